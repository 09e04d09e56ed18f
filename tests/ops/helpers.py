"""Running `appliance` commands as a user would: a real process, the real data directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PUSH_CONFIG = """
[push]
app_profiles = [{ id = "com.example.app/ios", transport = "apns" }]
push_kinds = [9, 1059, 7]
"""


def cli(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    from tests.pg import process_env

    base = process_env(args, **(env or {}))
    return subprocess.run([sys.executable, "-m", "appliance", *map(str, args)], capture_output=True, text=True,
                          env=base, cwd=ROOT, timeout=timeout)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes under `folder` (to prove a refused command changed nothing), but the
    instance lock's (any command that takes the lock writes its pid there)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "appliance.pid"}


def cli_as_stranger(data_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A command run by a user who cannot read `data_dir` (the operator forgot sudo): as root,
    the command runs as nobody; otherwise the directory is made unreadable while it runs."""
    if os.geteuid() == 0:
        from tests.pg import process_env

        base = process_env(args)
        return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               sys.executable, "-m", "appliance", *map(str, args)],
                              capture_output=True, text=True, env=base, cwd=ROOT, timeout=timeout)
    mode = data_dir.stat().st_mode & 0o777
    os.chmod(data_dir, 0)
    try:
        return cli(*args, timeout=timeout)
    finally:
        os.chmod(data_dir, mode)


class Running:
    """A long-running `appliance` command (an emulator, a server) whose output lines are read as
    they come: `wait_line(predicate)` waits for one."""

    def __init__(self, *args: str, env: dict | None = None, cwd: Path = ROOT):
        import threading

        from tests.pg import process_env

        self.args = [str(a) for a in args]
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen([sys.executable, "-m", "appliance", *self.args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=process_env(self.args, **(env or {})),
                                     cwd=cwd)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, predicate, timeout: float = 60) -> str:
        """The first line (of all read so far or to come) satisfying `predicate`."""
        import time

        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if predicate(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no such line from {self.args} in {timeout} s; got:\n" + "\n".join(self.lines))
                self._cond.wait(min(left, 0.5))

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def stop(self, sig: int | None = None) -> int:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        self.proc.stdout.close()
        return self.proc.returncode
