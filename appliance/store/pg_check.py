"""What `appliance doctor` reads of a PostgreSQL store, without writing anything: the server's
facts and settings, the schema version, the tables and columns, the rows every store holds.

Everything runs in one READ ONLY transaction on a connection of its own (`connect`); the doctor
then hands the same connection (a PgConnection) to the checks that read origins and keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.store import pg_schema, schema
from appliance.store.interface import Connection
from appliance.store.statement import PgText

# Seconds the doctor waits for the database server to answer a connection.
DEFAULT_CONNECT_TIMEOUT = 5

# The doctor's reads of the PostgreSQL store, run on a PgConnection (`connect`): PostgreSQL's own.
SQL_SERVER = PgText(
    "SELECT current_setting('server_version'), current_setting('server_version_num')::int, "
    "current_setting('server_encoding'), pg_is_in_recovery(), current_setting('default_transaction_read_only'), "
    "current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int, "
    "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), "
    "current_setting('fsync'), current_setting('synchronous_commit'), current_database(), "
    "pg_database_size(current_database())"
)
SQL_VERSION_ROWS = PgText("SELECT version FROM schema_version")
SQL_COLUMNS = PgText("SELECT table_name, column_name FROM information_schema.columns "
                     "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position")
SQL_GENERATION_ROW = PgText("SELECT value FROM meta WHERE name = 'config_generation'")
SQL_ADMIN_ROW = PgText("SELECT count(*) FROM admin_auth WHERE id = 1")
# SQLite's own catalogue, for the tables a store of this version has (the PostgreSQL ladder makes
# the same tables and columns: tests/store/test_schema.py holds the two together).
# (The search index is each backend's own: SQLite's FTS5 virtual table and its shadow tables are
# left out, PostgreSQL's events_search added: SEARCH_INDEX_COLUMNS.)
SQL_LITE_TABLES = ("SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table' "
                   "AND name NOT LIKE 'sqlite_%' ORDER BY name")
SEARCH_INDEX_COLUMNS = {"events_search": ["event", "tsv"]}
SQL_LITE_COLUMNS = "SELECT name FROM pragma_table_info(?)"

# PostgreSQL's lowest supported version here (README: 13 or later).
MIN_SERVER_VERSION = 130000


@dataclass
class Server:
    version: str
    version_num: int
    encoding: str
    in_recovery: bool
    read_only: bool
    max_connections: int
    reserved: int
    connections: int
    fsync: bool
    synchronous_commit: str
    database: str
    size: int


@dataclass
class Inspection:
    """What was found; `schema_version` None when the database holds no appliance schema."""

    server: Server
    schema_version: int | None
    version_rows: int = 0
    columns: dict[str, list[str]] = field(default_factory=dict)


def connect(dsn: str, *, timeout: float = DEFAULT_CONNECT_TIMEOUT):
    """A PgConnection inside one READ ONLY transaction (the caller closes it: nothing to commit)."""
    from appliance.store.postgres import PgConnection, _configure, psycopg

    raw = psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(timeout)))
    _configure(raw)
    raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    return PgConnection(raw)


def inspect(conn) -> Inspection:
    """The server's facts, the schema version and the tables of the database at `conn`."""
    r = conn.execute(SQL_SERVER).fetchone()
    server = Server(version=r[0], version_num=r[1], encoding=r[2], in_recovery=bool(r[3]),
                    read_only=r[4] == "on", max_connections=r[5], reserved=r[6], connections=r[7],
                    fsync=r[8] == "on", synchronous_commit=r[9], database=r[10], size=r[11])
    columns: dict[str, list[str]] = {}
    for table, column in conn.execute(SQL_COLUMNS).fetchall():
        columns.setdefault(table, []).append(column)
    if "schema_version" not in columns:
        return Inspection(server, None, 0, columns)
    rows = [v for (v,) in conn.execute(SQL_VERSION_ROWS).fetchall()]
    return Inspection(server, max(rows) if rows else None, len(rows), columns)


def expected_columns() -> dict[str, list[str]]:
    """Every table of the current schema with its columns, in order (schema_version included)."""
    from appliance.store.sqlite import in_memory

    lite = in_memory()
    try:
        schema.migrate(lite)
        want = {t: [c for (c,) in lite.execute(SQL_LITE_COLUMNS, (t,))]
                for (t,) in lite.execute(SQL_LITE_TABLES).fetchall()}
    finally:
        lite.close()
    want["schema_version"] = ["version"]
    want.update(SEARCH_INDEX_COLUMNS)
    return want


def missing_rows(conn) -> list[str]:
    """The rows migration 1 writes that every store needs, when absent (names, for a message)."""
    missing = []
    row = conn.execute(SQL_GENERATION_ROW).fetchone()
    if row is None or not str(row[0]).lstrip("-").isdigit():
        missing.append("meta config_generation")
    if not conn.execute(SQL_ADMIN_ROW).fetchone()[0]:
        missing.append("admin_auth row 1")
    return missing


def connections_per_node(reader_threads: int) -> int:
    """The database connections one node opens at most (docs/scaling.md, "What each node needs"):
    its writer, its reader pool, its listening connection and the one for ephemeral events."""
    from appliance.store.postgres import pool_max_size

    return 1 + pool_max_size(reader_threads) + 2


SCHEMA_VERSION = pg_schema.SCHEMA_VERSION
