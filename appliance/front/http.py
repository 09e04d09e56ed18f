"""HTTP/1.1 connections (h11) guarded for the open internet; websocket upgrades handed over.

- Request heads are bounded whatever the client does: a request line over 16 KiB gets 414, a head
  over 64 KiB or 100 header lines gets 431, and a head not complete 10 s after it began (a
  trickling "slowloris" client, a websocket handshake that never finishes, an idle keep-alive
  connection) closes the connection. The bytes are counted as they arrive, before any parsing.
- Open connections per client address are capped (`Guard.peers`): the TCP peer here, or, behind
  a trusted proxy (loopback or `trusted_proxies`), the address it forwards, counted by the app.
- Every other request goes to an ASGI application (the dashboard, NIP-11, NIP-86, the gateway),
  one at a time per connection; a request body is read no faster than the application takes it.
- A websocket handshake (`GET` with `Upgrade: websocket`) is checked by `websockets`' sans-I/O
  `ServerProtocol` and handed to the site's websocket handler as a `WebSocketRequest`, which it
  accepts (the connection becomes an `appliance.front.websocket.WebSocketConnection`) or denies
  with an HTTP answer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Awaitable, Callable
from urllib.parse import unquote, urlsplit

import h11
from starlette.datastructures import Address, Headers
from websockets.datastructures import Headers as HandshakeHeaders
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request as HandshakeRequest
from websockets.http11 import Response as HandshakeResponse
from websockets.server import ServerProtocol

from appliance.front.websocket import _PROTOCOL_LOG, Counters, WebSocketConnection

log = logging.getLogger("appliance.front")

# Limits on a request head (request line + headers). A websocket handshake is about 500 bytes.
DEFAULT_MAX_REQUEST_LINE = 16 * 1024
DEFAULT_MAX_HEAD = 64 * 1024
DEFAULT_MAX_HEADERS = 100
# Seconds a request head may take to arrive, from its first byte (or the connection's start, or
# the end of the previous response on a kept-alive connection).
DEFAULT_HEAD_TIMEOUT = 10.0
# Bytes of a request body held for the application before the socket is read no more.
DEFAULT_BODY_BUFFER = 64 * 1024
# A response sent before its request's body was read whole ends the connection; what the client
# still sends of that body is read and dropped for a little while (up to so many bytes) first:
# closed at once, with its bytes unread, the connection would be reset, and the client might lose
# the response it had not read yet.
DEFAULT_LINGER_SECONDS = 2.0
DEFAULT_LINGER_BYTES = 1024 * 1024

_STATUS = {
    400: b"HTTP/1.1 400 Bad Request\r\n",
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    414: b"HTTP/1.1 414 URI Too Long\r\n",
    429: b"HTTP/1.1 429 Too Many Requests\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
}
_ASGI = {"version": "3.0", "spec_version": "2.4"}


class Guard:
    """What the connections of one server share: limits, the per-address counter, counters."""

    def __init__(self, peers, *, max_line: int = DEFAULT_MAX_REQUEST_LINE, max_head: int = DEFAULT_MAX_HEAD,
                 max_headers: int = DEFAULT_MAX_HEADERS, head_timeout: float = DEFAULT_HEAD_TIMEOUT):
        self.peers = peers  # appliance.relay.peers.PeerLimits
        self.max_line = max_line
        self.max_head = max_head
        self.max_headers = max_headers
        self.head_timeout = head_timeout
        self.refused = {414: 0, 431: 0, 408: 0, 429: 0}
        self.websocket = Counters()

    @property
    def invalid_utf8(self) -> int:
        return self.websocket.invalid_utf8


@dataclass
class Site:
    """What one listening socket serves."""

    app: Callable  # the ASGI application for HTTP requests
    guard: Guard
    # The websocket handler, `await websocket(request)`; None: websocket handshakes go to `app`
    # as plain requests (and are refused there).
    websocket: Callable[["WebSocketRequest"], Awaitable[None]] | None = None
    max_message_size: int | None = 1 << 20
    compression: bool = False
    ping_interval: float | None = 30.0
    # Whether each websocket accepted is logged at INFO with the client's address (the
    # log_client_addresses setting); else a DEBUG line without it.
    log_client_addresses: bool = False
    state: dict = field(default_factory=dict)  # the ASGI lifespan state
    connections: set = field(default_factory=set)  # open HTTP connections (not upgraded)
    websockets: set = field(default_factory=set)  # open websocket connections
    tasks: set = field(default_factory=set)  # running requests and websocket handlers


def _address(pair) -> tuple[str, int] | None:
    if isinstance(pair, tuple) and len(pair) >= 2:
        return str(pair[0]), int(pair[1])
    return None


class HttpConnection(asyncio.Protocol):
    """One TCP connection, speaking HTTP/1.1 until (and unless) it becomes a websocket."""

    def __init__(self, site: Site):
        self.site = site
        self.guard = site.guard
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=site.guard.max_head + 4096)
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.ip_slot: str | None = None
        self.head_timer: asyncio.TimerHandle | None = None
        self.in_head = False
        self.cycle: _Cycle | None = None
        self.upgraded = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.read_paused = False
        self.closed = False
        self.lingering = -1  # bytes dropped since a response ended the connection (-1: none did)

    # -- the connection --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.client = _address(transport.get_extra_info("peername"))
        self.server = _address(transport.get_extra_info("sockname"))
        self.site.connections.add(self)
        peer = self.client[0] if self.client else ""
        peers = self.guard.peers
        if peer and not peers.is_trusted(peer):
            if peers.barred(peer) or not peers.acquire(peer):
                self._refuse(429)
                return
            self.ip_slot = peer
        self._begin_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.site.connections.discard(self)
        self._cancel_head_timer()
        if not self.upgraded:
            self._release_slot()
        self.writable.set()
        if self.cycle is not None:
            self.cycle.disconnected()

    def _release_slot(self) -> None:
        if self.ip_slot is not None:
            self.guard.peers.release(self.ip_slot)
            self.ip_slot = None

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def shutdown(self) -> None:
        """The server stops: an idle connection closes now, a busy one after its response."""
        if self.cycle is None:
            self.transport.close()
        else:
            self.cycle.keep_alive = False

    # -- the head of each request ----------------------------------------------------------------

    def _begin_head(self) -> None:
        self.in_head = True
        self.head_bytes = 0
        self.head_newlines = 0
        self.line_bytes = 0  # bytes of the request line so far (until its first newline)
        self.line_done = False
        self.head_tail = b""
        self.head_raw = bytearray()  # the head's bytes (a websocket handshake is parsed from them)
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(self.guard.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.in_head and not self.transport.is_closing():
            self._refuse(408 if self.head_bytes else None)

    def _refuse(self, status: int | None) -> None:
        """Answer `status` (None: say nothing) and close; nothing more is parsed."""
        self.in_head = False
        self._cancel_head_timer()
        if status is not None:
            if status in self.guard.refused:
                self.guard.refused[status] += 1
            try:
                self.transport.write(_STATUS[status] + b"content-length: 0\r\nconnection: close\r\n\r\n")
            except RuntimeError:  # our end of the stream was closed already (`_linger`)
                pass
        self.transport.close()

    def _check_head(self, data: bytes) -> bool:
        """Account `data` to the current head; False (connection refused) past a limit."""
        g = self.guard
        window = self.head_tail + data
        end = window.find(b"\r\n\r\n")
        part = data if end < 0 else data[: max(0, end + 4 - len(self.head_tail))]
        if not self.line_done:
            nl = part.find(b"\n")
            self.line_bytes += len(part) if nl < 0 else nl
            if nl >= 0:
                self.line_done = True
            if self.line_bytes > g.max_line:
                self._refuse(414)
                return False
        self.head_bytes += len(part)
        self.head_newlines += part.count(b"\n")
        if self.head_bytes > g.max_head or self.head_newlines > g.max_headers + 1:
            self._refuse(431)
            return False
        if end >= 0:
            self.in_head = False  # until the next request on this connection
            self._cancel_head_timer()
        else:
            self.head_tail = window[-3:]
        return True

    # -- requests --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if self.lingering >= 0:
            self.lingering += len(data)
            if self.lingering > DEFAULT_LINGER_BYTES:
                self.transport.close()
            return
        if self.in_head:
            self.head_raw += data
            if not self._check_head(data):
                return
        self.h11.receive_data(data)
        self._events()

    def eof_received(self) -> bool | None:
        if self.lingering >= 0 or self.transport.is_closing():
            self.transport.close()
            return None
        self.h11.receive_data(b"")
        self._events()
        return None

    def _events(self) -> None:
        conn = self.h11
        while not self.transport.is_closing():
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._bad_request(exc.error_status_hint)
                return
            if event is h11.NEED_DATA:
                break
            if event is h11.PAUSED:
                self._pause_reading()  # the next request waits until this one is answered
                break
            if isinstance(event, h11.Request):
                self._cancel_head_timer()
                self.in_head = False
                if self.site.websocket is not None and _is_websocket(event):
                    self._upgrade(event)
                    return
                self._start(event)
            elif isinstance(event, h11.Data):
                cycle = self.cycle
                if cycle is not None:
                    cycle.body_received(event.data)
                    if cycle.buffered > DEFAULT_BODY_BUFFER:
                        self._pause_reading()
            elif isinstance(event, h11.EndOfMessage):
                if self.cycle is not None:
                    self.cycle.body_done()
            elif isinstance(event, h11.ConnectionClosed):
                self.transport.close()
                break

    def _bad_request(self, status: int) -> None:
        if self.cycle is not None and self.cycle.started:
            self.transport.close()
            return
        if status not in _STATUS:
            status = 400
        self._refuse(status)

    def _pause_reading(self) -> None:
        if not self.read_paused and not self.transport.is_closing():
            self.read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.read_paused and not self.transport.is_closing():
            self.read_paused = False
            self.transport.resume_reading()

    def _start(self, request: h11.Request) -> None:
        target = request.target
        if not target.startswith(b"/"):  # absolute form (or `*`)
            split = urlsplit(target.decode("latin-1"))
            query = b"?" + split.query.encode("latin-1") if split.query else b""
            target = (split.path or "/").encode("latin-1") + query
        raw_path, _, query = target.partition(b"?")
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.http_version.decode(),
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": request.method.decode("ascii"),
            "root_path": "",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "headers": [(name, value) for name, value in request.headers],
            "state": self.site.state.copy(),
        }
        cycle = self.cycle = _Cycle(self, scope, head=request.method == b"HEAD")
        task = self.loop.create_task(cycle.run(self.site.app))
        self.site.tasks.add(task)
        task.add_done_callback(self.site.tasks.discard)

    def _cycle_done(self, cycle: "_Cycle") -> None:
        """A response was sent whole: on to the next request, or close."""
        self.cycle = None
        conn = self.h11
        if self.transport.is_closing():
            return
        if conn.their_state is h11.SEND_BODY:
            self._linger()  # (a request body the application did not read whole)
            return
        if not cycle.keep_alive or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            self.transport.close()
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            self.transport.close()
            return
        self._begin_head()
        self._resume_reading()
        pending, _closed = conn.trailing_data
        if pending:
            # A pipelined request read already: its bytes count toward its head's limits.
            self.head_raw += pending
            if self._check_head(bytes(pending)):
                self._events()
        elif _closed:
            self.transport.close()

    def _linger(self) -> None:
        """End the connection after a response its request's body did not get to: the response
        is followed by our end of the stream, and the rest of the body is dropped as it comes,
        for a little while (see DEFAULT_LINGER_SECONDS)."""
        self.lingering = 0
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(DEFAULT_LINGER_SECONDS, transport.close)
        self._resume_reading()

    # -- websockets ------------------------------------------------------------------------------

    def _upgrade(self, request: h11.Request) -> None:
        conn = self.h11
        while True:  # the handshake has no body: on to the point where h11 waits for the switch
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                self._refuse(400)
                return
            if event is h11.PAUSED:
                break
            if not isinstance(event, h11.EndOfMessage):
                self._refuse(400)
                return
        trailing, _closed = conn.trailing_data
        site = self.site
        extensions = []
        if site.compression:
            # As before (uvicorn's defaults): 4 KiB windows both ways, a small compressor.
            extensions.append(ServerPerMessageDeflateFactory(server_max_window_bits=12, client_max_window_bits=12,
                                                            compress_settings={"memLevel": 5}))
        protocol = ServerProtocol(extensions=extensions, max_size=site.max_message_size, logger=_PROTOCOL_LOG)
        # The protocol reads the handshake itself, from the head's own bytes (h11 found it).
        head = bytes(self.head_raw[:len(self.head_raw) - len(trailing)])
        protocol.receive_data(head)
        events = protocol.events_received()
        if len(events) != 1 or not isinstance(events[0], HandshakeRequest):
            # (its own parser's limits: a line over 8 KiB, 128 headers)
            self.transport.write(b"".join(protocol.data_to_send()) or _STATUS[400] + b"content-length: 0\r\n\r\n")
            self.transport.close()
            return
        response = protocol.accept(events[0])
        if response.status_code != 101:
            log.debug("refused a websocket handshake: %d %s", response.status_code,
                      (response.body or b"").decode("utf-8", "replace").strip().replace("\n", " "))
            protocol.send_response(response)
            self.transport.write(b"".join(protocol.data_to_send()))
            self.transport.close()
            return
        self._pause_reading()
        self.upgraded = True
        raw_path, _, query = request.target.partition(b"?")
        handshake = WebSocketRequest(self, protocol, response, bytes(trailing), raw_path, query,
                                     [(name, value) for name, value in request.headers])
        task = self.loop.create_task(handshake.run(site.websocket))
        site.tasks.add(task)
        task.add_done_callback(site.tasks.discard)


def _is_websocket(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"upgrade" and b"websocket" in value.lower():
            return True
    return False


class WebSocketRequest:
    """A websocket handshake checked and waiting for the application: `accept()` or `deny()`.

    `path`, `headers` (case-insensitive, `getlist`), `client` (`.host`, `.port`), `server` and
    `scheme` describe the request as ASGI would."""

    def __init__(self, http: HttpConnection, protocol: ServerProtocol, response: HandshakeResponse,
                 trailing: bytes, raw_path: bytes, query: bytes, raw_headers: list):
        self._http = http
        self._protocol = protocol
        self._response = response
        self._trailing = trailing
        self.raw_path = raw_path
        self.path = unquote(raw_path.decode("latin-1"))
        self.query_string = query
        self.headers = Headers(raw=raw_headers)
        self.client = Address(*http.client) if http.client else None
        self.server = http.server
        self.scheme = "ws"
        self.scope = {"type": "websocket", "path": self.path, "server": self.server,
                      "client": http.client, "scheme": self.scheme}
        self.answered = False
        self.connection: WebSocketConnection | None = None

    def accept(self) -> WebSocketConnection:
        """Complete the handshake (101): the connection is a websocket from now on."""
        assert not self.answered
        self.answered = True
        http = self._http
        transport = http.transport
        protocol = self._protocol
        site = http.site
        protocol.send_response(self._response)
        slot, http.ip_slot = http.ip_slot, None
        guard = http.guard

        def release() -> None:
            if slot is not None:
                guard.peers.release(slot)

        ws = WebSocketConnection(protocol, transport, counters=guard.websocket, connections=site.websockets,
                                 on_end=release, ping_interval=site.ping_interval,
                                 deflate="Sec-WebSocket-Extensions" in self._response.headers)
        ws.read_paused = http.read_paused
        if not http.writable.is_set():
            ws.writable.clear()
        transport.set_protocol(ws)
        site.connections.discard(http)
        transport.write(b"".join(protocol.data_to_send()))
        ws.unparsed += self._trailing
        if transport.is_closing():  # lost meanwhile
            ws.connection_lost(None)
        self.connection = ws
        client = http.client
        if site.log_client_addresses and client:  # the operator asked for addresses (INFO)
            log.info('%s:%d - "WebSocket %s" [accepted]', client[0], client[1], self.path)
        else:
            log.debug('client - "WebSocket %s" [accepted]', self.path)
        return ws

    def deny(self, status: int, body: bytes = b"", headers: list[tuple[str, str]] | None = None,
             content_type: str = "text/plain; charset=utf-8") -> None:
        """Answer the handshake with an HTTP response instead, and close."""
        assert not self.answered
        self.answered = True
        http = self._http
        fields = HandshakeHeaders([("Content-Type", content_type), ("Content-Length", str(len(body))),
                                   ("Connection", "close"), *(headers or [])])
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        if not http.transport.is_closing():
            http.transport.write(HandshakeResponse(status, phrase, fields, body).serialize())
            http.transport.close()

    async def run(self, handler: Callable[["WebSocketRequest"], Awaitable[None]]) -> None:
        try:
            await handler(self)
        except Exception:
            log.exception("websocket handler failed")
            if not self.answered:
                self.deny(500, b"Internal Server Error\n")
        else:
            if not self.answered:
                self.deny(403)
        ws = self.connection
        if ws is not None and not ws.close_sent and not ws.disconnected:
            ws.close(1000)


class _Cycle:
    """One HTTP request and its response, between the connection and the ASGI application."""

    def __init__(self, http: HttpConnection, scope: dict, head: bool):
        self.http = http
        self.scope = scope
        self.head = head
        self.body: list[bytes] = []
        self.buffered = 0
        self.more_body = True
        self.arrived = asyncio.Event()
        self.finished = asyncio.Event()  # the response was sent whole, or the client is gone
        self.gone = False
        self.started = False
        self.complete = False
        self.keep_alive = True
        self.status = 200
        self.headers: list = []
        self.continued = False

    # from the connection
    def body_received(self, data: bytes) -> None:
        self.body.append(bytes(data))
        self.buffered += len(data)
        self.arrived.set()

    def body_done(self) -> None:
        self.more_body = False
        self.arrived.set()

    def disconnected(self) -> None:
        self.gone = True
        self.arrived.set()
        self.finished.set()

    # the application's side
    async def receive(self) -> dict:
        http = self.http
        if not self.continued and self.more_body and not self.body:
            self.continued = True
            if http.h11.client_is_waiting_for_100_continue and not self.gone:
                http.transport.write(http.h11.send(h11.InformationalResponse(status_code=100, headers=[])))
        if self.complete or self.gone:
            await self.finished.wait()
            return {"type": "http.disconnect"}
        while not self.body and self.more_body and not self.gone:
            self.arrived.clear()
            http._resume_reading()
            await self.arrived.wait()
        if self.gone:
            return {"type": "http.disconnect"}
        chunk = b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        if self.more_body:
            http._resume_reading()
        else:
            self.complete = True  # the whole body was given; next, wait for the disconnect
        return {"type": "http.request", "body": chunk, "more_body": self.more_body}

    async def send(self, message: dict) -> None:
        http = self.http
        kind = message["type"]
        if self.gone:
            return
        if not http.writable.is_set():
            await http.writable.wait()
            if self.gone:
                return
        conn = http.h11
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("the response was started already")
            self.status = message["status"]
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            self.started = True
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started:
            raise RuntimeError("the response body came before its start")
        if self.finished.is_set():
            return
        out = []
        if self.status is not None:
            headers = self.headers
            if self.more_body:
                # Answered before its body was read whole (a body refused as too large): the
                # connection cannot carry another request; the client is told so.
                self.keep_alive = False
            if not self.keep_alive:
                headers = [*headers, (b"connection", b"close")]
            out.append(conn.send(h11.Response(status_code=self.status, headers=headers)))
            self.status = None
        body = message.get("body", b"")
        if body and not self.head:
            out.append(conn.send(h11.Data(data=body)))
        if not message.get("more_body", False):
            out.append(conn.send(h11.EndOfMessage()))
        data = b"".join(x for x in out if x)
        if data:
            http.transport.write(data)
        if not message.get("more_body", False):
            self.finished.set()
            self.complete = True
            http._cycle_done(self)

    async def run(self, app) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except Exception:
            log.exception("exception in the ASGI application")
            if not self.started and not self.gone:
                self.started = True
                self.headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"22")]
                self.status = 500
                self.keep_alive = False
                await self.send({"type": "http.response.body", "body": b"Internal Server Error\n"})
            elif not self.finished.is_set():
                self.http.transport.close()
        else:
            if not self.finished.is_set() and not self.gone:
                if not self.started:
                    log.error("the ASGI application returned without a response")
                    self.started = True
                    self.status = 500
                    self.headers = [(b"content-length", b"0")]
                    self.keep_alive = False
                    await self.send({"type": "http.response.body", "body": b""})
                else:
                    self.http.transport.close()
        finally:
            self.finished.set()

