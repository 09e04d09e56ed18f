"""Cipher suite 0x0001: MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519 (RFC 9420 §5, §17.1).

Primitives come from libraries: SHA-256/HMAC from the standard library, HKDF-Expand, AES-GCM,
X25519 and Ed25519 from `cryptography`, HPKE (RFC 9180 base mode, exporter, DeriveKeyPair) from
`pyhpke`. This module adds only the MLS labelled wrappers around them.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from pyhpke import AEADId, CipherSuite, KDFId, KEMId
from pyhpke.keys.x25519_key import X25519Key

from .codec import u16, u32, vl
from .errors import DecryptError, SignatureError, UnsupportedError

CIPHER_SUITE = 0x0001
SIGNATURE_SCHEME = 0x0807  # ed25519 (TLS SignatureScheme)
NH = 32  # KDF.Nh: SHA-256 output
NK = 16  # AEAD.Nk: AES-128-GCM key
NN = 12  # AEAD.Nn: nonce

_LABEL_PREFIX = b"MLS 1.0 "
_HPKE = CipherSuite.new(KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, AEADId.AES128_GCM)
_SHA256 = hashes.SHA256()


def require_suite(suite: int) -> None:
    if suite != CIPHER_SUITE:
        raise UnsupportedError(f"cipher suite 0x{suite:04x} is not supported (only 0x0001)")


def random_bytes(n: int = NH) -> bytes:
    return os.urandom(n)


def hash(data: bytes) -> bytes:  # noqa: A001 - the RFC's own name
    return hashlib.sha256(data).digest()


def mac(key: bytes, data: bytes) -> bytes:
    return hmac.digest(key, data, "sha256")


def mac_verify(key: bytes, data: bytes, tag: bytes) -> bool:
    return hmac.compare_digest(mac(key, data), tag)


def extract(salt: bytes, ikm: bytes) -> bytes:
    """KDF.Extract = HKDF-Extract: HMAC(salt, ikm), the empty salt standing for Nh zeros."""
    return hmac.digest(salt or bytes(NH), ikm, "sha256")


def expand(prk: bytes, info: bytes, length: int) -> bytes:
    return HKDFExpand(_SHA256, length, info).derive(prk)


def expand_with_label(secret: bytes, label: bytes, context: bytes, length: int) -> bytes:
    info = u16(length) + vl(_LABEL_PREFIX + label) + vl(context)
    return expand(secret, info, length)


def derive_secret(secret: bytes, label: bytes) -> bytes:
    return expand_with_label(secret, label, b"", NH)


def derive_tree_secret(secret: bytes, label: bytes, generation: int, length: int) -> bytes:
    return expand_with_label(secret, label, u32(generation), length)


def ref_hash(label: bytes, value: bytes) -> bytes:
    return hash(vl(label) + vl(value))


def make_key_package_ref(key_package: bytes) -> bytes:
    return ref_hash(b"MLS 1.0 KeyPackage Reference", key_package)


def make_proposal_ref(authenticated_content: bytes) -> bytes:
    return ref_hash(b"MLS 1.0 Proposal Reference", authenticated_content)


# -- signatures ---------------------------------------------------------------------------------

def signature_keypair() -> tuple[bytes, bytes]:
    """A fresh Ed25519 key pair as (private seed, public key)."""
    sk = Ed25519PrivateKey.generate()
    return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()


def signature_public(priv: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(priv).public_key().public_bytes_raw()


def sign_with_label(priv: bytes, label: bytes, content: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(priv).sign(vl(_LABEL_PREFIX + label) + vl(content))


def verify_with_label(pub: bytes, label: bytes, content: bytes, signature: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(pub).verify(signature, vl(_LABEL_PREFIX + label) + vl(content))
        return True
    except (InvalidSignature, ValueError):
        return False


def require_signature(pub: bytes, label: bytes, content: bytes, signature: bytes, what: str) -> None:
    if not verify_with_label(pub, label, content, signature):
        raise SignatureError(f"{what}: signature does not verify")


# -- HPKE -------------------------------------------------------------------------------------

def hpke_keypair() -> tuple[bytes, bytes]:
    sk = X25519PrivateKey.generate()
    return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()


def hpke_public(priv: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(priv).public_key().public_bytes_raw()


def derive_keypair(ikm: bytes) -> tuple[bytes, bytes]:
    """KEM.DeriveKeyPair (RFC 9180 §7.1.3) as (private, public) raw X25519 keys."""
    kp = _HPKE.kem.derive_key_pair(ikm)
    return kp.private_key.to_private_bytes(), kp.public_key.to_public_bytes()


def _pub(pub: bytes):
    try:
        return X25519Key.from_public_bytes(pub)
    except ValueError as exc:
        raise DecryptError(f"invalid HPKE public key: {exc}") from None


def _priv(priv: bytes):
    try:
        return X25519Key.from_private_bytes(priv)
    except ValueError as exc:
        raise DecryptError(f"invalid HPKE private key: {exc}") from None


def _encrypt_context(label: bytes, context: bytes) -> bytes:
    return vl(_LABEL_PREFIX + label) + vl(context)


def _sender_context(pub: bytes, info: bytes):
    key = _pub(pub)
    try:
        return _HPKE.create_sender_context(key, info)
    except Exception as exc:  # e.g. a low-order X25519 point: the shared secret is all zeros
        raise DecryptError(f"HPKE setup failed: unusable public key ({type(exc).__name__})") from None


def encrypt_with_label(pub: bytes, label: bytes, context: bytes, plaintext: bytes) -> tuple[bytes, bytes]:
    """EncryptWithLabel: returns (kem_output, ciphertext)."""
    enc, ctx = _sender_context(pub, _encrypt_context(label, context))
    return enc, ctx.seal(plaintext, b"")


def decrypt_with_label(priv: bytes, label: bytes, context: bytes, kem_output: bytes, ciphertext: bytes) -> bytes:
    try:
        ctx = _HPKE.create_recipient_context(kem_output, _priv(priv), _encrypt_context(label, context))
        return ctx.open(ciphertext, b"")
    except DecryptError:
        raise
    except Exception as exc:  # pyhpke raises its own OpenError / ValueError variants
        raise DecryptError(f"HPKE open failed ({label.decode()}): {type(exc).__name__}") from None


def export_sender(pub: bytes, exporter_context: bytes, length: int) -> tuple[bytes, bytes]:
    """SetupBaseS(pub, "") then Export: returns (kem_output, secret). For ExternalInit."""
    enc, ctx = _sender_context(pub, b"")
    return enc, ctx.export(exporter_context, length)


def export_receiver(priv: bytes, kem_output: bytes, exporter_context: bytes, length: int) -> bytes:
    try:
        ctx = _HPKE.create_recipient_context(kem_output, _priv(priv), b"")
    except DecryptError:
        raise
    except Exception as exc:
        raise DecryptError(f"HPKE setup failed: {type(exc).__name__}") from None
    return ctx.export(exporter_context, length)


# -- AEAD -------------------------------------------------------------------------------------

def aead_seal(key: bytes, nonce: bytes, aad: bytes, plaintext: bytes) -> bytes:
    return AESGCM(key).encrypt(nonce, plaintext, aad)


def aead_open(key: bytes, nonce: bytes, aad: bytes, ciphertext: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, aad)
    except InvalidTag:
        raise DecryptError("AEAD open failed") from None
