"""`appliance migrate-to-postgres URL`: copy this data directory's SQLite store into an empty
PostgreSQL database, keys included, and verify the row counts (see store.copy).

Refused while an appliance serves the data directory (its lock): what it wrote after the copy
would be left behind. Afterwards, start the appliance with `storage = "URL"`; the key file stays
in the data directory (every node over that database needs a copy of it).
"""

from __future__ import annotations

import argparse
from typing import Callable

from appliance.errors import StoreError
from appliance.settings import Settings
from appliance.store.dsn import is_postgres, redact
from appliance.store.instance import InstanceLock
from appliance.store.keyfile import KEYFILE_NAME
from appliance.store.sqlite import DB_FILENAME, SqliteStore


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    parser.add_argument("url", metavar="URL",
                        help="The empty PostgreSQL database to copy into: postgresql://USER:PASSWORD@HOST/DB "
                        "(?host=/run/postgresql for a Unix socket).")
    add_setting_flags(parser)


def run(args: argparse.Namespace, settings: Settings) -> int:
    url = args.url
    if not is_postgres(url):
        raise StoreError("the target must be a postgresql:// URL")
    data_dir = settings.data_path
    if not (data_dir / DB_FILENAME).is_file():
        raise StoreError(f"there is no SQLite store in {data_dir} ({DB_FILENAME}): nothing to copy")
    from appliance.store.copy import copy_to_postgres

    with InstanceLock(data_dir).acquire(write_pid=False):
        with SqliteStore(data_dir, sync_mode=settings.values["sync_mode"]) as store:  # at the current schema
            counts = store.read_sync(lambda conn: copy_to_postgres(conn, url))
    width = max(len(c.table) for c in counts)
    print(f"copied {data_dir / DB_FILENAME} into {redact(url)}")
    print(f"{'table':<{width}}  {'sqlite':>10}  {'postgresql':>10}")
    for c in counts:
        print(f"{c.table:<{width}}  {c.sqlite:>10}  {c.postgresql:>10}")
    print(f"verified: {len(counts)} tables, {sum(c.sqlite for c in counts)} rows, every count equal")
    print(f'next: serve with storage = "{redact(url)}" (the URL with its password), keeping '
          f"{data_dir / KEYFILE_NAME}: every node over this database needs a copy of that key file")
    return 0
