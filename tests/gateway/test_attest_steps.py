"""Each App Attest verification step refuses its own violation (software attester under a test CA)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import time

import cbor2
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from appliance.gateway.attest import AAGUID, AttestationFailed, Verifier, nonce_extension_value
from appliance.testing.attester import SoftwareAttester, TestCA
from tests.gateway.helpers import corrupt_intermediate

APP = "TEAM123456.com.example.app"
NOW = int(time.time())


@pytest.fixture(autouse=True)
def _now():
    """NOW is when each test runs: a fresh credential certificate is backdated only 5 minutes, and
    a slow suite can reach these tests longer than that after importing the module."""
    global NOW
    NOW = int(time.time())


@pytest.fixture(scope="module")
def ca():
    return TestCA()


def b64d(s: str) -> bytes:
    return base64.b64decode(s)


def verifier(ca, env="production", app=APP):
    return Verifier(app, env, (ca.root,))


def test_attestation_and_assertions_verify(ca):
    a = SoftwareAttester(ca, APP)
    key = verifier(ca).verify_attestation(b64d(a.attest(b"transcript")), a.key_id, b"transcript", NOW)
    assert key.public_key == a.point
    v = verifier(ca)
    assert v.verify_assertion(b64d(a.assert_(b"one")), b"one", key.public_key) == 1
    assert v.verify_assertion(b64d(a.assert_(b"two")), b"two", key.public_key) == 2


def test_development_environment_uses_the_develop_aaguid(ca):
    a = SoftwareAttester(ca, APP, "development")
    att = b64d(a.attest(b"t"))
    assert verifier(ca, "development").verify_attestation(att, a.key_id, b"t", NOW)
    with pytest.raises(AttestationFailed, match="AAGUID"):
        verifier(ca, "production").verify_attestation(att, a.key_id, b"t", NOW)


def _rebuild(att: bytes, **changes) -> bytes:
    obj = cbor2.loads(att)
    for path, value in changes.items():
        target = obj
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[k]
        if value is KeyError:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
    return cbor2.dumps(obj)


def test_structure_violations(ca):
    a = SoftwareAttester(ca, APP)
    att = b64d(a.attest(b"t"))
    inter = cbor2.loads(att)["attStmt"]["x5c"][1]
    cases = [
        _rebuild(att, fmt="packed"),
        _rebuild(att, attStmt__receipt=KeyError),
        _rebuild(att, attStmt__x5c=[cbor2.loads(att)["attStmt"]["x5c"][0]]),
        _rebuild(att, attStmt__x5c=cbor2.loads(att)["attStmt"]["x5c"] + [inter]),
        _rebuild(att, attStmt__x5c=[b"junk", inter]),
        _rebuild(att, authData="text"),
        _rebuild(att, extra=1),
        cbor2.dumps([1, 2]), b"\xff\x00", b"",
        # an intermediate (not yet checked against the root) that breaks once looked into
        _rebuild(att, attStmt__x5c=[cbor2.loads(att)["attStmt"]["x5c"][0], corrupt_intermediate(inter, "basic constraints")]),
        _rebuild(att, attStmt__x5c=[cbor2.loads(att)["attStmt"]["x5c"][0], corrupt_intermediate(inter, "curve")]),
    ]
    for bad in cases:
        with pytest.raises(AttestationFailed):
            verifier(ca).verify_attestation(bad, a.key_id, b"t", NOW)


def test_chain_violations(ca):
    a = SoftwareAttester(ca, APP)
    att = b64d(a.attest(b"t"))
    x5c = cbor2.loads(att)["attStmt"]["x5c"]
    other = TestCA()
    with pytest.raises(AttestationFailed, match="root"):
        verifier(other).verify_attestation(att, a.key_id, b"t", NOW)
    # credCert from another CA's intermediate
    b = SoftwareAttester(other, APP)
    x5c_other = cbor2.loads(b64d(b.attest(b"t")))["attStmt"]["x5c"]
    with pytest.raises(AttestationFailed, match="issued"):
        verifier(ca).verify_attestation(_rebuild(att, attStmt__x5c=[x5c_other[0], x5c[1]]), b.key_id, b"t", NOW)
    # the root itself in place of the intermediate (self-signed leaf chain is not accepted)
    with pytest.raises(AttestationFailed):
        verifier(ca).verify_attestation(_rebuild(att, attStmt__x5c=[x5c[0], ca.root.public_bytes(serialization.Encoding.DER)]),
                                        a.key_id, b"t", NOW)
    # several roots: any configured one anchors the chain
    assert Verifier(APP, "production", (other.root, ca.root)).verify_attestation(att, a.key_id, b"t", NOW)


def test_validity_windows(ca):
    a = SoftwareAttester(ca, APP)
    att = b64d(a.attest(b"t"))
    with pytest.raises(AttestationFailed, match="validity"):
        verifier(ca).verify_attestation(att, a.key_id, b"t", NOW + 4 * 86400)  # credCert lives 3 days
    with pytest.raises(AttestationFailed, match="validity"):
        verifier(ca).verify_attestation(att, a.key_id, b"t", NOW - 3600)
    old = TestCA(not_before=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc), days=30)
    b = SoftwareAttester(old, APP)
    with pytest.raises(AttestationFailed, match="validity"):
        verifier(old).verify_attestation(b64d(b.attest(b"t")), b.key_id, b"t", NOW)


def test_nonce_key_id_and_auth_data_steps(ca):
    a = SoftwareAttester(ca, APP)
    good = a.auth_data()
    v = verifier(ca)
    with pytest.raises(AttestationFailed, match="nonce"):
        v.verify_attestation(b64d(a.attest(b"t")), a.key_id, b"other", NOW)
    with pytest.raises(AttestationFailed, match="key id"):
        v.verify_attestation(b64d(a.attest(b"t")), hashlib.sha256(b"x").digest(), b"t", NOW)

    def with_auth(auth: bytes) -> bytes:
        return b64d(a.attest(b"t", auth_data=auth))

    cases = {
        "RP ID": hashlib.sha256(b"TEAM123456.com.other").digest() + good[32:],
        "counter": good[:33] + (1).to_bytes(4, "big") + good[37:],
        "AAGUID": good[:37] + AAGUID["development"] + good[53:],
        "credential id": good[:55] + bytes([good[55] ^ 1]) + good[56:],
        "attested credential": good[:32] + b"\x00" + good[33:],
        "too short": good[:50],
    }
    for match, auth in cases.items():
        with pytest.raises(AttestationFailed):
            v.verify_attestation(with_auth(auth), a.key_id, b"t", NOW)
    # The COSE key must be the certificate's key.
    other = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    cose = cbor2.dumps({1: 2, 3: -7, -1: 1, -2: other[1:33], -3: other[33:]})
    with pytest.raises(AttestationFailed, match="certificate"):
        v.verify_attestation(with_auth(good[:55 + 32] + cose), a.key_id, b"t", NOW)
    # Newer iOS appends a CBOR map after the COSE key without the ED flag: tolerated.
    assert v.verify_attestation(with_auth(good + cbor2.dumps({"ext": 1})), a.key_id, b"t", NOW)


def test_nonce_extension_der_is_strict():
    good = bytes.fromhex("3024a1220420") + b"\x11" * 32
    assert nonce_extension_value(good) == b"\x11" * 32
    for bad in (good + b"\x00", bytes.fromhex("3024a2220420") + b"\x11" * 32, bytes.fromhex("3024a1220320") + b"\x11" * 32,
                good[:-1], bytes.fromhex("3080a1220420") + b"\x11" * 32):
        with pytest.raises(AttestationFailed):
            nonce_extension_value(bad)


def _assertion(key, app: str, counter: int, client_data: bytes, flags: int = 0x40, ext: bytes = b"",
               members: dict | None = None) -> bytes:
    auth = hashlib.sha256(app.encode()).digest() + bytes([flags]) + counter.to_bytes(4, "big") + ext
    nonce = hashlib.sha256(auth + hashlib.sha256(client_data).digest()).digest()
    sig = key.sign(nonce, ec.ECDSA(hashes.SHA256()))
    return cbor2.dumps({"signature": sig, "authenticatorData": auth, **(members or {})})


def test_assertion_steps(ca):
    a = SoftwareAttester(ca, APP)
    v = verifier(ca)
    pk = a.point
    assert v.verify_assertion(_assertion(a.key, APP, 7, b"cd"), b"cd", pk) == 7
    assert v.verify_assertion(_assertion(a.key, APP, 8, b"cd", flags=0xC0, ext=cbor2.dumps({"x": b"1"})), b"cd", pk) == 8
    bad = [
        _assertion(a.key, "TEAM123456.com.other", 7, b"cd"),                       # RP ID
        _assertion(a.key, APP, 7, b"other"),                                        # client data
        _assertion(ec.generate_private_key(ec.SECP256R1()), APP, 7, b"cd"),         # another key
        _assertion(a.key, APP, 7, b"cd", ext=cbor2.dumps({"x": 1})),                # extensions without ED
        _assertion(a.key, APP, 7, b"cd", flags=0xC0, ext=cbor2.dumps({"x": 1}) + b"\x00"),  # trailing bytes
        _assertion(a.key, APP, 7, b"cd", flags=0xC0, ext=cbor2.dumps([1])),         # not a map
        _assertion(a.key, APP, 7, b"cd", members={"extra": 1}),                     # closed map
        cbor2.dumps({"signature": b"x"}), cbor2.dumps("x"), b"\xff", b"", b"x" * 1025,
    ]
    for assertion in bad:
        with pytest.raises(AttestationFailed):
            v.verify_assertion(assertion, b"cd", pk)
