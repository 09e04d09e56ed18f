"""The gateway's HTTP face: a small ASGI app serving the seven POST routes under the public URL's path.

On the main listener it sits in front of the relay and takes only requests whose Host is the
gateway's (when `public_url` names one) and whose path is under `<public path>/v1/`; with
`gateway_listen` it is the whole app of its own listener. Every answer is UTF-8 JSON: the route's
success object or one of the closed error bodies. Bodies over 8192 bytes are refused unread.
"""

from __future__ import annotations

import logging

from .errors import GatewayError, InvalidRequest, TemporarilyUnavailable
from .service import Gateway
from .wire import MAX_BODY_BYTES, ContentType

log = logging.getLogger("appliance.gateway")

ROUTES = {
    "/v1/installations/challenges": "challenge",
    "/v1/installations": "enroll",
    "/v1/delegations": "delegate",
    "/v1/installations/endpoint": "rotate_endpoint",
    "/v1/delegations/revoke": "revoke_delegation",
    "/v1/installations/revoke": "revoke_installation",
    "/v1/deliveries/apns": "deliver",
}


def _hostname(value: str) -> str:
    host = value.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host[:-1] if host.endswith(".") else host


class GatewayApp:
    """ASGI app of the gateway routes; `owns(scope)` says whether a main-listener request is ours."""

    def __init__(self, gateway: Gateway, *, match_host: bool = True):
        self.gateway = gateway
        self.prefix = gateway.config.route_prefix
        self.host = gateway.config.host if match_host else None

    def owns(self, scope) -> bool:
        if scope["type"] != "http":
            return False
        path = scope["path"]
        if not path.startswith(self.prefix + "/v1/") and path != self.prefix + "/v1":
            return False
        if self.host is None:
            return True
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        return len(hosts) == 1 and _hostname(hosts[0].decode("latin-1")) == self.host

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":  # a listener of its own: nothing to start
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        status, body, extra = await self._answer(scope, receive)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"cache-control", b"no-store"), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope, receive) -> tuple[int, bytes, list]:
        path = scope["path"]
        name = ROUTES.get(path[len(self.prefix):]) if path.startswith(self.prefix) else None
        if name is None:
            return 404, InvalidRequest().body, []
        if scope["method"] != "POST":  # "All routes below accept only POST."
            return 405, InvalidRequest().body, [(b"allow", b"POST")]
        headers = scope["headers"]
        try:
            if not ContentType.acceptable(_header(headers, b"content-type")):
                raise InvalidRequest("Content-Type must be application/json")
            body = await _read_body(headers, receive)
            handler = getattr(self.gateway, name)
            if name == "deliver":
                status, out = await handler(body, _header(headers, b"authorization"))
            else:
                status, out = await handler(body)
            return status, out, []
        except GatewayError as exc:
            if exc.status >= 500:
                log.info("gateway %s: %s %s", name, exc.code, exc.reason)
            else:
                log.debug("gateway %s: %s %s", name, exc.code, exc.reason)
            return exc.status, exc.body, []
        except Exception:
            log.exception("gateway %s failed", name)
            return 503, TemporarilyUnavailable().body, []


def _header(headers, name: bytes) -> str | None:
    values = [v for k, v in headers if k == name]
    if len(values) != 1:
        return None  # absent, or ambiguous: either way not usable
    return values[0].decode("latin-1")


async def _read_body(headers, receive) -> bytes:
    length = _header(headers, b"content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        raise InvalidRequest("body over 8192 bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise InvalidRequest("body over 8192 bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
