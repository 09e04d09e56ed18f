"""Marmot authorization proofs (foundation/authorization-proofs.md) and their two proof classes:

- kind 450, `marmot.member.account-identity-proof.v2` (component 0x8009): the account key authorizes
  one MLS leaf signature key (app-components/account-identity-proof-v2.md);
- kind 452, `marmot.authorization.multi-device-join.v1` (component 0x800a): an active admin authorizes
  one exact leaf to join one exact candidate parent GroupContext (marmot-multi-device.md and
  app-components/multi-device-join-authorization-v1.md; the draft's kind wins, spec note M1).

A proof on the wire is the 104-byte envelope `signer_pubkey[32] || created_at(u64) || signature[64]`;
the signed Nostr event is a local-only template that a verifier rebuilds from the envelope and the
MLS context. Nothing here is ever published to a relay.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass

from appliance.nostr.event import compute_id
from appliance.nostr.keys import public_key, schnorr_sign, schnorr_verify, xonly_key

from .errors import ProofError
from .wire import Reader, uint64

__all__ = [
    "PROOF_LEN",
    "MAX_CREATED_AT",
    "ACCOUNT_IDENTITY_PROOF_KIND",
    "JOIN_AUTHORIZATION_KIND",
    "ACCOUNT_IDENTITY_PROOF_CONTENT",
    "JOIN_AUTHORIZATION_CONTENT",
    "LOCAL_ONLY_KINDS",
    "MarmotAuthorizationProof",
    "AccountIdentityBinding",
    "JoinAuthorizationBinding",
    "signing_event",
    "sign_proof",
    "verify_proof",
    "verify_account_identity_proof",
    "accept_signed_event",
    "is_xonly_pubkey",
    "hex_to_xonly",
]

PROOF_LEN = 104
MAX_CREATED_AT = 2**53 - 1

ACCOUNT_IDENTITY_PROOF_KIND = 450
# marmot-multi-device.md says "a canonical local-only kind 452 Nostr event"; the component document's
# revision says 451. The draft document is authoritative here (spec note M1).
JOIN_AUTHORIZATION_KIND = 452
# Every kind either document ever used for these templates: none may reach a relay.
LOCAL_ONLY_KINDS = frozenset({450, 451, 452})

ACCOUNT_IDENTITY_PROOF_CONTENT = "Authorize this MLS leaf key for my Marmot account"
JOIN_AUTHORIZATION_CONTENT = "Authorize this device to join the Marmot group"

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class MarmotAuthorizationProof:
    """The common 104-byte envelope."""

    signer_pubkey: bytes
    created_at: int
    signature: bytes

    def encode(self) -> bytes:
        if len(self.signer_pubkey) != 32 or len(self.signature) != 64:
            raise ProofError("proof fields have the wrong length", "proof.malformed")
        _check_created_at(self.created_at)
        return self.signer_pubkey + uint64(self.created_at) + self.signature

    @classmethod
    def decode(cls, data: bytes) -> "MarmotAuthorizationProof":
        """Exactly one proof: truncation or trailing bytes are refused (validation step 1)."""
        if not isinstance(data, (bytes, bytearray)) or len(data) != PROOF_LEN:
            size = len(data) if isinstance(data, (bytes, bytearray)) else "non-bytes"
            raise ProofError(f"a proof is exactly {PROOF_LEN} bytes, got {size}", "proof.length")
        r = Reader(bytes(data), "MarmotAuthorizationProof")
        proof = cls(r.fixed(32), r.uint64(), r.fixed(64))
        r.done()
        return proof

    @property
    def signer_hex(self) -> str:
        return self.signer_pubkey.hex()

    def to_json(self) -> dict:
        return {"signer_pubkey": self.signer_pubkey.hex(), "created_at": self.created_at,
                "signature": self.signature.hex()}


def _check_created_at(created_at: int) -> None:
    if type(created_at) is not int or not 1 <= created_at <= MAX_CREATED_AT:
        raise ProofError(f"created_at {created_at!r} outside 1..2^53-1", "proof.created_at")


def _hex_u16(value: int) -> str:
    """`0x` and exactly four lowercase hex digits."""
    if type(value) is not int or not 0 <= value <= 0xFFFF:
        raise ProofError(f"{value!r} is not a 16-bit code point", "proof.malformed")
    return f"0x{value:04x}"


def _bytes32(value: bytes, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) != 32:
        raise ProofError(f"{what} must be 32 bytes", "proof.malformed")
    return bytes(value)


@dataclass(frozen=True)
class AccountIdentityBinding:
    """What a kind 450 proof binds: the leaf's MLS signature key under a ciphersuite, for an account."""

    ciphersuite: int
    signature_scheme: int
    mls_signature_key: bytes

    kind = ACCOUNT_IDENTITY_PROOF_KIND
    content = ACCOUNT_IDENTITY_PROOF_CONTENT

    def tags(self) -> list[list[str]]:
        # account-identity-proof-v2.md, "Signing event": exact tags, exact order, nothing else.
        return [
            ["d", "marmot.account-identity-proof.v2"],
            ["component", "0x8009"],
            ["ciphersuite", _hex_u16(self.ciphersuite)],
            ["signature_scheme", _hex_u16(self.signature_scheme)],
            ["mls_signature_key", bytes(self.mls_signature_key).hex()],
        ]


@dataclass(frozen=True)
class JoinAuthorizationBinding:
    """What a kind 452 proof binds: the candidate parent state and the exact joining leaf."""

    group_id: bytes
    epoch: int
    group_context_hash: bytes
    joining_account: bytes
    ciphersuite: int
    signature_scheme: int
    mls_signature_key: bytes
    leaf_node_hash: bytes

    kind = JOIN_AUTHORIZATION_KIND
    content = JOIN_AUTHORIZATION_CONTENT

    @classmethod
    def from_mls(cls, *, group_context: bytes, group_id: bytes, epoch: int, ciphersuite: int,
                 signature_scheme: int, joining_leaf: bytes, joining_account: bytes,
                 mls_signature_key: bytes) -> "JoinAuthorizationBinding":
        """From the TLS serializations MLS owns: both hashes are SHA-256 of those exact bytes."""
        return cls(
            group_id=bytes(group_id),
            epoch=epoch,
            group_context_hash=hashlib.sha256(group_context).digest(),
            joining_account=bytes(joining_account),
            ciphersuite=ciphersuite,
            signature_scheme=signature_scheme,
            mls_signature_key=bytes(mls_signature_key),
            leaf_node_hash=hashlib.sha256(joining_leaf).digest(),
        )

    def tags(self) -> list[list[str]]:
        if type(self.epoch) is not int or not 0 <= self.epoch < 2**64:
            raise ProofError(f"epoch {self.epoch!r} is not a uint64", "proof.malformed")
        # multi-device-join-authorization-v1.md, "Signing event": exact tags, exact order.
        return [
            ["d", "marmot.multi-device-join-authorization.v1"],
            ["component", "0x800a"],
            ["group_id", bytes(self.group_id).hex()],
            ["epoch", str(self.epoch)],  # canonical decimal: str() of an int never pads
            ["group_context_hash", _bytes32(self.group_context_hash, "group_context_hash").hex()],
            ["account", _bytes32(self.joining_account, "joining account").hex()],
            ["ciphersuite", _hex_u16(self.ciphersuite)],
            ["signature_scheme", _hex_u16(self.signature_scheme)],
            ["mls_signature_key", bytes(self.mls_signature_key).hex()],
            ["leaf_node_hash", _bytes32(self.leaf_node_hash, "leaf_node_hash").hex()],
        ]

    def to_json(self) -> dict:
        return {
            "group_id": self.group_id.hex(), "epoch": self.epoch,
            "group_context_hash": self.group_context_hash.hex(), "account": self.joining_account.hex(),
            "ciphersuite": _hex_u16(self.ciphersuite), "signature_scheme": _hex_u16(self.signature_scheme),
            "mls_signature_key": self.mls_signature_key.hex(), "leaf_node_hash": self.leaf_node_hash.hex(),
        }


Binding = AccountIdentityBinding | JoinAuthorizationBinding


def signing_event(binding: Binding, signer_pubkey_hex: str, created_at: int, *, kind: int | None = None) -> dict:
    """The unsigned local-only template (with its NIP-01 id) for a binding.

    `kind` exists only so tests can rebuild the component document's published vector, which was
    computed under that revision's kind; producers and verifiers always use the binding's kind.
    """
    kind = binding.kind if kind is None else kind
    tags = binding.tags()
    event_id = compute_id(signer_pubkey_hex, created_at, kind, tags, binding.content)
    return {"id": event_id, "pubkey": signer_pubkey_hex, "created_at": created_at, "kind": kind,
            "tags": tags, "content": binding.content}


def sign_proof(binding: Binding, secret_hex: str, created_at: int | None = None, *,
               aux: bytes | None = None) -> MarmotAuthorizationProof:
    """Produce a proof with a local account key (producer steps 1-6)."""
    if created_at is None:
        created_at = int(time.time())  # the producer's current time; never backdated
    _check_created_at(created_at)
    pubkey_hex = public_key(secret_hex)
    template = signing_event(binding, pubkey_hex, created_at)
    signature = schnorr_sign(secret_hex, bytes.fromhex(template["id"]), aux)
    proof = MarmotAuthorizationProof(bytes.fromhex(pubkey_hex), created_at, bytes.fromhex(signature))
    verify_proof(proof.encode(), binding)  # step 5: validate what we produced before handing it out
    return proof


def accept_signed_event(binding: Binding, requested_pubkey_hex: str, requested_created_at: int,
                        event: dict) -> MarmotAuthorizationProof:
    """Take an external signer's signed event only if it is exactly the requested template.

    authorization-proofs.md, "Producing a proof": pubkey, created_at, kind, tags and content must
    equal the request, the id must be the recomputed NIP-01 id, and the signature must verify.
    """
    if not isinstance(event, dict):
        raise ProofError("the signer returned no event object", "proof.signer_response")
    expected = signing_event(binding, requested_pubkey_hex, requested_created_at)
    for field in ("pubkey", "created_at", "kind", "tags", "content", "id"):
        if event.get(field) != expected[field] or type(event.get(field)) is not type(expected[field]):
            raise ProofError(f"the signer changed the event's {field}", "proof.signer_substitution")
    sig = event.get("sig")
    if not isinstance(sig, str) or not schnorr_verify(requested_pubkey_hex, bytes.fromhex(expected["id"]), sig):
        raise ProofError("the signer's signature does not verify", "proof.bad_signature")
    return MarmotAuthorizationProof(bytes.fromhex(requested_pubkey_hex), requested_created_at, bytes.fromhex(sig))


def verify_proof(data: bytes, binding: Binding) -> MarmotAuthorizationProof:
    """Verifier steps 1-6: decode exactly, check the key and timestamp, rebuild, verify the signature.

    Class rules (signer is the credential identity, signer is an active admin, ...) are the caller's.
    """
    proof = MarmotAuthorizationProof.decode(data)
    try:
        xonly_key(proof.signer_pubkey.hex())
    except ValueError:
        raise ProofError("signer_pubkey is not a valid x-only secp256k1 public key", "proof.signer_key") from None
    _check_created_at(proof.created_at)
    template = signing_event(binding, proof.signer_hex, proof.created_at)
    if not schnorr_verify(proof.signer_hex, bytes.fromhex(template["id"]), proof.signature.hex()):
        raise ProofError("the BIP-340 signature does not verify for the rebuilt event", "proof.bad_signature")
    return proof


def is_xonly_pubkey(value: bytes) -> bool:
    """A 32-byte valid x-only secp256k1 public key (what a Marmot credential identity must be)."""
    if not isinstance(value, (bytes, bytearray)) or len(value) != 32:
        return False
    try:
        xonly_key(bytes(value).hex())
    except ValueError:
        return False
    return True


def verify_account_identity_proof(data: bytes, *, credential_identity: bytes, ciphersuite: int,
                                  signature_scheme: int, mls_signature_key: bytes) -> MarmotAuthorizationProof:
    """Kind 450 class rules on top of the envelope: the signer is the leaf's credential identity."""
    if not is_xonly_pubkey(credential_identity):
        raise ProofError("the credential identity is not a valid x-only secp256k1 public key",
                         "proof.credential_identity")
    binding = AccountIdentityBinding(ciphersuite, signature_scheme, bytes(mls_signature_key))
    proof = verify_proof(data, binding)
    if proof.signer_pubkey != bytes(credential_identity):
        raise ProofError("proof signer is not the leaf's credential identity", "proof.signer_not_identity")
    return proof


def hex_to_xonly(value: str, what: str) -> bytes:
    """A 64-lowercase-hex x-only key as 32 bytes, or a ProofError naming `what`."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ProofError(f"{what} must be 64 lowercase hex characters", "proof.malformed")
    raw = bytes.fromhex(value)
    if not is_xonly_pubkey(raw):
        raise ProofError(f"{what} is not a valid x-only secp256k1 public key", "proof.signer_key")
    return raw
