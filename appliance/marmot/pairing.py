"""The draft multi-device pairing payload: current-epoch join material for each group, sealed from
an existing device to a new device of the same account (marmot-multi-device.md, "Pairing payload").

The draft leaves the bytes as a placeholder and requires, before it could be normative, either no
`group_event_key` transfer or a single-use payload with a bounded validity period. This module
implements the second option with a layout of our own, version 1 (spec note M9):

    # Plaintext (Marmot binary profile)
    struct {
      opaque group_event_key[32];       # MLS-Exporter("marmot", "group-event", 32) of the current epoch
      opaque join_psk<1..64>;           # MLS-Exporter("marmot", join_psk_id, KDF.Nh)
      opaque group_info<1..V>;          # TLS-serialized MLS GroupInfo (external_pub, ratchet_tree, ...)
    } MarmotPairingGroupEntryV1;

    struct {
      uint16 version = 1;
      opaque pairing_id[16];            # random; the single use is spent on this id
      uint64 not_before;                # Unix seconds, set by the sealer
      uint64 not_after;                 # not_before < not_after <= not_before + 600
      MarmotPairingGroupEntryV1 groups<V>;   # at least one entry
    } MarmotPairingPayloadV1;

    # Envelope
    struct {
      uint16 version = 1;
      opaque sender_ephemeral_pub[32];  # fresh X25519 key of the existing device, one per envelope
      opaque recipient_pub[32];         # the new device's fresh X25519 pairing key
      opaque nonce[12];                 # random
      opaque ciphertext<16..V>;         # ChaCha20-Poly1305(key, nonce, payload, aad), tag included
    } MarmotPairingEnvelopeV1;

    shared = X25519(sender_ephemeral_priv, recipient_pub)      # all-zero refused on both sides
    key    = HKDF-SHA256(salt = "marmot.pairing.v1", IKM = shared,
                         info = "marmot.pairing.v1 key" || sender_ephemeral_pub || recipient_pub, L = 32)
    aad    = every envelope byte before `ciphertext` (version, both keys, nonce)

Single use: the recipient's pairing key opens exactly one envelope (the caller deletes the private
key once `open_pairing` succeeds) and a pairing id, once opened, is refused again. Both sides erase
the material after use or expiry; the bound is the pairing flow's own and never extends retained
history.
"""

from __future__ import annotations

import hmac
import os
import time
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import EncodingError, PairingError, PairingExpired, PairingReused
from .wire import Reader, quic_vector, uint16, uint64

__all__ = [
    "PAIRING_VERSION",
    "MAX_PAIRING_VALIDITY",
    "DEFAULT_PAIRING_VALIDITY",
    "CLOCK_SKEW",
    "PairingGroupEntry",
    "PairingPayload",
    "PairingKey",
    "seal_pairing",
    "open_pairing",
    "peek_envelope",
]

PAIRING_VERSION = 1
# The payload hands over the epoch's outer-encryption key, so it must die quickly: ten minutes is
# enough to scan a QR code and build an External Commit, and short enough that a leaked payload is
# most likely already stale (a single epoch change also makes it useless for joining).
MAX_PAIRING_VALIDITY = 600
DEFAULT_PAIRING_VALIDITY = 300
# A new device's clock may run a little behind the sealer's; only `not_before` gets this slack.
CLOCK_SKEW = 60
MAX_JOIN_PSK = 64  # KDF.Nh of every MLS ciphersuite is at most 64 bytes

_SALT = b"marmot.pairing.v1"
_INFO = b"marmot.pairing.v1 key"
_HEADER_LEN = 2 + 32 + 32 + 12
_RAW = serialization.Encoding.Raw


def _public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class PairingGroupEntry:
    group_event_key: bytes
    join_psk: bytes
    group_info: bytes

    def __post_init__(self) -> None:
        if len(self.group_event_key) != 32:
            raise PairingError("group_event_key is not 32 bytes", "pairing.entry")
        if not 1 <= len(self.join_psk) <= MAX_JOIN_PSK:
            raise PairingError("join_psk length is outside 1..64", "pairing.entry")
        if not self.group_info:
            raise PairingError("group_info is empty", "pairing.entry")

    def encode(self) -> bytes:
        return self.group_event_key + quic_vector(self.join_psk) + quic_vector(self.group_info)


@dataclass(frozen=True)
class PairingPayload:
    pairing_id: bytes
    not_before: int
    not_after: int
    groups: tuple[PairingGroupEntry, ...]
    version: int = PAIRING_VERSION

    def __post_init__(self) -> None:
        if self.version != PAIRING_VERSION:
            raise PairingError(f"pairing payload version {self.version} is not 1", "pairing.version")
        if len(self.pairing_id) != 16:
            raise PairingError("pairing_id is not 16 bytes", "pairing.malformed")
        if not 0 < self.not_after - self.not_before <= MAX_PAIRING_VALIDITY:
            raise PairingError(f"validity window must be 1..{MAX_PAIRING_VALIDITY} seconds", "pairing.validity")
        if not self.groups:
            raise PairingError("a pairing payload carries at least one group", "pairing.empty")

    def encode(self) -> bytes:
        body = b"".join(g.encode() for g in self.groups)
        return (uint16(self.version) + self.pairing_id + uint64(self.not_before) + uint64(self.not_after)
                + quic_vector(body))

    @classmethod
    def decode(cls, data: bytes) -> "PairingPayload":
        r = Reader(data, "MarmotPairingPayloadV1")
        version = r.uint16()
        if version != PAIRING_VERSION:
            raise PairingError(f"pairing payload version {version} is not 1", "pairing.version")
        pairing_id = r.fixed(16)
        not_before, not_after = r.uint64(), r.uint64()
        body = r.vector(field="groups")
        r.done()
        items = Reader(body, "MarmotPairingGroupEntryV1")
        groups = []
        while not items.at_end():
            key = items.fixed(32)
            psk = items.vector(1, MAX_JOIN_PSK, field="join_psk")
            info = items.vector(1, field="group_info")
            groups.append(PairingGroupEntry(key, psk, info))
        return cls(pairing_id, not_before, not_after, tuple(groups), version)


@dataclass
class PairingKey:
    """The new device's fresh X25519 pairing key (its public half goes to the existing device)."""

    private: bytes
    created_at: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def generate(cls) -> "PairingKey":
        return cls(X25519PrivateKey.generate().private_bytes(_RAW, serialization.PrivateFormat.Raw,
                                                             serialization.NoEncryption()))

    @property
    def public(self) -> bytes:
        return _public_bytes(X25519PrivateKey.from_private_bytes(self.private))

    def expired(self, now: int) -> bool:
        # A pairing key nobody used is dropped after the longest window a payload could have.
        return now > self.created_at + MAX_PAIRING_VALIDITY + CLOCK_SKEW


def _shared_key(private: X25519PrivateKey, peer_public: bytes, sender_pub: bytes, recipient_pub: bytes) -> bytes:
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        # OpenSSL refuses a low-order point itself; same outcome as the explicit check below.
        raise PairingError("X25519 shared secret is all zero", "pairing.zero_shared_secret") from None
    if not any(shared):
        raise PairingError("X25519 shared secret is all zero", "pairing.zero_shared_secret")
    return HKDF(hashes.SHA256(), 32, _SALT, _INFO + sender_pub + recipient_pub).derive(shared)


def seal_pairing(recipient_pub: bytes, groups, *, now: int | None = None,
                 validity: int = DEFAULT_PAIRING_VALIDITY) -> tuple[bytes, PairingPayload]:
    """Seal entries for a new device's pairing key; returns (envelope bytes, the payload sealed)."""
    if len(recipient_pub) != 32:
        raise PairingError("recipient pairing key is not 32 bytes", "pairing.malformed")
    now = int(time.time()) if now is None else now
    payload = PairingPayload(os.urandom(16), now, now + validity, tuple(groups))
    sender = X25519PrivateKey.generate()
    sender_pub = _public_bytes(sender)
    key = _shared_key(sender, recipient_pub, sender_pub, recipient_pub)
    nonce = os.urandom(12)
    header = uint16(PAIRING_VERSION) + sender_pub + bytes(recipient_pub) + nonce
    ciphertext = ChaCha20Poly1305(key).encrypt(nonce, payload.encode(), header)
    return header + quic_vector(ciphertext), payload


def peek_envelope(envelope: bytes) -> dict:
    """The envelope's public header, without decrypting (for `inspect`)."""
    r = Reader(envelope, "MarmotPairingEnvelopeV1")
    version = r.uint16()
    if version != PAIRING_VERSION:
        raise PairingError(f"pairing envelope version {version} is not 1", "pairing.version")
    sender_pub, recipient_pub, nonce = r.fixed(32), r.fixed(32), r.fixed(12)
    ciphertext = r.vector(16, field="ciphertext")
    r.done()
    return {"version": version, "sender_ephemeral_pub": sender_pub.hex(), "recipient_pub": recipient_pub.hex(),
            "nonce": nonce.hex(), "ciphertext_len": len(ciphertext)}


def open_pairing(envelope: bytes, key: PairingKey, *, now: int | None = None,
                 used_ids=frozenset()) -> PairingPayload:
    """Open an envelope with the new device's pairing key, enforcing window and single use.

    The caller deletes `key` after success and remembers the pairing id in `used_ids`.
    """
    now = int(time.time()) if now is None else now
    try:
        head = peek_envelope(envelope)
    except EncodingError as exc:
        raise PairingError(f"pairing envelope is malformed: {exc}", "pairing.malformed") from None
    recipient_pub = bytes.fromhex(head["recipient_pub"])
    if not hmac.compare_digest(recipient_pub, key.public):
        raise PairingError("envelope is sealed to another pairing key", "pairing.wrong_key")
    sender_pub = bytes.fromhex(head["sender_ephemeral_pub"])
    if hmac.compare_digest(sender_pub, recipient_pub):
        raise PairingError("sender and recipient keys are equal (not fresh)", "pairing.key_reuse")
    derived = _shared_key(X25519PrivateKey.from_private_bytes(key.private), sender_pub, sender_pub, recipient_pub)
    header = envelope[:_HEADER_LEN]
    ciphertext = Reader(envelope[_HEADER_LEN:], "ciphertext").vector(16)
    try:
        plaintext = ChaCha20Poly1305(derived).decrypt(bytes.fromhex(head["nonce"]), ciphertext, header)
    except InvalidTag:
        raise PairingError("pairing envelope does not authenticate", "pairing.decrypt") from None
    try:
        payload = PairingPayload.decode(plaintext)
    except EncodingError as exc:
        raise PairingError(f"pairing payload is malformed: {exc}", "pairing.malformed") from None
    if payload.pairing_id.hex() in used_ids or payload.pairing_id in used_ids:
        raise PairingReused("this pairing payload was already used", "pairing.reused")
    if now > payload.not_after:
        raise PairingExpired("pairing payload has expired", "pairing.expired")
    if now + CLOCK_SKEW < payload.not_before:
        raise PairingExpired("pairing payload is not valid yet", "pairing.not_yet_valid")
    return payload
