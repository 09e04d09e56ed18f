"""Web Push message encryption (RFC 8291, `aes128gcm` of RFC 8188) and VAPID (RFC 8292) - pure.

    encrypt(plaintext, ua_public, auth_secret)  ->  the request body: one RFC 8188 record

        salt (16) | rs = 4096 (4, big-endian) | idlen = 65 (1) | as_public (65) | AES-128-GCM(record)

    where the record is the plaintext followed by the last-record delimiter 0x02 (no padding),
    and the content key and nonce come from an ECDH (P-256) between a fresh sender key pair and
    the subscription's `p256dh` key, mixed with its `auth` secret (RFC 8291, Section 3.4). The
    salt and the sender key pair are new for every message: the only bytes of the body that vary.

    VapidKey.header(aud, sub, exp)  ->  "vapid t=<ES256 JWT>, k=<the public key, base64url>"
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["RECORD_SIZE", "VapidKey", "b64url", "b64url_decode", "encrypt", "load_p256_public",
           "p256_private_from_bytes", "public_bytes"]

#: RFC 8188 record size in the header. One record always holds the whole (short) message.
RECORD_SIZE = 4096
_KEY_INFO = b"WebPush: info\x00"
_CEK_INFO = b"Content-Encoding: aes128gcm\x00"
_NONCE_INFO = b"Content-Encoding: nonce\x00"
_LAST_RECORD = b"\x02"


def b64url(data: bytes) -> str:
    """Unpadded base64url (RFC 7515 Section 2), as Web Push and JWTs write bytes."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict unpadded base64url: ValueError for padding, other alphabets or a non-canonical tail."""
    if not text or "=" in text or len(text) % 4 == 1:
        raise ValueError("not unpadded base64url")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (ValueError, TypeError):
        raise ValueError("not unpadded base64url") from None
    if b64url(raw) != text:  # unused trailing bits set: one value, one spelling
        raise ValueError("not canonical base64url")
    return raw


def public_bytes(key: ec.EllipticCurvePublicKey) -> bytes:
    """The 65-byte uncompressed point (0x04 | X | Y)."""
    return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


def load_p256_public(point: bytes) -> ec.EllipticCurvePublicKey:
    """A P-256 public key from its 65-byte uncompressed point; ValueError if it is not one on the curve."""
    if len(point) != 65 or point[0] != 4:
        raise ValueError("not an uncompressed P-256 point")
    return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)


def p256_private_from_bytes(d: bytes) -> ec.EllipticCurvePrivateKey:
    return ec.derive_private_key(int.from_bytes(d, "big"), ec.SECP256R1())


def _hkdf(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    return HKDF(hashes.SHA256(), length, salt, info).derive(ikm)


def encrypt(plaintext: bytes, ua_public: bytes, auth_secret: bytes, *, salt: bytes | None = None,
            sender: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    """The `aes128gcm` body carrying `plaintext` to the subscription (`ua_public`, `auth_secret`).

    `salt` and `sender` are for test vectors only: left out, both are fresh for this message."""
    if len(auth_secret) != 16:
        raise ValueError("the auth secret is 16 bytes")
    if len(plaintext) + 1 + 16 > RECORD_SIZE:
        raise ValueError("the message does not fit one record")
    ua_key = load_p256_public(ua_public)
    sender = sender or ec.generate_private_key(ec.SECP256R1())
    salt = os.urandom(16) if salt is None else salt
    if len(salt) != 16:
        raise ValueError("the salt is 16 bytes")
    as_public = public_bytes(sender.public_key())
    ecdh_secret = sender.exchange(ec.ECDH(), ua_key)
    # RFC 8291, Section 3.4: IKM from the ECDH secret keyed by the auth secret, then RFC 8188's keys.
    ikm = _hkdf(auth_secret, ecdh_secret, _KEY_INFO + ua_public + as_public, 32)
    cek = _hkdf(salt, ikm, _CEK_INFO, 16)
    nonce = _hkdf(salt, ikm, _NONCE_INFO, 12)
    record = AESGCM(cek).encrypt(nonce, plaintext + _LAST_RECORD, None)
    return salt + RECORD_SIZE.to_bytes(4, "big") + bytes([len(as_public)]) + as_public + record


def _json_b64(obj: dict) -> str:
    return b64url(json.dumps(obj, separators=(",", ":")).encode())


@dataclass(frozen=True)
class VapidKey:
    """An application server's P-256 key pair (RFC 8292) and how it signs a push request."""

    private_key: ec.EllipticCurvePrivateKey = field(repr=False, compare=False)

    @classmethod
    def generate(cls) -> "VapidKey":
        return cls(ec.generate_private_key(ec.SECP256R1()))

    @classmethod
    def from_der(cls, der: bytes) -> "VapidKey":
        key = serialization.load_der_private_key(der, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise ValueError("a VAPID key is a P-256 key")
        return cls(key)

    def to_der(self) -> bytes:
        return self.private_key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption())

    @property
    def public_key(self) -> str:
        """The `k` parameter: the uncompressed public point, base64url."""
        return b64url(public_bytes(self.private_key.public_key()))

    def token(self, aud: str, sub: str, exp: int) -> str:
        """The ES256 JWT of RFC 8292, Section 2: claims aud (the push resource's origin), exp, sub."""
        signing_input = (_json_b64({"typ": "JWT", "alg": "ES256"}) + "."
                         + _json_b64({"aud": aud, "exp": exp, "sub": sub})).encode("ascii")
        r, s = decode_dss_signature(self.private_key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        return signing_input.decode("ascii") + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))

    def header(self, aud: str, sub: str, exp: int) -> str:
        """The Authorization value (RFC 8292, Section 3)."""
        return f"vapid t={self.token(aud, sub, exp)}, k={self.public_key}"
