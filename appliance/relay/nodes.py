"""Live fan-out across nodes: several appliance processes over one PostgreSQL database.

Each node announces, inside the write transaction of every event it stores (the store's "event
stored" hook), what its own subscribers got from its broadcast: the event, then the relay-signed
group snapshots that transaction wrote, after a group message when the transaction changed a
group's state (a 9000-9022 event). Every other node hears them (appliance.store.notify) and
replays them on its own subscribers through the same broadcast, so the same read authorization
(authz.can_read, against that node's GroupState) decides who gets what. A group message comes
before the events of its transaction, and the listening node reloads that group from the database
before it broadcasts them: read authorization on every node follows a membership change made on
any node.

Payloads (compact JSON, one notification each, always under the 8000-byte NOTIFY limit):

    {"n": node, "o": origin, "e": <the event>}    an event that fits
    {"n": node, "o": origin, "i": "<event id>"}   an event that does not: read back from the database
    {"n": node, "o": origin, "g": "<h>"}          group h of origin changed: reload it

A group edited from the CLI or the dashboard (no event of its own) is announced the same way, by
`announce_edit` inside the edit's transaction: the group message, then its new snapshots.

What is not carried here: origins, keys, blocklists (and, again, group edits) bump the
configuration generation row, which every node polls (Upkeep.reload_loop); and after its
listening connection broke, a node reloads its groups and re-reads the generation at once (what
was announced meanwhile is lost to live subscribers, as it would be across a restart: stored
events stay readable by REQ).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import orjson

from appliance.nostr.event import Event, InvalidEvent, parse_event
from appliance.origins import UnknownOrigin
from appliance.relay.groups import Group, GroupState, read_group
from appliance.relay.relay import Relay
from appliance.store.events import event_raw
from appliance.store.notify import fits

log = logging.getLogger("appliance.relay")


class NodeFanout:
    """Announces this node's stored events and group changes; replays the other nodes' here."""

    def __init__(self, bus, relay: Relay, groups: GroupState, catch_up: Callable[[], Awaitable[object]]):
        self.bus = bus
        self.relay = relay
        self.groups = groups
        self.catch_up = catch_up  # reloads what notifications would have told (see the docstring)
        self.node_id = bus.node_id
        self._prefix = _node_prefix(self.node_id)
        self._sends: set[asyncio.Task] = set()
        self._stale = False  # a group message could not be applied: reload every group
        self.stats = {"announced": 0, "heard": 0, "replayed": 0, "read_back": 0}

    # -- announcing (inside the writer transaction) ------------------------------------------------

    def _event_payload(self, origin: int, ev: Event, raw: str) -> str:
        return _event_payload(self._prefix, origin, ev, raw)

    def stored(self, conn, origin: int, ev: Event, ctx: dict) -> None:
        """The store's "event stored" hook: announce at commit what the local broadcast sends."""
        bus = self.bus
        _announce_groups(bus, self._prefix, conn, ctx)
        bus.announce(conn, self._event_payload(origin, ev, ev.to_json()))
        for extra in ctx.get("broadcast", ()):
            bus.announce(conn, self._event_payload(origin, extra, extra.to_json()))
        self.stats["announced"] += 1

    def ephemeral(self, origin, ev: Event) -> None:
        """An ephemeral event broadcast here (never stored): announced on its own, now."""
        task = asyncio.get_running_loop().create_task(self.bus.send(self._event_payload(origin.id, ev, ev.to_json())))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    # -- hearing -----------------------------------------------------------------------------------

    async def heard(self, payload: str) -> None:
        """One notification from the bus (in the order the nodes committed)."""
        try:
            msg = orjson.loads(payload)
            node, origin_id = msg["n"], msg["o"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("node bus: ignored a notification that is not ours")
            return
        if node == self.node_id:
            return
        self.stats["heard"] += 1
        if self._stale:  # a group could not be read back earlier: read them all now
            try:
                await self.groups.reload(self.relay.store)
                self._stale = False
            except Exception:
                log.exception("node bus: reloading the groups failed")
        if "g" in msg:
            h = msg["g"]
            try:
                group = await self.relay.store.read(lambda conn: read_group(conn, origin_id, h))
            except Exception:
                # Fail closed: until it is read again, the group is private with no members here
                # (its events reach no one on this node), rather than readable as it was before.
                log.exception("node bus: reloading group %s failed; hiding it until the next reload", h)
                group = Group(h, private=True)
                self._stale = True
            self.groups.put(origin_id, h, group)
            return
        try:
            origin = self.relay.origins.by_id(origin_id)
        except UnknownOrigin:
            return  # an origin added since the last reload: no one here subscribes to it yet
        if "e" in msg:
            try:
                ev = parse_event(msg["e"])
            except InvalidEvent:
                log.warning("node bus: ignored a malformed event")
                return
            raw = ev.to_json()
        else:
            raw = await self.relay.store.read(lambda conn: event_raw(conn, origin_id, msg["i"]))
            self.stats["read_back"] += 1
            if raw is None:
                return  # deleted or replaced meanwhile: nothing to send
            ev = parse_event(orjson.loads(raw))
        self.relay.broadcast(origin, ev, raw)
        self.stats["replayed"] += 1

    async def connected(self) -> None:
        """After the listening connection (re)opened: catch up on what it may have missed."""
        try:
            await self.groups.reload(self.relay.store)
            self._stale = False
        except Exception:
            self._stale = True
            raise
        await self.catch_up()

    @property
    def listening(self) -> bool:
        """Whether other nodes' notifications reach this node now (else its mirror of the groups
        may lag: Upkeep.reload_loop then reloads it every second)."""
        return self.bus.listening.is_set()

    async def run(self) -> None:
        await self.bus.run(self.heard, self.connected)

    async def aclose(self) -> None:
        if self._sends:
            await asyncio.gather(*self._sends, return_exceptions=True)
        await self.bus.aclose()


def _node_prefix(node_id: str) -> str:
    return '{"n":' + orjson.dumps(node_id).decode() + ',"o":'


def _event_payload(prefix: str, origin: int, ev: Event, raw: str) -> str:
    payload = f'{prefix}{origin},"e":{raw}}}'
    if fits(payload):
        return payload
    return f'{prefix}{origin},"i":"{ev.id}"}}'


def _announce_groups(bus, prefix: str, conn, ctx: dict) -> None:
    for changed_origin, h in ctx.get("groups_changed", ()):
        bus.announce(conn, f'{prefix}{changed_origin},"g":{orjson.dumps(h).decode()}}}')


def announce_edit(bus, conn, ctx: dict) -> None:
    """A group edited from the CLI or the dashboard (`appliance.commands.groups`), inside its write
    transaction: announce at its commit, as `NodeFanout.stored` does for a moderation event, the
    group change and then the relay-signed snapshots the edit wrote. Every node but the one whose
    bus this is reloads the group, then sends the snapshots to its live subscribers through its
    broadcast (the dashboard's own node broadcasts them itself; a CLI's bus is nobody's node, so
    every node does). Nothing to do on one node (LocalBus) or for an edit that changed no group."""
    changed = ctx.get("groups_changed", ())
    if not getattr(bus, "multi_node", False) or not changed:
        return
    prefix = _node_prefix(bus.node_id)
    _announce_groups(bus, prefix, conn, ctx)
    origin = changed[-1][0]  # an edit is about one group of one origin
    for extra in ctx.get("broadcast", ()):
        bus.announce(conn, _event_payload(prefix, origin, extra, extra.to_json()))
