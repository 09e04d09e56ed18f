"""NIP-44 v2 encrypted payloads, including the 2026-06-28 extended (u32) length prefix."""

from __future__ import annotations

import base64
import binascii
import hmac as _hmac
import os

from coincurve import PrivateKey, PublicKey
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import hmac as c_hmac
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

__all__ = [
    "Nip44Error",
    "get_conversation_key",
    "get_message_keys",
    "calc_padded_len",
    "pad",
    "unpad",
    "encrypt",
    "decrypt",
    "MIN_PLAINTEXT_SIZE",
    "MAX_PLAINTEXT_SIZE",
    "EXTENDED_PREFIX_THRESHOLD",
    "max_payload_len",
]

VERSION = 2
MIN_PLAINTEXT_SIZE = 1
# Amended NIP-44 (2026-06-28): up to 2^32-1 bytes. Lengths below the threshold
# keep the original 2-byte big-endian prefix, so every payload an old writer
# produced stays valid; from the threshold on the prefix is 00 00 + u32 BE.
MAX_PLAINTEXT_SIZE = 2**32 - 1
EXTENDED_PREFIX_THRESHOLD = 65536
_SALT = b"nip44-v2"
_MIN_PAYLOAD_CHARS = 132  # base64 of the 99-byte minimum below
_MIN_DATA_LEN = 99  # version 1 + nonce 32 + prefix 2 + padded 32 + mac 32


class Nip44Error(ValueError):
    """Any NIP-44 failure; str() is the reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def get_conversation_key(secret_hex: str, pubkey_hex: str) -> bytes:
    """HKDF-extract(salt="nip44-v2", IKM=x(a·B)); symmetric in the two parties."""
    try:
        if len(secret_hex) != 64 or len(pubkey_hex) != 64:
            raise ValueError
        priv = PrivateKey(bytes.fromhex(secret_hex))  # rejects 0 and >= n
        # x-only keys are lifted to the even-y point (BIP-340); parsing rejects
        # x values that are not on the curve (including twist points).
        point = PublicKey(b"\x02" + bytes.fromhex(pubkey_hex))
        # Not PrivateKey.ecdh: libsecp256k1's ECDH hashes the point, NIP-44
        # wants the raw x coordinate.
        shared_x = point.multiply(priv.secret).format(compressed=True)[1:]
    except (ValueError, TypeError):
        raise Nip44Error("invalid secret or public key") from None
    h = c_hmac.HMAC(_SALT, hashes.SHA256())
    h.update(shared_x)
    return h.finalize()


def get_message_keys(conversation_key: bytes, nonce: bytes) -> tuple[bytes, bytes, bytes]:
    """(chacha_key 32, chacha_nonce 12, hmac_key 32) from HKDF-expand(ck, info=nonce, 76)."""
    if len(conversation_key) != 32:
        raise Nip44Error("invalid conversation_key length")
    if len(nonce) != 32:
        raise Nip44Error("invalid nonce length")
    keys = HKDFExpand(hashes.SHA256(), 76, nonce).derive(conversation_key)
    return keys[0:32], keys[32:44], keys[44:76]


def calc_padded_len(unpadded_len: int) -> int:
    """Padded size for a plaintext length: 32 minimum, then power-of-two-based chunks."""
    if type(unpadded_len) is not int or not MIN_PLAINTEXT_SIZE <= unpadded_len <= MAX_PLAINTEXT_SIZE:
        raise Nip44Error("invalid plaintext size")
    if unpadded_len <= 32:
        return 32
    # 1 << (floor(log2(n-1)) + 1) == 1 << bit_length(n-1), exact for big ints
    next_power = 1 << (unpadded_len - 1).bit_length()
    chunk = 32 if next_power <= 256 else next_power // 8
    return chunk * ((unpadded_len - 1) // chunk + 1)


def _prefix_len(n: int) -> int:
    return 2 if n < EXTENDED_PREFIX_THRESHOLD else 6


def max_payload_len(max_plaintext: int) -> int:
    """Longest base64 payload a plaintext of at most max_plaintext bytes can produce."""
    raw = 1 + 32 + _prefix_len(max_plaintext) + calc_padded_len(max_plaintext) + 32
    return 4 * ((raw + 2) // 3)


def pad(plaintext: bytes) -> bytes:
    """[length prefix][plaintext][zeros]; prefix is u16 BE, or 00 00 + u32 BE from 65536 bytes."""
    n = len(plaintext)
    if not MIN_PLAINTEXT_SIZE <= n <= MAX_PLAINTEXT_SIZE:
        raise Nip44Error("invalid plaintext size")
    if n < EXTENDED_PREFIX_THRESHOLD:
        prefix = n.to_bytes(2, "big")
    else:
        prefix = b"\x00\x00" + n.to_bytes(4, "big")
    return prefix + plaintext + bytes(calc_padded_len(n) - n)


def unpad(padded: bytes) -> bytes:
    """Inverse of pad; checks the prefix, the declared length and the exact padded size."""
    if len(padded) < 2:
        raise Nip44Error("invalid padding")
    n = int.from_bytes(padded[0:2], "big")
    prefix_len = 2
    if n == 0:
        # A zero u16 is the extended-format marker (a real length is never 0).
        if len(padded) < 6:
            raise Nip44Error("invalid padding")
        n = int.from_bytes(padded[2:6], "big")
        prefix_len = 6
        # Short lengths must use the short prefix: one encoding per length,
        # and an extended prefix claiming n < 65536 is what the spec rejects.
        if n < EXTENDED_PREFIX_THRESHOLD:
            raise Nip44Error("invalid padding")
    unpadded = padded[prefix_len : prefix_len + n]
    if len(unpadded) != n or len(padded) != prefix_len + calc_padded_len(n):
        raise Nip44Error("invalid padding")
    return unpadded


def _chacha20(key: bytes, nonce12: bytes, data: bytes) -> bytes:
    # cryptography's ChaCha20 takes a 16-byte nonce: 4-byte LE counter (0, as
    # RFC 8439 / NIP-44 start at block 0) followed by the 12-byte nonce.
    enc = Cipher(algorithms.ChaCha20(key, b"\x00\x00\x00\x00" + nonce12), mode=None).encryptor()
    return enc.update(data) + enc.finalize()


def _mac(hmac_key: bytes, nonce: bytes, ciphertext: bytes) -> bytes:
    h = c_hmac.HMAC(hmac_key, hashes.SHA256())
    h.update(nonce)
    h.update(ciphertext)
    return h.finalize()


def encrypt(
    plaintext: str,
    conversation_key: bytes,
    nonce: bytes | None = None,
    *,
    max_plaintext: int = MAX_PLAINTEXT_SIZE,
) -> str:
    """Base64 NIP-44 v2 payload. nonce is for tests only; by default 32 fresh random bytes."""
    if nonce is None:
        nonce = os.urandom(32)
    try:
        data = plaintext.encode("utf-8")
    except UnicodeEncodeError:
        raise Nip44Error("plaintext is not valid unicode") from None
    if len(data) > max_plaintext:
        raise Nip44Error("invalid plaintext size")
    chacha_key, chacha_nonce, hmac_key = get_message_keys(conversation_key, nonce)
    ciphertext = _chacha20(chacha_key, chacha_nonce, pad(data))
    mac = _mac(hmac_key, nonce, ciphertext)
    return base64.b64encode(b"\x02" + nonce + ciphertext + mac).decode("ascii")


def decrypt(
    payload: str,
    conversation_key: bytes,
    *,
    max_plaintext: int = MAX_PLAINTEXT_SIZE,
) -> str:
    """Plaintext of a NIP-44 v2 payload; raises Nip44Error on any defect.

    max_plaintext lets a caller bound work: payloads longer than that bound
    allows are refused before base64 decoding (as the NIP recommends).
    Invalid UTF-8 in an authenticated plaintext is refused, not replaced.
    """
    if type(payload) is not str:
        raise Nip44Error("payload must be a string")
    plen = len(payload)
    if plen == 0 or payload[0] == "#":
        # "#" marks a future non-base64 encoding: report it as unsupported.
        raise Nip44Error("unknown encryption version")
    if plen < _MIN_PAYLOAD_CHARS:
        raise Nip44Error("invalid payload size")
    if plen > max_payload_len(min(max_plaintext, MAX_PLAINTEXT_SIZE)):
        raise Nip44Error("invalid payload size")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise Nip44Error("invalid base64") from None
    # RFC 4648 canonical form only: Python also accepts extra "=" and non-zero unused bits, which
    # would let several contents decrypt to one plaintext (and other implementations refuse them).
    if base64.b64encode(data).decode("ascii") != payload:
        raise Nip44Error("invalid base64")
    dlen = len(data)
    if dlen < _MIN_DATA_LEN:
        raise Nip44Error("invalid data size")
    if data[0] != VERSION:
        raise Nip44Error(f"unknown encryption version {data[0]}")
    nonce = data[1:33]
    ciphertext = data[33 : dlen - 32]
    mac = data[dlen - 32 :]
    chacha_key, chacha_nonce, hmac_key = get_message_keys(conversation_key, nonce)
    if not _hmac.compare_digest(_mac(hmac_key, nonce, ciphertext), mac):
        raise Nip44Error("invalid MAC")
    plain = unpad(_chacha20(chacha_key, chacha_nonce, ciphertext))
    if len(plain) > max_plaintext:
        raise Nip44Error("invalid plaintext size")
    try:
        return plain.decode("utf-8")
    except UnicodeDecodeError:
        raise Nip44Error("invalid utf-8 in plaintext") from None
