"""The relay's endpoints on every path of every routed host: HTTP (NIP-11, the landing page, NIP-86
POSTs) and the websocket handshake that starts a relay session."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from appliance.landing import STATIC, landing_page
from appliance.origins import Origin, UnknownOrigin
from appliance.relay import nip11, peers
from appliance.relay.relay import Relay
from appliance.relay.session import Session
from appliance.settings import Settings

if TYPE_CHECKING:
    from starlette.datastructures import Headers

    from appliance.front import WebSocketRequest

CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "*",
    "Access-Control-Allow-Methods": "GET, OPTIONS",
}
# Preflight answer for NIP-86 calls from browser-based management clients.
RPC_CORS = {"Access-Control-Allow-Methods": "GET, POST, OPTIONS"}
# Seconds a connection attempt from an address barred for flooding waits for its 429 (see websocket_handler).
DEFAULT_BARRED_HOLD = 1.0

# A handler for POSTs to a relay URL (NIP-86): `(request, origin) -> Response`.
RelayPost = Callable[[Request, Origin], Awaitable[Response]]


class Served(Protocol):
    """What the endpoints use of the running appliance (appliance.app.Appliance)."""

    settings: Settings
    relay: Relay
    peers: peers.PeerLimits
    nip11_extensions: list[nip11.Extension]
    routes: list[BaseRoute]
    relay_post: RelayPost | None


class AmbiguousHost(ValueError):
    """A request naming its host more than once."""


def resolve_origin(app: Served, headers: Headers, path: str) -> Origin:
    """The origin a request names by its Host header and path."""
    hosts = headers.getlist("host")
    if len(hosts) > 1:
        # RFC 9112 3.2: a proxy in front might route by another of them than we would.
        raise AmbiguousHost("more than one Host header")
    return app.relay.origins.resolve(hosts[0] if hosts else None, path)


def routes(app: Served) -> list[BaseRoute]:
    """The HTTP routes: static files, the plug-ins' routes (the dashboard), then NIP-11 and the
    landing page on every path of every routed host, and NIP-86. (Websockets: `websocket_handler`.)"""

    def resolve(headers: Headers, path: str) -> Origin:
        return resolve_origin(app, headers, path)

    client_address = app.peers.client_address

    async def http_endpoint(request: Request) -> Response:
        try:
            origin = resolve(request.headers, request.url.path)
        except AmbiguousHost as exc:
            return PlainTextResponse(f"bad request: {exc}\n", status_code=400)
        except UnknownOrigin as exc:
            return PlainTextResponse(f"unknown host: {exc}\n", status_code=421)
        if origin.block_ips and client_address(request) in origin.block_ips:
            return PlainTextResponse("blocked: this address is blocked here\n", status_code=403)
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=CORS if app.relay_post is None else {**CORS, **RPC_CORS})
        if request.method == "POST":
            if app.relay_post is None:
                return PlainTextResponse("method not allowed\n", status_code=405, headers={"Allow": "GET, HEAD, OPTIONS"})
            return await app.relay_post(request, origin)
        if nip11.wants_nostr_json(request.headers.get("accept", "")):
            doc = nip11.document(origin, app.settings, app.nip11_extensions)
            return JSONResponse(doc, media_type=nip11.NOSTR_JSON, headers=CORS)
        return HTMLResponse(landing_page(origin))

    return [
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        *app.routes,
        Route("/{path:path}", http_endpoint, methods=["GET", "HEAD", "OPTIONS", "POST"]),
    ]


def websocket_handler(app: Served) -> Callable[[WebSocketRequest], Awaitable[None]]:
    """The relay's websocket endpoint, on every path of every routed host: `await handle(request)`
    for each handshake (an appliance.front.WebSocketRequest), which it accepts (a relay session
    serves the connection until it ends) or denies with an HTTP answer."""

    def resolve(headers: Headers, path: str) -> Origin:
        return resolve_origin(app, headers, path)

    def deny(request: WebSocketRequest, status: int, text: str, headers: list[tuple[str, str]] | None = None) -> None:
        request.deny(status, text.encode(), headers)

    async def handle(request: WebSocketRequest) -> None:
        try:
            origin = resolve(request.headers, request.path)
        except (AmbiguousHost, UnknownOrigin) as exc:
            bad = isinstance(exc, AmbiguousHost)
            deny(request, 400 if bad else 421, f"{'bad request' if bad else 'unknown host'}: {exc}\n")
            return
        # Behind a trusted proxy the client is the address it forwards (the server counted the
        # TCP peers that are not trusted proxies already).
        client = request.client.host if request.client else ""
        forwarded = app.peers.forwarded_client(client, request.headers.getlist("x-forwarded-for"))
        address = app.peers.client_address(request)
        if origin.block_ips and address in origin.block_ips:
            deny(request, 403, "blocked: this address is blocked here\n")
            return
        # An address closed for flooding waits before it connects again (the flood_backoff setting;
        # the server refuses direct peers before their request is read, see appliance.front.http).
        barred = app.peers.barred(address)
        if barred:
            # Held a moment before the answer: a client that retries at once is slowed to one
            # handshake per DEFAULT_BARRED_HOLD per connection it opens (a direct peer is cut before
            # its request is even read, see appliance.front.http).
            hold = min(barred, DEFAULT_BARRED_HOLD)
            await asyncio.sleep(hold)
            deny(request, 429, "rate-limited: too many refused messages from your address; try again later\n",
                 [("Retry-After", str(max(1, round(barred - hold))))])
            return
        session = Session(app.relay, request, origin)
        session.peer_ip = address
        # The server counted direct peers that are not trusted proxies; here the address a proxy
        # forwards, and a loopback client when loopback is not exempt.
        slot = None
        if forwarded is not None:
            slot = None if app.peers.exempt(forwarded) else forwarded
        elif address is not None and peers.is_loopback(address) and not app.peers.exempt(address):
            slot = address
        if slot is not None:
            if not app.peers.acquire(slot):
                deny(request, 429, "too many connections from your address\n")
                return
            try:
                await session.serve(request.accept())
            finally:
                app.peers.release(slot)
            return
        await session.serve(request.accept())

    return handle
