"""NIP-98 HTTP auth: verifying and building `Authorization: Nostr <base64 event>` headers."""

from __future__ import annotations

import base64
import binascii
import hashlib

import orjson

from .event import Event, InvalidEvent, parse_event, sign_event, verify_event

__all__ = ["HttpAuthError", "HTTP_AUTH_KIND", "verify_http_auth", "make_http_auth"]

HTTP_AUTH_KIND = 27235
# A legitimate header is an event with a few short tags; anything far larger
# is refused before decoding.
MAX_HEADER_LEN = 16384


class HttpAuthError(ValueError):
    """A refused Authorization header; str() is the reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def verify_http_auth(
    header_value: str,
    *,
    url: str,
    method: str,
    body: bytes | None,
    now: int,
    window: int = 60,
) -> Event:
    """Check a NIP-98 Authorization header against the request; return the event.

    The u tag must equal url byte for byte: normalising here could let a token
    minted for one URL be replayed on another.
    """
    if not isinstance(header_value, str) or not header_value:
        raise HttpAuthError("missing authorization header")
    if len(header_value) > MAX_HEADER_LEN:
        raise HttpAuthError("authorization header too large")
    scheme, _, token = header_value.strip().partition(" ")
    # RFC 9110: auth scheme names are case-insensitive.
    if scheme.lower() != "nostr":
        raise HttpAuthError("authorization scheme must be Nostr")
    token = token.strip()
    if not token:
        raise HttpAuthError("missing event in authorization header")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise HttpAuthError("authorization header is not valid base64") from None
    # Canonical form only (padding optional): one event, one token, should a replay cache ever
    # key on it.
    if base64.b64encode(raw).decode("ascii").rstrip("=") != token.rstrip("="):
        raise HttpAuthError("authorization header is not valid base64")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise HttpAuthError("authorization event is not valid JSON") from None
    try:
        ev = parse_event(obj)
    except InvalidEvent as exc:
        raise HttpAuthError(f"malformed event: {exc.reason}") from None
    if ev.kind != HTTP_AUTH_KIND:
        raise HttpAuthError("wrong kind")
    if abs(ev.created_at - now) > window:
        raise HttpAuthError("created_at out of window")
    u = ev.first_tag("u")
    if u is None:
        raise HttpAuthError("missing u tag")
    if u != url:
        raise HttpAuthError("url mismatch")
    m = ev.first_tag("method")
    if m is None:
        raise HttpAuthError("missing method tag")
    if m != method.upper():
        raise HttpAuthError("method mismatch")
    payload = ev.first_tag("payload")
    if payload is not None:
        if payload.lower() != hashlib.sha256(body or b"").hexdigest():
            raise HttpAuthError("payload hash mismatch")
    elif body:
        raise HttpAuthError("missing payload tag")
    if not verify_event(ev):
        raise HttpAuthError("invalid signature")
    return ev


def make_http_auth(
    secret_hex: str,
    url: str,
    method: str,
    body: bytes | None = None,
    *,
    created_at: int | None = None,
) -> str:
    """Build an Authorization header value (for clients and tests)."""
    tags = [["u", url], ["method", method.upper()]]
    if body:
        tags.append(["payload", hashlib.sha256(body).hexdigest()])
    ev = sign_event(secret_hex, HTTP_AUTH_KIND, tags, "", created_at)
    return "Nostr " + base64.b64encode(ev.to_json_bytes()).decode("ascii")
