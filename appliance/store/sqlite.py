"""The SQLite backend: one writer thread with group commit, a pool of reader connections."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import resource
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, TypeVar

import apsw
import apsw.bestpractice

from appliance.errors import StoreError
from appliance.store.faultlog import FaultLog
from appliance.store.schema import migrate
from appliance.store.writer import Writer, WriterFront

log = logging.getLogger("appliance.store")
sqlite_log = logging.getLogger("appliance.sqlite")

T = TypeVar("T")

DB_FILENAME = "appliance.sqlite3"
# Seconds between WAL checkpoints (copying committed pages into the database file).
CHECKPOINT_INTERVAL = 1.0
# SQLite VM steps between checks of a read's deadline: a few microseconds of work each.
PROGRESS_STEPS = 10_000
# Reads one owner (a connection) may have started at once; its others wait behind every other
# owner's first read (see ReadPool).
DEFAULT_READS_PER_OWNER = 2
# Uninterrupted work a read may do while others wait before it pauses for them (strfry's
# queryTimesliceBudgetMicroseconds is 10 ms too).
DEFAULT_READ_SLICE = 0.010
# Reader threads (and connections) at most: one per started read, running or paused.
DEFAULT_MAX_READER_THREADS = 24
# Page cache of each reader connection. Small: there can be many of them (ReadPool), the OS page
# cache holds the file anyway, and a query's working set is a few index pages. (Memory-mapping
# the file instead would count it once per connection in the process's RSS.)
READER_CACHE_KIB = 4 * 1024
# Reader threads beyond `reader_threads` (started for paused reads) end after this long idle, and
# their connections' memory goes back.
READER_IDLE_SECONDS = 5.0
# Bounds of a read run on the event loop's own thread, which saves a small REQ two thread hand-offs
# (SqliteStore._read_inline): docs/performance.md#inline_max_steps
INLINE_MAX_STEPS = 64_000
INLINE_MAX_CPU_SECONDS = 0.004
INLINE_MAX_SECONDS = 0.025
INLINE_CHECK_STEPS = 1_000
INLINE_COOLDOWN = 10.0  # seconds a read too long for the loop sends its owner's next reads to the threads
# What `SqliteStore._read_inline` returns for a read abandoned without its owner's next reads
# leaving the loop (see INLINE_COOLDOWN); None is a read too long for the loop.
INLINE_STALLED = "stalled"
# The page cache of the loop's own connection, which answers most REQs: larger than a reader's
# (there is one of it); no mmap, which cost more than it saved: docs/performance.md#inline_cache_kib
INLINE_CACHE_KIB = 32 * 1024
# The writer maps the file: the pages a write reads first are page faults on the OS page cache
# instead of read system calls (the file never shrinks while serving; a failed read there is
# SIGBUS and a restart): docs/performance.md#writer_mmap_bytes
WRITER_MMAP_BYTES = 2 * 1024 * 1024 * 1024


class QueryTimeout(StoreError):
    """A read ran past its time budget and was abandoned."""


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
    # Plans never depend on bound values. With the sqlite_stat4 samples PRAGMA optimize keeps,
    # SQLite otherwise re-prepares a statement whenever a value bound into its WHERE changes
    # (every REQ for another #p or author): measured as a tenth of a 50-event REQ's instructions.
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
    return conn


class _Read:
    """One read: waiting to start, running on a reader thread, or paused between time slices.

    Its result goes to an asyncio future (`fut`) or, for callers that want no task and no
    future per read (a REQ), to `done(result, exc)` called on the loop."""

    __slots__ = ("fn", "deadline", "timeout", "owner", "seq", "fut", "loop", "resume", "slice_start", "done",
                 "cancelled", "started", "evicted")

    def __init__(self, fn, deadline, timeout, owner, seq, fut, loop, done=None):
        self.fn, self.deadline, self.timeout, self.owner, self.seq, self.fut, self.loop = (
            fn, deadline, timeout, owner, seq, fut, loop)
        self.done = done
        self.cancelled = False
        self.resume: threading.Event | None = None  # set while paused
        self.slice_start = 0.0
        self.started = 0.0  # when it got its thread
        self.evicted = False  # gave its thread up to another owner's first read (see ReadPool)

    def cancel(self) -> None:
        """Its answer is not wanted: a read not started yet never runs, a started one is
        abandoned at its next progress check (its slot taken until then) and `done` is not called."""
        self.cancelled = True

    def is_cancelled(self) -> bool:
        return self.cancelled or (self.fut is not None and self.fut.cancelled())


class ReadPool:
    """Reader threads shared fairly between owners (websocket connections), in time slices.

    At most `active` reads run at once (each holds a run slot). The next read to get a slot
    belongs to the owner with the fewest reads running, oldest first: an owner's second read
    waits behind every other owner's first. A read that has run `slice_seconds` while others wait
    pauses (SQLite's progress handler blocks its thread, its snapshot kept) and goes to the back of
    the queue, so an expensive query is paused, not allowed to block (strfry's query time slices).
    Among owners with as many running, the one served longest ago goes first (round robin). An
    owner never has more than `per_owner` reads started. A read's time budget counts from when
    it was submitted, waiting and pauses included. A read whose waiter was cancelled before it
    started never runs; one already started is abandoned at its next progress check (every
    PROGRESS_STEPS VM steps), so a CLOSE sent right after a REQ (a pipelining client's pattern)
    frees the thread and its owner's slot instead of building an answer nobody waits for.

    Threads: one per started read (running or paused), created as needed up to `max_threads`,
    each with its own connection; idle ones wait for the next read. When every thread holds a
    started read, an owner's first read takes the thread of a paused read (the one whose owner has
    the most started, then the one that has run longest), which is abandoned as too long
    (QueryTimeout): a handful of connections with heavy queries cannot pin every thread, and the
    paused reads keep resuming meanwhile (a read that cannot start never holds the others up).
    """

    def __init__(self, store: "SqliteStore", active: int, per_owner: int = DEFAULT_READS_PER_OWNER,
                 max_threads: int | None = None, slice_seconds: float = DEFAULT_READ_SLICE):
        self._store = store
        self._active_max = active
        self._per_owner = per_owner
        self._max_threads = max_threads or max(active, DEFAULT_MAX_READER_THREADS)
        self._slice = slice_seconds
        self._cv = threading.Condition(threading.Lock())
        self._queue: list[_Read] = []  # waiting to start or to resume
        self._active: dict[Any, int] = {}  # owner -> reads holding a run slot
        self._started: dict[Any, int] = {}  # owner -> reads started and not finished
        # owner -> when it last got a run slot, while it has reads started or waiting: among
        # owners with as few running, the one served longest ago goes first (round robin).
        self._last: dict[Any, int] = {}
        self._dispatches = itertools.count()
        self.active = 0
        self._idle: list["_ReaderThread"] = []
        self._threads: list["_ReaderThread"] = []
        self._seq = itertools.count()
        self._stopping = False
        self.pauses = 0
        self.evictions = 0
        self.inline_reads = 0  # run on the loop's thread (see INLINE_MAX_STEPS)
        self.inline_abandoned = 0  # started there, abandoned: handed to the reader threads
        self.inline_stalled = 0  # of those, stalled (preempted, busy), not too long: no cooldown
        # owner -> until when its reads skip the loop (one of them was too long for it)
        self._inline_until: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._evicting = 0  # evicted reads still unwinding (their threads about to be free)
        with self._cv:  # the run slots' threads now, so no read waits for a connection to open
            for n in range(active):
                thread = _ReaderThread(self, n)
                self._threads.append(thread)
                self._idle.append(thread)

    def submit(self, fn: Callable[[apsw.Connection], T], timeout: float | None, owner: Any,
               inline: bool = False) -> asyncio.Future:
        """`fn(conn)` on a reader thread; the future resolves with its result. With `inline`, a
        short read may run on the loop's thread instead (see INLINE_MAX_STEPS)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        read = _Read(fn, time.monotonic() + timeout if timeout else None, timeout,
                     owner if owner is not None else object(), next(self._seq), fut, loop)
        if not (inline and self._run_inline(read)):
            self._enter(read)
        return fut

    def submit_then(self, fn: Callable[[apsw.Connection], T], done: Callable[[Any, BaseException | None], None],
                    timeout: float | None, owner: Any, inline: bool = False) -> _Read:
        """Like `submit`, but `done(result, exc)` is called on the loop (always in a later
        callback, never from within this call); cancel with the returned read's `cancel()`."""
        read = _Read(fn, time.monotonic() + timeout if timeout else None, timeout,
                     owner if owner is not None else object(), next(self._seq), None,
                     asyncio.get_running_loop(), done)
        if not (inline and self._run_inline(read)):
            self._enter(read)
        return read

    def _run_inline(self, read: _Read) -> bool:
        """Run `read` on this, the loop's, thread if it may: nothing waits for a reader, its owner
        has no read started (an owner's reads never exceed `per_owner`, inline or not) and none of
        its reads was too long for the loop lately. True when it ran (the outcome is delivered as
        a reader thread delivers it); False when it is for the reader threads."""
        owner = read.owner
        # Unlocked peeks: reads are queued and started only from this thread, so a stale answer
        # here merely sends a read to the reader threads.
        if self._stopping or self._queue or owner in self._started:
            return False
        try:
            until = self._inline_until.get(owner)
        except TypeError:  # an anonymous owner (not weakly referenceable): the reader threads
            return False
        if until is not None:
            if time.monotonic() < until:
                return False
            del self._inline_until[owner]
        outcome = self._store._read_inline(read.fn, read.timeout)
        if outcome is INLINE_STALLED:  # the reader threads do it; the owner's next read may not
            self.inline_abandoned += 1
            self.inline_stalled += 1
            return False
        if outcome is None:  # too long for the loop: the reader threads do it, and its next reads
            self.inline_abandoned += 1
            self._inline_until[owner] = time.monotonic() + INLINE_COOLDOWN
            return False
        self.inline_reads += 1
        result, exc = outcome
        if read.fut is not None:
            _settle(read.fut, result, exc)
        else:
            read.loop.call_soon(_call_done, read, result, exc)
        return True

    def _enter(self, read: _Read) -> None:
        with self._cv:
            self._queue.append(read)
            self._dispatch()

    # -- scheduling (lock held) ----------------------------------------------------------------

    def _pickable(self, read: _Read) -> bool:
        return read.resume is not None or self._started.get(read.owner, 0) < self._per_owner

    def _pick(self, can_start: bool) -> tuple[_Read | None, _Read | None]:
        """(the most deserving read that can run now, the most deserving new read that could not
        start for want of a thread). Without a free thread only paused reads can run."""
        best = best_key = None
        blocked = blocked_key = None
        queue = self._queue
        i = 0
        while i < len(queue):
            read = queue[i]
            if read.resume is None and read.is_cancelled():
                queue.pop(i)  # its waiter is gone and it never started
                if read.owner not in self._started and not any(r.owner is read.owner for r in queue):
                    self._last.pop(read.owner, None)
                continue
            if self._pickable(read):
                key = (self._active.get(read.owner, 0), self._last.get(read.owner, -1), read.seq)
                if read.resume is None and not can_start:
                    if blocked_key is None or key < blocked_key:
                        blocked, blocked_key = read, key
                elif best_key is None or key < best_key:
                    best, best_key = read, key
            i += 1
        return best, blocked

    def _can_start(self) -> bool:
        return bool(self._idle) or len(self._threads) < self._max_threads

    def _dispatch(self) -> None:
        """Give free run slots to the most deserving waiting reads."""
        while self.active < self._active_max and not self._stopping:
            read, blocked = self._pick(self._can_start())
            if blocked is not None and not self._started.get(blocked.owner) and not self._evicting \
                    and self._evict_for(blocked):
                continue  # the queue changed: pick again
            if read is None:
                return
            if read.resume is None:  # a new read needs a thread of its own
                if self._idle:
                    thread = self._idle.pop()
                else:
                    thread = _ReaderThread(self, len(self._threads))
                    self._threads.append(thread)
                self._started[read.owner] = self._started.get(read.owner, 0) + 1
                read.started = time.monotonic()
                thread.give(read)
            self._queue.remove(read)
            self.active += 1
            self._active[read.owner] = self._active.get(read.owner, 0) + 1
            self._last[read.owner] = next(self._dispatches)
            read.slice_start = time.monotonic()
            if read.resume is not None:
                resume, read.resume = read.resume, None
                resume.set()

    def _evict_for(self, newcomer: _Read) -> bool:
        """Every thread holds a started read and `newcomer` is its owner's first: abandon a paused
        read (its owner's most, then the longest running) so its thread comes free. False when
        none is paused (the running ones pause or end within a slice)."""
        paused = [r for r in self._queue if r.resume is not None and r.owner is not newcomer.owner]
        if not paused:
            return False
        victim = max(paused, key=lambda r: (self._started.get(r.owner, 0), -r.started))
        self._queue.remove(victim)
        victim.evicted = True
        self._evicting += 1
        self.evictions += 1
        # It unwinds holding a run slot, given back when it finishes (see _finished).
        self.active += 1
        self._active[victim.owner] = self._active.get(victim.owner, 0) + 1
        resume, victim.resume = victim.resume, None
        resume.set()
        return True

    def _release_slot(self, read: _Read) -> None:
        self.active -= 1
        n = self._active[read.owner] - 1
        if n:
            self._active[read.owner] = n
        else:
            del self._active[read.owner]

    def _finished(self, read: _Read, thread: "_ReaderThread") -> None:
        with self._cv:
            if read.evicted:
                self._evicting -= 1
            self._release_slot(read)
            n = self._started[read.owner] - 1
            if n:
                self._started[read.owner] = n
            else:
                del self._started[read.owner]
                if not any(r.owner is read.owner for r in self._queue):
                    self._last.pop(read.owner, None)  # its next read is a first read again
            self._idle.append(thread)
            self._dispatch()

    # -- time slices (reader threads, from SQLite's progress handler) ----------------------------

    def maybe_pause(self, read: _Read) -> bool:
        """Called every PROGRESS_STEPS VM steps of `read`: past its slice, with a read waiting
        that could run, step aside until it is this read's turn again. True: abandon the read
        (its thread went to another owner's first read)."""
        if not self._queue or time.monotonic() - read.slice_start < self._slice:
            return False
        with self._cv:
            if not any(self._pickable(r) for r in self._queue if r is not read):
                read.slice_start = time.monotonic()
                return False
            resume = read.resume = threading.Event()
            read.seq = next(self._seq)  # to the back of the queue
            self._queue.append(read)
            self._release_slot(read)
            self.pauses += 1
            self._dispatch()
        timeout = None if read.deadline is None else max(0.0, read.deadline - time.monotonic())
        if not resume.wait(timeout):
            with self._cv:
                if read.resume is resume:  # still waiting: leave the queue, take a slot back
                    read.resume = None
                    self._queue.remove(read)
                    self.active += 1
                    self._active[read.owner] = self._active.get(read.owner, 0) + 1
                    return False  # the caller's deadline check abandons the read
            resume.wait()  # dispatched (or evicted) meanwhile: the slot is ours already
        return read.evicted

    def _retire(self, thread: "_ReaderThread") -> bool:
        """An extra thread idle for READER_IDLE_SECONDS leaves (True), unless a read was just
        given to it."""
        with self._cv:
            if thread._ready.is_set() or thread not in self._idle:
                return False
            self._idle.remove(thread)
            self._threads.remove(thread)
            return True

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            for thread in self._threads:
                thread.give(None)
        for thread in self._threads:
            thread.join()


class _ReaderThread(threading.Thread):
    """One reader connection and the thread that runs reads on it."""

    def __init__(self, pool: ReadPool, n: int):
        super().__init__(name=f"appliance-reader-{n}", daemon=True)
        self.pool = pool
        self.n = n
        self._next: list = []
        self._ready = threading.Event()
        self.start()

    def give(self, read: _Read | None) -> None:
        self._next.append(read)
        self._ready.set()

    def run(self) -> None:
        pool = self.pool
        store = pool._store
        conn = store._reader()
        try:
            while True:
                if not self._ready.wait(None if self.n < pool._active_max else READER_IDLE_SECONDS):
                    if pool._retire(self):
                        trim_heap()
                        return
                    continue
                self._ready.clear()
                read = self._next.pop()
                if read is None:
                    return
                try:
                    if read.deadline is not None and time.monotonic() >= read.deadline:
                        raise QueryTimeout(f"query took longer than {read.timeout:g} s (waiting for a reader)")
                    result, exc = store._read_on(conn, read.fn, read.deadline, read.timeout,
                                                 lambda read=read: read.is_cancelled() or pool.maybe_pause(read)), None
                except BaseException as e:  # noqa: BLE001 - handed to the waiter
                    result, exc = None, e
                pool._finished(read, self)
                try:
                    if read.fut is not None:
                        read.loop.call_soon_threadsafe(_settle, read.fut, result, exc)
                    elif not read.cancelled:
                        read.loop.call_soon_threadsafe(_call_done, read, result, exc)
                except RuntimeError:  # the loop is closed (shutdown)
                    pass
        finally:
            store._forget_reader(conn)


# Linux counts block reads per thread; elsewhere the process's count (more reads count as the disk's).
_RUSAGE_WHO = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def _blocks_read() -> int:
    """Blocks this thread has read from the disk (not from the OS page cache) so far."""
    return resource.getrusage(_RUSAGE_WHO).ru_inblock


def trim_heap() -> None:
    """Hand freed heap memory back to the OS (glibc keeps it otherwise); a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _call_done(read: _Read, result: Any, exc: BaseException | None) -> None:
    if not read.cancelled:  # cancelled while the result was on its way
        read.done(result, exc)


def _settle(fut: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if fut.cancelled():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


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


class SqliteStore(WriterFront):
    """The appliance's storage: run writes through the single writer, reads on reader threads."""

    backend = "sqlite"  # PostgresStore's is "postgresql"

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
        self._writer = Writer(self._write_conn, self.write_batch)
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
