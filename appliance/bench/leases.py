"""`appliance bench leases`: NIP-PL lease acceptance speed over real websockets.

Starts `appliance serve` with push enabled on a temporary data directory, pre-builds signed,
NIP-44-encrypted leases (distinct addresses and endpoints) for several users in worker processes,
then each user's client authenticates (NIP-42) and publishes its leases with a window of EVENTs in
flight. Reports accepted leases/s (decrypt + validation + commit) and OK latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

ORIGIN = "ws://bench.push"
PROFILE = "com.example.bench/ios"
CHANNEL = "3f2b8c1e-9d4a-4b6e-8f01-23456789abcd"

CONFIG = f"""
public_url = "{ORIGIN}"
[push]
app_profiles = [{{ id = "{PROFILE}", transport = "apns" }}]
push_kinds = [9, 1059, 7]
[push.limitation]
max_leases_per_pubkey = 16
"""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leases", type=int, default=20000, help="leases to publish (default 20000)")
    p.add_argument("--clients", type=int, default=16, help="concurrent websocket clients (default 16)")
    p.add_argument("--per-user", type=int, default=16,
                   help="leases per user (default 16 = max_leases_per_pubkey); a client AUTHs as each user in turn")
    p.add_argument("--window", type=int, default=16, help="EVENTs in flight per client (default 16)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="processes pre-building leases")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"), help="SQLite durability (default full)")
    p.add_argument("--data-dir", default=None, help="use (and keep) this directory")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `appliance serve` (repeatable), e.g. --server-arg=--lease-workers=0")


def _build(task: tuple[str, str, str, int, int, int]) -> list[str]:
    """Worker: sign + encrypt leases [start, stop) of one user."""
    from appliance.nostr import nip44
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import public_key

    secret, exec_id, exec_pub, start, stop, now = task
    pub = public_key(secret)
    ck = nip44.get_conversation_key(secret, exec_pub)
    out = []
    for i in range(start, stop):
        pt = {
            "v": 1, "origin": ORIGIN, "app_profile": PROFILE, "transport": "apns",
            "endpoint": f"{pub[:16]}-{i:08d}-" + "f" * 40, "generation": 1, "active": True,
            "subscriptions": [
                {"filter": {"kinds": [9], "#p": [pub]}, "class": "time_sensitive"},
                {"filter": {"kinds": [9, 7], "#h": [CHANNEL]}, "class": "default"},
            ],
        }
        content = nip44.encrypt(json.dumps(pt), ck)
        tags = [["d", f"bench-{pub[:8]}-{i:012d}"], ["expiration", str(now + 86400)], ["exec", exec_id],
                ["alt", "Push lease"]]
        out.append(sign_event(secret, 30350, tags, content, now).to_json())
    return out


async def _client(url: str, users: list[tuple[str, list[str]]], window: int, lat: list[float], res: dict) -> None:
    """One connection: for each user, AUTH (NIP-42) as them, then pipeline their leases."""
    import websockets

    from appliance.nostr.event import sign_event

    ws = await websockets.connect(url, max_size=None, ping_interval=None, open_timeout=30, compression=None)
    try:
        challenge = None
        while challenge is None:
            msg = orjson.loads(await ws.recv())
            if msg[0] == "AUTH":
                challenge = msg[1]
        for secret, raws in users:
            auth = sign_event(secret, 22242, [["relay", ORIGIN], ["challenge", challenge]], "")
            await ws.send(json.dumps(["AUTH", auth.to_dict()]))
            while True:
                msg = orjson.loads(await ws.recv())
                if msg[0] == "OK" and msg[1] == auth.id:
                    if not msg[2]:
                        raise RuntimeError(f"AUTH refused: {msg[3]}")
                    break
            slots = asyncio.Semaphore(window)
            sent: dict[str, float] = {}
            remaining = len(raws)

            async def reader() -> None:
                nonlocal remaining
                while remaining:
                    async with asyncio.timeout(60):  # cheaper than wait_for (no task per message)
                        msg = orjson.loads(await ws.recv())
                    if msg[0] != "OK" or msg[1] not in sent:
                        continue
                    lat.append(time.perf_counter() - sent.pop(msg[1]))
                    key = "accepted" if msg[2] else msg[3]
                    res[key] = res.get(key, 0) + 1
                    remaining -= 1
                    slots.release()

            task = asyncio.create_task(reader())
            for raw in raws:
                await slots.acquire()
                sent[raw[7:71]] = time.perf_counter()
                await ws.send('["EVENT",' + raw + "]")
            await task
    finally:
        await ws.close()


def run(args: argparse.Namespace) -> int:
    from appliance.bench.harness import appliance_process, free_port, info, percentile
    from appliance.nostr.keys import generate_secret

    if args.leases < 1 or args.clients < 1 or args.window < 1 or args.per_user < 1:
        print("appliance bench leases: --leases, --clients and --window must be at least 1", file=sys.stderr)
        return 2
    keep = args.data_dir is not None
    work = Path(args.data_dir) if keep else Path(tempfile.mkdtemp(prefix="appliance-bench-leases-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.toml").write_text(CONFIG)
    port = free_port()
    relay = appliance_process(work / "appliance", port, work / "appliance.log", args.sync_mode,
                              ["--config", str(work / "config.toml"), *args.server_arg])
    try:
        relay.start()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Accept": "application/nostr+json"})
        doc = json.loads(urllib.request.urlopen(req, timeout=10).read())
        key = next(k for k in doc["push"]["keys"] if k.get("current"))
        now = int(time.time())
        n_users = -(-args.leases // args.per_user)
        secrets = [generate_secret() for _ in range(n_users)]
        tasks = []
        for u, secret in enumerate(secrets):
            n = min(args.per_user, args.leases - u * args.per_user)
            tasks.append((secret, key["id"], key["pubkey"], 0, n, now))
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max(1, args.workers)) as pool:
            batches = list(pool.map(_build, tasks, chunksize=32))
        users = [(task[0], batch) for task, batch in zip(tasks, batches)]
        info(f"pre-built {args.leases:,} signed, NIP-44 encrypted leases for {n_users:,} users "
             f"in {time.perf_counter() - t0:.1f} s")

        lat: list[float] = []
        res: dict[str, int] = {}

        async def main() -> float:
            t = time.perf_counter()
            url = f"ws://127.0.0.1:{port}"
            await asyncio.gather(*(_client(url, users[i::args.clients], args.window, lat, res)
                                   for i in range(args.clients)))
            return time.perf_counter() - t

        secs = asyncio.run(main())
    finally:
        relay.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    accepted = res.pop("accepted", 0)
    print(f"\nappliance bench leases: {args.leases:,} leases ({args.per_user} per user), {args.clients} clients "
          f"(NIP-42 AUTH per user) x window {args.window}, sync_mode {args.sync_mode}, {os.cpu_count()} CPUs")
    print(f"accepted   {accepted:,} in {secs:.2f} s = {accepted / secs:,.0f} leases/s")
    print(f"OK latency p50 {percentile(lat, 50) * 1000:.1f} ms  p99 {percentile(lat, 99) * 1000:.1f} ms  "
          f"max {max(lat) * 1000 if lat else float('nan'):.1f} ms")
    if res:
        print("rejected   " + ", ".join(f"{v}x {k}" for k, v in sorted(res.items())))
    return 0 if accepted == args.leases else 1
