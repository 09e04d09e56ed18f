"""`appliance origins ...`: list, add, edit and remove communities from the command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Callable

from appliance.errors import ConfigError
from appliance.origins import Origin, check_routes, load_origins, save_origin
from appliance.settings import Settings


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="origins_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="List origins as JSON.", description="List every origin with its settings.")
    add_setting_flags(ls)
    add = sub.add_parser("add", help="Add an origin.", description="Add a community served by this process.")
    add.add_argument("origin", help="Canonical origin, e.g. wss://chat.example.org")
    _origin_fields(add)
    add_setting_flags(add)
    edit = sub.add_parser("set", help="Change an origin's fields.", description="Edit an existing origin.")
    edit.add_argument("origin")
    _origin_fields(edit)
    add_setting_flags(edit)
    for verb, helptext in (("allow", "Add pubkeys to the allowlist (members)."),
                           ("disallow", "Remove pubkeys from the allowlist."),
                           ("block", "Add pubkeys to the blocklist."),
                           ("unblock", "Remove pubkeys from the blocklist.")):
        p = sub.add_parser(verb, help=helptext, description=helptext)
        p.add_argument("origin")
        p.add_argument("pubkeys", nargs="+", metavar="PUBKEY")
        add_setting_flags(p)


def _origin_fields(p: argparse.ArgumentParser) -> None:
    p.add_argument("--route-host", dest="hosts", action="append", metavar="HOST",
                   help="Host name routed to this origin (repeatable). Default: the origin's host.")
    p.add_argument("--route-path", dest="route_path", metavar="PATH", help="Path prefix routed to this origin.")
    p.add_argument("--name", dest="origin_name", help="NIP-11 name.")
    p.add_argument("--description", dest="origin_description", help="NIP-11 description.")
    p.add_argument("--policy", dest="policy", choices=("public", "members"), help="Access policy.")


def _fields(args: argparse.Namespace) -> dict:
    out = {}
    for attr, key in (("hosts", "hosts"), ("route_path", "path"), ("origin_name", "name"),
                      ("origin_description", "description"), ("policy", "access_policy")):
        value = getattr(args, attr, None)
        if value is not None:
            out[key] = value
    return out


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.app import prepare_origins
    from appliance.store.sqlite import SqliteStore

    with SqliteStore(settings.data_path, sync_mode=settings.sync_mode) as store:
        prepare_origins(store, settings, serving=False)
        cmd = args.origins_command
        if cmd == "list":
            for o in store.read_sync(load_origins):
                print(json.dumps({"id": o.id, "origin": o.origin, **json.loads(o.config_json())}))
            return 0

        def find(conn) -> Origin:
            for o in load_origins(conn):
                if o.origin == args.origin:
                    return o
            raise ConfigError("origin", args.origin, "no such origin; `appliance origins list` shows them")

        if cmd == "add":
            def op(conn):
                if any(o.origin == args.origin for o in load_origins(conn)):
                    raise ConfigError("origin", args.origin, "already exists; use `appliance origins set`")
                return save_origin(conn, Origin.from_mapping({"origin": args.origin, **_fields(args)}))
        elif cmd == "set":
            def op(conn):
                current = find(conn)
                data = {"origin": current.origin, **json.loads(current.config_json()), **_fields(args)}
                return save_origin(conn, Origin.from_mapping(data))
        else:
            def op(conn):
                current = find(conn)
                keys = set(args.pubkeys)
                probe = Origin.from_mapping({"origin": current.origin, "allow": sorted(keys)})  # validates hex
                keys = set(probe.allow)
                if cmd == "allow":
                    updated = replace(current, allow=current.allow | keys)
                elif cmd == "disallow":
                    updated = replace(current, allow=current.allow - keys)
                elif cmd == "block":
                    updated = replace(current, block=current.block | keys)
                else:
                    updated = replace(current, block=current.block - keys)
                return save_origin(conn, updated)
        from appliance.store.meta import bump_generation

        def op_and_bump(conn):
            saved = op(conn)
            check_routes(load_origins(conn))  # refused here, not at the next start
            bump_generation(conn)  # a running appliance reloads origins within a second
            return saved

        saved = store.write_sync(op_and_bump)
        print(json.dumps({"id": saved.id, "origin": saved.origin, **json.loads(saved.config_json())}))
    return 0
