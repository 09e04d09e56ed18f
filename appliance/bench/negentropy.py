"""`appliance bench negentropy`: NIP-77 reconciliation against strfry, both ways round.

Two stores of --events events each that differ by --diff of them (each holds that many the other
lacks; 100,000 and 1% by default: 99,000 shared, 1,000 on each side only) are reconciled, ids only
(no events copied), in both roles:

- the appliance serves and `strfry sync URL --dir none` asks it (the appliance's CPU: its server
  process's, the NEG-OPEN's read of its records included);
- `appliance sync URL --dir none` asks strfry (the appliance's CPU: what that command reports for
  reading its records and reconciling, and its whole process's, Python's start included).

Each is run --runs times; the medians are printed, with the session's record memory (40 bytes a
record) and the load average. Needs a strfry binary: --strfry or STRFRY_BIN.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from appliance.bench.harness import appliance_command, appliance_process, cpu_seconds, free_port, info, rss_mb


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=100_000, help="events in each store (default 100000)")
    p.add_argument("--diff", type=float, default=0.01,
                   help="fraction of each store the other lacks (default 0.01: 1%% on each side)")
    p.add_argument("--runs", type=int, default=3, help="reconciliations per role (default 3; medians printed)")
    p.add_argument("--strfry", default=os.environ.get("STRFRY_BIN", ""), metavar="PATH",
                   help="the strfry binary (default $STRFRY_BIN)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="processes signing events")
    p.add_argument("--data-dir", default=None, help="keep the stores here (reused when already filled)")


def _sign(task: tuple[str, int, int, int, str, int]) -> list[str]:
    from appliance.nostr.event import sign_event

    secret, start, stop, now, label, total = task
    # Spread over the last month whatever their number (100,000: one every 25 s; a million: 2-3 a
    # second, many sharing one).
    return [sign_event(secret, 1, [], f"{label} {i}", now - 2_600_000 + (i * 2_500_000) // total).to_json()
            for i in range(start, stop)]


def _events(n: int, label: str, workers: int) -> list[str]:
    from appliance.nostr.keys import generate_secret

    secret = generate_secret()
    now = int(time.time())
    step = 5000
    tasks = [(secret, a, min(a + step, n), now, label, max(n, 1)) for a in range(0, n, step)]
    with ProcessPoolExecutor(max(1, workers)) as pool:
        return [e for chunk in pool.map(_sign, tasks) for e in chunk]


async def _fill_appliance(url: str, lines: list[str]) -> None:
    """Publish the events to the appliance (benches serve with no rate limits), 4 connections with
    500 EVENTs awaiting their OK each."""
    import orjson

    from appliance.bench.harness import NostrClient

    clients = [await NostrClient.connect(url) for _ in range(4)]

    async def one(client, chunk: list[str]) -> None:
        for i in range(0, len(chunk), 500):
            window = chunk[i:i + 500]
            outcomes = await asyncio.gather(*(client.publish(line, orjson.loads(line)["id"]) for line in window))
            refused = [m for ok, m in outcomes if not ok]
            if refused:
                raise RuntimeError(f"the appliance refused {len(refused)} events: {refused[0]}")

    quarter = (len(lines) + 3) // 4
    try:
        await asyncio.gather(*(one(c, lines[k * quarter:(k + 1) * quarter]) for k, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.close()


def _strfry_config(workdir: Path, port: int) -> Path:
    (workdir / "strfry-db").mkdir(parents=True, exist_ok=True)
    config = workdir / "strfry.conf"
    config.write_text(f'db = "{workdir / "strfry-db"}/"\nrelay {{\n    bind = "127.0.0.1"\n    port = {port}\n'
                      "    nofiles = 0\n}\n")
    return config


def run(args: argparse.Namespace) -> int:
    strfry = args.strfry
    if not strfry or not os.access(strfry, os.X_OK):
        print("appliance bench negentropy: needs a strfry binary: --strfry PATH or STRFRY_BIN", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.data_dir:
            workdir = Path(args.data_dir)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-negentropy-")))
        return _run(args, strfry, workdir)


def _run(args, strfry: str, workdir: Path) -> int:
    n = args.events
    only = round(n * args.diff)
    data_dir = workdir / "appliance"
    strfry_port = free_port()
    config = _strfry_config(workdir, strfry_port)
    filled = workdir / "filled"
    version = subprocess.run([strfry, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    port = free_port()
    server = appliance_process(data_dir, port, workdir / "appliance.log", "normal", [])
    strfry_proc = None
    try:
        server.start()
        if not filled.exists():
            info(f"negentropy: signing {n + only} events ...")
            t0 = time.monotonic()
            common = _events(n - only, "shared", args.workers)
            ours = _events(only, "appliance", args.workers)
            theirs = _events(only, "strfry", args.workers)
            info(f"negentropy: signed in {time.monotonic() - t0:.1f} s; filling strfry ...")
            out = subprocess.run([strfry, f"--config={config}", "import"],
                                 input="\n".join(common + theirs) + "\n", capture_output=True, text=True)
            if out.returncode != 0:
                print(f"appliance bench negentropy: strfry import failed: {out.stderr[-500:]}", file=sys.stderr)
                return 1
            info("negentropy: filling the appliance ...")
            asyncio.run(_fill_appliance(server.url, common + ours))
            filled.write_text(f"{n} {only}\n")
        strfry_proc = subprocess.Popen([strfry, f"--config={config}", "relay"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        _wait_port(strfry_port)
        served = []
        for _ in range(args.runs):
            pid = server.proc.pid
            base = rss_mb(pid)
            before = cpu_seconds(pid)
            t0 = time.monotonic()
            syncing = subprocess.Popen([strfry, f"--config={config}", "sync", server.url, "--dir", "none"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            peak = base
            while syncing.poll() is None:  # the server's resident memory while the session is open
                peak = max(peak, rss_mb(pid))
                time.sleep(0.01)
            wall = time.monotonic() - t0
            spent = cpu_seconds(pid) - before
            out = subprocess.CompletedProcess(syncing.args, syncing.returncode, *syncing.communicate())
            found = re.search(r"Set reconcile complete\. Have (\d+) need (\d+)", out.stderr)
            if out.returncode != 0 or not found:
                print(f"appliance bench negentropy: strfry sync failed: {out.stderr[-800:]}", file=sys.stderr)
                return 1
            served.append((spent, wall, int(found[1]), int(found[2]), peak - base))
        asked = [_appliance_sync(data_dir, f"ws://127.0.0.1:{strfry_port}") for _ in range(args.runs)]
    finally:
        server.stop()
        if strfry_proc is not None:
            strfry_proc.terminate()
            strfry_proc.wait()

    load = os.getloadavg()
    print(f"negentropy: {n} events in each store, {only} in each that the other lacks "
          f"({version[0] if version else 'strfry ?'}); medians of {args.runs} runs; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    cpu, wall = statistics.median(s[0] for s in served), statistics.median(s[1] for s in served)
    grew = statistics.median(s[4] for s in served)
    print(f"  appliance serving, strfry sync --dir none: appliance CPU {cpu:.2f} s, wall {wall:.2f} s, its resident "
          f"memory up {grew:.1f} MB at most (strfry: have {served[0][2]}, need {served[0][3]})")
    cpu, wall = statistics.median(a[0] for a in asked), statistics.median(a[1] for a in asked)
    whole = statistics.median(a[2] for a in asked)
    print(f"  appliance sync --dir none against strfry: appliance CPU {cpu:.2f} s, wall {wall:.2f} s for the "
          f"reconciliation (the whole command, Python's start included: CPU {whole:.2f} s); {asked[0][3]}")
    print(f"  a session's records: {n} x 40 bytes = {n * 40 / 1e6:.1f} MB")
    return 0


def _appliance_sync(data_dir: Path, url: str) -> tuple[float, float, float, str]:
    """One `appliance sync URL --dir none`: (its reconciliation's CPU and wall seconds as it
    reports them, the whole process's CPU seconds, its summary line)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([*appliance_command(), "sync", url, "--dir", "none", "--data-dir", str(data_dir)],
                         capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = re.search(r"reconciled \d+ records in \d+ round\(s\): ([\d.]+) s, CPU ([\d.]+) s", out.stderr)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"appliance sync failed: {out.stderr[-800:]}")
    whole = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return float(found[2]), float(found[1]), whole, out.stdout.strip().splitlines()[-1]


def _wait_port(port: int, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")
