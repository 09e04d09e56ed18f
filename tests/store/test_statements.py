"""Each backend runs its own text of every statement: the store modules that run on both write each
statement as an SQL (SQLite's text and PostgreSQL's), a PostgreSQL connection runs the PostgreSQL
one and refuses any other text, and every PostgreSQL text is one the server accepts."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil

import pytest

import appliance.store
from appliance.errors import StoreError
from appliance.store.statement import SQL, PgText
from tests import pg

# Modules that never run on a PostgreSQL connection (SQLite's own), or only on one (PostgreSQL's
# own, written for it alone: scratch runs on a maintenance database's psycopg connection); and
# modules that run no statement.
SQLITE_ONLY = {"sqlite", "schema", "copy"}
POSTGRES_ONLY = {"postgres", "pg_schema", "pg_check", "pg_words", "scratch"}
NO_STATEMENTS = {"statement", "interface", "backend", "dsn", "faultlog", "instance", "readpool"}
# Statements a shared module runs on a psycopg connection of its own (the node bus listening).
OWN_CONNECTION = {("notify", "LISTEN")}
# PostgreSQL's own modules whose statements run on a PgConnection (the doctor's: pg_check.connect).
ON_PG_CONNECTION = ("pg_check",)


def shared_modules() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(appliance.store.__path__)]
    return sorted(set(names) - SQLITE_ONLY - POSTGRES_ONLY - NO_STATEMENTS)


def statements() -> list[tuple[str, str, str]]:
    """(module, name, PostgreSQL text) of every module-level statement of the shared modules, and
    of the PostgreSQL modules run on a PgConnection."""
    out = []
    for module in [*shared_modules(), *ON_PG_CONNECTION]:
        mod = importlib.import_module(f"appliance.store.{module}")
        for name, value in vars(mod).items():
            for i, stmt in enumerate(value if isinstance(value, tuple) else (value,)):
                label = name if not isinstance(value, tuple) else f"{name}[{i}]"
                if isinstance(stmt, SQL) and stmt.postgres is not None:
                    out.append((module, label, stmt.postgres))
                elif isinstance(stmt, PgText):
                    out.append((module, label, str(stmt)))
    return out


def test_every_statement_of_the_shared_modules_carries_its_postgresql_text():
    """A module-level SQL_* is an SQL with both texts (or one that declares itself SQLite-only,
    postgres None), or a PgText; and no execute() of a shared module takes a bare string."""
    missing = []
    for module in shared_modules():
        mod = importlib.import_module(f"appliance.store.{module}")
        for name, value in vars(mod).items():
            if not name.startswith("SQL_"):
                continue
            for stmt in value if isinstance(value, tuple) else (value,):
                if not isinstance(stmt, (SQL, PgText)):
                    missing.append(f"{module}.{name}")
        tree = ast.parse(inspect.getsource(mod))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("execute", "executemany") and node.args
                    and isinstance(node.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp))):
                text = ast.unparse(node.args[0])
                if not any(module == m and text.lstrip("f'\"").startswith(head) for m, head in OWN_CONNECTION):
                    missing.append(f"{module}:{node.lineno} ({text[:40]})")
    assert not missing, missing
    assert len(statements()) > 150


def test_nothing_translates_sqlite_statements_at_run_time():
    import appliance.store.postgres as postgres

    assert importlib.util.find_spec("appliance.store.dialect") is None
    assert "translate" not in inspect.getsource(postgres._text)
    assert not hasattr(postgres, "dialect")


class _Cursor:
    rowcount = 1

    def __init__(self, ran):
        self.ran = ran

    def execute(self, text, params=None):
        self.ran.append((text, params))

    def fetchone(self):
        return (7,)


class _Raw:
    """What PgConnection.execute needs of a psycopg connection: cursor()."""

    def __init__(self):
        self.ran = []

    def cursor(self):
        return _Cursor(self.ran)


def test_a_postgresql_connection_runs_only_postgresql_texts():
    from appliance.store.postgres import PgConnection

    conn = PgConnection(_Raw())
    conn.execute(SQL("SELECT x FROM t WHERE y = ?", "SELECT x FROM t WHERE y = %s"), (1,))
    conn.execute(PgText("SELECT pg_backend_pid()"))
    conn.execute(SQL("INSERT INTO t (y) VALUES (?)", "INSERT INTO t (y) VALUES (%s) RETURNING id",
                     returns_id=True), (2,))
    assert conn.raw.ran == [("SELECT x FROM t WHERE y = %s", [1]), ("SELECT pg_backend_pid()", None),
                            ("INSERT INTO t (y) VALUES (%s) RETURNING id", [2])]
    assert conn.last_insert_rowid() == 7
    with pytest.raises(StoreError, match="SELECT x FROM t WHERE y = \\?"):
        conn.execute("SELECT x FROM t WHERE y = ?", (1,))
    with pytest.raises(StoreError, match="INSERT OR REPLACE INTO t"):
        conn.executemany("INSERT OR REPLACE INTO t (y) VALUES (?)", [(1,)])
    with pytest.raises(StoreError, match="SQLite-only"):
        conn.execute(SQL("PRAGMA quick_check", None))
    assert len(conn.raw.ran) == 3


def test_a_statement_is_never_concatenated():
    with pytest.raises(TypeError):
        SQL("SELECT 1", "SELECT 1") + " WHERE true"


@pytest.mark.skipif(not pg.on_postgres(), reason="PostgreSQL's texts on the server (runs under --storage=postgresql)")
def test_every_postgresql_text_is_accepted_by_the_server(tmp_path):
    """EXPLAIN of each statement, its bindings NULL: the server parses it and resolves every table,
    column, function and type it names (nothing runs). Transaction control is left out."""
    import psycopg

    found = statements()
    refused = []
    with psycopg.connect(pg.database_for(tmp_path), autocommit=True) as raw:
        cur = psycopg.ClientCursor(raw)  # NULL written into the text: no parameter type to infer
        for module, name, text in found:
            if text.split(None, 1)[0].upper() in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"):
                continue
            try:
                with raw.transaction(force_rollback=True):
                    cur.execute("EXPLAIN " + text, [None] * text.count("%s") if "%" in text else None)
            except psycopg.Error as exc:
                refused.append(f"{module}.{name}: {str(exc).splitlines()[0]}")
    assert not refused, refused


def test_text_with_a_nul_is_refused_before_it_reaches_postgresql():
    from appliance.errors import Rejected
    from appliance.store.postgres import PgConnection

    conn = PgConnection(_Raw())
    with pytest.raises(Rejected, match="NUL"):
        conn.execute(SQL("SELECT ?", "SELECT %s"), ("a\x00b",))
    assert conn.raw.ran == []


SQL_LEASE = SQL("SELECT generation, endpoint, revoked_at, invalidated_at FROM leases WHERE pubkey = ?",
                "SELECT generation, endpoint, revoked_at, invalidated_at FROM leases WHERE pubkey = %s")
SQL_MARK_LEASE = SQL("UPDATE leases SET revoked_at = 5, invalidated_at = 6.5 WHERE pubkey = ?",
                     "UPDATE leases SET revoked_at = 5, invalidated_at = 6.5 WHERE pubkey = %s")


def test_replacing_a_lease_row_resets_the_columns_it_does_not_name(tmp_path):
    """SQLite's INSERT OR REPLACE deletes the old row: the columns the statement does not name go
    back to their defaults. PostgreSQL's text (an upsert) says so column by column."""
    from appliance.store import leases

    def row(generation, endpoint):
        return (1, "a" * 64, "d", "e" * 64, 10, 99, generation, 1, "ios", "apns", endpoint, "h", "[]", "k")

    with pg.make_store(tmp_path) as store:
        store.write_sync(lambda c: leases.put_lease(c, row(1, "first")))
        store.write_sync(lambda c: c.execute(SQL_MARK_LEASE, ("a" * 64,)))
        assert store.read_sync(lambda c: c.execute(SQL_LEASE, ("a" * 64,)).fetchall()) == [(1, "first", 5, 6.5)]
        store.write_sync(lambda c: leases.put_lease(c, row(2, "second")))
        assert store.read_sync(lambda c: c.execute(SQL_LEASE, ("a" * 64,)).fetchall()) == [(2, "second", None, None)]


class _DoctorRaw:
    """A psycopg connection answering the doctor's reads (pg_check) with a store's rows."""

    def __init__(self):
        self.ran = []

    def cursor(self):
        raw = self

        class Cursor:
            rowcount = 1

            def execute(self, text, params=None):
                raw.ran.append(text)
                self.text = text

            def fetchone(self):
                if "current_setting" in self.text:
                    return ("16.4", 160004, "UTF8", False, "off", 100, 3, 5, "on", "on", "appliance", 2**20)
                return ("1",) if "config_generation" in self.text else (1,)

            def fetchall(self):
                if "information_schema" in self.text:
                    return [("schema_version", "version")]
                return [(7,)]

        return Cursor()


def test_the_doctors_postgresql_reads_run_on_a_postgresql_connection():
    """`appliance doctor` (and reading the dashboard's settings) runs pg_check's statements on a
    PgConnection (pg_check.connect): each must be one it runs, not a bare string it refuses."""
    from appliance.store import pg_check
    from appliance.store.postgres import PgConnection

    conn = PgConnection(_DoctorRaw())
    found = pg_check.inspect(conn)
    assert (found.server.version_num, found.schema_version, found.version_rows) == (160004, 7, 1)
    assert pg_check.missing_rows(conn) == []
    assert len(conn.raw.ran) == 5
