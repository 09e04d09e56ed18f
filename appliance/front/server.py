"""Listening sockets, the ASGI lifespan of the application, and the steps of a graceful stop.

The owner (appliance.server) decides when to stop and what the relay does first; this module
only serves: `start()` runs the application's startup and then listens, `close_listeners()`
stops accepting, `wait_websockets()` waits for the clients' closing handshakes, `close()` ends
the HTTP connections (an idle one at once, a busy one after its response) and runs the
application's shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from appliance.front.http import HttpConnection, Site

log = logging.getLogger("appliance.server")

# Connections the kernel queues before they are accepted (uvicorn's default, as before).
DEFAULT_BACKLOG = 2048
_ASGI = {"version": "3.0", "spec_version": "2.4"}


class Lifespan:
    """The ASGI lifespan protocol against an application: startup, then, later, shutdown."""

    def __init__(self, app, state: dict):
        self.app = app
        self.state = state
        self._events: asyncio.Queue = asyncio.Queue()
        self._started = asyncio.Event()
        self._stopped = asyncio.Event()
        self.failed: str | None = None
        self._task: asyncio.Task | None = None

    async def _receive(self) -> dict:
        return await self._events.get()

    async def _send(self, message: dict) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._started.set()
        elif kind == "lifespan.startup.failed":
            self.failed = message.get("message", "") or "startup failed"
            self._started.set()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            if kind.endswith("failed"):
                log.error("application shutdown failed: %s", message.get("message", ""))
            self._stopped.set()

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": _ASGI, "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
        except BaseException as exc:
            if not self._started.is_set():
                self.failed = repr(exc)
                log.exception("application startup failed")
            else:
                log.exception("the application's lifespan failed")
            raise
        finally:
            self._started.set()
            self._stopped.set()

    async def startup(self) -> bool:
        self._task = asyncio.create_task(self._run())
        await self._events.put({"type": "lifespan.startup"})
        await self._started.wait()
        if self.failed is not None:
            log.error("application startup failed: %s", self.failed)
            return False
        log.info("Application startup complete.")
        return True

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._events.put({"type": "lifespan.shutdown"})
        await self._stopped.wait()
        try:
            await self._task
        except BaseException:
            pass
        log.info("Application shutdown complete.")


class Server:
    """Serves sites (an ASGI application, and maybe the relay's websockets) on sockets."""

    def __init__(self, lifespan_app=None):
        self.state: dict = {}
        self.lifespan = Lifespan(lifespan_app, self.state) if lifespan_app is not None else None
        self.listeners: list[tuple[Site, socket.socket]] = []
        self.servers: list[asyncio.AbstractServer] = []

    def add(self, site: Site, sock: socket.socket) -> None:
        """Serve `site` on `sock` (bound; listened on by `start`)."""
        site.state = self.state
        self.listeners.append((site, sock))

    @property
    def sites(self) -> list[Site]:
        return [site for site, _sock in self.listeners]

    async def start(self) -> bool:
        """The application's startup, then listen; False if the startup failed."""
        if self.lifespan is not None and not await self.lifespan.startup():
            return False
        loop = asyncio.get_running_loop()
        for site, sock in self.listeners:
            server = await loop.create_server(lambda site=site: HttpConnection(site), sock=sock,
                                              backlog=DEFAULT_BACKLOG)
            self.servers.append(server)
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            log.info("listening on http://%s:%d (Ctrl+C or SIGTERM stops)", shown, port)
        return True

    def close_listeners(self) -> None:
        """Accept no more connections."""
        for server in self.servers:
            server.close()

    async def wait_websockets(self, deadline: float) -> None:
        """Until every websocket connection has ended (the clients answered the close frames), or
        the loop's clock reaches `deadline`."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline and any(site.websockets for site in self.sites):
            await asyncio.sleep(0.01)

    async def close(self, deadline: float) -> None:
        """End what is left: websockets cut, HTTP connections closed (idle ones now, busy ones
        after their response, until `deadline`), then the application's shutdown."""
        loop = asyncio.get_running_loop()
        for site in self.sites:
            for ws in list(site.websockets):
                ws.abort()
            for http in list(site.connections):
                http.shutdown()
        while loop.time() < deadline and any(site.connections or site.tasks for site in self.sites):
            await asyncio.sleep(0.01)
        for site in self.sites:
            for http in list(site.connections):
                http.transport.abort()
            for task in list(site.tasks):
                task.cancel()
            if site.tasks:
                await asyncio.gather(*site.tasks, return_exceptions=True)
        for server in self.servers:
            server.close()
        if self.lifespan is not None:
            await self.lifespan.shutdown()
