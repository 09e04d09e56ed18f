"""`appliance gateway keys list|rotate`: the gateway's grant-sealing keys.

Rotation makes a new current key; the old one keeps opening the grants it sealed until the last of
them expires, then its secret is erased. A running appliance picks a rotation up within a second.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

from appliance.commands import add_list_options, open_data, print_list, when
from appliance.settings import Settings


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    keys = sub.add_parser("keys", help="List or rotate the keys that seal endpoint grants.",
                          description="Grant-sealing keys of the APNs gateway.")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    ls = keys_sub.add_parser("list", help="List grant keys (never the secrets).",
                             description="List grant keys: a table, or with --json one object per line.")
    add_list_options(ls)
    add_setting_flags(ls)
    rot = keys_sub.add_parser("rotate", help="Make a new current grant key; the old one becomes decrypt-only.",
                              description="Rotate the grant-sealing key. Grants sealed by the old key keep "
                              "working until they expire.")
    add_setting_flags(rot)


def rotate_grant_key(conn, keyfile, now: int):
    """A new current grant-sealing key (the old one keeps opening its grants until they expire)."""
    from appliance.gateway import authority
    from appliance.store.meta import bump_generation

    authority.ensure_grant_key(conn, keyfile, now)
    kid = authority.rotate_grant_key(conn, keyfile, now)
    bump_generation(conn)
    return next(k for k in authority.grant_keys(conn) if k.key_id == kid)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.gateway import authority
    from appliance.store.keyfile import KeyFile

    with open_data(settings) as (store, _registry):
        now = int(time.time())
        if args.keys_command == "list":
            print_list([row.to_json() for row in store.read_sync(authority.grant_keys)],
                       [("ID", lambda k: k["id"]), ("STATE", lambda k: k["state"]),
                        ("CREATED", lambda k: when(k["created_at"])), ("RETIRED", lambda k: when(k["retired_at"])),
                        ("DECRYPTS UNTIL", lambda k: when(k["decrypts_until"])),
                        ("SECRET", lambda k: "held" if k["secret_held"] else "erased")],
                       as_json=args.json, empty="no grant keys")
            return 0
        keyfile = KeyFile.for_store(settings.data_path, store)
        print(json.dumps(store.write_sync(lambda conn: rotate_grant_key(conn, keyfile, now)).to_json()))
    return 0
