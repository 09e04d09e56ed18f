"""`appliance bench nodes`: several appliance processes over one PostgreSQL database,
measured beside SQLite.

Needs a PostgreSQL cluster: `--postgres URL` names its maintenance database (default
$APPLIANCE_BENCH_PG); every part creates a scratch database of its own there and drops it after.
Each node is `appliance serve` on a temporary data directory (the first node's key file copied to
the others) with the same public URL, as behind a load balancer.

- ingest:  the same signed events published by `--clients` connections (window `--window`) to one
           SQLite node, one PostgreSQL node and two PostgreSQL nodes (the clients split between
           them): events/s, OK p50/p99, the nodes' CPU ms per event (schedstat, every thread) and
           the PostgreSQL backends' (their pids' schedstat, when the cluster runs on this host);
           then `--queries` REQs (an author's latest 20) answered by each node in turn: REQ p50/p99.
- fanout:  a live subscriber on node A, a publisher on node B: time from EVENT sent to B to the
           event arriving at A (both clocks are this host's), for events small enough to travel in
           the notification and for ones that do not (read back by id), beside the same with the
           publisher on A (the local broadcast).
- wakes:   a NIP-PL lease accepted on node A, events mentioning its author published on node B:
           time from EVENT sent to the APNs emulator receiving the wake, beside the event
           published on node A.

A shared or busy machine gives noisy figures (the load average is printed): compare runs taken
back to back, and the CPU ms per event, which load inflates far less than wall-clock latency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import orjson

from appliance.bench.harness import NostrClient, appliance_process, cpu_seconds, free_port, info, percentile
from appliance.bench.relay import ingest, load_average

PUBLIC = "ws://bench.nodes"
PARTS = ("ingest", "fanout", "wakes")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--postgres", default=os.environ.get("APPLIANCE_BENCH_PG", ""), metavar="URL",
                   help="a PostgreSQL cluster's maintenance database (scratch databases are created and dropped "
                        "there) [env APPLIANCE_BENCH_PG]")
    p.add_argument("--parts", default=",".join(PARTS), help=f"which parts, comma-separated ({', '.join(PARTS)})")
    p.add_argument("--events", type=int, default=6000, help="events published in the ingest part")
    p.add_argument("--clients", type=int, default=8, help="publishing connections in the ingest part")
    p.add_argument("--window", type=int, default=50, help="EVENTs in flight per connection")
    p.add_argument("--queries", type=int, default=400, help="REQs timed per configuration")
    p.add_argument("--fanout", type=int, default=400, help="events timed per fan-out case")
    p.add_argument("--wakes", type=int, default=100, help="wakes timed per case")
    p.add_argument("--sync-mode", default="normal", choices=("full", "normal"),
                   help="the nodes' sync_mode (normal: what `bench relay` measures by default)")


# -- scratch databases and nodes -----------------------------------------------------------------


class Cluster:
    def __init__(self, admin_url: str):
        self.admin_url = admin_url
        self.made: list[str] = []

    def database(self) -> str:
        from appliance.store.scratch import create_scratch_database

        name, url = create_scratch_database(self.admin_url, "appliance_bench_")
        self.made.append(name)
        return url

    def drop(self) -> None:
        from appliance.store.scratch import drop_databases

        drop_databases(self.admin_url, self.made)
        self.made.clear()


class Nodes:
    """`count` appliance processes over one store (`storage`: 'sqlite' or a PostgreSQL URL)."""

    def __init__(self, work: Path, name: str, storage: str, count: int, sync_mode: str, config: str | None = None):
        self.procs = []
        base = work / name
        base.mkdir()
        extra = ["--storage", storage]
        if config is None:
            extra += ["--public-url", PUBLIC]
        else:
            (base / "appliance.toml").write_text(config)
            extra += ["--config", str(base / "appliance.toml")]
        for i in range(count):
            data = base / f"node{i}"
            data.mkdir()
            if i:
                shutil.copy2(base / "node0" / "appliance.key", data / "appliance.key")
            proc = appliance_process(data, free_port(), base / f"node{i}.log", sync_mode, extra).start()
            self.procs.append(proc)

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.procs]

    def cpu(self) -> float:
        return sum(cpu_seconds(p.proc.pid) for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.stop()

    def __enter__(self) -> "Nodes":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def database_cpu(url: str) -> float:
    """CPU seconds the PostgreSQL backends serving `url`'s database have used so far (when the
    cluster runs on this host); NaN for SQLite (no such process)."""
    from appliance.bench.harness import database_cpu_seconds

    if not url.startswith(("postgresql://", "postgres://")):
        return float("nan")
    return database_cpu_seconds(url)


def _per(seconds: float, n: int) -> str:
    return "-" if seconds != seconds else f"{seconds / max(1, n) * 1000:.3f}"


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.2f}" if values else "-"


# -- ingest and REQ ---------------------------------------------------------------------------------


def _events(n: int, authors: int, seed: int) -> tuple[list[bytes], list[str]]:
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import public_key

    rng = random.Random(seed)
    secrets = [rng.randbytes(32).hex() for _ in range(authors)]
    now = int(time.time())
    raws = [sign_event(secrets[i % authors], 1, [["t", "bench"]], f"event {i} {rng.random()}",
                       now - rng.randrange(3600)).to_json_bytes() for i in range(n)]
    return raws, [public_key(s) for s in secrets]


async def _reqs(urls: list[str], authors: list[str], n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    clients = [await NostrClient.connect(u) for u in urls]
    out: list[float] = []
    try:
        for i in range(n):
            c = clients[i % len(clients)]
            t0 = time.perf_counter()
            events, reason = await c.req(f"q{i}", [{"authors": [rng.choice(authors)], "limit": 20}])
            out.append(time.perf_counter() - t0)
            assert reason is None and events, reason
    finally:
        for c in clients:
            await c.close()
    return out


async def _ingest_split(urls: list[str], raws: list[bytes], clients: int, window: int):
    shares = [raws[i::len(urls)] for i in range(len(urls))]
    per = max(1, clients // len(urls))
    t0 = time.perf_counter()
    results = await asyncio.gather(*(ingest(u, share, per, window, False) for u, share in zip(urls, shares)))
    seconds = time.perf_counter() - t0
    accepted = sum(r.accepted for r in results)
    latency = [x for r in results for x in r.ok_latency]
    return accepted, seconds, latency


def part_ingest(work: Path, cluster: Cluster | None, args) -> list[str]:
    raws, authors = _events(args.events, 50, seed=1)
    configs = [("SQLite, 1 node", "sqlite", 1)]
    if cluster is not None:
        configs += [("PostgreSQL, 1 node", None, 1), ("PostgreSQL, 2 nodes", None, 2)]
    lines = [f"{'configuration':<22} {'events/s':>9} {'OK p50 ms':>10} {'OK p99 ms':>10} {'CPU ms/ev':>10} "
             f"{'DB CPU ms/ev':>13} {'REQ p50 ms':>11} {'REQ p99 ms':>11}"]
    for i, (name, storage, count) in enumerate(configs):
        storage = storage or cluster.database()
        info(f"ingest: {name} ({len(raws):,} events, {args.clients} clients, window {args.window}); "
             f"load {load_average()}")
        with Nodes(work, f"ingest{i}", storage, count, args.sync_mode) as nodes:
            time.sleep(0.5)
            cpu0, db0 = nodes.cpu(), database_cpu(storage)
            accepted, seconds, latency = asyncio.run(_ingest_split(nodes.urls, raws, args.clients, args.window))
            cpu, db = nodes.cpu() - cpu0, database_cpu(storage) - db0
            if accepted != len(raws):
                info(f"  only {accepted:,} of {len(raws):,} accepted")
            reqs = asyncio.run(_reqs(nodes.urls, authors, args.queries, seed=2))
        lines.append(f"{name:<22} {accepted / seconds:>9,.0f} {_ms(latency, 50):>10} {_ms(latency, 99):>10} "
                     f"{cpu / max(1, accepted) * 1000:>10.3f} {_per(db, accepted):>13} "
                     f"{_ms(reqs, 50):>11} {_ms(reqs, 99):>11}")
    return lines


# -- fan-out across nodes ---------------------------------------------------------------------------


async def _fanout(sub_url: str, pub_url: str, n: int, size: int, seed: int) -> list[float]:
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import public_key

    rng = random.Random(seed)
    secret = rng.randbytes(32).hex()
    author = public_key(secret)
    sub = await NostrClient.connect(sub_url)
    pub = sub if pub_url == sub_url else await NostrClient.connect(pub_url)
    arrived: dict[str, float] = {}
    waiters: dict[str, asyncio.Future] = {}

    def on_event(ev: dict) -> None:
        arrived[ev["id"]] = time.perf_counter()
        fut = waiters.pop(ev["id"], None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    out: list[float] = []
    try:
        events, _ = await sub.req("warm", [{"authors": [author]}])
        await sub.subscribe("live", [{"authors": [author], "kinds": [1]}], on_event)
        await asyncio.sleep(0.2)
        for i in range(n):
            ev = sign_event(secret, 1, [], f"{i} " + "x" * size)
            fut = asyncio.get_running_loop().create_future()
            waiters[ev.id] = fut
            t0 = time.perf_counter()
            ok, msg = await pub.publish(ev.to_json(), ev.id)
            assert ok, msg
            await asyncio.wait_for(fut, 10)
            out.append(arrived[ev.id] - t0)
    finally:
        await sub.close()
        if pub is not sub:
            await pub.close()
    return out


def part_fanout(work: Path, cluster: Cluster, args) -> list[str]:
    info(f"fanout: 2 PostgreSQL nodes, {args.fanout} events per case; load {load_average()}")
    lines = [f"{'case':<46} {'p50 ms':>8} {'p99 ms':>8}"]
    with Nodes(work, "fanout", cluster.database(), 2, args.sync_mode) as nodes:
        a, b = nodes.urls
        time.sleep(0.5)
        for name, pub, size in (("same node (local broadcast), 100 B", a, 100),
                                ("across nodes, event in the notification, 100 B", b, 100),
                                ("across nodes, event in the notification, 4 KB", b, 4000),
                                ("across nodes, id only (read back), 20 KB", b, 20000)):
            lat = asyncio.run(_fanout(a, pub, args.fanout, size, seed=len(lines)))
            lines.append(f"{name:<46} {_ms(lat, 50):>8} {_ms(lat, 99):>8}")
    return lines


# -- wakes across nodes -----------------------------------------------------------------------------


def _wake_config(emu) -> str:
    from appliance.bench.wakes import KEY_ID, PROFILE, TEAM, TOPIC

    return f"""
public_url = "{PUBLIC}"
wake_min_interval = 0
[push]
app_profiles = [{{ id = "{PROFILE}", transport = "apns", topic = "{TOPIC}", team_id = "{TEAM}", key_id = "{KEY_ID}", \
key_file = "{emu.key_file}", environment = "production", apns_url = "{emu.url}", ca_file = "{emu.ca_file}" }}]
push_kinds = [9]
"""


async def _wakes(lease_node, event_url: str, emu, n: int, seed: int) -> list[float]:
    from appliance.bench.harness import executor_key, lease_event
    from appliance.bench.wakes import PROFILE
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import public_key

    rng = random.Random(seed)
    user = rng.randbytes(32).hex()
    author = rng.randbytes(32).hex()
    token = rng.randbytes(32).hex()
    exec_id, exec_pub = executor_key(lease_node.port)
    c = await NostrClient.connect(lease_node.url)
    ok, msg = await c.auth(user, PUBLIC)
    assert ok, msg
    lease = lease_event(user, origin=PUBLIC, profile=PROFILE, endpoint=token, generation=1, d=uuid.uuid4().hex,
                        exec_id=exec_id, exec_pub=exec_pub,
                        subscriptions=[{"filter": {"kinds": [9], "#p": [public_key(user)]}, "class": "default"}])
    ok, msg = await c.publish(lease.to_json(), lease.id)
    assert ok, msg
    await c.close()
    pub = await NostrClient.connect(event_url)
    out: list[float] = []
    try:
        for i in range(n):
            before = len([r for r in emu.requests() if r[3] == token])
            ev = sign_event(author, 9, [["p", public_key(user)]], f"wake {i}")
            t0 = time.time()
            ok, msg = await pub.publish(ev.to_json(), ev.id)
            assert ok, msg
            deadline = time.monotonic() + 10
            while True:
                mine = [r for r in emu.requests() if r[3] == token]
                if len(mine) > before:
                    out.append(mine[-1][0] - t0)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("a wake did not arrive within 10 s")
                await asyncio.sleep(0.002)
            await asyncio.sleep(0.02)  # the next event finds no pending wake to join
    finally:
        await pub.close()
    return out


def part_wakes(work: Path, cluster: Cluster, args) -> list[str]:
    from appliance.bench.wakes import Emulator

    info(f"wakes: 2 PostgreSQL nodes, {args.wakes} wakes per case; load {load_average()}")
    emu_dir = work / "apns"
    emu_dir.mkdir()
    emu = Emulator(emu_dir)
    lines = [f"{'case':<46} {'p50 ms':>8} {'p99 ms':>8}"]
    try:
        with Nodes(work, "wakes", cluster.database(), 2, args.sync_mode, config=_wake_config(emu)) as nodes:
            a, b = nodes.procs
            time.sleep(0.5)
            for name, event_node, seed in (("lease and event on one node", a, 1),
                                           ("lease on node A, event on node B", b, 2)):
                lat = asyncio.run(_wakes(a, event_node.url, emu, args.wakes, seed))
                lines.append(f"{name:<46} {_ms(lat, 50):>8} {_ms(lat, 99):>8}")
    finally:
        emu.stop()
    return lines


def run(args: argparse.Namespace) -> int:
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        info(f"appliance bench nodes: unknown part {unknown[0]!r} (choose from {', '.join(PARTS)})")
        return 2
    try:
        import appliance.store.postgres  # noqa: F401
    except ImportError:
        info("appliance bench nodes: this build has no PostgreSQL store (appliance.store.postgres)")
        return 2
    cluster = Cluster(args.postgres) if args.postgres else None
    if cluster is None and any(p != "ingest" for p in parts):
        info("appliance bench nodes: --postgres URL (a PostgreSQL cluster's maintenance database) is needed "
             "for several nodes; only the SQLite figures can be taken without it")
        return 2
    work = Path(tempfile.mkdtemp(prefix="appliance-bench-nodes-"))
    out: list[str] = []
    try:
        for part in parts:
            lines = {"ingest": part_ingest, "fanout": part_fanout, "wakes": part_wakes}[part](work, cluster, args)
            out += [f"== {part} ==", *lines, ""]
    finally:
        if cluster is not None:
            cluster.drop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"appliance bench nodes (load average at the end: {load_average()})")
    print("\n".join(out))
    return 0
