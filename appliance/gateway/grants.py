"""Endpoint grants: the opaque sealed delivery capability a relay keeps as its lease endpoint.

Wire form: `<key id>.<base64url, unpadded: 12-byte nonce || AES-256-GCM ciphertext and tag>`, at
most 4096 bytes (about 150 here). The associated data is `appliance-gateway-grant-v1:<key id>`, so
a grant re-labelled with another key id fails even if two keys were equal. The plaintext is a fixed
binary record binding installation, relay pubkey, endpoint epoch, generation, app profile,
not_before and expiry. It holds no APNs token: the token stays in gateway custody.

Grant keys (32 random bytes, wrapped by the appliance key file) rotate: the newest is current and
seals; each predecessor stays decrypt-only until the latest expiry of the grants it sealed
(`max_expires_at`, raised at every issue), then its secret is erased.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import struct
import time
import uuid
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .wire import MAX_GRANT_BYTES, REGISTERED_PROFILES

AAD_PREFIX = b"appliance-gateway-grant-v1:"
GRANT_VERSION = 1
# version, installation (16), relay pubkey (32), epoch, generation, not_before, expires_at, profile
_RECORD = struct.Struct(">B16s32sqqqqB")
_PROFILE_CODES = {name: i + 1 for i, name in enumerate(REGISTERED_PROFILES)}
_PROFILES_BY_CODE = {v: k for k, v in _PROFILE_CODES.items()}


class GrantInvalid(Exception):
    """A grant that does not open; which part failed is for DEBUG logs only."""


@dataclass(frozen=True)
class Grant:
    installation: str  # canonical UUID
    relay_pubkey: str  # 64 hex
    endpoint_epoch: int
    generation: int
    app_profile: str
    not_before: int
    expires_at: int

    def pack(self) -> bytes:
        return _RECORD.pack(GRANT_VERSION, uuid.UUID(self.installation).bytes, bytes.fromhex(self.relay_pubkey),
                            self.endpoint_epoch, self.generation, self.not_before, self.expires_at,
                            _PROFILE_CODES[self.app_profile])

    @classmethod
    def unpack(cls, data: bytes) -> "Grant":
        if len(data) != _RECORD.size:
            raise GrantInvalid("record size")
        version, inst, relay, epoch, generation, not_before, expires_at, code = _RECORD.unpack(data)
        if version != GRANT_VERSION or code not in _PROFILES_BY_CODE:
            raise GrantInvalid("record version or profile")
        return cls(str(uuid.UUID(bytes=inst)), relay.hex(), epoch, generation, _PROFILES_BY_CODE[code],
                   not_before, expires_at)


def new_key_id(now: int) -> str:
    """A grant key id: date plus 24 random bits (no '.', which separates it from the sealed part)."""
    return "g" + time.strftime("%Y%m%d", time.gmtime(now)) + secrets.token_hex(3)


class Keyring:
    """The current sealing key plus decrypt-only predecessors, by key id."""

    def __init__(self, current: tuple[str, bytes], predecessors: dict[str, bytes] | None = None):
        self.current_id = current[0]
        self._ciphers = {current[0]: AESGCM(current[1])}
        for kid, key in (predecessors or {}).items():
            if kid == current[0]:
                raise ValueError("duplicate grant key id")
            self._ciphers[kid] = AESGCM(key)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def seal(self, grant: Grant) -> str:
        nonce = secrets.token_bytes(12)
        kid = self.current_id
        sealed = self._ciphers[kid].encrypt(nonce, grant.pack(), AAD_PREFIX + kid.encode())
        out = kid + "." + base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode()
        if len(out) > MAX_GRANT_BYTES:  # cannot happen with the fixed record; checked all the same
            raise GrantInvalid("sealed grant over 4096 bytes")
        return out

    def open(self, text: str) -> Grant:
        if len(text) > MAX_GRANT_BYTES:
            raise GrantInvalid("grant over 4096 bytes")
        kid, dot, payload = text.partition(".")
        cipher = self._ciphers.get(kid)
        if not dot or cipher is None:
            raise GrantInvalid("unknown grant key")
        if not _B64URL.fullmatch(payload) or len(payload) % 4 == 1:
            raise GrantInvalid("not base64url")
        try:
            raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        except (binascii.Error, ValueError):
            raise GrantInvalid("not base64url") from None
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != payload or len(raw) < 12 + 16:
            raise GrantInvalid("non-canonical or short")
        try:
            plain = cipher.decrypt(raw[:12], raw[12:], AAD_PREFIX + kid.encode())
        except InvalidTag:
            raise GrantInvalid("authentication failed") from None
        return Grant.unpack(plain)


_B64URL = re.compile(r"[A-Za-z0-9_-]+")
