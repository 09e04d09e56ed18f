"""The HTTP and websocket server: uvicorn, configured and guarded for the open internet.

- Request heads are bounded whatever the client does: a request line over 16 KiB gets 414, a head
  over 64 KiB or 100 header lines gets 431, and a head not complete 10 s after it began (a
  trickling "slowloris" client, or a websocket handshake that never finishes) closes the
  connection. uvicorn's httptools parser alone bounds none of these (it buffers a line or a header
  value that never ends); h11 would bound the total only, and costs more per request.
- Open connections per client address are capped (`max_connections_per_ip`): the TCP peer here,
  or, behind a trusted proxy (loopback or `trusted_proxies`), the address it forwards, counted by
  the app (`appliance.app`).
- A websocket client's stream is parsed into messages a few KiB at a time, the next piece once
  the app has taken every message parsed so far: one read from a client that pipelines (up to
  256 KiB: thousands of small frames) is not parsed in one go, which held the event loop, and
  every other client, for tens of milliseconds (issue #14).
- A text frame that is not UTF-8 is closed with 1007 by uvicorn, which also logs a traceback at
  ERROR for each one: here it is one DEBUG line and a counter, so a client cannot fill the log.
- SIGTERM: the relay first stops taking new work, lets the writer commit what is in flight, sends
  every pending OK and closes each websocket with 1001 (closing handshake included); then
  uvicorn's own shutdown runs. A second SIGTERM (or SIGINT) ends the process at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from appliance.app import Appliance, asgi
from appliance.errors import ApplianceError
from appliance.relay.peers import PeerLimits
from appliance.settings import Settings

log = logging.getLogger("appliance.server")

# Limits on a request head (request line + headers). A websocket handshake is about 500 bytes.
DEFAULT_MAX_REQUEST_LINE = 16 * 1024
DEFAULT_MAX_HEAD = 64 * 1024
DEFAULT_MAX_HEADERS = 100
# Seconds a request head may take to arrive, from its first byte (or the connection's start).
DEFAULT_HEAD_TIMEOUT = 10.0
# Seconds SIGTERM waits for in-flight events and for clients to answer the close frame.
DEFAULT_SHUTDOWN_GRACE = 10.0
# Bytes of a websocket client's stream parsed into messages at a time (see GuardedWebSocketProtocol).
# uvloop reads up to 256 KiB at once; parsed whole, a read of a pipelining client's small frames
# (a REQ/CLOSE flood: about 3,800 frames in 125 KiB) held the loop for 23 ms on the 2-core box,
# and every other client waited that long. 4 KiB is at most about 500 of the smallest frames,
# typically 10-100 messages; an ordinary client's read is smaller and is parsed as it comes.
DEFAULT_WS_PARSE_BYTES = 4 * 1024

_STATUS = {
    414: b"HTTP/1.1 414 URI Too Long\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    429: b"HTTP/1.1 429 Too Many Requests\r\n",
}


class Guard:
    """What the protocol classes share: limits, the per-address counter, counters for metrics."""

    def __init__(self, peers: PeerLimits, *, max_line: int = DEFAULT_MAX_REQUEST_LINE, max_head: int = DEFAULT_MAX_HEAD,
                 max_headers: int = DEFAULT_MAX_HEADERS, head_timeout: float = DEFAULT_HEAD_TIMEOUT):
        self.peers = peers
        self.max_line = max_line
        self.max_head = max_head
        self.max_headers = max_headers
        self.head_timeout = head_timeout
        self.refused = {414: 0, 431: 0, 408: 0, 429: 0}
        self.invalid_utf8 = 0


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads, a head timeout and a per-address cap."""

    guard: Guard  # set on the subclass built for one server (see `protocol_classes`)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.ip_slot: str | None = None
        peer = self.client[0] if self.client else ""
        peers = self.guard.peers
        if peer and not peers.is_trusted(peer):
            if peers.barred(peer) or not peers.acquire(peer):
                self._refuse(429)
                return
            self.ip_slot = peer
        self._begin_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release_slot()
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _release_slot(self) -> None:
        if self.ip_slot is not None:
            self.guard.peers.release(self.ip_slot)
            self.ip_slot = None

    # -- the head of each request ------------------------------------------------------------

    def _begin_head(self) -> None:
        self.in_head = True
        self.head_bytes = 0
        self.head_newlines = 0
        self.line_bytes = 0  # bytes of the request line so far (until its first newline)
        self.line_done = False
        self.head_tail = b""
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(self.guard.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "head_timer", None)
        if timer is not None:
            timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.in_head and not self.transport.is_closing():
            # Idle keep-alive connections end here too (uvicorn's own keep-alive timeout is shorter).
            self._refuse(408 if self.head_bytes else None)

    def _refuse(self, status: int | None) -> None:
        """Answer `status` (None: say nothing) and close; nothing more is parsed."""
        self.in_head = False
        self._cancel_head_timer()
        if status is not None:
            self.guard.refused[status] += 1
            self.transport.write(_STATUS[status] + b"content-length: 0\r\nconnection: close\r\n\r\n")
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if self.in_head and not self._check_head(data):
            return
        super().data_received(data)

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
            self.in_head = False  # until the next request on this connection (on_message_complete)
            self._cancel_head_timer()
        else:
            self.head_tail = window[-3:]
        return True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if not self.transport.is_closing():
            self._begin_head()

    def handle_websocket_upgrade(self) -> None:
        self._cancel_head_timer()
        self.in_head = False
        slot, self.ip_slot = self.ip_slot, None
        super().handle_websocket_upgrade()
        # The websocket protocol now owns the transport: it releases the address slot at its end.
        protocol = self.transport.get_protocol()
        if slot is not None:
            if isinstance(protocol, GuardedWebSocketProtocol):
                protocol.ip_slot = slot
            else:
                self.guard.peers.release(slot)


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O websocket protocol that releases its address slot, logs bad UTF-8
    quietly, and parses what a client sent DEFAULT_WS_PARSE_BYTES at a time.

    uvicorn parses a whole read at once, queues every message in it for the app, and reads again
    once the app has taken them all. Here, past the handshake, a read is parsed a piece at a time:
    a piece, then (once it has given the app a message) nothing more until the app has taken every
    message queued; the rest of the read waits in `unparsed`, and the socket is not read meanwhile
    (the client's further messages wait in its own socket, as before). The order of messages,
    control frames and the client's close is unchanged, and what was read before the connection
    was lost is still parsed and handed over before the app hears of the disconnect; once the app
    has closed, everything read is parsed as it comes (messages are dropped then), so the
    client's answer to the close frame is not held up."""

    guard: Guard
    ip_slot: str | None = None
    unparsed: memoryview | None = None  # the rest of the last read, not parsed yet

    def data_received(self, data: bytes) -> None:
        if not self.handshake_complete or (len(data) <= DEFAULT_WS_PARSE_BYTES and self.unparsed is None):
            super().data_received(data)
            return
        self.unparsed = memoryview(data if self.unparsed is None else bytes(self.unparsed) + data)
        self._parse_some()

    def _parse_some(self) -> None:
        """Parse pieces of `unparsed` until one gives the app a message (or nothing is left); all
        of it once the app has closed (messages are dropped then, and the client's answer to the
        close frame is behind them)."""
        if self.close_sent and self.unparsed is not None:
            rest, self.unparsed = self.unparsed, None
            super().data_received(bytes(rest))
            return
        queue = self.queue
        while self.unparsed is not None and queue.empty():
            rest = self.unparsed
            self.unparsed = rest[DEFAULT_WS_PARSE_BYTES:] if len(rest) > DEFAULT_WS_PARSE_BYTES else None
            super().data_received(bytes(rest[:DEFAULT_WS_PARSE_BYTES]))
        if self.unparsed is not None and not self.read_paused:
            self.read_paused = True  # nothing more is read while part of a read is unparsed
            self.transport.pause_reading()

    async def send(self, message) -> None:
        await super().send(message)
        if self.close_sent and self.unparsed is not None:
            # The app closed with part of a read unparsed (it stops receiving once it closes): the
            # client's own close frame may be in there, and its answer ends the connection now,
            # not at the close timeout.
            self._parse_some()

    async def receive(self):
        message = await self.queue.get()
        if self.queue.empty():
            if self.unparsed is not None:
                self._parse_some()
            if self.read_paused and self.unparsed is None and self.queue.empty():
                self.read_paused = False
                self.transport.resume_reading()
        return message

    def connection_lost(self, exc: Exception | None) -> None:
        if self.unparsed is not None:  # what was read still reaches the app, before the disconnect
            rest, self.unparsed = self.unparsed, None
            super().data_received(bytes(rest))
        if self.ip_slot is not None:
            self.guard.peers.release(self.ip_slot)
            self.ip_slot = None
        super().connection_lost(exc)


class QuietInvalidUtf8(logging.Filter):
    """uvicorn logs every non-UTF-8 text frame as an ERROR with a traceback: count it, keep one
    DEBUG line without the traceback, drop the rest."""

    MESSAGE = "Invalid UTF-8 sequence received from client."

    def __init__(self, guard: Guard):
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        self.guard.invalid_utf8 += 1
        log.debug("closed a websocket (1007): a text frame was not UTF-8 (%d so far)", self.guard.invalid_utf8)
        return False


def protocol_classes(guard: Guard) -> tuple[type, type]:
    """Protocol classes bound to `guard` (one pair per server, so tests can run several)."""
    http = type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"guard": guard})
    ws = type("GuardedWebSocketProtocol", (GuardedWebSocketProtocol,), {"guard": guard})
    return http, ws


def second_signal_exits_at_once() -> None:
    """After the first SIGTERM/SIGINT, the next one ends the process at once: the kernel's default
    action, which needs no Python code to run (the graceful stop may be waiting on a thread or a
    slow client). SQLite's WAL keeps every committed transaction through it."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


class ApplianceServer(uvicorn.Server):
    """uvicorn's server with the relay's graceful stop before uvicorn's own shutdown."""

    def __init__(self, config: uvicorn.Config, appliance: Appliance):
        super().__init__(config)
        self.appliance = appliance

    def handle_exit(self, sig: int, frame) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and sig in (signal.SIGINT, signal.SIGTERM):
            log.info("stopping: finishing in-flight work (a second signal exits at once)")
            second_signal_exits_at_once()

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if sockets is not None and self.started:
            self._log_started_message(sockets)  # uvicorn says it only for sockets it bound itself

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:  # stop accepting first
            server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEFAULT_SHUTDOWN_GRACE
        try:
            await self.appliance.relay.shutdown(DEFAULT_SHUTDOWN_GRACE)
        except Exception:  # the rest of the shutdown must run
            log.exception("graceful relay shutdown failed")
        # Each client answers our close frame: closing the socket before that, with its messages
        # still arriving, would reset the connection and throw away the last OKs it had not read.
        while loop.time() < deadline and any(
                isinstance(c, WebSocketsSansIOProtocol) for c in self.server_state.connections):
            await asyncio.sleep(0.01)
        await super().shutdown(sockets)


def build_server(settings: Settings, app: Appliance, cls: type = ApplianceServer) -> ApplianceServer:
    """The configured uvicorn server for `app`."""
    guard = Guard(app.peers)
    http_class, ws_class = protocol_classes(guard)
    config = uvicorn.Config(
        asgi(app),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        http=http_class,
        ws=ws_class,
        # Frames up to twice the limit are read so the client gets a NOTICE; beyond that, close 1009.
        ws_max_size=settings.max_message_length * 2,
        ws_per_message_deflate=settings.ws_compression,
        ws_ping_interval=30,
        ws_ping_timeout=30,
        lifespan="on",
        access_log=False,  # request lines carry the dashboard's one-time setup token and users' addresses
        proxy_headers=False,  # X-Forwarded-For is read by the app, from trusted proxies only
        server_header=False,
        timeout_graceful_shutdown=DEFAULT_SHUTDOWN_GRACE,
    )
    config.load()
    logging.getLogger("uvicorn.error").addFilter(QuietInvalidUtf8(guard))
    app.guard = guard
    return cls(config, app)


class ListenError(ApplianceError):
    """A listening address cannot be bound (another process holds it, or it is not ours to take)."""

    def __init__(self, host: str, port: int, exc: OSError):
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.in_use = exc.errno == errno.EADDRINUSE
        why = "address already in use" if self.in_use else (exc.strerror or str(exc)).lower()
        super().__init__(f"cannot listen on {self.address}: {why}")


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (0: a free port), as uvicorn would bind it, but not listening
    yet: the server listens once it serves (connections are refused until then, not queued).
    Bound before anything is printed or created, so an address in use stops the start first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(host, port, exc) from None
    return sock


class _SignalsElsewhere:
    """Mixin: `run_with_gateway_listener` owns SIGINT/SIGTERM and stops both servers itself."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class _MainServer(_SignalsElsewhere, ApplianceServer):
    pass


class _GatewayServer(_SignalsElsewhere, uvicorn.Server):
    pass


def run_with_gateway_listener(settings: Settings, app: Appliance) -> None:
    """The main listener plus the gateway's own (`gateway_listen`) in one event loop: SIGTERM or
    SIGINT stops both (the relay's graceful shutdown first), then the process exits. Listens on
    the sockets the CLI bound (`app.sockets`), or binds them here."""
    from appliance.app import gateway_asgi
    from appliance.errors import ConfigError
    from appliance.gateway.config import parse_listen

    listen = app.gateway.config.listen
    sock = app.sockets.get("gateway")
    if sock is None:
        host, port = parse_listen(listen, "gateway_listen")
        try:
            family, _type, _proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except OSError as exc:
            raise ConfigError("gateway_listen", listen, f"cannot listen there: {exc.strerror or exc}") from None
    relay_sockets = [app.sockets["relay"]] if "relay" in app.sockets else None
    server = build_server(settings, app, cls=_MainServer)
    http_class, _ws = protocol_classes(Guard(app.peers))  # the same head limits and per-address cap
    config = uvicorn.Config(gateway_asgi(app), log_level=settings.log_level, http=http_class, ws="none",
                            lifespan="off", proxy_headers=False, server_header=False,
                            timeout_graceful_shutdown=DEFAULT_SHUTDOWN_GRACE)
    gateway = _GatewayServer(config)

    async def both() -> None:
        def stop() -> None:
            server.should_exit = gateway.should_exit = True
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            log.info("stopping: finishing in-flight work (a second signal exits at once)")
            second_signal_exits_at_once()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        task = asyncio.create_task(gateway.serve(sockets=[sock]))
        try:
            await server.serve(sockets=relay_sockets)
        finally:
            gateway.should_exit = True
            await task

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(both())
