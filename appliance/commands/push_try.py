"""`appliance push try`: push end to end in a few seconds, on a temporary data directory.

It starts an APNs emulator (as `appliance emulator apns` does) and an appliance (this same program,
`serve --port 0`, on a temporary data directory: never the operator's, whatever the environment
or config says), configures an app profile pointing at the emulator, then plays a device and a
sender: a lease (kind 30350, made as `appliance push make-lease` makes it), an event tagging the
device, and shows each step as it happens: the lease accepted, the event stored, the wake job, the
APNs request with its constant body, the delivery-log row. Then it stops both and removes the
directory (`--keep` leaves it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from appliance.errors import ApplianceError

PROFILE = "com.example.demo/ios"
TOPIC = "com.example.demo"
DEMO_KIND = 9
# Seconds each step may take on a small, busy machine before the demo gives up.
STEP_TIMEOUT = 60.0


class TryFailed(ApplianceError):
    """A step of the demo did not happen."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "try", help="A two-minute push demo: appliance + APNs emulator on a temporary data dir.",
        description="Start an APNs emulator and an appliance on a temporary data directory (never yours), make "
        "an app profile, a device lease and an event that matches it, and print each step as it happens: the "
        "lease accepted, the event stored, the wake job, the APNs request with its constant body, the "
        "delivery-log row. Then stop both. Exit 0 when the wake arrived.")
    p.add_argument("--keep", action="store_true",
                   help="Keep the temporary directory (data, config, logs, emulator files) and print where.")


def _self_command() -> list[str]:
    """This program: the standalone executable itself, or `python -m appliance`."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "appliance"]


class _EmulatorThread:
    """The APNs emulator on a loop of its own thread (the demo's main thread drives the client)."""

    def __init__(self, directory: Path):
        from appliance.commands.emulator import Emulator

        self.emu = Emulator(directory)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="apns-emulator", daemon=True)

    def start(self) -> "_EmulatorThread":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.emu.start("127.0.0.1", 0), self.loop).result(STEP_TIMEOUT)
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self.emu.stop(), self.loop).result(10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(10)
        self.loop.close()


def _say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def _wait(what: str, probe, timeout: float = STEP_TIMEOUT, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TryFailed(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(interval)


def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="appliance-push-try-"))
    print(f"appliance push try: push end to end on a temporary data directory ({work}); nothing of yours is "
          "touched", flush=True)
    emulator: _EmulatorThread | None = None
    server: subprocess.Popen | None = None
    log_path = work / "serve.log"
    try:
        emulator = _EmulatorThread(work / "apns").start()
        emu = emulator.emu
        emu.api.keep_records = True
        _say("1/7", f"APNs emulator listening on {emu.url} (what `appliance emulator apns` runs)")
        server, running = _start_appliance(work, emu, log_path)
        _demo(work, emu, running)
        return 0
    except (TryFailed, ApplianceError, OSError) as exc:
        print(f"appliance push try: FAILED: {exc}", file=sys.stderr, flush=True)
        if log_path.exists():
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            if tail:
                print("the appliance's last log lines:\n  " + "\n  ".join(tail), file=sys.stderr, flush=True)
        return 1
    finally:
        stopped = []
        if server is not None:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            stopped.append("the appliance")
        if emulator is not None:
            emulator.stop()
            stopped.append("the APNs emulator")
        if args.keep:
            where = f"kept {work} (data/, appliance.toml, serve.log, apns/)"
        else:
            shutil.rmtree(work, ignore_errors=True)
            where = f"removed {work}"
        print(f"stopped {' and '.join(stopped) or 'nothing'}; {where}", flush=True)


def _start_appliance(work: Path, emu, log_path: Path) -> tuple[subprocess.Popen, dict]:
    from appliance.store.instance import read_instance

    data = work / "data"
    profile = {"id": PROFILE, "transport": "apns", "topic": TOPIC}
    profile.update({line.split(" = ", 1)[0]: json.loads(line.split(" = ", 1)[1]) for line in emu.lines()})
    inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in profile.items())
    config = work / "appliance.toml"
    config.write_text(
        "# written by `appliance push try`\n"
        "wake_min_interval = 0\n"
        "lease_workers = 0\n"
        "[push]\n"
        f"app_profiles = [{{ {inline} }}]\n"
        f"push_kinds = [{DEMO_KIND}]\n")
    # Only what is given here: no APPLIANCE_* variable (a data dir, a database, a config) of the operator's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    cmd = [*_self_command(), "serve", "--data-dir", str(data), "--host", "127.0.0.1", "--port", "0",
           "--storage", "sqlite", "--config", str(config), "--log-level", "warning", "--admin-listen", "off"]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  cwd=work)

    def ready():
        if server.poll() is not None:
            raise TryFailed(f"the appliance exited (code {server.returncode})")
        info = read_instance(data) if data.exists() else None
        if not info:
            return None
        from appliance.commands.push import fetch_nip11

        try:
            doc = fetch_nip11(info["relay_url"], info["listen"][0])
        except Exception:  # noqa: BLE001 - not answering yet
            return None
        return info if "push" in doc else None

    running = _wait("the appliance's start", ready)
    _say("2/7", f"appliance serving {running['relay_url']} (pid {running['pid']}, data in {data}); app profile "
         f"{PROFILE} delivers to the emulator ({config.name})")
    return server, running


def _demo(work: Path, emu, running: dict) -> None:
    from appliance.commands.emulator import token_fingerprint
    from appliance.commands.push import RelayClient, find_descriptor, make_lease
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import generate_secret, public_key
    from appliance.settings import load
    from appliance.store.backend import store_for
    from appliance.store import wakes

    settings = load(flags={"data_dir": str(work / "data"), "storage": "sqlite"}, environ={})
    device, sender = generate_secret(), generate_secret()
    device_pk = public_key(device)
    token = secrets.token_hex(32)  # a made-up APNs device token
    desc = find_descriptor(settings, running["relay_url"], running)
    lease, plaintext = make_lease(device, desc, profile_id=PROFILE, token=token, kinds=[DEMO_KIND])
    address = running["listen"][0]

    async def publish(secret: str, event: dict) -> tuple[bool, str]:
        async with RelayClient(desc.origin, address) as relay:
            await relay.auth(secret)
            return await relay.publish(event)

    ok, message = asyncio.run(publish(device, lease))
    if not ok:
        raise TryFailed(f"the lease was refused: {message}")
    key_id = next(t[1] for t in lease["tags"] if t[0] == "exec")
    _say("3/7", f"lease accepted: OK true for kind 30350 {lease['id'][:16]}... (device pubkey {device_pk[:12]}…, token "
         f"{token_fingerprint(token)}, wakes on kind {DEMO_KIND} tagging the device, NIP-44 encrypted to executor "
         f"key {key_id})")
    event = sign_event(sender, DEMO_KIND, [["p", device_pk]], "hello from appliance push try").to_dict()
    ok, message = asyncio.run(publish(sender, event))
    if not ok:
        raise TryFailed(f"the event was refused: {message}")
    _say("4/7", f"event stored: OK true for kind {DEMO_KIND} {event['id'][:16]}... tagging the device")
    with store_for(settings) as store:
        job = _wait("the wake job", lambda: next(
            (j for j in store.read_sync(lambda conn: wakes.list_jobs(conn, limit=20)) if j.event_id == event["id"]),
            None))
        _say("5/7", f"wake job {job.id} for app profile {job.app_profile}, class {job.cls} (written in the "
             "event's own transaction)")
        records = _wait("the APNs request", lambda: [r for r in emu.api.requests() if r.apns_id == job.id])
        record = records[0]
        answered = f"{record.status}" + (f" {record.reason}" if record.reason else "")
        _say("6/7", f"APNs request: POST /3/device/<token {token_fingerprint(record.token)}> apns-id={record.apns_id} "
             f"topic={record.header('apns-topic')} push-type={record.header('apns-push-type')} "
             f"priority={record.header('apns-priority')} body={len(record.body)} bytes; the emulator answered "
             f"{answered}")
        print(f"      body {record.body.decode()}", flush=True)
        row = _wait("the delivery-log row", lambda: next(
            iter(store.read_sync(lambda conn: wakes.delivery_log(conn, job_id=job.id, limit=1))), None))
        latency = f" in {row['latency_ms']:.0f} ms" if row.get("latency_ms") is not None else ""
        _say("7/7", f"delivery log: attempt {row['attempt']} {row['outcome']} (status {row['status']}){latency}, "
             f"lease {row['lease']}, profile {row['app_profile']}")
    if record.status != 200 or row["outcome"] != "accepted":
        raise TryFailed(f"the wake was not accepted: {record.status} {record.reason}")
