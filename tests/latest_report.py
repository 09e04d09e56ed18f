"""The one line `make test-latest` prints about the suite's run against the newest releases.

    python tests/latest_report.py EXIT_CODE LOG

The run's own output (pytest's included) stays in LOG: CI reads pytest's closing summary line as
the verdict of a run, and this run is a report, not a gate. So the line says how it went in words
of its own (counts after their names, never "N passed, N failed"), and names the direct
dependencies whose newest release is newer than uv.lock's pin (from the `uv pip list` in LOG).
Standard library only; it always exits 0.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pytest's closing line, e.g. "==== 2 failed, 1200 passed, 9 skipped in 612.30s (0:10:12) ====".
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s\b")
COUNT = re.compile(r"(\d+) (\w+)")


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def newer_than_lock(log: str) -> list[str] | None:
    """Direct dependencies installed in the latest run at another version than uv.lock pins (None:
    LOG lists no installed packages)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = {_name(r) for r in project["dependencies"]}
    for extra in project.get("optional-dependencies", {}).values():
        direct |= {_name(r) for r in extra}
    pinned = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    installed = dict(re.findall(r"^([A-Za-z0-9][\w.-]*)\s+(\d\S*)\s*$", log, re.M))
    installed = {k.lower().replace("_", "-"): v for k, v in installed.items()}
    if not installed:
        return None
    return [f"{name} {installed[name]} (lock {pinned[name]})" for name in sorted(direct)
            if name in installed and name in pinned and installed[name] != pinned[name]]


def line(code: int, log: str) -> str:
    summaries = [m.group(1) for m in map(SUMMARY.match, log.splitlines()) if m]
    counts = ", ".join(f"{word} {n}" for n, word in COUNT.findall(summaries[-1])) if summaries else "no summary"
    if code == 124 or code == 137:
        verdict = "stopped at its time limit"
    elif code == 0:
        verdict = "the suite passes"
    else:
        verdict = f"the suite does not pass (pytest exit {code})"
    newer = newer_than_lock(log)
    ahead = ("" if newer is None else "; newer than uv.lock: " + ", ".join(newer) if newer
             else "; every direct dependency as in uv.lock")
    return f"test-latest (not gating): {verdict}: {counts}{ahead}"


def main(argv: list[str]) -> int:
    code, path = int(argv[1]), Path(argv[2])
    log = path.read_text(errors="replace") if path.exists() else ""
    print(f"{line(code, log)}; log: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
