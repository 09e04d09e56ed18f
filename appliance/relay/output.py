"""One connection's output: messages queued, written together, drained as the peer takes them.

Messages wait in `pending` until a callback scheduled on the loop writes all of them with one
system call (no task wakes for it): everything queued in one turn of the loop (a REQ's answer, a
burst of OKs) goes out together. Only when the peer is behind, or on the plain ASGI path, does a
task (`_drain`) write them as the peer takes them. Once output ends, what is pending is written,
then the close frame (if the relay is closing), and `done` is set.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from appliance.relay.frames import Frames, FrameWriter

log = logging.getLogger("appliance.relay")

# Queued messages written together (one system call): a REQ's stored events, a burst of OKs.
SEND_BATCH = 256


class Output:
    """The queue of one connection's unsent messages and what writes them."""

    def __init__(self, relay, writer: FrameWriter, close: Callable[[int, str], Awaitable[None]],
                 lost: Callable[[], None]):
        self.relay = relay  # its `queued_bytes` counts the unsent output of every connection
        self.writer = writer
        self._close = close  # sends the close frame
        self._lost = lost  # called when a write fails: the connection is over
        self._loop = asyncio.get_running_loop()
        self.pending: list = []
        self._flush_scheduled = False
        self._drain_task: asyncio.Task | None = None
        self._ending = False  # write what is pending, then the close frame (if any), then stop
        self.done = asyncio.Event()
        self.close_code: int | None = None  # set when the relay ends the connection
        self.close_reason = ""
        self.queued_bytes = 0

    def enqueue(self, text: str | Frames) -> None:
        """Queue one message (or a `Frames` of several) to be written with what else comes in
        this turn of the loop."""
        self.account(len(text))
        self.pending.append(text)
        if not self._flush_scheduled and self._drain_task is None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write everything pending at once, or hand over to `_drain`."""
        self._flush_scheduled = False
        if self._drain_task is not None or self.done.is_set():
            return
        pending = self.pending
        if pending and self.writer.ready():
            self.pending = []
            try:
                self.writer.write_now(pending)
            except Exception:  # a transport that broke under us: this connection is over
                log.debug("write failed", exc_info=True)
                self._lost()
                self.writer.abort()
                self.done.set()
                return
            self.account(-sum(map(len, pending)))
            pending = None
        if pending or self._ending:  # the peer is behind (or plain ASGI), or output ends
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
        self.queued_bytes += n
        self.relay.queued_bytes += n

    def discard(self) -> None:
        """What was never sent leaves with the connection."""
        self.account(-self.queued_bytes)

    async def _drain(self) -> None:
        """The slow path: write pending messages as the peer takes them (or through plain ASGI
        sends), then, once output ends, the close frame."""
        writer = self.writer
        try:
            while not self.done.is_set():
                if self.pending:
                    texts = self.pending[:SEND_BATCH]
                    del self.pending[:SEND_BATCH]
                    try:
                        delivered = await writer.send_all(texts)
                    except Exception:  # a stalled or broken peer (the plain ASGI path raises)
                        delivered = False
                    if not delivered:
                        self._lost()
                        writer.abort()
                        self.done.set()
                        break
                    self.account(-sum(map(len, texts)))
                    if writer.ready() and not self._ending:
                        break  # the peer keeps up again: back to writing from the loop
                    continue
                if self._ending:
                    if self.close_code is not None and not writer.aborted:
                        try:
                            await self._close(self.close_code, self.close_reason)
                        except Exception:  # the peer is gone already
                            pass
                    self.done.set()
                break
        finally:
            self._drain_task = None
            if (self.pending or self._ending) and not self.done.is_set():
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
