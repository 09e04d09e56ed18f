"""`appliance bench gateway`: the local APNs gateway's enrollment, delegation and delivery rates.

Starts the APNs emulator (HTTP/2 + TLS, verifying provider tokens) and `appliance serve` with the
gateway enabled on a temporary data directory, its profile pointed at the emulator and its App
Attest root at a test CA. Then, over plain HTTP/1.1 keep-alive connections:

1. enrollment: software attesters fetch a challenge and enroll (attestation verified: chain,
   nonce, key id, RP id, AAGUID), `--enroll-concurrency` at a time;
2. delegation: each installation delegates to the benchmark's relay key (assertion verified,
   counter advanced, grant sealed);
3. deliveries: the relay key signs NIP-98 headers (in worker processes, ahead of each round) and
   POSTs /v1/deliveries/apns with `--concurrency` requests in flight. Each delivery is NIP-98
   verified, its event id burned, reserved in one committed transaction, sent to the emulator as
   one HTTP/2 request and finished in a second transaction.

Prints rates and p50/p99 latencies per phase. Client and server share the machine: on a small
box the client's own CPU lowers the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from appliance.bench.harness import appliance_process, cpu_seconds, free_port, percentile

TOPIC = "com.example.bench"
APP_ID = "BENCHTEAM1." + TOPIC
TEAM_ID, KEY_ID = "BENCHTEAM1", "BENCHKEY01"
PROFILE = "buzz-ios-production"
ROUND = 4000  # deliveries signed per round: a round must go out inside NIP-98's 60 s window


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--installations", type=int, default=512, help="installations enrolled and delegated (default 512)")
    p.add_argument("--deliveries", type=int, default=20000, help="deliveries to send (default 20000)")
    p.add_argument("--concurrency", type=int, default=64, help="deliveries in flight (default 64)")
    p.add_argument("--enroll-concurrency", type=int, default=16,
                   help="enrollments and delegations in flight (default 16)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="processes signing NIP-98 headers")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"), help="SQLite durability (default full)")
    p.add_argument("--data-dir", default=None, help="use (and keep) this directory")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `appliance serve` (repeatable)")


# -- a minimal HTTP/1.1 keep-alive client (the load generator must cost less than the server) ----


class Http1:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = [f"POST {path} HTTP/1.1", f"host: {self.host}:{self.port}", "content-type: application/json",
                f"content-length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# -- workers -------------------------------------------------------------------------------------


def _sign_round(task: tuple[str, str, list[tuple[str, str]], int]) -> list[tuple[bytes, str]]:
    """Worker: (body, Authorization) for each (grant, request id) of one round."""
    from appliance.nostr.nip98 import make_http_auth

    secret, url, items, expires_at = task
    out = []
    for grant, request_id in items:
        body = json.dumps({"v": 1, "endpoint_grant": grant, "request_id": request_id, "expires_at": expires_at},
                          separators=(",", ":")).encode()
        out.append((body, make_http_auth(secret, url, "POST", body)))
    return out


# -- the run -------------------------------------------------------------------------------------


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.1f}"


def run(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from appliance.nostr.keys import generate_secret, public_key
    from appliance.testing.attester import SoftwareAttester, TestCA

    work = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="appliance-bench-gateway-"))
    work.mkdir(parents=True, exist_ok=True)
    ca = TestCA()
    (work / "root.pem").write_bytes(ca.root_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    (work / "AuthKey.p8").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    (work / "AuthKey.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    emulator = subprocess.Popen(
        [sys.executable, "-m", "appliance.testing.apns_emulator", "--dir", str(work / "emulator"),
         "--key", f"{TEAM_ID}:{KEY_ID}:{work / 'AuthKey.pub'}", "--topic", TOPIC],
        stdout=subprocess.PIPE, stderr=open(work / "emulator.log", "ab"), text=True)
    relay = None
    try:
        emu = json.loads(emulator.stdout.readline())
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        (work / "appliance.toml").write_text(f"""
[gateway]
enabled = true
public_url = "{base}"
app_attest_root_ca = "{work / 'root.pem'}"
endpoint_quota_window = 1
endpoint_quota_max = 1000000
[[gateway.profiles]]
id = "{PROFILE}"
app_id = "{APP_ID}"
environment = "production"
topic = "{TOPIC}"
team_id = "{TEAM_ID}"
key_id = "{KEY_ID}"
key_file = "{work / 'AuthKey.p8'}"
apns_url = "{emu['url']}"
ca_file = "{emu['ca_file']}"
""")
        relay = appliance_process(work / "data", port, work / "appliance.log", args.sync_mode,
                                  ["--config", str(work / "appliance.toml"), *args.server_arg]).start()
        secret = generate_secret()
        relay_pubkey = public_key(secret)
        attesters = [SoftwareAttester(ca, APP_ID, "production") for _ in range(args.installations)]
        results = asyncio.run(_measure(args, base, port, attesters, relay_pubkey, secret,
                                       {"appliance": relay.proc.pid, "emulator": emulator.pid}))
    finally:
        if relay is not None:
            relay.stop()
        emulator.terminate()
        emulator.wait(10)
        if not args.data_dir:
            shutil.rmtree(work, ignore_errors=True)
    _report(args, results)
    return 0 if results["deliveries"]["accepted"] == args.deliveries else 1


async def _measure(args, base: str, port: int, attesters, relay_pubkey: str, secret: str, pids: dict) -> dict:
    import httpx

    from appliance.testing.gateway_client import AppInstallation

    out: dict = {}
    async with httpx.AsyncClient(base_url=base, limits=httpx.Limits(max_connections=args.enroll_concurrency),
                                 timeout=60) as http:
        installs = [AppInstallation(http, base, a, PROFILE, os.urandom(32).hex()) for a in attesters]

        async def phase(name: str, call) -> None:
            lat: list[float] = []
            codes: dict[int, int] = {}
            queue = list(installs)

            async def worker():
                while queue:
                    inst = queue.pop()
                    t = time.perf_counter()
                    r = await call(inst)
                    lat.append(time.perf_counter() - t)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1

            t0, cpu0 = time.perf_counter(), {k: cpu_seconds(v) for k, v in pids.items()}
            await asyncio.gather(*(worker() for _ in range(args.enroll_concurrency)))
            out[name] = {"seconds": time.perf_counter() - t0, "lat": lat, "codes": codes,
                         "cpu": {k: cpu_seconds(v) - cpu0[k] for k, v in pids.items()}}

        await phase("enroll", lambda inst: inst.enroll(lifetime=86400))
        await phase("delegate", lambda inst: inst.delegate(relay_pubkey, 1, lifetime=3600))
    grants = [inst.grants[relay_pubkey] for inst in installs if relay_pubkey in inst.grants]
    if not grants:
        raise RuntimeError(f"no delegation succeeded: {out}")

    url = base + "/v1/deliveries/apns"
    lat: list[float] = []
    codes: dict[int, int] = {}
    fire_seconds = 0.0
    cpu: dict[str, float] = {}
    left = args.deliveries
    clients = [Http1("127.0.0.1", port) for _ in range(args.concurrency)]
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        n = 0
        while left > 0:
            size = min(ROUND, left)
            items = [(grants[(n + i) % len(grants)], str(uuid.uuid4())) for i in range(size)]
            n += size
            chunks = [items[i::max(1, args.workers)] for i in range(max(1, args.workers))]
            expires_at = int(time.time()) + 600
            signed = []
            for part in await asyncio.gather(*(loop.run_in_executor(pool, _sign_round, (secret, url, c, expires_at))
                                               for c in chunks if c)):
                signed.extend(part)
            queue = signed[::-1]

            async def sender(client: Http1):
                while queue:
                    body, auth = queue.pop()
                    t = time.perf_counter()
                    status, _ = await client.post("/v1/deliveries/apns", body, {"authorization": auth})
                    lat.append(time.perf_counter() - t)
                    codes[status] = codes.get(status, 0) + 1

            t0, c0 = time.perf_counter(), {k: cpu_seconds(v) for k, v in pids.items()}
            await asyncio.gather(*(sender(c) for c in clients))
            fire_seconds += time.perf_counter() - t0
            for k, v in pids.items():
                cpu[k] = cpu.get(k, 0.0) + cpu_seconds(v) - c0[k]
            left -= size
    for c in clients:
        c.close()
    out["deliveries"] = {"seconds": fire_seconds, "lat": lat, "codes": codes, "accepted": codes.get(200, 0),
                         "cpu": cpu}
    return out


def _report(args, results: dict) -> None:
    print(f"\nappliance bench gateway: {args.installations} installations, {args.deliveries} deliveries, "
          f"{args.concurrency} in flight (sync_mode={args.sync_mode})")
    print(f"{'phase':<12} {'count':>8} {'per s':>10} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms/op':>10}  answers")
    for name in ("enroll", "delegate", "deliveries"):
        r = results[name]
        count = len(r["lat"])
        rate = count / r["seconds"] if r["seconds"] else 0.0
        cpu_ms = r["cpu"].get("appliance", 0.0) / count * 1000 if count else float("nan")
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(r["codes"].items()))
        print(f"{name:<12} {count:>8} {rate:>10,.0f} {_ms(r['lat'], 50):>8} {_ms(r['lat'], 99):>8} {cpu_ms:>10.2f}"
              f"  {codes}")
    d = results["deliveries"]
    per = d["cpu"].get("appliance", 0.0) / max(1, len(d["lat"]))
    print(f"\ncpu ms/op: the appliance process's CPU time per operation (user + system); one core of it "
          f"sustains about {1 / per:,.0f} deliveries/s" if per else "")
    print("deliveries: NIP-98 verified, event id burned, reservation committed (send-begin), one HTTP/2 "
          "request to the APNs emulator; target >= 1,000/s. Client, emulator and appliance share this "
          "machine: figures on a busy or small box are lower.")
