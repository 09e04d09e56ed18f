"""Measurements live in docs/performance.md, not in comments: a tuned constant links its section
there, and the link must land on a section that says how to measure it: a benchmark, or `python -m
timeit` over the one function a constant tunes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
LINK = re.compile(r"docs/performance\.md#([A-Za-z0-9_-]+)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def sections() -> dict[str, str]:
    """Anchor -> the text of that section (up to the next heading)."""
    out: dict[str, str] = {}
    name = None
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            name = anchor(line.lstrip("#"))
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def links() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), m.group(1))
            for path in sorted((ROOT / "appliance").rglob("*.py")) for m in LINK.finditer(path.read_text())]


def test_the_code_links_its_measurements():
    assert len(links()) >= 10


def test_every_link_lands_on_a_section_with_its_command():
    found = sections()
    for where, name in links():
        assert name in found, f"{where}: docs/performance.md has no section #{name}"
        assert re.search(r"Measure: .*`(appliance bench [a-z-]+|python -m timeit )", found[name]), \
            f"docs/performance.md#{name} names no `appliance bench ...` (or `python -m timeit ...`) command"


def test_the_anchor_rule():
    assert anchor(" DEFAULT_SWITCH_INTERVAL") == "default_switch_interval"
    assert anchor(" gc.freeze at start") == "gcfreeze-at-start"
