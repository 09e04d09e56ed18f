"""`appliance bench relay` starts `appliance serve` as a subprocess on a temporary data directory,
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
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from appliance.bench.harness import (RelayProcess, appliance_process, cpu_seconds, database_cpu_seconds, free_port,
                                     info, percentile, rss_mb)
from appliance.store.dsn import redact

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


def _seeded_secret(seed: int, role: str, i: int) -> str:
    """A benchmark key derived from the seed (never a real key: anyone can derive it)."""
    return hashlib.sha256(f"appliance bench {seed} {role} {i}".encode()).hexdigest()


class EventFactory:
    """A pool of author keys and recipients, and a process pool that signs events with them."""

    CHUNK = 10_000

    def __init__(self, authors: int, recipients: int, workers: int, seed: int):
        from appliance.nostr.keys import public_key

        # Keys follow from the seed, so a kept data directory (--data-dir) reused with the same
        # seed is queried for the authors and recipients it holds.
        self.secrets = [_seeded_secret(seed, "author", i) for i in range(authors)]
        self.pubkeys = [public_key(s) for s in self.secrets]
        self.recipients = [public_key(_seeded_secret(seed, "recipient", i)) for i in range(recipients)]
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


def stored_already(data_dir: Path) -> int:
    """Events a kept data directory (--data-dir) already holds."""
    from appliance.store.backend import database_errors
    from appliance.store.events import event_counts
    from appliance.store.sqlite import DB_FILENAME, connect

    path = data_dir / DB_FILENAME
    if not path.exists():
        return 0
    conn = connect(path, readonly=True)
    try:
        return sum(event_counts(conn).values())
    except database_errors():
        return 0
    finally:
        conn.close()


def preload(data_dir: Path, factory: EventFactory, n: int, *, newest: int, spread: int,
            storage: str = "sqlite") -> tuple[int, float]:
    """Store `n` signed events with `store_event`, 10k per transaction; (stored, seconds)."""
    from appliance.origin_config import prepare_origins
    from appliance.nostr.event import Event
    from appliance.settings import load
    from appliance.store.events import store_event
    from appliance.store.backend import make_store

    settings = load(flags={"data_dir": str(data_dir)}, environ={})
    t0 = time.perf_counter()
    stored = 0
    store = make_store(storage, data_dir, sync_mode="normal").open()
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


# -- nostr-relay, for comparison -------------------------------------------------------


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
    cpu_per_event: float = float("nan")  # the relay's CPU seconds per accepted event


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


def measure(relay: RelayProcess, raws: list[bytes], factory: EventFactory, args: argparse.Namespace,
            wal: Path | None = None, read_path: "ReadPathResult | None" = None) -> RunResult:
    arun = _event_loop_runner()
    info(f"{relay.name}: publishing {len(raws):,} events from {args.clients} clients "
         f"(window {args.window}) to {relay.url}")

    async def run_ingest() -> IngestResult:
        if wal is None or read_path is None:
            return await ingest(relay.url, raws, args.clients, args.window, args.compression)
        with WalSampler(wal) as sampler:
            r = await ingest(relay.url, raws, args.clients, args.window, args.compression)
        read_path.wal_peak_ingest = sampler.peak
        return r

    storage = getattr(args, "storage", "sqlite") if relay.name == "appliance" else "sqlite"
    c0, d0 = cpu_seconds(relay.proc.pid), database_cpu_seconds(storage)
    result = arun(run_ingest())
    result.cpu_per_event = (cpu_seconds(relay.proc.pid) - c0) / max(1, result.accepted)
    if storage != "sqlite":
        db_cpu = (database_cpu_seconds(storage) - d0) / max(1, result.accepted)
        info(f"{relay.name}: PostgreSQL backends' CPU per event {db_cpu * 1000:.3f} ms "
             f"(the appliance's: {result.cpu_per_event * 1000:.3f} ms)")
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



# -- read path, fan-out, abuse (`appliance bench relay`, the appliance only) --------------------


class WalSampler:
    """Samples the WAL file's size every few milliseconds while running; `peak` in bytes."""

    def __init__(self, path: Path, every: float = 0.01):
        self.path = path
        self.every = every
        self.peak = 0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            try:
                self.peak = max(self.peak, self.path.stat().st_size)
            except OSError:
                pass
            await asyncio.sleep(self.every)

    def __enter__(self) -> "WalSampler":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
        try:
            self.peak = max(self.peak, self.path.stat().st_size)
        except OSError:
            pass


def load_average() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


async def _round_trips(ws, messages: list[str], sub_ids: list[str], latencies: list[float]) -> int:
    """Send each REQ/COUNT and wait for its EOSE/COUNT/CLOSED; returns events received."""
    n = 0
    perf = time.perf_counter
    for text, sub in zip(messages, sub_ids):
        t0 = perf()
        await ws.send(text)
        async with asyncio.timeout(60):
            while True:
                msg = orjson.loads(await ws.recv())
                if msg[1] != sub:
                    continue
                if msg[0] == "EVENT":
                    n += 1
                    continue
                break
        latencies.append(perf() - t0)
        if msg[0] == "EOSE":
            await ws.send('["CLOSE",' + orjson.dumps(sub).decode() + "]")
    return n


def req_shapes(factory: EventFactory, rng: random.Random, n: int) -> dict[str, list[dict]]:
    """The REQ shapes the read-path targets name (issue: read path as fast as strfry)."""
    return {
        "REQ kinds+#p limit 50": [{"kinds": [1], "#p": [rng.choice(factory.recipients)], "limit": 50} for _ in range(n)],
        "REQ authors limit 50": [{"authors": [rng.choice(factory.pubkeys)], "limit": 50} for _ in range(n)],
        "REQ kinds+#p limit 1": [{"kinds": [1], "#p": [rng.choice(factory.recipients)], "limit": 1} for _ in range(n)],
    }


async def read_latencies(url: str, shapes: dict[str, list[dict]], out: dict[str, list[float]],
                         returned: dict[str, int], warm: int = 0, pid: int | None = None,
                         cpu: dict[str, list[float]] | None = None) -> None:
    """Sequential REQs of each shape on one connection (opened before the clock); with `pid`,
    the relay's CPU seconds per REQ of each shape go to `cpu`."""
    ws = await _connect(url, False)
    try:
        for name, filters in shapes.items():
            msgs, subs = [], []
            for i, f in enumerate(filters):
                subs.append(f"r{i}")
                msgs.append(orjson.dumps(["REQ", f"r{i}", f]).decode())
            if warm:  # not timed, not counted
                await _round_trips(ws, msgs[:warm], subs[:warm], [])
                msgs, subs = msgs[warm:], subs[warm:]
            lat: list[float] = []
            c0 = cpu_seconds(pid) if pid else 0.0
            n = await _round_trips(ws, msgs, subs, lat)
            if pid and cpu is not None:
                cpu.setdefault(name, []).append((cpu_seconds(pid) - c0) / max(1, len(msgs)))
            out.setdefault(name, []).extend(lat)
            returned[name] = returned.get(name, 0) + n
    finally:
        await ws.close()


async def count_latencies(url: str, filters: list[dict]) -> list[float]:
    ws = await _connect(url, False)
    try:
        msgs = [orjson.dumps(["COUNT", f"c{i}", f]).decode() for i, f in enumerate(filters)]
        lat: list[float] = []
        await _round_trips(ws, msgs, [f"c{i}" for i in range(len(filters))], lat)
        return lat
    finally:
        await ws.close()


async def after_bursts(url: str, bursts: list[list[bytes]], clients: int, window: int,
                       shapes_per_burst: list[dict[str, list[dict]]], pid: int | None = None,
                       cpu: dict[str, list[float]] | None = None) -> tuple[dict[str, list[float]], float]:
    """Publish each burst, then at once time REQs of every shape; (latencies by shape, ingest/s)."""
    out: dict[str, list[float]] = {}
    returned: dict[str, int] = {}
    accepted, seconds = 0, 0.0
    for burst, shapes in zip(bursts, shapes_per_burst):
        r = await ingest(url, burst, clients, window, False)
        accepted += r.accepted
        seconds += r.seconds
        await read_latencies(url, shapes, out, returned, pid=pid, cpu=cpu)
    return out, accepted / seconds if seconds else 0.0


async def ingest_with_readers(url: str, raws: list[bytes], clients: int, window: int, readers: int,
                              factory: EventFactory, rng: random.Random) -> tuple[IngestResult, list[float]]:
    """Ingest while `readers` connections issue REQs back to back (the WAL-growth scenario)."""
    stop = asyncio.Event()
    lat: list[float] = []

    async def reader(seed: int) -> None:
        ws = await _connect(url, False)
        r = random.Random(seed)
        i = 0
        try:
            while not stop.is_set():
                f = {"kinds": [1], "#p": [r.choice(factory.recipients)], "limit": 50}
                i += 1
                await _round_trips(ws, [orjson.dumps(["REQ", f"w{i}", f]).decode()], [f"w{i}"], lat)
        finally:
            await ws.close()

    tasks = [asyncio.create_task(reader(rng.randrange(1 << 30))) for _ in range(readers)]
    try:
        result = await ingest(url, raws, clients, window, False)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result, lat


async def fanout(url: str, connections: int, rounds: int, factory: EventFactory,
                 pid: int | None = None) -> tuple[list[float], float]:
    """One event to `connections` subscribers: seconds from its EVENT sent until the last has it;
    and the relay's CPU seconds per event (with `pid`)."""
    import websockets

    from appliance.nostr.event import sign_event

    subs = [await websockets.connect(url, compression=None, max_size=None, open_timeout=60, ping_interval=None)
            for _ in range(connections)]
    pub = await _connect(url, False)
    try:
        for ws in subs:  # (an AUTH challenge first, from relays that send one: skipped below)
            await ws.send('["REQ","live",{"kinds":[1],"#t":["fanout"]}]')
        for ws in subs:
            async with asyncio.timeout(60):
                while orjson.loads(await ws.recv())[0] != "EOSE":
                    pass
        secret = factory.secrets[0]
        lat: list[float] = []
        c0 = cpu_seconds(pid) if pid else float("nan")
        for i in range(rounds):
            ev = sign_event(secret, 1, [["t", "fanout"]], f"fan-out {i} {time.time()}")
            text = '["EVENT",' + ev.to_json() + "]"

            async def one(ws) -> None:
                async with asyncio.timeout(60):
                    while True:
                        msg = orjson.loads(await ws.recv())
                        if msg[0] == "EVENT" and msg[2]["id"] == ev.id:
                            return

            waiters = [asyncio.create_task(one(ws)) for ws in subs]
            await asyncio.sleep(0)
            t0 = time.perf_counter()
            await pub.send(text)
            await asyncio.gather(*waiters)
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)
        return lat, (cpu_seconds(pid) - c0) / rounds if pid else float("nan")
    finally:
        await pub.close()
        await asyncio.gather(*(ws.close() for ws in subs), return_exceptions=True)


HEAVY_COUNT_FILTERS = 16


async def abuse(url: str, attackers: int, seconds: float, factory: EventFactory, rng: random.Random,
                in_flight: int = 5) -> tuple[list[float], int, int]:
    """`attackers` connections keep heavy COUNTs (16 filters over every kind-1 event) in flight
    while a bystander times trivial REQs; (bystander latencies, COUNTs answered, COUNTs refused)."""
    heavy = orjson.dumps([{"kinds": [1], "since": k} for k in range(HEAVY_COUNT_FILTERS)]).decode()[1:-1]
    stop = asyncio.Event()
    answered = refused = 0

    async def attacker(a: int) -> None:
        nonlocal answered, refused
        ws = await _connect(url, False)
        try:
            sent = 0
            pending = 0

            async def send_one() -> None:
                nonlocal sent, pending
                sent += 1
                pending += 1
                await ws.send(f'["COUNT","a{a}.{sent}",{heavy}]')

            for _ in range(in_flight):
                await send_one()
            while pending:
                msg = orjson.loads(await asyncio.wait_for(ws.recv(), 120))
                if msg[0] in ("COUNT", "CLOSED"):
                    pending -= 1
                    if msg[0] == "COUNT":
                        answered += 1
                    else:
                        refused += 1
                    if not stop.is_set():
                        await send_one()
        finally:
            await ws.close()

    tasks = [asyncio.create_task(attacker(a)) for a in range(attackers)]
    await asyncio.sleep(0.5)  # the attack is under way
    lat: list[float] = []
    ws = await _connect(url, False)
    try:
        deadline = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < deadline:
            f = {"kinds": [1], "#p": [rng.choice(factory.recipients)], "limit": 50}
            i += 1
            await _round_trips(ws, [orjson.dumps(["REQ", f"b{i}", f]).decode()], [f"b{i}"], lat)
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await ws.close()
        await asyncio.gather(*tasks, return_exceptions=True)
    return lat, answered, refused


@dataclass
class ReadPathResult:
    quiet: dict[str, list[float]] = field(default_factory=dict)
    quiet_returned: dict[str, int] = field(default_factory=dict)
    quiet_cpu: dict[str, list[float]] = field(default_factory=dict)  # relay CPU seconds per REQ
    after_burst: dict[str, list[float]] = field(default_factory=dict)
    after_burst_cpu: dict[str, list[float]] = field(default_factory=dict)
    count: list[float] = field(default_factory=list)
    count_cpu: float = float("nan")
    fanout_cpu: float = float("nan")
    fanout: list[float] = field(default_factory=list)
    fanout_connections: int = 0
    abuse: list[float] = field(default_factory=list)
    abuse_counts: tuple[int, int] = (0, 0)
    abuse_attackers: int = 0
    abuse_rss: tuple[float, float, float] = (float("nan"),) * 3
    wal_peak_ingest: int = 0
    wal_peak_readers: int = 0
    wal_reader_lat: list[float] = field(default_factory=list)
    wal_ingest_rate: float = 0.0
    burst_rate: float = 0.0


def measure_read_path(relay: RelayProcess, wal_path: Path, extra: list[list[bytes]], factory: EventFactory,
                      args: argparse.Namespace, result: ReadPathResult) -> None:
    """Quiet and after-burst REQs, COUNT, ingest with readers (WAL peak), fan-out, abuse."""
    arun = _event_loop_runner()
    rng = random.Random(args.seed + 7)
    n = args.queries
    time.sleep(2.0)  # quiet: checkpoints done, nothing else running
    info("appliance: REQ latency, quiet")
    pid = relay.proc.pid
    arun(read_latencies(relay.url, req_shapes(factory, rng, n + 10), result.quiet, result.quiet_returned, warm=10,
                        pid=pid, cpu=result.quiet_cpu))
    info("appliance: COUNT latency, quiet")
    c0 = cpu_seconds(pid)
    result.count = arun(count_latencies(relay.url, [{"kinds": [1], "#p": [rng.choice(factory.recipients)]}
                                                    for _ in range(n)]))
    result.count_cpu = (cpu_seconds(pid) - c0) / max(1, n)
    bursts, wal_events = extra[:-1], extra[-1]
    if bursts:
        info(f"appliance: REQ latency right after each of {len(bursts)} bursts of {len(bursts[0]):,} events")

        async def bursts_run():
            with WalSampler(wal_path):
                return await after_bursts(relay.url, bursts, args.clients, args.window,
                                          [req_shapes(factory, rng, max(10, n // len(bursts))) for _ in bursts],
                                          pid=pid, cpu=result.after_burst_cpu)

        result.after_burst, result.burst_rate = arun(bursts_run())
    if wal_events:
        info(f"appliance: ingest of {len(wal_events):,} events from 4 clients with 2 readers (WAL peak)")

        async def wal_run():
            with WalSampler(wal_path) as sampler:
                r, lat = await ingest_with_readers(relay.url, wal_events, 4, args.window, 2, factory, rng)
            return r, lat, sampler.peak

        r, result.wal_reader_lat, result.wal_peak_readers = arun(wal_run())
        result.wal_ingest_rate = r.accepted / r.seconds if r.seconds else 0.0
    if args.fanout:
        info(f"appliance: live fan-out to {args.fanout} connections")
        result.fanout_connections = args.fanout
        result.fanout, result.fanout_cpu = arun(fanout(relay.url, args.fanout, 30, factory, pid))
    if args.attackers:
        info(f"appliance: bystander REQs while {args.attackers} connections send {HEAVY_COUNT_FILTERS}-filter COUNTs")
        before = rss_mb(relay.proc.pid)
        result.abuse_attackers = args.attackers
        result.abuse, answered, refused = arun(abuse(relay.url, args.attackers, args.abuse_seconds, factory, rng))
        during = rss_mb(relay.proc.pid)
        time.sleep(7.0)  # extra reader threads retire after 5 s idle
        result.abuse_counts = (answered, refused)
        result.abuse_rss = (before, during, rss_mb(relay.proc.pid))


# The targets, in ms: (p50, p99) quiet and right after a burst; None where none is set.
REQ_TARGETS = {"REQ kinds+#p limit 50": (0.7, 3.0), "REQ authors limit 50": (0.7, 3.0),
               "REQ kinds+#p limit 1": (0.3, 3.0)}
AFTER_BURST_TARGET = (1.0, 3.0)
COUNT_TARGET_P50 = 1.0  # at 1M stored events
FANOUT_BEFORE_MS = 18.0  # one event to 300 connections before the read-path work (no regression)


def _met(lat: list[float], p50: float | None, p99: float | None) -> str:
    """`yes` when the figures are within the targets, else what is over."""
    if not lat or (p50 is None and p99 is None):
        return ""
    over = []
    if p50 is not None and percentile(lat, 50) * 1000 > p50:
        over.append("p50")
    if p99 is not None and percentile(lat, 99) * 1000 > p99:
        over.append("p99")
    return "yes" if not over else "NO (" + ", ".join(over) + ")"


def _cpu_ms(values) -> str:
    values = [v for v in (values if isinstance(values, list) else [values]) if v == v]
    return f"{sum(values) / len(values) * 1000:.3f}" if values else "-"


def read_path_table(r: ReadPathResult, stored: int) -> str:
    rows = [["figure", "p50 (ms)", "p99 (ms)", "n", "relay CPU/op (ms)", "target (ms)", "met"]]
    for name, lat in r.quiet.items():
        per = r.quiet_returned.get(name, 0) / max(1, len(lat))
        p50, p99 = REQ_TARGETS[name]
        rows.append([f"{name}, quiet ({per:.1f} events)", _ms(lat, 50), _ms(lat, 99), str(len(lat)),
                     _cpu_ms(r.quiet_cpu.get(name, [])), f"p50 <= {p50}, p99 <= {p99}", _met(lat, p50, p99)])
    for name, lat in r.after_burst.items():
        p50, p99 = AFTER_BURST_TARGET
        rows.append([f"{name}, right after a burst", _ms(lat, 50), _ms(lat, 99), str(len(lat)),
                     _cpu_ms(r.after_burst_cpu.get(name, [])), f"p50 <= {p50}, p99 <= {p99}", _met(lat, p50, p99)])
    at_1m = stored >= 1_000_000
    rows.append(["COUNT kinds+#p", _ms(r.count, 50), _ms(r.count, 99), str(len(r.count)), _cpu_ms(r.count_cpu),
                 f"p50 <= {COUNT_TARGET_P50} at 1M", _met(r.count, COUNT_TARGET_P50, None) if at_1m else "(not at 1M)"])
    if r.wal_reader_lat:
        rows.append(["REQ kinds+#p limit 50, during ingest", _ms(r.wal_reader_lat, 50), _ms(r.wal_reader_lat, 99),
                     str(len(r.wal_reader_lat)), "-", "", ""])
    if r.fanout:
        rows.append([f"live fan-out, 1 event to {r.fanout_connections} connections", _ms(r.fanout, 50),
                     _ms(r.fanout, 99), str(len(r.fanout)), _cpu_ms(r.fanout_cpu),
                     f"no regression (about {FANOUT_BEFORE_MS:g} before)",
                     _met(r.fanout, FANOUT_BEFORE_MS, None) if r.fanout_connections == 300 else ""])
    if r.abuse_attackers:
        rows.append([f"abuse: bystander REQ, {r.abuse_attackers} conns x {HEAVY_COUNT_FILTERS}-filter COUNTs",
                     _ms(r.abuse, 50), _ms(r.abuse, 99), str(len(r.abuse)), "-", "p99 < 250", _met(r.abuse, None, 250)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
           for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    mib = 1024 * 1024
    out.append("")
    out.append(f"stored events: {stored:,}")
    out.append(f"WAL peak: {r.wal_peak_ingest / mib:.1f} MiB during the ingest run; "
               f"{r.wal_peak_readers / mib:.1f} MiB during an ingest with 2 readers "
               f"({r.wal_ingest_rate:,.0f} events/s) (target < 64 MiB)")
    if r.burst_rate:
        out.append(f"ingest during the bursts: {r.burst_rate:,.0f} events/s")
    if r.abuse_attackers:
        a, b, c = r.abuse_rss
        out.append(f"abuse: {r.abuse_counts[0]:,} heavy COUNTs answered, {r.abuse_counts[1]:,} refused (CLOSED); "
                   f"relay RSS {a:,.0f} MB before, {b:,.0f} MB at the end of the attack, {c:,.0f} MB 7 s later")
    return "\n".join(out)


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
        ratio_of([rate(r) for r in results], True) if len(results) == 2 else "", ">= 11,000 (quiet box)")
    add("relay CPU per event (ms)", [_cpu_ms(r.ingest.cpu_per_event) for r in results])
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


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=20_000, metavar="N", help="events to publish (default 20000)")
    p.add_argument("--clients", type=int, default=8, metavar="C", help="concurrent websocket clients (default 8)")
    p.add_argument("--window", type=int, default=100, metavar="W",
                   help="EVENTs each client keeps in flight before waiting for OKs (default 100)")
    p.add_argument("--preload", type=int, default=0, metavar="N",
                   help="first store N signed events directly in the database (10k per transaction)")
    p.add_argument("--queries", type=int, default=200, metavar="Q",
                   help="REQs timed per query shape (default 200, after 10 warm-up queries)")
    p.add_argument("--authors", type=int, default=300, metavar="K",
                   help="distinct author keys (default 300: REQs by author return their full limit of 50)")
    p.add_argument("--recipients", type=int, default=300, metavar="K",
                   help="distinct p-tagged recipients (default 300: #p REQs return their full limit of 50)")
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
    p.add_argument("--bursts", type=int, default=5, metavar="B",
                   help="write bursts after which REQ latency is timed at once (default 5; 0 skips)")
    p.add_argument("--burst-events", type=int, default=3000, metavar="N", help="events per burst (default 3000)")
    p.add_argument("--wal-events", type=int, default=20_000, metavar="N",
                   help="events ingested by 4 clients while 2 clients REQ back to back, for the WAL peak "
                        "(default 20000; 0 skips)")
    p.add_argument("--fanout", type=int, default=300, metavar="C",
                   help="subscribed connections for the live fan-out figure (default 300; 0 skips)")
    p.add_argument("--attackers", type=int, default=10, metavar="A",
                   help="connections sending heavy 16-filter COUNTs for the abuse figure (default 10; 0 skips)")
    p.add_argument("--abuse-seconds", type=float, default=5.0, metavar="S",
                   help="how long the abuse figure's bystander measures (default 5)")
    p.add_argument("--storage", default="sqlite", metavar="sqlite|URL",
                   help="the store: sqlite (default) or the URL of an EMPTY PostgreSQL database "
                   "(postgresql://...); the PostgreSQL backends' CPU is reported beside the appliance's")
    p.add_argument("--strfry", metavar="PATH", default=None,
                   help="a strfry executable to measure side by side with a fresh appliance (default: $STRFRY_BIN)")
    p.add_argument("--compare-events", type=int, default=6000, metavar="N",
                   help="events ingested by each relay side by side, from 4 clients (default 6000)")
    p.add_argument("--compare-queries", type=int, default=60, metavar="Q",
                   help="REQs timed per shape side by side (default 60, after 10 warm-up queries)")
    p.add_argument("--compare-only", action="store_true",
                   help="only the side-by-side figures (with --strfry or $STRFRY_BIN)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `appliance serve` (repeatable), e.g. --server-arg=--write-batch=1000")


def run(args: argparse.Namespace) -> int:
    if args.events < 1 or args.clients < 1 or args.window < 1:
        print("appliance bench relay: --events, --clients and --window must be at least 1", file=sys.stderr)
        return 2
    from appliance.bench import strfry as strfry_bench

    strfry = args.strfry or strfry_bench.strfry_binary()
    if args.compare_only and not strfry:
        print("appliance bench relay: --compare-only needs --strfry PATH or STRFRY_BIN", file=sys.stderr)
        return 2
    keep = args.data_dir is not None
    work = Path(args.data_dir) if keep else Path(tempfile.mkdtemp(prefix="appliance-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    info(f"appliance bench relay: working in {work}")
    load_start = load_average()
    if args.compare_only:
        try:
            print(side_by_side_report(work, strfry, args, load_start))
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
        return 0
    factory = EventFactory(args.authors, args.recipients, max(1, args.workers), args.seed)
    results: list[RunResult] = []
    stored: dict[str, int] = {}
    try:
        now = int(time.time())
        data_dir = work / "appliance"
        preloaded = stored_already(data_dir)
        if preloaded:
            info(f"{data_dir} already holds {preloaded:,} events (kept; --preload adds to them)")
        if args.preload > 0:
            info(f"preloading {args.preload:,} events (signed in {factory.workers} processes, "
                 "10k per transaction)...")
            added, secs = preload(data_dir, factory, args.preload, newest=now - 3600, spread=30 * 86400,
                                  storage=args.storage)
            preloaded += added
            size = sum(f.stat().st_size for f in data_dir.iterdir() if f.is_file())
            info(f"preloaded {added:,} events in {secs:.1f} s ({added / secs:,.0f} events/s, "
                 f"signing included); database {size / 1e6:,.0f} MB")
        t0 = time.perf_counter()
        extra_n = args.bursts * args.burst_events + args.wal_events
        signed = factory.sign(args.events + extra_n, newest=now, spread=600)
        raws = signed[: args.events]
        extra = [signed[args.events + i * args.burst_events: args.events + (i + 1) * args.burst_events]
                 for i in range(args.bursts)] + [signed[args.events + args.bursts * args.burst_events:]]
        info(f"pre-signed {len(signed):,} events in {time.perf_counter() - t0:.2f} s ({factory.workers} processes)")
        factory.close()

        relay = appliance_process(data_dir, free_port(), work / "appliance.log", args.sync_mode, args.server_arg,
                                  storage=args.storage)
        relay.start()
        read_path = ReadPathResult()
        try:
            r = measure(relay, raws, factory, args, wal=data_dir / "appliance.sqlite3-wal", read_path=read_path)
            measure_read_path(relay, data_dir / "appliance.sqlite3-wal", extra, factory, args, read_path)
        finally:
            relay.stop()
        results.append(r)
        stored[r.name] = preloaded + r.ingest.accepted
        total_stored = stored[r.name] + sum(len(b) for b in extra) + (read_path.fanout and len(read_path.fanout) or 0)

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
          f"preload {args.preload:,}, sync_mode {args.sync_mode}, storage {redact(args.storage)}, "
          f"{os.cpu_count()} CPUs, compression {'on' if args.compression else 'off'}; "
          f"load average {load_start} at the start, {load_average()} at the end")
    print(table(results, stored, args.queries))
    print(f"\nread path (appliance; quiet = 2 s after the ingest; a shared or busy machine gives noisy figures)")
    print(read_path_table(read_path, total_stored))
    if len(results) == 2:
        a, b = (res.ingest.accepted / res.ingest.seconds if res.ingest.seconds else 0 for res in results)
        if b:
            print(f"\ningest ratio appliance / nostr-relay: {a / b:.1f}x")
    if strfry:
        work = Path(tempfile.mkdtemp(prefix="appliance-bench-"))
        try:
            print("\n" + side_by_side_report(work, strfry, args, load_average()))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def side_by_side_report(work: Path, strfry: str, args: argparse.Namespace, load_start: str) -> str:
    """A fresh appliance and strfry side by side (appliance.bench.strfry); the report."""
    from appliance.bench import strfry as strfry_bench

    # About 60 events per author and per recipient: a 50-event REQ gets its 50.
    keys = max(1, args.compare_events // 60)
    factory = EventFactory(keys, keys, max(1, args.workers), args.seed + 101)
    try:
        now = int(time.time())
        signed = factory.sign(args.compare_events + args.burst_events, newest=now, spread=600)
    finally:
        factory.close()
    raws, burst = signed[: args.compare_events], signed[args.compare_events:] if args.bursts else []
    relay = appliance_process(work / "appliance-vs", free_port(), work / "appliance-vs.log", args.sync_mode,
                              args.server_arg)
    relay.start()
    try:
        table = strfry_bench.run_side_by_side(work, strfry, relay, raws, burst, factory, args)
    finally:
        relay.stop()
    return (f"side by side: appliance and strfry, {len(raws):,} events ingested from 4 clients, then REQs "
            f"({args.compare_queries} per shape), a burst of {len(burst):,}, fan-out to {args.fanout}; sync_mode "
            f"{args.sync_mode}; load average {load_start} at the start, {load_average()} at the end\n{table}")
