"""What the rest of the appliance may know of a store: protocols both backends implement, and the
errors they raise. Code outside `store/` is typed against these, never against a backend's class or
its driver's; the store modules' functions take a `Connection` and run a backend's statements on it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeVar, runtime_checkable

from appliance.errors import StoreError

T = TypeVar("T")


class QueryTimeout(StoreError):
    """A read ran past its time budget and was abandoned."""


class DriverMissing(StoreError, ImportError):
    """The database driver `storage` needs is not installed (an optional extra)."""


# What `storage` = a PostgreSQL URL says when psycopg is absent.
POSTGRES_DRIVER_MISSING = ("storage is a PostgreSQL URL, but the PostgreSQL driver (psycopg) is not installed: "
                           "pip install 'appliance[postgresql]'")


class Cursor(Protocol):
    """The rows of one statement."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


@runtime_checkable
class Connection(Protocol):
    """One database connection as the store functions use it. `with conn:` is a transaction (a
    savepoint inside one already open), committed on a normal exit and rolled back on an error.

    `execute` takes a statement.SQL, of which each backend runs its own text (SQLite the string
    itself, PostgreSQL its `postgres`), or one backend's own text: a PgText on PostgreSQL, a plain
    string on SQLite (its own modules' PRAGMAs). A PostgreSQL connection refuses a plain string:
    nothing is translated from one backend's text to the other's."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Cursor: ...

    def executemany(self, sql: str, seq: Any) -> Any: ...

    def changes(self) -> int: ...

    def last_insert_rowid(self) -> int: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type, exc, tb) -> Any: ...

    def close(self) -> None: ...


def is_sqlite(conn: Connection) -> bool:
    """Whether `conn` is a SQLite connection (a PostgreSQL one says `backend = "postgresql"`)."""
    return getattr(conn, "backend", "sqlite") == "sqlite"


WriteOp = Callable[[Connection], Any]
ReadFn = Callable[[Connection], T]
Done = Callable[[Any, "BaseException | None"], None]


class ReadHandle(Protocol):
    """A read started with `Store.read_then`."""

    def cancel(self) -> None: ...


class Store(Protocol):
    """The appliance's storage: one writer (writes grouped per commit, in order) and reads on
    their own threads, each in one consistent snapshot; neither ever blocks the event loop."""

    backend: str  # "sqlite" or "postgresql"
    data_dir: Path  # the node's directory (key file, instance lock; SQLite's database)
    path: Path | None  # SQLite's database file; None on PostgreSQL
    dsn: str | None  # PostgreSQL's URL (the node bus listens with it); None on SQLite
    reader_threads: int
    schema_version_found: int | None

    def open(self) -> "Store": ...

    def close(self) -> None: ...

    def __enter__(self) -> "Store": ...

    def __exit__(self, *exc: Any) -> None: ...

    # -- reads
    async def read(self, fn: ReadFn[T], timeout: float | None = None, owner: Any = None,
                   inline: bool = False) -> T: ...

    def read_then(self, fn: ReadFn[T], done: Done, timeout: float | None = None, owner: Any = None,
                  inline: bool = False) -> ReadHandle: ...

    def read_sync(self, fn: ReadFn[T], timeout: float | None = None) -> T: ...

    # -- writes
    def write(self, op: WriteOp) -> asyncio.Future: ...

    def write_then(self, op: WriteOp, done: Done) -> None: ...

    def write_sync(self, op: WriteOp) -> Any: ...

    # -- the writer's state
    @property
    def full_since(self) -> float | None: ...

    @property
    def writer_stats(self) -> tuple[int, int]: ...

    @property
    def lock_reorders(self) -> int: ...

    @property
    def writes_queued(self) -> int: ...

    def memory_used(self) -> int | None:
        """Bytes the database holds in this process (SQLite: page caches, statements); None when
        its memory is another process's (PostgreSQL's server)."""
        ...

    # -- upkeep
    def scrub_wal(self) -> bool: ...

    def backup(self, dest: Path) -> None: ...
