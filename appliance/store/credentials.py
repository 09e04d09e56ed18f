"""Provider credentials uploaded through the dashboard: APNs .p8 keys (`p8:...`) and FCM service
account key files (`sa:...`, a draft transport's). Kept wrapped by the key file (like executor
keys), named by a fingerprint of their public key (which is safe to show); one table holds both,
told apart by the fingerprint's prefix."""

from __future__ import annotations

from .keyfile import KeyFile
from appliance.store.interface import Connection
from appliance.store.statement import SQL

SQL_SAVE = SQL(
    "INSERT INTO apns_keys (fingerprint, wrapped, created_at) VALUES (?, ?, ?) "
    "ON CONFLICT (fingerprint) DO NOTHING",
    "INSERT INTO apns_keys (fingerprint, wrapped, created_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (fingerprint) DO NOTHING",
)
SQL_ALL = SQL("SELECT fingerprint, wrapped FROM apns_keys", "SELECT fingerprint, wrapped FROM apns_keys")
SQL_LIST = SQL("SELECT fingerprint, created_at FROM apns_keys ORDER BY created_at",
               "SELECT fingerprint, created_at FROM apns_keys ORDER BY created_at")


def _label(fingerprint: str) -> str:
    return f"apns-key:{fingerprint}"


def save_apns_key(conn: Connection, keyfile: KeyFile, fingerprint: str, pem: bytes, now: int) -> None:
    conn.execute(SQL_SAVE, (fingerprint, keyfile.wrap(pem, label=_label(fingerprint)), now))


def load_apns_keys(conn: Connection, keyfile: KeyFile) -> dict[str, bytes]:
    """fingerprint -> PEM of every stored key."""
    return {fp: keyfile.unwrap(wrapped, label=_label(fp)) for fp, wrapped in conn.execute(SQL_ALL)}


def list_apns_keys(conn: Connection) -> list[tuple[str, int]]:
    return conn.execute(SQL_LIST).fetchall()
