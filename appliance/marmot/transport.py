"""The Marmot Nostr transport (transports/nostr.md): the relay-facing events that carry MLS bytes.

- kind 445 group messages: ChaCha20-Poly1305 under the epoch's `group_event_key`
  (MLS-Exporter("marmot", "group-event", 32), given here as bytes), `base64(nonce || ciphertext)`,
  one `h` tag, signed by a fresh one-time key per event;
- kind 444 welcome rumors (unsigned) delivered inside NIP-59 gift wraps (kind 1059 -> 13 -> 444);
- kind 30443 key package events (and the legacy kind 443 that clients may still publish);
- kind 10051 key package relay lists.

Builders produce exactly what the spec lists; parsers check what it says MUST hold before peeling
(validation before peeling) and refuse the rest with a TransportError naming the rule.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from appliance.nostr import nip59
from appliance.nostr.event import Event, sign_event, verify_event
from appliance.nostr.keys import generate_secret

from .errors import TransportError

__all__ = [
    "GROUP_MESSAGE_KIND",
    "WELCOME_RUMOR_KIND",
    "KEY_PACKAGE_KIND",
    "LEGACY_KEY_PACKAGE_KIND",
    "KEY_PACKAGE_RELAYS_KIND",
    "MIN_GROUP_MESSAGE_BYTES",
    "encrypt_group_message",
    "decrypt_group_message",
    "check_group_message",
    "WelcomeRumor",
    "build_welcome_rumor",
    "parse_welcome_rumor",
    "wrap_welcome",
    "unwrap_welcome",
    "KeyPackageEvent",
    "build_key_package_event",
    "parse_key_package_event",
    "build_key_package_relays",
    "parse_key_package_relays",
    "decode_base64",
]

GROUP_MESSAGE_KIND = 445
WELCOME_RUMOR_KIND = 444
KEY_PACKAGE_KIND = 30443
LEGACY_KEY_PACKAGE_KIND = 443
KEY_PACKAGE_RELAYS_KIND = 10051
NONCE_LEN = 12
TAG_LEN = 16
MIN_GROUP_MESSAGE_BYTES = NONCE_LEN + TAG_LEN  # 28: nonce plus the Poly1305 tag
MLS_PROTOCOL_VERSION = "1.0"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"(?:[0-9a-f]{2})+")
_CODE = re.compile(r"0x[0-9a-f]{4}")


def decode_base64(text: object, what: str) -> bytes:
    """Standard base64 with padding, canonical form only (one encoding per byte string)."""
    if not isinstance(text, str):
        raise TransportError(f"{what} is not a string", "transport.base64")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise TransportError(f"{what} is not valid base64", "transport.base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise TransportError(f"{what} is not canonical padded base64", "transport.base64")
    return raw


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _single(ev_tags: list, name: str) -> list[list[str]]:
    return [t for t in ev_tags if t and t[0] == name]


# --- kind 445 ------------------------------------------------------------------------------------

def check_group_message(ev: Event) -> str:
    """The outer checks a relay and a peeler make: kind 445, exactly one lowercase-hex 64 `h`,
    content canonical base64 of at least 28 bytes. Returns the `h` value."""
    if ev.kind != GROUP_MESSAGE_KIND:
        raise TransportError(f"kind {ev.kind} is not a group message", "transport.kind")
    hs = _single(ev.tags, "h")
    if len(hs) != 1:
        raise TransportError("a group message has exactly one h tag", "transport.h_tag")
    if len(hs[0]) < 2 or not _HEX64.fullmatch(hs[0][1]):
        raise TransportError("the h tag is not 64 lowercase hex characters", "transport.h_tag")
    raw = decode_base64(ev.content, "group message content")
    if len(raw) < MIN_GROUP_MESSAGE_BYTES:
        raise TransportError(f"group message content decodes to {len(raw)} bytes, fewer than 28",
                             "transport.content_too_short")
    return hs[0][1]


def encrypt_group_message(group_event_key: bytes, nostr_group_id: bytes, mls_message: bytes, *,
                          created_at: int | None = None) -> Event:
    """A signed kind 445 event carrying one MLS message, from a fresh one-time key."""
    if len(group_event_key) != 32:
        raise TransportError("group_event_key is not 32 bytes", "transport.key")
    if len(nostr_group_id) != 32:
        raise TransportError("nostr_group_id is not 32 bytes", "transport.h_tag")
    nonce = os.urandom(NONCE_LEN)
    ciphertext = ChaCha20Poly1305(bytes(group_event_key)).encrypt(nonce, bytes(mls_message), b"")
    one_time = generate_secret()  # never the account key, never reused
    return sign_event(one_time, GROUP_MESSAGE_KIND, [["h", bytes(nostr_group_id).hex()]],
                      _b64(nonce + ciphertext), created_at=created_at)


def decrypt_group_message(group_event_key: bytes, ev: Event) -> bytes:
    """The MLS message bytes of a kind 445 event, or a TransportError (outer checks, signature, AEAD)."""
    check_group_message(ev)
    if not verify_event(ev):
        raise TransportError("group message signature does not verify", "transport.signature")
    raw = base64.b64decode(ev.content)
    try:
        return ChaCha20Poly1305(bytes(group_event_key)).decrypt(raw[:NONCE_LEN], raw[NONCE_LEN:], b"")
    except InvalidTag:
        raise TransportError("group message does not decrypt under this epoch's key", "transport.decrypt") from None


# --- kind 444 welcome rumors in NIP-59 gift wraps ---------------------------------------------------

@dataclass(frozen=True)
class WelcomeRumor:
    rumor: dict
    welcome: bytes          # serialized MLSMessage (wire format mls_welcome)
    key_package_event_id: str
    relays: list[str]

    @property
    def sender(self) -> str:
        return self.rumor["pubkey"]


def build_welcome_rumor(sender_pubkey: str, welcome_message: bytes, key_package_event_id: str,
                        relays: list[str], *, created_at: int | None = None) -> dict:
    """The unsigned kind 444 rumor for one invitee."""
    if not _HEX64.fullmatch(key_package_event_id or ""):
        raise TransportError("key package event id is not 64 lowercase hex", "transport.e_tag")
    if not relays:
        raise TransportError("a welcome names at least one relay", "transport.relays_tag")
    tags = [["encoding", "base64"], ["e", key_package_event_id], ["relays", *relays]]
    return nip59.make_rumor(sender_pubkey, WELCOME_RUMOR_KIND, tags, _b64(welcome_message), created_at)


def parse_welcome_rumor(rumor: object) -> WelcomeRumor:
    """Checks a kind 444 rumor (as unwrapped): no sig, encoding base64, content base64, e and relays tags."""
    try:
        rumor = nip59.parse_rumor(rumor)
    except nip59.UnwrapError as exc:
        raise TransportError(f"welcome rumor: {exc.reason}", "transport.rumor") from None
    if rumor["kind"] != WELCOME_RUMOR_KIND:
        raise TransportError(f"kind {rumor['kind']} is not a welcome rumor", "transport.kind")
    tags = rumor["tags"]
    enc = _single(tags, "encoding")
    if len(enc) != 1 or enc[0][1:] != ["base64"]:
        raise TransportError("a welcome rumor needs [\"encoding\", \"base64\"]", "transport.encoding_tag")
    es = _single(tags, "e")
    if len(es) != 1 or len(es[0]) < 2 or not _HEX64.fullmatch(es[0][1]):
        raise TransportError("a welcome rumor needs one e tag with the key package event id", "transport.e_tag")
    relays = [u for t in _single(tags, "relays") for u in t[1:]]
    if not relays:
        raise TransportError("a welcome rumor needs a relays tag", "transport.relays_tag")
    welcome = decode_base64(rumor["content"], "welcome content")
    return WelcomeRumor(rumor, welcome, es[0][1], relays)


def wrap_welcome(rumor: dict, sender_secret: str, recipient_pubkey: str) -> Event:
    """The kind 1059 gift wrap to publish for one invitee (its `p` tag is the invitee)."""
    parse_welcome_rumor(rumor)
    return nip59.gift_wrap(rumor, sender_secret, recipient_pubkey)


def unwrap_welcome(wrap: Event, recipient_secret: str) -> WelcomeRumor:
    """Open a gift-wrapped welcome addressed to us; a wrap for anyone else is refused."""
    try:
        rumor, _sender = nip59.unwrap(wrap, recipient_secret)
    except nip59.UnwrapError as exc:
        raise TransportError(f"gift wrap: {exc.reason}", "transport.gift_wrap") from None
    return parse_welcome_rumor(rumor)


# --- kind 30443 key packages, kind 10051 relay lists ---------------------------------------------

@dataclass(frozen=True)
class KeyPackageEvent:
    event: Event
    key_package: bytes      # the decoded content (framed MLSMessage or bare KeyPackage; spec note M3)
    d: str | None
    ref: str | None
    ciphersuite: str | None
    relays: list[str]


def build_key_package_event(secret_hex: str, key_package: bytes, *, key_package_ref: bytes, ciphersuite: int,
                            extensions: list[int], proposals: list[int], relays: list[str],
                            d: str | None = None, created_at: int | None = None) -> Event:
    """A signed kind 30443 event with the spec's current tag set, in its order."""
    if not relays:
        raise TransportError("a key package event names at least one relay", "transport.relays_tag")
    tags = [
        ["d", d or os.urandom(32).hex()],
        ["mls_protocol_version", MLS_PROTOCOL_VERSION],
        ["i", bytes(key_package_ref).hex()],
        ["mls_ciphersuite", f"0x{ciphersuite:04x}"],
        ["mls_extensions", *(f"0x{e:04x}" for e in extensions)],
        ["mls_proposals", *(f"0x{p:04x}" for p in proposals)],
        ["encoding", "base64"],
        ["relays", *relays],
    ]
    return sign_event(secret_hex, KEY_PACKAGE_KIND, tags, _b64(key_package), created_at=created_at)


def parse_key_package_event(ev: Event) -> KeyPackageEvent:
    """Outer checks of a key package publication (kind 30443, or legacy 443) before MLS decoding."""
    if ev.kind not in (KEY_PACKAGE_KIND, LEGACY_KEY_PACKAGE_KIND):
        raise TransportError(f"kind {ev.kind} is not a key package event", "transport.kind")
    if not verify_event(ev):
        raise TransportError("key package event signature does not verify", "transport.signature")
    enc = _single(ev.tags, "encoding")
    if len(enc) != 1 or enc[0][1:] != ["base64"]:
        raise TransportError("a key package event needs [\"encoding\", \"base64\"]", "transport.encoding_tag")
    d = ev.first_tag("d")
    if ev.kind == KEY_PACKAGE_KIND and not d:
        raise TransportError("a kind 30443 key package needs a non-empty d tag", "transport.d_tag")
    ref = ev.first_tag("i")
    if ref is not None and not _HEX.fullmatch(ref):
        raise TransportError("the i tag is not lowercase hex", "transport.i_tag")
    suite = ev.first_tag("mls_ciphersuite")
    if suite is not None and not _CODE.fullmatch(suite):
        raise TransportError("mls_ciphersuite is not 0x followed by four hex digits", "transport.capability_tag")
    for name in ("mls_extensions", "mls_proposals"):
        for t in _single(ev.tags, name):
            if not all(_CODE.fullmatch(v) for v in t[1:]):
                raise TransportError(f"{name} values must be 0x followed by four hex digits",
                                     "transport.capability_tag")
    key_package = decode_base64(ev.content, "key package content")
    if not key_package:
        raise TransportError("key package content is empty", "transport.content")
    relays = [u for t in _single(ev.tags, "relays") for u in t[1:]]
    return KeyPackageEvent(ev, key_package, d, ref, suite, relays)


def build_key_package_relays(secret_hex: str, relays: list[str], *, created_at: int | None = None) -> Event:
    """Kind 10051: one `relay` tag per relay, empty content."""
    return sign_event(secret_hex, KEY_PACKAGE_RELAYS_KIND, [["relay", r] for r in relays], "",
                      created_at=created_at)


def parse_key_package_relays(ev: Event) -> list[str]:
    if ev.kind != KEY_PACKAGE_RELAYS_KIND:
        raise TransportError(f"kind {ev.kind} is not a key package relay list", "transport.kind")
    if ev.content != "":
        raise TransportError("a key package relay list has empty content", "transport.content")
    return [t[1] for t in ev.tags if len(t) > 1 and t[0] == "relay"]

