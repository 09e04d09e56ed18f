"""NIP-29 style groups (channels, `h` tag): state, moderation, relay-signed snapshots.

Group state lives in the `groups` and `group_members` tables and changes only inside the writer
transaction of the event that changes it (9000-9022) or of a CLI edit. `GroupState` is the
in-memory mirror that read authorization consults for every broadcast; the writer transaction
hands it the new state to apply right after commit, before any later event is broadcast.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from appliance.errors import Rejected
from appliance.nostr.event import Event, is_event_id as is_pubkey, sign_event
from appliance.nostr.keys import generate_secret, public_key
from appliance.store import groups as store_groups
from appliance.store.events import address_rows, group_of, store_event
from appliance.store.groups import Group, read_group
from appliance.store.interface import Connection, Store
from appliance.store.keyfile import KeyFile
from appliance.store.meta import node_lock

if TYPE_CHECKING:
    from appliance.origins import Origin

PUT_USER, REMOVE_USER, EDIT_METADATA, DELETE_EVENT, CREATE_GROUP, DELETE_GROUP = 9000, 9001, 9002, 9005, 9007, 9008
JOIN_REQUEST, LEAVE_REQUEST = 9021, 9022
MODERATION_KINDS = frozenset({PUT_USER, REMOVE_USER, EDIT_METADATA, DELETE_EVENT, DELETE_GROUP})
METADATA, ADMINS, MEMBERS = 39000, 39001, 39002
RELAY_SIGNED_KINDS = frozenset(range(39000, 39010))
_GROUP_PROTOCOL_KINDS = RELAY_SIGNED_KINDS | MODERATION_KINDS | {CREATE_GROUP, JOIN_REQUEST, LEAVE_REQUEST}

H_GRAMMARS: dict[str, Callable[[str], bool]] = {
    "uuid-v4-lowercase": re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}").fullmatch,
}
DEFAULT_H_GRAMMAR = "uuid-v4-lowercase"


class GroupState:
    """In-memory mirror of every origin's groups; implements `authz.GroupView`. Changed and read on
    the loop only (`reload` reads the store on a reader thread, then applies it on the loop)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, str], Group] = {}
        self._private: dict[int, set[str]] = {}
        # Per reload in flight, the changes applied while its read runs: its snapshot may predate
        # their commits, so they are applied again over it (a removed member stays removed).
        self._reloading: list[list[tuple[int, str, Group | None]]] = []

    def load(self, conn: Connection) -> None:
        """Every group, from `conn`, applied on this thread: at start and in the CLI only."""
        self._replace(store_groups.all_groups(conn))

    async def reload(self, store: Store) -> None:
        """Every group read again on a reader thread and applied here, on the loop: the loop changes
        the mirror in place (`put`), so no other thread may look through it."""
        made: list[tuple[int, str, Group | None]] = []
        self._reloading.append(made)
        try:
            groups = await store.read(store_groups.all_groups)
        finally:
            self._reloading.remove(made)
        self._replace(groups)
        for origin, h, group in made:
            self.put(origin, h, group)

    def _replace(self, groups: dict[tuple[int, str], Group]) -> None:
        self._groups = groups
        self._reindex()

    def _reindex(self) -> None:
        private: dict[int, set[str]] = {}
        for (origin, h), g in self._groups.items():
            if g.private:
                private.setdefault(origin, set()).add(h)
        self._private = private

    def put(self, origin: int, h: str, group: Group | None) -> None:
        """Apply a committed change (None: the group was deleted)."""
        for made in self._reloading:
            made.append((origin, h, group))
        if group is None:
            self._groups.pop((origin, h), None)
        else:
            self._groups[(origin, h)] = group
        self._reindex()

    def get(self, origin: int, h: str) -> Group | None:
        return self._groups.get((origin, h))

    def groups_of(self, origin: int) -> list[Group]:
        return [g for (o, _h), g in self._groups.items() if o == origin]

    # GroupView
    def is_private(self, origin_id: int, group: str) -> bool:
        g = self._groups.get((origin_id, group))
        return g is not None and g.private

    def is_member(self, origin_id: int, group: str, pubkey: str) -> bool:
        g = self._groups.get((origin_id, group))
        return g is not None and pubkey in g.members

    def hidden_groups(self, origin_id: int, reader: str | None) -> frozenset[str]:
        private = self._private.get(origin_id)
        if not private:
            return frozenset()
        return frozenset(h for h in private if reader is None or reader not in self._groups[(origin_id, h)].members)


class RelayKeys:
    """Per-origin relay signing keys (NIP-29 snapshots), wrapped at rest by the key file."""

    def __init__(self, keyfile: KeyFile):
        self.keyfile = keyfile
        self._cache: dict[int, tuple[str, str]] = {}

    def pubkey(self, origin: int) -> str | None:
        cached = self._cache.get(origin)
        return cached[1] if cached else None

    def secret(self, origin: int) -> str | None:
        """The origin's relay secret key, once loaded (it also signs NIP-98 gateway deliveries)."""
        cached = self._cache.get(origin)
        return cached[0] if cached else None

    def get(self, conn: Connection, origin: int) -> tuple[str, str]:
        """(secret_hex, pubkey) of the origin's relay key, created on first use."""
        cached = self._cache.get(origin)
        if cached is not None:
            return cached
        node_lock(conn, f"relay-key:{origin}")  # several nodes: one makes it, the others read it
        row = store_groups.relay_key(conn, origin)
        label = f"relay-key:{origin}"
        if row is None:
            secret = generate_secret()
            pub = public_key(secret)
            store_groups.save_relay_key(conn, origin, pub, self.keyfile.wrap(bytes.fromhex(secret), label=label))
        else:
            pub, wrapped = row
            secret = self.keyfile.unwrap(wrapped, label=label).hex()
        self._cache[origin] = (secret, pub)
        return secret, pub

    def ensure(self, store: Store, origins: Iterable[Origin]) -> None:
        """Every origin has its relay key (NIP-29 group snapshots, NIP-98 to a gateway)."""
        for o in origins:
            store.write_sync(lambda conn, oid=o.id: self.get(conn, oid))


class Groups:
    """The NIP-29 rules, as in-transaction hooks for the relay's store."""

    def __init__(self, state: GroupState, keys: RelayKeys, h_grammar: Callable[[int], str] = lambda _o: DEFAULT_H_GRAMMAR):
        self.state = state
        self.keys = keys
        self.h_grammar = h_grammar

    def nip11(self, origin: Origin, doc: dict[str, Any]) -> None:
        """NIP-11 `self`: the relay pubkey that signs this origin's group snapshots."""
        pubkey = self.keys.pubkey(origin.id)
        if pubkey:
            doc["self"] = pubkey

    # -- the in-transaction check hook ---------------------------------------------------------

    @staticmethod
    def wants(ev: Event) -> bool:
        """The events `check` must see: group-scoped ones and the group protocol kinds."""
        return ev.kind in _GROUP_PROTOCOL_KINDS or group_of(ev) is not None

    def check(self, conn: Connection, origin: int, ev: Event, ctx: dict) -> None:
        # Runs for every event taking the one-by-one path, whatever `wants` says: events whose
        # h tag is not a NIP-29 group (Marmot group messages) are not this hook's business.
        if ev.kind not in _GROUP_PROTOCOL_KINDS and group_of(ev) is None:
            return
        if ev.kind in RELAY_SIGNED_KINDS:
            raise Rejected("restricted", "group metadata events are generated by the relay")
        hs = ev.tag_values("h")
        if not hs:
            if ev.kind in MODERATION_KINDS or ev.kind in (CREATE_GROUP, JOIN_REQUEST, LEAVE_REQUEST):
                raise Rejected("invalid", "group events need an h tag")
            return
        if len(hs) > 1:
            raise Rejected("invalid", "an event belongs to at most one group (one h tag)")
        h = hs[0]
        if ev.kind == CREATE_GROUP:
            self.create(conn, origin, h, creator=ev.pubkey, ctx=ctx)
            return
        group = read_group(conn, origin, h)
        if group is None:
            raise Rejected("invalid", "group not found")
        if ev.kind == JOIN_REQUEST:
            if ev.pubkey in group.members:
                raise Rejected("duplicate", "already a member")
            if group.closed:
                raise Rejected("restricted", "this group is closed: an admin must add you")
            store_groups.put_member(conn, origin, h, ev.pubkey, "")
        elif ev.kind == LEAVE_REQUEST:
            if ev.pubkey not in group.members:
                raise Rejected("duplicate", "not a member")
            store_groups.remove_member(conn, origin, h, ev.pubkey)
        elif ev.kind in MODERATION_KINDS:
            if not group.is_admin(ev.pubkey):
                raise Rejected("restricted", "only group admins may do this")
            self._moderate(conn, origin, group, ev)
        else:
            if ev.pubkey not in group.members:
                raise Rejected("restricted", "not a member of this group")
            return
        self.changed(conn, origin, h, ctx)

    def check_ephemeral(self, origin, ev: Event) -> None:
        """The posting rule for events that are broadcast but never stored (ephemeral kinds), against
        the committed in-memory state: a group's events come from its members only."""
        hs = ev.tag_values("h")
        if not hs or group_of(ev) is None:
            return
        if len(hs) > 1:
            raise Rejected("invalid", "an event belongs to at most one group (one h tag)")
        group = self.state.get(origin.id, hs[0])
        if group is None:
            raise Rejected("invalid", "group not found")
        if ev.pubkey not in group.members:
            raise Rejected("restricted", "not a member of this group")

    def _moderate(self, conn: Connection, origin: int, group: Group, ev: Event) -> None:
        h = group.h
        if ev.kind == PUT_USER:
            for tag in ev.tags:
                if len(tag) >= 2 and tag[0] == "p":
                    role = "admin" if len(tag) >= 3 and tag[2] == "admin" else ""
                    store_groups.put_member(conn, origin, h, tag[1], role)
        elif ev.kind == REMOVE_USER:
            for pk in ev.tag_values("p"):
                store_groups.remove_member(conn, origin, h, pk)
        elif ev.kind == EDIT_METADATA:
            g = group
            name = ev.first_tag("name")
            about = ev.first_tag("about")
            picture = ev.first_tag("picture")
            flags = {t[0] for t in ev.tags if t and t[0] in ("open", "closed", "public", "private")}
            closed = True if "closed" in flags else False if "open" in flags else g.closed
            private = True if "private" in flags else False if "public" in flags else g.private
            store_groups.update_group(conn, origin, h, name=name if name is not None else g.name,
                                      about=about if about is not None else g.about,
                                      picture=picture if picture is not None else g.picture,
                                      closed=closed, private=private)
        elif ev.kind == DELETE_EVENT:
            from appliance.store.events import delete_row

            for eid in ev.tag_values("e"):
                rowid = store_groups.group_event_row(conn, origin, h, eid)
                if rowid is not None:
                    delete_row(conn, rowid)
        elif ev.kind == DELETE_GROUP:
            from appliance.store.events import delete_row

            for rowid in store_groups.group_event_rows(conn, origin, h):
                delete_row(conn, rowid)
            store_groups.drop_group(conn, origin, h)

    # -- state changes usable from events and from the CLI -------------------------------------

    def create(self, conn: Connection, origin: int, h: str, *, creator: str | None, ctx: dict,
               name: str = "", private: bool = False, closed: bool = False) -> None:
        grammar = self.h_grammar(origin)
        valid = H_GRAMMARS.get(grammar)
        if valid is None:
            raise Rejected("error", f"this community's group id grammar {grammar!r} is not supported")
        if not valid(h):
            raise Rejected("invalid", f"group id must be {grammar}")
        if store_groups.group_exists(conn, origin, h):
            raise Rejected("duplicate", "group already exists")
        store_groups.create_group(conn, origin, h, name=name, closed=closed, private=private, now=int(time.time()))
        if creator is not None:
            store_groups.put_member(conn, origin, h, creator, "admin")
        self.changed(conn, origin, h, ctx)

    def edit(self, conn: Connection, origin: int, h: str, ctx: dict, *, name: str | None = None,
             private: bool | None = None, closed: bool | None = None) -> None:
        """Change a group's name and flags (what a 9002 event does); for operators."""
        g = read_group(conn, origin, h)
        if g is None:
            raise Rejected("invalid", "group not found")
        store_groups.update_group(conn, origin, h, name=g.name if name is None else name, about=g.about,
                                  picture=g.picture, closed=g.closed if closed is None else closed,
                                  private=g.private if private is None else private)
        self.changed(conn, origin, h, ctx)

    def set_member(self, conn: Connection, origin: int, h: str, pubkey: str, role: str | None, ctx: dict) -> None:
        """Add (role '' or 'admin') or remove (role None) a member; for the CLI."""
        if not is_pubkey(pubkey):
            raise Rejected("invalid", f"{pubkey!r} is not a pubkey (64 lowercase hex characters)")
        group = read_group(conn, origin, h)
        if group is None:
            raise Rejected("invalid", "group not found")
        if role is None:
            if pubkey not in group.members:
                raise Rejected("invalid", "not a member of this group")
            store_groups.remove_member(conn, origin, h, pubkey)
        else:
            store_groups.put_member(conn, origin, h, pubkey, role)
        self.changed(conn, origin, h, ctx)

    def changed(self, conn: Connection, origin: int, h: str, ctx: dict) -> None:
        """After a change: regenerate the relay-signed snapshots and queue the state update."""
        group = read_group(conn, origin, h)
        snapshots = self._snapshots(conn, origin, h, group)
        ctx.setdefault("broadcast", []).extend(snapshots)
        ctx.setdefault("after_commit", []).append(lambda: self.state.put(origin, h, group))
        # Other nodes over the same database reload this group (appliance.relay.nodes).
        ctx.setdefault("groups_changed", []).append((origin, h))

    def _snapshots(self, conn: Connection, origin: int, h: str, group: Group | None) -> list[Event]:
        secret, pub = self.keys.get(conn, origin)
        now = int(time.time())
        out: list[Event] = []
        if group is None:
            specs: Iterable = ((kind, None) for kind in (METADATA, ADMINS, MEMBERS))
        else:
            meta = [["d", h], ["name", group.name], ["about", group.about], ["picture", group.picture],
                    ["private" if group.private else "public"], ["closed" if group.closed else "open"]]
            admins = [["d", h]] + [["p", pk, "admin"] for pk, role in sorted(group.members.items()) if role == "admin"]
            members = [["d", h]] + [["p", pk] for pk in sorted(group.members)]
            specs = ((METADATA, meta), (ADMINS, admins), (MEMBERS, members))
        for kind, tags in specs:
            previous = address_rows(conn, origin, pub, kind, h)
            created_at = max([now] + [c + 1 for _r, _i, c in previous])
            if tags is None:  # group deleted: drop its snapshots
                from appliance.store.events import delete_row

                for rowid, _i, _c in previous:
                    delete_row(conn, rowid)
                continue
            ev = sign_event(secret, kind, tags, "", created_at)
            # The member list of a private group is itself private: file it under the group.
            grp = h if kind == MEMBERS and group.private else None
            store_event(conn, origin, ev, raw=ev.to_json(), expiration=None, now=now, grp=grp)
            out.append(ev)
        return out
