"""Pure Nostr protocol code (NIP-01 events and filters, NIP-42, NIP-44, NIP-59, NIP-98); no I/O."""

from .event import (
    MAX_SAFE_INT,
    Event,
    InvalidEvent,
    canonical_json,
    compute_id,
    d_tag,
    expiration,
    is_addressable,
    is_ephemeral,
    is_regular,
    is_replaceable,
    parse_event,
    sign_event,
    verify_event,
    verify_id,
    verify_signature,
)
from .filters import Filter, InvalidFilter, matches, matches_any, parse_filter
from .keys import generate_secret, public_key, schnorr_sign, schnorr_verify
from .nip42 import AuthError, normalize_relay_url, validate_auth_event
from .nip44 import Nip44Error
from .nip59 import DM_KINDS, GIFT_WRAP_KINDS, is_gated_kind, may_read_private, recipients
from .nip98 import HttpAuthError, make_http_auth, verify_http_auth

__all__ = [
    "MAX_SAFE_INT",
    "Event",
    "InvalidEvent",
    "canonical_json",
    "compute_id",
    "d_tag",
    "expiration",
    "is_addressable",
    "is_ephemeral",
    "is_regular",
    "is_replaceable",
    "parse_event",
    "sign_event",
    "verify_event",
    "verify_id",
    "verify_signature",
    "Filter",
    "InvalidFilter",
    "matches",
    "matches_any",
    "parse_filter",
    "generate_secret",
    "public_key",
    "schnorr_sign",
    "schnorr_verify",
    "AuthError",
    "normalize_relay_url",
    "validate_auth_event",
    "Nip44Error",
    "DM_KINDS",
    "GIFT_WRAP_KINDS",
    "is_gated_kind",
    "may_read_private",
    "recipients",
    "HttpAuthError",
    "make_http_auth",
    "verify_http_auth",
]
