"""`appliance bench flood`: can one connection flooding REQs/COUNTs starve a well-behaved client?

A fresh appliance with `--events` stored kind-1 events. A bystander times sequential REQs (kinds 1,
one #p, limit 50: an ordinary client's read) first on a quiet relay, then while ONE other connection
pipelines messages as fast as its socket takes them, never waiting for answers (the flood): REQs,
16-filter COUNTs, both, signed EVENTs, or frames near the size limit. The figure is the bystander's
p99 under each flood against its quiet p99; the target is at most 2x. Each flood runs
twice: with the relay's default limits (as deployed) and with the rate limits off (`--req-rate 0`
and the rest: what the relay's scheduling alone does).

Both clients connect over loopback as a TLS proxy on the same box would, each naming its own client
address in X-Forwarded-For (loopback is a trusted proxy by default): the relay tells them apart as
it tells two clients behind Caddy or nginx apart, and its per-address budgets apply to each. The
attacker reconnects at once whenever the relay closes it or refuses its connection.

    appliance bench flood                          # 20k events, 10 s per phase
    appliance bench flood --events 100000 --seconds 20

On a shared machine the figures are noisy: compare the ratio, rerun on a quiet one for finals.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

TARGET_RATIO = 2.0
# The client addresses they name in X-Forwarded-For (documentation ranges, RFC 5737): bystander
# n is 198.51.100.n.
BYSTANDER_NETWORK = "198.51.100."
ATTACKER_ADDRESS = "203.0.113.66"
# Signed events the EVENT flood cycles through (sent again once all were: duplicates then).
FLOOD_EVENTS = 4000
LARGE_CONTENT = 120_000  # characters of content in each frame of the large-frame flood
FLOODS = {
    # name: what the attacker sends, round robin (sub ids are reused so subscriptions stay bounded)
    "REQ": [["REQ", "f{i}", {"kinds": [1], "limit": 500}], ["CLOSE", "f{i}"]],
    "COUNT": [["COUNT", "c{i}", *({"kinds": [1], "since": k} for k in range(16))]],
    "REQ+COUNT": [["REQ", "f{i}", {"kinds": [1], "limit": 500}], ["CLOSE", "f{i}"],
                  ["COUNT", "c{i}", *({"kinds": [1], "since": k} for k in range(16))]],
    "EVENT": None,  # signed kind-1 events (see FLOOD_EVENTS)
    # EVENTs just under max_message_length (128 KiB), refused for their content length once parsed.
    "large frames": [["EVENT", {"id": "0" * 64, "pubkey": "1" * 64, "created_at": 1, "kind": 1, "tags": [],
                                "content": "x" * LARGE_CONTENT, "sig": "2" * 128}]],
}


@dataclass
class Phase:
    name: str
    limits: str
    latencies: list[float] = field(default_factory=list)
    timeline: list[tuple[int, float, float]] = field(default_factory=list)  # (bystander, sent at, latency)
    origin: float = 0.0  # when the timing began (time.perf_counter: the monotonic clock on Linux)
    refused: dict[str, int] = field(default_factory=dict)  # bystander REQs answered CLOSED, by reason
    sent: int = 0
    relay_cpu: float = 0.0  # CPU seconds the relay used per second of the bystanders' timing
    attacker_cpu: float = 0.0  # CPU seconds the attacker's process used in all
    answers: dict[str, int] = field(default_factory=dict)
    attacker_closed: str = ""
    commits: int = 0  # write transactions the relay committed while the bystanders were timed
    writes: int = 0  # ... and the writes in them (the attacker's accepted EVENTs)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=20_000, metavar="N", help="stored kind-1 events (default 20000)")
    p.add_argument("--seconds", type=float, default=10.0, metavar="S", help="length of each phase (default 10)")
    p.add_argument("--recipients", type=int, default=300, metavar="K", help="#p values events carry (default 300)")
    p.add_argument("--limits", choices=("both", "defaults", "off"), default="both",
                   help="run the floods with the default rate limits, with them off, or both (default)")
    p.add_argument("--bystanders", type=int, default=4, metavar="N",
                   help="well-behaved clients timing REQs, each from its own address (default 4)")
    p.add_argument("--bystander-rate", type=float, default=15.0, metavar="R",
                   help="REQs per second each bystander sends, one at a time (default 15: within the default "
                        "req_rate of 20, so a bystander is never held back for its own sake)")
    p.add_argument("--flood", dest="floods", action="append", choices=list(FLOODS), metavar="KIND",
                   help="run only this flood (repeatable; default all: " + ", ".join(FLOODS) + ")")
    p.add_argument("--warmup", type=float, default=3.0, metavar="S",
                   help="seconds the flood runs before the bystanders start timing (default 3: the attacker has "
                        "filled its socket buffers by then, and what is timed is the relay under a steady flood)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--data-dir", metavar="DIR", help="keep the work directory here (default: a temporary one)")
    p.add_argument("--latencies", metavar="CSV",
                   help="write every timed bystander REQ here (limits, phase, bystander, seconds into the phase "
                        "when sent, latency in ms, and when sent on the machine's monotonic clock, as the "
                        "relay's time.monotonic): whether the slow ones were slow together tells a stall of "
                        "the relay from one client's bad luck")


async def _connect(url: str, address: str):
    """A connection as a local TLS proxy makes it for the client at `address`."""
    import websockets

    return await websockets.connect(url, max_size=None, compression=None, open_timeout=30, ping_interval=None,
                                    additional_headers={"X-Forwarded-For": address})


async def _bystanders(url: str, seconds: float, recipients: list[str], seed: int, phase: Phase, n: int,
                     rate: float) -> None:
    clients = [await _connect(url, f"{BYSTANDER_NETWORK}{k + 1}") for k in range(n)]
    try:
        for ws in clients:
            await ws.recv()  # AUTH
        origin = phase.origin = time.perf_counter()
        await asyncio.gather(*(_bystander(ws, seconds, recipients, random.Random(seed * 1000 + k), phase, rate, k,
                                          origin, n) for k, ws in enumerate(clients)))
    finally:
        for ws in clients:
            await ws.close()


async def _bystander(ws, seconds: float, recipients: list[str], rng: random.Random, phase: Phase, rate: float,
                     number: int, start: float, of: int) -> None:
    """Sequential REQs at `rate` per second (each sent once the previous one's EOSE is in and its
    time slot has come), timed from send to EOSE, on `ws` (connected, its AUTH read).

    The time slots are fixed from `start`: bystander `number` of `of` sends its i-th REQ at
    start + (number + u) / (of * rate) + i / rate (u random in [0, 1)), or as soon as its previous
    answer is in when that is later. So the bystanders stay out of step with each other, as
    independent clients are. (Each REQ used to be sent 1/rate after the previous one was sent:
    every late wake-up then moved all of its later REQs, and within a second or two the
    bystanders of one process drifted into step and sent together, queueing behind each other at
    the relay and meeting any stall all at once.)"""
    perf = time.perf_counter
    deadline = start + seconds
    first = start + (number + rng.random()) / (of * rate)
    i = 0
    while True:
        slot = first + i / rate
        if slot >= deadline:
            break
        await asyncio.sleep(max(0.0, slot - perf()))
        i += 1
        sub = f"b{i}"
        f = {"kinds": [1], "#p": [rng.choice(recipients)], "limit": 50}
        t0 = perf()
        await ws.send(orjson.dumps(["REQ", sub, f]).decode())
        async with asyncio.timeout(60):
            while True:
                msg = orjson.loads(await ws.recv())
                if msg[1] == sub and msg[0] != "EVENT":
                    break
        latency = perf() - t0
        phase.latencies.append(latency)
        phase.timeline.append((number, t0 - start, latency))
        if msg[0] == "EOSE":
            await ws.send(orjson.dumps(["CLOSE", sub]).decode())
        else:
            reason = str(msg[2]).split(":")[0] if len(msg) > 2 else msg[0]
            phase.refused[reason] = phase.refused.get(reason, 0) + 1


async def _flood(url: str, kind: str, stop: asyncio.Event, phase: Phase, events: list[str]) -> None:
    """One connection at a time sending `kind` without waiting for answers; when the relay closes
    it (or refuses to let it in), the attacker connects again at once (counted), so the flood lasts
    the whole phase."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    templates = events if FLOODS[kind] is None else [orjson.dumps(m).decode() for m in FLOODS[kind]]
    closes: dict[str, int] = {}
    while not stop.is_set():
        try:
            ws = await _connect(url, ATTACKER_ADDRESS)
        except InvalidStatus as exc:
            code = f"HTTP {exc.response.status_code}"
            closes[code] = closes.get(code, 0) + 1
            continue

        async def drain(ws=ws) -> None:
            try:
                async for raw in ws:
                    msg = orjson.loads(raw)
                    verb = msg[0]
                    if verb in ("CLOSED", "OK") and isinstance(msg[-1], str) and ":" in msg[-1]:
                        verb += " " + msg[-1].split(":")[0]  # by reason: "CLOSED rate-limited"
                    phase.answers[verb] = phase.answers.get(verb, 0) + 1
            except ConnectionClosed:
                pass

        reader = asyncio.create_task(drain())

        async def hang_up_at_stop(ws=ws) -> None:
            # The relay may have stopped reading this connection (its budget spent): a send then
            # waits for room in the socket. At the end of the phase the attacker just hangs up.
            await stop.wait()
            ws.transport.abort()

        hang_up = asyncio.create_task(hang_up_at_stop())
        try:
            i = 0
            numbered = any("{i}" in t for t in templates)
            while not stop.is_set():
                i += 1
                if numbered:
                    for t in templates:
                        await ws.send(t.replace("{i}", str(i % 50)))
                        phase.sent += 1
                else:  # the EVENT flood: one event each round, the next one next round
                    await ws.send(templates[i % len(templates)])
                    phase.sent += 1
                if i % 20 == 0:
                    await asyncio.sleep(0)  # let the reader run
        except ConnectionClosed as exc:
            if not stop.is_set():  # (not the attacker's own hang-up)
                code = str(exc.rcvd.code) if exc.rcvd else "?"
                closes[code] = closes.get(code, 0) + 1
        finally:
            hang_up.cancel()
            if not stop.is_set():
                await ws.close()
            reader.cancel()
            await asyncio.gather(reader, hang_up, return_exceptions=True)
    if closes:
        phase.attacker_closed = "closed by the relay " + ", ".join(f"{n}x ({c})" for c, n in closes.items()) + \
            ", reconnected each time"


def _flood_process(url: str, kind: str, stop, results, events: list[str]) -> None:
    """The attacker in a process of its own, so its sending loop never competes with the
    bystander's client for this process's event loop (only the relay is measured)."""
    phase = Phase(kind, "")
    done = asyncio.Event()

    async def main() -> None:
        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.05)
            done.set()

        watcher = asyncio.create_task(watch())
        await _flood(url, kind, done, phase, events)
        await watcher

    asyncio.run(main())
    results.put((phase.sent, phase.answers, phase.attacker_closed, time.process_time()))


def _writer_totals(port: int, token: str) -> tuple[int, int]:
    """(commits, writes) of the relay's writer so far, from its /admin/metrics."""
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    totals = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("appliance_store_commits_total", "appliance_store_writes_total"):
            totals[name] = int(float(value))
    return totals.get("appliance_store_commits_total", 0), totals.get("appliance_store_writes_total", 0)


def _phase(url: str, kind: str | None, args: argparse.Namespace, recipients: list[str], phase: Phase,
           events: list[str], relay_pid: int, port: int, token: str) -> None:
    import multiprocessing

    from appliance.bench.harness import cpu_seconds

    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    attacker = ctx.Process(target=_flood_process, args=(url, kind, stop, results, events if kind == "EVENT" else []),
                           daemon=True) if kind else None
    if attacker:
        attacker.start()
        time.sleep(args.warmup)  # the flood is under way
    try:
        commits0, writes0 = _writer_totals(port, token)
        cpu0, t0 = cpu_seconds(relay_pid), time.perf_counter()
        asyncio.run(_bystanders(url, args.seconds, recipients, args.seed, phase, args.bystanders, args.bystander_rate))
        phase.relay_cpu = (cpu_seconds(relay_pid) - cpu0) / (time.perf_counter() - t0)
        commits1, writes1 = _writer_totals(port, token)
        phase.commits, phase.writes = commits1 - commits0, writes1 - writes0
    finally:
        if attacker:
            stop.set()
            try:
                phase.sent, phase.answers, phase.attacker_closed, phase.attacker_cpu = results.get(timeout=60)
            finally:
                attacker.join(10)
                if attacker.is_alive():
                    attacker.kill()


def run(args: argparse.Namespace) -> int:
    from appliance.bench.harness import appliance_process, free_port, info, percentile
    from appliance.bench.relay import EventFactory, load_average, preload

    if args.events < 1 or args.seconds <= 0 or args.bystanders < 1 or args.bystander_rate <= 0:
        print("appliance bench flood: --events, --seconds, --bystanders and --bystander-rate must be positive",
              file=sys.stderr)
        return 2
    keep = args.data_dir is not None
    work = Path(args.data_dir) if keep else Path(tempfile.mkdtemp(prefix="appliance-bench-flood-"))
    work.mkdir(parents=True, exist_ok=True)
    factory = EventFactory(50, args.recipients, 2, args.seed)
    phases: list[Phase] = []
    try:
        info(f"preloading {args.events:,} events")
        preload(work / "appliance", factory, args.events, newest=int(time.time()), spread=86400)
        flood_events = [raw.decode() for raw in factory.sign(FLOOD_EVENTS, int(time.time()), 3600)]
        flood_events = [f'["EVENT",{raw}]' for raw in flood_events]
        off = ["--req-rate", "0", "--event-rate", "0", "--ip-req-rate", "0", "--ip-event-rate", "0",
               "--receive-rate", "0"]
        configs = [("defaults", []), ("rate limits off", off)]
        for limits, extra in configs[1 if args.limits == "off" else 0:1 if args.limits == "defaults" else 2]:
            port = free_port()
            proc = appliance_process(work / "appliance", port, work / "appliance.log", "normal", [])
            token = "flood-" + secrets.token_hex(8)
            proc.env["APPLIANCE_METRICS_TOKEN"] = token  # (in its environment, not its argv)
            if limits == "defaults":  # appliance_process turns the rate limits off for throughput benches
                for flag in ("--event-rate", "--req-rate"):
                    i = proc.args.index(flag)
                    del proc.args[i:i + 2]
            proc.args += extra
            proc.start()
            try:
                for kind in (None, *(args.floods or FLOODS)):
                    phase = Phase(kind or "quiet", limits)
                    info(f"{limits}: bystander REQs, {'quiet' if kind is None else 'one connection flooding ' + kind}")
                    _phase(proc.url, kind, args, factory.recipients, phase, flood_events, proc.proc.pid, port, token)
                    phases.append(phase)
            finally:
                proc.stop()
        factory.close()
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.latencies:
        with open(args.latencies, "w") as out:
            out.write("limits,phase,bystander,sent_s,latency_ms,sent_clock\n")
            for p in phases:
                for number, sent, latency in p.timeline:
                    out.write(f"{p.limits},{p.name},{number + 1},{sent:.4f},{latency * 1000:.3f},"
                              f"{p.origin + sent:.4f}\n")
    print(f"\nappliance bench flood: {args.events:,} stored events, {args.seconds:g} s per phase, "
          f"load average {load_average()}")
    print(f"{'limits':<16} {'phase':<22} {'REQs':>6} {'refused':>7} {'p50 ms':>8} {'p99 ms':>8} {'p99/quiet':>10} "
          f"{'<= 2x':>6} {'relay CPU':>9}  attacker")
    ok = True
    for p in phases:
        quiet = next(q for q in phases if q.limits == p.limits and q.name == "quiet")
        p50, p99 = percentile(p.latencies, 50) * 1000, percentile(p.latencies, 99) * 1000
        ratio = p99 / (percentile(quiet.latencies, 99) * 1000)
        met = ratio <= TARGET_RATIO and not p.refused  # a bystander refused anything: not met
        ok &= met
        if p.refused:
            print("  bystander REQs refused: " + ", ".join(f"{k} {v}" for k, v in sorted(p.refused.items())))
        attacker = "" if p.name == "quiet" else (
            f"{p.sent:,} sent ({p.attacker_cpu:.1f} s CPU); answers " + ", ".join(f"{k} {v:,}" for k, v in sorted(p.answers.items()))
            + (f"; {p.attacker_closed}" if p.attacker_closed else "")
            + (f"; {p.writes:,} writes in {p.commits:,} commits" if p.writes else ""))
        print(f"{p.limits:<16} {('flood ' + p.name) if p.name != 'quiet' else 'quiet':<22} {len(p.latencies):>6} "
              f"{sum(p.refused.values()):>7} {p50:>8.2f} {p99:>8.2f} {ratio:>10.2f} {'yes' if met else 'NO':>6} {p.relay_cpu:>8.0%}  {attacker}")
    print(f"\ntarget: a well-behaved client's p99 under a one-connection flood within {TARGET_RATIO:g}x of quiet: "
          + ("met" if ok else "NOT met"))
    return 0
