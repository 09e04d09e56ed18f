"""`appliance bench flood`: can one connection flooding REQs/COUNTs starve a well-behaved client?

A fresh appliance with `--events` stored kind-1 events. A bystander times sequential REQs (kinds 1,
one #p, limit 50: an ordinary client's read) first on a quiet relay, then while ONE other connection
pipelines REQs and COUNTs as fast as its socket takes them, never waiting for answers (the flood).
The figure is the bystander's p99 under each flood against its quiet p99; the target (issue #14)
is at most 2x. Each flood runs twice: with the relay's default limits (as deployed) and with the
per-connection rate limits off (`--req-rate 0`: what the relay's scheduling alone does).

    appliance bench flood                          # 20k events, 10 s per phase
    appliance bench flood --events 100000 --seconds 20

On a shared machine the figures are noisy: compare the ratio, rerun on a quiet one for finals.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

TARGET_RATIO = 2.0
FLOODS = {
    # name: what the attacker sends, round robin (sub ids are reused so subscriptions stay bounded)
    "REQ": [["REQ", "f{i}", {"kinds": [1], "limit": 500}], ["CLOSE", "f{i}"]],
    "COUNT": [["COUNT", "c{i}", *({"kinds": [1], "since": k} for k in range(16))]],
    "REQ+COUNT": [["REQ", "f{i}", {"kinds": [1], "limit": 500}], ["CLOSE", "f{i}"],
                  ["COUNT", "c{i}", *({"kinds": [1], "since": k} for k in range(16))]],
}


@dataclass
class Phase:
    name: str
    limits: str
    latencies: list[float] = field(default_factory=list)
    sent: int = 0
    answers: dict[str, int] = field(default_factory=dict)
    attacker_closed: str = ""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=20_000, metavar="N", help="stored kind-1 events (default 20000)")
    p.add_argument("--seconds", type=float, default=10.0, metavar="S", help="length of each phase (default 10)")
    p.add_argument("--recipients", type=int, default=300, metavar="K", help="#p values events carry (default 300)")
    p.add_argument("--limits", choices=("both", "defaults", "off"), default="both",
                   help="run the floods with the default rate limits, with them off, or both (default)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--data-dir", metavar="DIR", help="keep the work directory here (default: a temporary one)")


async def _bystander(url: str, seconds: float, recipients: list[str], rng: random.Random, out: list[float]) -> None:
    from appliance.bench.relay import _connect, _round_trips

    ws = await _connect(url, False)
    try:
        deadline = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < deadline:
            i += 1
            f = {"kinds": [1], "#p": [rng.choice(recipients)], "limit": 50}
            await _round_trips(ws, [orjson.dumps(["REQ", f"b{i}", f]).decode()], [f"b{i}"], out)
            await asyncio.sleep(0.01)
    finally:
        await ws.close()


async def _flood(url: str, kind: str, stop: asyncio.Event, phase: Phase) -> None:
    """One connection at a time sending `kind` without waiting for answers; when the relay closes
    it, the attacker connects again at once (counted), so the flood lasts the whole phase."""
    from websockets.exceptions import ConnectionClosed

    from appliance.bench.relay import _connect

    templates = [orjson.dumps(m).decode() for m in FLOODS[kind]]
    closes: dict[str, int] = {}
    while not stop.is_set():
        ws = await _connect(url, False)

        async def drain(ws=ws) -> None:
            try:
                async for raw in ws:
                    verb = orjson.loads(raw)[0]
                    phase.answers[verb] = phase.answers.get(verb, 0) + 1
            except ConnectionClosed:
                pass

        reader = asyncio.create_task(drain())
        try:
            i = 0
            while not stop.is_set():
                i += 1
                for t in templates:
                    await ws.send(t.replace("{i}", str(i % 50)))
                    phase.sent += 1
                if i % 20 == 0:
                    await asyncio.sleep(0)  # let the reader run
        except ConnectionClosed as exc:
            code = str(exc.rcvd.code) if exc.rcvd else "?"
            closes[code] = closes.get(code, 0) + 1
        finally:
            await ws.close()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    if closes:
        phase.attacker_closed = "closed by the relay " + ", ".join(f"{n}x ({c})" for c, n in closes.items()) + \
            ", reconnected each time"


def _flood_process(url: str, kind: str, stop, results) -> None:
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
        await _flood(url, kind, done, phase)
        await watcher

    asyncio.run(main())
    results.put((phase.sent, phase.answers, phase.attacker_closed))


def _phase(url: str, kind: str | None, seconds: float, recipients: list[str], seed: int, phase: Phase) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    attacker = ctx.Process(target=_flood_process, args=(url, kind, stop, results), daemon=True) if kind else None
    if attacker:
        attacker.start()
        time.sleep(1.0)  # the flood is under way
    try:
        asyncio.run(_bystander(url, seconds, recipients, random.Random(seed), phase.latencies))
    finally:
        if attacker:
            stop.set()
            try:
                phase.sent, phase.answers, phase.attacker_closed = results.get(timeout=60)
            finally:
                attacker.join(10)
                if attacker.is_alive():
                    attacker.kill()


def run(args: argparse.Namespace) -> int:
    from appliance.bench.harness import appliance_process, free_port, info, percentile
    from appliance.bench.relay import EventFactory, load_average, preload

    if args.events < 1 or args.seconds <= 0:
        print("appliance bench flood: --events and --seconds must be positive", file=sys.stderr)
        return 2
    keep = args.data_dir is not None
    work = Path(args.data_dir) if keep else Path(tempfile.mkdtemp(prefix="appliance-bench-flood-"))
    work.mkdir(parents=True, exist_ok=True)
    factory = EventFactory(50, args.recipients, 2, args.seed)
    phases: list[Phase] = []
    try:
        info(f"preloading {args.events:,} events")
        preload(work / "appliance", factory, args.events, newest=int(time.time()), spread=86400)
        configs = [("defaults", []), ("rate limits off", ["--req-rate", "0", "--event-rate", "0"])]
        for limits, extra in configs[1 if args.limits == "off" else 0:1 if args.limits == "defaults" else 2]:
            port = free_port()
            proc = appliance_process(work / "appliance", port, work / "appliance.log", "normal", [])
            if limits == "defaults":  # appliance_process turns the rate limits off for throughput benches
                for flag in ("--event-rate", "--req-rate"):
                    i = proc.args.index(flag)
                    del proc.args[i:i + 2]
            proc.args += extra
            proc.start()
            try:
                for kind in (None, *FLOODS):
                    phase = Phase(kind or "quiet", limits)
                    info(f"{limits}: bystander REQs, {'quiet' if kind is None else 'one connection flooding ' + kind}")
                    _phase(proc.url, kind, args.seconds, factory.recipients, args.seed, phase)
                    phases.append(phase)
            finally:
                proc.stop()
        factory.close()
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nappliance bench flood: {args.events:,} stored events, {args.seconds:g} s per phase, "
          f"load average {load_average()}")
    print(f"{'limits':<16} {'phase':<22} {'REQs':>6} {'p50 ms':>8} {'p99 ms':>8} {'p99/quiet':>10} {'<= 2x':>6}  "
          "attacker")
    ok = True
    for p in phases:
        quiet = next(q for q in phases if q.limits == p.limits and q.name == "quiet")
        p50, p99 = percentile(p.latencies, 50) * 1000, percentile(p.latencies, 99) * 1000
        ratio = p99 / (percentile(quiet.latencies, 99) * 1000)
        met = ratio <= TARGET_RATIO
        ok &= met
        attacker = "" if p.name == "quiet" else (
            f"{p.sent:,} sent; answers " + ", ".join(f"{k} {v:,}" for k, v in sorted(p.answers.items()))
            + (f"; {p.attacker_closed}" if p.attacker_closed else ""))
        print(f"{p.limits:<16} {('flood ' + p.name) if p.name != 'quiet' else 'quiet':<22} {len(p.latencies):>6} "
              f"{p50:>8.2f} {p99:>8.2f} {ratio:>10.2f} {'yes' if met else 'NO':>6}  {attacker}")
    print(f"\ntarget: a well-behaved client's p99 under a one-connection flood within {TARGET_RATIO:g}x of quiet: "
          + ("met" if ok else "NOT met"))
    return 0
