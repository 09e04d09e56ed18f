"""Marmot authorization proofs: the spec's own signing vectors byte for byte, and every validation step."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from appliance.marmot import proofs
from appliance.marmot.errors import ProofError
from appliance.marmot.proofs import (
    AccountIdentityBinding,
    JoinAuthorizationBinding,
    MarmotAuthorizationProof,
    accept_signed_event,
    sign_proof,
    signing_event,
    verify_account_identity_proof,
    verify_proof,
)
from appliance.nostr.event import canonical_json
from appliance.nostr.keys import generate_secret, public_key, schnorr_sign

SK3 = "%064x" % 3
PK3 = "f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9"
ZERO_AUX = bytes(32)

# app-components/account-identity-proof-v2.md, "Signing test vector"
AIP = {
    "created_at": 1700000000,
    "mls_signature_key": "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
    "serialization": '[0,"f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9",1700000000,450,[["d","marmot.account-identity-proof.v2"],["component","0x8009"],["ciphersuite","0x0001"],["signature_scheme","0x0807"],["mls_signature_key","000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"]],"Authorize this MLS leaf key for my Marmot account"]',
    "event_id": "b7e9a15dd85990fb0f49c33db3cc9875f73986207b038404ceb6b7fec4e0af6b",
    "signature": "c5315d3c85b9d4907cb03395a2a97b3ba2eab393f8e45b13a5d5233acedac60a51d2a295e1b1b5ee372d18a49bdb8041a7dba9dedce722c7c6f712f78bbdfb5d",
    "data": "f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9000000006553f100c5315d3c85b9d4907cb03395a2a97b3ba2eab393f8e45b13a5d5233acedac60a51d2a295e1b1b5ee372d18a49bdb8041a7dba9dedce722c7c6f712f78bbdfb5d",
}

# app-components/multi-device-join-authorization-v1.md, "Signing test vector" (computed under kind 451)
JOIN = {
    "created_at": 1700000060,
    "binding": JoinAuthorizationBinding(
        group_id=bytes.fromhex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"),
        epoch=7,
        group_context_hash=bytes.fromhex("202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"),
        joining_account=bytes.fromhex("2f8bde4d1a07209355b4a7250a5c5128e88b84bddc619ab7cba8d569b240efe4"),
        ciphersuite=0x0001,
        signature_scheme=0x0807,
        mls_signature_key=bytes.fromhex("404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"),
        leaf_node_hash=bytes.fromhex("606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"),
    ),
    "serialization": '[0,"f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9",1700000060,451,[["d","marmot.multi-device-join-authorization.v1"],["component","0x800a"],["group_id","000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"],["epoch","7"],["group_context_hash","202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"],["account","2f8bde4d1a07209355b4a7250a5c5128e88b84bddc619ab7cba8d569b240efe4"],["ciphersuite","0x0001"],["signature_scheme","0x0807"],["mls_signature_key","404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"],["leaf_node_hash","606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"]],"Authorize this device to join the Marmot group"]',
    "event_id": "5742d21abace7c54ddb386b3276a4c3c0f2cf04e01037aa723b5d84b447f17be",
    "signature": "dd19fefcc2dc03fdc8b8540bd938ea6af6abcef70d3b2698ac65c0f96ebe54a6e0fde0bea14f85ddc3960c5a3f310fef7d2ac5aac7e7453e32e5692fb5df247c",
    "data": "f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9000000006553f13cdd19fefcc2dc03fdc8b8540bd938ea6af6abcef70d3b2698ac65c0f96ebe54a6e0fde0bea14f85ddc3960c5a3f310fef7d2ac5aac7e7453e32e5692fb5df247c",
}

AIP_BINDING = AccountIdentityBinding(0x0001, 0x0807, bytes.fromhex(AIP["mls_signature_key"]))


def _serialization(template: dict) -> str:
    return canonical_json(template["pubkey"], template["created_at"], template["kind"], template["tags"],
                          template["content"]).decode()


def test_account_identity_proof_vector_byte_for_byte():
    template = signing_event(AIP_BINDING, PK3, AIP["created_at"])
    assert _serialization(template) == AIP["serialization"]
    assert template["id"] == AIP["event_id"]
    proof = sign_proof(AIP_BINDING, SK3, AIP["created_at"], aux=ZERO_AUX)
    assert proof.signature.hex() == AIP["signature"]
    assert proof.encode().hex() == AIP["data"]
    assert len(proof.encode()) == proofs.PROOF_LEN == 104
    decoded = verify_proof(bytes.fromhex(AIP["data"]), AIP_BINDING)
    assert decoded == proof and decoded.created_at == 1700000000 and decoded.signer_hex == PK3


def test_account_identity_proof_class_rule_signer_is_credential_identity():
    data = bytes.fromhex(AIP["data"])
    verify_account_identity_proof(data, credential_identity=bytes.fromhex(PK3), ciphersuite=1,
                                  signature_scheme=0x0807, mls_signature_key=AIP_BINDING.mls_signature_key)
    other = bytes.fromhex(public_key(generate_secret()))
    with pytest.raises(ProofError) as e:
        verify_account_identity_proof(data, credential_identity=other, ciphersuite=1, signature_scheme=0x0807,
                                      mls_signature_key=AIP_BINDING.mls_signature_key)
    assert e.value.code == "proof.signer_not_identity"
    with pytest.raises(ProofError) as e:
        verify_account_identity_proof(data, credential_identity=b"\x00" * 32, ciphersuite=1,
                                      signature_scheme=0x0807, mls_signature_key=AIP_BINDING.mls_signature_key)
    assert e.value.code == "proof.credential_identity"


def test_join_authorization_vector_byte_for_byte_under_the_component_documents_kind():
    """The published vector was computed with kind 451 (that document's revision); our producer uses
    kind 452 as marmot-multi-device.md says (spec note M1). The construction is otherwise identical."""
    binding = JOIN["binding"]
    template = signing_event(binding, PK3, JOIN["created_at"], kind=451)
    assert _serialization(template) == JOIN["serialization"]
    assert template["id"] == JOIN["event_id"]
    sig = schnorr_sign(SK3, bytes.fromhex(template["id"]), ZERO_AUX)
    assert sig == JOIN["signature"]
    data = MarmotAuthorizationProof(bytes.fromhex(PK3), JOIN["created_at"], bytes.fromhex(sig)).encode()
    assert data.hex() == JOIN["data"]


def test_join_authorization_is_kind_452_and_refuses_the_451_proof():
    binding = JOIN["binding"]
    template = signing_event(binding, PK3, JOIN["created_at"])
    assert template["kind"] == 452 == proofs.JOIN_AUTHORIZATION_KIND
    assert template["content"] == "Authorize this device to join the Marmot group"
    assert [t[0] for t in template["tags"]] == ["d", "component", "group_id", "epoch", "group_context_hash",
                                                "account", "ciphersuite", "signature_scheme",
                                                "mls_signature_key", "leaf_node_hash"]
    proof = sign_proof(binding, SK3, JOIN["created_at"], aux=ZERO_AUX)
    assert verify_proof(proof.encode(), binding) == proof
    # The envelope signed under 451 does not verify as a 452 proof (and 450 never does either).
    with pytest.raises(ProofError) as e:
        verify_proof(bytes.fromhex(JOIN["data"]), binding)
    assert e.value.code == "proof.bad_signature"


def test_from_mls_hashes_the_exact_tls_bytes():
    gc, leaf = b"group-context-bytes", b"leaf-node-bytes"
    b = JoinAuthorizationBinding.from_mls(group_context=gc, group_id=b"\x01" * 16, epoch=0, ciphersuite=1,
                                          signature_scheme=0x0807, joining_leaf=leaf,
                                          joining_account=bytes.fromhex(PK3), mls_signature_key=b"\x02" * 32)
    assert b.group_context_hash == hashlib.sha256(gc).digest()
    assert b.leaf_node_hash == hashlib.sha256(leaf).digest()
    assert ["epoch", "0"] in b.tags()  # zero itself is "0"


@pytest.mark.parametrize("mutate", ["group_id", "epoch", "group_context_hash", "joining_account", "ciphersuite",
                                    "signature_scheme", "mls_signature_key", "leaf_node_hash"])
def test_every_bound_value_matters(mutate):
    binding = JOIN["binding"]
    proof = sign_proof(binding, SK3, JOIN["created_at"])
    fields = dict(binding.__dict__)
    value = fields[mutate]
    fields[mutate] = value + 1 if isinstance(value, int) else bytes([value[0] ^ 1]) + value[1:]
    with pytest.raises(ProofError) as e:
        verify_proof(proof.encode(), JoinAuthorizationBinding(**fields))
    assert e.value.code == "proof.bad_signature"


@pytest.mark.parametrize("data,code", [
    (b"", "proof.length"),
    (bytes.fromhex(AIP["data"])[:-1], "proof.length"),
    (bytes.fromhex(AIP["data"]) + b"\x00", "proof.length"),
    (b"\x00" * 32 + bytes.fromhex(AIP["data"])[32:], "proof.signer_key"),  # x = 0 is not on the curve
    (bytes.fromhex(PK3) + bytes(8) + bytes.fromhex(AIP["signature"]), "proof.created_at"),
    (bytes.fromhex(PK3) + (2**53).to_bytes(8, "big") + bytes.fromhex(AIP["signature"]), "proof.created_at"),
    (bytes.fromhex(AIP["data"])[:-1] + b"\x00", "proof.bad_signature"),
])
def test_verifier_steps(data, code):
    with pytest.raises(ProofError) as e:
        verify_proof(data, AIP_BINDING)
    assert e.value.code == code


def test_producer_never_zero_or_unsafe_timestamps():
    for bad in (0, -1, 2**53, "1700000000", True):
        with pytest.raises(ProofError):
            sign_proof(AIP_BINDING, SK3, bad)
    assert sign_proof(AIP_BINDING, SK3, 2**53 - 1).created_at == 2**53 - 1


def test_external_signer_response_must_be_exactly_the_request():
    template = signing_event(AIP_BINDING, PK3, AIP["created_at"])
    signed = {**template, "sig": AIP["signature"]}
    proof = accept_signed_event(AIP_BINDING, PK3, AIP["created_at"], orjson.loads(orjson.dumps(signed)))
    assert proof.encode().hex() == AIP["data"]
    for field, value in [("tags", template["tags"] + [["client", "x"]]), ("content", "other"),
                         ("created_at", AIP["created_at"] + 1), ("kind", 1), ("pubkey", "0" * 64),
                         ("id", "0" * 64)]:
        with pytest.raises(ProofError) as e:
            accept_signed_event(AIP_BINDING, PK3, AIP["created_at"], {**signed, field: value})
        assert e.value.code == "proof.signer_substitution", field
    with pytest.raises(ProofError) as e:
        accept_signed_event(AIP_BINDING, PK3, AIP["created_at"], {**signed, "sig": JOIN["signature"]})
    assert e.value.code == "proof.bad_signature"


def test_tag_value_encodings():
    b = AccountIdentityBinding(0x0003, 0x0807, b"\xab" * 32)
    assert b.tags()[2] == ["ciphersuite", "0x0003"] and b.tags()[3] == ["signature_scheme", "0x0807"]
    with pytest.raises(ProofError):
        AccountIdentityBinding(0x10000, 0x0807, b"").tags()


@pytest.mark.parametrize("vector,binding", [(AIP["data"], AIP_BINDING), (JOIN["data"], None)])
def test_every_single_byte_mutation_is_refused(vector, binding):
    """Any change to any of the 104 bytes (the key, the timestamp, the signature) is refused."""
    data = bytes.fromhex(vector)
    if binding is None:  # the join vector as a kind 452 proof: sign it under 452 first
        binding = JOIN["binding"]
        data = sign_proof(binding, SK3, JOIN["created_at"], aux=ZERO_AUX).encode()
    verify_proof(data, binding)
    for i in range(len(data)):
        for flip in (0x01, 0x80):
            mutated = data[:i] + bytes([data[i] ^ flip]) + data[i + 1:]
            with pytest.raises(ProofError):
                verify_proof(mutated, binding)


# The component document's join vector reproduced under kind 452, the kind the draft names (spec note
# M1): the same inputs, secret key 3 and zero auxiliary randomness; the serialization differs only in
# the kind. This is what the appliance produces and the only join authorization it accepts.
JOIN_452 = {
    "event_id": "aa6c83eefe4f96d2e28135c93ff32412d64aeb79096a545f8e8cad4af31187f2",
    "signature": "e8fad066f7eea0271fecd1808728004b09bde30e59af63d3bf8d07413e65382a"
                 "8e55e3247d5cdfc3b4fc5c5c8fc02b02a0a4b5eff44fe2c42641c11b57cd5dc8",
}


def test_join_authorization_vector_under_kind_452_and_nothing_else_accepted():
    binding = JOIN["binding"]
    serialization = JOIN["serialization"].replace(",1700000060,451,", ",1700000060,452,", 1)
    assert serialization.count(",452,") == 1
    template = signing_event(binding, PK3, JOIN["created_at"])
    assert _serialization(template) == serialization
    assert template["id"] == hashlib.sha256(serialization.encode()).hexdigest() == JOIN_452["event_id"]
    proof = sign_proof(binding, SK3, JOIN["created_at"], aux=ZERO_AUX)
    assert proof.signature.hex() == JOIN_452["signature"]
    assert proof.encode().hex() == PK3 + "000000006553f13c" + JOIN_452["signature"]
    assert verify_proof(proof.encode(), binding) == proof
    # The same binding signed under any other kind (450, the account proof's; 451, the component
    # document's) is refused, and an external signer's event of another kind is not taken.
    for kind in (450, 451, 453):
        other = signing_event(binding, PK3, JOIN["created_at"], kind=kind)
        sig = schnorr_sign(SK3, bytes.fromhex(other["id"]), ZERO_AUX)
        data = MarmotAuthorizationProof(bytes.fromhex(PK3), JOIN["created_at"], bytes.fromhex(sig)).encode()
        with pytest.raises(ProofError) as e:
            verify_proof(data, binding)
        assert e.value.code == "proof.bad_signature", kind
        with pytest.raises(ProofError) as e:
            accept_signed_event(binding, PK3, JOIN["created_at"], {**other, "sig": sig})
        assert e.value.code == "proof.signer_substitution", kind
