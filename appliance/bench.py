"""`appliance bench`: measure relay ingest and query speed on this machine.

Each benchmark is one entry of `BENCHMARKS` (name -> Benchmark(help, add_args, run)); `add_parser`
turns them into subcommands of `appliance bench`, so adding one is adding an entry.

`appliance bench relay` starts `appliance serve` as a subprocess on a temporary data directory,
publishes pre-signed events from several concurrent, pipelining websocket clients and measures
accepted events/s and OK latency (send to OK), then REQ latency of indexed queries
(`{"#p": [x], "limit": 50}` and `{"authors": [x], "limit": 50}`) over the stored set. With
`--preload N` it first writes N signed events straight into the SQLite file through the store's own
functions, so query latency can be measured over a large database. When the `nostr-relay` package
is importable it runs the same load against it and prints the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import orjson

# -- registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


BENCHMARKS: dict[str, Benchmark] = {}


def add_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True)
    for name, bench in BENCHMARKS.items():
        p = sub.add_parser(name, help=bench.help, description=bench.help)
        bench.add_args(p)


def run(args: argparse.Namespace) -> int:
    bench = BENCHMARKS.get(getattr(args, "bench_command", None) or "")
    if bench is None:
        print("appliance bench: choose one of " + ", ".join(BENCHMARKS), file=sys.stderr)
        return 2
    return bench.run(args)


# -- helpers -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- event generation (in worker processes) ----------------------------------------------------

TOPICS = ("nostr", "bitcoin", "python", "sqlite", "relay", "music", "art", "news")
WORDS = ("the", "relay", "stores", "signed", "notes", "from", "many", "clients", "and", "serves",
         "them", "back", "quickly", "over", "websockets", "to", "anyone", "who", "asks")

_worker: dict = {}


def _worker_init(secrets: list[str], recipients: list[str]) -> None:
    from coincurve import PrivateKey, PublicKeyXOnly

    _worker["keys"] = [
        (PrivateKey(bytes.fromhex(s)), PublicKeyXOnly.from_secret(bytes.fromhex(s)).format().hex())
        for s in secrets
    ]
    _worker["recipients"] = recipients


def _noop(_x: int) -> int:
    return os.getpid()


def _sign_batch(task: tuple[int, int, int, int]) -> list[bytes]:
    """Sign `count` kind-1 events (p and t tags, created_at in (newest - spread, newest])."""
    seed, count, newest, spread = task
    rng = random.Random(seed)
    keys = _worker["keys"]
    recipients = _worker["recipients"]
    out: list[bytes] = []
    sha256 = hashlib.sha256
    dumps = orjson.dumps
    for i in range(count):
        priv, pubkey = keys[rng.randrange(len(keys))]
        created_at = newest - rng.randrange(spread)
        tags = [["p", recipients[rng.randrange(len(recipients))]], ["t", TOPICS[rng.randrange(len(TOPICS))]]]
        words = " ".join(WORDS[rng.randrange(len(WORDS))] for _ in range(rng.randrange(4, 16)))
        content = f"{words} #{seed}.{i}"
        digest = sha256(dumps([0, pubkey, created_at, 1, tags, content])).digest()
        sig = priv.sign_schnorr(digest, rng.randbytes(32)).hex()
        out.append(dumps({"id": digest.hex(), "pubkey": pubkey, "created_at": created_at, "kind": 1,
                          "tags": tags, "content": content, "sig": sig}))
    return out


class EventFactory:
    """A pool of author keys and recipients, and a process pool that signs events with them."""

    CHUNK = 10_000

    def __init__(self, authors: int, recipients: int, workers: int, seed: int):
        from appliance.nostr.keys import generate_secret, public_key

        self.secrets = [generate_secret() for _ in range(authors)]
        self.pubkeys = [public_key(s) for s in self.secrets]
        self.recipients = [public_key(generate_secret()) for _ in range(recipients)]
        self.workers = workers
        self._seed = seed * 1_000_000
        self.pool = ProcessPoolExecutor(workers, initializer=_worker_init,
                                        initargs=(self.secrets, self.recipients))
        # Start every worker now, before this process has other threads (they are forked).
        list(self.pool.map(_noop, range(workers)))

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)

    def batches(self, n: int, newest: int, spread: int, chunk: int = CHUNK):
        """Yield lists of signed event JSON (bytes), in order, signed in parallel."""
        tasks = []
        while n > 0:
            size = min(chunk, n)
            self._seed += 1
            tasks.append((self._seed, size, newest, spread))
            n -= size
        yield from self.pool.map(_sign_batch, tasks)

    def sign(self, n: int, newest: int, spread: int) -> list[bytes]:
        chunk = max(100, min(self.CHUNK, -(-n // (self.workers * 4))))
        return [raw for batch in self.batches(n, newest, spread, chunk) for raw in batch]


# -- preload -----------------------------------------------------------------------------------


def preload(data_dir: Path, factory: EventFactory, n: int, *, newest: int, spread: int) -> tuple[int, float]:
    """Store `n` signed events with `store_event`, 10k per transaction; (stored, seconds)."""
    from appliance.app import prepare_origins
    from appliance.nostr.event import Event
    from appliance.settings import load
    from appliance.store.events import store_event
    from appliance.store.sqlite import SqliteStore

    settings = load(flags={"data_dir": str(data_dir)}, environ={})
    t0 = time.perf_counter()
    stored = 0
    store = SqliteStore(data_dir, sync_mode="normal").open()
    try:
        origins = prepare_origins(store, settings)
        origin_id = next(o.id for o in origins if o.origin == settings.effective_public_url)
        now = int(time.time())
        loads = orjson.loads
        for batch in factory.batches(n, newest, spread):

            def op(conn, batch=batch):
                for raw in batch:
                    d = loads(raw)
                    ev = Event(d["id"], d["pubkey"], d["created_at"], d["kind"], d["tags"], d["content"], d["sig"])
                    store_event(conn, origin_id, ev, raw=raw.decode(), expiration=None, now=now)
                return len(batch)

            stored += store.write_sync(op)
            if stored % 100_000 < len(batch):
                rate = stored / (time.perf_counter() - t0)
                info(f"  preloaded {stored:,} / {n:,} ({rate:,.0f} events/s)")
    finally:
        store.close()
    return stored, time.perf_counter() - t0


# -- relay processes ---------------------------------------------------------------------------


class RelayProcess:
    """A relay subprocess on a loopback port, with its output in a log file."""

    def __init__(self, name: str, args: list[str], port: int, log_path: Path, cwd: Path | None = None):
        self.name = name
        self.args = args
        self.port = port
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> "RelayProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log_path.read_text(errors='replace')[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not start within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()


def appliance_process(data_dir: Path, port: int, log_path: Path, sync_mode: str, extra: list[str]) -> RelayProcess:
    args = [sys.executable, "-m", "appliance", "serve", "--data-dir", str(data_dir), "--port", str(port),
            "--event-rate", "0", "--req-rate", "0", "--log-level", "warning", "--sync-mode", sync_mode, *extra]
    return RelayProcess("appliance", args, port, log_path)


def nostr_relay_available() -> bool:
    try:
        import nostr_relay  # noqa: F401
    except ImportError:
        return False
    return True


def nostr_relay_process(work: Path, port: int, log_path: Path) -> RelayProcess:
    """nostr-relay 1.14 (`nostr-relay -c config.yaml serve`: gunicorn + uvicorn worker, SQLite)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "nostr-relay.yaml"
    db = work / "nostr.sqlite3"
    config.write_text(
        "DEBUG: false\n"
        "storage:\n"
        f"  sqlalchemy.url: sqlite+aiosqlite:///{db}\n"
        "  num_concurrent_reqs: 10\n"
        "  num_concurrent_adds: 2\n"
        "  validators:\n"
        "    - nostr_relay.validators.is_not_too_large\n"
        "    - nostr_relay.validators.is_signed\n"
        "    - nostr_relay.validators.is_recent\n"
        "    - nostr_relay.validators.is_not_hellthread\n"
        "verification:\n"
        "  nip05_verification: disabled\n"
        "gunicorn:\n"
        f"  bind: 127.0.0.1:{port}\n"
        "  workers: 1\n"
        "  loglevel: warning\n"
        "  reload: false\n"
        "authentication:\n"
        "  enabled: false\n"
        "subscription_limit: 32\n"
        "max_limit: 6000\n"
        "message_timeout: 1800\n"
    )
    args = [sys.executable, "-c", "import sys; from nostr_relay.cli import main; sys.exit(main())",
            "-c", str(config), "serve"]
    return RelayProcess("nostr-relay", args, port, log_path, cwd=work)


# -- load --------------------------------------------------------------------------------------


@dataclass
class IngestResult:
    sent: int = 0
    accepted: int = 0
    rejected: int = 0
    seconds: float = 0.0
    ok_latency: list[float] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)


async def _connect(url: str, compression: bool):
    import websockets

    return await websockets.connect(url, max_size=None, compression="deflate" if compression else None,
                                    open_timeout=30, ping_interval=None)


async def _publisher(url: str, messages: list[tuple[str, str]], window: int, result: IngestResult,
                     compression: bool, stall: float) -> None:
    ws = await _connect(url, compression)
    try:
        slots = asyncio.Semaphore(window)
        sent_at: dict[str, float] = {}
        remaining = len(messages)
        perf = time.perf_counter
        latency = result.ok_latency

        async def read_oks() -> None:
            nonlocal remaining
            while remaining:
                async with asyncio.timeout(stall):  # cheaper than wait_for (no task per message)
                    text = await ws.recv()
                msg = orjson.loads(text)
                if msg[0] != "OK":
                    continue
                t0 = sent_at.pop(msg[1], None)
                if t0 is None:
                    continue
                latency.append(perf() - t0)
                if msg[2]:
                    result.accepted += 1
                else:
                    result.rejected += 1
                    reason = str(msg[3]).split(":", 1)[0]
                    result.reasons[reason] = result.reasons.get(reason, 0) + 1
                remaining -= 1
                slots.release()

        reader = asyncio.create_task(read_oks())
        try:
            for eid, text in messages:
                await slots.acquire()
                if reader.done():
                    break
                sent_at[eid] = perf()
                await ws.send(text)
                result.sent += 1
            await reader
        finally:
            reader.cancel()
    finally:
        await ws.close()


async def ingest(url: str, raws: list[bytes], clients: int, window: int, compression: bool,
                 stall: float = 60.0) -> IngestResult:
    """Publish every event from `clients` connections, each keeping `window` EVENTs in flight."""
    messages = []
    for raw in raws:
        text = raw.decode()
        messages.append((text[7:71], '["EVENT",' + text + "]"))  # '{"id":"' is 7 characters
    shares = [messages[i::clients] for i in range(clients)]
    result = IngestResult()
    t0 = time.perf_counter()
    await asyncio.gather(*(_publisher(url, share, window, result, compression, stall) for share in shares if share))
    result.seconds = time.perf_counter() - t0
    return result


async def query_latency(url: str, filters: list[dict], warmup: int, compression: bool) -> tuple[list[float], int]:
    """Sequential REQ round trips (REQ sent to EOSE received); (latencies, events returned)."""
    ws = await _connect(url, compression)
    latencies: list[float] = []
    returned = 0
    try:
        for i, flt in enumerate(filters):
            sub = f"q{i}"
            t0 = time.perf_counter()
            await ws.send(orjson.dumps(["REQ", sub, flt]).decode())
            n = 0
            # One timeout for the whole round trip: asyncio.wait_for per message costs a task each
            # (about 0.1 ms here), which made 50-event REQs look twice as slow as they are.
            async with asyncio.timeout(60):
                while True:
                    msg = orjson.loads(await ws.recv())
                    if msg[0] == "EVENT" and msg[1] == sub:
                        n += 1
                    elif msg[0] in ("EOSE", "CLOSED") and msg[1] == sub:
                        break
            elapsed = time.perf_counter() - t0
            await ws.send(orjson.dumps(["CLOSE", sub]).decode())
            if i >= warmup:
                latencies.append(elapsed)
                returned += n
    finally:
        await ws.close()
    return latencies, returned


@dataclass
class RunResult:
    name: str
    ingest: IngestResult
    req_p: list[float]
    req_authors: list[float]
    returned_p: int
    returned_authors: int


def _event_loop_runner():
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def measure(relay: RelayProcess, raws: list[bytes], factory: EventFactory, args: argparse.Namespace) -> RunResult:
    arun = _event_loop_runner()
    info(f"{relay.name}: publishing {len(raws):,} events from {args.clients} clients "
         f"(window {args.window}) to {relay.url}")
    result = arun(ingest(relay.url, raws, args.clients, args.window, args.compression))
    rate = result.accepted / result.seconds if result.seconds else 0.0
    info(f"{relay.name}: {result.accepted:,} accepted in {result.seconds:.2f} s ({rate:,.0f} events/s)"
         + (f", rejected {result.reasons}" if result.rejected else ""))
    rng = random.Random(args.seed)
    warm = 10
    by_p = [{"#p": [rng.choice(factory.recipients)], "limit": 50} for _ in range(args.queries + warm)]
    by_author = [{"authors": [rng.choice(factory.pubkeys)], "limit": 50} for _ in range(args.queries + warm)]
    req_p, n_p = arun(query_latency(relay.url, by_p, warm, args.compression))
    req_a, n_a = arun(query_latency(relay.url, by_author, warm, args.compression))
    return RunResult(relay.name, result, req_p, req_a, n_p, n_a)


# -- report ------------------------------------------------------------------------------------


def _ms(values: list[float], q: float) -> str:
    v = percentile(values, q)
    return "-" if v != v else f"{v * 1000:.2f}"


def table(results: list[RunResult], stored: dict[str, int], queries: int) -> str:
    headers = ["metric", *(r.name for r in results)]
    if len(results) == 2:
        headers.append("ratio")
    headers.append("target")
    rows: list[list[str]] = []

    def rate(r: RunResult) -> float:
        return r.ingest.accepted / r.ingest.seconds if r.ingest.seconds else 0.0

    def add(label: str, cells: list[str], ratio: str = "", target: str = "") -> None:
        row = [label, *cells]
        if len(results) == 2:
            row.append(ratio)
        row.append(target)
        rows.append(row)

    def ratio_of(values: list[float], higher_better: bool) -> str:
        a, b = values
        if not a or not b or a != a or b != b:
            return "-"
        return f"{(a / b if higher_better else b / a):.1f}x"

    add("events accepted / sent", [f"{r.ingest.accepted:,} / {r.ingest.sent:,}" for r in results])
    add("ingest (events/s)", [f"{rate(r):,.0f}" for r in results],
        ratio_of([rate(r) for r in results], True) if len(results) == 2 else "", ">= 5,000")
    for q in (50, 99):
        add(f"OK latency p{q} (ms)", [_ms(r.ingest.ok_latency, q) for r in results],
            ratio_of([percentile(r.ingest.ok_latency, q) for r in results], False) if len(results) == 2 else "")
    for label, attr, returned in (("REQ #p limit 50", "req_p", "returned_p"),
                                  ("REQ authors limit 50", "req_authors", "returned_authors")):
        for q in (50, 99):
            add(f"{label} p{q} (ms)", [_ms(getattr(r, attr), q) for r in results],
                ratio_of([percentile(getattr(r, attr), q) for r in results], False) if len(results) == 2 else "",
                "<= 5 (at 1M stored)" if q == 50 else "")
        add(f"{label} events/query", [f"{getattr(r, returned) / max(1, len(getattr(r, attr))):.1f}"
                                      for r in results])
    add("stored events", [f"{stored.get(r.name, 0):,}" for r in results])
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


# -- `appliance bench relay` -------------------------------------------------------------------


def _relay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=20_000, metavar="N", help="events to publish (default 20000)")
    p.add_argument("--clients", type=int, default=8, metavar="C", help="concurrent websocket clients (default 8)")
    p.add_argument("--window", type=int, default=100, metavar="W",
                   help="EVENTs each client keeps in flight before waiting for OKs (default 100)")
    p.add_argument("--preload", type=int, default=0, metavar="N",
                   help="first store N signed events directly in the database (10k per transaction)")
    p.add_argument("--queries", type=int, default=200, metavar="Q",
                   help="REQs timed per query shape (default 200, after 10 warm-up queries)")
    p.add_argument("--authors", type=int, default=1000, metavar="K", help="distinct author keys (default 1000)")
    p.add_argument("--recipients", type=int, default=1000, metavar="K",
                   help="distinct p-tagged recipients (default 1000)")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"),
                   help="the appliance's sync_mode (default full: durable commits)")
    p.add_argument("--compression", action="store_true",
                   help="negotiate permessage-deflate (off by default: it costs both sides CPU)")
    p.add_argument("--no-compare", action="store_true", help="do not run nostr-relay even if it is installed")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, metavar="P",
                   help="processes signing events (default: one per CPU)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="use (and keep) this directory instead of a temporary one")
    p.add_argument("--seed", type=int, default=1, help="random seed for queries and content (default 1)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `appliance serve` (repeatable), e.g. --server-arg=--write-batch=1000")


def run_relay(args: argparse.Namespace) -> int:
    if args.events < 1 or args.clients < 1 or args.window < 1:
        print("appliance bench relay: --events, --clients and --window must be at least 1", file=sys.stderr)
        return 2
    keep = args.data_dir is not None
    work = Path(args.data_dir) if keep else Path(tempfile.mkdtemp(prefix="appliance-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    info(f"appliance bench relay: working in {work}")
    factory = EventFactory(args.authors, args.recipients, max(1, args.workers), args.seed)
    results: list[RunResult] = []
    stored: dict[str, int] = {}
    try:
        now = int(time.time())
        data_dir = work / "appliance"
        preloaded = 0
        if args.preload > 0:
            info(f"preloading {args.preload:,} events (signed in {factory.workers} processes, "
                 "10k per transaction)...")
            preloaded, secs = preload(data_dir, factory, args.preload, newest=now - 3600, spread=30 * 86400)
            size = sum(f.stat().st_size for f in data_dir.iterdir() if f.is_file())
            info(f"preloaded {preloaded:,} events in {secs:.1f} s ({preloaded / secs:,.0f} events/s, "
                 f"signing included); database {size / 1e6:,.0f} MB")
        t0 = time.perf_counter()
        raws = factory.sign(args.events, newest=now, spread=600)
        info(f"pre-signed {len(raws):,} events in {time.perf_counter() - t0:.2f} s ({factory.workers} processes)")
        factory.close()

        relay = appliance_process(data_dir, free_port(), work / "appliance.log", args.sync_mode, args.server_arg)
        relay.start()
        try:
            r = measure(relay, raws, factory, args)
        finally:
            relay.stop()
        results.append(r)
        stored[r.name] = preloaded + r.ingest.accepted

        if not args.no_compare:
            if nostr_relay_available():
                other = nostr_relay_process(work / "nostr-relay", free_port(), work / "nostr-relay.log")
                try:
                    other.start()
                    r = measure(other, raws, factory, args)
                    results.append(r)
                    stored[r.name] = r.ingest.accepted
                except Exception as exc:  # report ours even when the comparison fails
                    info(f"nostr-relay comparison failed: {exc}")
                finally:
                    other.stop()
            else:
                info("nostr-relay is not installed (pip install 'appliance[bench]'): no comparison")
    finally:
        factory.close()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nappliance bench relay: {args.events:,} events, {args.clients} clients x window {args.window}, "
          f"preload {args.preload:,}, sync_mode {args.sync_mode}, "
          f"{os.cpu_count()} CPUs, compression {'on' if args.compression else 'off'}")
    print(table(results, stored, args.queries))
    if len(results) == 2:
        a, b = (res.ingest.accepted / res.ingest.seconds if res.ingest.seconds else 0 for res in results)
        if b:
            print(f"\ningest ratio appliance / nostr-relay: {a / b:.1f}x")
    return 0


BENCHMARKS["relay"] = Benchmark(
    "Publish signed events to a fresh relay from concurrent clients; print ingest and REQ speed.",
    _relay_args,
    run_relay,
)


from appliance import bench_leases as _bench_leases  # noqa: E402 - registered like `relay`

BENCHMARKS["leases"] = Benchmark(
    "Publish NIP-44 encrypted push leases from authenticated clients; print leases/s and OK latency.",
    _bench_leases.add_args,
    _bench_leases.run,
)
