"""The change counter that tells a running appliance to reload state edited out of process, and the
health check's probe row."""

from __future__ import annotations

import apsw

SQL_BUMP_GENERATION = "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE name = 'config_generation'"
SQL_GENERATION = "SELECT value FROM meta WHERE name = 'config_generation'"
# Several nodes over PostgreSQL: a transaction-scoped lock on a name (its 64-bit hash).
SQL_NODE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))"
SQL_HEALTH_PROBE = ("INSERT INTO meta (name, value) VALUES ('health_probe', ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value")
SQL_META = "SELECT value FROM meta WHERE name = ?"
SQL_SET_META = "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value"


def meta_value(conn: apsw.Connection, name: str) -> str | None:
    """A value of the `meta` table (None: not set)."""
    row = conn.execute(SQL_META, (name,)).fetchone()
    return row[0] if row else None


def set_meta(conn: apsw.Connection, name: str, value: str) -> None:
    conn.execute(SQL_SET_META, (name, value))


SQL_READ_PROBE = "SELECT 1"


def read_probe(conn: apsw.Connection) -> None:
    """The cheapest real read: the health check's proof that a reader answers."""
    conn.execute(SQL_READ_PROBE).fetchone()


def bump_generation(conn: apsw.Connection) -> None:
    """Tell a running appliance that origins, groups or keys changed outside it (the CLI)."""
    conn.execute(SQL_BUMP_GENERATION)


def node_lock(conn, *names: str) -> None:
    """Serialize the rest of this write transaction with every other node's transactions that
    lock one of `names`, until commit (PostgreSQL advisory locks, taken in sorted order). Nothing to
    do on SQLite: its one writer serializes every write already."""
    if isinstance(conn, apsw.Connection):
        return
    for name in sorted(set(names)):
        conn.execute(SQL_NODE_LOCK, (name,))


def config_generation(conn: apsw.Connection) -> int:
    row = conn.execute(SQL_GENERATION).fetchone()
    return int(row[0]) if row else 0


def health_probe(now: float):
    """A real one-row write for the health check (an empty transaction commits whatever happens).
    It is marked `probe`: the writer does not take it as proof that writes fit again after the
    disk filled up, since one small row often still fits where events do not."""

    def op(conn: apsw.Connection) -> None:
        conn.execute(SQL_HEALTH_PROBE, (f"{now:.3f}",))

    op.probe = True
    return op
