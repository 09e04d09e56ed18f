"""A small HTTP/2 client over TLS (RFC 9113, frames and HPACK on asyncio), for APNs-style APIs.

Why not httpx, nor the `h2` state machine: both cost too much CPU per request at peak wake rates
(docs/performance.md#own-http2-client). A provider API needs little of HTTP/2: one origin,
POST-style requests with small bodies and small answers, one stream per request on one
long-lived connection. So this client speaks exactly that part of the protocol
with bytes and `struct`: TLS with ALPN `h2` mandatory, SETTINGS (acknowledged and applied), PING
answered, concurrency bounded by the server's MAX_CONCURRENT_STREAMS, flow control respected in
both directions, header blocks split into CONTINUATION frames as needed, RST_STREAM, GOAWAY
(reason kept), and reconnection after GOAWAY or a dropped connection. HPACK both ways is ours too
(`_Encoder` below, `hpack_decode.py`), each checked against the `hpack` library in the tests.
Whatever the server sends that the protocol forbids ends the connection (GOAWAY with the error),
failing its requests with Http2Error.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import struct
from dataclasses import dataclass
from urllib.parse import urlsplit

from .hpack_decode import DecodeError, Decoder

__all__ = ["Http2Client", "Response", "Http2Error", "ConnectFailed", "StreamRefused"]

# Streams we open at once before the server told us its limit (RFC 9113 suggests assuming 100).
DEFAULT_MAX_STREAMS = 100
# Our receive window for the connection: answers are small, so acknowledging rarely is enough.
RECEIVE_WINDOW = 16 * 1024 * 1024
# An answer's body longer than this is not an APNs-style answer: the stream is reset (bytes).
MAX_BODY = 1024 * 1024
# Largest header list we decode for one answer (bytes, HPACK-decoded, as RFC 9113 counts them).
MAX_HEADER_LIST = 64 * 1024
# Seconds the server has to answer our PING after a request timed out, before the connection is
# taken for dead and dropped (its requests fail, the next ones open a new connection).
PING_TIMEOUT = 10.0

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEAD = struct.Struct(">I B I")  # (length << 8 | type, flags, stream id): 9 bytes
# Frame types (RFC 9113 6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Settings (RFC 9113 6.5.2)
(HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE,
 MAX_HEADER_LIST_SIZE) = 1, 2, 3, 4, 5, 6
# Error codes (RFC 9113 7)
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = (
    0x0, 0x1, 0x3, 0x6, 0x7, 0x8, 0x9)
_ERROR_NAMES = {0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR", 0x3: "FLOW_CONTROL_ERROR",
                0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED", 0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM",
                0x8: "CANCEL", 0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
                0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED"}
_MAX_WINDOW = 2 ** 31 - 1
_OUR_FRAME_SIZE = 16384  # we never raise SETTINGS_MAX_FRAME_SIZE above the default


class Http2Error(Exception):
    """The request did not get a response (connection lost, stream reset, protocol error)."""


class ConnectFailed(Http2Error):
    """No connection could be made; `tls` is set when the server's certificate was not trusted."""

    def __init__(self, message: str, tls: ssl.SSLCertVerificationError | None = None, refused: bool = False):
        super().__init__(message)
        self.tls = tls
        self.refused = refused  # the host answered the connection attempt with a refusal (RST)


class StreamRefused(Http2Error):
    """The server refused the stream before processing it (GOAWAY past it, REFUSED_STREAM): safe to retry."""


class _NotOpened(StreamRefused):
    """The connection retired (GOAWAY, dropped) before the request had a stream: nothing was sent."""


class _ConnectionError(Exception):
    """The server broke the protocol: the connection ends with this error code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def _frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | ftype, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1 integer with an N-bit prefix (`first` holds the bits above the prefix)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_str(data: bytes) -> bytes:
    return _hpack_int(len(data), 7) + data  # H = 0: no Huffman coding


class _Encoder:
    """HPACK for a client whose requests repeat most fields (method, scheme, authority, provider
    token, topic, ...) and change a few on every request (path, apns-id, expiry).

    A repeating field is sent once as a literal with incremental indexing (RFC 7541 6.2.1) and
    afterwards as one or two bytes naming its dynamic table entry (6.1): the server decodes an
    index instead of the provider token's 200-odd bytes. Fields named in `volatile` are literals
    without indexing (6.2.2), so they never churn the table. No Huffman coding: a few more bytes
    for the literals, a fraction of the CPU. This encoder is the only writer of its table, so it
    mirrors it exactly: entries of name + value + 32 octets, evicted oldest first (4.4), within the
    size the server allows (SETTINGS_HEADER_TABLE_SIZE, at most the 4096 default; a change is
    signalled at the start of the next block, 4.2, 6.3). Nothing here is secret from the server;
    no party but the server sees the compressed sizes.
    """

    # Literal blocks kept (fields seen before); bounded by starting afresh when full.
    CACHE_MAX = 256

    def __init__(self, volatile: frozenset[str] = frozenset()):
        self.volatile = volatile
        self._literals: dict[tuple, bytes] = {}
        self.max_size = 4096
        self._size = 0
        self._entries: list[tuple[tuple, int]] = []  # (field, size), oldest first
        self._seq: dict[tuple, int] = {}  # field -> its insertion number
        self._inserted = 0  # insertions so far; the newest entry is number _inserted - 1
        self._updates: list[int] = []  # table size updates owed to the server's decoder

    def table_size_changed(self, allowed: int) -> None:
        """The server's SETTINGS_HEADER_TABLE_SIZE: our table shrinks to fit (never beyond 4096)."""
        size = min(allowed, 4096)
        if size != self.max_size or self._updates:
            # RFC 7541 4.2: the smallest size since the last block first, then the final one.
            smallest = min([size, *self._updates])
            self._updates = [smallest] if smallest == size else [smallest, size]
            self.max_size = size
            self._evict(0)

    def _evict(self, room: int) -> None:
        while self._entries and self._size + room > self.max_size:
            field, size = self._entries.pop(0)
            self._size -= size
            if self._seq.get(field) == self._inserted - len(self._entries) - 1:
                del self._seq[field]

    @staticmethod
    def _octets(text) -> bytes:
        return text if type(text) is bytes else str(text).encode()

    def encode(self, headers) -> bytes:
        out = bytearray()
        if self._updates:
            for size in self._updates:
                out += _hpack_int(size, 5, 0x20)
            self._updates = []
        seq, volatile = self._seq, self.volatile
        for field in headers:
            n = seq.get(field)
            if n is not None:  # in the table: its index (the newest entry is 62)
                out += _hpack_int(62 + self._inserted - 1 - n, 7, 0x80)
                continue
            name = field[0]
            if name in volatile:
                block = self._literals.get(field)
                if block is None:
                    block = b"\x00" + _hpack_str(self._octets(name)) + _hpack_str(self._octets(field[1]))
                    if len(self._literals) >= self.CACHE_MAX:
                        self._literals.clear()
                    self._literals[field] = block
                out += block
                continue
            name_b, value_b = self._octets(name), self._octets(field[1])
            out += b"\x40" + _hpack_str(name_b) + _hpack_str(value_b)
            size = len(name_b) + len(value_b) + 32
            if size > self.max_size:  # larger than the table: the table empties (4.4)
                self._evict(self.max_size + 1)
                continue
            self._evict(size)
            self._entries.append((field, size))
            self._size += size
            seq[field] = self._inserted
            self._inserted += 1
        return bytes(out)


class _Stream:
    __slots__ = ("future", "status", "headers", "body", "window", "received", "deadline")

    def __init__(self, future: asyncio.Future, window: int, deadline: float | None = None):
        self.future = future
        self.deadline = deadline  # loop time by which its answer must be in (None: the caller's own timeout)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.window = window  # what we may still send on it (flow control)
        self.received = 0  # DATA bytes it received (against our initial window)


class _Connection(asyncio.Protocol):
    def __init__(self, client: "Http2Client"):
        self.client = client
        self.encoder = _Encoder(client.volatile)
        self.decoder = Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._out = bytearray()
        self._flush_scheduled = False
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.next_stream_id = 1
        self.closed = False
        self.goaway_reason: str | None = None
        self.max_streams = DEFAULT_MAX_STREAMS
        self.capacity = asyncio.Event()  # set while a stream can be opened
        self.capacity.set()
        self.window = asyncio.Event()  # set when the peer widened a flow-control window
        # The loop this connection lives on, kept: on Python 3.11 every asyncio.get_running_loop()
        # is a getpid() system call, and a request asked for it two or three times.
        self.loop = asyncio.get_running_loop()
        self.ready = self.loop.create_future()
        self.lost = self.loop.create_future()
        # The peer's settings as they concern us, and our send window for the connection.
        self.send_window = 65535
        self.initial_window = 65535
        self.max_frame = 16384
        # What the peer may still send us on the connection before we widen it again.
        self.recv_window = 65535
        self._buf = b""
        self._settings_seen = False
        self._headers_for: int | None = None  # a header block in progress (CONTINUATION expected)
        # One timer for every stream's deadline: at the earliest one (see `_sweep`).
        self._sweep_at: float | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._headers_flags = 0
        self._block = bytearray()
        # A liveness probe after a request timed out: the PING payload awaiting its ACK.
        self._ping_sent: bytes | None = None
        self._ping_handle: asyncio.TimerHandle | None = None
        self._pings_answered = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            self._fail(ConnectFailed("the server does not speak HTTP/2 (ALPN h2)"))
            transport.close()
            return
        # No server push; a large initial stream window (answers never need a WINDOW_UPDATE);
        # and a generous connection window (fewer WINDOW_UPDATE round trips).
        settings = struct.pack(">HIHIHI", ENABLE_PUSH, 0, INITIAL_WINDOW_SIZE, MAX_BODY,
                               MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)
        self.recv_window += RECEIVE_WINDOW
        transport.write(_PREFACE + _frame(SETTINGS, 0, 0, settings)
                        + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", RECEIVE_WINDOW)))
        if not self.ready.done():
            self.ready.set_result(None)

    def connection_lost(self, exc) -> None:
        self._fail(Http2Error(f"connection lost{': ' + str(exc) if exc else ''}"))
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos, end = 0, len(buf)
        try:
            while end - pos >= 9:
                word, flags, stream_id = _HEAD.unpack_from(buf, pos)
                length = word >> 8
                if length > _OUR_FRAME_SIZE:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - pos < 9 + length:
                    break
                payload = buf[pos + 9:pos + 9 + length]
                pos += 9 + length
                self._frame_received(word & 0xFF, flags, stream_id & _MAX_WINDOW, payload)
        except _ConnectionError as exc:
            self._connection_error(exc.code, str(exc))
            return
        self._buf = buf[pos:]
        if self._out:
            self._flush()

    # -- frames in ---------------------------------------------------------------------------------

    def _frame_received(self, ftype: int, flags: int, stream_id: int, payload: bytes) -> None:
        if not self._settings_seen:  # RFC 9113 3.4: the server's preface is a SETTINGS frame
            if ftype != SETTINGS or flags & ACK:
                raise _ConnectionError(PROTOCOL_ERROR, "the server's preface is not a SETTINGS frame")
            self._settings_seen = True
        if self._headers_for is not None and (ftype != CONTINUATION or stream_id != self._headers_for):
            raise _ConnectionError(PROTOCOL_ERROR, "a header block was interrupted")
        if ftype == HEADERS:
            self._headers_received(flags, stream_id, payload)
        elif ftype == DATA:
            self._data_received(flags, stream_id, payload)
        elif ftype == CONTINUATION:
            if self._headers_for is None:
                raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without a header block")
            self._block += payload
            if len(self._block) > MAX_HEADER_LIST:
                raise _ConnectionError(PROTOCOL_ERROR, "a header block too large")
            if flags & END_HEADERS:
                self._headers_for = None
                self._header_block(stream_id, self._headers_flags, bytes(self._block))
        elif ftype == SETTINGS:
            self._settings_received(flags, stream_id, payload)
        elif ftype == WINDOW_UPDATE:
            if len(payload) != 4:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame is 4 bytes")
            increment = struct.unpack(">I", payload)[0] & _MAX_WINDOW
            if stream_id == 0:
                if increment == 0:
                    raise _ConnectionError(PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0")
                self.send_window += increment
                if self.send_window > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection window overflowed")
            else:
                stream = self.streams.get(stream_id)
                if stream is not None:
                    stream.window += increment
                    if increment == 0 or stream.window > _MAX_WINDOW:
                        self._stream_error(stream_id, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR,
                                           "a bad WINDOW_UPDATE")
            self.window.set()
        elif ftype == PING:
            if stream_id != 0 or len(payload) != 8:
                raise _ConnectionError(PROTOCOL_ERROR if stream_id else FRAME_SIZE_ERROR, "a bad PING frame")
            if not flags & ACK:
                self._send(_frame(PING, ACK, 0, payload))
            elif payload == self._ping_sent:  # the server is there: the connection stays
                self._ping_sent = None
                self._released()  # requests held while it was in doubt go ahead
                self._pings_answered += 1
                if self._ping_handle is not None:
                    self._ping_handle.cancel()
                    self._ping_handle = None
        elif ftype == RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise _ConnectionError(PROTOCOL_ERROR, "a bad RST_STREAM frame")
            code = struct.unpack(">I", payload)[0]
            stream = self.streams.pop(stream_id, None)
            if stream is not None and not stream.future.done():
                refused = code == REFUSED_STREAM
                stream.future.set_exception((StreamRefused if refused else Http2Error)(
                    f"stream reset by the server ({_ERROR_NAMES.get(code, hex(code))})"))
            self._released()
        elif ftype == GOAWAY:
            if stream_id != 0 or len(payload) < 8:
                raise _ConnectionError(PROTOCOL_ERROR, "a bad GOAWAY frame")
            last, code = struct.unpack_from(">II", payload)
            self._goaway(last & _MAX_WINDOW, code, payload[8:])
        elif ftype == PUSH_PROMISE:  # we said SETTINGS_ENABLE_PUSH = 0
            raise _ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE although push is disabled")
        elif ftype == PRIORITY:
            if stream_id == 0 or len(payload) != 5:
                raise _ConnectionError(PROTOCOL_ERROR, "a bad PRIORITY frame")
        # Unknown frame types are ignored (RFC 9113 4.1).

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
            return payload[1:len(payload) - payload[0]]
        return payload

    def _headers_received(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if stream_id % 2 == 0 or stream_id >= self.next_stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which we never opened")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise _ConnectionError(PROTOCOL_ERROR, "a HEADERS priority field cut short")
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, block)
        else:
            self._headers_for, self._headers_flags = stream_id, flags
            self._block = bytearray(block)

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        # Every block is decoded, even for a stream we gave up on: it may change the HPACK table.
        try:
            fields = self.decoder.decode(block)
        except DecodeError as exc:
            raise _ConnectionError(COMPRESSION_ERROR, f"cannot decode a header block: {exc}") from None
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if stream.status == 0 or 100 <= stream.status < 200:  # the answer's head (after any 1xx)
            status = None
            headers: dict[str, str] = {}
            for name, value in fields:
                if name == ":status":
                    status = value
                elif name[:1] == ":" or name != name.lower():
                    status = None
                    break
                else:
                    headers[name] = value
            if status is None or len(status) != 3 or not status.isdigit():
                self._stream_error(stream_id, PROTOCOL_ERROR, "a malformed answer head")
                return
            stream.status, stream.headers = int(status), headers
            if stream.status < 200:
                if flags & END_STREAM:
                    self._stream_error(stream_id, PROTOCOL_ERROR, "an informational answer ended the stream")
                return
        elif not flags & END_STREAM:  # trailers must end the stream
            self._stream_error(stream_id, PROTOCOL_ERROR, "a second header block that does not end the stream")
            return
        if flags & END_STREAM:
            self._finish(stream_id)

    def _data_received(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        # Flow control counts the whole frame, padding included (RFC 9113 6.9.1).
        self.recv_window -= len(payload)
        if self.recv_window < 0:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "the server sent past the connection window")
        if self.recv_window < RECEIVE_WINDOW // 2:
            self._send(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", RECEIVE_WINDOW)))
            self.recv_window += RECEIVE_WINDOW
        data = self._unpad(flags, payload)
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id % 2 == 0 or stream_id >= self.next_stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on stream {stream_id}, which we never opened")
            return  # a stream we reset or finished: its window is the connection's only
        stream.received += len(payload)
        if stream.status < 200:
            self._stream_error(stream_id, PROTOCOL_ERROR, "DATA before the answer's head")
            return
        if stream.received > MAX_BODY:  # past the initial window we gave it: not an APNs answer
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, "an answer larger than its window")
            return
        stream.body += data
        if flags & END_STREAM:
            self._finish(stream_id)

    def _settings_received(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame of a bad length")
        for i in range(0, len(payload), 6):
            code, value = struct.unpack_from(">HI", payload, i)
            if code == HEADER_TABLE_SIZE:
                self.encoder.table_size_changed(min(value, 4096))
            elif code == ENABLE_PUSH:
                if value > 1:
                    raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH above 1")
            elif code == MAX_CONCURRENT_STREAMS:
                self.max_streams = max(1, value)
                self._released()
            elif code == INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta, self.initial_window = value - self.initial_window, value
                for stream in self.streams.values():
                    stream.window += delta
                self.window.set()
            elif code == MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.max_frame = value
        self._send(_frame(SETTINGS, ACK, 0))

    # -- frames out --------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        """Queue bytes for the server; written once per loop iteration (requests share a write)."""
        self._out += data
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(bytes(self._out))
        self._out.clear()

    def _stream_error(self, stream_id: int, code: int, message: str) -> None:
        """The server broke the protocol on one stream: reset it, fail its request."""
        stream = self.streams.pop(stream_id, None)
        self._send(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", code)))
        if stream is not None and not stream.future.done():
            stream.future.set_exception(Http2Error(f"HTTP/2 protocol error: {message}"))
        self._released()

    def _connection_error(self, code: int, message: str) -> None:
        last = 0  # the server opens no streams
        self._send(_frame(GOAWAY, 0, 0, struct.pack(">II", last, code)))
        self._flush()
        self._fail(Http2Error(f"HTTP/2 protocol error: {message}"))
        if self.transport is not None:
            self.transport.close()

    # -- streams ---------------------------------------------------------------------------------

    def _finish(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None and not stream.future.done():
            stream.future.set_result(Response(stream.status, stream.headers, bytes(stream.body)))
        self._released()

    def _released(self) -> None:
        """A stream ended (answered, reset, timed out, refused)."""
        if len(self.streams) < self.max_streams:
            self.capacity.set()
        # A body waiting for a window looks again: its own stream may be the one that ended.
        self.window.set()
        if self.closed and not self.streams and self.transport is not None and not self.transport.is_closing():
            # Retired (GOAWAY, stream ids used up) and its last stream done: the socket goes.
            self.transport.close()

    def _goaway(self, last: int, code: int, debug: bytes) -> None:
        """GOAWAY: streams past `last` were never processed; the rest may still finish."""
        self.closed = True
        if debug:
            try:  # APNs puts {"reason": ...} in the GOAWAY payload
                self.goaway_reason = json.loads(debug).get("reason")
            except (ValueError, AttributeError):
                pass
        for sid in [s for s in self.streams if s > last]:
            stream = self.streams.pop(sid)
            if not stream.future.done():
                stream.future.set_exception(StreamRefused(f"GOAWAY before processing ({self.goaway_reason})"))
        self.capacity.set()  # waiters move on to a new connection
        self._released()  # closes it now if no stream is left, else once the last one ends

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(exc)
        for stream in self.streams.values():
            if not stream.future.done():
                stream.future.set_exception(exc)
        self.streams.clear()
        self.capacity.set()
        self.window.set()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_at = self._sweep_handle = None
        if self._ping_handle is not None:
            self._ping_handle.cancel()
            self._ping_handle = None

    def probe(self) -> None:
        """A request got no answer in time: PING the server (once at a time). No ACK within the
        client's `ping_timeout` means the connection is dead (a peer or path gone silent, with no
        reset ever coming): it is dropped, its requests fail at once, the next open a new one."""
        if self.closed or self._ping_sent is not None or self.transport is None or self.transport.is_closing():
            return
        self._ping_sent = os.urandom(8)
        self._send(_frame(PING, 0, 0, self._ping_sent))
        self._flush()
        self._ping_handle = self.loop.call_later(self.client.ping_timeout, self._silent)

    def _silent(self) -> None:
        self._ping_handle = None
        if self._ping_sent is None or self.transport is None:
            return
        self._fail(Http2Error(f"connection dropped: no answer to PING in {self.client.ping_timeout:g} s"))
        self.transport.abort()

    def _watch(self, deadline: float) -> None:
        """Have `_sweep` run by `deadline` (loop time)."""
        if self._sweep_at is not None and self._sweep_at <= deadline:
            return
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = deadline
        self._sweep_handle = self.loop.call_at(deadline, self._sweep)

    def _sweep(self) -> None:
        """The streams past their deadline fail with TimeoutError (and are reset, as a cancelled
        request is); then wait for the earliest deadline left. A request's own asyncio.timeout
        cost a timer per request; this is one timer per connection (requests of one client share
        their timeout, so it rarely finds anything to do)."""
        self._sweep_at = self._sweep_handle = None
        now = self.loop.time()
        late = [sid for sid, stream in self.streams.items() if stream.deadline is not None and stream.deadline <= now]
        for sid in late:
            stream = self.streams.pop(sid)
            self._send(_frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))  # (after GOAWAY too)
            if not stream.future.done():
                stream.future.set_exception(TimeoutError())
        if late:
            self._flush()
            self._released()
            self.probe()
        left = [stream.deadline for stream in self.streams.values() if stream.deadline is not None]
        if left:
            self._watch(min(left))

    def can_start(self, body: bytes) -> bool:
        """Whether a request with this body starts at once: a stream is free, the connection is not
        in doubt (a PING unanswered) and the body fits the flow-control windows (nothing to wait
        for before its answer)."""
        return (not self.closed and len(self.streams) < self.max_streams and self._ping_sent is None
                and len(body) <= min(self.send_window, self.initial_window, self.max_frame))

    async def request(self, headers: list[tuple[str, str]], body: bytes, deadline: float | None = None) -> Response:
        """`deadline` (loop time): the answer must be in by then, else TimeoutError; only for a
        request that `can_start` (without one, the caller times the request itself)."""
        # While a PING after a timeout is unanswered, no new stream: if the connection is dead,
        # these requests go on the next one instead (`_NotOpened` once it is dropped).
        while (len(self.streams) >= self.max_streams or self._ping_sent is not None) and not self.closed:
            self.capacity.clear()
            await self.capacity.wait()
        if self.closed:
            raise _NotOpened("connection closing")
        stream_id = self.next_stream_id
        if stream_id > _MAX_WINDOW:
            self.closed = True  # stream ids ran out: the next request opens a new connection
            self._released()
            raise _NotOpened("stream ids exhausted")
        self.next_stream_id += 2
        future = self.loop.create_future()
        stream = self.streams[stream_id] = _Stream(future, self.initial_window, deadline)
        if deadline is not None:
            self._watch(deadline)
        try:
            block = self.encoder.encode(headers)
            flags = 0 if body else END_STREAM
            size = self.max_frame
            if len(block) <= size:
                self._send(_frame(HEADERS, flags | END_HEADERS, stream_id, block))
            else:  # HEADERS then CONTINUATION frames, back to back (nothing may come between)
                parts = [block[i:i + size] for i in range(0, len(block), size)]
                frames = [_frame(HEADERS, flags, stream_id, parts[0])]
                frames += [_frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, stream_id, part)
                           for i, part in enumerate(parts[1:], 1)]
                self._send(b"".join(frames))
            sent = 0
            while sent < len(body):
                room = min(self.send_window, stream.window, self.max_frame)
                if room <= 0:
                    self._flush()
                    self.window.clear()
                    await self.window.wait()
                    if future.done() or stream_id not in self.streams:  # answered, reset, refused or lost
                        if future.done() and future.exception() is None:
                            # Answered before its body was all sent (RFC 9113 8.1): the rest is
                            # not sent; the reset frees the stream on the server's side too.
                            self._send(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", CANCEL)))
                        return await future
                    continue
                chunk = body[sent:sent + room]
                sent += len(chunk)
                self.send_window -= len(chunk)
                stream.window -= len(chunk)
                self._send(_frame(DATA, END_STREAM if sent >= len(body) else 0, stream_id, chunk))
            return await future
        except asyncio.CancelledError:
            # Timed out or abandoned: tell the server, so the stream's slot is freed on both sides.
            if self.streams.pop(stream_id, None) is not None:  # (a stream GOAWAY left open too)
                self._send(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", CANCEL)))
                self._flush()
                self._released()
            raise


class Http2Client:
    """Requests to one https:// origin over one long-lived HTTP/2 connection, made on first use."""

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext, *, connect_timeout: float = 10.0,
                 volatile: frozenset[str] = frozenset({":path"}), ping_timeout: float = PING_TIMEOUT):
        """`volatile`: header names whose values change from request to request (never indexed);
        `ping_timeout`: seconds a PING sent after a request timed out may go unanswered before the
        connection is dropped."""
        parts = urlsplit(base_url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("an https:// URL is required")
        self.host = parts.hostname
        self.port = parts.port or 443
        self.authority = parts.netloc
        self.ssl_context = ssl_context
        self.ssl_context.set_alpn_protocols(["h2"])
        self.connect_timeout = connect_timeout
        self.volatile = volatile
        self.ping_timeout = ping_timeout
        self._conn: _Connection | None = None
        self._connecting: asyncio.Lock | None = None
        self.connections_made = 0

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            loop = asyncio.get_running_loop()
            try:
                _transport, conn = await asyncio.wait_for(
                    loop.create_connection(lambda: _Connection(self), self.host, self.port, ssl=self.ssl_context,
                                           server_hostname=self.host),
                    self.connect_timeout)
                await conn.ready
            except ssl.SSLCertVerificationError as exc:
                raise ConnectFailed(f"TLS certificate not trusted: {exc.verify_message}", tls=exc) from None
            except (OSError, asyncio.TimeoutError) as exc:
                if isinstance(exc, ConnectionRefusedError):
                    raise ConnectFailed(f"cannot connect to {self.authority}: connection refused (nothing "
                                        "listens there, or a firewall says no)", refused=True) from None
                raise ConnectFailed(f"cannot connect to {self.authority}: {exc or 'timed out'}") from None
            self._conn = conn
            self.connections_made += 1
            return conn

    async def request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                      timeout: float) -> Response:
        """One request; Http2Error (or asyncio.TimeoutError after `timeout` seconds) if no response came."""
        all_headers = [(":method", method), (":scheme", "https"), (":authority", self.authority),
                       (":path", path), *headers]
        conn = self._conn
        if conn is not None and conn.can_start(body):
            # The usual case: nothing to wait for but the answer, timed by the connection's sweep.
            return await conn.request(all_headers, body, conn.loop.time() + timeout)
        conn = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    conn = await self._connection()
                    try:
                        return await conn.request(all_headers, body)
                    except _NotOpened:
                        continue  # it retired while this request waited for a stream: the next one
        except TimeoutError:
            if conn is not None:
                conn.probe()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            if not conn.transport.is_closing():
                last = 0  # the server opens no streams
                conn._send(_frame(GOAWAY, 0, 0, struct.pack(">II", last, NO_ERROR)))
                conn._flush()
            conn.transport.close()
            try:  # let the TLS close finish while the loop still runs
                await asyncio.wait_for(asyncio.shield(conn.lost), 2)
            except asyncio.TimeoutError:
                conn.transport.abort()
