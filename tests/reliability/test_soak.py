"""`appliance bench soak`: a short run end to end (the 30-minute one is in docs/reliability.md)."""

from __future__ import annotations

import csv
import subprocess
import sys
import xml.dom.minidom

import pytest

from appliance.bench.soak import COLUMNS, verdict
from tests.conftest import ROOT


def _rows(rss, files=66, lag=5.0, queue=0):
    return [{"elapsed_s": i * 10, "rss_mb": r, "open_files": files if isinstance(files, int) else files[i],
             "loop_lag_ms": lag, "queue_depth": queue} for i, r in enumerate(rss)]


def test_the_verdict_names_growth_and_tolerates_warm_up():
    assert verdict(_rows([70, 72, 74, 75, 75, 75, 76, 75, 75])) == []
    assert verdict(_rows([70, 80, 90, 100, 110, 120, 130, 140, 150])) == [
        "resident memory grew from 110.0 to 140.0 MB"]
    assert verdict(_rows([70] * 9, files=[60, 60, 60, 70, 80, 90, 100, 110, 120])) == [
        "open files grew from 80 to 110"]


@pytest.mark.slow
def test_a_short_soak_samples_every_column_and_finds_no_error(tmp_path):
    from tests.pg import database_for, on_postgres, process_env

    out = tmp_path / "soak"
    # The soak's own server on the suite's backend (the flag: the soak starts it without APPLIANCE_*).
    storage = [f"--server-arg=--storage={database_for(out / 'data')}"] if on_postgres() else []
    run = subprocess.run(
        [sys.executable, "-m", "appliance", "bench", "soak", "--minutes", "0.3", "--interval", "3", "--rate", "10",
         "--wake-users", "20", "--subscribers", "3", "--churn-users", "3", "--out", str(out), *storage],
        capture_output=True, text=True, cwd=ROOT, timeout=240, env=process_env())
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "errors: none" in run.stdout
    with open(out / "soak.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= 5 and tuple(rows[0]) == COLUMNS
    assert all(float(r["rss_mb"]) > 0 and int(r["open_files"]) > 0 and r["loop_lag_ms"] != "nan" for r in rows)
    assert all(int(r["queue_depth"]) >= 0 for r in rows)
    assert sum(int(r["published"]) for r in rows) > 0 and sum(int(r["wakes"]) for r in rows) > 0
    svg = xml.dom.minidom.parse(str(out / "soak.svg"))
    assert len(svg.getElementsByTagName("polyline")) >= 7
