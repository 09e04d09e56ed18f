"""The PostgreSQL backend (`storage = "postgresql://..."`): store.interface, SQLite's threading model.

One writer thread owns one connection and groups writes per transaction (writer.Writer, each op
in its own SAVEPOINT); reads run on the same fair reader threads as SQLite's (readpool.ReadPool),
each borrowing a connection from a psycopg_pool ConnectionPool for one REPEATABLE READ, READ ONLY
transaction (one snapshot, like a SQLite read transaction), bounded by statement_timeout. The event
loop never waits on the database. The store functions keep taking a `conn`: here a PgConnection,
which implements store.interface.Connection and runs each statement's own PostgreSQL text (an
SQL's `postgres`, or a PgText built for PostgreSQL: statement.py); it refuses any other text, so
a statement written for SQLite alone fails at once instead of being run or rewritten.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from appliance.errors import Rejected, StoreError
from appliance.store.interface import POSTGRES_DRIVER_MISSING, DriverMissing, QueryTimeout

try:  # the `postgresql` extra; the other PostgreSQL modules take psycopg from here
    import psycopg
    import psycopg.errors
    import psycopg.sql
    from psycopg.adapt import Loader
    from psycopg_pool import ConnectionPool
except ImportError:
    raise DriverMissing(POSTGRES_DRIVER_MISSING) from None

from appliance.store import pg_schema
from appliance.store.dsn import error_text, redact
from appliance.store.meta import HeldLocks
from appliance.store.readpool import ReadPool
from appliance.store.statement import SQL, PgText
from appliance.store.writer import Writer, WriterFront
from appliance.store.interface import Connection

log = logging.getLogger("appliance.store")

T = TypeVar("T")

# The driver's errors, and those of a statement that refused a value (store.backend names them).
DRIVER_ERRORS: tuple[type[BaseException], ...] = (psycopg.Error,)
VALUE_ERRORS: tuple[type[BaseException], ...] = (psycopg.DataError,)

# Reader connections the pool keeps open (more open on demand, up to max_threads of the ReadPool).
DEFAULT_POOL_MIN = 2
# Seconds a read waits for a pooled connection before it fails.
POOL_TIMEOUT = 30.0
# Seconds between reconnection attempts of the writer after its connection broke.
RECONNECT_PAUSE = 0.5


def pool_max_size(reader_threads: int) -> int:
    """Reader connections the pool opens at most (a read borrows one; reads of the REQ path and the
    housekeeping may overlap the reader threads' own)."""
    return max(reader_threads * 2, 8)


class _NumberLoader(Loader):
    """numeric -> int (or float): PostgreSQL's sum() of BIGINT is numeric; SQLite gives an integer."""

    def load(self, data):
        text = bytes(data)
        if b"." in text or b"e" in text or b"E" in text or b"N" in text:
            return float(text)
        return int(text)


def _configure(raw: psycopg.Connection) -> None:
    raw.adapters.register_loader("numeric", _NumberLoader)


class _Empty:
    """The cursor of a statement whose rows the connection consumed (INSERT ... RETURNING id)."""

    def fetchone(self):
        return None

    def fetchall(self):
        return []

    def __iter__(self):
        return iter(())


_EMPTY = _Empty()


def _params(params):
    """A statement's bindings (a sequence) as psycopg takes them (bool as 0/1: the schema's flags are integers).
    PostgreSQL text cannot hold U+0000, which SQLite stores: such a value is refused as invalid."""
    if params is None:
        return ()
    if isinstance(params, dict):
        raise TypeError("named bindings are not supported on PostgreSQL")
    out = []
    for p in params:
        cls = p.__class__
        if cls is bool:
            p = int(p)
        elif cls is str and "\x00" in p:
            raise Rejected("invalid", "text with a NUL character (U+0000) cannot be stored")
        out.append(p)
    return out


def _text(sql: str) -> tuple[str, bool]:
    """(PostgreSQL text, whether it returns the new row's id) of a statement: an SQL's own
    PostgreSQL text, a PgText as it is (psycopg reads `%` as a binding's mark only in a statement
    run with bindings: a literal one is written `%%` there, `%` elsewhere)."""
    cls = sql.__class__
    if cls is SQL:
        if sql.postgres is None:
            raise StoreError(f"a SQLite-only statement ran on PostgreSQL: {sql[:80]!r}")
        return sql.postgres, sql.returns_id
    if cls is PgText:
        return sql, False
    raise StoreError(f"a statement without its PostgreSQL text ran on PostgreSQL (write it as statement.SQL): "
                     f"{sql[:80]!r}")


# The first two letters of the transaction control statements a connection's HeldLocks follows
# (BEGIN, COMMIT, ROLLBACK [TO], SAVEPOINT, RELEASE, END, ABORT); others with them cost a split.
_CONTROL = frozenset(("BE", "CO", "RO", "SA", "RE", "EN", "AB"))


class PgConnection:
    """A psycopg connection as a store.interface.Connection: runs each statement's PostgreSQL text."""

    backend = "postgresql"  # interface.is_sqlite
    __slots__ = ("raw", "_changes", "_rowid", "deadline", "timeout", "_nest", "locks")

    def __init__(self, raw: psycopg.Connection):
        self.raw = raw
        self._changes = 0
        self._rowid = 0
        self._nest: list[str | None] = []  # `with conn:` levels: None began the transaction, else a savepoint
        self.deadline: float | None = None  # a read's: past it, the next statement is not started
        self.timeout: float | None = None
        self.locks = HeldLocks()  # the node locks its transaction holds (meta.node_lock)

    def execute(self, sql: str, params=None):
        if sql[:2] in _CONTROL:
            self.locks.statement(sql)
        text, returns_id = _text(sql)
        bound = bool(params)
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise QueryTimeout(f"query took longer than {self.timeout:g} s")
        cur = self.raw.cursor()
        try:
            cur.execute(text, _params(params) if bound else None)
        except psycopg.errors.QueryCanceled:
            raise QueryTimeout(f"query took longer than {self.timeout or 0:g} s") from None
        self._changes = cur.rowcount if cur.rowcount >= 0 else 0
        if returns_id:
            row = cur.fetchone()
            if row is not None:
                self._rowid = row[0]
            return _EMPTY
        return cur

    def executemany(self, sql: str, seq) -> None:
        text, _returns_id = _text(sql)
        rows = [_params(p) for p in seq]
        if not rows:
            self._changes = 0
            return
        with self.raw.cursor() as cur:
            cur.executemany(text, rows)
            self._changes = cur.rowcount if cur.rowcount >= 0 else 0

    def changes(self) -> int:
        return self._changes

    def last_insert_rowid(self) -> int:
        return self._rowid

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def __enter__(self) -> "PgConnection":
        """A transaction (inside one already open, a savepoint): interface.Connection's `with conn:`."""
        if not self._nest and not self.in_transaction:
            self.raw.execute("BEGIN")
            self.locks.end()
            self._nest.append(None)
        else:
            name = f"nest{len(self._nest)}"
            self.raw.execute(f"SAVEPOINT {name}")
            self.locks.savepoint(name)
            self._nest.append(name)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        name = self._nest.pop()
        if name is None:
            self.locks.end()
            self.raw.execute("ROLLBACK" if exc_type else "COMMIT")
        else:
            if exc_type:
                self.locks.rollback_to(name)
                self.raw.execute(f"ROLLBACK TO {name}")
            self.locks.release(name)
            self.raw.execute(f"RELEASE {name}")

    def close(self) -> None:
        self.raw.close()


class PgWriter(Writer):
    """The one writer on PostgreSQL: reconnects after its connection broke (a database restart)."""

    BEGIN = PgText("BEGIN")
    ERRORS = (psycopg.Error,)
    FULL_ERRORS = (psycopg.errors.DiskFull,)

    def __init__(self, conn: PgConnection, batch_max: int, connect: Callable[[], PgConnection]):
        super().__init__(conn, batch_max)
        self._connect = connect
        conn.locks.ordered = True  # node locks in one global order (meta.node_lock, Writer)

    def before_batch(self) -> None:
        if not self._conn.raw.closed and not self._conn.raw.broken:
            return
        log.warning("the writer's database connection was lost: reconnecting")
        try:
            self._conn.raw.close()
        except psycopg.Error:
            pass
        while True:
            try:
                self._conn = self._connect()
                self._conn.locks.ordered = True
                return
            except psycopg.OperationalError as exc:
                log.error("cannot reach the database (%s); retrying", exc.__class__.__name__)
                time.sleep(RECONNECT_PAUSE)


class PostgresStore(WriterFront):
    """The appliance's storage on PostgreSQL: same public surface as SqliteStore."""

    def __init__(self, dsn: str, data_dir: Path, *, write_batch: int = 500, reader_threads: int = 4,
                 sync_mode: str = "full"):
        self.dsn = dsn
        self.data_dir = Path(data_dir)  # the key file and instance lock stay the node's
        self.path = None
        self.sync_mode = sync_mode
        self.write_batch = write_batch
        self.reader_threads = reader_threads
        self.backend = "postgresql"
        self._writer: PgWriter | None = None
        self._pool: ReadPool | None = None
        self._conns: ConnectionPool | None = None
        self._local = threading.local()
        self.schema_version_found: int | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.dsn)})"

    # -- lifecycle ------------------------------------------------------------------------------

    def _connect(self) -> PgConnection:
        raw = psycopg.connect(self.dsn, autocommit=True)
        _configure(raw)
        if self.sync_mode != "full":  # 'normal': a crash of the database server may lose the last commits
            raw.execute("SET synchronous_commit = off")
        return PgConnection(raw)

    def open(self) -> "PostgresStore":
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot use the data directory {self.data_dir}: {exc.strerror or exc}") from None
        try:
            conn = self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the PostgreSQL database {redact(self.dsn)}: "
                             f"{error_text(exc, self.dsn)}") from None
        try:
            self.schema_version_found = pg_schema.migrate(conn.raw)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot migrate the PostgreSQL database {redact(self.dsn)}: "
                             f"{error_text(exc, self.dsn)}") from None
        except BaseException:
            conn.close()
            raise
        self._conns = ConnectionPool(self.dsn, min_size=min(DEFAULT_POOL_MIN, self.reader_threads),
                                     max_size=pool_max_size(self.reader_threads), kwargs={"autocommit": True},
                                     configure=_configure, timeout=POOL_TIMEOUT, open=True,
                                     name="appliance-readers")
        self._writer = PgWriter(conn, self.write_batch, self._connect)
        self._writer.start()
        self._pool = ReadPool(self, self.reader_threads)
        log.debug("PostgreSQL store open: schema version %d (found %d), %d reader threads",
                  pg_schema.SCHEMA_VERSION, self.schema_version_found, self.reader_threads)
        return self

    def create_schema(self) -> int:
        """Migrate the database and close again (the schema version found before)."""
        conn = self._connect()
        try:
            return pg_schema.migrate(conn.raw)
        finally:
            conn.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.stop()
            try:
                self._writer._conn.close()
            except psycopg.Error:
                pass
            self._writer = None
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        if self._conns is not None:
            self._conns.close()
            self._conns = None


    def memory_used(self) -> None:
        """None: the database's memory is the server's, not this process's."""
        return None

    def scrub_wal(self) -> bool:
        """Nothing to scrub here: PostgreSQL's WAL and its retention are the database's operator's."""
        return True

    def backup(self, dest: Path) -> None:
        raise StoreError("backups of a PostgreSQL store are the database's own (pg_dump, or its replicas): "
                         "`appliance backup` copies a SQLite store only")

    # -- reads (the ReadPool's hooks: _reader, _read_on, _forget_reader, _read_inline) -----------

    def _reader(self):
        return None  # a connection is borrowed from the pool per read

    def _forget_reader(self, conn) -> None:
        pass

    def _read_inline(self, fn, timeout=None):
        return None  # a round trip to the server would block the loop: always a reader thread

    def _read_on(self, _conn, fn: Callable[[PgConnection], T], deadline: float | None, timeout: float | None,
                 every: Callable[[], bool] | None = None) -> T:
        """`fn(conn)` in one read-only snapshot; past `deadline` the statement running is
        cancelled by the server (statement_timeout) and no other starts: QueryTimeout."""
        assert self._conns is not None, "store is not open"
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QueryTimeout(f"query took longer than {timeout:g} s (waiting for a reader)")
            begin += f"; SET LOCAL statement_timeout = {max(1, int(left * 1000))}"
        with self._conns.connection() as raw:
            conn = PgConnection(raw)
            conn.deadline, conn.timeout = deadline, timeout
            try:
                raw.execute(begin)
                try:
                    result = fn(conn)
                finally:
                    if conn.in_transaction:
                        raw.execute("ROLLBACK")  # read only: nothing to keep
            except psycopg.errors.QueryCanceled:
                raise QueryTimeout(f"query took longer than {timeout or 0:g} s") from None
            return result

    def read_sync(self, fn: Callable[[PgConnection], T], timeout: float | None = None) -> T:
        return self._read_on(None, fn, time.monotonic() + timeout if timeout else None, timeout)

    async def read(self, fn: Callable[[PgConnection], T], timeout: float | None = None, owner: Any = None,
                   inline: bool = False) -> T:
        pool = self._pool
        assert pool is not None, "store is not open"
        return await pool.submit(fn, timeout, owner, False)

    def read_then(self, fn: Callable[[PgConnection], T], done: Callable[[Any, BaseException | None], None],
                  timeout: float | None = None, owner: Any = None, inline: bool = False):
        pool = self._pool
        assert pool is not None, "store is not open"
        return pool.submit_then(fn, done, timeout, owner, False)


SQL_BACKEND_PIDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()")


def backend_pids(dsn: str) -> list[int]:
    """The server processes connected to the database at `dsn` (but this query's own)."""
    with psycopg.connect(dsn, autocommit=True) as raw:
        return [r[0] for r in raw.execute(SQL_BACKEND_PIDS)]
