"""Marmot (MLS over Nostr) events the relay stores as they are, and the ones it never stores.

A kind 445 group message carries the MLS group's `nostr_group_id` (64 lowercase hex) in an `h`
tag and is signed by a one-time key: it is not a NIP-29 group event (no group row, no members,
no moderation), so the group rules never see it. The relay only checks its shape and serves it by
`#h` like any other tag. (Marmot, MIP-03.)

The other kinds of the Marmot Nostr transport (transports/nostr.md) are checked where that
document says MUST, and no stricter: key packages (addressable kind 30443, and the older kind 443
clients still publish beside them) and gift-wrapped welcomes (1059, recipient-gated like every gift
wrap). Key package relay lists (10051) have no MUST there: stored like any replaceable event. Signing templates that must never reach a relay
(450, 451, 452) and bare welcome rumors (444) are refused with the reason.
"""

from __future__ import annotations

import base64
import binascii
import re

from appliance.errors import Rejected
from appliance.nostr.event import Event
from appliance.store.events import GROUP_MESSAGE_KIND

# Smallest MLS ciphertext a group message can carry: a 12-byte nonce and a 16-byte AEAD tag.
MIN_GROUP_MESSAGE_BYTES = 28
_GROUP_ID = re.compile(r"[0-9a-f]{64}").fullmatch


KEY_PACKAGE_KIND, LEGACY_KEY_PACKAGE_KIND = 30443, 443
WELCOME_RUMOR_KIND, GIFT_WRAP_KIND = 444, 1059
# Local-only signing templates: account identity proof (450) and multi-device join authorization
# (452 in the draft, 451 in an earlier revision of its component document; spec note M1).
LOCAL_ONLY_KINDS = {450: "account identity proof", 451: "multi-device join authorization",
                    452: "multi-device join authorization"}
_HEX = re.compile(r"(?:[0-9a-f]{2})+").fullmatch


def _base64(content: str, what: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected("invalid", f"{what} content must be base64") from None


def _encoding(ev: Event) -> str | None:
    """The value of the event's single `encoding` tag (None without one)."""
    values = ev.tag_values("encoding")
    if len(values) > 1:
        raise Rejected("invalid", "a Marmot event has at most one encoding tag")
    return values[0] if values else None


def check_key_package(ev: Event) -> None:
    """Kind 30443: a non-empty `d`, `["encoding", "base64"]`, base64 content; kind 443 (older
    clients): base64 content under that tag, or hex content without one (MIP-00's first form)."""
    what = f"a key package (kind {ev.kind})"
    encoding = _encoding(ev)
    if ev.kind == KEY_PACKAGE_KIND:
        if not ev.first_tag("d"):
            raise Rejected("invalid", f"{what} needs a non-empty d tag")
        if encoding != "base64":
            raise Rejected("invalid", f'{what} needs ["encoding", "base64"]')
    elif encoding not in (None, "base64"):
        raise Rejected("invalid", f'{what} is encoded as ["encoding", "base64"] (or hex without the tag)')
    if encoding == "base64":
        data = _base64(ev.content, what)
    elif _HEX(ev.content):
        data = bytes.fromhex(ev.content)
    else:
        raise Rejected("invalid", f"{what} without an encoding tag carries hex content")
    if not data:
        raise Rejected("invalid", f"{what} carries no key package")
    ref = ev.first_tag("i")
    if ref is not None and not _HEX(ref):
        raise Rejected("invalid", f"the i tag of {what} is a lowercase hex KeyPackageRef")


def check_gift_wrap(ev: Event) -> None:
    """Kind 1059: addressed to someone (its readers are its author and its p-tagged recipients)."""
    if not ev.tag_values("p"):
        raise Rejected("invalid", "a gift wrap (kind 1059) names its recipient in a p tag")


def check_marmot_event(ev: Event) -> None:
    """The Marmot transport rules for `ev`'s kind (callers pass only kinds in MARMOT_KINDS)."""
    if ev.kind in LOCAL_ONLY_KINDS:
        raise Rejected("blocked", f"kind {ev.kind} is a local-only Marmot signing template "
                                  f"({LOCAL_ONLY_KINDS[ev.kind]}); it is never published to relays")
    if ev.kind == WELCOME_RUMOR_KIND:
        raise Rejected("invalid", "kind 444 welcome rumors are unsigned and travel only inside NIP-59 "
                                  "gift wraps (kind 1059)")
    CHECKS[ev.kind](ev)


def check_group_message(ev: Event) -> None:
    """Refuse a kind 445 event that is not shaped like a Marmot group message."""
    hs = [t for t in ev.tags if t[0] == "h"]  # a bare ["h"] is an h tag too
    if len(hs) != 1:
        raise Rejected("invalid", "a group message (kind 445) has exactly one h tag")
    if len(hs[0]) < 2 or not _GROUP_ID(hs[0][1]):
        raise Rejected("invalid", "the h tag of a group message is a 64-character lowercase hex group id")
    try:
        data = base64.b64decode(ev.content, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected("invalid", "group message content must be base64") from None
    if len(data) < MIN_GROUP_MESSAGE_BYTES:
        raise Rejected("invalid", f"group message content is too short (at least {MIN_GROUP_MESSAGE_BYTES} bytes)")


CHECKS = {
    GROUP_MESSAGE_KIND: check_group_message,
    KEY_PACKAGE_KIND: check_key_package,
    LEGACY_KEY_PACKAGE_KIND: check_key_package,
    # Kind 10051 (key package relay lists) is described by transports/nostr.md but carries no MUST:
    # it is stored as NIP-01 allows (replaceable), never refused for its tags or content (M13).
    GIFT_WRAP_KIND: check_gift_wrap,
}
MARMOT_KINDS = frozenset(CHECKS) | frozenset(LOCAL_ONLY_KINDS) | {WELCOME_RUMOR_KIND}
