"""Which process serves a data directory: an exclusive lock on `<data_dir>/appliance.pid`.

`appliance serve` holds an exclusive `flock` on the file for its whole life and writes its pid
into it. The kernel drops the lock when the process ends, however it ends (a crash or SIGKILL
leaves no stale lock behind; the pid written in the file is only there to be named in messages).
A second server on the same directory is refused, and so is `appliance restore` while one runs.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from appliance.errors import StoreError

LOCK_NAME = "appliance.pid"


class InstanceBusy(StoreError):
    """Another process holds the data directory."""

    def __init__(self, data_dir: Path, pid: int | None):
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"the data directory {data_dir} is in use by a running appliance ({who})")
        self.pid = pid


def ensure_data_dir(data_dir: Path) -> None:
    """Create the data directory (0700) if missing; StoreError naming it when that fails."""
    try:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        os.chmod(data_dir, 0o700)
    except OSError as exc:
        raise StoreError(f"cannot use the data directory {data_dir}: {exc.strerror or exc}") from None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class InstanceLock:
    """The data directory's lock: `acquire()` or InstanceBusy; released by `release()` or exit."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, *, write_pid: bool = True) -> "InstanceLock":
        ensure_data_dir(self.data_dir)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise InstanceBusy(self.data_dir, pid) from None
        if write_pid:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the lock; the file stays (unlinking it would race a new holder)
            self._fd = None

    def __enter__(self) -> "InstanceLock":
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def running_pid(data_dir: Path) -> int | None:
    """The pid serving `data_dir` (0 when the holder wrote none), or None when nobody holds it."""
    try:
        fd = os.open(Path(data_dir) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        return None
    finally:
        os.close(fd)


# What the serving process records about itself beside the lock: its pid, listen addresses and
# URLs, for the commands run beside it (`admin reset`, `doctor`, `push ...`) to name the real port.
INSTANCE_NAME = "instance.json"


def write_instance(data_dir: Path, info: dict) -> None:
    """Record the serving process (atomically: a reader sees the old file or the new one)."""
    import json

    path = Path(data_dir) / INSTANCE_NAME
    tmp = path.with_name(f".{INSTANCE_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"pid": os.getpid(), **info}, indent=1) + "\n")
    os.replace(tmp, path)


def clear_instance(data_dir: Path) -> None:
    """Remove this process's record at a clean stop (a newer server's record is left alone)."""
    path = Path(data_dir) / INSTANCE_NAME
    info = _load_instance(path)
    if info is not None and info.get("pid") == os.getpid():
        try:
            path.unlink()
        except OSError:
            pass


def _load_instance(path: Path) -> dict | None:
    import json

    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def read_instance(data_dir: Path) -> dict | None:
    """The running appliance's record for `data_dir`: only while a process holds the lock and it
    is the one that wrote the record (a file left by a crash names nobody)."""
    pid = running_pid(data_dir)
    if not pid:
        return None
    info = _load_instance(Path(data_dir) / INSTANCE_NAME)
    return info if info is not None and info["pid"] == pid else None
