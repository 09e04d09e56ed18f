"""The suite's storage backend: SQLite (default) or PostgreSQL (`--storage=postgresql` or
APPLIANCE_TEST_STORAGE=postgresql, with APPLIANCE_TEST_PG naming the cluster's maintenance
database, e.g. postgresql://postgres@/postgres?host=/tmp/pg/sock).

On PostgreSQL every data directory a test uses gets a database of its own, created from a
migrated template (CREATE DATABASE ... TEMPLATE: a file copy, a few milliseconds), so a server
restarted on the same data directory finds its data again, and no two tests share a database."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

STORAGE = os.environ.get("APPLIANCE_TEST_STORAGE", "sqlite")
ADMIN_URL = os.environ.get("APPLIANCE_TEST_PG", "postgresql://postgres@/postgres?host=/tmp/pgstore-pg/sock")
TEMPLATE = "appliance_test_template"

_lock = threading.Lock()
_by_dir: dict[str, str] = {}
_created: list[str] = []
_template_ready = False


def on_postgres() -> bool:
    return STORAGE == "postgresql"


def _url(database: str) -> str:
    head, _, query = ADMIN_URL.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{database}" + (f"?{query}" if query else "")


def _admin():
    import psycopg

    return psycopg.connect(ADMIN_URL, autocommit=True)


def _ensure_template(admin) -> None:
    global _template_ready
    if _template_ready:
        return
    from appliance.store.postgres import PostgresStore
    from appliance.store.pg_schema import SCHEMA_VERSION

    exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (TEMPLATE,)).fetchone()
    if exists:  # a template of an older schema (another checkout's run) is made again
        import psycopg

        with psycopg.connect(_url(TEMPLATE)) as c:
            try:
                version = c.execute("SELECT version FROM schema_version").fetchone()[0]
            except psycopg.Error:
                version = -1
        if version != SCHEMA_VERSION:
            admin.execute(f'DROP DATABASE "{TEMPLATE}" WITH (FORCE)')
            exists = None
    if not exists:
        admin.execute(f"CREATE DATABASE \"{TEMPLATE}\" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' "
                      "TEMPLATE template0")
        _created.append(TEMPLATE)
        PostgresStore(_url(TEMPLATE), Path("/nonexistent-appliance-template")).create_schema()
    _template_ready = True


def new_database() -> str:
    """The URL of a fresh, migrated, empty database."""
    name = "appliance_test_" + uuid.uuid4().hex[:16]
    with _lock:
        with _admin() as admin:
            _ensure_template(admin)
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        _created.append(name)
    return _url(name)


def empty_database() -> str:
    """The URL of a fresh database with no tables at all."""
    name = "appliance_test_" + uuid.uuid4().hex[:16]
    with _lock:
        with _admin() as admin:
            admin.execute(f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' "
                          "TEMPLATE template0")
        _created.append(name)
    return _url(name)


def database_for(data_dir: Path) -> str:
    """The database of one data directory (created on first use)."""
    key = str(Path(data_dir).resolve())
    with _lock:
        url = _by_dir.get(key)
    if url is None:
        url = new_database()
        with _lock:
            url = _by_dir.setdefault(key, url)
    return url


def storage_env(data_dir: Path) -> dict:
    """The environment a server or CLI process on `data_dir` needs for the suite's backend."""
    return {"APPLIANCE_STORAGE": database_for(data_dir)} if on_postgres() else {}


def make_store(data_dir: Path, **kw):
    """An unopened store on `data_dir` for the suite's backend."""
    if on_postgres():
        from appliance.store.postgres import PostgresStore

        return PostgresStore(database_for(data_dir), data_dir, **kw)
    from appliance.store.sqlite import SqliteStore

    return SqliteStore(data_dir, **kw)


def drop_all() -> None:
    """Drops every database this run made (the template too when this run made it)."""
    global _template_ready
    with _lock:
        names, _created[:] = list(_created), []
        _by_dir.clear()
        _template_ready = False
    if not names:
        return
    with _admin() as admin:
        for name in reversed(names):  # the template last: the others were copied from it
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def db_rows(data_dir: Path, sql: str, args=()) -> list[tuple]:
    """Rows of one query on the database of `data_dir`, read beside a running server (read-only on
    SQLite). `sql`: a statement.SQL, whose PostgreSQL text runs on PostgreSQL, or a text without
    bindings that both backends run as it is."""
    if on_postgres():
        import psycopg

        from appliance.store.postgres import _configure
        from appliance.store.statement import SQL

        if isinstance(sql, SQL):
            text = sql.postgres
        elif args:
            raise TypeError(f"a query with bindings needs its PostgreSQL text, SQL(sqlite, postgres): {sql[:60]!r}")
        else:
            text = sql
        with psycopg.connect(database_for(data_dir), autocommit=True) as conn:
            _configure(conn)
            return [tuple(r) for r in conn.execute(text, tuple(args) if args else None).fetchall()]
    import apsw

    # apsw, the store's own SQLite: the stdlib's may be too old for the schema (FTS5's contentless_delete).
    conn = apsw.Connection(str(Path(data_dir) / "appliance.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(10_000)
    try:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()


def cli_env(args) -> dict:
    """storage_env for a command line naming `--data-dir DIR` (nothing when it names none)."""
    args = [str(a) for a in args]
    for i, a in enumerate(args):
        if a == "--data-dir" and i + 1 < len(args):
            return storage_env(Path(args[i + 1]))
        if a.startswith("--data-dir="):
            return storage_env(Path(a.split("=", 1)[1]))
    return {}


def process_env(args=(), data_dir: Path | None = None, **extra: str) -> dict:
    """The environment of an `appliance` process a test runs: this process's environment without
    any APPLIANCE_* setting, plus what the suite's backend needs for the data directory the
    command line names (`--data-dir`) or `data_dir`, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    env.update(storage_env(Path(data_dir)) if data_dir is not None else cli_env(args))
    env.update(extra)
    return env


def db_rows_at(url: str, sql: str, args=()) -> list[tuple]:
    """Rows of one PostgreSQL query on the database at `url`."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql, tuple(args) if args else None).fetchall()]


def table_names(data_dir: Path) -> list[str]:
    """The tables of `data_dir`'s database (the store's own, on either backend)."""
    if on_postgres():
        return [t for (t,) in db_rows_at(database_for(data_dir), "SELECT table_name FROM information_schema.tables "
                                         "WHERE table_schema = 'public' AND table_name <> 'schema_version'")]
    return [t for (t,) in db_rows(data_dir, "SELECT name FROM sqlite_master WHERE type = 'table'")]
