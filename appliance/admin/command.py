"""`appliance admin reset|fetch-assets`: a fresh one-time setup URL for an operator who lost the
password; the dashboard's front-end assets from the npm registry, verified."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from appliance.settings import Settings


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    reset = sub.add_parser("reset", help="Forget the admin password and print a fresh one-time setup URL.",
                           description="Forget the dashboard password, sign every session out, and print a new "
                           "one-time URL that sets a password. Works while the appliance runs.")
    add_setting_flags(reset)
    fetch = sub.add_parser("fetch-assets", help="Download the dashboard's htmx from the npm registry, verified.",
                           description="Fetch the pinned htmx release with the npm client, check it against its "
                           "pinned integrity and install it under static/vendor/ (or the data directory).")
    add_setting_flags(fetch)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.admin_command == "fetch-assets":
        from . import assets

        for asset in assets.ASSETS:
            if assets.load(asset, settings.data_path) is not None:
                print(f"{asset.spec}: present and verified ({asset.sri})")
                continue
            path = assets.fetch(asset, settings.data_path)
            print(f"{asset.spec}: fetched, verified ({asset.integrity}) and written to {path}")
        return 0
    from appliance.errors import ConfigError
    from appliance.store.backend import store_for

    from . import auth
    from .web import admin_base_url, setup_url

    from appliance.store.instance import read_instance

    running = read_instance(settings.data_path)
    # The running appliance's own URL names the port it really listens on.
    base = running.get("admin_url") if running else admin_base_url(settings)
    if base is None:
        raise ConfigError("admin_listen", "off", "the dashboard is off; set admin_listen to use it")
    with store_for(settings) as store:
        token = store.write_sync(lambda conn: auth.reset(conn, int(time.time())))
    print(f"  admin  {setup_url(base, token)}")
    print("appliance: the admin password was cleared and every session signed out; the URL above sets a new "
          f"one (it works once, for {auth.SETUP_TOKEN_TTL // 3600} hours).", file=sys.stderr)
    return 0
