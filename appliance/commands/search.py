"""`appliance search reindex`: rebuild the NIP-50 full-text index for the kinds in `search_kinds`.

The index is kept by the writer in each event's own transaction; a rebuild is only needed after
restoring an index by other means or to make sure it holds exactly the events of the kinds
configured. It runs beside the server, one chunk of 10,000 events per write transaction (searches
meanwhile miss the events not indexed again yet).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from appliance.settings import Settings


def add_parser(sub, add_setting_flags: Callable) -> None:
    search = sub.add_parser("search", help="NIP-50 search: rebuild the full-text index.",
                            description="Manage the NIP-50 full-text index.")
    actions = search.add_subparsers(dest="search_command", metavar="ACTION", required=True)
    reindex = actions.add_parser(
        "reindex", help="Rebuild the full-text index of the events of the kinds in search_kinds.",
        description="Drop the NIP-50 full-text index and write it again for every stored event whose kind is in "
        "search_kinds (give the same configuration as the server). Runs beside the server.")
    add_setting_flags(reindex)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.commands import open_data
    from appliance.store.search import Rebuild

    kinds = settings.search_kinds
    with open_data(settings) as (store, _registry):
        last = [time.monotonic()]

        def progress(r: Rebuild) -> None:
            if time.monotonic() - last[0] >= 2:
                last[0] = time.monotonic()
                print(f"search: progress: {r.after:,} of {r.bound or 0:,} rowids", file=sys.stderr, flush=True)

        rebuild = Rebuild(kinds, full=True).run(store.write_sync, progress)
    print(f"search: reindexed {rebuild.events} events of kinds {list(kinds)}")
    return 0
