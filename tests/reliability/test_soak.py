"""`appliance bench soak`: a short run end to end (the 30-minute one is in docs/reliability.md)."""

from __future__ import annotations

import csv
import math
import random
import subprocess
import sys
import xml.dom.minidom

import pytest

from appliance.bench.soak import COLUMNS, verdict
from tests.conftest import LOG_LEVEL, ROOT


def _run(minutes=30, rss_per_h=0.0, files_per_h=0.0, queue_per_h=0.0, lag_per_h=0.0, seed=14):
    """A sample every 10 s of a run: resident memory with a warm-up step and allocator noise, SQLite's
    caches filling towards their bound and levelling off, open files and the wake queue jittering,
    event-loop lag with spikes from other jobs on the box; plus the given leaks."""
    rng = random.Random(seed)
    rows = []
    for i in range(int(minutes * 6)):
        t = 10 * (i + 1)
        h = t / 3600
        sqlite = 4 + 60 * (1 - math.exp(-t / 600))
        warm = 15 * min(1.0, t / 180)
        rows.append({
            "elapsed_s": t, "sqlite_mb": round(sqlite, 1),
            "rss_mb": round(70 + warm + sqlite + rng.gauss(0, 1.5) + rss_per_h * h, 1),
            "open_files": 66 + rng.choice((0, 0, 0, 1, 2)) + int(files_per_h * h),
            "queue_depth": rng.choice((0, 0, 0, 1, 3)) + int(queue_per_h * h),
            "loop_lag_ms": round(rng.uniform(1, 8) + (rng.random() < 0.05) * rng.uniform(100, 800)
                                 + lag_per_h * h, 2)})
    return rows


def test_a_flat_run_with_noise_spikes_and_a_warm_up_step_passes():
    assert verdict(_run()) == []
    for seed in range(20):
        assert verdict(_run(seed=seed)) == [], seed


def test_steady_leaks_are_named():
    # 88 MB/h (2.1 GB a day) of resident memory: the previous verdict, comparing two halves
    # against fixed tolerances, passed it on a 30-minute run.
    [line] = verdict(_run(rss_per_h=88))
    assert line.startswith("memory outside SQLite's caches: +8") and "past the limit of 10 MB/h" in line
    # One file descriptor every 2 minutes (720 a day).
    [line] = verdict(_run(files_per_h=30))
    assert line.startswith("open files: +3") and "past the limit of 1/h" in line
    assert verdict(_run(rss_per_h=15))[0].startswith("memory outside SQLite's caches")
    assert verdict(_run(queue_per_h=100))[0].startswith("the wake queue")
    assert verdict(_run(lag_per_h=400))[0].startswith("event-loop lag")


def test_growth_that_levels_off_or_steps_once_is_not_a_trend():
    rows = _run()
    for r in rows:  # a one-off 8 MB step at minute 12, then flat
        r["rss_mb"] += 8 * (r["elapsed_s"] >= 720)
    assert verdict(rows) == []
    rows = _run()
    for r in rows:  # a cache outside SQLite's filling 20 MB through minute 15, then full
        r["rss_mb"] += 20 * min(1.0, r["elapsed_s"] / 900)
    assert verdict(rows) == []


def test_a_run_too_short_to_tell_a_leak_from_noise_gets_no_verdict():
    assert verdict(_run(minutes=8, rss_per_h=500)) == []
    assert verdict(_run(minutes=12, rss_per_h=500)) != []


@pytest.mark.slow
def test_a_short_soak_samples_every_column_and_finds_no_error(tmp_path):
    from tests.pg import database_for, on_postgres, process_env

    out = tmp_path / "soak"
    # The soak's own server on the suite's backend (the flag: the soak starts it without APPLIANCE_*).
    storage = [f"--server-arg=--storage={database_for(out / 'data')}"] if on_postgres() else []
    run = subprocess.run(
        [sys.executable, "-m", "appliance", "bench", "soak", "--minutes", "0.3", "--interval", "3", "--rate", "10",
         "--wake-users", "20", "--subscribers", "3", "--churn-users", "3", "--out", str(out), *storage,
         f"--server-arg=--log-level={LOG_LEVEL}"],
        capture_output=True, text=True, cwd=ROOT, timeout=240, env=process_env())
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    # Its appliance's log, at the suite's level, goes to the check for secrets (here and at the end).
    from tests.leaks import LOGS, check_log, sensitive

    LOGS.append(out / "appliance.log")
    sensitive((out / "data" / "appliance.key").read_bytes())
    assert "INFO" in (out / "appliance.log").read_text(errors="replace")
    assert check_log(out / "appliance.log") == []
    assert "errors: none" in run.stdout
    with open(out / "soak.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= 5 and tuple(rows[0]) == COLUMNS
    assert all(float(r["rss_mb"]) > 0 and int(r["open_files"]) > 0 and r["loop_lag_ms"] != "nan" for r in rows)
    assert all(int(r["queue_depth"]) >= 0 for r in rows)
    assert sum(int(r["published"]) for r in rows) > 0 and sum(int(r["wakes"]) for r in rows) > 0
    svg = xml.dom.minidom.parse(str(out / "soak.svg"))
    assert len(svg.getElementsByTagName("polyline")) >= 7
