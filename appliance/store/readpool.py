"""The reader threads both backends share: reads spread fairly over owners (websocket
connections), in time slices where the backend can pause a read (SQLite's progress handler).

A store gives the pool four hooks: `_reader()` (this thread's connection, or None),
`_read_on(conn, fn, deadline, timeout, every)`, `_forget_reader(conn)` and
`_read_inline(fn, timeout)` (None, or INLINE_STALLED, when a read is not for the loop's thread).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, TypeVar

from appliance.store.interface import Connection, QueryTimeout

T = TypeVar("T")

# Reads one owner (a connection) may have started at once; its others wait behind every other
# owner's first read (see ReadPool).
DEFAULT_READS_PER_OWNER = 2
# Uninterrupted work a read may do while others wait before it pauses for them (strfry's
# queryTimesliceBudgetMicroseconds is 10 ms too).
DEFAULT_READ_SLICE = 0.010
# Reader threads (and connections) at most: one per started read, running or paused.
DEFAULT_MAX_READER_THREADS = 24
# Reader threads beyond `reader_threads` (started for paused reads) end after this long idle, and
# their connections' memory goes back.
READER_IDLE_SECONDS = 5.0
# Seconds a read too long for the loop sends its owner's next reads to the threads:
# docs/performance.md#inline_max_steps
INLINE_COOLDOWN = 10.0
# What a store's `_read_inline` returns for a read abandoned without its owner's next reads
# leaving the loop (the thread was preempted, not the read too long); None is a read too long.
INLINE_STALLED = "stalled"


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
    progress check), so a CLOSE sent right after a REQ (a pipelining client's pattern)
    frees the thread and its owner's slot instead of building an answer nobody waits for.

    Threads: one per started read (running or paused), created as needed up to `max_threads`,
    each with its own connection; idle ones wait for the next read. When every thread holds a
    started read, an owner's first read takes the thread of a paused read (the one whose owner has
    the most started, then the one that has run longest), which is abandoned as too long
    (QueryTimeout): a handful of connections with heavy queries cannot pin every thread, and the
    paused reads keep resuming meanwhile (a read that cannot start never holds the others up).
    """

    def __init__(self, store: Any, active: int, per_owner: int = DEFAULT_READS_PER_OWNER,
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
        self._waiting: dict[Any, int] = {}  # owner -> reads waiting to start (never started yet)
        self._queued_new: dict[Any, int] = {}  # owner -> of those, in `_queue`
        # owner -> its other new reads, in order: those it could not start before one of its
        # started or queued reads is done stay out of the queue that every dispatch scans.
        self._later: dict[Any, deque[_Read]] = {}
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

    def submit(self, fn: Callable[[Connection], T], timeout: float | None, owner: Any,
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

    def submit_then(self, fn: Callable[[Connection], T], done: Callable[[Any, BaseException | None], None],
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
        """Run `read` on this, the loop's, thread if it may: its owner has no read started or
        waiting (an owner's reads never exceed `per_owner`, inline or not, nor overtake each
        other) and none of its reads was too long for the loop lately. Other owners' reads waiting
        for a reader do not keep it off the loop: it is bounded there, and behind them a short read
        would wait for the longest reads to pause or end. True when it ran (the outcome is
        delivered as a reader thread delivers it); False when it is for the reader threads."""
        owner = read.owner
        # Unlocked peeks, waiting first: a read is counted started before it stops waiting (both
        # under the lock, on whichever thread dispatches it), so no read of the owner slips past.
        if self._stopping or owner in self._waiting or owner in self._started:
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
            owner = read.owner
            self._waiting[owner] = self._waiting.get(owner, 0) + 1
            if self._started.get(owner, 0) + self._queued_new.get(owner, 0) >= self._per_owner:
                later = self._later.get(owner)
                if later is None:
                    later = self._later[owner] = deque()
                later.append(read)
                return  # (it could not start now anyway)
            self._queue_new(read)
            self._dispatch()

    def _queue_new(self, read: _Read) -> None:
        self._queue.append(read)
        self._queued_new[read.owner] = self._queued_new.get(read.owner, 0) + 1

    def _dequeue_new(self, read: _Read) -> None:
        """A new read left the queue: it starts now, or was cancelled."""
        _count_down(self._queued_new, read.owner)
        self._unwait(read)

    def _promote(self, owner: Any) -> None:
        """Queue `owner`'s later reads while it could start them (cancelled ones go)."""
        later = self._later.get(owner)
        while later and self._started.get(owner, 0) + self._queued_new.get(owner, 0) < self._per_owner:
            read = later.popleft()
            if read.is_cancelled():
                self._unwait(read)
            else:
                self._queue_new(read)
        if later is not None and not later:
            del self._later[owner]

    def _unwait(self, read: _Read) -> None:
        """A read that never started leaves the queue (it starts now, or was cancelled)."""
        _count_down(self._waiting, read.owner)

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
                self._dequeue_new(read)
                self._promote(read.owner)  # (appended: this scan still sees them)
                if read.owner not in self._started and read.owner not in self._waiting:
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
                self._dequeue_new(read)
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
        _count_down(self._active, read.owner)

    def _finished(self, read: _Read, thread: "_ReaderThread") -> None:
        with self._cv:
            if read.evicted:
                self._evicting -= 1
            self._release_slot(read)
            n = _count_down(self._started, read.owner)
            self._promote(read.owner)
            if not n and read.owner not in self._waiting:
                self._last.pop(read.owner, None)  # its next read is a first read again
            self._idle.append(thread)
            self._dispatch()

    # -- time slices (reader threads, from SQLite's progress handler) ----------------------------

    def maybe_pause(self, read: _Read) -> bool:
        """Called at each progress check of `read`: past its slice, with a read waiting
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
                # An answer not wanted any more goes now, not when this thread's next read comes.
                result = exc = read = None
        finally:
            store._forget_reader(conn)


def _count_down(counts: dict[Any, int], owner: Any) -> int:
    """One fewer for `owner` in `counts`, which keeps no zeros; what is left."""
    n = counts[owner] - 1
    if n:
        counts[owner] = n
    else:
        del counts[owner]
    return n


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

