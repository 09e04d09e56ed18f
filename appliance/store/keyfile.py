"""Secrets at rest: private keys in the database are wrapped by a key file kept beside it (0600).

A copy of the SQLite file alone does not reveal any private key; the key file alone holds no
secret of any user. Back up both together (or neither).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.errors import StoreError
from appliance.store.statement import SQL

log = logging.getLogger("appliance.store")

KEYFILE_NAME = "appliance.key"
_VERSION = b"\x01"


class KeyFile:
    """AES-256-GCM wrapping under a 32-byte master key stored in `<data_dir>/appliance.key`."""

    def __init__(self, data_dir: Path, *, holds_wrapped_keys: bool = False):
        """Load the key file, or create it when nothing needs it yet. `holds_wrapped_keys` says the
        database already has keys wrapped by a key file: then a missing one is an error, never
        replaced (a new key could not unwrap them, and keys wrapped under it would mix masters)."""
        self.path = Path(data_dir) / KEYFILE_NAME
        self._key = self._load_or_create(holds_wrapped_keys)

    @classmethod
    def read(cls, path: Path) -> "KeyFile":
        """A key file at any path (a backup's), read as it is: never created, never chmod-ed."""
        self = cls.__new__(cls)
        self.path = Path(path)
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise StoreError(f"cannot read the key file {self.path}: {exc.strerror or exc}") from None
        if len(data) != 32:
            raise StoreError(f"{self.path} is not a valid key file (expected 32 bytes)")
        self._key = data
        return self

    def same_key(self, other: "KeyFile") -> bool:
        return hmac.compare_digest(self._key, other._key)

    @classmethod
    def for_store(cls, data_dir: Path, store) -> "KeyFile":
        """The key file of an open store (whose database says whether it holds wrapped keys)."""
        return cls(data_dir, holds_wrapped_keys=store.read_sync(holds_wrapped_keys))

    def _load_or_create(self, holds_wrapped_keys: bool) -> bytes:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            if holds_wrapped_keys:
                raise StoreError(
                    f"the key file {self.path} is missing, but the database holds private keys wrapped by it: "
                    "restore appliance.key from the backup made with this database (a new key file cannot "
                    "unwrap them)"
                ) from None
            return self._create()
        except OSError as exc:
            raise StoreError(f"cannot read the key file {self.path}: {exc.strerror or exc}") from None
        if len(data) != 32:
            raise StoreError(f"{self.path} is not a valid key file (expected 32 bytes)")
        mode = self.path.stat().st_mode & 0o777
        if mode & 0o077:
            # Tighten rather than refuse: the secret is ours to protect. Said once, at start.
            log.warning("key file %s was readable by others (mode %o); set it to 0600", self.path, mode)
            os.chmod(self.path, 0o600)
        return data

    def _create(self) -> bytes:
        key = secrets.token_bytes(32)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot create the key file {self.path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
            fh.flush()
            os.fsync(fh.fileno())
        return key

    def wrap(self, secret: bytes, *, label: str) -> bytes:
        """Encrypt `secret`; `label` (e.g. "executor-key:2026-06") is bound as associated data."""
        nonce = secrets.token_bytes(12)
        return _VERSION + nonce + AESGCM(self._key).encrypt(nonce, secret, label.encode())

    def derive(self, label: str) -> bytes:
        """A 32-byte key for one purpose (`label`), derived from the master key; never stored."""
        return hmac.new(self._key, b"appliance-derived-key:" + label.encode(), hashlib.sha256).digest()

    def unwrap(self, blob: bytes, *, label: str) -> bytes:
        if not blob or blob[:1] != _VERSION:
            raise StoreError("unknown wrapped-key format")
        try:
            return AESGCM(self._key).decrypt(blob[1:13], blob[13:], label.encode())
        except Exception:
            raise StoreError(f"cannot unwrap {label}: wrong key file for this database?") from None


SQL_HOLDS_WRAPPED = SQL(
    "SELECT EXISTS (SELECT 1 FROM relay_keys) OR EXISTS (SELECT 1 FROM executor_keys WHERE wrapped IS NOT NULL) "
    "OR EXISTS (SELECT 1 FROM apns_keys) OR EXISTS (SELECT 1 FROM vapid_keys)"
    " OR EXISTS (SELECT 1 FROM gateway_grant_keys WHERE wrapped IS NOT NULL)"
    " OR EXISTS (SELECT 1 FROM gateway_installations WHERE token IS NOT NULL)",
    "SELECT EXISTS (SELECT 1 FROM relay_keys) OR EXISTS (SELECT 1 FROM executor_keys WHERE wrapped IS NOT NULL) "
    "OR EXISTS (SELECT 1 FROM apns_keys) OR EXISTS (SELECT 1 FROM vapid_keys)"
    " OR EXISTS (SELECT 1 FROM gateway_grant_keys WHERE wrapped IS NOT NULL)"
    " OR EXISTS (SELECT 1 FROM gateway_installations WHERE token IS NOT NULL)",
)


def holds_wrapped_keys(conn) -> bool:
    """Whether the database holds any private key wrapped by a key file."""
    return bool(conn.execute(SQL_HOLDS_WRAPPED).fetchone()[0])


# What a key file must unwrap, by owner (each owner knows its own labels; see commands.backup).
SQL_TABLES = SQL(
    "SELECT name FROM sqlite_schema WHERE type = 'table'",
    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
    "AND table_type = 'BASE TABLE'",
)
SQL_RELAY_KEY_ORIGINS = SQL("SELECT origin FROM relay_keys ORDER BY origin",
                            "SELECT origin FROM relay_keys ORDER BY origin")
SQL_EXECUTOR_KEY_ORIGINS = SQL("SELECT DISTINCT origin FROM executor_keys WHERE wrapped IS NOT NULL ORDER BY origin",
                               "SELECT DISTINCT origin FROM executor_keys WHERE wrapped IS NOT NULL ORDER BY origin")
SQL_GATEWAY_GRANT_KEYS = SQL("SELECT count(*) FROM gateway_grant_keys WHERE wrapped IS NOT NULL",
                             "SELECT count(*) FROM gateway_grant_keys WHERE wrapped IS NOT NULL")
SQL_APNS_KEYS = SQL("SELECT count(*) FROM apns_keys", "SELECT count(*) FROM apns_keys")
SQL_VAPID_KEYS = SQL("SELECT count(*) FROM vapid_keys", "SELECT count(*) FROM vapid_keys")
SQL_GATEWAY_TOKENS = SQL(
    "SELECT handle, endpoint_epoch, token FROM gateway_installations "
    "WHERE token IS NOT NULL ORDER BY handle",
    "SELECT handle, endpoint_epoch, token FROM gateway_installations "
    "WHERE token IS NOT NULL ORDER BY handle",
)


def wrapped_inventory(conn) -> dict:
    """Where the database holds wrapped secrets: origins with relay keys, origins with executor
    keys, the number of gateway grant keys, the gateway's wrapped APNs tokens, the number of
    APNs .p8 keys uploaded through the dashboard and the number of UnifiedPush VAPID keys."""
    # A database made by an older version (a backup) may lack the newer tables.
    tables = {r[0] for r in conn.execute(SQL_TABLES)}
    return {
        "relay_key_origins": [r[0] for r in conn.execute(SQL_RELAY_KEY_ORIGINS)] if "relay_keys" in tables else [],
        "executor_key_origins": ([r[0] for r in conn.execute(SQL_EXECUTOR_KEY_ORIGINS)]
                                 if "executor_keys" in tables else []),
        "gateway_grant_keys": (conn.execute(SQL_GATEWAY_GRANT_KEYS).fetchone()[0]
                               if "gateway_grant_keys" in tables else 0),
        "gateway_tokens": list(conn.execute(SQL_GATEWAY_TOKENS)) if "gateway_installations" in tables else [],
        "apns_keys": conn.execute(SQL_APNS_KEYS).fetchone()[0] if "apns_keys" in tables else 0,
        "vapid_keys": conn.execute(SQL_VAPID_KEYS).fetchone()[0] if "vapid_keys" in tables else 0,
    }
