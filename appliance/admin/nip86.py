"""NIP-86 relay management API: JSON-RPC-like calls POSTed to a relay URL with Content-Type
`application/nostr+json+rpc`, authorized by a NIP-98 event (payload tag required) from one of the
`admin_pubkeys`. Each call acts on the origin the URL routes to, through the same functions as the
dashboard and the CLI (`appliance.commands.moderation`), and applies at once.

Answers: 200 `{"result": ...}` or 200 `{"result": null, "error": "..."}` when the call itself is
refused; 401 without valid authorization, 403 for a pubkey that is not an admin, 400 for a body
that is not a call, 415 for another content type.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from appliance.commands import moderation
from appliance.errors import ConfigError
from appliance.store.admin import spend_auth_event
from appliance.store.fingerprints import KEY_PURPOSE
from appliance.nostr.nip98 import HttpAuthError, verify_http_auth
from appliance.relay.peers import url_as_reached

log = logging.getLogger("appliance.admin")

CONTENT_TYPE = "application/nostr+json+rpc"
# Largest call accepted (a method name and a few short parameters).
MAX_BODY = 64 * 1024
# Seconds a NIP-98 event's created_at may be from now. One authorizing a change is spent in the
# store (every node sees it) and kept there until this window has closed for it.
AUTH_WINDOW = 60


def _http_form(url: str) -> str:
    return url.replace("wss://", "https://", 1).replace("ws://", "http://", 1)


class CallError(Exception):
    """The call is refused; the message goes into the response's `error`."""


def _param(params: list, i: int, default: Any = ...) -> Any:
    if i < len(params):
        return params[i]
    if default is ...:
        raise CallError(f"missing parameter {i + 1}")
    return default


async def _bounded_body(request: Request) -> bytes | None:
    """The request body, or None as soon as it is known to pass MAX_BODY (by its Content-Length,
    or while it streams in, chunked): never more than MAX_BODY is held."""
    length = request.headers.get("content-length", "")
    if length and (not length.isdigit() or int(length) > MAX_BODY):
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        parts.append(chunk)
    return b"".join(parts)


class Management:
    def __init__(self, app):
        self.app = app
        s = app.settings
        # Pubkeys may be given as hex, npub1... or the dashboard's fingerprint (pk:...) of one seen here.
        fp = app.keyfile.derive(KEY_PURPOSE)
        # method -> (handler(conn, origin_id, params) -> result, writes?)
        self.methods: dict[str, tuple[Callable, bool]] = {
            "banpubkey": (lambda c, o, p: moderation.ban_pubkey(c, s, o, _param(p, 0), _param(p, 1, ""),
                                                                         fingerprint_key=fp), True),
            "unbanpubkey": (lambda c, o, p: moderation.unban_pubkey(c, s, o, _param(p, 0), fingerprint_key=fp),
                            True),
            "listbannedpubkeys": (lambda c, o, p: [{"pubkey": k, "reason": r}
                                                   for k, r in moderation.list_pubkeys(c, o, "block")], False),
            "allowpubkey": (lambda c, o, p: moderation.allow_pubkey(c, s, o, _param(p, 0), _param(p, 1, ""),
                                                                             fingerprint_key=fp), True),
            "unallowpubkey": (lambda c, o, p: moderation.unallow_pubkey(c, s, o, _param(p, 0),
                                                                                 fingerprint_key=fp), True),
            "listallowedpubkeys": (lambda c, o, p: [{"pubkey": k, "reason": r}
                                                    for k, r in moderation.list_pubkeys(c, o, "allow")], False),
            "banevent": (lambda c, o, p: moderation.ban_event(c, s, o, _param(p, 0), _param(p, 1, "")), True),
            "unbanevent": (lambda c, o, p: moderation.unban_event(c, s, o, _param(p, 0)), True),
            "allowevent": (lambda c, o, p: moderation.allow_event(c, s, o, _param(p, 0), _param(p, 1, "")), True),
            "unallowevent": (lambda c, o, p: moderation.unallow_event(c, o, _param(p, 0)), True),
            "listbannedevents": (lambda c, o, p: [{"id": e, "reason": r}
                                                  for e, r in moderation.list_events(c, o, "banned")], False),
            "listallowedevents": (lambda c, o, p: [{"id": e, "reason": r}
                                                   for e, r in moderation.list_events(c, o, "allowed")], False),
            # No moderation queue: nothing ever waits for a decision (docs/spec-notes.md A2).
            "listeventsneedingmoderation": (lambda c, o, p: [], False),
            "changerelayname": (lambda c, o, p: moderation.change_info(c, s, o, "name", _param(p, 0)), True),
            "changerelaydescription": (lambda c, o, p: moderation.change_info(c, s, o, "description",
                                                                              _param(p, 0)), True),
            "changerelayicon": (lambda c, o, p: moderation.change_info(c, s, o, "icon", _param(p, 0)), True),
            "allowkind": (lambda c, o, p: moderation.allow_kind(c, s, o, _param(p, 0)), True),
            "disallowkind": (lambda c, o, p: moderation.disallow_kind(c, s, o, _param(p, 0)), True),
            "listallowedkinds": (lambda c, o, p: sorted(moderation.find(c, o).allow_kinds), False),
            "listdisallowedkinds": (lambda c, o, p: sorted(moderation.find(c, o).block_kinds), False),
            "blockip": (lambda c, o, p: moderation.block_ip(c, s, o, _param(p, 0), _param(p, 1, "")), True),
            "unblockip": (lambda c, o, p: moderation.unblock_ip(c, s, o, _param(p, 0)), True),
            "listblockedips": (lambda c, o, p: [{"ip": ip, "reason": r}
                                                for ip, r in moderation.list_blocked_ips(c, o)], False),
        }

    def supported(self) -> list[str]:
        return ["supportedmethods", *self.methods]

    def nip11(self, origin, doc: dict) -> None:
        """Advertise NIP-86 where someone can use it."""
        if self.app.settings.admin_pubkeys and 86 not in doc.get("supported_nips", []):
            doc["supported_nips"] = [*doc.get("supported_nips", []), 86]

    def _urls(self, request: Request, origin) -> list[str]:
        """The URLs a `u` tag may name: the origin's relay URL or its http(s) form (docs/spec-notes.md
        A1). On an install with no public URL, also the URL the request reached when its Host names
        this machine, as for NIP-42. Never whatever the Host header says: an admin call signed for
        another relay, replayed here with that relay's Host, must not act here."""
        base = origin.origin
        urls = [base, _http_form(base)]
        s = self.app.settings
        if not s.public_url and base == s.effective_public_url:
            server = request.scope.get("server") or ("",)
            scheme = "https" if request.url.scheme == "https" else "http"
            reached = url_as_reached(request.headers.getlist("host"), str(server[0]), scheme, request.url.path)
            if reached:
                urls += [reached, reached.replace("http", "ws", 1)]
        return list(dict.fromkeys(urls + [u.rstrip("/") if u.endswith("/") else u + "/" for u in urls]))

    async def _spend(self, event, now: int) -> bool:
        """Spend the authorization event of a change in the store; False if it was spent already
        (here, before a restart, or on another node). Committed before the change is made: a call
        refused afterwards has used its event all the same."""
        expires_at = event.created_at + AUTH_WINDOW + 1
        return await self.app.store.write(lambda conn: spend_auth_event(conn, event.id, expires_at, now))

    async def handle(self, request: Request, origin) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != CONTENT_TYPE:
            # Not a NIP-86 call at all: answered as the relay's other non-websocket requests are.
            return PlainTextResponse(f"unsupported media type: a relay URL takes POSTs only as NIP-86 calls "
                                     f"({CONTENT_TYPE})\n", status_code=415)
        body = await _bounded_body(request)
        if body is None:
            # Refused before the rest is read (anyone can send one); the connection is closed.
            return JSONResponse({"error": "request too large"}, status_code=413, headers={"Connection": "close"})
        now = int(time.time())
        header = request.headers.get("authorization", "")
        event = None
        reason = "missing authorization header"
        for url in self._urls(request, origin):
            try:
                event = verify_http_auth(header, url=url, method="POST", body=body, now=now, window=AUTH_WINDOW)
                break
            except HttpAuthError as exc:
                reason = exc.reason
                if exc.reason != "url mismatch":
                    break
        if event is not None and event.first_tag("payload") is None:
            event, reason = None, "missing payload tag (NIP-86 requires it)"
        if event is None:
            return JSONResponse({"error": f"unauthorized: {reason}"}, status_code=401,
                                headers={"WWW-Authenticate": "Nostr"})
        if event.pubkey not in self.app.settings.admin_pubkeys:
            return JSONResponse({"error": "restricted: this pubkey is not an admin of this relay"}, status_code=403)
        try:
            call = json.loads(body)
        except ValueError:
            return JSONResponse({"error": "invalid request: the body is not JSON"}, status_code=400)
        if not isinstance(call, dict) or not isinstance(call.get("method"), str) \
                or not isinstance(call.get("params", []), list):
            return JSONResponse({"error": 'invalid request: expected {"method": "...", "params": [...]}'},
                                status_code=400)
        method, params = call["method"], call.get("params", [])
        if method == "supportedmethods":
            return JSONResponse({"result": self.supported()})
        entry = self.methods.get(method)
        if entry is None:
            return JSONResponse({"result": None, "error": f"unsupported method: {method}"})
        handler, writes = entry
        # A change is made once per authorization event (a replayed request cannot undo a later
        # decision); reads may repeat (a client listing twice within a second signs the same event).
        if writes and not await self._spend(event, now):
            return JSONResponse({"error": "unauthorized: this authorization event was already used"}, status_code=401)
        try:
            if writes:
                await self.app.store.write(lambda conn: handler(conn, origin.id, params))
                await self.app.upkeep.reload_if_changed()
                result: Any = True
            else:
                result = await self.app.store.read(lambda conn: handler(conn, origin.id, params))
        except (CallError, ConfigError) as exc:
            return JSONResponse({"result": None, "error": str(exc)})
        log.info("NIP-86 %s at %s by an admin", method, origin.origin)
        return JSONResponse({"result": result})
