"""Closed request objects of the gateway routes, parsed strictly (NIP-PL, "Common HTTP and value rules").

A body is at most 8192 bytes of UTF-8 JSON holding exactly one object whose members are exactly
the route's members: unknown, missing or duplicate members (at any depth), wrong types, trailing
non-whitespace data or a `v` other than the integer 1 are all `400 invalid_request`, as are values
outside their rules (canonical lowercase UUIDs, 64-hex relay pubkeys, lowercase-hex APNs tokens of
at most 512 bytes, 32-byte URL-safe challenges, standard-base64 key ids, attestations and
assertions within their sizes, grants of at most 4096 bytes). Parsing is pure: no clock, no state.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from .errors import InvalidRequest

MAX_BODY_BYTES = 8192
MAX_ENDPOINT_BYTES = 512
MAX_GRANT_BYTES = 4096
MAX_ATTESTATION_BYTES = 16384
MAX_ASSERTION_BYTES = 1024
KEY_ID_BYTES = 32
CHALLENGE_BYTES = 32
WIRE_VERSION = 1
# Integers are signed JSON integers; every one we store fits SQLite's signed 64 bits.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

#: The registered app_profile values of the public profile (NIP-PL, "Registered values").
REGISTERED_PROFILES = ("buzz-ios-production", "buzz-ios-sandbox")

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_LOWER_HEX = re.compile(r"(?:[0-9a-f]{2})+\Z")
_B64URL = re.compile(r"[A-Za-z0-9_-]+\Z")
_B64STD = re.compile(r"[A-Za-z0-9+/]+={0,2}\Z")
_JSON_WS = " \t\n\r"


class _Reject(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # duplicate member, at whatever depth this object sits
            raise _Reject("duplicate member")
        out[key] = value
    return out


def _parse_int(text: str) -> int:
    if len(text) > 20:  # "-9223372036854775808" is 20 characters; refuse before converting
        raise _Reject("integer out of range")
    n = int(text)
    if not INT_MIN <= n <= INT_MAX:
        raise _Reject("integer out of range")
    return n


def _parse_float(_text: str) -> float:
    # 1.0 and 1e0 are not integers, and no member of any route is a fraction.
    raise _Reject("not an integer")


def _parse_constant(_name: str) -> Any:
    raise _Reject("NaN/Infinity")


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_int=_parse_int, parse_float=_parse_float,
                            parse_constant=_parse_constant, strict=True)


def parse_json_object(body: bytes) -> dict[str, Any]:
    """One JSON object from at most 8192 bytes of UTF-8, or InvalidRequest."""
    if len(body) > MAX_BODY_BYTES:
        raise InvalidRequest("body over 8192 bytes")
    try:
        text = body.decode("utf-8")  # strict: invalid sequences and a BOM-less check below
    except UnicodeDecodeError:
        raise InvalidRequest("body is not UTF-8") from None
    start = len(text) - len(text.lstrip(_JSON_WS))
    try:
        value, end = _DECODER.raw_decode(text, start)
    except _Reject as exc:
        raise InvalidRequest(str(exc)) from None
    except (ValueError, RecursionError):  # JSONDecodeError, a BOM, deep nesting
        raise InvalidRequest("malformed JSON") from None
    if text[end:].strip(_JSON_WS):
        raise InvalidRequest("trailing data")
    if not isinstance(value, dict):
        raise InvalidRequest("not an object")
    return value


# -- value rules -------------------------------------------------------------------------------


def _int(value: Any) -> int:
    if type(value) is not int:  # bool is an int subclass: refused here
        raise InvalidRequest("expected an integer")
    return value


def _positive(value: Any) -> int:
    n = _int(value)
    if n < 1:
        raise InvalidRequest("expected a positive integer")
    return n


def _str(value: Any) -> str:
    if type(value) is not str:
        raise InvalidRequest("expected a string")
    if not value.isascii():
        # JSON can spell lone surrogates ("\ud800"): no Unicode text, so no value of any member.
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest("string is not Unicode text") from None
    return value


def _version(value: Any) -> int:
    if _int(value) != WIRE_VERSION:
        raise InvalidRequest("v must be 1")
    return WIRE_VERSION


def _uuid(value: Any) -> str:
    s = _str(value)
    if not _UUID.match(s):
        raise InvalidRequest("expected a canonical lowercase UUID")
    return s


def _relay_pubkey(value: Any) -> str:
    s = _str(value)
    if not _HEX64.match(s):
        raise InvalidRequest("expected 64 lowercase hex characters")
    return s


def _endpoint(value: Any) -> str:
    s = _str(value)
    if len(s) > 2 * MAX_ENDPOINT_BYTES or not _LOWER_HEX.match(s):
        raise InvalidRequest("expected a non-empty even-length lowercase hex APNs token of at most 512 bytes")
    return s


def decode_challenge(s: str) -> bytes:
    """32 bytes from unpadded URL-safe base64 in its one canonical spelling."""
    if len(s) != 43 or not _B64URL.match(s):
        raise InvalidRequest("expected a 32-byte unpadded URL-safe base64 challenge")
    raw = base64.urlsafe_b64decode(s + "=")
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != s:  # non-zero trailing bits
        raise InvalidRequest("non-canonical challenge encoding")
    return raw


def _challenge(value: Any) -> str:
    s = _str(value)
    decode_challenge(s)
    return s


def decode_std_b64(s: str, lo: int, hi: int) -> bytes:
    """Standard base64, padded or not (as Apple's App Attest API hands it out), canonical bits."""
    if not s or not _B64STD.match(s) or len(s) > 4 * (hi // 3 + 1):
        raise InvalidRequest("expected standard base64")
    bare = s.rstrip("=")
    if s != bare and len(s) % 4:  # padding present but not to a multiple of 4
        raise InvalidRequest("bad base64 padding")
    if len(bare) % 4 == 1:
        raise InvalidRequest("bad base64 length")
    try:
        raw = base64.b64decode(bare + "=" * (-len(bare) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("expected standard base64") from None
    if base64.b64encode(raw).decode().rstrip("=") != bare:
        raise InvalidRequest("non-canonical base64")
    if not lo <= len(raw) <= hi:
        raise InvalidRequest("decoded size out of range")
    return raw


def _key_id(value: Any) -> str:
    s = _str(value)
    decode_std_b64(s, KEY_ID_BYTES, KEY_ID_BYTES)
    return s


def _attestation(value: Any) -> str:
    s = _str(value)
    decode_std_b64(s, 1, MAX_ATTESTATION_BYTES)
    return s


def _assertion(value: Any) -> str:
    s = _str(value)
    decode_std_b64(s, 1, MAX_ASSERTION_BYTES)
    return s


def _profile(value: Any) -> str:
    s = _str(value)
    if s not in REGISTERED_PROFILES:
        raise InvalidRequest("unregistered app_profile")
    return s


def _grant(value: Any) -> str:
    s = _str(value)
    if not s or len(s.encode("utf-8")) > MAX_GRANT_BYTES:
        raise InvalidRequest("endpoint_grant empty or over 4096 bytes")
    return s


# -- the routes' closed objects ------------------------------------------------------------------

Schema = dict[str, Callable[[Any], Any]]

CHALLENGE: Schema = {"v": _version}
ENROLL: Schema = {
    "v": _version, "challenge_id": _uuid, "challenge": _challenge, "key_id": _key_id,
    "attestation": _attestation, "app_profile": _profile, "endpoint": _endpoint,
    "endpoint_epoch": _positive, "expires_at": _int,
}
DELEGATE: Schema = {
    "v": _version, "challenge_id": _uuid, "challenge": _challenge, "installation_handle": _uuid,
    "endpoint_epoch": _positive, "generation": _positive, "relay_pubkey": _relay_pubkey,
    "not_before": _int, "expires_at": _int, "assertion": _assertion,
}
ROTATE_ENDPOINT: Schema = {
    "v": _version, "challenge_id": _uuid, "challenge": _challenge, "installation_handle": _uuid,
    "endpoint_epoch": _positive, "new_endpoint_epoch": _int, "endpoint": _endpoint, "assertion": _assertion,
}
REVOKE_DELEGATION: Schema = {
    "v": _version, "challenge_id": _uuid, "challenge": _challenge, "installation_handle": _uuid,
    "relay_pubkey": _relay_pubkey, "generation": _positive, "assertion": _assertion,
}
REVOKE_INSTALLATION: Schema = {
    "v": _version, "challenge_id": _uuid, "challenge": _challenge, "installation_handle": _uuid,
    "endpoint_epoch": _positive, "new_endpoint_epoch": _int, "assertion": _assertion,
}
DELIVERY: Schema = {"v": _version, "endpoint_grant": _grant, "request_id": _uuid, "expires_at": _int}


def parse_request(body: bytes, schema: Schema) -> dict[str, Any]:
    """The route's closed object from the raw body bytes, every value checked; InvalidRequest otherwise."""
    obj = parse_json_object(body)
    if obj.keys() != schema.keys():
        raise InvalidRequest("unknown or missing member")
    out = {name: check(obj[name]) for name, check in schema.items()}
    # "new_endpoint_epoch MUST equal endpoint_epoch + 1 without overflow"
    if "new_endpoint_epoch" in schema and (out["endpoint_epoch"] >= INT_MAX
                                           or out["new_endpoint_epoch"] != out["endpoint_epoch"] + 1):
        raise InvalidRequest("new_endpoint_epoch must be endpoint_epoch + 1")
    return out


@dataclass(frozen=True)
class ContentType:
    """`Content-Type: application/json`, optionally with `charset=utf-8` (nothing else)."""

    @staticmethod
    def acceptable(value: str | None) -> bool:
        if value is None:
            return False
        media, _, params = value.partition(";")
        if media.strip().lower() != "application/json":
            return False
        params = params.strip()
        if not params:
            return True
        name, _, val = params.partition("=")
        return name.strip().lower() == "charset" and val.strip().strip('"').lower() == "utf-8"
