"""What the benchmarks share: free ports, percentiles, progress lines, relay processes on a
temporary data directory (`appliance serve` as a subprocess) and figures of a process from /proc."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


# -- numbers and messages ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def __init__(self, name: str, args: list[str], port: int, log_path: Path, cwd: Path | None = None):
        self.name = name
        self.args = args
        self.port = port
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> "RelayProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
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

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()


def appliance_command() -> list[str]:
    """How to run this program again: the standalone executable is itself; else `python -m appliance`."""
    return [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "appliance"]


def appliance_process(data_dir: Path, port: int, log_path: Path, sync_mode: str, extra: list[str]) -> RelayProcess:
    args = [*appliance_command(), "serve", "--data-dir", str(data_dir), "--port", str(port),
            "--event-rate", "0", "--req-rate", "0", "--log-level", "warning", "--sync-mode", sync_mode, *extra]
    return RelayProcess("appliance", args, port, log_path)


# -- a process's resources (Linux /proc) ------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used so far (every thread, user and system, from schedstat in ns):
    a figure a busy machine inflates far less than wall-clock latency (it still does, through
    caches and cores). NaN when the process is gone or /proc is not there."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that just ended
    except OSError:
        return float("nan")
    return total / 1e9


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")
