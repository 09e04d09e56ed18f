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
