"""VAPID key pairs of the UnifiedPush profile (RFC 8292): one per (origin, push service origin),
made on first use and kept wrapped by the key file like executor keys."""

from __future__ import annotations

from appliance.store.interface import Connection
from appliance.store.statement import SQL

from .keyfile import KeyFile

SQL_SAVE = SQL(
    "INSERT INTO vapid_keys (origin, push_origin, wrapped, created_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (origin, push_origin) DO NOTHING",
    "INSERT INTO vapid_keys (origin, push_origin, wrapped, created_at) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (origin, push_origin) DO NOTHING",
)
SQL_GET = SQL("SELECT wrapped FROM vapid_keys WHERE origin = ? AND push_origin = ?",
              "SELECT wrapped FROM vapid_keys WHERE origin = %s AND push_origin = %s")
SQL_ALL = SQL("SELECT origin, push_origin, wrapped FROM vapid_keys",
              "SELECT origin, push_origin, wrapped FROM vapid_keys")
SQL_COUNT = SQL("SELECT count(*) FROM vapid_keys", "SELECT count(*) FROM vapid_keys")


def vapid_label(origin: int, push_origin: str) -> str:
    return f"vapid-key:{origin}:{push_origin}"


def get_vapid_key(conn: Connection, origin: int, push_origin: str) -> bytes | None:
    """The wrapped key of (origin, push origin), or None."""
    row = conn.execute(SQL_GET, (origin, push_origin)).fetchone()
    return row[0] if row else None


def save_vapid_key(conn: Connection, origin: int, push_origin: str, wrapped: bytes, now: int) -> bytes:
    """Keep `wrapped` unless a key is there already (another worker or node made it first); the
    wrapped key in use either way."""
    conn.execute(SQL_SAVE, (origin, push_origin, wrapped, now))
    stored = get_vapid_key(conn, origin, push_origin)
    assert stored is not None
    return stored


def load_vapid_keys(conn: Connection, keyfile: KeyFile) -> int:
    """Unwrap every stored key (the key file check of backup, restore and doctor); how many."""
    n = 0
    for origin, push_origin, wrapped in conn.execute(SQL_ALL):
        keyfile.unwrap(wrapped, label=vapid_label(origin, push_origin))
        n += 1
    return n
