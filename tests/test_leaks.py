"""The log checker every server of the suite goes through (tests/leaks.py) flags base64 JSON,
JWTs and NIP-98 values, and not a random token that happens to contain `eyJ`."""

from __future__ import annotations

import base64
import json

from tests.leaks import leaks_in


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def test_a_jwt_and_a_nip98_value_in_a_log_are_leaks():
    jwt = b64url(json.dumps({"alg": "ES256", "kid": "ABC123DEFG"}).encode()) + "." \
        + b64url(json.dumps({"iss": "DEF123GHIJ", "iat": 1700000000}).encode()) + ".c2ln"
    nip98 = base64.b64encode(json.dumps({"kind": 27235, "content": "", "tags": []}).encode()).decode()
    for value in (jwt, nip98):
        assert leaks_in(f"INFO something Authorization: Nostr {value} seen")


def test_base64_json_with_whitespace_or_beyond_ascii_in_a_log_is_a_leak():
    # RFC 7515's example JWT (CRLF in its header and payload); a JWT naming someone; a NIP-98
    # value whose JSON carries UTF-8 as is.
    rfc7515 = ("eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkz"
               "ODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
    named = b64url(json.dumps({"sub": "Zoë Ågren", "iat": 1700000000}, ensure_ascii=False).encode()) + ".c2ln"
    nip98 = base64.b64encode(json.dumps({"content": "café", "kind": 27235, "tags": []},
                                        ensure_ascii=False).encode()).decode()
    for value in (rfc7515, named, nip98):
        assert leaks_in(f"INFO Authorization: {value}"), value


def test_a_random_token_that_contains_eyj_is_not_a_leak():
    # The CI run that found this: the banner's one-time setup link carried such a token.
    token = "eyJCRGkRYR3XgVLj" + b64url(bytes(range(1, 25)))
    assert base64.urlsafe_b64decode("eyJCRGkRYR3XgVLj")[:2] == b'{"'
    assert leaks_in(f"  admin  http://127.0.0.1:1/admin/setup?token={token}") == []
