"""Composition root: builds the store, origins and relay, wires their hooks, and serves them."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from appliance import __version__
from appliance.errors import ApplianceError
from appliance.push.config import check_push_config, check_push_fits_relay
from appliance.relay import nip11, peers
from appliance.relay.groups import DEFAULT_H_GRAMMAR, Groups, GroupState, RelayKeys
from appliance.store import meta, origin_rows
from appliance.store.meta import config_generation

from appliance.origins import Origin, OriginRegistry, UnknownOrigin, load_origins, save_origin, sync_origins
from appliance.relay.relay import Relay, peer_ip
from appliance.relay.session import Session
from appliance.settings import Settings
from appliance.store.events import purge_expired
from appliance.store.keyfile import KeyFile
from appliance.store.backend import store_for
from appliance.store.sqlite import SqliteStore

log = logging.getLogger("appliance")

NOSTR_JSON = nip11.NOSTR_JSON
CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "*",
    "Access-Control-Allow-Methods": "GET, OPTIONS",
}
# Preflight answer for NIP-86 calls from browser-based management clients.
RPC_CORS = {"Access-Control-Allow-Methods": "GET, POST, OPTIONS"}
# Seconds a connection attempt from an address barred for flooding waits for its 429 (see ws_endpoint).
DEFAULT_BARRED_HOLD = 1.0

# How long a thread holding the GIL runs before one waiting for it gets its turn (CPython's default
# is 5 ms). The event loop lets the GIL go for every C call that can wait (a socket write, each
# step of an inline SQLite read): while a reader thread builds a large answer in Python, the loop
# waited up to the whole interval to get it back, each time. Measured with `appliance bench
# flood` (the latencies CSV): a bystander REQ that met the flooder's admitted 500-event REQ took
# 5-6 ms instead of 1.2, one at a time, every few tenths of a second, which alone missed the 2x
# target against a quiet p99 of 2.3 ms (docs/reliability.md). 0.5 ms bounds that wait; a thread
# that runs Python without pause just changes hands more often while another waits.
DEFAULT_SWITCH_INTERVAL = 0.0005
DEFAULT_ORIGIN_KEY = "default_origin"


def default_origin(settings: Settings) -> Origin:
    """The origin derived from the public URL and flat settings: the single-community setup."""
    return Origin.from_mapping(
        {
            "origin": settings.effective_public_url,
            "name": settings.relay_name,
            "description": settings.relay_description,
            "contact": settings.relay_contact,
            "pubkey": settings.relay_pubkey,
            "access_policy": settings.access_policy,
            "auth_required": settings.auth_required,
            "push": settings.push,
        },
        where="public_url",
        check_push=check_push_config,
        push_where="[push]",
    )


# The default origin's fields that come from flat settings, by origin field.
DEFAULT_ORIGIN_SETTINGS = {
    "name": "relay_name", "description": "relay_description", "contact": "relay_contact",
    "pubkey": "relay_pubkey", "access_policy": "access_policy", "auth_required": "auth_required",
}
# Always the configuration's: the default origin's URL and routing follow public_url.
DEFAULT_ORIGIN_FIXED = frozenset({"origin", "hosts", "path"})


def declared_fields(settings: Settings) -> dict[str, frozenset[str]]:
    """Which fields of which origin the configuration (flags, environment, config file) sets.

    Key "default" is the default origin; the others are the config file's `[[origins]]` by origin
    string. The configuration owns these: they are rewritten from it at every start, so the
    dashboard and the CLI refuse to edit them. Every other field is the database's.
    """
    default = set(DEFAULT_ORIGIN_FIXED)
    default |= {f for f, name in DEFAULT_ORIGIN_SETTINGS.items() if settings.sources.get(name, "default") != "default"}
    if settings.push:
        default.add("push")
    out = {"default": frozenset(default)}
    for o in settings.origins:
        if isinstance(o.get("origin"), str):
            out[o["origin"]] = frozenset(o) | {"origin"}
    return out


def _merge(current: Origin, declared: Origin, now: frozenset[str], before: frozenset[str]) -> Origin:
    """`current` with the fields the configuration declares now taken from `declared`, and the
    fields it declared at the previous start but no longer does set back to their defaults."""
    data = current.to_mapping()
    fresh = Origin(origin=declared.origin).to_mapping()
    wanted = declared.to_mapping()
    for name in before - now:
        data[name] = fresh.get(name)
    for name in now:
        data[name] = wanted.get(name)
    if "hosts" not in now and "hosts" in before - now:
        data.pop("hosts", None)  # derived from the origin again
    data = {k: v for k, v in data.items() if v is not None}
    return Origin.from_mapping(data, id=current.id, where="origin")


def _declared_before(conn, key: str) -> frozenset[str]:
    value = meta.meta_value(conn, f"declared:{key}")
    return frozenset(json.loads(value)) if value is not None else frozenset()


def _record_declared(conn, key: str, names: frozenset[str]) -> None:
    meta.set_meta(conn, f"declared:{key}", json.dumps(sorted(names)))


def default_origin_id(conn) -> int | None:
    value = meta.meta_value(conn, DEFAULT_ORIGIN_KEY)
    return int(value) if value is not None else None


def served_default_origin(conn, settings: Settings) -> Origin:
    """The default origin as `serve` makes it at start: the configuration's fields over the stored
    row (what the dashboard and the CLI saved for the rest); before the first start, the
    configuration's alone."""
    base = default_origin(settings)
    default_id = default_origin_id(conn)
    current = next((o for o in load_origins(conn) if o.id == default_id), None) if default_id is not None else None
    if current is None:
        return base
    return _merge(current, base, declared_fields(settings)["default"], _declared_before(conn, "default"))


def config_owned(conn, settings: Settings) -> dict[int, frozenset[str]]:
    """Origin id -> the fields the configuration owns (see `declared_fields`)."""
    declared = declared_fields(settings)
    out: dict[int, frozenset[str]] = {}
    default_id = default_origin_id(conn)
    for o in load_origins(conn):
        if o.id == default_id:
            out[o.id] = declared["default"]
        elif o.origin in declared:
            out[o.id] = declared[o.origin]
    return out


def prepare_origins(store: SqliteStore, settings: Settings, *, serving: bool = True) -> list[Origin]:
    """Make the default origin and the config file's origins exist; return all of them.

    The configuration owns the fields it declares (`declared_fields`); every other field keeps the
    value the CLI or the dashboard stored. A field the configuration stops declaring returns to its
    default. Only `serve` (serving=True) rewrites the default origin from the settings: the default
    origin keeps its row (and so its events) when the public URL changes.
    """
    base = default_origin(settings)
    declared_keys = declared_fields(settings)
    declared = [
        Origin.from_mapping(o, where=f"origins[{i}]", check_push=check_push_config)
        for i, o in enumerate(settings.origins)
    ]
    # Refused before anything is saved, by every command (a saved origin the server would refuse
    # stalls its reloads and its next start).
    check_push_fits_relay(base.push, "[push]", settings.max_content_length)
    for i, o in enumerate(declared):
        check_push_fits_relay(o.push, f"origins[{i}].push", settings.max_content_length)

    def op(conn):
        stored = {o.origin: o for o in load_origins(conn)}
        default_id = default_origin_id(conn)
        if default_id is None:
            save_origin(conn, base)
            oid = next(o.id for o in load_origins(conn) if o.origin == base.origin)
            meta.set_meta(conn, DEFAULT_ORIGIN_KEY, str(oid))
            _record_declared(conn, "default", declared_keys["default"])
        elif serving:
            current = next((o for o in stored.values() if o.id == default_id), None)
            merged = base if current is None else _merge(
                current, base, declared_keys["default"], _declared_before(conn, "default"))
            origin_rows.rewrite_origin(conn, default_id, merged.origin, merged.config_json())
            _record_declared(conn, "default", declared_keys["default"])
        for origin in declared:
            now = declared_keys[origin.origin]
            current = stored.get(origin.origin)
            if current is not None:
                origin = _merge(current, origin, now, _declared_before(conn, origin.origin))
            save_origin(conn, origin)
            _record_declared(conn, origin.origin, now)
        return sync_origins(conn, [])

    return store.write_sync(op)


@dataclass
class Appliance:
    """The running appliance: everything `build` wired together."""

    settings: Settings
    store: SqliteStore
    relay: Relay
    groups: Groups
    keyfile: KeyFile
    nip11_extensions: list[nip11.Extension] = field(default_factory=list)
    background: list[asyncio.Task] = field(default_factory=list)
    generation: int = 0
    push: Any = None  # appliance.push.service.Push
    peers: peers.PeerLimits = field(default_factory=lambda: peers.PeerLimits(0))
    guard: Any = None  # appliance.server.Guard, once served
    gateway: Any = None  # appliance.gateway.service.Gateway, when [gateway] enabled = true
    started_at: float = field(default_factory=time.time)
    # Plug-ins from outside (the dashboard, wired by the CLI): routes served before the relay's
    # catch-all, coroutines run at start and stop, and a handler for POSTs to a relay URL
    # (NIP-86) as `(request, origin) -> Response`.
    routes: list = field(default_factory=list)
    on_startup: list = field(default_factory=list)
    on_shutdown: list = field(default_factory=list)
    relay_post: Any = None
    # Called (no arguments) after a reload applied a configuration edit made elsewhere (the CLI,
    # another node): parts that copied settings at start take the edited values.
    on_reload: list = field(default_factory=list)
    # Lines added to the start banner, after the relay's.
    banner: list = field(default_factory=list)
    instance_lock: Any = None  # appliance.store.instance.InstanceLock, held while serving
    # The other nodes over the same database (appliance.store.notify): a LocalBus when alone.
    bus: Any = None
    fanout: Any = None  # appliance.relay.nodes.NodeFanout, when the bus reaches other nodes
    # Listening sockets the CLI bound before anything else (bound, not yet listening), by role:
    # "relay" (host:port), "admin" (admin_listen), "gateway" (gateway_listen). The servers take them.
    sockets: dict = field(default_factory=dict)

    # Seconds between checks for origin/group edits made by the CLI while the server runs.
    RELOAD_INTERVAL = 1.0

    def client_address(self, conn) -> str | None:
        """The client's address (a Request or WebSocket): behind a trusted proxy (loopback or
        `trusted_proxies`), the one it forwards in X-Forwarded-For; else the TCP peer. A client
        that is not a trusted proxy cannot name another address."""
        peer = conn.client.host if conn.client else ""
        return self.peers.forwarded_client(peer, conn.headers.getlist("x-forwarded-for")) or peer_ip(conn)

    async def reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.RELOAD_INTERVAL)
            try:
                await self.reload_if_changed()
                if self.fanout is not None and not self.fanout.listening:
                    # Not hearing the other nodes: their group changes arrive by polling meanwhile.
                    await self.store.read(self.groups.state.load)
            except Exception:
                log.exception("reloading origins and groups failed")

    async def reload_if_changed(self) -> bool:
        """Pick up origins and groups edited out of process (CLI); True if anything changed."""
        generation = await self.store.read(config_generation)
        if generation == self.generation:
            if self.push is not None and self.push.transports.files_changed():
                await self._reload_push_files()
            return False
        from appliance.origins import load_origins

        origins = await self.store.read(load_origins)
        if self.push is not None:
            # First, as it can refuse the new configuration: then nothing of it is applied.
            try:
                await asyncio.to_thread(self.push.load, origins)
                await self.push.close_retired()
            except ApplianceError as exc:
                self.generation = generation  # said once; the next edit is tried afresh
                log.error("configuration edit not applied, still serving the previous one: %s", exc)
                return False
        await self.store.read(self.groups.state.load)
        await self._reload_stored_settings()
        self.relay.origins.origins = origins
        self.relay.origins_changed()
        await asyncio.to_thread(ensure_relay_keys, self.store, self.groups, origins)
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.reload_keys)  # grant-key rotation by the CLI
        self.generation = generation
        self.wal_scrub_pending = True  # an edit may have erased key material (`appliance keys erase`)
        log.info("reloaded origins and groups generation=%d", generation)
        return True

    async def _reload_push_files(self) -> None:
        """A key_file or ca_file changed on disk: the profiles naming it read it again (a file that
        no longer loads is said once; the transports that read the old one keep serving)."""
        from appliance.origins import load_origins

        changed = self.push.transports.files_changed()
        origins = await self.store.read(load_origins)
        try:
            await asyncio.to_thread(self.push.load, origins)
            await self.push.close_retired()
            log.info("read again after a change on disk: %s", ", ".join(changed))
        except ApplianceError as exc:
            self.push.transports.forget_files(changed)
            log.error("a changed key or CA file was not applied, still serving the previous one: %s", exc)

    async def _reload_stored_settings(self) -> None:
        """Settings saved from the dashboard (of this node or another over the same database)."""
        from appliance.store.admin import stored_settings

        stored = await self.store.read(stored_settings)
        for name, source in list(self.settings.sources.items()):
            if source == "dashboard" and name not in stored:
                self.settings.clear_stored(name)
        self.settings.apply_stored(stored)
        for hook in self.on_reload:
            try:
                hook()
            except Exception:
                log.exception("applying reloaded settings failed")

    async def purge_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.purge_interval)
            try:
                await self.purge_once()
            except Exception:
                log.exception("expired-event purge failed")

    # Erased key material waits in the WAL until a scrub succeeds (readers can keep it busy).
    wal_scrub_pending: bool = False

    async def purge_once(self) -> int:
        total = 0
        while True:
            n = await self.store.write(lambda conn: purge_expired(conn, int(time.time())))
            total += n
            if n == 0:
                # Push and gateway retention: each erases key material that has served its time.
                for part in (self.push, self.gateway):
                    if part is not None:
                        erased = await self.store.write(lambda conn, part=part: part.maintain(conn, int(time.time())))
                        self.wal_scrub_pending = self.wal_scrub_pending or erased > 0
                if self.wal_scrub_pending:
                    self.wal_scrub_pending = not await asyncio.to_thread(self.store.scrub_wal)
                return total


def build(settings: Settings) -> Appliance:
    """Open the store and wire the relay; the caller serves `asgi(appliance)`."""
    store = store_for(settings).open()
    try:
        from appliance.store.admin import stored_settings

        settings.apply_stored(store.read_sync(stored_settings))  # saved from the dashboard
        origins = prepare_origins(store, settings)
        sync_search_kinds(store, settings)
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
    app.generation = store.read_sync(config_generation)
    ensure_relay_keys(store, groups, origins)
    app.nip11_extensions.append(lambda origin, doc: _nip29_self(app, origin, doc))
    _wire_push(app, origins)
    _wire_gateway(app)
    _wire_nodes(app)
    return app


def sync_search_kinds(store, settings: Settings) -> None:
    """NIP-50: index the events of kinds added to `search_kinds` since the last start, and unindex
    those of kinds removed, before serving (the kinds table then follows the setting)."""
    from appliance.store.search import Rebuild

    rebuild = Rebuild(settings.search_kinds, full=False)
    last = [time.monotonic()]

    def progress(r: Rebuild) -> None:
        if time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            log.info("search index: %d of %d rowids done", r.after, r.bound or 0)

    rebuild.run(store.write_sync, progress)
    if rebuild.added or rebuild.removed:
        log.info("search index: kinds %s indexed, kinds %s unindexed (search_kinds is now %s)",
                 list(rebuild.added), list(rebuild.removed), list(rebuild.kinds))


def make_bus(store):
    """The node bus for this store: LISTEN/NOTIFY on PostgreSQL (every node over one database
    hears the others), nothing on SQLite (one node by construction)."""
    from appliance.store.notify import LocalBus, PgBus

    if getattr(store, "backend", "sqlite") == "postgresql":
        return PgBus(store.dsn)
    return LocalBus()


def _wire_nodes(app: "Appliance") -> None:
    """Several nodes over one database: stored events, group changes and ephemeral events are
    announced to the other nodes, and theirs replayed to this node's subscribers."""
    from appliance.relay.nodes import NodeFanout

    app.bus = make_bus(app.store)
    if not app.bus.multi_node:
        return
    app.fanout = NodeFanout(app.bus, app.relay, app.groups.state, app.reload_if_changed)
    app.relay.other_nodes = True
    app.relay.store_hooks.add_stored(app.fanout.stored)
    app.relay.on_ephemeral.append(app.fanout.ephemeral)


def gateway_config(settings: Settings):
    """The checked `[gateway]` table (ConfigError naming the field), with its derived default URL."""
    from appliance.gateway.config import parse_gateway

    listen = settings.gateway_listen or settings.gateway.get("gateway_listen", "")
    if listen:
        derived = f"http://{listen}"
    else:
        host = settings.host if settings.host not in {"0.0.0.0", "::", ""} else "127.0.0.1"
        derived = f"http://{host}:{settings.port}"
    return parse_gateway(settings.gateway, gateway_listen=settings.gateway_listen, derived_url=derived)


def _wire_gateway(app: "Appliance") -> None:
    """The optional APNs gateway: its own tables, grant keys wrapped by the key file, its routes."""
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


def _wire_push(app: "Appliance", origins: list[Origin]) -> None:
    """NIP-PL executor: descriptors + keys (refuses to start on an invalid descriptor), kind 30350 hooks,
    matching into the wake outbox inside every event's transaction, and the delivery workers."""
    from appliance.push.delivery import DeliverySettings
    from appliance.push.descriptor import LEASE_KIND
    from appliance.push.profiles import ProfileTransports
    from appliance.push.service import Push
    from appliance.relay.authz import can_read
    from appliance.store.groups import StoredGroups

    registry = app.relay.origins

    def authorize(conn, origin_id: int, reader: str, ev) -> bool:
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

    def make_gateway(origin_id: int, url: str):
        """Delivery through an APNs gateway, NIP-98 signed with the origin's relay key (NIP-11 `self`)."""
        from appliance.transports.gateway import GatewayTransport

        return GatewayTransport(url, lambda: relay_secret(origin_id))

    push = Push(app.store, app.keyfile, workers=app.settings.lease_workers,
                relay_max_content_length=app.settings.max_content_length, authorize=authorize,
                delivery=DeliverySettings.from_settings(app.settings),
                transports=ProfileTransports(make_gateway=make_gateway, derive=app.keyfile.derive),
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


def push_names(store, settings: Settings) -> dict[int, str]:
    """Origin id -> its push table as the operator wrote it in the config file (`[push]`,
    `origins[0].push`), for messages; origins made with the CLI or the dashboard are not here."""
    names: dict[int, str] = {}

    def read(conn):
        default_id = default_origin_id(conn)
        if default_id is not None and settings.push:
            names[default_id] = "[push]"
        by_origin = {o.origin: o.id for o in load_origins(conn)}
        for i, o in enumerate(settings.origins):
            if isinstance(o.get("origin"), str) and o["origin"] in by_origin and o.get("push"):
                names[by_origin[o["origin"]]] = f"origins[{i}].push"

    store.read_sync(read)
    return names


def _nip29_self(app: "Appliance", origin: Origin, doc: dict) -> None:
    """NIP-11 `self`: the relay pubkey that signs this origin's group snapshots."""
    pubkey = app.groups.keys.pubkey(origin.id)
    if pubkey:
        doc["self"] = pubkey


def ensure_relay_keys(store: SqliteStore, groups: Groups, origins: list[Origin]) -> None:
    for o in origins:
        store.write_sync(lambda conn, oid=o.id: groups.keys.get(conn, oid))


class AmbiguousHost(ValueError):
    """A request naming its host more than once."""


def resolve_origin(app: Appliance, headers, path: str) -> Origin:
    """The origin a request names by its Host header and path."""
    hosts = headers.getlist("host")
    if len(hosts) > 1:
        # RFC 9112 3.2: a proxy in front might route by another of them than we would.
        raise AmbiguousHost("more than one Host header")
    return app.relay.origins.resolve(hosts[0] if hosts else None, path)


def asgi(app: Appliance):
    """The ASGI application for HTTP: NIP-11 and the landing page on every path of every routed
    host, NIP-86, the dashboard and the gateway's routes. (Websockets: `websocket_handler`.)"""

    def resolve(headers, path: str) -> Origin:
        return resolve_origin(app, headers, path)

    client_address = app.client_address

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
            return JSONResponse(doc, media_type=NOSTR_JSON, headers=CORS)
        return HTMLResponse(_landing(origin, app.settings))

    @contextlib.asynccontextmanager
    async def lifespan(_starlette):
        app.background.append(asyncio.create_task(app.purge_loop()))
        app.background.append(asyncio.create_task(app.reload_loop()))
        for start in app.on_startup:
            await start()
        if app.push is not None:
            app.background.append(asyncio.create_task(app.push.delivery.run()))
        if app.fanout is not None:
            app.background.append(asyncio.create_task(app.fanout.run()))
        # What startup built (modules, settings, the origin registry) lives as long as the process:
        # out of the cyclic collector's way, so that a full collection, which allocation churn (a
        # flood, say) triggers, scans only what came later. Measured under an EVENT flood on the
        # 2-core box: full collections of 75-120 ms, the event loop stopped and every client
        # waiting, which alone put the bystanders' p99 of `appliance bench flood` past 2x.
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

    routes = [
        Mount("/static", StaticFiles(directory=ROOT / "static"), name="static"),
        *app.routes,
        Route("/{path:path}", http_endpoint, methods=["GET", "HEAD", "OPTIONS", "POST"]),
    ]
    main = Starlette(routes=routes, lifespan=lifespan)
    if app.gateway is None or app.gateway.config.listen:
        return main
    from appliance.gateway.http import GatewayApp

    gateway = GatewayApp(app.gateway)

    async def dispatch(scope, receive, send):
        # The gateway's routes share the main listener: its host (if public_url names one) and path.
        if gateway.owns(scope):
            return await gateway(scope, receive, send)
        return await main(scope, receive, send)

    return dispatch


def websocket_handler(app: Appliance):
    """The relay's websocket endpoint, on every path of every routed host: `await handle(request)`
    for each handshake (an appliance.front.WebSocketRequest), which it accepts (a relay session
    serves the connection until it ends) or denies with an HTTP answer."""

    def resolve(headers, path: str) -> Origin:
        return resolve_origin(app, headers, path)

    def deny(request, status: int, text: str, headers: list[tuple[str, str]] | None = None) -> None:
        request.deny(status, text.encode(), headers)

    async def handle(request) -> None:
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
        address = app.client_address(request)
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


def gateway_asgi(app: Appliance):
    """The gateway routes alone, for their own listener (`gateway_listen`)."""
    from appliance.gateway.http import GatewayApp

    return GatewayApp(app.gateway, match_host=False)


# templates/ and static/ sit beside the package in the source tree (the fixed top-level layout).
ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = Environment(loader=FileSystemLoader(ROOT / "templates"), autoescape=select_autoescape(default=True))


def _landing(origin: Origin, settings: Settings) -> str:
    return TEMPLATES.get_template("index.html").render(
        name=origin.name or origin.origin,
        description=origin.description,
        url=origin.origin,
        version=__version__,
    )


def local_urls(settings: Settings) -> list[str]:
    """Other URLs that reach the default origin when no public URL is set (NIP-42 AUTH accepts a
    relay tag naming any of them): loopback names, and this machine's addresses when listening on
    all interfaces."""
    if settings.public_url:
        return []
    port = settings.port
    host = settings.host
    hosts: list[str] = []
    if host in {"0.0.0.0", "::", ""} or peers.is_loopback(host) or host == "localhost":
        hosts += ["127.0.0.1", "localhost"]
    if host in {"0.0.0.0", "::", ""}:
        hosts += [a for a in peers.local_addresses() if not peers.is_loopback(a)
                  and (host == "::" or ":" not in a) and not a.startswith("fe80:")]
    elif not peers.is_loopback(host) and host != "localhost":
        hosts.append(host)
    urls = []
    for h in hosts:
        url = f"ws://[{h}]:{port}" if ":" in h else f"ws://{h}:{port}"
        if url != settings.effective_public_url and url not in urls:
            urls.append(url)
    return urls


def startup_banner(settings: Settings, app: Appliance) -> list[str]:
    lines = [f"appliance {__version__}: data in {settings.data_path.resolve()}"]
    for origin in app.relay.origins.origins:
        http = origin.origin.replace("wss://", "https://", 1).replace("ws://", "http://", 1)
        lines.append(f"  relay  {origin.origin}   (NIP-11: {http} with Accept: {NOSTR_JSON})")
    for url in local_urls(settings):
        lines.append(f"  also   {url}")
    if app.gateway is not None:
        lines.append(f"  gateway  {app.gateway.config.display_url}")
    lines.extend(app.banner)
    lines.append(f"  listening on {settings.host}:{settings.port}")
    if app.gateway is not None and app.gateway.config.listen:
        lines.append(f"  gateway listening on {app.gateway.config.listen}")
    return lines
