"""`appliance keys list|rotate ORIGIN`: NIP-PL executor encryption keys.

A running appliance picks a rotation up within a second (it watches the config generation).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

from appliance.errors import ConfigError
from appliance.commands import find_origin, open_data
from appliance.settings import Settings


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="List an origin's executor keys as JSON (never the private keys).",
                        description="List executor keys.")
    ls.add_argument("origin")
    add_setting_flags(ls)
    rot = sub.add_parser("rotate", help="Make a new current key; the old one retires.",
                         description="Rotate the executor encryption key of a push-enabled origin. The old key "
                         "keeps decrypting for max_lease_ttl + allowed_skew, then is rejected.")
    rot.add_argument("origin")
    add_setting_flags(rot)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.push import keys as keystore
    from appliance.push.config import push_limits
    from appliance.store.meta import bump_generation
    from appliance.store.keyfile import KeyFile

    with open_data(settings) as (store, registry):
        origin = find_origin(registry, args.origin)
        if not origin.push:
            raise ConfigError("origin", args.origin, "push is not enabled for this origin (add a push table)")
        now = int(time.time())
        if args.keys_command == "list":
            for k in store.read_sync(lambda conn: keystore.list_keys(conn, origin.id)):
                print(json.dumps(k.to_json()))
            return 0
        keyfile = KeyFile.for_store(settings.data_path, store)
        limits = push_limits(origin.push)

        def op(conn):
            keystore.ensure_current(conn, keyfile, origin.id, now)
            row = keystore.rotate(conn, keyfile, origin.id, limits, now)
            bump_generation(conn)
            return row

        row = store.write_sync(op)
        print(json.dumps(row.to_json()))
    return 0
