"""The change counter that tells a running appliance to reload state edited out of process."""

from __future__ import annotations

import apsw

SQL_BUMP_GENERATION = "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE name = 'config_generation'"
SQL_GENERATION = "SELECT value FROM meta WHERE name = 'config_generation'"


def bump_generation(conn: apsw.Connection) -> None:
    """Tell a running appliance that origins, groups or keys changed outside it (the CLI)."""
    conn.execute(SQL_BUMP_GENERATION)


def config_generation(conn: apsw.Connection) -> int:
    row = conn.execute(SQL_GENERATION).fetchone()
    return int(row[0]) if row else 0
