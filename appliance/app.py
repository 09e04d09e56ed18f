"""Composition root: builds the store, origins, relay, push executor and gateway, wires their hooks,
and runs them, with the upkeep loops (appliance.upkeep), for as long as the server serves
(`lifespan`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from appliance.endpoints import RelayPost, routes
from appliance.origin_config import prepare_origins, push_names
from appliance.origins import Origin, OriginRegistry, UnknownOrigin
from appliance.relay import nip11, peers
from appliance.relay.groups import DEFAULT_H_GRAMMAR, Groups, GroupState, RelayKeys
from appliance.relay.relay import Relay
from appliance.settings import Settings
from appliance.store.admin import stored_settings
from appliance.store.backend import store_for
from appliance.store.interface import Connection, Store
from appliance.store.keyfile import KeyFile
from appliance.store.meta import config_generation
from appliance.store.search import sync_search_kinds
from appliance.upkeep import Upkeep

if TYPE_CHECKING:
    from appliance.front import Guard
    from appliance.gateway.service import Gateway
    from appliance.nostr.event import Event
    from appliance.push.service import Push
    from appliance.relay.nodes import NodeFanout
    from appliance.store.instance import InstanceLock
    from appliance.store.notify import LocalBus, PgBus
    from appliance.transports.gateway import GatewayTransport

log = logging.getLogger("appliance")

# The loop waits at most this long for the GIL behind a reader thread building an answer
# (CPython's default is 5 ms): docs/performance.md#default_switch_interval
DEFAULT_SWITCH_INTERVAL = 0.0005


@dataclass
class Appliance:
    """The running appliance: everything `build` wired together."""

    settings: Settings
    store: Store
    relay: Relay
    groups: Groups
    keyfile: KeyFile
    nip11_extensions: list[nip11.Extension] = field(default_factory=list)
    background: list[asyncio.Task[None]] = field(default_factory=list)
    push: Push | None = None
    peers: peers.PeerLimits = field(default_factory=lambda: peers.PeerLimits(0))
    guard: Guard | None = None  # the relay server's, once served
    gateway: Gateway | None = None  # when [gateway] enabled = true
    started_at: float = field(default_factory=time.time)
    # Plug-ins from outside (the dashboard, wired by the CLI): routes served before the relay's
    # catch-all, coroutines run at start and stop, and a handler for POSTs to a relay URL
    # (NIP-86) as `(request, origin) -> Response`.
    routes: list[BaseRoute] = field(default_factory=list)
    on_startup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_shutdown: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    relay_post: RelayPost | None = None
    # Called (no arguments) after a reload applied a configuration edit made elsewhere (the CLI,
    # another node): parts that copied settings at start take the edited values.
    on_reload: list[Callable[[], None]] = field(default_factory=list)
    # Lines added to the start banner, after the relay's.
    banner: list[str] = field(default_factory=list)
    instance_lock: InstanceLock | None = None  # held while serving
    # The other nodes over the same database (appliance.store.notify): a LocalBus when alone.
    bus: LocalBus | PgBus | None = None
    fanout: NodeFanout | None = None  # when the bus reaches other nodes
    # Listening sockets the CLI bound before anything else (bound, not yet listening), by role:
    # "relay" (host:port), "admin" (admin_listen), "gateway" (gateway_listen). The servers take them.
    sockets: dict[str, socket.socket] = field(default_factory=dict)
    # The reload and purge loops (appliance.upkeep), made with the appliance.
    upkeep: Upkeep = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.upkeep = Upkeep(self)


def build(settings: Settings) -> Appliance:
    """Open the store and wire the relay, the push executor, the gateway and the other nodes; the
    caller serves `asgi(appliance)` and appliance.endpoints.websocket_handler."""
    store = store_for(settings).open()
    try:
        settings.apply_stored(store.read_sync(stored_settings))  # saved from the dashboard
        origins = prepare_origins(store, settings)
        sync_search_kinds(store, settings.search_kinds)
        keyfile = KeyFile.for_store(settings.data_path, store)
    except Exception:
        store.close()
        raise
    state = GroupState()
    store.read_sync(state.load)
    registry = OriginRegistry(origins)

    def h_grammar(origin_id: int) -> str:
        """The group-id grammar an origin advertises (its push descriptor's h_grammar)."""
        return registry.by_id(origin_id).push.get("h_grammar", DEFAULT_H_GRAMMAR)

    groups = Groups(state, RelayKeys(keyfile), h_grammar=h_grammar)
    client_peers = peers.PeerLimits(settings.max_connections_per_ip, peers.parse_networks(settings.trusted_proxies),
                                    loopback_exempt=settings.loopback_exempt, max_backoff=settings.flood_backoff)
    relay = Relay(settings=settings, store=store, origins=registry, groups=state, peers=client_peers)
    relay.store_hooks.add_check(groups.check, wants=groups.wants)
    relay.ephemeral_checks.append(groups.check_ephemeral)
    app = Appliance(settings=settings, store=store, relay=relay, groups=groups, keyfile=keyfile, peers=client_peers)
    app.upkeep.generation = store.read_sync(config_generation)
    groups.keys.ensure(store, origins)
    app.nip11_extensions.append(groups.nip11)
    _wire_push(app, origins)
    _wire_gateway(app)
    _wire_nodes(app)
    return app


@contextlib.asynccontextmanager
async def lifespan(app: Appliance) -> AsyncIterator[None]:
    """The appliance's run: its background tasks and plug-ins started, then everything stopped and
    closed in order when the server stops."""
    app.background.append(asyncio.create_task(app.upkeep.purge_loop()))
    app.background.append(asyncio.create_task(app.upkeep.reload_loop()))
    app.relay.verifier.start()
    for start in app.on_startup:
        await start()
    if app.push is not None:
        app.background.append(asyncio.create_task(app.push.delivery.run()))
    if app.fanout is not None:
        app.background.append(asyncio.create_task(app.fanout.run()))
    # What startup built lives as long as the process: out of the cyclic collector's way, so a
    # full collection scans only what came later (docs/performance.md#gcfreeze-at-start).
    gc.collect()
    gc.freeze()
    # See DEFAULT_SWITCH_INTERVAL.
    sys.setswitchinterval(DEFAULT_SWITCH_INTERVAL)
    try:
        yield
    finally:
        if app.push is not None:
            # Attempts under way finish and are recorded; claimed wakes not yet sent are
            # released, so the next start sends them at once (not after their claim lapses).
            await app.push.delivery.stop()
        for stop in app.on_shutdown:
            try:
                await stop()
            except Exception:
                log.exception("stopping a part of the appliance failed")
        for task in app.background:
            task.cancel()
        await asyncio.gather(*app.background, return_exceptions=True)
        if app.fanout is not None:
            await app.fanout.aclose()
        if app.gateway is not None:
            await app.gateway.drain()
        if app.push is not None:
            await app.push.aclose()
            app.push.close()
        app.relay.close()
        app.store.close()


def asgi(app: Appliance) -> ASGIApp:
    """The ASGI application for HTTP: the endpoints (appliance.endpoints) and the plug-ins' routes,
    run by `lifespan`, with the gateway's routes on the main listener unless it has its own."""
    main = Starlette(routes=routes(app), lifespan=lambda _starlette: lifespan(app))
    if app.gateway is None or app.gateway.config.listen:
        return main
    from appliance.gateway.http import GatewayApp

    gateway = GatewayApp(app.gateway)

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        # The gateway's routes share the main listener: its host (if public_url names one) and path.
        if gateway.owns(scope):
            return await gateway(scope, receive, send)
        return await main(scope, receive, send)

    return dispatch


def gateway_asgi(app: Appliance) -> ASGIApp:
    """The gateway routes alone, for their own listener (`gateway_listen`)."""
    from appliance.gateway.http import GatewayApp

    return GatewayApp(app.gateway, match_host=False)


def _wire_nodes(app: Appliance) -> None:
    """Several nodes over one database: stored events, group changes and ephemeral events are
    announced to the other nodes, and theirs replayed to this node's subscribers."""
    from appliance.relay.nodes import NodeFanout
    from appliance.store.notify import make_bus

    app.bus = make_bus(app.store)
    if not app.bus.multi_node:
        return
    app.fanout = NodeFanout(app.bus, app.relay, app.groups.state, app.upkeep.reload_if_changed)
    app.relay.other_nodes = True
    app.relay.store_hooks.add_stored(app.fanout.stored)
    app.relay.on_ephemeral.append(app.fanout.ephemeral)


def _wire_gateway(app: Appliance) -> None:
    """The optional APNs gateway: its own tables, grant keys wrapped by the key file, its routes."""
    from appliance.gateway.config import gateway_config

    try:
        config = gateway_config(app.settings)
        if not config.enabled:
            return
        from appliance.gateway.service import Gateway

        app.gateway = Gateway(config, app.store, app.keyfile).open()
    except Exception:
        if app.push is not None:
            app.push.close()
        app.relay.close()
        app.store.close()
        raise
    if not config.profiles:
        log.warning("gateway enabled with no [[gateway.profiles]]: every enrollment will be refused")


def _wire_push(app: Appliance, origins: list[Origin]) -> None:
    """NIP-PL executor: descriptors + keys (refuses to start on an invalid descriptor), kind 30350 hooks,
    matching into the wake outbox inside every event's transaction, and the delivery workers."""
    from appliance.push.delivery import DeliverySettings
    from appliance.push.descriptor import LEASE_KIND
    from appliance.push.profiles import ProfileTransports
    from appliance.push.service import Push
    from appliance.relay.authz import can_read
    from appliance.store.groups import StoredGroups

    registry = app.relay.origins

    def authorize(conn: Connection, origin_id: int, reader: str, ev: Event) -> bool:
        """The relay's one read rule (what REQ uses), over this connection's view of the groups;
        and an event whose author is banned here now wakes no one (docs/spec-notes.md W15)."""
        try:
            origin = registry.by_id(origin_id)
        except UnknownOrigin:
            return False
        return ev.pubkey not in origin.block and can_read(origin, reader, ev, StoredGroups(conn))

    def relay_secret(origin_id: int) -> str:
        secret = app.groups.keys.secret(origin_id)
        if secret is None:  # an origin added since the last reload: its key is made there
            raise LookupError(f"no relay key loaded for origin {origin_id}")
        return secret

    def make_gateway(origin_id: int, url: str) -> GatewayTransport:
        """Delivery through an APNs gateway, NIP-98 signed with the origin's relay key (NIP-11 `self`)."""
        from appliance.transports.gateway import GatewayTransport

        return GatewayTransport(url, lambda: relay_secret(origin_id))

    push = Push(app.store, app.keyfile, workers=app.settings.lease_workers,
                relay_max_content_length=app.settings.max_content_length, authorize=authorize,
                delivery=DeliverySettings.from_settings(app.settings),
                transports=ProfileTransports(make_gateway=make_gateway, derive=app.keyfile.derive,
                                             wake_workers=app.settings.wake_workers),
                draft_transports=app.settings.push_draft_transports)
    push.names = push_names(app.store, app.settings)
    try:
        push.load(origins)
    except Exception:
        push.close()
        app.relay.close()
        app.store.close()
        raise
    app.push = push
    app.relay.admission[LEASE_KIND] = push.admit
    app.relay.store_hooks.add_check(push.check, kind=LEASE_KIND)
    app.relay.store_hooks.add_stored(push.stored)
    app.relay.store_hooks.add_stored_batch(push.stored_batch)
    app.nip11_extensions.append(push.nip11)

