"""Shared fixtures: a real appliance process on a loopback port, and a real websocket client."""

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

import httpx
import pytest
import websockets

from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret, public_key
from tests.leaks import LOGS, check_log, sensitive

ROOT = Path(__file__).resolve().parents[1]
# The --log-level of every appliance the suite starts (its own servers and the benches'): debug, so
# the check for secrets in logs reads every line an operator's log could hold, at any level (about
# 19x the bytes of info, no measurable time: docs/security-tests.md). APPLIANCE_TEST_LOG_LEVEL
# sets another.
LOG_LEVEL = os.environ.get("APPLIANCE_TEST_LOG_LEVEL", "debug")


def pytest_addoption(parser):
    parser.addoption("--storage", choices=("sqlite", "postgresql"), default=None,
                     help="the store backend the suite runs on (default sqlite, or $APPLIANCE_TEST_STORAGE); "
                          "postgresql needs $APPLIANCE_TEST_PG, the URL of a cluster's maintenance database")
    parser.addoption("--fuzz-scale", type=float, default=None, metavar="N",
                     help="multiply every fuzz test's hypothesis example count by N (default 1, or $FUZZ_SCALE)")
    parser.addoption("--with-slow", action="store_true",
                     help="run the slow tier too (tests marked slow; without this or an -m expression they "
                          "are deselected: `make test-slow` is `-m slow`)")


def pytest_configure(config):
    from tests import fuzzing, pg

    storage = config.getoption("--storage")
    if storage is not None:
        pg.STORAGE = storage
        os.environ["APPLIANCE_TEST_STORAGE"] = storage
    from appliance.bench import harness

    harness.LOG_LEVEL = LOG_LEVEL
    scale = config.getoption("--fuzz-scale")
    if scale is not None:
        fuzzing.SCALE = scale


def pytest_collection_modifyitems(config, items):
    from tests import pg

    # Two tiers: the default run leaves out the slow end-to-end tests unless asked for them by
    # --with-slow or by any -m expression (`-m slow` is the slow tier alone).
    if not config.getoption("--with-slow") and not config.option.markexpr:
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
            config._slow_deselected = len(slow)
    if not pg.on_postgres():
        return
    for item in items:
        marker = item.get_closest_marker("sqlite_only")
        if marker is not None:
            reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"SQLite-only: {reason}"))


def vectors_dir() -> Path | None:
    env = os.environ.get("APPLIANCE_VECTORS")
    path = Path(env) if env else ROOT.parent / "shared" / "vectors"
    return path if path.is_dir() else None


def free_port() -> int:
    """A free loopback port, from this worker's own block when the suite runs on parallel workers."""
    from appliance.bench.harness import free_port as harness_free_port

    return harness_free_port()


# The server's info line once it applied a configuration generation (appliance.upkeep).
RELOADED = re.compile(r"reloaded origins and groups generation=(\d+)")


class PortTaken(RuntimeError):
    pass


class Server:
    """An `appliance serve` process on a free loopback port with its own data directory."""

    def __init__(self, data_dir: Path, *extra: str, env: dict | None = None, config: str | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.extra = list(extra)
        self.env = env or {}
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"server-{self.port}.log"
        LOGS.append(self.log_path)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Server":
        for _ in range(3):
            try:
                return self._start()
            except PortTaken:
                # Taken between free_port's check and the server's bind (another process on the
                # machine): another port, as a real operator would pick.
                self._log.close()
                self.port = free_port()
                self.log_path = self.data_dir.parent / f"server-{self.port}.log"
                LOGS.append(self.log_path)
        return self._start()

    def _start(self) -> "Server":
        args = [sys.executable, "-m", "appliance", "serve", "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--log-level", LOG_LEVEL, *self.extra]
        if self.config is not None:
            cfg = self.data_dir.parent / f"config-{self.port}.toml"
            cfg.write_text(self.config)
            args += ["--config", str(cfg)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        from tests.pg import storage_env

        env.update(storage_env(self.data_dir))
        env.update(self.env)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        # Ready in a second or two on an idle machine, but up to ten times that with parallel
        # workers beside other loads on two cores: a start that long is slow, not broken.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log_path.read_text()
                if f"cannot listen on 127.0.0.1:{self.port}: address already in use" in log:
                    raise PortTaken(log)
                raise RuntimeError(f"server exited early:\n{log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.proc.kill()  # not left running, holding its port and data directory, after the test
        self.proc.wait()
        self._log.close()
        raise RuntimeError(f"server did not start:\n{self.log_path.read_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
        key = self.data_dir / "appliance.key"
        if key.is_file():
            sensitive(key.read_bytes())
        leaked = check_log(self.log_path)
        assert not leaked, f"secrets in the server log {self.log_path}: {leaked}"

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    async def caught_up(self, timeout: float = 60) -> None:
        """Wait until the server has applied every configuration edit committed so far: the CLI's
        edits reach it through its reload loop, about a second on an idle machine, later on a busy
        one (a fixed sleep was a flake)."""
        from tests.pg import db_rows

        ((value,),) = db_rows(self.data_dir, "SELECT value FROM meta WHERE name = 'config_generation'")
        deadline = time.monotonic() + timeout
        while not any(int(g) >= int(value) for g in RELOADED.findall(self.log_path.read_text())):
            assert time.monotonic() < deadline, f"configuration generation {value} not reloaded in {timeout} s"
            await asyncio.sleep(0.05)

    def nip11(self, host: str | None = None) -> dict:
        headers = {"Accept": "application/nostr+json"}
        if host:
            headers["Host"] = host
        r = httpx.get(self.http + "/", headers=headers)
        r.raise_for_status()
        return r.json()


class Client:
    """A minimal Nostr websocket client over the `websockets` library."""

    def __init__(self, ws):
        self.ws = ws
        self.challenge: str | None = None
        self.backlog: list = []

    @classmethod
    async def connect(cls, url: str, host: str | None = None) -> "Client":
        if host:  # connect to the real address but present `host` in the Host header
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            ws = await websockets.connect(f"ws://{host}:{parts.port}{parts.path or '/'}", host=parts.hostname,
                                          port=parts.port, max_size=None)
        else:
            ws = await websockets.connect(url, max_size=None)
        client = cls(ws)
        first = await client.recv()
        assert first[0] == "AUTH"
        client.challenge = first[1]
        return client

    async def close(self) -> None:
        await self.ws.close()

    async def send(self, msg) -> None:
        await self.ws.send(msg if isinstance(msg, str) else json.dumps(msg))

    async def recv(self, timeout: float = 10) -> list:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def expect(self, predicate, timeout: float = 10) -> list:
        """The next message satisfying `predicate`; others are kept in `backlog`."""
        for i, msg in enumerate(self.backlog):
            if predicate(msg):
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.recv(max(0.01, deadline - time.monotonic()))
            if predicate(msg):
                return msg
            self.backlog.append(msg)

    async def publish(self, ev) -> tuple[bool, str]:
        d = ev.to_dict() if hasattr(ev, "to_dict") else ev
        await self.send(["EVENT", d])
        msg = await self.expect(lambda m: m[0] == "OK" and m[1] == d.get("id"))
        return msg[2], msg[3]

    async def req(self, sub_id: str, *filters) -> tuple[list[dict], list | None]:
        """Stored events until EOSE; (events, None) or ([], CLOSED message)."""
        await self.send(["REQ", sub_id, *filters])
        events = []
        while True:
            msg = await self.expect(lambda m: m[0] in ("EVENT", "EOSE", "CLOSED") and m[1] == sub_id)
            if msg[0] == "EVENT":
                events.append(msg[2])
            elif msg[0] == "EOSE":
                return events, None
            else:
                return events, msg

    async def count(self, sub_id: str, *filters) -> list:
        await self.send(["COUNT", sub_id, *filters])
        return await self.expect(lambda m: m[0] in ("COUNT", "CLOSED") and m[1] == sub_id)

    async def auth(self, secret: str, relay_url: str) -> tuple[bool, str]:
        ev = sign_event(secret, 22242, [["relay", relay_url], ["challenge", self.challenge]], "")
        await self.send(["AUTH", ev.to_dict()])
        msg = await self.expect(lambda m: m[0] == "OK" and m[1] == ev.id)
        return msg[2], msg[3]


class Identity:
    def __init__(self):
        self.secret = generate_secret()
        self.pubkey = public_key(self.secret)
        sensitive(self.secret, self.pubkey)

    def sign(self, kind: int, tags=None, content: str = "", created_at: int | None = None):
        return sign_event(self.secret, kind, tags or [], content, created_at)


# What the parallel workers found, as the controller learns it when each worker ends
# (pytest_testnodedown): the slow tests each left out and the secrets in their servers' logs.
_from_workers: dict = {"slow_deselected": 0, "leaked": {}}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", None) or {}
    _from_workers["slow_deselected"] = max(_from_workers["slow_deselected"], output.get("slow_deselected", 0))
    _from_workers["leaked"].update(output.get("leaked_secrets") or {})


def pytest_terminal_summary(terminalreporter, config):
    left = getattr(config, "_slow_deselected", 0) or _from_workers["slow_deselected"]
    if left:
        terminalreporter.write_line(f"{left} slow tests left out: `make test-slow` (pytest -m slow) runs them, "
                                    "--with-slow runs both tiers")


def pytest_sessionfinish(session, exitstatus):
    """Every server log of the run (the suite's servers and the appliances benches started), against
    every secret registered by its end; on PostgreSQL, the databases the run made are dropped."""
    from appliance.bench.harness import APPLIANCE_LOGS
    from tests import pg

    leaked = {str(p): found for p in dict.fromkeys([*LOGS, *APPLIANCE_LOGS]) if (found := check_log(p))}
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a parallel worker: its exit status is not the run's, the controller's is
        workeroutput["leaked_secrets"] = leaked
        workeroutput["slow_deselected"] = getattr(session.config, "_slow_deselected", 0)
    else:
        leaked.update(_from_workers["leaked"])
    if leaked and workeroutput is None:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"SECRETS IN SERVER LOGS: {leaked}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if pg.on_postgres():
        pg.drop_all()


@pytest.fixture(scope="session")
def pg_cluster():
    """A PostgreSQL cluster whatever backend the suite runs on (tests/pgcluster.py): for the tests
    of several nodes and of PostgreSQL operations."""
    from tests.pgcluster import start_cluster

    cluster = start_cluster()
    yield cluster
    cluster.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def connect(anyio_backend):
    """`await connect(url, host=None)` opens a Client that is closed after the test."""
    opened: list[Client] = []

    async def _connect(url: str, host: str | None = None) -> Client:
        client = await Client.connect(url, host)
        opened.append(client)
        return client

    yield _connect
    for client in opened:
        await client.close()


@pytest.fixture
def built_app(tmp_path):
    """The appliance built in-process over a fresh data directory (the suite's backend) and not
    served: for the tests of one part's rules on its real parts. Closed after the test."""
    from appliance.app import build
    from appliance.settings import load
    from tests.pg import storage_env

    data_dir = tmp_path / "data"
    app = build(load(flags={"data_dir": str(data_dir)}, environ=storage_env(data_dir), config_path=None))
    yield app
    app.relay.close()
    app.store.close()


@pytest.fixture
def make_server(tmp_path):
    servers: list[Server] = []

    def factory(*extra: str, env: dict | None = None, config: str | None = None, data_dir: Path | None = None):
        server = Server(data_dir or tmp_path / f"data{len(servers)}", *extra, env=env, config=config).start()
        servers.append(server)
        return server

    yield factory
    for s in servers:
        s.stop()


@pytest.fixture
def server(make_server):
    return make_server()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """One server for a whole module, for modules whose tests neither reconfigure nor restart it and
    read only what they wrote themselves: such a module overrides `server` with it and pays one
    start instead of one a test."""
    server = Server(tmp_path_factory.mktemp("module") / "data").start()
    yield server
    server.stop()


@pytest.fixture
def alice() -> Identity:
    return Identity()


@pytest.fixture
def bob() -> Identity:
    return Identity()
