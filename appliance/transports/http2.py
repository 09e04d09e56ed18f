"""A small HTTP/2 client over TLS (the `h2` state machine on asyncio), for APNs-style APIs.

Why not httpx: measured against the local APNs emulator on the 2-core reference box, httpx's
HTTP/2 path spent about 2 ms of CPU per request (its pool, anyio shims and per-request imports)
and topped out near 550 requests/s through one connection; this client does one stream per
request on one long-lived connection with none of that and reaches several thousand. It does
only what a provider API needs: POST-style requests with small bodies, one origin, TLS with ALPN
`h2` mandatory, concurrency bounded by the server's MAX_CONCURRENT_STREAMS, flow control
respected, reconnection after GOAWAY or a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack

__all__ = ["Http2Client", "Response", "Http2Error", "ConnectFailed", "StreamRefused"]

# Streams we open at once before the server told us its limit (RFC 9113 suggests assuming 100).
DEFAULT_MAX_STREAMS = 100


class Http2Error(Exception):
    """The request did not get a response (connection lost, stream reset, protocol error)."""


class ConnectFailed(Http2Error):
    """No connection could be made; `tls` is set when the server's certificate was not trusted."""

    def __init__(self, message: str, tls: ssl.SSLCertVerificationError | None = None):
        super().__init__(message)
        self.tls = tls


class StreamRefused(Http2Error):
    """The server refused the stream before processing it (GOAWAY past it, REFUSED_STREAM): safe to retry."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


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


class _PlainEncoder(hpack.Encoder):
    """HPACK for a client whose header values change on every request (path, apns-id, expiry).

    hpack's general encoder searches and grows the dynamic table for every field and Huffman-codes
    every value; for these requests that cost about 0.4 ms each, more than everything else here.
    This one writes every field as a literal without indexing (RFC 7541 6.2.2), never touching the
    dynamic table, with no Huffman coding: a few more bytes on the wire, a fraction of the CPU. A
    table size change the peer asked for is still signalled first (by the base class).
    """

    # Fields seen before (the method, scheme, authority, provider token, topic, ...: most of a
    # request's fields repeat) keep their encoding; bounded by starting afresh when full.
    CACHE_MAX = 256

    def __init__(self):
        super().__init__()
        self._fields: dict[tuple, bytes] = {}

    def encode(self, headers, huffman=True):
        out = bytearray()
        if self.header_table.resized:
            out += self._encode_table_size_change()
            self.header_table.resized = False
        fields = self._fields
        for header in headers:
            block = fields.get(header)
            if block is None:
                name, value = header[0], header[1]
                if type(name) is not bytes:
                    name = str(name).encode()
                if type(value) is not bytes:
                    value = str(value).encode()
                block = b"\x00" + _hpack_str(name) + _hpack_str(value)
                if len(fields) >= self.CACHE_MAX:
                    fields.clear()
                fields[header] = block
            out += block
        return bytes(out)


class _Stream:
    __slots__ = ("future", "status", "headers", "body")

    def __init__(self, future: asyncio.Future):
        self.future = future
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()


class _Connection(asyncio.Protocol):
    def __init__(self, client: "Http2Client"):
        self.client = client
        # Our own headers are fixed and well-formed: skip h2's per-request outbound header checks.
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8", validate_outbound_headers=False,
            normalize_outbound_headers=False))
        self.h2.encoder = _PlainEncoder()
        self._flush_scheduled = False
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.closed = False
        self.goaway_reason: str | None = None
        self.max_streams = DEFAULT_MAX_STREAMS
        self.capacity = asyncio.Event()  # set while a stream can be opened
        self.capacity.set()
        self.window = asyncio.Event()  # set when the peer widened a flow-control window
        self.ready = asyncio.get_running_loop().create_future()
        self.lost = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            self._fail(ConnectFailed("the server does not speak HTTP/2 (ALPN h2)"))
            transport.close()
            return
        self.h2.initiate_connection()
        # Responses are small: a generous receive window means fewer WINDOW_UPDATE round trips.
        self.h2.increment_flow_control_window(16 * 1024 * 1024)
        transport.write(self.h2.data_to_send())
        if not self.ready.done():
            self.ready.set_result(None)

    def connection_lost(self, exc) -> None:
        self._fail(Http2Error(f"connection lost{': ' + str(exc) if exc else ''}"))
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._fail(Http2Error(f"HTTP/2 protocol error: {exc}"))
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.ResponseReceived):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    for k, v in event.headers:
                        if k == ":status":
                            stream.status = int(v)
                        else:
                            stream.headers[k] = v
            elif isinstance(event, h2.events.DataReceived):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.body.extend(event.data)
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._finish(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                stream = self.streams.pop(event.stream_id, None)
                if stream is not None and not stream.future.done():
                    refused = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
                    stream.future.set_exception((StreamRefused if refused else Http2Error)(
                        f"stream reset by the server ({event.error_code!r})"))
                self._released()
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                changed = event.changed_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
                if changed is not None:
                    self.max_streams = max(1, changed.new_value)
                    self._released()
            elif isinstance(event, h2.events.WindowUpdated):
                self.window.set()
            elif isinstance(event, h2.events.ConnectionTerminated):
                self._goaway(event)
        data = self.h2.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def _flush_soon(self) -> None:
        """Write what h2 queued once per loop iteration: concurrent requests share one system call."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- streams ---------------------------------------------------------------------------------

    def _finish(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None and not stream.future.done():
            stream.future.set_result(Response(stream.status, stream.headers, bytes(stream.body)))
        self._released()

    def _released(self) -> None:
        if len(self.streams) < self.max_streams:
            self.capacity.set()

    def _goaway(self, event: h2.events.ConnectionTerminated) -> None:
        """GOAWAY: streams past `last_stream_id` were never processed; the rest may still finish."""
        self.closed = True
        if event.additional_data:
            try:  # APNs puts {"reason": ...} in the GOAWAY payload
                self.goaway_reason = json.loads(event.additional_data).get("reason")
            except (ValueError, AttributeError):
                pass
        last = event.last_stream_id or 0
        for sid in [s for s in self.streams if s > last]:
            stream = self.streams.pop(sid)
            if not stream.future.done():
                stream.future.set_exception(StreamRefused(f"GOAWAY before processing ({self.goaway_reason})"))
        self.capacity.set()  # waiters move on to a new connection
        if not self.streams:
            self.transport.close()

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

    async def request(self, headers: list[tuple[str, str]], body: bytes) -> Response:
        while len(self.streams) >= self.max_streams and not self.closed:
            self.capacity.clear()
            await self.capacity.wait()
        if self.closed:
            raise StreamRefused("connection closing")
        stream_id = self.h2.get_next_available_stream_id()
        future = asyncio.get_running_loop().create_future()
        self.streams[stream_id] = _Stream(future)
        try:
            self.h2.send_headers(stream_id, headers, end_stream=not body)
            sent = 0
            while sent < len(body):
                window = min(self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
                if window <= 0:
                    self.transport.write(self.h2.data_to_send())
                    self.window.clear()
                    await self.window.wait()
                    if self.closed:
                        raise Http2Error("connection lost while sending")
                    continue
                chunk = body[sent:sent + window]
                sent += len(chunk)
                self.h2.send_data(stream_id, chunk, end_stream=sent >= len(body))
            self._flush_soon()
            return await future
        except h2.exceptions.ProtocolError as exc:
            self.streams.pop(stream_id, None)
            self._released()
            raise Http2Error(f"cannot send: {exc}") from None
        except asyncio.CancelledError:
            # Timed out or abandoned: tell the server, so the stream's slot is freed on both sides.
            if self.streams.pop(stream_id, None) is not None and not self.closed:
                try:
                    self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                    self.transport.write(self.h2.data_to_send())
                except h2.exceptions.ProtocolError:
                    pass
                self._released()
            raise


class Http2Client:
    """Requests to one https:// origin over one long-lived HTTP/2 connection, made on first use."""

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext, *, connect_timeout: float = 10.0):
        parts = urlsplit(base_url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("an https:// URL is required")
        self.host = parts.hostname
        self.port = parts.port or 443
        self.authority = parts.netloc
        self.ssl_context = ssl_context
        self.ssl_context.set_alpn_protocols(["h2"])
        self.connect_timeout = connect_timeout
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
                raise ConnectFailed(f"cannot connect to {self.authority}: {exc or 'timed out'}") from None
            self._conn = conn
            self.connections_made += 1
            return conn

    async def request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                      timeout: float) -> Response:
        """One request; Http2Error (or asyncio.TimeoutError after `timeout` seconds) if no response came."""
        all_headers = [(":method", method), (":scheme", "https"), (":authority", self.authority),
                       (":path", path), *headers]
        async with asyncio.timeout(timeout):
            conn = await self._connection()
            return await conn.request(all_headers, body)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            try:
                conn.h2.close_connection()
                conn.transport.write(conn.h2.data_to_send())
            except h2.exceptions.ProtocolError:
                pass
            conn.transport.close()
            try:  # let the TLS close finish while the loop still runs
                await asyncio.wait_for(asyncio.shield(conn.lost), 2)
            except asyncio.TimeoutError:
                conn.transport.abort()
