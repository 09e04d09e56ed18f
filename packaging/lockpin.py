"""Print one package of uv.lock as a pip requirement with its hashes, for `pip install --require-hashes`.

    python packaging/lockpin.py uv > req.txt && pip install --require-hashes --no-deps -r req.txt

The Makefile and the Dockerfile install uv this way, from the same lock file as everything else
(its `lock` dependency group), before `uv sync` installs the rest. Standard library only: it runs
on a bare python3 before anything is installed.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "uv.lock"


def requirement(name: str, lock: Path = LOCK) -> str:
    packages = [p for p in tomllib.loads(lock.read_text())["package"] if p["name"] == name]
    if len(packages) != 1:
        raise SystemExit(f"lockpin: {lock.name} has {len(packages)} entries for {name!r}, expected one")
    package = packages[0]
    files = package.get("wheels", []) + ([package["sdist"]] if "sdist" in package else [])
    hashes = [f["hash"] for f in files if "hash" in f]
    if not hashes:
        raise SystemExit(f"lockpin: {lock.name} has no hashes for {name!r}")
    return " \\\n    ".join([f"{name}=={package['version']}", *(f"--hash={h}" for h in hashes)]) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python packaging/lockpin.py PACKAGE")
    sys.stdout.write(requirement(sys.argv[1]))
