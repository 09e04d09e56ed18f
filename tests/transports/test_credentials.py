"""The APNs signing key (.p8) and the provider token (ES256 JWT) cache."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from appliance.transports.credentials import TOKEN_LIFETIME, ApnsKey, CredentialError, ProviderToken, load_p8

from .conftest import KEY_ID, TEAM


def _pem(key, password: bytes | None = None) -> bytes:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.mark.parametrize("content,words", [
    (None, "does not exist"),
    (b"", "not a PEM private key"),
    (b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n", "not a PEM private key"),
    ("rsa", "P-256"),
    ("p384", "P-256"),
    ("encrypted", "password-protected"),
    (b"x" * 20000, "too large"),
])
def test_unusable_key_files_are_named(tmp_path, content, words):
    path = tmp_path / "AuthKey.p8"
    if content == "rsa":
        content = _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    elif content == "p384":
        content = _pem(ec.generate_private_key(ec.SECP384R1()))
    elif content == "encrypted":
        content = _pem(ec.generate_private_key(ec.SECP256R1()), b"secret")
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CredentialError) as err:
        load_p8(path)
    assert words in str(err.value)
    assert "PRIVATE" not in str(err.value)  # never the key material


def test_a_directory_is_not_a_key(tmp_path):
    with pytest.raises(CredentialError, match="is a directory"):
        load_p8(tmp_path)


@pytest.mark.parametrize("team,key_id", [("team123456", KEY_ID), (TEAM, "ABC123"), (TEAM, 1234567890), ("", KEY_ID)])
def test_team_and_key_ids_are_apples_ten_characters(p8, team, key_id):
    with pytest.raises(CredentialError):
        ApnsKey.load(team, key_id, p8[0])


def test_the_provider_token_is_an_es256_jwt_with_kid_iss_iat(p8):
    key = ApnsKey.load(TEAM, KEY_ID, p8[0])
    jwt = key.sign_token(1_700_000_000)
    head, claims, sig = jwt.split(".")
    assert json.loads(_b64(head)) == {"alg": "ES256", "kid": KEY_ID}
    assert json.loads(_b64(claims)) == {"iss": TEAM, "iat": 1_700_000_000}
    raw = _b64(sig)
    assert len(raw) == 64  # JOSE r||s, not DER
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    p8[1].public_key().verify(der, f"{head}.{claims}".encode(), ec.ECDSA(hashes.SHA256()))


def test_one_token_is_reused_for_its_lifetime_then_replaced(p8):
    now = [1_700_000_000.0]
    token = ProviderToken(ApnsKey.load(TEAM, KEY_ID, p8[0]), clock=lambda: now[0])
    first = token.current()
    now[0] += TOKEN_LIFETIME - 1
    assert token.current() == first and token.issued == 1
    now[0] += 1
    second = token.current()
    assert second != first and token.issued == 2
    assert 45 * 60 <= TOKEN_LIFETIME < 60 * 60  # Apple: under an hour, not more often than every 20 min


def test_refresh_replaces_only_the_stale_token(p8):
    token = ProviderToken(ApnsKey.load(TEAM, KEY_ID, p8[0]))
    stale = token.current()
    fresh = token.refresh(stale)
    assert fresh != stale
    # A second caller that saw the same stale token gets the new one, not a third token.
    assert token.refresh(stale) == fresh and token.issued == 2
    assert token.current() == fresh
