"""The appliance's server: its own HTTP/1.1 and websocket front (appliance.front) serving the
relay and the ASGI application, guarded for the open internet, with the relay's graceful stop.

- Request heads are bounded (414, 431, a 10 s head timeout), open connections per client address
  are capped, and bodies are read no faster than the application takes them (appliance.front.http).
- Relay connections are websockets of our own (appliance.front.websocket, over `websockets`'
  sans-I/O protocol): a client's stream is parsed a few KiB at a time as the relay takes its
  messages, a text frame that is not UTF-8 closes the connection with 1007 quietly (one DEBUG
  line and a counter), and the relay's sessions write frames to it directly.
- SIGTERM (or SIGINT): the relay first stops taking new work, lets the writer commit what is in
  flight, sends every pending OK and closes each websocket with 1001 (closing handshake
  included); then the HTTP connections close and the application's shutdown runs, and the process
  exits 0. A second SIGTERM (or SIGINT) ends the process at once.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket

from appliance.app import Appliance, asgi
from appliance.endpoints import websocket_handler
from appliance.errors import ApplianceError
from appliance.front import Guard, Server, Site
from appliance.settings import Settings

log = logging.getLogger("appliance.server")

# Seconds SIGTERM waits for in-flight events and for clients to answer the close frame.
DEFAULT_SHUTDOWN_GRACE = 10.0
# Exit status when the application's startup fails (as uvicorn's, before).
STARTUP_FAILED = 3
def second_signal_exits_at_once() -> None:
    """After the first SIGTERM/SIGINT, the next one ends the process at once: the kernel's default
    action, which needs no Python code to run (the graceful stop may be waiting on a thread or a
    slow client). SQLite's WAL keeps every committed transaction through it."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


# glibc's malloc: blocks from this size up are mapped on their own and unmapped when freed.
MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def tune_malloc() -> bool:
    """Memory freed by the relay's large answers goes back to the system (glibc only; True if set).

    glibc raises its mmap threshold to the size of the first large block freed, so later answers
    (up to max_query_bytes each) would come from heaps where freed memory stays; fixing the threshold
    turns that off (docs/performance.md#mmap_threshold)."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def _loop_factory():
    try:
        import uvloop
    except ImportError:  # the standard event loop serves too, a little slower
        return None
    return uvloop.new_event_loop


class ApplianceServer:
    """The relay's listener (and the gateway's own, `gateway_listen`), in one event loop."""

    def __init__(self, settings: Settings, app: Appliance):
        self.settings = settings
        self.appliance = app
        self.guard = Guard(app.peers)
        app.guard = self.guard
        self.site = Site(
            asgi(app), self.guard, websocket=websocket_handler(app),
            # Frames up to twice the limit are read so the client gets a NOTICE; beyond that, close 1009.
            max_message_size=settings.max_message_length * 2,
            compression=settings.ws_compression,
            log_client_addresses=settings.log_client_addresses,
        )
        self.front = Server(lifespan_app=self.site.app)
        self.extra: list[tuple[Site, socket.socket]] = []
        self.should_exit = False
        self._exit: asyncio.Event | None = None
        self.exit_code = 0

    def add_listener(self, site: Site, sock: socket.socket) -> None:
        """Serve `site` on `sock` too (the gateway's own listener)."""
        self.extra.append((site, sock))

    def run(self, sockets: list[socket.socket] | None = None) -> int:
        """Serve until SIGTERM/SIGINT (or `should_exit`); the exit status (0 after a graceful stop)."""
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(self.serve(sockets))

    def handle_exit(self, sig: int | None = None) -> None:
        first = not self.should_exit
        self.should_exit = True
        if self._exit is not None:
            self._exit.set()
        if first and sig in (signal.SIGINT, signal.SIGTERM):
            log.info("stopping: finishing in-flight work (a second signal exits at once)")
            second_signal_exits_at_once()

    async def serve(self, sockets: list[socket.socket] | None = None) -> int:
        loop = asyncio.get_running_loop()
        self._exit = asyncio.Event()
        if self.should_exit:
            self._exit.set()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.handle_exit, sig)
            except (NotImplementedError, RuntimeError):  # not the main thread (tests)
                pass
        if not sockets:
            sockets = [bind_listener(self.settings.host, self.settings.port)]
        for sock in sockets:
            self.front.add(self.site, sock)
        for site, sock in self.extra:
            self.front.add(site, sock)
        if not await self.front.start():
            self.exit_code = STARTUP_FAILED
            return self.exit_code
        self.started = True
        await self._exit.wait()
        await self.shutdown()
        return self.exit_code

    async def shutdown(self) -> None:
        front = self.front
        front.close_listeners()  # stop accepting first
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEFAULT_SHUTDOWN_GRACE
        try:
            await self.appliance.relay.shutdown(DEFAULT_SHUTDOWN_GRACE)
        except Exception:  # the rest of the shutdown must run
            log.exception("graceful relay shutdown failed")
        # Each client answers our close frame: closing the socket before that, with its messages
        # still arriving, would reset the connection and throw away the last OKs it had not read.
        await front.wait_websockets(deadline)
        await front.close(max(deadline, loop.time() + 1.0))


def build_server(settings: Settings, app: Appliance) -> ApplianceServer:
    """The configured server for `app`: `run(sockets=[...])` serves it."""
    return ApplianceServer(settings, app)


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


def run_with_gateway_listener(settings: Settings, app: Appliance) -> int:
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
            sock = bind_listener(host, port)
        except ListenError as exc:
            raise ConfigError("gateway_listen", listen, f"cannot listen there: {exc}") from None
    server = build_server(settings, app)
    # The same head limits and per-address cap; no websockets there.
    server.add_listener(Site(gateway_asgi(app), Guard(app.peers)), sock)
    relay_sockets = [app.sockets["relay"]] if "relay" in app.sockets else None
    return server.run(sockets=relay_sockets)
