"""secp256k1 keys and BIP-340 Schnorr signatures (thin wrapper over coincurve)."""

from __future__ import annotations

import os
from functools import lru_cache

from coincurve import PrivateKey, PublicKeyXOnly

__all__ = ["generate_secret", "public_key", "schnorr_sign", "schnorr_verify", "xonly_key"]


def _secret_bytes(secret_hex: str) -> bytes:
    if not isinstance(secret_hex, str) or len(secret_hex) != 64:
        raise ValueError("secret key must be 64 hex characters")
    # bytes.fromhex raises ValueError on non-hex; coincurve checks the range 1..n-1.
    return bytes.fromhex(secret_hex)


def generate_secret() -> str:
    """A fresh random secret key as 64 lowercase hex characters."""
    return PrivateKey().secret.hex()


def public_key(secret_hex: str) -> str:
    """The BIP-340 x-only public key (64 lowercase hex) of a secret key."""
    return PublicKeyXOnly.from_secret(_secret_bytes(secret_hex)).format().hex()


# Parsing an x-only key means a square root on the curve; relays see the same
# authors over and over, so caching the parsed key roughly halves verify cost.
# The cached objects are never mutated (we never call tweak_add on them).
@lru_cache(maxsize=16384)
def xonly_key(pubkey_hex: str) -> PublicKeyXOnly:
    """Parsed x-only public key; raises ValueError if it is not a valid point."""
    return PublicKeyXOnly(bytes.fromhex(pubkey_hex))


def schnorr_sign(secret_hex: str, msg32: bytes, aux: bytes | None = None) -> str:
    """BIP-340 signature (128 lowercase hex) of a 32-byte message.

    aux is the 32 bytes of auxiliary randomness; None means fresh os.urandom
    (coincurve itself would read None as "no randomness", which BIP-340 allows
    but does not recommend, so we never pass None through).
    """
    if len(msg32) != 32:
        raise ValueError("message must be 32 bytes")
    if aux is None:
        aux = os.urandom(32)
    elif len(aux) != 32:
        raise ValueError("aux randomness must be 32 bytes")
    return PrivateKey(_secret_bytes(secret_hex)).sign_schnorr(msg32, aux).hex()


def schnorr_verify(pubkey_hex: str, msg32: bytes, sig_hex: str) -> bool:
    """True iff sig_hex is a valid BIP-340 signature of msg32 by pubkey_hex; never raises on bad input."""
    try:
        if len(pubkey_hex) != 64 or len(sig_hex) != 128:
            return False
        return xonly_key(pubkey_hex).verify(bytes.fromhex(sig_hex), bytes(msg32))
    except (ValueError, TypeError):
        return False
