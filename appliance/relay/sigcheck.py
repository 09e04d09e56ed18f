"""BIP-340 signature checks in a worker process, a batch per turn of the event loop.

On the loop's thread an EVENT's signature check (libsecp256k1, which lets the GIL go) was half of
the loop's work per ingested event, plus a wait for the GIL after each one: the loop was the
relay's bound (docs/performance.md#signatures-checked-in-a-worker-process). Here the loop checks
the id itself (a hash) and sends the signature checks of one turn to a worker process in one write
(an event's id, author and signature: 128 bytes each), and gets one byte back per check; no thread
of this process takes part (an executor's own thread would contend for the GIL), and no future or
task is made per check.

Answers come in the order the checks were begun, and none is given before one begun earlier, so
the relay's writes keep the order its clients sent the events in. The worker starts with the
first check begun; until it is ready, and when it has failed or stopped answering (then what it
held is checked here, in order), checks run on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import struct
import time
from collections import deque
from typing import Callable

from appliance.children import watch_parent
from appliance.nostr.event import Event, verify_event, verify_id

log = logging.getLogger("appliance.relay")

# A check as sent: the event's id, author and signature, raw.
RECORD = 128
_HEADER = struct.Struct("!I")  # the byte length of what follows
# Checks sent in one message at most.
MAX_BATCH = 1024
# After the worker failed, checks run on the loop this long before another is started.
RESTART_AFTER = 5.0
# Seconds without an answer while checks wait before the worker counts as failed (stopped, or not
# scheduled): a working worker answers a batch in milliseconds; this is well inside SIGTERM's grace.
STALL_AFTER = 3.0


class PendingCheck:
    """A check whose answer comes later, on the loop: `then(fn)` has fn(valid) called then (at
    once if it is known). Awaitable too."""

    __slots__ = ("ev", "valid", "_then")

    def __init__(self, ev: Event):
        self.ev = ev
        self.valid: bool | None = None
        self._then: Callable[[bool], None] | None = None

    def then(self, fn: Callable[[bool], None]) -> None:
        if self.valid is not None:
            fn(self.valid)
        else:
            self._then = fn

    def settle(self, valid: bool) -> None:
        self.valid = valid
        fn, self._then = self._then, None
        if fn is not None:
            try:
                fn(valid)
            except Exception:  # the checks answered after it are answered all the same
                log.exception("a signature check's continuation failed (event %s)", self.ev.id)

    def __await__(self):
        fut = asyncio.get_running_loop().create_future()
        self.then(lambda valid: fut.done() or fut.set_result(valid))
        return (yield from fut.__await__())


def _record(ev: Event) -> bytes | None:
    """The check as sent; None when a field is not hex of its size (such an event is refused)."""
    try:
        data = bytes.fromhex(ev.id + ev.pubkey + ev.sig)
    except (ValueError, TypeError):
        return None
    return data if len(data) == RECORD else None


class SignatureWorker:
    """The loop's side. `begin(ev)` answers True/False when the answer is known at once (a wrong
    id, or no worker ready), else a `PendingCheck` settled once the worker has checked it."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proc = None
        self._transport: asyncio.Transport | None = None
        self.ready = False
        self._starting = False
        self._closed = False
        self._wanted = False  # `start` was called: a failed worker is replaced
        self._restart_at = 0.0
        self._unsent: list[bytes] = []
        # Checks begun and not answered, in order. Never any while not `ready` (`_failed`
        # answers them), so a check run on the loop never overtakes one begun before it.
        self._waiting: deque[PendingCheck] = deque()
        self._flush_scheduled = False
        self._buffer = bytearray()
        self._protocol: _Answers | None = None
        # The loop's time of the last answer, or of the first check sent since all were answered:
        # what the stall watch measures from.
        self._progress_at = 0.0
        self._watch: asyncio.TimerHandle | None = None
        self.failures = 0

    def start(self) -> None:
        """Have a worker from the first check begun on (a relay given no EVENT spawns none); until
        it is ready, checks run on the loop. A machine with one CPU gets none: the worker would
        only take turns with the loop."""
        if _cpus() < 2:
            return
        self._wanted = True

    def begin(self, ev: Event) -> "bool | PendingCheck":
        if not self.ready:
            if self._wanted:
                self._maybe_start()
            return verify_event(ev)
        if not verify_id(ev):
            return False
        record = _record(ev)
        if record is None:
            return False
        pending = PendingCheck(ev)
        self._waiting.append(pending)
        self._unsent.append(record)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return pending

    def close(self) -> None:
        """Stop the worker (on the loop, as the server stops); what it held is checked here."""
        self._closed = True
        self.ready = False
        self._detach()
        self._stop_process()
        self._unsent.clear()
        self._check_waiting_here()

    # -- the loop's side of the socket ------------------------------------------------------------

    def _flush(self) -> None:
        """The checks begun in this turn of the loop go to the worker, in one write."""
        self._flush_scheduled = False
        unsent, self._unsent = self._unsent, []
        if not self.ready or not unsent:
            return
        if len(self._waiting) == len(unsent):  # none sent before is unanswered: the wait starts now
            self._progress_at = self._loop.time()
        if self._watch is None:
            self._watch = self._loop.call_later(STALL_AFTER, self._check_stall)
        parts = []
        for start in range(0, len(unsent), MAX_BATCH):
            payload = b"".join(unsent[start:start + MAX_BATCH])
            parts.append(_HEADER.pack(len(payload)))
            parts.append(payload)
        self._transport.write(b"".join(parts))

    def _answers(self, data: bytes) -> None:
        """One byte per check (1: valid), in the order they were sent."""
        buf = self._buffer
        buf += data
        while len(buf) >= 4:
            (n,) = _HEADER.unpack_from(buf)
            if len(buf) < 4 + n:
                break
            answers = bytes(buf[4:4 + n])
            del buf[:4 + n]
            waiting = self._waiting
            for valid in answers:
                waiting.popleft().settle(valid == 1)
            self._progress_at = self._loop.time()

    def _check_stall(self) -> None:
        """While checks wait, the worker must answer within STALL_AFTER of its last answer (or of
        the first of them sent): else it counts as failed (killed, what it held checked here)."""
        self._watch = None
        if not self.ready or not self._waiting:
            return
        waited = self._loop.time() - self._progress_at
        if waited >= STALL_AFTER:
            self._failed(TimeoutError(f"no answer in {waited:.1f} s"))
        else:
            self._watch = self._loop.call_later(STALL_AFTER - waited, self._check_stall)

    def _failed(self, exc: BaseException | None) -> None:
        """The worker is gone: what it held is checked here, in order; another starts later."""
        if self._closed or not (self.ready or self._starting):
            return
        self.failures += 1
        log.warning("the signature worker stopped (%s); %d checks done on the loop instead",
                    exc or "its connection closed", len(self._waiting))
        self.ready = False
        self._detach()
        self._unsent.clear()
        self._buffer.clear()
        self._restart_at = time.monotonic() + RESTART_AFTER
        self._stop_process()
        self._check_waiting_here()

    def _detach(self) -> None:
        """The socket to the worker closed, its protocol no longer ours (a late call of it is
        ignored), the stall watch stopped."""
        self._protocol = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        transport, self._transport = self._transport, None
        if transport is not None:
            try:
                transport.close()
            except RuntimeError:  # the loop is closed already
                pass

    def _check_waiting_here(self) -> None:
        waiting = self._waiting
        while waiting:
            pending = waiting.popleft()
            pending.settle(verify_event(pending.ev))

    # -- the worker process's lifecycle ------------------------------------------------------------

    def _maybe_start(self) -> None:
        if self._starting or self._closed or time.monotonic() < self._restart_at:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._starting = True
        self._loop.create_task(self._start())

    async def _start(self) -> None:
        ours = None
        try:
            ours, theirs = socket.socketpair()
            try:
                # spawn: this process has threads (writer, readers), which fork would copy mid-state.
                proc = multiprocessing.get_context("spawn").Process(
                    target=serve, args=(theirs, os.getpid()), name="appliance-sigcheck", daemon=True)
                proc.start()
            finally:
                theirs.close()
            self._proc = proc
            ours.setblocking(False)
            protocol = self._protocol = _Answers(self)
            transport, _ = await self._loop.connect_accepted_socket(lambda: protocol, ours)
            if self._protocol is not protocol:  # closed meanwhile
                transport.close()
                return
            self._transport = transport
            # (ready once the worker says so: its imports done)
        except Exception:
            log.exception("could not start the signature worker; checking signatures on the loop")
            if ours is not None and self._transport is None:  # (a transport closes its own)
                ours.close()
            self._restart_at = time.monotonic() + RESTART_AFTER
            self._starting = False
            self._stop_process()

    def _hello(self) -> None:
        self._starting = False
        if not self._closed:
            self.ready = True

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        self._starting = False
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(1)


class _Answers(asyncio.Protocol):
    """The socket to the worker: its greeting, then its answers."""

    def __init__(self, owner: SignatureWorker):
        self.owner = owner
        self.greeted = False

    def data_received(self, data: bytes) -> None:
        if self.owner._protocol is not self:  # a worker given up on (its socket closing)
            return
        if not self.greeted:
            self.greeted = True
            self.owner._hello()
            data = data[1:]
            if not data:
                return
        self.owner._answers(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.owner._protocol is self:
            self.owner._failed(exc)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# -- the worker process ---------------------------------------------------------------------------


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def serve(sock: socket.socket, parent_pid: int) -> None:
    """The worker: a greeting byte, then for each message of checks one byte per check (1: the
    signature is valid), in order, until the socket closes."""
    from appliance.nostr.keys import xonly_key

    # Ctrl+C in a terminal signals the whole process group: the appliance stops in its own way (its
    # drain needs no worker) and ends this one; a KeyboardInterrupt here would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent_pid)
    sock.sendall(b"\x01")
    header = _HEADER
    while True:
        head = _read_exactly(sock, header.size)
        if head is None:
            return
        (n,) = header.unpack(head)
        payload = _read_exactly(sock, n)
        if payload is None:
            return
        answers = bytearray(n // RECORD)
        for i in range(0, n - RECORD + 1, RECORD):
            try:
                valid = xonly_key(payload[i + 32:i + 64].hex()).verify(payload[i + 64:i + 128], payload[i:i + 32])
            except (ValueError, TypeError):  # not a key: refused, as on the loop
                valid = False
            answers[i // RECORD] = valid
        sock.sendall(header.pack(len(answers)) + answers)
