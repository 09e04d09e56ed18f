"""`appliance bench transfer` and `appliance bench search` run end to end at a tiny size and print
their figures (the figures themselves are measured under the bench lock, never asserted here)."""

from __future__ import annotations

import re

import pytest

from .test_transfer import run


@pytest.mark.slow
def test_bench_transfer_prints_each_command():
    out = run("bench", "transfer", "--events", "400", "--no-verify", "--workers", "1", timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    text = out.stdout.decode()
    assert re.search(r"^import\s+[\d,]+\s.*import: read 400, stored 400, duplicate 0, rejected 0$", text, re.M), text
    assert re.search(r"^import --no-verify\s+[\d,]+\s", text, re.M), text
    assert re.search(r"^export\s+[\d,]+\s.*400 lines$", text, re.M), text


@pytest.mark.slow
def test_bench_search_prints_latency_and_ingest():
    out = run("bench", "search", "--events", "600", "--vocabulary", "300", "--queries", "5", "--ingest-events",
              "200", "--rounds", "1", "--clients", "2", "--workers", "1", timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    text = out.stdout.decode()
    for words in ("uniform over the vocabulary", "the 100 most frequent words", "weighted as in running text"):
        assert re.search(rf"^{words}\s+5\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$", text, re.M), text
    assert re.search(r"index on \(search_kinds 1\)\s+[\d,]+ events/s", text), text
    assert re.search(r"with the index: [+-][\d.]+% slower", text), text
