"""The `--state DIR` of `appliance marmot`: one device's private Marmot state, in files.

    DIR/                      0700
      key-packages/<ref>.json private parts of published key packages (until a welcome consumes them)
      groups/<group_id>.json  MLS group state and its Nostr routing
      pairing/keys/<pub>.json a new device's X25519 pairing keys (deleted once an envelope opens)
      pairing/groups/<gid>.json opened pairing entries (deleted once the External Commit succeeds)
      pairing/used.json       pairing ids already opened, kept until they expire
      pending/<gid>.json      a prepared External Commit waiting for its admin authorization

Every file is JSON, written atomically (temporary file, fsync, rename) with mode 0600; secrets
never leave the directory unless a command is asked to print them.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from appliance.errors import ConfigError

__all__ = ["StateDir"]

_NAME = re.compile(r"[0-9a-z][0-9a-z-]{0,255}")


class StateDir:
    """File-backed state for one device; `purge_expired` runs on open."""

    def __init__(self, path: str | Path):
        self.root = Path(path)
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("state", str(path), f"cannot create the state directory: {exc.strerror}") from None
        if not self.root.is_dir():
            raise ConfigError("state", str(path), "not a directory")

    # -- generic JSON records ------------------------------------------------------------------------

    def _path(self, kind: str, name: str) -> Path:
        if not _NAME.fullmatch(name):
            raise ConfigError("state", name, "record names are lowercase letters, digits and dashes")
        return self.root / kind / f"{name}.json"

    def write(self, kind: str, name: str, record: dict[str, Any]) -> None:
        path = self._path(kind, name)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(record, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def read(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(kind, name).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError("state", str(self._path(kind, name)), f"unreadable state record: {exc}") from None

    def delete(self, kind: str, name: str) -> bool:
        """Remove a record, overwriting it first (it may hold secrets)."""
        path = self._path(kind, name)
        try:
            size = path.stat().st_size
            with open(path, "r+b") as fh:
                fh.write(b"\0" * size)
                fh.flush()
                os.fsync(fh.fileno())
            path.unlink()
            return True
        except FileNotFoundError:
            return False

    def names(self, kind: str) -> list[str]:
        folder = self.root / kind
        if not folder.is_dir():
            return []
        return sorted(p.stem for p in folder.glob("*.json"))

    # -- pairing bookkeeping (single use, bounded validity) --------------------------------------------

    def used_pairing_ids(self, now: int | None = None) -> dict[str, int]:
        """Pairing ids already opened, with the time each stops mattering (its not_after)."""
        now = int(time.time()) if now is None else now
        record = self.read("pairing", "used") or {}
        return {k: v for k, v in record.get("used", {}).items() if v >= now}

    def mark_pairing_used(self, pairing_id: str, not_after: int) -> None:
        used = self.used_pairing_ids()
        used[pairing_id] = not_after
        self.write("pairing", "used", {"used": used})

    def purge_expired(self, now: int | None = None) -> list[str]:
        """Delete pairing keys, opened entries and pending commits whose validity has passed."""
        now = int(time.time()) if now is None else now
        removed = []
        for kind in ("pairing/keys", "pairing/groups", "pending"):
            for name in self.names(kind):
                record = self.read(kind, name) or {}
                if record.get("expires_at", 0) < now:
                    self.delete(kind, name)
                    removed.append(f"{kind}/{name}")
        if self.read("pairing", "used") is not None:
            self.write("pairing", "used", {"used": self.used_pairing_ids(now)})
        return removed
