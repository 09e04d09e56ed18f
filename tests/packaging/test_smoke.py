"""The standalone executable, end to end: built from packaging/appliance.spec (or taken from
APPLIANCE_BINARY), started on a temporary data directory with push delivering to a local APNs
emulator, then: NIP-11, an event published and read back over websockets, the dashboard's setup
and login pages with the verified htmx, a lease and an event that wake a device through the
emulator, a backup and the doctor by the same binary, and SIGTERM; then `push try` and `emulator
apns` from the binary alone (no source tree, no Python on its PATH). Figures (size, cold start, idle RSS) go to
test-artifacts/smoke.json and are printed (`make smoke` shows them).

The Dockerfile's build and run steps are these same ones (`make dist`, then the binary with a data
directory and host 0.0.0.0); keep them in step.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import websockets

from appliance.admin import assets
from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret, public_key
from appliance.transports.apns import APNS_BODY
from tests.conftest import free_port
from tests.pg import on_postgres, process_env
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, jobs, token, wait_until

ROOT = Path(__file__).resolve().parents[2]
BINARY_ENV = "APPLIANCE_BINARY"
# Seconds a build may take on a small, busy machine (about 30 s of CPU; extraction and analysis I/O).
BUILD_TIMEOUT = 1200
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT + 300)]


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    """APPLIANCE_BINARY when given, else a fresh build (the one command of the README)."""
    given = os.environ.get(BINARY_ENV)
    if given:
        path = Path(given).resolve()
        assert path.is_file() and os.access(path, os.X_OK), f"{BINARY_ENV}={given} is not an executable file"
        return path
    # Both paths in the run's temporary directory: two suites in one checkout build apart.
    dist, work = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("pyinstaller")
    out = subprocess.run(
        [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN", "--distpath", str(dist),
         "--workpath", str(work), str(ROOT / "packaging" / "appliance.spec")],
        cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert out.returncode == 0, f"the build failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return dist / "appliance"


def _tree_rss_kib(pid: int) -> tuple[int, int]:
    """(RSS of `pid` and its descendants, RSS of the largest one) in KiB, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, largest, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            rss = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{p}/status").read_text()).group(1))
        except (OSError, AttributeError):
            rss = 0
        total += rss
        largest = max(largest, rss)
        todo += children.get(p, [])
    return total, largest


async def _publish_and_read(url: str) -> dict:
    secret = generate_secret()
    event = sign_event(secret, 1, [["t", "smoke"]], "hello from the standalone executable")
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps(["EVENT", event.to_dict()]))
        ok = None
        while ok is None:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if msg[0] == "OK" and msg[1] == event.id:
                ok = msg
        assert ok[2] is True, ok
        await ws.send(json.dumps(["REQ", "s", {"authors": [public_key(secret)]}]))
        got = []
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if msg[0] == "EVENT" and msg[1] == "s":
                got.append(msg[2])
            elif msg[0] == "EOSE":
                break
    assert [e["id"] for e in got] == [event.id]
    return got[0]


class _Running:
    """What the test helpers need of a server: its URLs and data directory."""

    def __init__(self, port: int, data_dir: Path):
        self.port, self.data_dir = port, data_dir
        self.url, self.http = f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{port}"

    def nip11(self, host: str | None = None) -> dict:
        r = httpx.get(self.http + "/", headers={"Accept": "application/nostr+json"}, timeout=10)
        r.raise_for_status()
        return r.json()


async def _wake(server: _Running, apns: Apns) -> dict:
    """A lease, then an event for its author: one wake reaches the emulator and is delivered."""
    alice, bob = await Pusher.connect(server), await Pusher.connect(server)
    try:
        tok = token()
        await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
        ev = await alice.publish(9, [["p", bob.pubkey]])
        await asyncio.to_thread(apns.emulator.wait_for, lambda recs: any(r.token == tok for r in recs), 30)
        (rec,) = apns.emulator.requests(tok)
        (job,) = jobs(server, event_id=ev.id)
        assert rec.status == 200 and rec.body == APNS_BODY and rec.header("apns-id") == job["id"]
        await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered", timeout=30)
        return job
    finally:
        await alice.client.close()
        await bob.client.close()


@pytest.fixture
def apns(tmp_path):
    (tmp_path / "apns").mkdir()
    a = Apns(tmp_path / "apns").start()
    yield a
    a.stop()


def test_the_executable_serves_end_to_end(binary, tmp_path, apns):
    figures: dict = {"binary": str(binary), "size_bytes": binary.stat().st_size}
    env = process_env()
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert version.returncode == 0, version.stderr
    assert re.fullmatch(r"appliance \d+\.\d+\.\d+ \(git [0-9a-f]{7,40}(-dirty)?\)", version.stdout.strip()), version.stdout
    figures["version"] = version.stdout.strip()

    data, port = tmp_path / "data", free_port()
    env = process_env(data_dir=data)  # the suite's backend (a database of its own on PostgreSQL)
    config = tmp_path / "appliance.toml"
    config.write_text(delivery_config(apns))
    log = tmp_path / "serve.log"
    started = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(binary), "serve", "--data-dir", str(data), "--port", str(port),
                                 "--config", str(config)], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        # Cold start: a new process and data directory until NIP-11 answers.
        deadline = started + 120
        nip11 = None
        while nip11 is None:
            assert proc.poll() is None, f"the executable exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no answer within 120 s:\n{log.read_text()}"
            try:
                r = httpx.get(base + "/", headers={"Accept": "application/nostr+json"}, timeout=1)
                if r.status_code == 200:
                    nip11 = r.json()
            except httpx.HTTPError:
                time.sleep(0.02)
        figures["cold_start_seconds"] = round(time.monotonic() - started, 3)
        assert nip11["software"] == "appliance" and 11 in nip11["supported_nips"] and 1 in nip11["supported_nips"]
        assert "nip-pl" in nip11["supported_extensions"] and nip11["push"]["keys"]

        event = asyncio.run(_publish_and_read(f"ws://127.0.0.1:{port}"))
        assert event["content"] == "hello from the standalone executable"

        # The dashboard: the one-time setup link of the banner, the login page, htmx (verified).
        banner = log.read_text()
        setup = re.search(r"admin  http://\S+?(/admin/setup\?token=\S+)", banner)  # (the public URL's host)
        assert setup, banner
        page = httpx.get(base + setup.group(1), timeout=10)
        assert page.status_code == 200 and "<form" in page.text and 'name="password"' in page.text
        login = httpx.get(base + "/admin/login", timeout=10)
        assert login.status_code == 200 and "<title>Sign in" in login.text
        assert 'action="/admin/login"' in login.text and 'name="password"' in login.text
        htmx = httpx.get(base + "/admin/static/htmx.min.js", timeout=10)
        assert htmx.status_code == 200
        assert "sha384-" + base64.b64encode(hashlib.sha384(htmx.content).digest()).decode() == assets.HTMX.sri
        health = httpx.get(base + "/admin/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok"

        # A wake through the APNs emulator (the lease is checked by a spawned worker process: the
        # binary runs itself again for it).
        asyncio.run(_wake(_Running(port, data), apns))

        # The same binary's operations commands, beside the running server.
        backup = subprocess.run([str(binary), "backup", f"{tmp_path / 'bk'}/", "--data-dir", str(data)],
                                capture_output=True, text=True, env=env, timeout=120)
        if on_postgres():  # backed up by PostgreSQL's own tools: the command says how, and writes nothing
            assert backup.returncode == 2 and "pg_dump --format=custom" in backup.stderr, backup.stderr
            assert not (tmp_path / "bk").exists()
        else:
            assert backup.returncode == 0, backup.stderr
            assert (tmp_path / "bk" / "appliance.sqlite3").is_file() and (tmp_path / "bk" / "appliance.key").is_file()
        # (The suite's PostgreSQL cluster runs without fsync, which sync_mode "full" rightly fails:
        # test_doctor_postgres checks that; here the doctor is asked about "normal".)
        durability = ["--sync-mode", "normal"] if on_postgres() else []
        doctor = subprocess.run([str(binary), "doctor", "--data-dir", str(data), "--port", str(port),
                                 "--config", str(config), *durability],
                                capture_output=True, text=True, env=env, timeout=120)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr

        time.sleep(2)  # idle: nothing in flight
        total, largest = _tree_rss_kib(proc.pid)
        figures["idle_rss_kib"] = total
        figures["idle_rss_server_process_kib"] = largest

        proc.send_signal(signal.SIGTERM)
        # A graceful stop ends by the signal itself (uvicorn re-raises it once shut down).
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM), log.read_text()
        assert "Application shutdown complete" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "smoke.json").write_text(json.dumps(figures, indent=2) + "\n")
    print("\nstandalone executable:", json.dumps(figures, indent=2))


def _bare_env(tmp_path: Path) -> dict:
    """No source tree and no Python for the executable to lean on: no PYTHONPATH, no venv, a PATH
    without the test's Python, and no APPLIANCE_* of the suite's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("APPLIANCE_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/bin:/bin"
    env["HOME"] = str(tmp_path)
    return env


def test_the_executable_runs_push_try_alone(binary, tmp_path):
    """`dist/appliance push try` from an empty directory: its own appliance (the binary run again)
    and its own APNs emulator, every step printed, exit 0."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = subprocess.run([str(binary), "push", "try"], capture_output=True, text=True, cwd=work,
                         env=_bare_env(tmp_path), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for step in ("[1/7] APNs emulator listening", "[2/7] appliance serving", "[3/7] lease accepted: OK true",
                 "[4/7] event stored: OK true", "[5/7] wake job", "[6/7] APNs request",
                 f"      body {APNS_BODY.decode()}", "[7/7] delivery log: attempt 1 accepted (status 200)"):
        assert step in out.stdout, out.stdout
    assert list(work.iterdir()) == []  # nothing left behind where it ran


def test_the_executable_runs_the_apns_emulator(binary, tmp_path):
    """`dist/appliance emulator apns`: its profile settings, its .p8 and certificate in --dir."""
    apns_dir = tmp_path / "apns"
    proc = subprocess.Popen([str(binary), "emulator", "apns", "--listen", "127.0.0.1:0", "--dir", str(apns_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env=_bare_env(tmp_path))
    lines = []
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("environment = ") for line in lines):
            assert time.monotonic() < deadline, lines
            line = proc.stdout.readline()
            assert line, f"the emulator exited: {lines}"
            lines.append(line.rstrip("\n"))
        found = dict(line.split(" = ", 1) for line in lines if " = " in line)
        assert {"apns_url", "ca_file", "team_id", "key_id", "key_file", "environment"} <= set(found), lines
        key_file = Path(json.loads(found["key_file"]))
        assert key_file.parent == apns_dir and key_file.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
        assert Path(json.loads(found["ca_file"])).is_file()
        port = int(json.loads(found["apns_url"]).rsplit(":", 1)[1])
        import socket
        import ssl

        ctx = ssl.create_default_context(cafile=json.loads(found["ca_file"]))
        ctx.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.selected_alpn_protocol() == "h2"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()
