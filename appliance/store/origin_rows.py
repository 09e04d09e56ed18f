"""The `origins` rows: each community's configuration as JSON, keyed by its origin URL. The
`Origin` model and its rules live in `appliance.origins`; this module only reads and writes rows."""

from __future__ import annotations
from appliance.store.interface import Connection
from appliance.store.statement import SQL



SQL_ALL = SQL("SELECT id, origin, config FROM origins ORDER BY id",
              "SELECT id, origin, config FROM origins ORDER BY id")
SQL_UPSERT = SQL(
    "INSERT INTO origins (origin, config) VALUES (?, ?) "
    "ON CONFLICT (origin) DO UPDATE SET config = excluded.config RETURNING id",
    "INSERT INTO origins (origin, config) VALUES (%s, %s) "
    "ON CONFLICT (origin) DO UPDATE SET config = excluded.config RETURNING id",
)
SQL_REWRITE = SQL("UPDATE origins SET origin = ?, config = ? WHERE id = ?",
                  "UPDATE origins SET origin = %s, config = %s WHERE id = %s")


def origin_rows(conn: Connection) -> list[tuple[int, str, str]]:
    """(id, origin, config JSON) of every origin, oldest first."""
    return conn.execute(SQL_ALL).fetchall()


def upsert_origin(conn: Connection, origin: str, config: str) -> int:
    """Insert or update the row of `origin`; its id."""
    (oid,) = conn.execute(SQL_UPSERT, (origin, config)).fetchone()
    return oid


def rewrite_origin(conn: Connection, oid: int, origin: str, config: str) -> None:
    """Give the row `oid` a new origin URL and configuration (the default origin follows public_url)."""
    conn.execute(SQL_REWRITE, (origin, config, oid))
