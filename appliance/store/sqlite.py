"""The SQLite backend: one writer thread with group commit, a pool of reader connections."""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import apsw
import apsw.bestpractice

from appliance.errors import StoreError
from appliance.store.interface import QueryTimeout
from appliance.store.readpool import INLINE_STALLED, ReadPool, trim_heap  # noqa: F401 - trim_heap re-exported
from appliance.store.faultlog import FaultLog
from appliance.store.schema import migrate
from appliance.store.writer import Writer, WriterFront

log = logging.getLogger("appliance.store")
sqlite_log = logging.getLogger("appliance.sqlite")

T = TypeVar("T")

DB_FILENAME = "appliance.sqlite3"
# The driver's errors, and those of a statement that refused a value (store.backend names them).
DRIVER_ERRORS: tuple[type[BaseException], ...] = (apsw.Error,)
VALUE_ERRORS: tuple[type[BaseException], ...] = (apsw.ConstraintError, apsw.MismatchError)
# Seconds between WAL checkpoints (copying committed pages into the database file).
CHECKPOINT_INTERVAL = 1.0
# SQLite VM steps between checks of a read's deadline: a few microseconds of work each.
PROGRESS_STEPS = 10_000
# Page cache of each reader connection. Small: there can be many of them (ReadPool), the OS page
# cache holds the file anyway, and a query's working set is a few index pages. (Memory-mapping
# the file instead would count it once per connection in the process's RSS.)
READER_CACHE_KIB = 4 * 1024
# Bounds of a read run on the event loop's own thread, which saves a small REQ two thread hand-offs
# (SqliteStore._read_inline): docs/performance.md#inline_max_steps
INLINE_MAX_STEPS = 64_000
INLINE_MAX_CPU_SECONDS = 0.004
INLINE_MAX_SECONDS = 0.025
INLINE_CHECK_STEPS = 1_000
# The page cache of the loop's own connection, which answers most REQs: larger than a reader's
# (there is one of it); no mmap, which cost more than it saved: docs/performance.md#inline_cache_kib
INLINE_CACHE_KIB = 32 * 1024
# The writer maps the file: the pages a write reads first are page faults on the OS page cache
# instead of read system calls (the file never shrinks while serving; a failed read there is
# SIGBUS and a restart): docs/performance.md#writer_mmap_bytes
WRITER_MMAP_BYTES = 2 * 1024 * 1024 * 1024


# WAL file size kept after a checkpoint; larger WALs are truncated back to this.
WAL_SIZE_LIMIT = 64 * 1024 * 1024
# Pages in the WAL past which the writer restarts it after a commit (RESTART: everything copied
# back, the next commit writes from the start of the file again), rather than letting a write
# burst with readers present grow it without bound: every read searches the WAL index, so a big
# WAL slows reads too. The checkpointer copies pages back (PASSIVE) from half this on, so little is
# left to copy then. 2,048 pages of 4 KiB: 8 MiB.
WAL_RESTART_PAGES = 2048
# How long a RESTART waits for readers on older snapshots (it holds new writes back meanwhile);
# if they are not done by then, the next commit tries again.
WAL_RESTART_WAIT_MS = 100
# After readers kept a RESTART from finishing (a long or paused query), commits skip it this long.
WAL_RESTART_BACKOFF = 1.0

_bestpractice_applied = False


# SQLite reports a full disk on every statement it aborts (commits, each WAL checkpoint round):
# the first is logged, then one line a minute, and one when a commit fits again (_wal_hook).
_disk_full = FaultLog(sqlite_log, "SQLite: writing to the disk")


def _sqlite_log(code: int, message: str) -> None:
    """SQLite's error log, into the `appliance.sqlite` logger. A statement re-prepared after a
    schema change (SQLITE_SCHEMA, routine at start while migrations run) is DEBUG, not news."""
    primary = code & 0xFF
    if primary == apsw.SQLITE_FULL:
        _disk_full.failed(f"{message} (SQLITE_FULL)")
        return
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
        # start's writes hold the lock; ours replaces it, in first place (apsw before 3.49.2
        # lists WAL first, whose pragma takes a lock).
        hooks = (connection_busy_timeout_first,
                 *(f for f in apsw.bestpractice.recommended if f is not apsw.bestpractice.connection_busy_timeout))
        apsw.bestpractice.apply(hooks)
        apsw.config(apsw.SQLITE_CONFIG_LOG, _sqlite_log)  # replaces bestpractice's root-logger handler
        _bestpractice_applied = True


def connect(path: Path, *, sync_mode: str = "full", readonly: bool = False, reader: bool = False) -> apsw.Connection:
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
    if reader:
        conn.execute(f"PRAGMA cache_size = -{READER_CACHE_KIB}")
    else:
        conn.execute("PRAGMA cache_size = -65536")  # 64 MiB page cache for the writer
    conn.execute("PRAGMA temp_store = MEMORY")
    # Plans never depend on bound values: a REQ for another #p or author is not re-prepared
    # (docs/performance.md#plans-fixed-qpsg).
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
    return conn


# Linux counts block reads per thread; elsewhere the process's count (more reads count as the disk's).
_RUSAGE_WHO = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def _blocks_read() -> int:
    """Blocks this thread has read from the disk (not from the OS page cache) so far."""
    return resource.getrusage(_RUSAGE_WHO).ru_inblock



def memory_used() -> int:
    """Bytes SQLite holds in memory (page caches of the writer and readers, statements)."""
    return apsw.memory_used()


def in_memory() -> apsw.Connection:
    """A plain SQLite database in memory (no file, no pragmas): a scratch schema to compare with."""
    return apsw.Connection(":memory:")


def read_file(path: Path, fn: Callable[[apsw.Connection], T]) -> T:
    """`fn(conn)` on a read-only connection to the database file `path` (closed after: a read-only
    connection never checkpoints the WAL, so what a killed appliance left stays as it was)."""
    conn = connect(path, readonly=True)
    try:
        return fn(conn)
    finally:
        conn.close()


def integrity_check(path: Path) -> list[str]:
    """SQLite's integrity_check of the database file `path`, read-only: ["ok"] when sound."""
    return read_file(path, lambda conn: [r[0] for r in conn.execute("PRAGMA integrity_check")])


def open_checked(path: Path, *, busy_timeout_ms: int = 0) -> tuple[apsw.Connection, list[str], int]:
    """A read-only connection to a database file, with SQLite's quick_check result and the file's
    schema version (what `doctor` and `restore` judge a file by). Raises apsw.Error if the file
    cannot be read as SQLite at all."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        if busy_timeout_ms:
            conn.set_busy_timeout(busy_timeout_ms)
        result = [r[0] for r in conn.execute("PRAGMA quick_check")]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except BaseException:
        conn.close()
        raise
    return conn, result, version


def backup_database(source: Path, dest: Path) -> int:
    """Write a consistent copy of the database `source` to `dest` while an appliance may be
    serving it, with SQLite's online backup API (a file copy could catch a commit half-written,
    or miss what still sits in the WAL). The copy is one self-contained file (no WAL), written
    under a temporary name, synced and renamed into place: `dest` is never half a backup.
    Returns the copy's size in bytes."""
    source, dest = Path(source), Path(dest)
    if not source.is_file():
        raise StoreError(f"there is no database at {source}")
    partial = dest.with_name(f".{dest.name}.partial")
    try:
        src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READWRITE)
    except apsw.Error as exc:
        raise StoreError(f"cannot open {source}: {exc}") from None
    try:
        src.set_busy_timeout(BUSY_TIMEOUT_MS)
        partial.unlink(missing_ok=True)
        # Private from its first byte: SQLite would create it with the umask's mode (often
        # world-readable) and its journal takes the same mode as the file.
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        dst = apsw.Connection(str(partial))
        try:
            with dst.backup("main", src, "main") as step:
                step.step(-1)  # every page in one read transaction: one snapshot
            dst.execute("PRAGMA journal_mode = DELETE")  # a single self-contained file
        finally:
            dst.close()
        with open(partial, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(partial, dest)
        _fsync_dir(dest.parent)
    except apsw.Error as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"backup of {source} failed: {exc}") from None
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"cannot write the backup {dest}: {exc.strerror or exc}") from None
    finally:
        src.close()
    return dest.stat().st_size


def _fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _private_files(path: Path) -> None:
    """The database and its WAL and shared-memory files readable by the owner only, whatever the
    umask: they hold users' private events (the backup copy is 0600 too). SQLite creates the -wal
    and -shm files with the database file's mode, so creating that one 0600 covers them."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if os.stat(p).st_mode & 0o077:
                os.chmod(p, 0o600)
        except FileNotFoundError:
            pass


class SqliteWriter(Writer):
    """The one writer on SQLite: BEGIN IMMEDIATE takes the write lock when the batch starts."""

    BEGIN = "BEGIN IMMEDIATE"
    ERRORS = (apsw.Error,)
    FULL_ERRORS = (apsw.FullError,)


class SqliteStore(WriterFront):
    """The appliance's storage: run writes through the single writer, reads on reader threads."""

    backend = "sqlite"  # PostgresStore's is "postgresql"
    dsn = None  # no database server: the node bus is local (store.interface.Store)

    def __init__(self, data_dir: Path, *, sync_mode: str = "full", write_batch: int = 500, reader_threads: int = 4):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_FILENAME
        self.sync_mode = sync_mode
        self.write_batch = write_batch
        self.reader_threads = reader_threads
        self._write_conn: apsw.Connection | None = None
        self._writer: Writer | None = None
        self._pool: ReadPool | None = None
        self._local = threading.local()
        self._reader_conns: list[apsw.Connection] = []
        self._inline_conn: apsw.Connection | None = None  # the loop's own (see ReadPool._run_inline)
        self._lock = threading.Lock()
        self.schema_version_found: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> "SqliteStore":
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.data_dir, 0o700)
            _private_files(self.path)
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
        self._write_conn.execute(f"PRAGMA mmap_size = {WRITER_MMAP_BYTES}")
        self._write_conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        self._stop_checkpoints = threading.Event()
        self._wal_big = threading.Event()
        self.wal_pages = 0
        self.wal_restarts = 0
        self._restart_after = 0.0
        self._checkpointing = threading.Lock()  # one checkpoint at a time: PASSIVE or the writer's RESTART
        self._write_conn.set_wal_hook(self._wal_hook)
        self._writer = SqliteWriter(self._write_conn, self.write_batch)
        self._writer.after_commit = self._restart_wal
        self._writer.start()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="appliance-checkpoint", daemon=True)
        self._checkpointer.start()
        self._pool = ReadPool(self, self.reader_threads)
        return self

    def _wal_hook(self, _conn: apsw.Connection, _db: str, pages: int) -> int:
        """After each commit (writer thread): past half WAL_RESTART_PAGES, wake the checkpointer."""
        _disk_full.recovered()
        self.wal_pages = pages
        if pages >= WAL_RESTART_PAGES // 2:
            self._wal_big.set()
        return apsw.SQLITE_OK

    def _checkpoint_loop(self) -> None:
        conn = connect(self.path, sync_mode=self.sync_mode)
        try:
            while not self._stop_checkpoints.is_set():
                self._wal_big.wait(CHECKPOINT_INTERVAL)
                if self._stop_checkpoints.is_set():
                    break
                self._wal_big.clear()
                try:
                    with self._checkpointing:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except apsw.Error as exc:  # busy or locked: the next round catches up
                    log.debug("checkpoint skipped: %s", exc)
        finally:
            conn.close()

    def _restart_wal(self) -> None:
        """Writer thread, after a commit: past WAL_RESTART_PAGES, copy the rest of the WAL back and
        have the next commit start it afresh (no writer to wait for: this is the writer). Readers
        on older snapshots get WAL_RESTART_WAIT_MS; if they are not done, the next commit retries."""
        if self.wal_pages < WAL_RESTART_PAGES or time.monotonic() < self._restart_after:
            return
        conn = self._write_conn
        # A PASSIVE round under way is let finish first (it copies what RESTART would; SQLite
        # would otherwise refuse the second checkpoint as busy): no new writes meanwhile, so the
        # WAL stops growing here.
        with self._checkpointing:
            conn.set_busy_timeout(WAL_RESTART_WAIT_MS)
            try:
                busy, _frames, _copied = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            except apsw.BusyError:
                busy = 1
            finally:
                conn.set_busy_timeout(BUSY_TIMEOUT_MS)
        if not busy:
            self.wal_restarts += 1
            self.wal_pages = 0
        else:  # a long read holds an old snapshot: do not stall every commit on it
            self._restart_after = time.monotonic() + WAL_RESTART_BACKOFF

    def memory_used(self) -> int:
        return memory_used()

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
        """Write a consistent copy of the database to `dest` (see `backup_database`)."""
        backup_database(self.path, Path(dest))

    def close(self) -> None:
        if getattr(self, "_checkpointer", None) is not None:
            self._stop_checkpoints.set()
            self._wal_big.set()
            self._checkpointer.join()
            self._checkpointer = None
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        with self._lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()
            self._inline_conn = None
        if self._write_conn is not None:
            try:
                self._write_conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except apsw.Error:
                pass
            self._write_conn.close()
            self._write_conn = None


    # -- reads ----------------------------------------------------------------------------------

    def _reader(self) -> apsw.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # Read-only: reads never take a write lock, not even the best-practice PRAGMA optimize
            # (which, on a busy database, could hold a new reader up behind the writer).
            conn = connect(self.path, sync_mode=self.sync_mode, readonly=True, reader=True)
            self._local.conn = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    def _forget_reader(self, conn: apsw.Connection) -> None:
        with self._lock:
            if conn in self._reader_conns:
                self._reader_conns.remove(conn)
        conn.close()

    def _read_inline(self, fn: Callable[[apsw.Connection], T],
                     timeout: float | None = None) -> tuple[Any, BaseException | None] | str | None:
        """`fn(conn)` in one read transaction on the calling (the loop's) thread's own connection,
        abandoned past INLINE_MAX_STEPS VM steps, INLINE_MAX_CPU_SECONDS of this thread's CPU time
        or INLINE_MAX_SECONDS (or `timeout`, the read's own budget, when smaller): (result, exception);
        None when abandoned as too long for the loop; INLINE_STALLED when abandoned on the wall clock
        alone with nothing read from the disk meanwhile, or the database was busy (this connection
        never waits for a lock)."""
        conn = self._inline_conn
        if conn is None:
            conn = self._inline_conn = connect(self.path, sync_mode=self.sync_mode, readonly=True, reader=True)
            conn.set_busy_timeout(0)
            conn.execute(f"PRAGMA cache_size = -{INLINE_CACHE_KIB}")
            with self._lock:
                self._reader_conns.append(conn)
        steps = 0
        stalled = False
        clock, cpu_clock = time.monotonic, time.thread_time
        start, cpu_start = clock(), cpu_clock()
        blocks_start = _blocks_read()
        wall = INLINE_MAX_SECONDS if timeout is None else min(INLINE_MAX_SECONDS, timeout)

        def progress() -> bool:
            nonlocal steps, stalled
            steps += INLINE_CHECK_STEPS
            if steps > INLINE_MAX_STEPS or cpu_clock() - cpu_start > INLINE_MAX_CPU_SECONDS:
                return True
            stalled = clock() - start > wall
            return stalled

        conn.set_progress_handler(progress, INLINE_CHECK_STEPS, id="inline")
        try:
            with conn:
                return fn(conn), None
        except apsw.InterruptError:
            return INLINE_STALLED if stalled and _blocks_read() == blocks_start else None
        except apsw.BusyError:
            return INLINE_STALLED
        except Exception as exc:  # noqa: BLE001 - handed to the waiter, as from a reader thread
            return None, exc
        finally:
            conn.set_progress_handler(None, id="inline")

    def read_sync(self, fn: Callable[[apsw.Connection], T], timeout: float | None = None) -> T:
        """Run `fn(conn)` on this thread's reader connection, in one read transaction. With
        `timeout` (seconds), SQLite abandons it past that time: QueryTimeout."""
        return self._read_on(self._reader(), fn, time.monotonic() + timeout if timeout else None, timeout)

    @staticmethod
    def _read_on(conn: apsw.Connection, fn: Callable[[apsw.Connection], T], deadline: float | None,
                 timeout: float | None, every: Callable[[], bool] | None = None) -> T:
        """`fn(conn)` in one read transaction; `every` runs now and then while SQLite works (the
        pool's time slices; True abandons the read), and past `deadline` the read is abandoned
        (QueryTimeout)."""
        if deadline is None and every is None:
            with conn:
                return fn(conn)
        clock = time.monotonic
        evicted = False

        def progress() -> bool:
            nonlocal evicted
            if every is not None and every():
                evicted = True
                return True
            return deadline is not None and clock() > deadline

        conn.set_progress_handler(progress, PROGRESS_STEPS, id="timeout")
        try:
            with conn:
                return fn(conn)
        except apsw.InterruptError:
            if evicted:
                raise QueryTimeout("query abandoned: its reader went to another connection") from None
            raise QueryTimeout(f"query took longer than {timeout:g} s") from None
        finally:
            conn.set_progress_handler(None, id="timeout")

    async def read(self, fn: Callable[[apsw.Connection], T], timeout: float | None = None, owner: Any = None,
                   inline: bool = False) -> T:
        """Run `fn(conn)` on a reader thread (a consistent snapshot) without blocking the loop.

        `owner` (a connection) shares the readers fairly with the other owners (see ReadPool);
        `timeout` counts from now, waiting included. With `inline` (and an owner), a short read
        may run on the loop's own thread instead, bounded (see INLINE_MAX_STEPS)."""
        pool = self._pool
        assert pool is not None, "store is not open"
        return await pool.submit(fn, timeout, owner, inline)

    def read_then(self, fn: Callable[[apsw.Connection], T], done: Callable[[Any, BaseException | None], None],
                  timeout: float | None = None, owner: Any = None, inline: bool = False):
        """`read` without a task or future: `done(result, exc)` is called on the loop (never if
        cancelled first, never from within this call). Returns a handle with `cancel()`. The REQ
        path: one hand-off each way, or none when it runs inline."""
        pool = self._pool
        assert pool is not None, "store is not open"
        return pool.submit_then(fn, done, timeout, owner, inline)
