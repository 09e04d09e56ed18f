"""A websocket connection (RFC 6455) on asyncio, over `websockets`' sans-I/O `ServerProtocol`.

`ServerProtocol` checks the handshake, negotiates permessage-deflate (RFC 7692) and parses frames:
it enforces masking, control frame rules, close codes, fragmentation order and the message size
limit (closing 1002 or 1009). This module moves bytes between it and the socket, assembles
fragmented messages, checks that text is UTF-8 (closing 1007, quietly: one DEBUG line and a
counter), answers pings and sends its own keepalive pings, and runs the closing handshake.

Messages go to a `handler` (the relay's session) that pulls them (`next_message`) when it is ready
for more: what a client sent is parsed DEFAULT_PARSE_BYTES at a time, and the socket is not read
again until every message parsed so far was taken. One read from a client that pipelines (up to
256 KiB: thousands of small frames) is not parsed in one go, which held the event loop, and every
other client, for tens of milliseconds; the client's further messages wait in its own
socket (TCP backpressure). Once the relay closes the connection, everything read is parsed as it
comes (messages are dropped then), so the client's answer to the close frame is not held up.

Output is written by the handler through `write_now` (many messages, one system call; frames built
here for connections without an extension) or `send_all` (waiting while the peer is behind).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from typing import Any, Protocol

from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from appliance.front.frames import Frames, frame_header

log = logging.getLogger("appliance.front")
# websockets' own logger for the protocol objects: at INFO it says "connection open" for every
# connection; only its warnings are wanted.
_PROTOCOL_LOG = logging.getLogger("appliance.front.protocol")
_PROTOCOL_LOG.setLevel(logging.WARNING)

# Bytes of a client's stream parsed into messages at a time: a pipelining client's read parsed
# whole holds the loop while every other client waits: docs/performance.md#default_parse_bytes
DEFAULT_PARSE_BYTES = 4 * 1024
# Seconds the relay waits for a client's answer to its close frame before cutting the connection.
DEFAULT_CLOSE_TIMEOUT = 10.0
# Keepalive: a ping after this many idle-or-not seconds, and the connection cut (1011) when its
# pong has not come this many seconds later, the relay reading it all along.
DEFAULT_PING_INTERVAL = 30.0
DEFAULT_PING_TIMEOUT = 30.0
# A peer that lets this long pass without taking any of what is buffered for it is cut off: its
# unsent messages would otherwise stay in memory for as long as it keeps the connection open.
DEFAULT_WRITE_STALL_SECONDS = 60.0

NOTHING = object()  # `next_message`: nothing parsed and nothing left to parse (more will come)
CLOSED = object()  # `next_message`: the connection is over (after every message it carried)


class Handler(Protocol):
    """What a connection hands its messages to."""

    def pump(self) -> None:
        """Messages (or the end) are there to take with `next_message`."""


class Counters:
    """What the websocket connections of one server count (for metrics and tests)."""

    def __init__(self) -> None:
        self.invalid_utf8 = 0


class WebSocketConnection(asyncio.Protocol):
    """One open websocket connection: the transport's protocol once the handshake succeeded."""

    def __init__(self, conn: ServerProtocol, transport: asyncio.Transport, *, counters: Counters,
                 connections: set, on_end=None, ping_interval: float | None = DEFAULT_PING_INTERVAL,
                 ping_timeout: float = DEFAULT_PING_TIMEOUT, close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
                 stall_seconds: float = DEFAULT_WRITE_STALL_SECONDS, deflate: bool = False):
        self.conn = conn
        # Whether permessage-deflate was negotiated (the handshake's answer named it): then every
        # message goes through the protocol, whose compression context must see each one.
        self.deflate = deflate
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.counters = counters
        self.connections = connections  # the server's open websocket connections (graceful stop)
        self._on_end = on_end  # called once when the connection is over (an address slot released)
        self.handler: Handler | None = None
        self.messages: deque = deque()  # parsed, not taken yet: str, bytes, or CLOSED last
        self.unparsed = bytearray()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self.read_paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.disconnected = False
        self.close_sent = False  # by the relay (its close frame or a failure)
        self.aborted = False
        self._ended = False
        self.close_timeout = close_timeout
        self.stall_seconds = stall_seconds
        self._close_timer: asyncio.TimerHandle | None = None
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self._ping_timer: asyncio.TimerHandle | None = None
        self._pong_timer: asyncio.TimerHandle | None = None
        self._ping_payload: bytes | None = None
        # Reading was paused since the last ping went out: the client's pong may wait unread.
        self._paused_since_ping = False
        connections.add(self)
        if ping_interval:
            self._ping_timer = self.loop.call_later(ping_interval, self._ping)

    # -- the handler's side ----------------------------------------------------------------------

    def attach(self, handler: Handler) -> None:
        """Start handing messages to `handler` (what arrived meanwhile first)."""
        self.handler = handler
        self._after_read()
        handler.pump()

    @property
    def pipelined(self) -> bool:
        """Whether the client's next messages have arrived already (it sends without waiting)."""
        return bool(self.messages) or bool(self.unparsed)

    def next_message(self) -> Any:
        """The next message (str for text, bytes for binary); NOTHING when none has arrived yet
        (the handler's `pump` is called when one does); CLOSED once the connection is over."""
        messages = self.messages
        while not messages:
            if not self.unparsed:
                self._after_read()
                return NOTHING
            piece = bytes(self.unparsed[:DEFAULT_PARSE_BYTES])
            del self.unparsed[:DEFAULT_PARSE_BYTES]
            self._parse(piece)
        message = messages[0]
        if message is not CLOSED:
            messages.popleft()
        return message

    # -- output ----------------------------------------------------------------------------------

    @property
    def raw_frames(self) -> bool:
        """Whether `Frames` may be written: plain frames go straight to the socket (no
        permessage-deflate context that must see each message)."""
        return not self.deflate

    def ready(self) -> bool:
        """Whether `write_now` may be used: the peer keeps up (the transport's flow control) and
        the connection is open."""
        return (self.writable.is_set() and not self.disconnected and not self.close_sent
                and not self.transport.is_closing())

    def write_now(self, texts: list) -> None:
        """Write `texts` (str, or `Frames` when `raw_frames`) with one `transport.write`; only
        when `ready()`."""
        conn = self.conn
        if self.deflate:  # permessage-deflate: its compression context must see every frame
            for text in texts:
                conn.send_text(text.encode())
            self.transport.write(b"".join(conn.data_to_send()))
            return
        # No extension: a server's text frame is a fixed header and the payload (RFC 6455 5.2,
        # unmasked), built here in one pass. Whatever the protocol queued itself (a pong) goes first.
        parts = conn.data_to_send()
        for text in texts:
            if type(text) is Frames:
                parts.append(text.data)
                continue
            data = text.encode()
            parts.append(frame_header(len(data)))
            parts.append(data)
        self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    async def send_all(self, texts: list) -> bool:
        """Send `texts` in order, waiting while the peer is behind; False once the peer is gone
        (or cut off after DEFAULT_WRITE_STALL_SECONDS without taking anything)."""
        if not self.writable.is_set():
            try:
                await asyncio.wait_for(self.writable.wait(), self.stall_seconds)
            except asyncio.TimeoutError:
                self.abort()
                return False
        if self.disconnected or self.close_sent or self.transport.is_closing():
            return False
        self.write_now(texts)
        return True

    def close(self, code: int, reason: str = "") -> None:
        """Start the closing handshake: the close frame now, the connection cut if the client has
        not answered within `close_timeout`. Everything read is parsed from now on as it comes
        (messages dropped), so the client's answer is found at once."""
        if self.close_sent or self.disconnected:
            return
        self.close_sent = True
        try:
            self.conn.send_close(code, reason)
        except InvalidState:  # the client closed first: its close was answered already
            pass
        self._flush()
        if not self.transport.is_closing():
            self._close_timer = self.loop.call_later(self.close_timeout, self.abort)
        self._drop_unparsed()

    def abort(self) -> None:
        """Cut the connection now, dropping whatever is buffered (a peer that stopped reading)."""
        self.aborted = True
        self.transport.abort()

    # -- the transport's side --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.close_sent:
            self._parse(data)  # only its answer to our close frame matters now
            return
        self.unparsed += data
        if self.handler is not None:
            self.handler.pump()
        self._after_read()

    def eof_received(self) -> bool | None:
        return None  # close the transport: a client that half-closes is gone

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disconnected = True
        # Unblock a sender waiting for `writable`: a lost transport never resumes writing.
        self.writable.set()
        self._stop_timers()
        self.connections.discard(self)
        # What was read still reaches the handler (it is parsed as taken), then the end.
        self._end()
        if self.handler is not None:
            self.handler.pump()

    # -- internals -------------------------------------------------------------------------------

    def _after_read(self) -> None:
        """Read the socket again once everything read was parsed and taken; not before."""
        if self.disconnected:
            return
        if self.unparsed or self.messages:
            if not self.read_paused:
                self.read_paused = True
                self._paused_since_ping = True
                self.transport.pause_reading()
        elif self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def _drop_unparsed(self) -> None:
        """The relay closed: what is unparsed is parsed now, its messages dropped."""
        rest, self.unparsed = bytes(self.unparsed), bytearray()
        pending = [m for m in self.messages if m is CLOSED]
        self.messages.clear()
        self.messages.extend(pending)
        if rest:
            self._parse(rest)
        if self.read_paused and not self.disconnected:
            self.read_paused = False
            self.transport.resume_reading()

    def _parse(self, data: bytes) -> None:
        conn = self.conn
        conn.receive_data(data)
        for frame in conn.events_received():
            self._frame(frame)
        if conn.state is not State.OPEN and not self._ended:
            # Closing without the client's close frame: a protocol error or a message too big,
            # failed by the protocol (its close frame queued, written by `_flush`).
            self.close_sent = True
        self._flush()

    def _frame(self, frame: Frame) -> None:
        opcode = frame.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            self._fragment_text = opcode is Opcode.TEXT
            if frame.fin:
                self._message(frame.data, self._fragment_text)
            else:
                self._fragments = [frame.data]
        elif opcode is Opcode.CONT:
            self._fragments.append(frame.data)
            if frame.fin:
                data, self._fragments = b"".join(self._fragments), []
                self._message(data, self._fragment_text)
        elif opcode is Opcode.PONG:
            if self._ping_payload is not None and bytes(frame.data) == self._ping_payload:
                self._ping_payload = None
                if self._pong_timer is not None:
                    self._pong_timer.cancel()
                    self._pong_timer = None
                if self.ping_interval and not self.close_sent:
                    self._ping_timer = self.loop.call_later(self.ping_interval, self._ping)
        elif opcode is Opcode.CLOSE:
            self._end()
        # (PING: the protocol queued the pong, written by `_flush`.)

    def _message(self, data: bytes, text: bool) -> None:
        if self.close_sent:
            return  # the relay closed: nothing more is handled
        if not text:
            self.messages.append(bytes(data))
            return
        try:
            self.messages.append(data.decode())
        except UnicodeDecodeError:
            self.counters.invalid_utf8 += 1
            log.debug("closed a websocket (1007): a text frame was not UTF-8 (%d so far)",
                      self.counters.invalid_utf8)
            self.close_sent = True
            self.conn.fail(1007, "invalid UTF-8")
            self._end()

    def _end(self) -> None:
        """The connection is over for the handler once it has taken what came before."""
        if not self._ended:
            self._ended = True
            self.messages.append(CLOSED)
            if self._on_end is not None:
                self._on_end()

    def _flush(self) -> None:
        """Write what the protocol queued (a pong, a close frame); close the transport when it
        says the stream ends (after a closing handshake or a failure)."""
        writes = self.conn.data_to_send()
        if not writes or self.transport.is_closing():
            return
        end = writes[-1] == b""
        data = b"".join(writes)
        if data:
            self.transport.write(data)
        if end or self.conn.state is State.CLOSED:
            self._stop_timers()
            self.transport.close()

    def _ping(self) -> None:
        self._ping_timer = None
        if self.close_sent or self.transport.is_closing():
            return
        self._ping_payload = os.urandom(4)
        self._paused_since_ping = self.read_paused
        self.conn.send_ping(self._ping_payload)
        self._flush()
        self._pong_timer = self.loop.call_later(self.ping_timeout, self._ping_timed_out)

    def _ping_timed_out(self) -> None:
        self._pong_timer = None
        if self.close_sent or self.transport.is_closing():
            return
        if self.read_paused or self._paused_since_ping:
            # The relay has not been reading this client (its messages wait their turn), so its
            # pong may be there unread: wait again. One that takes nothing is cut by the write stall.
            self._paused_since_ping = self.read_paused
            self._pong_timer = self.loop.call_later(self.ping_timeout, self._ping_timed_out)
            return
        self.close_sent = True
        self.conn.fail(1011, "keepalive ping timeout")
        self._flush()
        self.transport.close()

    def _stop_timers(self) -> None:
        for name in ("_ping_timer", "_pong_timer", "_close_timer"):
            timer = getattr(self, name)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

