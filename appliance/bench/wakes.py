"""`appliance bench wakes`: the NIP-PL delivery path, measured.

Every part starts `appliance serve` (push enabled, one APNs app profile with credentials) on a
temporary data directory and the APNs emulator (HTTP/2 + TLS, verifying every provider token) as
a separate process, so the appliance has a core to itself on a 2-core box as it would next to
Apple. Leases are preloaded straight into the SQLite file through the executor's own functions
(`check_lease_stateless` on the plaintext, then `apply_lease`, as an accepted lease is stored),
each user holding `--devices` leases (#p self, and #h of one of `--channels` channels).

- ingest:  the same signed kind-9 events published (8 clients, window 100) to appliances holding
           0, 10,000 and 100,000 active leases at one origin. The events mention pubkeys no lease
           names, so every event pays for matching (the index lookup) but wakes nobody; each
           database is topped up with other stored events to the same event count, so the
           figures compare the cost of the lease count itself, not of a bigger events table.
- latency: a steady stream (default 200 events/s) of events, each mentioning a different leased
           user, against 10,000 leases: time from the client sending EVENT to the emulator
           receiving that user's provider request (both clocks are this host's).
- peak:    `--peak-jobs` due wake jobs (with their leases and events) preloaded into the outbox,
           then the appliance started: wakes/s from its first APNs request to its last, through one
           HTTP/2 connection; with the CPU seconds each process spent (where the time goes).
- rss:     resident memory of the appliance holding 100,000 active leases, after a burst of
           matching traffic (VmRSS and its peak VmHWM from /proc).

`--transport fcm` runs the same parts through a draft fcm profile (FCM HTTP v1 with a service
account) against the FCM emulator (`appliance.testing.fcm_emulator`: it verifies the RS256 grant
and checks the bearer token and the message of every send) instead of APNs; apns is the default.
`--transport unifiedpush` runs them through a draft unifiedpush profile against a local HTTPS
distributor (`appliance.testing.distributor`, its own process, checking every VAPID token): each
lease's endpoint one of its push URLs with subscription keys, every wake an encrypted Web Push
message over HTTP/1.1 (the profile's per-host cap raised out of the way: one host takes them all).

A shared or busy machine gives noisy figures: run it on a quiet box.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

from appliance.bench.harness import appliance_process, free_port, info, percentile
from appliance.bench.relay import ingest

ORIGIN = "ws://bench.wakes"
PROFILE = "com.example.bench/ios"
FCM_PROFILE = "com.example.bench/android"
UP_PROFILE = "org.example.bench/up"
TOPIC = "com.example.bench"
TEAM, KEY_ID = "BENCHTEAM1", "BENCHKEY01"
PARTS = ("ingest", "latency", "peak", "rss")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable; default all)")
    p.add_argument("--transport", default="apns", choices=("apns", "fcm", "unifiedpush"),
                   help="the app profile's transport: apns (default), fcm (a draft: FCM HTTP v1 against the FCM "
                   "emulator) or unifiedpush (a draft: Web Push to a local HTTPS distributor)")
    p.add_argument("--events", type=int, default=20_000, help="events per ingest run (default 20000)")
    p.add_argument("--lease-counts", default="0,10000,100000",
                   help="active leases held in the ingest runs (default 0,10000,100000)")
    p.add_argument("--rounds", type=int, default=2,
                   help="ingest runs per lease count, interleaved; the best of each is reported (default 2)")
    p.add_argument("--rate", type=float, default=200.0, help="matching events/s for the latency part (default 200)")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the latency stream (default 20)")
    p.add_argument("--latency-leases", type=int, default=10_000, help="leases held in the latency part")
    p.add_argument("--peak-jobs", type=int, default=20_000, help="wake jobs preloaded for the peak part")
    p.add_argument("--rss-leases", type=int, default=100_000, help="leases held in the rss part")
    p.add_argument("--devices", type=int, default=1, help="leases per user (default 1)")
    p.add_argument("--channels", type=int, default=5_000, help="channels the leases' #h subscriptions spread over")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="processes signing events")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"), help="SQLite durability (default full)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `appliance serve` (repeatable), e.g. --server-arg=--wake-workers=128")
    p.add_argument("--keep", metavar="DIR", help="work in (and keep) this directory")


# -- the emulator and the config --------------------------------------------------------------------


class Emulator:
    """The APNs emulator as its own process, logging one line per answered request."""

    transport = "apns"
    ok_status = 200  # the status of an accepted request in its log

    def endpoint(self, token: str) -> str:
        """A lease's endpoint for the device `token` (APNs, FCM: the token itself)."""
        return token

    def __init__(self, work: Path):
        from cryptography.hazmat.primitives import serialization

        from appliance.testing.tls import make_p8

        self.work = work
        self.key_file = work / f"AuthKey_{KEY_ID}.p8"
        key = make_p8(self.key_file)
        pub = work / "apns-key.pub.pem"
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
        self.log = work / "apns-requests.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.testing.apns_emulator", "--dir", str(work / "apns-pki"),
             "--key", f"{TEAM}:{KEY_ID}:{pub}", "--topic", TOPIC, "--log", str(self.log)],
            stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.url, self.ca_file = ready["url"], ready["ca_file"]

    def requests(self) -> list[tuple[float, int, str, str]]:
        """(time, status, apns-id, token) per answered request so far."""
        out = []
        if self.log.exists():
            for line in self.log.read_text().split("\n")[:-1]:  # (the last is being written, or empty)
                at, status, _reason, apns_id, token = line.split(" ")
                out.append((float(at), int(status), apns_id, token))
        return out

    def reset(self) -> None:
        self.log.write_text("")

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class FcmEmulator(Emulator):
    """The FCM emulator as its own process (token endpoint and messages:send on one port), logging
    one line per answered send in the APNs emulator's format."""

    transport = "fcm"

    def __init__(self, work: Path):
        self.work = work
        self.log = work / "fcm-requests.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.testing.fcm_emulator", "--dir", str(work / "fcm-pki"),
             "--log", str(self.log)], stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.url, self.ca_file = ready["url"], ready["ca_file"]
        self.sa_file, self.token_uri = ready["service_account_file"], ready["token_uri"]


class DistributorProcess(Emulator):
    """The local HTTPS distributor as its own process (the UnifiedPush stand-in), logging one line
    per answered request; every lease's endpoint is one of its push URLs, all with the same keys."""

    transport = "unifiedpush"
    ok_status = 201

    def __init__(self, work: Path):
        from appliance.testing.distributor import Distributor

        self.work = work
        self.log = work / "distributor-requests.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.testing.distributor", "--dir", str(work / "distributor-pki"),
             "--host", "localhost", "--log", str(self.log)], stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.url, self.ca_file = ready["url"], ready["ca_file"]
        sub = Distributor().subscribe("/")
        self.keys = sub.endpoint[sub.endpoint.index("#"):]

    def endpoint(self, token: str) -> str:
        return f"{self.url}/up/{token}{self.keys}"

    def requests(self) -> list[tuple[float, int, str, str]]:
        """(time, status, "", token) per answered request so far (the token: the push URL's last part)."""
        out = []
        if self.log.exists():
            for line in self.log.read_text().split("\n")[:-1]:
                at, status, path = line.split(" ")
                out.append((float(at), int(status), "", path.rsplit("/", 1)[-1]))
        return out




def device_token(rng: random.Random, transport: str) -> str:
    """An endpoint of the transport's shape: 32 bytes of hex (APNs), an FCM registration token."""
    if transport == "fcm":
        return rng.randbytes(8).hex() + ":APA91b" + rng.randbytes(64).hex()
    return rng.randbytes(32).hex()


def config_text(emu: Emulator) -> str:
    if emu.transport == "unifiedpush":
        # One host takes every wake here: its cap is raised out of the way (the default is 10/s).
        return f"""
public_url = "{ORIGIN}"
push_draft_transports = true
[push]
app_profiles = [{{ id = "{UP_PROFILE}", transport = "unifiedpush", vapid_subject = "mailto:bench@example.org", \
allow_hosts = ["localhost"], ca_file = "{emu.ca_file}", host_rate = 100000, host_burst = 100000 }}]
push_kinds = [9, 7]
[push.limitation]
max_leases_per_pubkey = 16
"""
    if emu.transport == "fcm":
        return f"""
public_url = "{ORIGIN}"
push_draft_transports = true
[push]
app_profiles = [{{ id = "{FCM_PROFILE}", transport = "fcm", service_account_file = "{emu.sa_file}", \
token_uri = "{emu.token_uri}", fcm_url = "{emu.url}", ca_file = "{emu.ca_file}" }}]
push_kinds = [9, 7]
[push.limitation]
max_leases_per_pubkey = 16
"""
    return f"""
public_url = "{ORIGIN}"
[push]
app_profiles = [{{ id = "{PROFILE}", transport = "apns", topic = "{TOPIC}", team_id = "{TEAM}", key_id = "{KEY_ID}", \
key_file = "{emu.key_file}", environment = "production", apns_url = "{emu.url}", ca_file = "{emu.ca_file}" }}]
push_kinds = [9, 7]
[push.limitation]
max_leases_per_pubkey = 16
"""


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _memory(pid: int) -> dict[str, float]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


# -- preloading leases, events and jobs ------------------------------------------------------------


def _fake_pubkey(rng: random.Random) -> str:
    return rng.randbytes(32).hex()


def preload(data_dir: Path, config: Path, *, users: int, devices: int, channels: int, seed: int,
            jobs_for: int = 0, filler: int = 0, transport: str = "apns",
            endpoint_of=lambda token: token) -> list[tuple[str, list[str]]]:
    """Store `users` x `devices` active leases (and, for the first `jobs_for` users, one stored
    event and one due wake job per lease), then `filler` unrelated stored events of about a lease
    event's size (so databases compared for their lease count hold as many events); return
    [(pubkey, [device tokens])]."""
    from appliance.origin_config import prepare_origins
    from appliance.nostr.event import Event
    from appliance.push.acceptance import check_lease_stateless
    from appliance.push.config import build_descriptor
    from appliance.push.descriptor import ExecutorKey
    from appliance.push.state import apply_lease
    from appliance.settings import load
    from appliance.store import wakes
    from appliance.store.events import store_event
    from appliance.store.sqlite import SqliteStore

    settings = load(flags={"data_dir": str(data_dir)}, environ={}, config_path=config)
    store = SqliteStore(data_dir, sync_mode="normal").open()
    rng = random.Random(seed)
    now = int(time.time())
    probe = ExecutorKey("bench", "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798", current=True)
    out: list[tuple[str, list[str]]] = []
    try:
        origins = prepare_origins(store, settings)
        origin = next(o for o in origins if o.origin == ORIGIN)
        desc = build_descriptor(origin.origin, origin.push, [probe], drafts=True)
        profile = {"fcm": FCM_PROFILE, "unifiedpush": UP_PROFILE}.get(transport, PROFILE)
        chan = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(max(1, channels))]
        batch: list = []

        def flush() -> None:
            def op(conn, items=list(batch)):
                for ev, raw, lease, job in items:
                    store_event(conn, origin.id, ev, raw=raw, expiration=lease.expiration if ev.kind == 30350 else None,
                                now=now)
                    if lease is not None and ev.kind == 30350:
                        apply_lease(conn, origin.id, lease, desc.limits, now)
                    if job is not None:
                        wakes.insert_job(conn, **job, now=time.time(), useful_age=3600, min_interval=0)
            store.write_sync(op)
            batch.clear()

        for u in range(users):
            pub = _fake_pubkey(rng)
            tokens = []
            for dev in range(devices):
                token = device_token(rng, transport)
                tokens.append(token)
                pt = {"v": 1, "origin": ORIGIN, "app_profile": profile, "transport": transport,
                      "endpoint": endpoint_of(token),
                      "generation": 1, "active": True, "subscriptions": [
                          {"filter": {"kinds": [9], "#p": [pub]}, "class": "time_sensitive"},
                          {"filter": {"kinds": [9, 7], "#h": [chan[rng.randrange(len(chan))]]}, "class": "default"}]}
                content = json.dumps(pt)
                d = f"bench-{rng.randbytes(12).hex()}"
                tags = [["d", d], ["expiration", str(now + 86400)], ["exec", "bench"]]
                eid = hashlib.sha256(f"{pub}{d}".encode()).hexdigest()
                ev = Event(eid, pub, now, 30350, tags, content, "00" * 64)
                # The content is the plaintext itself: "decrypting" it is the identity.
                lease = check_lease_stateless(ev, authed_pubkey=pub, descriptor=desc, decrypt=lambda _k, c: c,
                                              now=now, verify=lambda _e: True)
                batch.append((ev, ev.to_json(), lease, None))
                if u < jobs_for:
                    mention = Event(hashlib.sha256(f"m{eid}".encode()).hexdigest(), _fake_pubkey(rng), now, 9,
                                    [["p", pub]], "bench", "00" * 64)
                    job = dict(job_id=wakes.new_job_id(), origin=origin.id, app_profile=profile, transport=transport,
                               endpoint_hash=lease.endpoint_hash, event_id=mention.id, lease_pubkey=pub, lease_d=d,
                               generation=1, cls="time_sensitive")
                    batch.append((mention, mention.to_json(), None, job))
            out.append((pub, tokens))
            if len(batch) >= 5000:
                flush()
        for i in range(filler):
            author = _fake_pubkey(rng)
            content = "filler " + rng.randbytes(300).hex()
            ev = Event(hashlib.sha256(f"f{seed}.{i}".encode()).hexdigest(), author, now, 1,
                       [["p", _fake_pubkey(rng)], ["t", "bench"]], content, "00" * 64)
            batch.append((ev, ev.to_json(), None, None))
            if len(batch) >= 5000:
                flush()
        if batch:
            flush()
    finally:
        store.close()
    return out


# -- signed events (worker processes) ----------------------------------------------------------------

_signers: list = []


def _init_signers(secrets: list[str]) -> None:
    from coincurve import PrivateKey, PublicKeyXOnly

    _signers[:] = [(PrivateKey(bytes.fromhex(s)), PublicKeyXOnly.from_secret(bytes.fromhex(s)).format().hex())
                   for s in secrets]


def _sign(task: tuple[int, list[str]]) -> list[bytes]:
    """Kind-9 events, one per mentioned pubkey."""
    seed, mentions = task
    rng = random.Random(seed)
    out = []
    for i, p in enumerate(mentions):
        priv, pubkey = _signers[rng.randrange(len(_signers))]
        created_at = int(time.time())
        tags = [["p", p]]
        content = f"bench message {seed}.{i}"
        digest = hashlib.sha256(orjson.dumps([0, pubkey, created_at, 9, tags, content])).digest()
        sig = priv.sign_schnorr(digest, rng.randbytes(32)).hex()
        out.append(orjson.dumps({"id": digest.hex(), "pubkey": pubkey, "created_at": created_at, "kind": 9,
                                 "tags": tags, "content": content, "sig": sig}))
    return out


def sign_mentions(mentions: list[str], workers: int, seed: int) -> list[bytes]:
    from appliance.nostr.keys import generate_secret

    secrets = [generate_secret() for _ in range(16)]
    chunk = max(100, -(-len(mentions) // (workers * 4)))
    tasks = [(seed * 100_000 + i, mentions[i * chunk:(i + 1) * chunk]) for i in range(-(-len(mentions) // chunk))]
    with ProcessPoolExecutor(workers, initializer=_init_signers, initargs=(secrets,)) as pool:
        return [raw for part in pool.map(_sign, tasks) for raw in part]


# -- the parts ----------------------------------------------------------------------------------------


class Run:
    """One appliance on its own data directory, preloaded once (`pristine`) and copied afresh for
    every measured start."""

    def __init__(self, work: Path, name: str, emu: Emulator, args, *, users: int, jobs_for: int = 0,
                 filler: int = 0, pristine: "Run | None" = None):
        self.dir = work / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "appliance.toml"
        self.config.write_text(config_text(emu))
        self.data = self.dir / "data"
        if pristine is not None:  # the same preloaded data as another run
            self.pristine, self.users = pristine.pristine, pristine.users
        else:
            self.pristine = self.dir / "pristine"
            t0 = time.perf_counter()
            self.users = preload(self.pristine, self.config, users=users, devices=args.devices,
                                 channels=args.channels, seed=zlib.crc32(name.encode()) & 0xFFFF, jobs_for=jobs_for,
                                 filler=filler, transport=emu.transport, endpoint_of=emu.endpoint)
            info(f"  {name}: preloaded {users * args.devices:,} leases"
                 + (f" and {jobs_for * args.devices:,} wake jobs" if jobs_for else "")
                 + (f" and {filler:,} other events" if filler else "")
                 + f" in {time.perf_counter() - t0:.1f} s")
        self.port = free_port()
        self.proc = appliance_process(self.data, self.port, self.dir / "server.log", args.sync_mode,
                                      ["--config", str(self.config), *args.server_arg])

    def __enter__(self) -> "Run":
        shutil.rmtree(self.data, ignore_errors=True)
        shutil.copytree(self.pristine, self.data)
        self.proc.start()
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stop()

    @property
    def pid(self) -> int:
        return self.proc.proc.pid


_RUNS: dict[str, Run] = {}


def part_ingest(work: Path, emu: Emulator, args) -> list[tuple[int, list[float], list[float]]]:
    counts = [int(c) for c in args.lease_counts.split(",")]
    most = max(counts)
    rng = random.Random(7)
    nobody = [_fake_pubkey(rng) for _ in range(args.events)]
    raws = sign_mentions(nobody, args.workers, seed=1)
    rates: dict[int, list[float]] = {c: [] for c in counts}
    cpus: dict[int, list[float]] = {c: [] for c in counts}
    runs = {c: Run(work, f"ingest-{c}", emu, args, users=c // args.devices, filler=most - c) for c in counts}
    _RUNS.update({f"ingest-{c}": r for c, r in runs.items()})
    for rnd in range(args.rounds):
        for c in counts:
            run = runs[c]
            with run:
                time.sleep(1.0)  # let start-up work settle
                cpu0 = _cpu_seconds(run.pid)
                res = asyncio.run(ingest(run.proc.url, raws, 8, 100, False))
                cpu = (_cpu_seconds(run.pid) - cpu0) / max(1, res.accepted) * 1e6
            rate = res.accepted / res.seconds if res.seconds else 0.0
            rates[c].append(rate)
            cpus[c].append(cpu)
            info(f"  ingest with {c:,} leases, round {rnd + 1}: {res.accepted:,} accepted, {rate:,.0f} events/s, "
                 f"{cpu:.0f} us of appliance CPU per event" + (f", rejected {res.reasons}" if res.rejected else ""))
    return [(c, rates[c], cpus[c]) for c in counts]


async def _stream(url: str, raws: list[bytes], rate: float) -> dict[str, float]:
    """Publish at a steady rate; the send time of each event by the pubkey it mentions."""
    import websockets

    sent: dict[str, float] = {}
    ws = await websockets.connect(url, max_size=None, compression=None, ping_interval=None)
    oks = 0

    refused: dict[str, int] = {}

    async def reader() -> None:
        nonlocal oks
        while oks < len(raws):
            msg = orjson.loads(await ws.recv())
            if msg[0] == "OK":
                oks += 1
                if not msg[2]:
                    refused[msg[3]] = refused.get(msg[3], 0) + 1
            elif msg[0] == "NOTICE":
                info(f"  NOTICE {msg[1]}")

    task = asyncio.create_task(reader())
    t0 = time.perf_counter()
    for i, raw in enumerate(raws):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        mention = orjson.loads(raw)["tags"][0][1]
        sent[mention] = time.time()
        await ws.send('["EVENT",' + raw.decode() + ']')
    try:
        async with asyncio.timeout(60):
            await task
    except TimeoutError:
        info(f"  only {oks:,} of {len(raws):,} OKs came back in time")
    if refused:
        info(f"  refused: {refused}")
    await ws.close()
    return sent


def part_latency(work: Path, emu: Emulator, args) -> dict:
    n = int(args.rate * args.seconds)
    users = max(args.latency_leases // args.devices, n)
    run = Run(work, "latency", emu, args, users=users)
    mentioned = [pub for pub, _t in run.users[:n]]
    token_of = {t: pub for pub, tokens in run.users for t in tokens}
    raws = sign_mentions(mentioned, args.workers, seed=2)
    emu.reset()
    with run:
        time.sleep(1.0)
        sent = asyncio.run(_stream(run.proc.url, raws, args.rate))
        deadline = time.time() + 30
        while time.time() < deadline and len(emu.requests()) < n * args.devices:
            time.sleep(0.2)
    lat = [(at - sent[token_of[token]]) * 1000 for at, _s, _id, token in emu.requests() if token_of.get(token) in sent]
    return {"events": n, "wakes": len(lat), "p50": percentile(lat, 50), "p90": percentile(lat, 90),
            "p99": percentile(lat, 99), "max": max(lat) if lat else float("nan")}


def part_peak(work: Path, emu: Emulator, args) -> dict:
    run = Run(work, "peak", emu, args, users=args.peak_jobs // args.devices, jobs_for=args.peak_jobs // args.devices)
    emu.reset()
    cpu_emu0 = emu.cpu_seconds()
    expected = (args.peak_jobs // args.devices) * args.devices
    with run:
        deadline = time.time() + 600
        # The appliance's CPU from its first request on (start-up excluded): where a wake's time goes.
        cpu_first, sent_first = float("nan"), 0
        while time.time() < deadline and emu.log.stat().st_size == 0:
            time.sleep(0.02)
        cpu_first, sent_first = _cpu_seconds(run.pid), len(emu.requests())
        while time.time() < deadline and len(emu.requests()) < expected:
            time.sleep(0.5)
        cpu_app = _cpu_seconds(run.pid)
    reqs = emu.requests()
    times = sorted(r[0] for r in reqs)
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    return {"wakes": len(reqs), "accepted": sum(r[1] == emu.ok_status for r in reqs), "seconds": span,
            "rate": (len(times) - 1) / span if span else float("nan"),
            "cpu_appliance": cpu_app, "cpu_emulator": emu.cpu_seconds() - cpu_emu0,
            "cpu_per_wake": (cpu_app - cpu_first) / max(1, len(reqs) - sent_first)}


def part_rss(work: Path, emu: Emulator, args) -> dict:
    users = args.rss_leases // args.devices
    same = next((r for r in _RUNS.values() if len(r.users) == users), None)
    run = Run(work, "rss", emu, args, users=users, pristine=same)
    rng = random.Random(3)
    mentioned = [run.users[rng.randrange(len(run.users))][0] for _ in range(5000)]
    raws = sign_mentions(mentioned, args.workers, seed=3)
    with run:
        time.sleep(1.0)
        idle = _memory(run.pid)
        asyncio.run(ingest(run.proc.url, raws, 4, 50, False))
        time.sleep(3.0)  # let the wakes drain
        busy = _memory(run.pid)
    return {"leases": users * args.devices, "idle_rss": idle.get("VmRSS"), "rss": busy.get("VmRSS"),
            "hwm": busy.get("VmHWM")}


def run(args: argparse.Namespace) -> int:
    parts = args.only or list(PARTS)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="appliance-bench-wakes-"))
    work.mkdir(parents=True, exist_ok=True)
    emu = {"fcm": FcmEmulator, "unifiedpush": DistributorProcess}.get(args.transport, Emulator)(work)
    results: dict = {}
    try:
        for part in parts:
            info(f"{part}:")
            results[part] = {"ingest": part_ingest, "latency": part_latency, "peak": part_peak,
                             "rss": part_rss}[part](work, emu, args)
    finally:
        emu.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nappliance bench wakes: transport {args.transport}"
          + (" (draft: FCM HTTP v1 against the FCM emulator)" if args.transport == "fcm" else "")
          + (" (draft: Web Push to a local HTTPS distributor)" if args.transport == "unifiedpush" else "")
          + f", sync_mode {args.sync_mode}, {args.devices} lease(s) per user, "
          f"{os.cpu_count()} CPUs (a shared or busy machine gives noisy figures)")
    if "ingest" in results:
        base = max(results["ingest"][0][1]) if results["ingest"] and results["ingest"][0][1] else 0
        base_cpu = min(results["ingest"][0][2]) if results["ingest"] and results["ingest"][0][2] else 0
        print(f"\ningest ({args.events:,} kind-9 events mentioning no leased user, 8 clients x window 100; the CPU")
        print("figure is the appliance's own CPU time per accepted event, steadier than events/s on a busy host):")
        print("  leases   events/s (best)  vs first   all rounds              CPU us/event (least)  vs first")
        for count, rates, cpus in results["ingest"]:
            best, least = max(rates), min(cpus)
            change = f"{(best / base - 1) * 100:+.1f}%" if base else "-"
            cpu_change = f"{(least / base_cpu - 1) * 100:+.1f}%" if base_cpu else "-"
            print(f"  {count:>7,}  {best:>12,.0f}     {change:>7}   {', '.join(f'{r:,.0f}' for r in rates):<22}  "
                  f"{least:>10.0f}           {cpu_change:>7}")
    if "latency" in results:
        r = results["latency"]
        provider = {"fcm": "FCM", "unifiedpush": "push service"}.get(args.transport, "APNs")
        print(f"\nevent -> {provider} request latency at {args.rate:.0f} matching events/s over {args.seconds:.0f} s "
              f"({args.latency_leases:,} leases): {r['wakes']:,} wakes for {r['events']:,} events")
        print(f"  p50 {r['p50']:.1f} ms   p90 {r['p90']:.1f} ms   p99 {r['p99']:.1f} ms   max {r['max']:.1f} ms")
    if "peak" in results:
        r = results["peak"]
        via = "HTTP/1.1 connections to one push host" if args.transport == "unifiedpush" else "one HTTP/2 connection"
        print(f"\npeak delivery through {via} ({r['wakes']:,} preloaded due wakes, "
              f"{r['accepted']:,} accepted): {r['rate']:,.0f} wakes/s over {r['seconds']:.1f} s")
        print(f"  CPU seconds: appliance {r['cpu_appliance']:.1f} (start-up included: "
              f"{r['cpu_appliance'] / max(1, r['wakes']) * 1e6:.0f} us per wake), emulator {r['cpu_emulator']:.1f} "
              f"({r['cpu_emulator'] / max(1, r['wakes']) * 1e6:.0f} us per request)")
        print(f"  appliance CPU per wake from its first request on: {r['cpu_per_wake'] * 1e6:.0f} us "
              f"(=> {1 / r['cpu_per_wake']:,.0f} wakes/s per CPU-second); load average {os.getloadavg()[0]:.1f}")
    if "rss" in results:
        r = results["rss"]
        print(f"\nresident memory with {r['leases']:,} active leases: {r['idle_rss']:.0f} MB idle, "
              f"{r['rss']:.0f} MB after 5,000 matching events (peak {r['hwm']:.0f} MB)")
    return 0
