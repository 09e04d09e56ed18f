"""Marmot (MLS over Nostr) events the relay stores as they are.

A kind 445 group message carries the MLS group's `nostr_group_id` (64 lowercase hex) in an `h`
tag and is signed by a one-time key: it is not a NIP-29 group event (no group row, no members,
no moderation), so the group rules never see it. The relay only checks its shape and serves it by
`#h` like any other tag. (Marmot, MIP-03; the other Marmot kinds come with the Marmot issue.)
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


def check_group_message(ev: Event) -> None:
    """Refuse a kind 445 event that is not shaped like a Marmot group message."""
    hs = ev.tag_values("h")
    if len(hs) != 1:
        raise Rejected("invalid", "a group message (kind 445) has exactly one h tag")
    if not _GROUP_ID(hs[0]):
        raise Rejected("invalid", "the h tag of a group message is a 64-character lowercase hex group id")
    try:
        data = base64.b64decode(ev.content, validate=True)
    except (binascii.Error, ValueError):
        raise Rejected("invalid", "group message content must be base64") from None
    if len(data) < MIN_GROUP_MESSAGE_BYTES:
        raise Rejected("invalid", f"group message content is too short (at least {MIN_GROUP_MESSAGE_BYTES} bytes)")
