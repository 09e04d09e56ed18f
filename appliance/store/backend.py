"""The store the `storage` setting names: SqliteStore (the default) or PostgresStore."""

from __future__ import annotations

from pathlib import Path

from appliance.store.dsn import is_postgres
from appliance.store.interface import Store


def make_store(storage: str, data_dir: Path, *, sync_mode: str = "full", write_batch: int = 500,
               reader_threads: int = 4) -> Store:
    """An unopened store for `storage` ('sqlite' or a postgresql:// URL); data_dir keeps the key
    file (and, for SQLite, the database)."""
    if is_postgres(storage):
        from appliance.store.postgres import PostgresStore  # psycopg only when asked for

        return PostgresStore(storage, data_dir, sync_mode=sync_mode, write_batch=write_batch,
                             reader_threads=reader_threads)
    from appliance.store.sqlite import SqliteStore

    return SqliteStore(data_dir, sync_mode=sync_mode, write_batch=write_batch, reader_threads=reader_threads)


def _backends() -> list:
    """The backend modules this installation has (PostgreSQL's only with its driver)."""
    from appliance.store import sqlite

    try:
        from appliance.store import postgres
    except ImportError:  # DriverMissing: the `postgresql` extra is not installed
        return [sqlite]
    return [sqlite, postgres]


def database_errors() -> tuple[type[BaseException], ...]:
    """The errors the database drivers raise (PostgreSQL's only when its driver is installed)."""
    return tuple(e for b in _backends() for e in b.DRIVER_ERRORS)


def value_errors() -> tuple[type[BaseException], ...]:
    """The drivers' errors for a statement that refused a value (a constraint, a type)."""
    return tuple(e for b in _backends() for e in b.VALUE_ERRORS)


def store_for(settings) -> Store:
    """make_store from a Settings object."""
    v = settings.values
    return make_store(v["storage"], settings.data_path, sync_mode=v["sync_mode"], write_batch=v["write_batch"],
                      reader_threads=v["reader_threads"])
