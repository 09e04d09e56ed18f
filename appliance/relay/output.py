"""One connection's output: messages queued, written a piece at a time, drained as the peer takes them.

Messages wait in `pending` until a callback scheduled on the loop writes them (no task wakes for
it): everything queued in one turn of the loop (a REQ's answer, a burst of OKs) goes out together,
in pieces of at most DEFAULT_WRITE_PIECE bytes while the transport takes them. Only when the peer
is behind does a task (`_drain`) write them as the peer takes them. What the peer has not taken
stays here, counted (`queued_bytes`, and the relay's sum of them): the transport holds a piece at
most, so the counts are the memory that slow readers cost. Once output ends, what is pending is
written, then the close frame (if the relay is closing), and `done` is set.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Callable

from appliance.front.frames import Frames

log = logging.getLogger("appliance.relay")

# Bytes handed to the transport at once. A REQ's answer (up to max_query_bytes) is written in
# pieces at frame boundaries: a peer that does not read holds one piece in the transport's buffer,
# not the answer, and the rest stays counted here.
DEFAULT_WRITE_PIECE = 256 * 1024


class Output:
    """The queue of one connection's unsent messages and what writes them."""

    def __init__(self, relay, writer, lost: Callable[[], None], *, high_water: int = 0,
                 drained: Callable[[], None] | None = None, shed: Callable[[], None] | None = None):
        self.relay = relay  # its `queued_bytes` counts the unsent output of every connection
        # The connection (appliance.front.websocket.WebSocketConnection): `ready()`, `write_now`,
        # `send_all`, `close(code, reason)`, `abort()`.
        self.writer = writer
        self._lost = lost  # called when a write fails: the connection is over
        # Past `high_water` unsent bytes the connection is `full`; `drained()` is called when it
        # falls back to half of that (0: never full).
        self.high_water = high_water
        self._drained = drained
        self.full = False
        self._loop = asyncio.get_running_loop()
        self.pending: deque = deque()
        self._flush_scheduled = False
        self._drain_task: asyncio.Task | None = None
        self._ending = False  # write what is pending, then the close frame (if any), then stop
        self.done = asyncio.Event()
        self.close_code: int | None = None  # set when the relay ends the connection
        self.close_reason = ""
        self.queued_bytes = 0
        # Answers built on reader threads and not queued yet, by what they answer: their size
        # counts toward `over_budget` at once (the loop may queue them a little later). Reader
        # threads add to it while the loop looks through it: only under the lock.
        self._producing: dict = {}
        self._producing_lock = threading.Lock()
        # Reads are held for this connection (`over_budget`; set by its session): while it is not
        # `full` (answers being built put it over), `drained()` follows each write, not only the
        # drain of a full output, which never comes for a client that reads what it is sent.
        self.held = False
        self.abandoned = False
        # Cuts the connection when the relay sheds output (Relay.shed_output).
        self.shed = shed if shed is not None else self.abandon
        relay.outputs.add(self)

    def enqueue(self, text: str | Frames) -> None:
        """Queue one message (or a `Frames` of several) to be written with what else comes in
        this turn of the loop."""
        if self.abandoned:
            return
        self.account(len(text))
        self.pending.append(text)
        if not self._flush_scheduled and self._drain_task is None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _piece(self) -> tuple[list, int]:
        """The next messages to write, DEFAULT_WRITE_PIECE bytes or so (a `Frames` split at a frame
        boundary when it is larger), and their size."""
        pending = self.pending
        piece: list = []
        size = 0
        while pending and size < DEFAULT_WRITE_PIECE:
            item = pending[0]
            n = len(item)
            if size + n > DEFAULT_WRITE_PIECE and type(item) is Frames and n > DEFAULT_WRITE_PIECE:
                head, rest = item.split(DEFAULT_WRITE_PIECE - size)
                if rest is not None:
                    pending[0] = rest
                    piece.append(Frames(head, 0))
                    size += len(head)
                    break
            pending.popleft()
            piece.append(item)
            size += n
        return piece, size

    def _flush(self) -> None:
        """Write what is pending while the transport takes it, or hand over to `_drain`."""
        self._flush_scheduled = False
        if self._drain_task is not None or self.done.is_set():
            return
        writer = self.writer
        while self.pending and writer.ready():
            piece, size = self._piece()
            try:
                writer.write_now(piece)
            except Exception:  # a transport that broke under us: this connection is over
                log.debug("write failed", exc_info=True)
                self._lost()
                writer.abort()
                self.done.set()
                return
            self.account(-size)
        if self.pending or self._ending:  # the peer is behind, or output ends
            self._drain_task = asyncio.ensure_future(self._drain())

    def end(self, code: int | None = None, reason: str = "") -> None:
        """No more output after what is pending, then a close frame with `code` (if given)."""
        if code is not None:
            self.close_code = code
            self.close_reason = reason
        if not self._ending:
            self._ending = True
            if not self._flush_scheduled and self._drain_task is None:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)

    def account(self, n: int) -> None:
        """Unsent output grew (or, negative, shrank) by n: this connection's and the relay's."""
        if self.abandoned:
            return
        self.queued_bytes += n
        relay = self.relay
        relay.queued_bytes += n
        if n > 0:
            if relay.queued_bytes > relay.output_peak:
                relay.output_peak = relay.queued_bytes
            if self.high_water and not self.full and self.queued_bytes > self.high_water:
                self.full = True
        else:
            if relay.read_waiters:
                relay.room_made()
            if self.full:
                if self.queued_bytes <= self.high_water // 2:
                    self.full = False
                    if self._drained is not None:
                        self._drained()
            else:
                self.owed_less()  # (reads held for answers being built: they look again)

    def owed_less(self) -> None:
        """Less is owed to this connection (written, or an answer being built dropped unsent): reads
        held while answers being built put it over budget, not `full`, look again."""
        if self.held and not self.full and self._drained is not None:
            self._drained()

    def over_budget(self) -> bool:
        """Whether no new answer should be built for this connection now (on any thread): it is
        `full`, or would be with the answers being built already."""
        if self.full:
            return True
        if not self.high_water:
            return False
        with self._producing_lock:
            building = sum(self._producing.values())
        return self.queued_bytes + building > self.high_water

    def building(self, answer: object, size: int, wanted: Callable[[], bool] | None = None) -> None:
        """On a reader thread: an answer of `size` bytes for `answer` (a subscription) is built,
        not queued yet; not counted unless still `wanted()`, asked under the lock: the loop stops
        wanting an answer before it forgets it (`built`), so none is counted after that."""
        with self._producing_lock:
            if wanted is None or wanted():
                self._producing[answer] = size

    def built(self, answer: object) -> bool:
        """`answer` is queued, or not wanted: it counts no more. Whether it counted."""
        with self._producing_lock:
            return self._producing.pop(answer, None) is not None

    def forget_unwanted(self, wanted: Callable[[object], bool]) -> None:
        """The answers being built that are no longer `wanted` count no more (a read cancelled
        just as it finished its answer)."""
        with self._producing_lock:
            for answer in [a for a in self._producing if not wanted(a)]:
                del self._producing[answer]

    def abandon(self) -> None:
        """The connection is cut: what was never sent is dropped and uncounted now."""
        if not self.abandoned:
            self.relay.queued_bytes -= self.queued_bytes
            self.queued_bytes = 0
            self.relay.room_made()
            self.full = False
            self.abandoned = True
            self.pending.clear()
            self.relay.outputs.discard(self)
            self.relay.forget_waiters(self)

    def discard(self) -> None:
        """What was never sent leaves with the connection."""
        self.abandon()

    async def _drain(self) -> None:
        """The slow path: write pending messages as the peer takes them, then, once output ends,
        the close frame."""
        writer = self.writer
        try:
            while not self.done.is_set():
                if self.pending:
                    piece, size = self._piece()
                    try:
                        delivered = await writer.send_all(piece)
                    except Exception:  # a broken peer
                        delivered = False
                    if not delivered:
                        self._lost()
                        writer.abort()
                        self.done.set()
                        break
                    self.account(-size)
                    if writer.ready() and not self._ending:
                        break  # the peer keeps up again: back to writing from the loop
                    continue
                if self._ending:
                    if self.close_code is not None and not writer.aborted:
                        writer.close(self.close_code, self.close_reason)
                    self.done.set()
                break
        finally:
            self._drain_task = None
            if (self.pending or self._ending) and not self.done.is_set():
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
