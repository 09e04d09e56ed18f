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


def database_errors() -> tuple[type[BaseException], ...]:
    """The errors the database drivers raise (PostgreSQL's only when its driver is installed)."""
    import apsw

    try:
        import psycopg
    except ImportError:
        return (apsw.Error,)
    return (apsw.Error, psycopg.Error)


def value_errors() -> tuple[type[BaseException], ...]:
    """The drivers' errors for a statement that refused a value (a constraint, a type)."""
    import apsw

    errors: list[type[BaseException]] = [apsw.ConstraintError, apsw.MismatchError]
    try:
        import psycopg
    except ImportError:
        pass
    else:
        errors.append(psycopg.DataError)
    return tuple(errors)


def store_for(settings) -> Store:
    """make_store from a Settings object."""
    v = settings.values
    return make_store(v["storage"], settings.data_path, sync_mode=v["sync_mode"], write_batch=v["write_batch"],
                      reader_threads=v["reader_threads"])
