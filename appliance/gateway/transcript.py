"""Exact App Attest transcripts (NIP-PL, "Exact App Attest transcript construction").

transcript = UTF-8(domain + "\\n" + compact JSON object with members in the exact order below).
The audience member is the configured public base URL plus the route path, so a signature made
for one route (or one gateway) cannot be used on another. Known-answer vectors:
`../shared/vectors/nip-pl-app-attest-transcripts.json` (byte-exact).
"""

from __future__ import annotations

import hashlib
from typing import Any

ENROLL = "buzz.push.enroll.v1"
DELEGATE = "buzz.push.delegate.v1"
ROTATE_ENDPOINT = "buzz.push.rotate-endpoint.v1"
REVOKE_DELEGATION = "buzz.push.revoke-delegation.v1"
REVOKE_INSTALLATION = "buzz.push.revoke-installation.v1"

#: domain -> (route path, members after v and audience, in transcript order)
LAYOUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    ENROLL: ("/v1/installations",
             ("challenge_id", "challenge", "key_id", "app_profile", "endpoint", "endpoint_epoch", "expires_at")),
    DELEGATE: ("/v1/delegations",
               ("challenge_id", "challenge", "installation_handle", "endpoint_epoch", "generation",
                "relay_pubkey", "not_before", "expires_at")),
    ROTATE_ENDPOINT: ("/v1/installations/endpoint",
                      ("challenge_id", "challenge", "installation_handle", "endpoint_epoch",
                       "new_endpoint_epoch", "endpoint")),
    REVOKE_DELEGATION: ("/v1/delegations/revoke",
                        ("challenge_id", "challenge", "installation_handle", "relay_pubkey", "generation")),
    REVOKE_INSTALLATION: ("/v1/installations/revoke",
                          ("challenge_id", "challenge", "installation_handle", "endpoint_epoch",
                           "new_endpoint_epoch")),
}

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(s: str) -> str:
    """JSON string: quotation mark, reverse solidus and U+0000..U+001F escaped, nothing else."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(v: Any) -> str:
    if type(v) is int:
        return str(v)  # shortest decimal
    if type(v) is str:
        return _string(v)
    raise TypeError(f"transcripts hold only integers and strings, not {type(v).__name__}")


def audience(base_url: str, domain: str) -> str:
    """The audience string of a route: the public base URL (no trailing slash) plus the route path."""
    return base_url.rstrip("/") + LAYOUTS[domain][0]


def transcript(domain: str, base_url: str, fields: dict[str, Any]) -> bytes:
    """The exact transcript bytes for `domain` from a parsed request (extra request members ignored)."""
    _path, order = LAYOUTS[domain]
    members = [f'"v":{_value(fields.get("v", 1))}', f'"audience":{_string(audience(base_url, domain))}']
    members += [f"{_string(name)}:{_value(fields[name])}" for name in order]
    return (domain + "\n{" + ",".join(members) + "}").encode("utf-8")


def client_data_hash(transcript_bytes: bytes) -> bytes:
    """clientDataHash = SHA-256(transcript bytes), what every assertion route verifies."""
    return hashlib.sha256(transcript_bytes).digest()
