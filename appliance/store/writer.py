"""The one writer thread: it owns the only write connection and groups many writes per commit."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any, Callable, TypeVar

from appliance.errors import StorageFull
from appliance.store.faultlog import FaultLog
from appliance.store.interface import Connection
from appliance.store.meta import LockOrder
from appliance.store.statement import SQL

log = logging.getLogger("appliance.store")

T = TypeVar("T")
WriteOp = Callable[[Connection], Any]

_STOP = object()

# Group commit under load: with at least LINGER_FROM writes waiting, the writer waits LINGER_STEP
# at a time for more, up to LINGER_SECONDS, and commits them together (larger batches cost less
# CPU per event; an OK still follows its commit): docs/performance.md#linger_from
LINGER_FROM = 16
LINGER_STEP = 0.001
LINGER_SECONDS = 0.01

# Transaction control: the same text on both backends (BEGIN is each backend's, see Writer.BEGIN).
SQL_COMMIT = SQL("COMMIT", "COMMIT")
SQL_ROLLBACK = SQL("ROLLBACK", "ROLLBACK")
# An operation's own savepoint, and that of a run handed to its `run_batch` together.
SQL_SAVEPOINT_OP = SQL("SAVEPOINT op", "SAVEPOINT op")
SQL_RELEASE_OP = SQL("RELEASE op", "RELEASE op")
SQL_UNDO_OP = SQL("ROLLBACK TO op", "ROLLBACK TO op")
SQL_SAVEPOINT_TOGETHER = SQL("SAVEPOINT together", "SAVEPOINT together")
SQL_RELEASE_TOGETHER = SQL("RELEASE together", "RELEASE together")
SQL_UNDO_TOGETHER = SQL("ROLLBACK TO together", "ROLLBACK TO together")


class Writer:
    """Infinite looping thread that protects the single write connection.

    Each submitted operation runs inside its own SAVEPOINT of a shared transaction, so a failing
    operation rolls back alone while its neighbours in the batch still commit. Consecutive
    operations that carry the same `run_batch` function are handed to it together (see
    `_run_together`): that is how plain events are written a batch at a time. Futures resolve only
    after COMMIT returned: an `OK true` sent on that signal is durable.

    A backend subclasses it to name its own BEGIN and its driver's error classes (class
    attributes below: sqlite.SqliteWriter, postgres.PgWriter).

    Node locks (PostgreSQL, several nodes: meta.node_lock) are taken in one global order. An
    operation that asks for a key below one its transaction holds raises `LockOrder`: its own
    savepoint is rolled back, what the batch did before it is committed and answered, and it runs
    again in a new transaction that takes every key it needs first, in order (again, with more
    keys, if it then asks for one more below). It runs whole each time, from a clean start: an
    operation's side effects wait for the commit (contexts, `after_commit`), NOTIFY of a
    rolled-back savepoint is never delivered, and its future is resolved once.
    """

    BEGIN = SQL("BEGIN", "BEGIN")
    ERRORS: tuple[type[BaseException], ...] = ()  # the driver's errors
    FULL_ERRORS: tuple[type[BaseException], ...] = ()  # of those, a full disk

    def __init__(self, conn: Connection, batch_max: int = 500):
        self._conn = conn
        self._batch_max = batch_max
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="appliance-writer", daemon=True)
        self.commits = 0
        self.writes = 0
        self.reorders = 0  # operations run again to take their node locks in order (PostgreSQL)
        # When a write last failed for lack of disk space (time.time()), until a later ordinary
        # write commits: the health check's own one-row probe often still fits, so it cannot tell.
        self.full_since: float | None = None
        # A commit that keeps failing (a full disk: each one, for as long as it lasts) is logged
        # once, then once a minute, and once when a commit succeeds again.
        self.faults = FaultLog(log, "writing to the database")
        # Run on the writer thread after each batch is committed and answered (WAL upkeep).
        self.after_commit: Callable[[], None] | None = None

    def start(self) -> None:
        self._thread.start()

    def submit(self, op: WriteOp) -> asyncio.Future:
        """Queue `op(conn)`; the returned future resolves with its result once committed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put((op, fut, loop))
        return fut

    def submit_then(self, op: WriteOp, done: Callable[[Any, BaseException | None], None]) -> None:
        """Queue `op(conn)` with no future: `done(result, exc)` runs on the caller's event loop once
        the batch holding it committed (or failed), as a future's waiter would be woken."""
        self._queue.put((op, _Then(done), asyncio.get_running_loop()))

    def run_sync(self, op: WriteOp) -> Any:
        """Run `op` through the writer from a non-async thread and wait for the commit."""
        done = threading.Event()
        box: list = []

        def setter(result, exc):
            box.append((result, exc))
            done.set()

        self._queue.put((op, setter, None))
        done.wait()
        result, exc = box[0]
        if exc is not None:
            raise exc
        return result

    def stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is _STOP:
                return
            batch = [item]
            stopping = self._take_queued(batch)
            if not stopping and LINGER_FROM <= len(batch) < self._batch_max:
                stopping = self._linger(batch)
            try:
                self._commit_batch(batch)
            except BaseException as exc:  # noqa: BLE001 - the thread must outlive any one batch
                self._abandon(batch, exc)
            if stopping:
                return

    def _take_queued(self, batch: list) -> bool:
        """Add what is queued to `batch`, up to the batch size; True when told to stop."""
        q = self._queue
        while len(batch) < self._batch_max:
            try:
                nxt = q.get_nowait()
            except queue.Empty:
                return False
            if nxt is _STOP:
                return True
            batch.append(nxt)
        return False

    def _linger(self, batch: list) -> bool:
        """Writes are arriving faster than they commit (so many were waiting): wait for more while
        they keep coming, up to LINGER_SECONDS, so one commit carries them (see LINGER_FROM).
        True when told to stop."""
        deadline = time.monotonic() + LINGER_SECONDS
        while len(batch) < self._batch_max and time.monotonic() < deadline:
            before = len(batch)
            time.sleep(LINGER_STEP)
            if self._take_queued(batch):
                return True
            if len(batch) == before:  # none came meanwhile: commit what there is
                break
        return False

    def _abandon(self, batch: list, exc: BaseException) -> None:
        """Nothing of `batch` was written: roll back and tell every waiter why. TransactionLost
        means SQLite itself rolled the transaction back (disk full, I/O error); the waiters get the
        error that did it. Anything else is a bug, logged in full."""
        if isinstance(exc, TransactionLost):
            self.faults.failed(exc.cause, note=f"SQLite rolled the transaction back, {len(batch)} writes lost")
            exc = exc.cause
        else:
            log.error("write batch failed, %d writes rolled back", len(batch), exc_info=exc)
        if self._conn.in_transaction:
            try:
                self._conn.execute(SQL_ROLLBACK)
            except self.ERRORS:
                pass
        self._deliver([(fut, loop, None, exc) for _op, fut, loop in batch])

    def _commit_batch(self, batch: list) -> None:
        conn = self._conn
        outcomes: list[tuple[Any, Any, Any, Any, BaseException | None]] = []  # (op, fut, loop, result, exc)
        try:
            self.before_batch()
            conn = self._conn
            conn.execute(self.BEGIN)
        except self.ERRORS as exc:  # the database is unusable: fail every waiter loudly
            self.faults.failed(exc, note="could not begin a transaction")
            self._deliver([(fut, loop, None, exc) for _op, fut, loop in batch])
            return
        i = 0
        while i < len(batch):
            run_fn = getattr(batch[i][0], "run_batch", None)
            j = i + 1
            if run_fn is not None:
                while j < len(batch) and getattr(batch[j][0], "run_batch", None) is run_fn:
                    j += 1
            if j - i > 1 and self._run_together(conn, run_fn, batch[i:j], outcomes):
                i = j
                continue
            for op, fut, loop in batch[i:j]:
                self._run_one(conn, op, fut, loop, outcomes)
            i = j
        self._commit(conn, outcomes)
        if self.after_commit is not None:
            try:
                self.after_commit()
            except Exception:  # housekeeping must never stop the writer
                log.exception("after-commit housekeeping failed")

    def _commit(self, conn, outcomes: list) -> None:
        """COMMIT the transaction, then answer its operations (all failed if the commit did)."""
        try:
            conn.execute(SQL_COMMIT)
        except self.ERRORS as exc:
            self.faults.failed(exc, note=f"commit, {len(outcomes)} writes rolled back")
            if conn.in_transaction:  # SQLite may have rolled it back already (disk full)
                try:
                    conn.execute(SQL_ROLLBACK)
                except self.ERRORS:
                    pass
            self._deliver([(fut, loop, None, exc) for _op, fut, loop, _r, _e in outcomes])
            return
        self.commits += 1
        self.writes += len(outcomes)
        self.faults.recovered()
        if self.full_since is not None and any(
                exc is None and not getattr(op, "probe", False) for op, _f, _l, _r, exc in outcomes):
            self.full_since = None  # an ordinary write fitted again
        self._deliver([(fut, loop, result, exc) for _op, fut, loop, result, exc in outcomes])

    def before_batch(self) -> None:
        """Writer thread, before each transaction: a backend may reconnect here."""

    def _run_one(self, conn: Connection, op: WriteOp, fut, loop, outcomes: list) -> None:
        try:
            self._one(conn, op, fut, loop, outcomes)
        except LockOrder as order:
            self._run_in_order(conn, order, outcomes, lambda: self._one(conn, op, fut, loop, outcomes))

    def _one(self, conn: Connection, op: WriteOp, fut, loop, outcomes: list) -> None:
        """Run `op` in its own savepoint; LockOrder leaves nothing of it and goes to the caller."""
        conn.execute(SQL_SAVEPOINT_OP)
        try:
            result = op(conn)
        except LockOrder as order:
            _undo(conn, SQL_UNDO_OP, SQL_RELEASE_OP, order, self.ERRORS)
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, not swallowed
            _undo(conn, SQL_UNDO_OP, SQL_RELEASE_OP, exc, self.ERRORS)
            outcomes.append((op, fut, loop, None, exc))
        else:
            conn.execute(SQL_RELEASE_OP)
            outcomes.append((op, fut, loop, result, None))

    def _run_in_order(self, conn, order: LockOrder, outcomes: list, again: Callable[[], T]) -> T:
        """An operation (rolled back to its savepoint) asked for node locks out of order: commit
        and answer what came before it, then run it again (`again`) in a new transaction that takes
        the keys it needs first, in order; until it asks for none below those it holds."""
        keys = set(order.keys) - conn.locks.keys  # its own: those of the ops before are released
        while True:
            self.reorders += 1
            if outcomes:
                self._commit(conn, outcomes)
                outcomes.clear()
            else:
                conn.execute(SQL_ROLLBACK)
            conn.execute(self.BEGIN)
            conn.locks.take(conn, sorted(keys))
            try:
                return again()
            except LockOrder as more:  # it asked for yet another key below: the whole set, again
                keys |= more.keys

    def _run_together(self, conn: Connection, run_fn, run: list, outcomes: list) -> bool:
        """Run consecutive ops sharing a `run_batch` function in one go.

        `run_batch(conn, ops)` returns one result or exception per op and must leave the database
        as running the ops one by one would (refusals it returns write nothing). If it raises,
        its writes are rolled back and the caller runs the ops one by one instead.
        """
        try:
            return self._together(conn, run_fn, run, outcomes)
        except LockOrder as order:
            return self._run_in_order(conn, order, outcomes, lambda: self._together(conn, run_fn, run, outcomes))

    def _together(self, conn: Connection, run_fn, run: list, outcomes: list) -> bool:
        conn.execute(SQL_SAVEPOINT_TOGETHER)
        try:
            results = run_fn(conn, [op for op, _f, _l in run])
        except LockOrder as order:
            _undo(conn, SQL_UNDO_TOGETHER, SQL_RELEASE_TOGETHER, order, self.ERRORS)
            raise
        except Exception as exc:
            _undo(conn, SQL_UNDO_TOGETHER, SQL_RELEASE_TOGETHER, exc, self.ERRORS)
            return False
        conn.execute(SQL_RELEASE_TOGETHER)
        for (op, fut, loop), result in zip(run, results):
            if isinstance(result, BaseException):
                outcomes.append((op, fut, loop, None, result))
            else:
                outcomes.append((op, fut, loop, result, None))
        return True

    def _deliver(self, outcomes: list) -> None:
        by_loop: dict[Any, list] = {}
        for fut, loop, result, exc in outcomes:
            if isinstance(exc, self.FULL_ERRORS):  # one error the callers can name to their clients
                self.full_since = self.full_since or time.time()
                full = StorageFull(exc)
                full.__cause__ = exc
                exc = full
            if loop is None:  # run_sync waiter
                fut(result, exc)
            else:
                by_loop.setdefault(loop, []).append((fut, result, exc))
        for loop, items in by_loop.items():
            # One wake-up of the event loop per batch, not per write.
            try:
                loop.call_soon_threadsafe(_resolve_all, items)
            except RuntimeError:  # loop closed during shutdown
                pass


class _Then:
    """A write's answer given to a callback (`Writer.submit_then`) instead of a future: the same
    surface `_resolve_all` uses, and answered once, like a future."""

    __slots__ = ("fn", "answered")

    def __init__(self, fn: Callable[[Any, BaseException | None], None]):
        self.fn = fn
        self.answered = False

    def done(self) -> bool:
        return self.answered

    def set_result(self, result: Any) -> None:
        self._call(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._call(None, exc)

    def _call(self, result: Any, exc: BaseException | None) -> None:
        self.answered = True
        try:
            self.fn(result, exc)
        except Exception:  # the other writes of the batch are still answered
            log.exception("write callback failed")


def _resolve_all(items: list) -> None:
    for fut, result, exc in items:
        if fut.done():  # cancelled, or answered already (a batch that failed after a commit)
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)


class TransactionLost(Exception):
    """The savepoint to undo one op is gone: SQLite already rolled the transaction back."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _undo(conn: Connection, rollback_to: SQL, release: SQL, cause: BaseException,
          errors: tuple[type[BaseException], ...]) -> None:
    """Roll back to a savepoint and release it; TransactionLost if SQLite dropped the transaction."""
    try:
        conn.execute(rollback_to)
        conn.execute(release)
    except errors:
        raise TransactionLost(cause) from cause


class WriterFront:
    """What a store offers writers, the same over any backend: it holds its `Writer` as `_writer`
    (None while closed) and opens in `open()`, closes in `close()`."""

    _writer: Writer | None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, op: WriteOp) -> asyncio.Future:
        """Run `op(conn)` in the shared write transaction; awaitable, resolves after COMMIT."""
        assert self._writer is not None, "store is not open"
        return self._writer.submit(op)

    def write_then(self, op: WriteOp, done: Callable[[Any, BaseException | None], None]) -> None:
        """Run `op(conn)` in the shared write transaction, with no future or task: `done(result,
        exc)` runs on this event loop after COMMIT (see `Writer.submit_then`)."""
        assert self._writer is not None, "store is not open"
        self._writer.submit_then(op, done)

    def write_sync(self, op: WriteOp) -> Any:
        """Blocking variant of `write` for threads without an event loop (CLI, tests)."""
        assert self._writer is not None, "store is not open"
        return self._writer.run_sync(op)

    @property
    def full_since(self) -> float | None:
        """When a write last failed for lack of disk space, if none has fitted since."""
        return self._writer.full_since if self._writer else None

    @property
    def writer_stats(self) -> tuple[int, int]:
        w = self._writer
        return (w.commits, w.writes) if w else (0, 0)

    @property
    def lock_reorders(self) -> int:
        """Operations run again in a new transaction to take their node locks in order."""
        return self._writer.reorders if self._writer else 0

    @property
    def writes_queued(self) -> int:
        """Writes waiting for the writer thread (not the batch it is writing)."""
        w = self._writer
        return w._queue.qsize() if w else 0

