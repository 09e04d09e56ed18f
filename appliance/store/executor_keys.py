"""The `executor_keys` rows: NIP-PL executor encryption keys, their states and wrapped secrets.
The lifecycle rules live in `appliance.push.keys`; this module only reads and writes rows."""

from __future__ import annotations

from dataclasses import dataclass
from appliance.store.interface import Connection
from appliance.store.statement import SQL


SQL_KEYS = SQL(
    "SELECT key_id, pubkey, wrapped, state, created_at, became_retiring_at, accept_until "
    "FROM executor_keys WHERE origin = ? ORDER BY created_at, key_id",
    "SELECT key_id, pubkey, wrapped, state, created_at, became_retiring_at, accept_until "
    "FROM executor_keys WHERE origin = %s ORDER BY created_at, key_id",
)
SQL_INSERT = SQL(
    "INSERT INTO executor_keys (origin, key_id, pubkey, wrapped, state, created_at) VALUES (?, ?, ?, ?, 'current', ?)",
    "INSERT INTO executor_keys (origin, key_id, pubkey, wrapped, state, created_at) VALUES (%s, %s, %s, %s, "
    "'current', %s)",
)
SQL_RETIRE = SQL(
    "UPDATE executor_keys SET state = 'retiring', became_retiring_at = ?, accept_until = ? "
    "WHERE origin = ? AND state = 'current'",
    "UPDATE executor_keys SET state = 'retiring', became_retiring_at = %s, accept_until = %s "
    "WHERE origin = %s AND state = 'current'",
)
SQL_EXPIRE = SQL("UPDATE executor_keys SET state = 'expired' WHERE state = 'retiring' AND accept_until <= ?",
                 "UPDATE executor_keys SET state = 'expired' WHERE state = 'retiring' AND accept_until <= %s")
SQL_ERASE = SQL(
    "UPDATE executor_keys SET wrapped = NULL WHERE state = 'expired' AND wrapped IS NOT NULL AND NOT EXISTS ("
    " SELECT 1 FROM leases l WHERE l.origin = executor_keys.origin AND l.exec_key_id = executor_keys.key_id"
    " AND l.active = 1 AND l.expiration > ?)",
    "UPDATE executor_keys SET wrapped = NULL WHERE state = 'expired' AND wrapped IS NOT NULL AND NOT EXISTS ("
    " SELECT 1 FROM leases l WHERE l.origin = executor_keys.origin AND l.exec_key_id = executor_keys.key_id"
    " AND l.active = 1 AND l.expiration > %s)",
)

# Active, unexpired leases naming each key: what erasing the key would break.
SQL_DEPENDENT_LEASES = SQL(
    "SELECT exec_key_id, count(*) FROM leases WHERE origin = ? AND active = 1 AND expiration > ? GROUP BY exec_key_id",
    "SELECT exec_key_id, count(*) FROM leases WHERE origin = %s AND active = 1 AND expiration > %s "
    "GROUP BY exec_key_id",
)
SQL_ERASE_ONE = SQL("UPDATE executor_keys SET state = 'expired', wrapped = NULL WHERE origin = ? AND key_id = ?",
                    "UPDATE executor_keys SET state = 'expired', wrapped = NULL WHERE origin = %s AND key_id = %s")


SQL_WRAPPED = SQL("SELECT key_id, wrapped FROM executor_keys WHERE origin = ? AND wrapped IS NOT NULL",
                  "SELECT key_id, wrapped FROM executor_keys WHERE origin = %s AND wrapped IS NOT NULL")


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


def list_keys(conn: Connection, origin: int) -> list[KeyRow]:
    return [
        KeyRow(kid, pub, state, created, retiring_at, until, wrapped is not None)
        for kid, pub, wrapped, state, created, retiring_at, until in conn.execute(SQL_KEYS, (origin,))
    ]


def insert_current(conn: Connection, origin: int, key_id: str, pubkey: str, wrapped: bytes, now: int) -> None:
    conn.execute(SQL_INSERT, (origin, key_id, pubkey, wrapped, now))


def retire_current(conn: Connection, origin: int, now: int, accept_until: int) -> None:
    conn.execute(SQL_RETIRE, (now, accept_until, origin))


def expire_and_erase(conn: Connection, now: int) -> tuple[int, int]:
    """Close retiring keys' acceptance windows; erase expired secrets no active lease uses.
    Returns (keys expired, secrets erased)."""
    conn.execute(SQL_EXPIRE, (now,))
    expired = conn.changes()
    conn.execute(SQL_ERASE, (now,))
    return expired, conn.changes()


def dependent_leases(conn: Connection, origin: int, now: int) -> dict[str, int]:
    """key id -> how many active, unexpired leases were encrypted to it."""
    return dict(conn.execute(SQL_DEPENDENT_LEASES, (origin, now)).fetchall())


def erase_one(conn: Connection, origin: int, key_id: str) -> None:
    conn.execute(SQL_ERASE_ONE, (origin, key_id))


def wrapped_secrets(conn: Connection, origin: int) -> list[tuple[str, bytes]]:
    """(key_id, wrapped secret) of the keys that still hold private material."""
    return conn.execute(SQL_WRAPPED, (origin,)).fetchall()
