"""NIP-PL executor encryption keys: generation, rotation, retirement window, erasure.

Private keys are wrapped by the appliance key file (a copy of the SQLite file alone leaks
nothing). States: ``current`` (exactly one per push-enabled origin), ``retiring`` (keeps
decrypting until ``accept_until = became_retiring_at + max_lease_ttl + allowed_skew``, the
limits in force when it was rotated out) and ``expired`` (rejected as ``invalid: unknown
executor key``; its wrapped secret is erased once no unexpired active lease names it).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

import apsw

from appliance.nostr.keys import generate_secret, public_key
from appliance.store.keyfile import KeyFile

from .descriptor import ExecutorKey, Limits

SQL_KEYS = (
    "SELECT key_id, pubkey, wrapped, state, created_at, became_retiring_at, accept_until "
    "FROM executor_keys WHERE origin = ? ORDER BY created_at, key_id"
)
SQL_INSERT = (
    "INSERT INTO executor_keys (origin, key_id, pubkey, wrapped, state, created_at) VALUES (?, ?, ?, ?, 'current', ?)"
)
SQL_RETIRE = (
    "UPDATE executor_keys SET state = 'retiring', became_retiring_at = ?, accept_until = ? "
    "WHERE origin = ? AND state = 'current'"
)
SQL_EXPIRE = "UPDATE executor_keys SET state = 'expired' WHERE state = 'retiring' AND accept_until <= ?"
SQL_ERASE = (
    "UPDATE executor_keys SET wrapped = NULL WHERE state = 'expired' AND wrapped IS NOT NULL AND NOT EXISTS ("
    " SELECT 1 FROM leases l WHERE l.origin = executor_keys.origin AND l.exec_key_id = executor_keys.key_id"
    " AND l.active = 1 AND l.expiration > ?)"
)

# Active, unexpired leases naming each key: what erasing the key would break.
SQL_DEPENDENT_LEASES = (
    "SELECT exec_key_id, count(*) FROM leases WHERE origin = ? AND active = 1 AND expiration > ? GROUP BY exec_key_id"
)
SQL_ERASE_ONE = "UPDATE executor_keys SET state = 'expired', wrapped = NULL WHERE origin = ? AND key_id = ?"


class KeyNotErasable(ValueError):
    """Erasing this key now would break accepted leases (or it is the current key)."""


@dataclass(frozen=True)
class KeyRow:
    key_id: str
    pubkey: str
    state: str
    created_at: int
    became_retiring_at: int | None
    accept_until: int | None
    has_secret: bool

    def accepts(self, now: int) -> bool:
        if self.state == "current":
            return True
        return self.state == "retiring" and self.accept_until is not None and now < self.accept_until

    def to_json(self) -> dict:
        return {"id": self.key_id, "pubkey": self.pubkey, "state": self.state, "created_at": self.created_at,
                "became_retiring_at": self.became_retiring_at, "accept_until": self.accept_until,
                "private_key_held": self.has_secret}


def _label(origin: int, key_id: str) -> str:
    return f"executor-key:{origin}:{key_id}"


def new_key_id(now: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now)) + "-" + secrets.token_hex(3)


def list_keys(conn: apsw.Connection, origin: int) -> list[KeyRow]:
    return [
        KeyRow(kid, pub, state, created, retiring_at, until, wrapped is not None)
        for kid, pub, wrapped, state, created, retiring_at, until in conn.execute(SQL_KEYS, (origin,))
    ]


def create_current(conn: apsw.Connection, keyfile: KeyFile, origin: int, now: int) -> KeyRow:
    secret = generate_secret()
    kid = new_key_id(now)
    conn.execute(SQL_INSERT, (origin, kid, public_key(secret), keyfile.wrap(bytes.fromhex(secret),
                                                                            label=_label(origin, kid)), now))
    return next(k for k in list_keys(conn, origin) if k.key_id == kid)


def ensure_current(conn: apsw.Connection, keyfile: KeyFile, origin: int, now: int) -> None:
    """Generate the first executor key of a push-enabled origin (inside a write transaction)."""
    if not any(k.state == "current" for k in list_keys(conn, origin)):
        create_current(conn, keyfile, origin, now)


def rotate(conn: apsw.Connection, keyfile: KeyFile, origin: int, limits: Limits, now: int) -> KeyRow:
    """Make a new current key; the old one retires for max_lease_ttl + allowed_skew."""
    conn.execute(SQL_RETIRE, (now, now + limits.max_lease_ttl + limits.allowed_skew, origin))
    return create_current(conn, keyfile, origin, now)


def expire_and_erase(conn: apsw.Connection, now: int) -> tuple[int, int]:
    """Close retiring keys' acceptance windows; erase expired secrets no active lease uses.
    Returns (keys expired, secrets erased)."""
    conn.execute(SQL_EXPIRE, (now,))
    expired = conn.changes()
    conn.execute(SQL_ERASE, (now,))
    return expired, conn.changes()


def dependent_leases(conn: apsw.Connection, origin: int, now: int) -> dict[str, int]:
    """key id -> how many active, unexpired leases were encrypted to it."""
    return dict(conn.execute(SQL_DEPENDENT_LEASES, (origin, now)).fetchall())


def erase(conn: apsw.Connection, origin: int, key_id: str, now: int) -> None:
    """Erase a retired key's private material at once (it stops decrypting and is no longer
    advertised); only when no accepted lease depends on it. The current key is never erased."""
    row = next((k for k in list_keys(conn, origin) if k.key_id == key_id), None)
    if row is None:
        raise KeyNotErasable(f"no executor key {key_id!r}")
    if row.state == "current":
        raise KeyNotErasable("the current key cannot be erased: rotate first")
    n = dependent_leases(conn, origin, now).get(key_id, 0)
    if n:
        raise KeyNotErasable(f"{n} active lease(s) still depend on key {key_id}; it is erased automatically "
                             "once they expire or are replaced")
    conn.execute(SQL_ERASE_ONE, (origin, key_id))


def advertised(rows: list[KeyRow], now: int) -> tuple[ExecutorKey, ...]:
    """Descriptor keys: current first, then retiring keys still inside their window."""
    out = [ExecutorKey(k.key_id, k.pubkey, current=True) for k in rows if k.state == "current"]
    out += [ExecutorKey(k.key_id, k.pubkey, retiring=True) for k in rows
            if k.state == "retiring" and k.accepts(now)]
    return tuple(out)


def load_secrets(conn: apsw.Connection, keyfile: KeyFile, origin: int) -> dict[str, tuple[str, KeyRow]]:
    """key_id -> (secret_hex, row) for keys that still hold private material."""
    out: dict[str, tuple[str, KeyRow]] = {}
    rows = {k.key_id: k for k in list_keys(conn, origin)}
    for kid, wrapped in conn.execute(
        "SELECT key_id, wrapped FROM executor_keys WHERE origin = ? AND wrapped IS NOT NULL", (origin,)
    ):
        out[kid] = (keyfile.unwrap(wrapped, label=_label(origin, kid)).hex(), rows[kid])
    return out
