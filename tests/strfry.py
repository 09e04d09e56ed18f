"""A strfry relay for the interoperability tests: the binary named by STRFRY_BIN (built from
source, e.g. with ../shared/tools/strfry-build.sh), on a free loopback port with its own database
directory. Tests that need it skip, saying why, when STRFRY_BIN is not set."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

STRFRY_BIN = os.environ.get("STRFRY_BIN", "")


def strfry_bin() -> str:
    """The strfry binary, or the test is skipped with the reason."""
    if not STRFRY_BIN:
        pytest.skip("STRFRY_BIN is not set: the strfry interoperability tests need a strfry binary "
                    "(build one with ../shared/tools/strfry-build.sh and set STRFRY_BIN to it)")
    if not os.access(STRFRY_BIN, os.X_OK):
        pytest.skip(f"STRFRY_BIN={STRFRY_BIN} is not an executable file")
    return STRFRY_BIN


class Strfry:
    """One strfry relay: `import_events`/`export` use its database directly, `start` serves it."""

    def __init__(self, workdir: Path):
        self.bin = strfry_bin()
        self.dir = workdir
        self.db = workdir / "db"
        self.db.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config = workdir / "strfry.conf"
        # strfry's defaults for everything else: negentropy on, 1,000,000 records per sync.
        self.config.write_text(f'db = "{self.db}/"\nrelay {{\n    bind = "127.0.0.1"\n    port = {self.port}\n'
                               "    nofiles = 0\n}\n")
        self.log_path = workdir / "strfry.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def run(self, *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.bin, f"--config={self.config}", *args], input=input, capture_output=True,
                              text=True, timeout=timeout)

    def import_events(self, lines: list[str]) -> None:
        out = self.run("import", input="".join(line + "\n" for line in lines))
        assert out.returncode == 0, out.stderr[-2000:]

    def export(self) -> list[str]:
        out = self.run("export")
        assert out.returncode == 0, out.stderr[-2000:]
        return [line for line in out.stdout.splitlines() if line]

    def sync(self, url: str, *args: str) -> subprocess.CompletedProcess:
        return self.run("sync", url, *args)

    def start(self) -> "Strfry":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.bin, f"--config={self.config}", "relay"], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"strfry exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("strfry did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()


@pytest.fixture
def strfry(tmp_path):
    relay = Strfry(tmp_path / "strfry")
    yield relay
    relay.stop()
