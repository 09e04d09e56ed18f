"""What the benchmarks share: free ports, percentiles, progress lines, relay processes on a
temporary data directory (`appliance serve` as a subprocess) and figures of a process from /proc."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson

from appliance.store.sqlite import DB_FILENAME


# -- numbers and messages ------------------------------------------------------------------


# Under pytest-xdist (PYTEST_XDIST_WORKER=gwN) each worker hands out ports from a block of its own,
# below the kernel's ephemeral range: with port 0 a port one worker was just given (and has not
# bound yet) can be the next one the kernel gives another worker. A random start keeps two runs of
# the suite on one machine apart too; every port is still checked free by binding it.
_PORT_BLOCK = 400
_PORT_BASE = 20000
_next_port: int | None = None


def free_port() -> int:
    """A loopback TCP port free at the time of the call."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    low = _PORT_BASE + int(worker[2:]) % 30 * _PORT_BLOCK
    if _next_port is None:
        _next_port = int.from_bytes(os.urandom(2), "big") % _PORT_BLOCK
    for _ in range(_PORT_BLOCK):
        port = low + _next_port
        _next_port = (_next_port + 1) % _PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {low}..{low + _PORT_BLOCK - 1}")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- relay processes ---------------------------------------------------------------------------


class RelayProcess:
    """A relay subprocess on a loopback port, with its output in a log file."""

    def __init__(self, name: str, args: list[str], port: int, log_path: Path, cwd: Path | None = None,
                 env: dict | None = None):
        self.name = name
        self.args = args
        self.port = port
        self.log_path = log_path
        self.cwd = cwd
        self.env = env or {}  # added to the process's environment (a secret stays out of its argv)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> "RelayProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        env.update(self.env)
        self._close_log()
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

    def kill(self) -> None:
        """SIGKILL: no shutdown work at all, as a crash or the OOM killer would end it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()


def appliance_command() -> list[str]:
    """How to run this program again: the standalone executable is itself; else `python -m appliance`."""
    return [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "appliance"]


# The --log-level of the appliances benches start: warnings and errors only, so logging costs the
# measured process nothing (an argument in `extra`, such as --server-arg=--log-level=info, wins).
# The test suite raises it, so its check for secrets in logs reads what info lines say too.
LOG_LEVEL = "warning"
# Every log file an appliance started here wrote to (the test suite checks them for secrets).
APPLIANCE_LOGS: list[Path] = []


def appliance_process(data_dir: Path, port: int, log_path: Path, sync_mode: str, extra: list[str],
                      storage: str = "sqlite") -> RelayProcess:
    args = [*appliance_command(), "serve", "--data-dir", str(data_dir), "--port", str(port),
            "--event-rate", "0", "--req-rate", "0", "--log-level", LOG_LEVEL, "--sync-mode", sync_mode, *extra]
    APPLIANCE_LOGS.append(log_path)
    env = {"APPLIANCE_STORAGE": storage}
    source = os.environ.get("APPLIANCE_BENCH_SOURCE")
    if source:  # another checkout's appliance (a before/after comparison on the same machine)
        env["PYTHONPATH"] = source
    return RelayProcess("appliance", args, port, log_path, env=env, cwd=Path(source) if source else None)


def database_cpu_seconds(storage: str) -> float:
    """CPU time the PostgreSQL server processes serving `storage`'s database have used so far (its
    backends on this machine: a remote server's are not seen); 0.0 for SQLite (its work is the
    appliance's own)."""
    from appliance.store.dsn import is_postgres

    if not is_postgres(storage):
        return 0.0
    from appliance.store.postgres import backend_pids

    pids = backend_pids(storage)
    total = 0.0
    for pid in pids:
        c = cpu_seconds(pid)
        if c == c:  # not NaN
            total += c
    return total


# -- a process's resources (Linux /proc) ------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used so far (every thread, user and system, from schedstat in ns),
    its live child processes' included (the relay's signature worker): a figure a busy machine
    inflates far less than wall-clock latency (it still does, through caches and cores). NaN when
    the process is gone or /proc is not there."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return float("nan")
    children: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                children.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    for child in children:
        spent = cpu_seconds(child)
        if spent == spent:  # (a child that just ended: NaN)
            total += int(spent * 1e9)
    return total / 1e9


def rss_mb(pid: int) -> float:
    """The process's resident memory (VmRSS) less the pages of the SQLite database it maps (the
    OS page cache's, shared and reclaimable: see appliance.store.sqlite.WRITER_MMAP_BYTES), in MB."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            rss = next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), None)
    except OSError:
        rss = None
    if rss is None:
        return float("nan")
    return (rss - _mapped_kib(pid, DB_FILENAME)) / 1024


_SMAPS_HEADER = re.compile(r"[0-9a-f]+-[0-9a-f]+ ").match


def _mapped_kib(pid: int, filename: str) -> int:
    """Resident KiB of the process's mappings of files named `filename` (0 when unreadable)."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as fh:
            for line in fh:
                if _SMAPS_HEADER(line):  # a mapping's first line: range perms offset dev inode [path]
                    parts = line.split()
                    inside = len(parts) >= 6 and parts[5].endswith("/" + filename)
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1])
    except OSError:
        return 0
    return total


def open_files(pid: int) -> int:
    """File descriptors the process holds open (sockets, the database and its WAL, logs); -1 when gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def dir_mb(path: Path) -> float:
    """Bytes under `path` (the data directory: database, WAL, keys), in MB."""
    total = 0
    for p in Path(path).rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass  # a file that just went (a WAL checkpointed away)
    return total / 1e6


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {name or name{labels}: value} (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


# -- a Nostr client for load generators ---------------------------------------------------------


class NostrClient:
    """One websocket with a reader task: `publish` waits for the event's OK, `req` for EOSE, and
    live subscriptions call a function per EVENT. A connection that drops sets `closed` (with
    the reason), which the load generators count as an error."""

    def __init__(self, ws):

        self.ws = ws
        self.challenge: str | None = None
        self._oks: dict[str, "asyncio.Future"] = {}
        self._subs: dict[str, object] = {}
        self._challenge = asyncio.get_running_loop().create_future()
        self.closed: str | None = None
        self.notices: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, timeout: float = 30) -> "NostrClient":
        import websockets

        ws = await websockets.connect(url, max_size=None, compression=None, ping_interval=None, open_timeout=timeout)
        client = cls(ws)
        client.challenge = await asyncio.wait_for(client._challenge, timeout)
        return client

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = orjson.loads(raw)
                kind = msg[0]
                if kind == "OK":
                    fut = self._oks.pop(msg[1], None)
                    if fut is not None and not fut.done():
                        fut.set_result((msg[2], msg[3]))
                elif kind in ("EVENT", "EOSE", "CLOSED"):
                    handler = self._subs.get(msg[1])
                    if handler is not None:
                        handler(msg)
                elif kind == "AUTH":
                    if not self._challenge.done():
                        self._challenge.set_result(msg[1])
                elif kind == "NOTICE":
                    self.notices.append(str(msg[1]))
        except Exception as exc:  # the connection went: every waiter learns it
            self.closed = f"{type(exc).__name__}: {exc}"
        else:
            self.closed = self.closed or "closed"
        for fut in self._oks.values():
            if not fut.done():
                fut.set_exception(ConnectionError(self.closed))
        self._oks.clear()

    async def publish(self, event_json: str, event_id: str, timeout: float = 30) -> tuple[bool, str]:

        fut = asyncio.get_running_loop().create_future()
        self._oks[event_id] = fut
        await self._send('["EVENT",' + event_json + "]")
        return await asyncio.wait_for(fut, timeout)

    async def _send(self, text: str) -> None:
        """Send one message; a connection that is gone raises ConnectionError, as a read would."""
        import websockets

        try:
            await self.ws.send(text)
        except websockets.ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from exc

    async def auth(self, secret: str, relay_url: str) -> tuple[bool, str]:
        from appliance.nostr.event import sign_event

        ev = sign_event(secret, 22242, [["relay", relay_url], ["challenge", self.challenge]], "")

        fut = asyncio.get_running_loop().create_future()
        self._oks[ev.id] = fut
        await self._send(json.dumps(["AUTH", ev.to_dict()]))
        return await asyncio.wait_for(fut, 30)

    async def req(self, sub_id: str, filters: list[dict], timeout: float = 30) -> tuple[list[dict], str | None]:
        """Stored events until EOSE, then CLOSE: (events, None), or (events, CLOSED reason)."""

        events: list[dict] = []
        done = asyncio.get_running_loop().create_future()

        def on(msg):
            if msg[0] == "EVENT":
                events.append(msg[2])
            elif not done.done():
                done.set_result(None if msg[0] == "EOSE" else str(msg[2] if len(msg) > 2 else "closed"))

        self._subs[sub_id] = on
        try:
            await self._send(json.dumps(["REQ", sub_id, *filters]))
            reason = await asyncio.wait_for(done, timeout)
            if reason is None:
                await self._send(json.dumps(["CLOSE", sub_id]))
            return events, reason
        finally:
            self._subs.pop(sub_id, None)

    async def subscribe(self, sub_id: str, filters: list[dict], on_event) -> None:
        """A live subscription: `on_event(event)` for each EVENT, stored or new."""

        self._subs[sub_id] = lambda msg: on_event(msg[2]) if msg[0] == "EVENT" else None
        await self._send(json.dumps(["REQ", sub_id, *filters]))

    async def close(self) -> None:

        self.closed = self.closed or "closed by us"
        try:
            await asyncio.wait_for(self.ws.close(), 5)
        except Exception:
            pass  # a connection already gone
        self._reader.cancel()


def executor_key(port: int) -> tuple[str, str]:
    """(id, pubkey) of the current executor key, from the relay's NIP-11 document."""
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Accept": "application/nostr+json"})
    doc = json.loads(urllib.request.urlopen(req, timeout=10).read())
    key = next(k for k in doc["push"]["keys"] if k.get("current"))
    return key["id"], key["pubkey"]


def lease_event(secret: str, *, origin: str, profile: str, endpoint: str, generation: int, d: str,
                exec_id: str, exec_pub: str, subscriptions: list[dict] | None = None, active: bool = True,
                ttl: int = 86400, created_at: int | None = None):
    """A signed NIP-PL lease (kind 30350), its plaintext NIP-44 encrypted to the executor key; a
    tombstone when `active` is False."""

    from appliance.nostr import nip44
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import public_key

    pub = public_key(secret)
    now = int(time.time()) if created_at is None else created_at
    if active:
        pt = {"v": 1, "origin": origin, "app_profile": profile, "transport": "apns", "endpoint": endpoint,
              "generation": generation, "active": True,
              "subscriptions": subscriptions or [{"filter": {"kinds": [9], "#p": [pub]}, "class": "time_sensitive"}]}
    else:
        pt = {"v": 1, "origin": origin, "generation": generation, "active": False}
    content = nip44.encrypt(json.dumps(pt), nip44.get_conversation_key(secret, exec_pub))
    tags = [["d", d], ["expiration", str(now + ttl)], ["exec", exec_id], ["alt", "Push lease"]]
    return sign_event(secret, 30350, tags, content, now)
