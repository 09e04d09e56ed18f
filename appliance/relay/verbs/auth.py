"""AUTH (NIP-42): the client proves a pubkey by signing the connection's challenge."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from appliance.nostr.event import InvalidEvent, parse_event
from appliance.nostr.nip42 import AuthError, validate_auth_event
from appliance.relay.peers import url_as_reached
from appliance.relay.verbs.base import Verb, event_argument

if TYPE_CHECKING:
    from appliance.relay.session import Session


def local_urls(session: "Session") -> tuple[str, ...]:
    """On an install with no public URL, the URL this client connected to also names the relay
    when its host is this machine (`ws://localhost:7777`, `ws://192.168.1.5:7777`). Any other
    Host header is never trusted: a relay elsewhere could forward our challenge to its own
    users and sign in here as them. With a configured origin, only that URL counts."""
    s = session.settings
    if s.public_url or session.origin.origin != s.effective_public_url:
        return ()
    request = session.request
    server = request.server or ("",)
    scheme = "wss" if request.scheme == "wss" else "ws"
    url = url_as_reached(request.headers.getlist("host"), str(server[0]), scheme, request.path or "/")
    return (url,) if url else ()


def on_auth(session: "Session", msg: list, _admitted: bool = False) -> None:
    arg = event_argument(session, msg, 'invalid: AUTH takes one signed event: ["AUTH", {...}]')
    if arg is None:
        return
    obj, event_id = arg
    try:
        ev = parse_event(obj)
        pubkey = validate_auth_event(
            ev,
            challenge=session.challenge,
            relay_url=session.origin.relay_url,
            now=int(time.time()),
            window=session.settings.auth_window,
            also_urls=local_urls(session),
        )
    except (InvalidEvent, AuthError) as exc:
        session.ok(event_id, False, f"invalid: {exc.reason}")
        return
    if pubkey in session.origin.block:
        session.ok(ev.id, False, "blocked: this pubkey is blocked here")
        return
    session.reader = pubkey
    session.ok(ev.id, True, "")


AUTH = Verb(on_auth)
