"""Real App Attest objects from iPhones (../shared/vectors/app-attest) verify at a fixed time inside
their validity, under Apple's bundled root, and fail when any input is flipped."""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime

import cbor2
import pytest
from cryptography import x509

from appliance.gateway.attest import AttestationFailed, Verifier, load_roots
from appliance.testing.attester import TestCA
from tests.conftest import vectors_dir

VECTORS = vectors_dir()
pytestmark = pytest.mark.skipif(VECTORS is None, reason="../shared/vectors not found (set APPLIANCE_VECTORS)")
APPLE = load_roots() if VECTORS else ()
UEBELACK_APP_ID = "V8H6LQ9448.io.uebelacker.AppAttestExample"  # uebelack/node-app-attest test constants


def _yaml_docs(path) -> list[dict]:
    """The flat `key: value` documents of the veehaitch fixtures (no YAML library needed)."""
    docs, cur = [], {}
    for line in path.read_text().splitlines():
        if line.startswith("---"):
            if cur:
                docs.append(cur)
            cur = {}
            continue
        m = re.match(r"([A-Za-z0-9]+): (.*)$", line)
        if m:
            cur[m.group(1)] = m.group(2).strip("'")
    if cur:
        docs.append(cur)
    return docs


def _uebelack(env: str) -> dict:
    d = json.loads((VECTORS / "app-attest" / f"uebelack-attestation-{env}.json").read_text())
    att = base64.b64decode(d["attestation"])
    leaf = x509.load_der_x509_certificate(cbor2.loads(att)["attStmt"]["x5c"][0])
    return {"attestation": att, "key_id": base64.b64decode(d["keyId"]),
            "client_data": base64.b64decode(d["challenge"]),  # node-app-attest's clientData
            "app_id": UEBELACK_APP_ID, "env": env,
            "now": int(leaf.not_valid_before_utc.timestamp()) + 86400,
            "leaf_end": int(leaf.not_valid_after_utc.timestamp())}


def _veehaitch(version: str) -> dict:
    docs = _yaml_docs(VECTORS / "app-attest" / f"veehaitch-ios-{version}.yaml")
    a = next(d for d in docs if d.get("type") == "attestation")
    s = next(d for d in docs if d.get("type") == "assertion")
    ts = int(datetime.fromisoformat(a["timestamp"].replace("Z", "+00:00")).timestamp())
    att = base64.b64decode(a["attestationBase64"])
    leaf = x509.load_der_x509_certificate(cbor2.loads(att)["attStmt"]["x5c"][0])
    return {"attestation": att, "key_id": base64.b64decode(a["keyIdBase64"]),
            "client_data": base64.b64decode(a["clientDataBase64"]), "app_id": f"{a['teamIdentifier']}.{a['bundleIdentifier']}",
            "env": "development", "now": ts, "leaf_end": int(leaf.not_valid_after_utc.timestamp()),
            "assertion": base64.b64decode(s["assertionBase64"]),
            "assertion_client_data": base64.b64decode(s["clientDataBase64"]), "counter": int(s["counter"])}


def _fixtures():
    if VECTORS is None:
        return []
    return [_uebelack("development"), _uebelack("production"), _veehaitch("14.2"), _veehaitch("14.4")]


# Without the vectors there is nothing to name (the module is skipped with its reason).
IDS = ["uebelack-development", "uebelack-production", "veehaitch-14.2", "veehaitch-14.4"] if VECTORS else []


def verify(f, *, app_id=None, env=None, roots=None, key_id=None, client_data=None, now=None, attestation=None):
    v = Verifier(app_id or f["app_id"], env or f["env"], APPLE if roots is None else roots)
    return v.verify_attestation(attestation or f["attestation"], key_id or f["key_id"],
                                f["client_data"] if client_data is None else client_data, f["now"] if now is None else now)


@pytest.mark.parametrize("f", _fixtures(), ids=IDS)
def test_real_attestation_verifies_at_a_time_inside_its_validity(f):
    key = verify(f)
    assert key.key_id == f["key_id"] and len(key.public_key) == 65 and key.public_key[0] == 4


@pytest.mark.parametrize("f", _fixtures(), ids=IDS)
def test_any_flipped_input_fails(f):
    flipped_cd = bytes([f["client_data"][0] ^ 1]) + f["client_data"][1:]
    cases = {
        "challenge": dict(client_data=flipped_cd),
        "challenge-extended": dict(client_data=f["client_data"] + b"x"),
        "key id": dict(key_id=bytes([f["key_id"][0] ^ 1]) + f["key_id"][1:]),
        "app id": dict(app_id=f["app_id"] + "x"),
        "team id": dict(app_id="X" + f["app_id"][1:]),
        "environment": dict(env="production" if f["env"] == "development" else "development"),
        "after expiry": dict(now=f["leaf_end"] + 1),
        "before issue": dict(now=f["now"] - 10 * 86400),
        "wrong root": dict(roots=(TestCA().root,)),
    }
    for name, kw in cases.items():
        with pytest.raises(AttestationFailed):
            verify(f, **kw)
            pytest.fail(f"flipped {name} verified")


@pytest.mark.parametrize("f", _fixtures(), ids=IDS)
def test_any_flipped_byte_of_the_object_fails(f):
    att = f["attestation"]
    # Bytes spread over the CBOR: certificates, signatures, authData, receipt.
    for i in range(0, len(att), max(1, len(att) // 97)):
        mutated = att[:i] + bytes([att[i] ^ 0x01]) + att[i + 1:]
        try:
            verify(f, attestation=mutated)
        except AttestationFailed:
            continue
        # Only the receipt (which Apple's steps do not check) may change without effect.
        obj = cbor2.loads(mutated)
        assert obj["authData"] == cbor2.loads(att)["authData"]
        assert obj["attStmt"]["x5c"] == cbor2.loads(att)["attStmt"]["x5c"]


@pytest.mark.parametrize("version", ["14.2", "14.4"])
def test_real_assertion_of_the_same_key_verifies(version):
    f = _veehaitch(version)
    key = verify(f)
    v = Verifier(f["app_id"], "development", APPLE)
    assert v.verify_assertion(f["assertion"], f["assertion_client_data"], key.public_key) == f["counter"] == 1
    with pytest.raises(AttestationFailed):
        v.verify_assertion(f["assertion"], f["assertion_client_data"] + b"!", key.public_key)
    with pytest.raises(AttestationFailed):
        Verifier(f["app_id"] + "x", "development", APPLE).verify_assertion(
            f["assertion"], f["assertion_client_data"], key.public_key)
    other = _veehaitch("14.4" if version == "14.2" else "14.2")
    with pytest.raises(AttestationFailed):  # another device's key
        v.verify_assertion(f["assertion"], f["assertion_client_data"], verify(other).public_key)
    for i in range(len(f["assertion"])):
        mutated = f["assertion"][:i] + bytes([f["assertion"][i] ^ 0x01]) + f["assertion"][i + 1:]
        with pytest.raises(AttestationFailed):
            v.verify_assertion(mutated, f["assertion_client_data"], key.public_key)


# A real iOS delegation assertion whose authenticatorData carries Apple extension data (ED flag),
# published with the Buzz gateway's tests (block/buzz, tests/fixtures/app-attest-assertion-extensions.json).
BUZZ_EXT = {
    "app_id": "6PU678XRWJ.com.monotelabs.buzz",
    "public_key": "041740cd1acf5c8bcf5a196bb26c231ed025efbede78275195779bb1a81fdf83bba02a934be3830c1fe91e59b6443b81c6f3af"
                  "42f02fb4b42ed21596ab54b96c72",
    "client_data": 'buzz.push.delegate.v1\n{"v":1,"audience":"https://push.buzz.xyz/v1/delegations","challenge_id":'
                   '"9e2dd642-6d35-4cf1-9b96-e5f2fd6a87be","challenge":"z1vnVBypyq1bcc_lsE2TwSc4tWQpAwDp6JBN1_7BMx0",'
                   '"installation_handle":"79ee98e7-96be-4c98-acff-5aacb7e72d11","endpoint_epoch":1,"generation":116,'
                   '"relay_pubkey":"324e339a09bcd6a72a560a81b99ed8790c76d8f2d4d065a313864331a0e737a0",'
                   '"not_before":1790846356,"expires_at":1793436900}',
    "assertion": "omlzaWduYXR1cmVYSDBGAiEAzceni1j9sWQukx84gRLz7586KWAQgsxQZvVrJwITkDUCIQD3xgDLFOEj3A5qEpjBhe4Hfqrf7TxS9HSo"
                 "uFcNRvW/23FhdXRoZW50aWNhdG9yRGF0YVhjrcEZ3QzlsQSzlnMT1WvkcRWBm9jenhcwHPkQV7/g9/bAAAAAdKJ3YXBwbGVfYnVuZGxl"
                 "X3ZlcnNpb25fMDFhMngcYXBwbGVfdmFsaWRhdGlvbl9jYXRlZ29yeV8wMUQCAAAA",
}


def test_real_assertion_with_extension_data():
    v = Verifier(BUZZ_EXT["app_id"], "production", APPLE)
    assertion = base64.b64decode(BUZZ_EXT["assertion"])
    key = bytes.fromhex(BUZZ_EXT["public_key"])
    assert v.verify_assertion(assertion, BUZZ_EXT["client_data"].encode(), key) == 116
    with pytest.raises(AttestationFailed):
        v.verify_assertion(assertion, BUZZ_EXT["client_data"].replace("116", "117").encode(), key)
