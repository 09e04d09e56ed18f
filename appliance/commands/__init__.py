"""CLI subcommands that manage a data directory (origins, groups, executor keys).

Each module offers `add_parser(parser, add_setting_flags)` and `run(args, settings) -> int`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from appliance.errors import ConfigError
from appliance.origins import Origin, OriginRegistry, UnknownOrigin
from appliance.settings import Settings
from appliance.store.sqlite import SqliteStore


@contextlib.contextmanager
def open_data(settings: Settings) -> Iterator[tuple[SqliteStore, OriginRegistry]]:
    """The data directory's store and origins, for a command run beside (or without) the server."""
    from appliance.app import prepare_origins

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


def find_origin(registry: OriginRegistry, origin: str) -> Origin:
    try:
        return registry.by_origin(origin)
    except UnknownOrigin:
        raise ConfigError("origin", origin, "no such origin; `appliance origins list` shows them") from None
