"""SIGKILL under load, five times (`appliance bench crashloop --kills 50` is the long run): after
every restart each acknowledged event is served, each stored mention woke its device once, lease
rows and watermarks agree with what REQ serves, and the database passes integrity_check."""

from __future__ import annotations

import pytest

from appliance.bench.crashloop import CrashLoop

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_five_sigkills_under_load_lose_nothing_acknowledged(tmp_path):
    lines: list[str] = []
    loop = CrashLoop(tmp_path, seed=14, wake_users=12, churn_users=3, log=lines.append)
    report = await loop.run(5)
    assert report.violations == [], "\n".join(report.violations[:20] + lines)
    assert report.kills == 5
    # The load was real: events acknowledged before kills, mentions stored and woken, lease churn.
    assert report.acked > 50 and report.mentions_stored > 20 and report.wakes > 20
    assert report.lease_versions > 10
