"""CLI subcommands that manage a data directory (origins, groups, executor keys).

Each module offers `add_parser(parser, add_setting_flags)` and `run(args, settings) -> int`.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from appliance.errors import ConfigError
from appliance.origins import Origin, OriginRegistry, UnknownOrigin
from appliance.settings import Settings
from appliance.store.interface import Store


@contextlib.contextmanager
def open_data(settings: Settings) -> Iterator[tuple[Store, OriginRegistry]]:
    """The data directory's store and origins, for a command run beside (or without) the server."""
    from appliance.origin_config import prepare_origins

    from appliance.store.backend import store_for

    with store_for(settings) as store:
        yield store, OriginRegistry(prepare_origins(store, settings, serving=False))


def follow_running(settings: Settings) -> dict | None:
    """The record of the appliance serving this data directory now (None when none runs); its
    listen address replaces `host` and `port`, so what a command prints names the real port."""
    from appliance.store.instance import read_instance

    running = read_instance(settings.data_path)
    listen = (running or {}).get("listen") or []
    if listen:
        host, _, port = listen[0].rpartition(":")
        if port.isdigit():
            for name, value in (("host", host.strip("[]")), ("port", int(port))):
                if settings.values[name] != value:
                    settings.values[name] = value
                    setattr(settings, name, value)
                    settings.sources[name] = "running appliance"
    return running


def read_stored_settings(settings: Settings) -> dict:
    """The settings saved from the dashboard, read without changing anything ({} when there is no
    database yet, or it cannot be read: `doctor` says why)."""
    from appliance.store.admin import stored_settings
    from appliance.store.dsn import is_postgres

    errors: tuple = (OSError,)
    try:
        from appliance.store.backend import database_errors

        errors += database_errors()
        if is_postgres(settings.storage):
            from appliance.store import pg_check

            conn = pg_check.connect(settings.storage)
        else:
            from appliance.store.sqlite import DB_FILENAME, connect

            path = settings.data_path / DB_FILENAME
            if not path.exists():
                return {}
            conn = connect(path, readonly=True)
        try:
            return stored_settings(conn)
        finally:
            conn.close()
    except errors:
        return {}


def add_list_options(parser) -> None:
    parser.add_argument("--json", action="store_true", help="One JSON object per line (for scripts) instead of a table.")


def print_list(rows: list[dict], columns: list[tuple[str, Callable[[dict], object]]], *, as_json: bool,
               empty: str) -> None:
    """A list as an aligned table with a header (`empty` when there is nothing), or with --json one
    JSON object per line (nothing when empty)."""
    import json

    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    if not rows:
        print(empty)
        return
    cells = [[h for h, _ in columns]] + [["-" if (v := get(r)) is None or v == "" else str(v) for _, get in columns]
                                         for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())


def when(ts) -> str | None:
    """A Unix time as the tables show it (UTC)."""
    import time

    return None if ts is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def find_origin(registry: OriginRegistry, origin: str) -> Origin:
    try:
        return registry.by_origin(origin)
    except UnknownOrigin:
        raise ConfigError("origin", origin, "no such origin; `appliance origins list` shows them") from None
