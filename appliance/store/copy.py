"""Copy a SQLite store into an empty PostgreSQL database (`appliance migrate-to-postgres URL`).

Everything happens in one PostgreSQL transaction: the schema is created, every table is copied
(COPY, in the SQLite schema's creation order, which respects its foreign keys), the identity
counters are moved past the copied ids and the row counts are compared; any failure rolls it all
back and leaves the target empty. The SQLite side is read in one read transaction (one snapshot).
The wrapped keys are rows and travel with the data; the key file that unwraps them does not (it
stays in the node's data directory, and every node needs a copy of it).
"""

from __future__ import annotations

from dataclasses import dataclass


from appliance.errors import StoreError
from appliance.store import pg_schema
from appliance.store.dsn import error_text, redact
from appliance.store.interface import Connection
from appliance.store.postgres import psycopg

sql = psycopg.sql

# The ordinary tables: not the search index (an FTS5 virtual table and its shadow tables; PostgreSQL's
# own index, events_search, is written by its trigger as the events are copied).
SQL_TABLES = ("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name IN "
              "(SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table') ORDER BY rowid")
SQL_COLUMNS = "SELECT name FROM pragma_table_info(?)"
# Identity columns and their tables: the next id PostgreSQL hands out follows the copied ones.
IDENTITIES = (("origins", "id"), ("events", "rowid"), ("delivery_log", "id"))
# Rows migration 1 seeds, which the copy brings (with their values) instead.
SEEDED = ("meta", "admin_auth", "search_kinds")


@dataclass(frozen=True)
class TableCount:
    table: str
    sqlite: int
    postgresql: int


def copy_to_postgres(src: Connection, dsn: str) -> list[TableCount]:
    """Copy every table of the SQLite database `src` (at the current schema) into the empty
    PostgreSQL database at `dsn`; the per-table row counts on both sides (all equal, or StoreError)."""
    try:
        raw = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to {redact(dsn)}: {error_text(exc, dsn)}") from None
    try:
        with raw.transaction():
            tables = raw.execute(pg_schema.SQL_HAS_TABLES).fetchone()[0]
            if tables:
                raise StoreError(f"the database {redact(dsn)} is not empty ({tables} tables): "
                                 "migrate-to-postgres copies into an empty database only")
            pg_schema.migrate(raw)
            for table in SEEDED:
                raw.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
            counts = []
            with src:  # one read transaction: one snapshot of the SQLite database
                for (table,) in src.execute(SQL_TABLES).fetchall():
                    columns = [c for (c,) in src.execute(SQL_COLUMNS, (table,)).fetchall()]
                    n = _copy_table(src, raw, table, columns)
                    counts.append((table, n))
            for table, column in IDENTITIES:
                raw.execute(sql.SQL("SELECT setval(pg_get_serial_sequence({t}, {c}), "
                                    "coalesce(max({ci}), 0) + 1, false) FROM {ti}").format(
                    t=sql.Literal(table), c=sql.Literal(column), ci=sql.Identifier(column),
                    ti=sql.Identifier(table)))
            result = []
            for table, n in counts:
                got = raw.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0]
                result.append(TableCount(table, n, got))
            wrong = [c for c in result if c.sqlite != c.postgresql]
            if wrong:
                raise StoreError("row counts differ after the copy (nothing was kept): " + ", ".join(
                    f"{c.table} {c.sqlite} != {c.postgresql}" for c in wrong))
            return result
    except psycopg.Error as exc:
        raise StoreError(f"the copy into {redact(dsn)} failed, nothing was kept: {error_text(exc, dsn)}") from None
    finally:
        raw.close()


def _copy_table(src: Connection, raw: psycopg.Connection, table: str, columns: list[str]) -> int:
    """COPY one table's rows across; returns how many were read from SQLite."""
    # Names from the database's own schema (sqlite_schema), quoted as identifiers on both sides.
    select = "SELECT " + ", ".join(f'"{c}"' for c in columns) + f' FROM "{table}"'
    copy = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table),
                                                     sql.SQL(", ").join(map(sql.Identifier, columns)))
    n = 0
    with raw.cursor() as cur, cur.copy(copy) as out:
        for row in src.execute(select):
            out.write_row(row)
            n += 1
    return n
