"""NIP-19 bech32 keys: `nsec` and `npub` to and from 32 raw bytes (bech32 reference implementation)."""

from __future__ import annotations

import re

import bech32

__all__ = ["Nip19Error", "decode_key", "encode_key", "parse_secret"]

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class Nip19Error(ValueError):
    """Text that is not the NIP-19 key it claims to be; str() is the reason."""


def decode_key(text: str, hrp: str) -> bytes:
    """32 bytes from an `nsec1...`/`npub1...` string with the expected prefix."""
    got, data = bech32.bech32_decode(text.strip())
    if got is None or data is None:
        raise Nip19Error(f"not a valid bech32 {hrp}")
    if got != hrp:
        raise Nip19Error(f"expected an {hrp}, got an {got}")
    raw = bech32.convertbits(data, 5, 8, False)
    if raw is None or len(raw) != 32:
        raise Nip19Error(f"an {hrp} holds exactly 32 bytes")
    return bytes(raw)


def encode_key(raw: bytes, hrp: str) -> str:
    if len(raw) != 32:
        raise Nip19Error(f"an {hrp} holds exactly 32 bytes")
    return bech32.bech32_encode(hrp, bech32.convertbits(raw, 8, 5, True))


def parse_secret(text: str) -> str:
    """A secret key given as 64 hex characters or as an nsec, returned as 64 lowercase hex."""
    text = text.strip()
    if _HEX64.fullmatch(text):
        return text.lower()
    if text.lower().startswith("nsec1"):
        return decode_key(text, "nsec").hex()
    raise Nip19Error("expected a secret key as 64 hex characters or an nsec1... string")
