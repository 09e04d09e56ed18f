"""`appliance bench slow-readers`: connections that ask for large answers and never read them.

30 connections each send 24 REQs answered with about 8 MB (max_query_bytes) and read nothing,
while a bystander times small REQs. Printed: the relay's resident memory before, at its peak
(sampled every 20 ms) and after; whether it is alive; the slow connections it dropped; the
bystander's p50/p99; the relay's own peak of unread output (its metrics). The targets:
peak RSS < 400 MB, alive, bystander p99 < 50 ms.

Set APPLIANCE_BENCH_SOURCE=/path/to/another/checkout to run that checkout's appliance (before/after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

from appliance.bench.harness import appliance_process, free_port, info, percentile, rss_mb

TOKEN = "bench-slow-readers"
PEAK_TARGET_MB = 400
P99_TARGET_MS = 50


def _masked_frames(texts: list[str]) -> bytes:
    mask = b"\x5a\x17\xc3\x09"
    out = b""
    for text in texts:
        data = text.encode()
        n = len(data)
        header = b"\x81" + (bytes([0x80 | n]) if n < 126 else b"\xfe" + n.to_bytes(2, "big"))
        out += header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return out


def never_reading(port: int, requests: list[str]) -> socket.socket:
    """A websocket connection (small receive buffer) that sends `requests`, then reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        piece = sock.recv(1)
        if not piece:
            raise ConnectionError("closed during the handshake")
        head += piece
    sock.sendall(_masked_frames(requests))
    return sock


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 0.02):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak = pid, every, 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            value = rss_mb(self.pid)
            if value == value:
                self.peak = max(self.peak, value)
            time.sleep(self.every)


def _threads(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((line.split()[1] for line in fh if line.startswith("Threads:")), "?")
    except OSError:
        return "?"


def _metric(port: int, name: str) -> float:
    import httpx

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/admin/metrics", headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=10).text
    except Exception:
        return float("nan")
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


async def _publish(url: str, events: list[dict]) -> None:
    import websockets

    async with websockets.connect(url, max_size=None, compression=None) as ws:
        for i in range(0, len(events), 200):
            batch = events[i:i + 200]
            for ev in batch:
                await ws.send(json.dumps(["EVENT", ev]))  # (about 60 KB: under max_message_length)
            left = len(batch)
            while left:
                msg = json.loads(await ws.recv())
                if msg[0] == "OK":
                    left -= 1


async def _bystander(url: str, stop: asyncio.Event, lat: list[float]) -> None:
    import websockets

    async with websockets.connect(url, max_size=None, compression=None) as ws:
        i = 0
        while not stop.is_set():
            i += 1
            sub = f"b{i}"
            t0 = time.perf_counter()
            await ws.send(json.dumps(["REQ", sub, {"kinds": [1], "limit": 5}]))
            async with asyncio.timeout(60):
                while True:
                    msg = json.loads(await ws.recv())
                    if msg[0] in ("EOSE", "CLOSED") and msg[1] == sub:
                        break
            lat.append(time.perf_counter() - t0)
            await ws.send(json.dumps(["CLOSE", sub]))
            await asyncio.sleep(0.02)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connections", type=int, default=30, metavar="C", help="never-reading connections (default 30)")
    p.add_argument("--reqs", type=int, default=24, metavar="R", help="large REQs each sends (default 24)")
    p.add_argument("--events", type=int, default=200, metavar="N",
                   help="stored events of about 60 KB (default 200: a REQ for all of them is about 12 MB, "
                        "answered with max_query_bytes, 8 MiB)")
    p.add_argument("--seconds", type=float, default=20.0, metavar="S",
                   help="how long the slow connections stay open (default 20)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `appliance serve` (repeatable)")


def run(args: argparse.Namespace) -> int:
    from appliance.bench.relay import load_average
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import generate_secret

    work = Path(tempfile.mkdtemp(prefix="appliance-bench-slow-"))
    load_start = load_average()
    port = free_port()
    relay = appliance_process(work / "data", port, work / "appliance.log", "normal",
                              ["--metrics-token", TOKEN, "--log-level", "info", *args.server_arg])
    try:
        secret = generate_secret()
        now = int(time.time())
        info(f"signing {args.events:,} events of about 60 KB")
        events = [sign_event(secret, 1, [["t", "slow"]], f"{i} " + "x" * 60_000, created_at=now - i).to_dict()
                  for i in range(args.events)]
        relay.start()
        asyncio.run(_publish(relay.url, events))
        time.sleep(1.0)
        pid = relay.proc.pid
        before = rss_mb(pid)
        sampler = RssSampler(pid)
        sampler.start()
        big = [json.dumps(["REQ", f"big{i}", {"kinds": [1], "#t": ["slow"], "limit": 500}]) for i in range(args.reqs)]
        lat: list[float] = []

        async def scenario() -> int:
            stop = asyncio.Event()
            by = asyncio.create_task(_bystander(relay.url, stop, lat))
            await asyncio.sleep(0.5)
            socks = []
            for _ in range(args.connections):
                try:
                    socks.append(await asyncio.to_thread(never_reading, port, big))
                except OSError as exc:
                    info(f"a slow connection could not open: {exc}")
            info(f"{len(socks)} slow connections open")
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                await asyncio.sleep(min(2.0, max(0.0, end - time.monotonic())))
                queued = await asyncio.to_thread(_metric, port, "appliance_output_queued_bytes")
                info(f"unread output {queued / 2**20:,.1f} MiB, RSS now {rss_mb(pid):,.0f} MB, peak so far "
                     f"{sampler.peak:,.0f} MB, {_threads(pid)} threads")
            if os.environ.get("SLOW_READERS_SMAPS"):
                with open(f"/proc/{pid}/smaps") as fh, open(os.environ["SLOW_READERS_SMAPS"], "w") as out:
                    out.write(fh.read())
            for sock in socks:
                sock.close()
            await asyncio.sleep(3.0)
            stop.set()
            try:
                await by
            except Exception as exc:
                info(f"the bystander failed: {exc!r}")
            return len(socks)

        info(f"{args.connections} connections x {args.reqs} REQs of about 8 MB, never read, for {args.seconds:g} s")
        opened = asyncio.run(scenario())
        sampler.stop.set()
        sampler.join()
        alive = relay.proc.poll() is None
        after = rss_mb(pid) if alive else float("nan")
        output_peak = _metric(port, "appliance_output_queued_bytes_peak") if alive else float("nan")
    finally:
        relay.stop()
    log = (work / "appliance.log").read_text(errors="replace")
    drops = log.count("dropping slow connection")
    shutil.rmtree(work, ignore_errors=True)
    p50, p99 = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000
    print(f"\nappliance bench slow-readers: {opened} connections x {args.reqs} REQs of ~8 MB never read, "
          f"{args.events:,} stored events; load average {load_start} at the start, {load_average()} at the end")
    print(f"relay RSS: {before:,.0f} MB before, {sampler.peak:,.0f} MB peak, {after:,.0f} MB after "
          f"(target: peak < {PEAK_TARGET_MB} MB: {'yes' if sampler.peak < PEAK_TARGET_MB else 'NO'})")
    print(f"relay alive: {'yes' if alive else 'NO'}; slow connections dropped: {drops}; "
          f"relay's peak of unread output: {output_peak / 2**20:,.1f} MiB")
    print(f"bystander REQ (limit 5), {len(lat)} REQs: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
          f"(target: p99 < {P99_TARGET_MS} ms: {'yes' if p99 < P99_TARGET_MS else 'NO'})")
    return 0 if alive else 1
