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


def test_a_random_token_that_contains_eyj_is_not_a_leak():
    # The CI run that found this: the banner's one-time setup link carried such a token.
    token = "eyJCRGkRYR3XgVLj" + b64url(bytes(range(1, 25)))
    assert base64.urlsafe_b64decode("eyJCRGkRYR3XgVLj")[:2] == b'{"'
    assert leaks_in(f"  admin  http://127.0.0.1:1/admin/setup?token={token}") == []
