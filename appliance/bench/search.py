"""`appliance bench search`: NIP-50 search latency over N kind-1 events, and what the index costs ingest.

The corpus: N kind-1 notes of 5 to 30 words drawn from a vocabulary of V made-up words with
Zipf's law (word k about 1/k as frequent as the first, as in natural text), loaded with
`appliance import --no-verify` (the real write path: the index is written by the triggers). An
`appliance serve` over it then answers one-word REQs `{"search": W, "limit": 50}` from one
websocket client, one at a time, REQ sent to EOSE received: p50 and p99 for words drawn
uniformly from the vocabulary (the headline), from its 100 most frequent words (the worst
case: each matches tens of thousands of notes) and from running text (words weighted by their
frequency). Then the same M signed notes are published to a fresh server with the index on
(search_kinds 1) and with it off (search_kinds empty), in turns: events/s and the server's CPU
per event, each variant's best of its rounds.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

from appliance.bench.harness import (appliance_command, appliance_process, cpu_seconds, free_port, info,
                                     percentile)
from appliance.bench.relay import _event_loop_runner, ingest, load_average, query_latency

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def vocabulary(size: int, seed: int) -> list[str]:
    """`size` distinct pronounceable made-up words, in a fixed order (the first the most frequent)."""
    rng = random.Random(seed)
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))] = None
    return list(words)


def zipf_weights(size: int) -> list[float]:
    return list(itertools.accumulate(1.0 / (k + 1) for k in range(size)))


_gen: dict = {}


def _gen_init(size: int, seed: int) -> None:
    _gen["words"] = vocabulary(size, seed)
    _gen["cum"] = zipf_weights(size)


def _notes(task: tuple[int, int, int, bool]) -> bytes:
    """`count` kind-1 notes as JSON lines; signed when `sign` (else a well-formed, unchecked sig)."""
    seed, count, newest, sign = task
    rng = random.Random(seed)
    words, cum = _gen["words"], _gen["cum"]
    keys = _gen.get("keys")
    if keys is None:
        from coincurve import PrivateKey, PublicKeyXOnly

        secrets = [hashlib.sha256(f"bench search author {i}".encode()).digest() for i in range(200)]
        keys = _gen["keys"] = [(PrivateKey(s), PublicKeyXOnly.from_secret(s).format().hex()) for s in secrets]
    out = []
    for i in range(count):
        priv, pubkey = keys[rng.randrange(len(keys))]
        created_at = newest - rng.randrange(365 * 86400)
        content = " ".join(rng.choices(words, cum_weights=cum, k=rng.randint(5, 30)))
        digest = hashlib.sha256(orjson.dumps([0, pubkey, created_at, 1, [], content])).digest()
        sig = priv.sign_schnorr(digest, rng.randbytes(32)).hex() if sign else rng.randbytes(64).hex()
        out.append(orjson.dumps({"content": content, "created_at": created_at, "id": digest.hex(), "kind": 1,
                                 "pubkey": pubkey, "sig": sig, "tags": []}))
    return b"\n".join(out) + b"\n"


def notes(pool: ProcessPoolExecutor, n: int, seed: int, *, sign: bool, chunk: int = 10_000):
    now = int(time.time())
    tasks = [(seed * 1_000_003 + i, min(chunk, n - i * chunk), now - 60, sign) for i in range(-(-n // chunk))]
    yield from pool.map(_notes, tasks)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=1_000_000, metavar="N", help="kind-1 notes searched (default 1000000)")
    p.add_argument("--vocabulary", type=int, default=50_000, metavar="V", help="distinct words (default 50000)")
    p.add_argument("--queries", type=int, default=300, metavar="Q", help="REQs timed per word set (default 300)")
    p.add_argument("--limit", type=int, default=50, help="the REQs' limit (default 50)")
    p.add_argument("--ingest-events", type=int, default=30_000, metavar="M",
                   help="signed notes published per ingest round, index on and off (default 30000; 0 skips)")
    p.add_argument("--rounds", type=int, default=2, help="ingest rounds per variant, in turns (default 2)")
    p.add_argument("--clients", type=int, default=8, help="publishing clients (default 8)")
    p.add_argument("--window", type=int, default=100, help="EVENTs in flight per client (default 100)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, metavar="P",
                   help="processes making the notes (default: one per CPU)")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work-dir", metavar="DIR",
                   help="use (and keep) this directory; a corpus loaded there before is used again")


def run(args: argparse.Namespace) -> int:
    if args.events < 1 or args.queries < 1:
        print("appliance bench search: --events and --queries must be at least 1", file=sys.stderr)
        return 2
    keep = args.work_dir is not None
    work = Path(args.work_dir) if keep else Path(tempfile.mkdtemp(prefix="appliance-bench-search-"))
    work.mkdir(parents=True, exist_ok=True)
    load_start = load_average()
    words = vocabulary(args.vocabulary, args.seed)
    # Spawned, not forked: a forked worker started after `appliance import` would hold its stdin open.
    pool = ProcessPoolExecutor(max(1, args.workers), initializer=_gen_init, initargs=(args.vocabulary, args.seed),
                               mp_context=multiprocessing.get_context("spawn"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    lines: list[str] = []
    arun = _event_loop_runner()
    try:
        data = work / "corpus"
        marker = work / f"corpus-{args.events}-{args.vocabulary}-{args.seed}.done"
        if not marker.exists():
            shutil.rmtree(data, ignore_errors=True)
            info(f"making and importing {args.events:,} notes into {data} (import --no-verify)...")
            import subprocess

            t0 = time.perf_counter()
            proc = subprocess.Popen([*appliance_command(), "import", "--data-dir", str(data), "--no-verify",
                                     "--sync-mode", args.sync_mode, "--log-level", "warning"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            for block in notes(pool, args.events, args.seed, sign=False):
                proc.stdin.write(block)
            proc.stdin.close()
            summary = proc.stdout.read().decode().strip()
            if proc.wait() != 0:
                raise RuntimeError(f"import failed: {summary}")
            secs = time.perf_counter() - t0
            info(f"{summary} in {secs:.1f} s ({args.events / secs:,.0f} notes/s, making them included)")
            marker.touch()
        size = sum(f.stat().st_size for f in data.iterdir() if f.is_file())
        lines.append(f"corpus: {args.events:,} kind-1 notes of 5-30 words, Zipf over {args.vocabulary:,} words; "
                     f"database {size / 1e6:,.0f} MB")

        rng = random.Random(args.seed)
        sets = {
            "uniform over the vocabulary": [rng.choice(words) for _ in range(args.queries)],
            "the 100 most frequent words": [rng.choice(words[:100]) for _ in range(args.queries)],
            "weighted as in running text": rng.choices(words, cum_weights=zipf_weights(len(words)), k=args.queries),
        }
        relay = appliance_process(data, free_port(), work / "serve.log", args.sync_mode, [])
        relay.start()
        try:
            warm = [{"search": w, "limit": args.limit} for w in rng.sample(words, 20)]
            arun(query_latency(relay.url, warm, len(warm), False))
            lines.append(f"\none-word search REQs, limit {args.limit}, REQ to EOSE from one client "
                         f"(load {load_average()}):")
            lines.append(f"{'words':<30} {'queries':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'events/answer':>14}")
            for name, chosen in sets.items():
                lat, returned = arun(query_latency(relay.url, [{"search": w, "limit": args.limit} for w in chosen],
                                                   0, False))
                ms = [x * 1000 for x in lat]
                lines.append(f"{name:<30} {len(ms):>8} {percentile(ms, 50):>8.2f} {percentile(ms, 90):>8.2f} "
                             f"{percentile(ms, 99):>8.2f} {returned / len(ms):>14.1f}")
                info(lines[-1])
        finally:
            relay.stop()

        if args.ingest_events > 0:
            info(f"signing {args.ingest_events:,} notes for the ingest rounds...")
            raws = b"".join(notes(pool, args.ingest_events, args.seed + 7, sign=True)).splitlines()
            best: dict[str, tuple[float, float]] = {}
            for rnd in range(args.rounds):
                for name, kinds in (("index on (search_kinds 1)", "1"), ("index off (search_kinds empty)", "")):
                    d = work / f"ingest-{rnd}-{len(kinds)}"
                    shutil.rmtree(d, ignore_errors=True)
                    relay = appliance_process(d, free_port(), work / f"ingest-{rnd}-{len(kinds)}.log", args.sync_mode,
                                              ["--search-kinds", kinds])
                    relay.start()
                    try:
                        c0 = cpu_seconds(relay.proc.pid)
                        r = arun(ingest(relay.url, [_id_first(x) for x in raws], args.clients, args.window, False))
                        cpu = (cpu_seconds(relay.proc.pid) - c0) / max(1, r.accepted)
                    finally:
                        relay.stop()
                        shutil.rmtree(d, ignore_errors=True)
                    rate = r.accepted / r.seconds
                    info(f"round {rnd + 1} {name}: {r.accepted:,} accepted, {rate:,.0f} events/s, "
                         f"{cpu * 1e6:.0f} us CPU per event (load {load_average()})")
                    old = best.get(name)
                    best[name] = (max(rate, old[0]) if old else rate, min(cpu, old[1]) if old else cpu)
            (on_rate, on_cpu), (off_rate, off_cpu) = best.values()
            lines.append(f"\ningest of {args.ingest_events:,} signed notes, {args.clients} clients x window "
                         f"{args.window}, best of {args.rounds} rounds each:")
            for name, (rate, cpu) in best.items():
                lines.append(f"  {name:<32} {rate:>9,.0f} events/s  {cpu * 1e6:>6.0f} us server CPU per event")
            lines.append(f"  with the index: {100 * (1 - on_rate / off_rate):+.1f}% slower in events/s, "
                         f"{100 * (on_cpu / off_cpu - 1):+.1f}% more server CPU per event")
    finally:
        pool.shutdown(cancel_futures=True)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nappliance bench search: {os.cpu_count()} CPUs, sync_mode {args.sync_mode}; load average {load_start} "
          f"at the start, {load_average()} at the end")
    print("\n".join(lines))
    return 0


def _id_first(raw: bytes) -> bytes:
    """The relay bench's publisher reads the id at a fixed offset: the id key first."""
    d = orjson.loads(raw)
    return orjson.dumps({"id": d["id"], **{k: v for k, v in d.items() if k != "id"}})
