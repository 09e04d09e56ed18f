"""`appliance groups ...`: create groups and manage admins and members from the command line.

Edits go straight to the database; a running appliance picks them up within a second
(it watches a change counter), so no restart is needed. The edits are functions over a write
transaction (`create_group`, `edit_group`, `set_member`), shared with the dashboard.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Callable

from appliance.errors import ConfigError, Rejected
from appliance.commands import add_list_options, find_origin, open_data, print_list
from appliance.settings import Settings
from appliance.store.interface import Connection


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="groups_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="List the groups of an origin.",
                        description="List the groups of an origin: a table, or with --json one object per line.")
    add_list_options(ls)
    ls.add_argument("origin")
    add_setting_flags(ls)
    create = sub.add_parser("create", help="Create a group.", description="Create a NIP-29 group.")
    create.add_argument("origin")
    create.add_argument("--id", dest="h", help="Group id (default: a new lowercase UUIDv4).")
    create.add_argument("--name", dest="group_name", default="", help="Group name.")
    create.add_argument("--private", action="store_true", help="Only members may read.")
    create.add_argument("--closed", action="store_true", help="Only admins may add members.")
    create.add_argument("--admin", dest="admins", action="append", default=[], metavar="PUBKEY",
                        help="Initial admin (repeatable).")
    add_setting_flags(create)
    for verb, helptext in (("add", "Add a member (or admin with --admin)."), ("remove", "Remove a member.")):
        p = sub.add_parser(verb, help=helptext, description=helptext)
        p.add_argument("origin")
        p.add_argument("h", metavar="GROUP")
        p.add_argument("pubkey")
        if verb == "add":
            p.add_argument("--admin", action="store_true", help="Make the member an admin.")
        add_setting_flags(p)


def _rejected(h: str | None, exc: Rejected) -> ConfigError:
    return ConfigError("group", h, exc.wire)


def create_group(conn: Connection, groups, origin_id: int, ctx: dict, *, h: str | None = None,
                 name: str = "", private: bool = False, closed: bool = False, admins=()) -> str:
    """Create a group (a new lowercase UUIDv4 id unless `h` is given) with its first admins; its id."""
    from appliance.store.meta import bump_generation

    h = h or str(uuid.uuid4())
    try:
        groups.create(conn, origin_id, h, creator=None, ctx=ctx, name=name, private=private, closed=closed)
        for pk in admins:
            groups.set_member(conn, origin_id, h, pk, "admin", ctx)
    except Rejected as exc:
        raise _rejected(h, exc) from None
    bump_generation(conn)
    return h


def edit_group(conn: Connection, groups, origin_id: int, h: str, ctx: dict, *, name: str | None = None,
               private: bool | None = None, closed: bool | None = None) -> None:
    from appliance.store.meta import bump_generation

    try:
        groups.edit(conn, origin_id, h, ctx, name=name, private=private, closed=closed)
    except Rejected as exc:
        raise _rejected(h, exc) from None
    bump_generation(conn)


def set_member(conn: Connection, groups, origin_id: int, h: str, pubkey: str, role: str | None,
               ctx: dict) -> None:
    """Add a member (role '' or 'admin') or remove one (role None)."""
    from appliance.store.meta import bump_generation

    try:
        groups.set_member(conn, origin_id, h, pubkey, role, ctx)
    except Rejected as exc:
        raise _rejected(h, exc) from None
    bump_generation(conn)


def group_json(g) -> dict:
    return {"id": g.h, "name": g.name, "private": g.private, "closed": g.closed, "members": g.members}


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.relay.groups import Groups, GroupState, RelayKeys, read_group
    from appliance.store.keyfile import KeyFile

    with open_data(settings) as (store, registry):
        origin = find_origin(registry, args.origin)
        state = GroupState()
        store.read_sync(state.load)
        if args.groups_command == "list":
            print_list([group_json(g) for g in state.groups_of(origin.id)],
                       [("ID", lambda g: g["id"]), ("NAME", lambda g: g["name"]),
                        ("PRIVATE", lambda g: "yes" if g["private"] else "no"),
                        ("CLOSED", lambda g: "yes" if g["closed"] else "no"),
                        ("MEMBERS", lambda g: len(g["members"]))], as_json=args.json, empty="no groups")
            return 0
        groups = Groups(state, RelayKeys(KeyFile.for_store(settings.data_path, store)),
                        h_grammar=lambda _o: origin.push.get("h_grammar", "uuid-v4-lowercase"))
        cmd = args.groups_command
        from appliance.relay.nodes import announce_edit
        from appliance.store.notify import make_bus

        bus = make_bus(store)  # several nodes: their live subscribers get the new snapshots

        def op(conn):
            ctx: dict = {}
            if cmd == "create":
                h = create_group(conn, groups, origin.id, ctx, h=args.h, name=args.group_name,
                                 private=args.private, closed=args.closed, admins=args.admins)
            else:
                h = args.h
                role = None if cmd == "remove" else ("admin" if args.admin else "")
                set_member(conn, groups, origin.id, h, args.pubkey, role, ctx)
            announce_edit(bus, conn, ctx)
            return read_group(conn, origin.id, h)

        print(json.dumps(group_json(store.write_sync(op))))
    return 0
