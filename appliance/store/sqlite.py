"""The SQLite backend: one writer thread with group commit, a pool of reader connections."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

import apsw
import apsw.bestpractice

from appliance.errors import StoreError
from appliance.store.schema import migrate
from appliance.store.writer import Writer, WriteOp

log = logging.getLogger("appliance.store")
sqlite_log = logging.getLogger("appliance.sqlite")

T = TypeVar("T")

DB_FILENAME = "appliance.sqlite3"
# Seconds between WAL checkpoints (copying committed pages into the database file).
CHECKPOINT_INTERVAL = 1.0
# SQLite VM steps between checks of a read's deadline: a few microseconds of work each.
PROGRESS_STEPS = 10_000


class QueryTimeout(StoreError):
    """A read ran past its time budget and was abandoned."""


# WAL file size kept after a checkpoint; larger WALs are truncated back to this.
WAL_SIZE_LIMIT = 64 * 1024 * 1024

_bestpractice_applied = False


def _sqlite_log(code: int, message: str) -> None:
    """SQLite's error log, into the `appliance.sqlite` logger. A statement re-prepared after a
    schema change (SQLITE_SCHEMA, routine at start while migrations run) is DEBUG, not news."""
    primary = code & 0xFF
    if code == apsw.SQLITE_SCHEMA or primary == apsw.SQLITE_INTERRUPT:
        # Re-prepares after a schema change; reads abandoned on purpose (query_timeout).
        level = logging.DEBUG
    elif primary in (apsw.SQLITE_WARNING, apsw.SQLITE_NOTICE):
        level = logging.WARNING
    else:
        level = logging.ERROR
    sqlite_log.log(level, "%s (%s)", message, apsw.mapping_result_codes.get(primary, code))


# Every connection waits this long for a lock before giving up with BusyError.
BUSY_TIMEOUT_MS = 10_000


def connection_busy_timeout_first(conn: apsw.Connection) -> None:
    """The busy timeout, set first: the best-practice hooks after it (PRAGMA optimize) take
    locks, and on a fresh database they race the writer and the other readers opening at once."""
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)


def _apply_bestpractice() -> None:
    global _bestpractice_applied
    if not _bestpractice_applied:
        # apsw's own busy-timeout hook sets 100 ms, too short while migrations or a first
        # start's writes hold the lock; ours replaces it, in first place.
        hooks = tuple(connection_busy_timeout_first if f is apsw.bestpractice.connection_busy_timeout else f
                      for f in apsw.bestpractice.recommended)
        assert hooks[0] is connection_busy_timeout_first
        apsw.bestpractice.apply(hooks)
        apsw.config(apsw.SQLITE_CONFIG_LOG, _sqlite_log)  # replaces bestpractice's root-logger handler
        _bestpractice_applied = True


def connect(path: Path, *, sync_mode: str = "full", readonly: bool = False) -> apsw.Connection:
    """A connection with the appliance's pragmas (WAL, foreign keys, busy timeout, sync mode)."""
    _apply_bestpractice()
    flags = apsw.SQLITE_OPEN_READONLY if readonly else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    conn = apsw.Connection(str(path), flags=flags)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        # Deleted content (erased key material, a tombstoned lease's endpoint) is zeroed in the
        # pages being written anyway; FAST costs no extra I/O. The WAL is scrubbed separately.
        conn.execute("PRAGMA secure_delete = FAST")
    conn.execute(f"PRAGMA synchronous = {'FULL' if sync_mode == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA cache_size = -65536")  # 64 MiB page cache per connection
    conn.execute("PRAGMA temp_store = MEMORY")
    return conn


class SqliteStore:
    """The appliance's storage: run writes through the single writer, reads on reader threads."""

    def __init__(self, data_dir: Path, *, sync_mode: str = "full", write_batch: int = 500, reader_threads: int = 4):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_FILENAME
        self.sync_mode = sync_mode
        self.write_batch = write_batch
        self.reader_threads = reader_threads
        self._write_conn: apsw.Connection | None = None
        self._writer: Writer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._reader_conns: list[apsw.Connection] = []
        self._lock = threading.Lock()
        self.schema_version_found: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> "SqliteStore":
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.data_dir, 0o700)
        except OSError as exc:
            raise StoreError(f"cannot use the data directory {self.data_dir}: {exc.strerror or exc}") from None
        try:
            self._write_conn = connect(self.path, sync_mode=self.sync_mode)
            self.schema_version_found = migrate(self._write_conn)
        except (apsw.NotADBError, apsw.CorruptError) as exc:
            raise StoreError(f"{self.path} is not a usable SQLite database ({exc}): restore it from a backup, "
                             "or point --data-dir at another directory") from None
        except apsw.CantOpenError as exc:
            raise StoreError(f"cannot open {self.path} ({exc}): check the path and its permissions") from None
        # Checkpoints run on their own thread, not inside the writer's commits (where they would
        # stall every waiting OK); the WAL is truncated back to this size after each one.
        self._write_conn.execute("PRAGMA wal_autocheckpoint = 0")
        self._write_conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        self._writer = Writer(self._write_conn, self.write_batch)
        self._writer.start()
        self._stop_checkpoints = threading.Event()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="appliance-checkpoint", daemon=True)
        self._checkpointer.start()
        self._pool = ThreadPoolExecutor(self.reader_threads, thread_name_prefix="appliance-reader")
        return self

    def _checkpoint_loop(self) -> None:
        conn = connect(self.path, sync_mode=self.sync_mode)
        try:
            while not self._stop_checkpoints.wait(CHECKPOINT_INTERVAL):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except apsw.Error as exc:  # busy or locked: the next round catches up
                    log.debug("checkpoint skipped: %s", exc)
        finally:
            conn.close()

    def scrub_wal(self) -> bool:
        """Checkpoint everything and truncate the WAL to zero bytes, so page images written before
        (say, a private key since erased) are gone from it; False if readers kept it busy."""
        conn = connect(self.path, sync_mode=self.sync_mode)
        try:
            busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return busy == 0
        except apsw.Error as exc:
            log.debug("WAL scrub deferred: %s", exc)
            return False
        finally:
            conn.close()

    def backup(self, dest: Path) -> None:
        """Write a consistent copy of the database to `dest` while the appliance runs, with
        SQLite's online backup API (a file copy could catch a commit half-written)."""
        src = connect(self.path, sync_mode=self.sync_mode)
        try:
            dst = apsw.Connection(str(dest))
            try:
                with dst.backup("main", src, "main") as step:
                    step.step(-1)  # every page in one read transaction: one snapshot
                dst.execute("PRAGMA journal_mode = DELETE")  # a single self-contained file
            finally:
                dst.close()
        finally:
            src.close()

    def close(self) -> None:
        if getattr(self, "_checkpointer", None) is not None:
            self._stop_checkpoints.set()
            self._checkpointer.join()
            self._checkpointer = None
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()
        if self._write_conn is not None:
            try:
                self._write_conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except apsw.Error:
                pass
            self._write_conn.close()
            self._write_conn = None

    def __enter__(self) -> "SqliteStore":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writes ---------------------------------------------------------------------------------

    def write(self, op: WriteOp) -> asyncio.Future:
        """Run `op(conn)` in the shared write transaction; awaitable, resolves after COMMIT."""
        assert self._writer is not None, "store is not open"
        return self._writer.submit(op)

    def write_sync(self, op: WriteOp) -> Any:
        """Blocking variant of `write` for threads without an event loop (CLI, tests)."""
        assert self._writer is not None, "store is not open"
        return self._writer.run_sync(op)

    @property
    def writer_stats(self) -> tuple[int, int]:
        w = self._writer
        return (w.commits, w.writes) if w else (0, 0)

    # -- reads ----------------------------------------------------------------------------------

    def _reader(self) -> apsw.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path, sync_mode=self.sync_mode)
            self._local.conn = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    def read_sync(self, fn: Callable[[apsw.Connection], T], timeout: float | None = None) -> T:
        """Run `fn(conn)` on this thread's reader connection, in one read transaction. With
        `timeout` (seconds), SQLite abandons it past that time: QueryTimeout."""
        conn = self._reader()
        if not timeout:
            with conn:
                return fn(conn)
        deadline = time.monotonic() + timeout
        conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS, id="timeout")
        try:
            with conn:
                return fn(conn)
        except apsw.InterruptError:
            raise QueryTimeout(f"query took longer than {timeout:g} s") from None
        finally:
            conn.set_progress_handler(None, id="timeout")

    async def read(self, fn: Callable[[apsw.Connection], T], timeout: float | None = None) -> T:
        """Run `fn(conn)` on a reader thread (a consistent snapshot) without blocking the loop."""
        assert self._pool is not None, "store is not open"
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.read_sync, fn, timeout)
