"""`appliance keys list|rotate|erase ORIGIN`: NIP-PL executor encryption keys.

A running appliance picks a rotation up within a second (it watches the config generation). The
edits are functions over a write transaction (`rotate_key`, `erase_key`), shared with the dashboard.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

from appliance.errors import ConfigError
from appliance.commands import add_list_options, find_origin, open_data, print_list, when
from appliance.origins import Origin
from appliance.settings import Settings
from appliance.store.interface import Connection


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="List an origin's executor keys (never the private keys).",
                        description="List the executor keys of an origin: a table, or with --json one object per line.")
    ls.add_argument("origin")
    add_list_options(ls)
    add_setting_flags(ls)
    rot = sub.add_parser("rotate", help="Make a new current key; the old one retires.",
                         description="Rotate the executor encryption key of a push-enabled origin. The old key "
                         "keeps decrypting for max_lease_ttl + allowed_skew, then is rejected.")
    rot.add_argument("origin")
    add_setting_flags(rot)
    erase = sub.add_parser("erase", help="Erase a retired key now (only when no active lease depends on it).",
                           description="Erase the private material of a retiring or expired executor key before "
                           "its window ends. Refused while an active lease was encrypted to it.")
    erase.add_argument("origin")
    erase.add_argument("key_id", metavar="KEY_ID")
    add_setting_flags(erase)


def _push_origin(origin: Origin) -> Origin:
    if not origin.push:
        raise ConfigError("origin", origin.origin, "push is not enabled for this origin (add a push table)")
    return origin


def rotate_key(conn: Connection, keyfile, origin: Origin, now: int):
    """Make a new current executor key; the old one retires for max_lease_ttl + allowed_skew."""
    from appliance.push import keys as keystore
    from appliance.push.config import push_limits
    from appliance.store.meta import bump_generation

    _push_origin(origin)
    keystore.ensure_current(conn, keyfile, origin.id, now)
    row = keystore.rotate(conn, keyfile, origin.id, push_limits(origin.push), now)
    bump_generation(conn)
    return row


def erase_key(conn: Connection, origin: Origin, key_id: str, now: int) -> None:
    """Erase a retired key's private material now, if no active lease depends on it."""
    from appliance.push import keys as keystore
    from appliance.store.meta import bump_generation

    _push_origin(origin)
    try:
        keystore.erase(conn, origin.id, key_id, now)
    except keystore.KeyNotErasable as exc:
        raise ConfigError("key", key_id, str(exc)) from None
    bump_generation(conn)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.push import keys as keystore
    from appliance.store.keyfile import KeyFile

    with open_data(settings) as (store, registry):
        origin = _push_origin(find_origin(registry, args.origin))
        now = int(time.time())
        if args.keys_command == "list":
            rows = [k.to_json() for k in store.read_sync(lambda conn: keystore.list_keys(conn, origin.id))]
            print_list(rows, [("ID", lambda k: k["id"]), ("STATE", lambda k: k["state"]),
                              ("PUBKEY", lambda k: k["pubkey"]), ("CREATED", lambda k: when(k["created_at"])),
                              ("RETIRING SINCE", lambda k: when(k["became_retiring_at"])),
                              ("ACCEPTED UNTIL", lambda k: when(k["accept_until"])),
                              ("PRIVATE KEY", lambda k: "held" if k["private_key_held"] else "erased")],
                       as_json=args.json, empty="no executor keys")
            return 0
        if args.keys_command == "erase":
            store.write_sync(lambda conn: erase_key(conn, origin, args.key_id, now))
            store.scrub_wal()  # best effort; the running appliance scrubs again on its next sweep
            print(json.dumps({"erased": args.key_id}))
            return 0
        keyfile = KeyFile.for_store(settings.data_path, store)
        row = store.write_sync(lambda conn: rotate_key(conn, keyfile, origin, now))
        print(json.dumps(row.to_json()))
    return 0
