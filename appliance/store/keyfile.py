"""Secrets at rest: private keys in the database are wrapped by a key file kept beside it (0600).

A copy of the SQLite file alone does not reveal any private key; the key file alone holds no
secret of any user. Back up both together (or neither).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.errors import StoreError

KEYFILE_NAME = "appliance.key"
_VERSION = b"\x01"


class KeyFile:
    """AES-256-GCM wrapping under a 32-byte master key stored in `<data_dir>/appliance.key`."""

    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / KEYFILE_NAME
        self._key = self._load_or_create()

    def _load_or_create(self) -> bytes:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            key = secrets.token_bytes(32)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(key)
                fh.flush()
                os.fsync(fh.fileno())
            return key
        if len(data) != 32:
            raise StoreError(f"{self.path} is not a valid key file (expected 32 bytes)")
        mode = self.path.stat().st_mode & 0o777
        if mode & 0o077:
            os.chmod(self.path, 0o600)  # tighten rather than refuse: the secret is ours to protect
        return data

    def wrap(self, secret: bytes, *, label: str) -> bytes:
        """Encrypt `secret`; `label` (e.g. "executor-key:2026-06") is bound as associated data."""
        nonce = secrets.token_bytes(12)
        return _VERSION + nonce + AESGCM(self._key).encrypt(nonce, secret, label.encode())

    def unwrap(self, blob: bytes, *, label: str) -> bytes:
        if not blob or blob[:1] != _VERSION:
            raise StoreError("unknown wrapped-key format")
        try:
            return AESGCM(self._key).decrypt(blob[1:13], blob[13:], label.encode())
        except Exception:
            raise StoreError(f"cannot unwrap {label}: wrong key file for this database?") from None
