"""`appliance bench NAME`: measurements of this machine, one module per benchmark.

    harness.py   what they share: free ports, percentiles, relay processes (`appliance serve` on a
                 temporary data directory), a process's CPU time and memory
    flood.py     `flood`: a well-behaved client's REQ latency while one connection floods REQs/COUNTs
    relay.py     `relay`: event ingest, OK latency and REQ latency, the read path, nostr-relay beside it,
                 strfry side by side (strfry.py) with --strfry PATH or STRFRY_BIN
    leases.py    `leases`: NIP-PL lease acceptance (NIP-44 decrypt, validation, commit)
    wakes.py     `wakes`: ingest with leases, event-to-APNs latency, peak wakes/s, memory
    gateway.py   `gateway`: enrollment, delegation and delivery through the local APNs gateway
    marmot.py    `marmot-join`: the draft multi-device External Commit in a group of N
    mls.py       `mls`: the MLS core (add members, External Commit build and process)
    crashloop.py `crashloop`: SIGKILLs at random points under load; nothing acknowledged lost, wakes once
    nodes.py     `nodes`: several nodes over one PostgreSQL: ingest and REQ beside SQLite, fan-out and
                 wake latency across nodes
    negentropy.py `negentropy`: NIP-77 reconciliation of two 100k-event stores against strfry, both roles
    slowreaders.py `slow-readers`: never-reading connections asking for large answers; memory, bystander
    soak.py      `soak`: N minutes of mixed load; memory, files, loop lag, latency, queue depth over time
    transfer.py  `transfer`: `appliance import` and `export` of N signed events (strfry's beside them)
    search.py    `search`: NIP-50 one-word REQ latency over N kind-1 events; ingest with the index on/off

Each module offers `add_args(parser)` and `run(args) -> int`; `BENCHMARKS` names them and
`add_parser` makes them subcommands of `appliance bench`, so adding one is adding an entry.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from types import ModuleType

from appliance.bench import (crashloop, flood, gateway, leases, marmot, mls, negentropy, nodes, relay, search,
                             slowreaders, soak, transfer, wakes)


@dataclass(frozen=True)
class Benchmark:
    help: str
    module: ModuleType


BENCHMARKS: dict[str, Benchmark] = {
    "relay": Benchmark("Publish signed events to a fresh relay from concurrent clients; print ingest and REQ speed.",
                       relay),
    "leases": Benchmark("Publish NIP-44 encrypted push leases from authenticated clients; print leases/s and OK "
                        "latency.", leases),
    "marmot-join": Benchmark("Build and process a draft multi-device External Commit in a group of N members; print "
                             "the times.", marmot),
    "gateway": Benchmark("Enroll, delegate and deliver through the local APNs gateway to an APNs emulator; print "
                         "rates and latency.", gateway),
    "wakes": Benchmark("NIP-PL wakes: ingest with 0/10k/100k leases, event-to-APNs latency, peak wakes/s, memory at "
                       "100k leases.", wakes),
    "flood": Benchmark("One connection floods REQs/COUNTs while a well-behaved client times its REQs; print its "
                       "p99 against a quiet relay's (target: within 2x).", flood),
    "mls": Benchmark("MLS core (cipher suite 0x0001): add N members in one Commit, build and process External "
                     "Commits in groups of each size; print the times.", mls),
    "crashloop": Benchmark("SIGKILL the appliance N times at random points under load; after each restart check "
                           "events, wakes (once each), leases and the database's integrity.", crashloop),
    "soak": Benchmark("Mixed load (publish, REQ, live subscriptions, lease churn, wakes to an APNs emulator) for N "
                      "minutes; sample memory, open files, loop lag, latency and queue depth into a CSV and an SVG.",
                      soak),
    "slow-readers": Benchmark("Connections ask for large answers and never read them (30 x 24 REQs of ~8 MB): print "
                              "the relay's peak memory, the connections dropped and a bystander's REQ latency.",
                              slowreaders),
    "nodes": Benchmark("Several appliance nodes over one PostgreSQL: ingest and REQ (SQLite, 1 and 2 PostgreSQL "
                       "nodes), cross-node fan-out latency and wake latency; print p50/p99.", nodes),
    "negentropy": Benchmark("NIP-77: reconcile two stores of N events differing by 1%% with strfry (strfry sync "
                            "against the appliance, appliance sync against strfry); print the appliance's CPU "
                            "seconds.", negentropy),
    "transfer": Benchmark("appliance import (ids and signatures checked) and export of N signed events as JSON "
                          "lines; print events/s, CPU and peak memory.", transfer),
    "search": Benchmark("NIP-50: one-word search REQs (limit 50) over N kind-1 events, p50/p99; ingest with the "
                        "search index on and off.", search),
}


def add_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True)
    for name, bench in BENCHMARKS.items():
        p = sub.add_parser(name, help=bench.help, description=bench.help)
        bench.module.add_args(p)


def run(args: argparse.Namespace) -> int:
    bench = BENCHMARKS.get(getattr(args, "bench_command", None) or "")
    if bench is None:
        print("appliance bench: choose one of " + ", ".join(BENCHMARKS), file=sys.stderr)
        return 2
    return bench.module.run(args)
