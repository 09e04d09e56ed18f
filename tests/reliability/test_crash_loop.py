"""SIGKILL under load, five times (`appliance bench crashloop --kills 50` is the long run): after
every restart each acknowledged event is served, each stored mention woke its device once, lease
rows and watermarks agree with what REQ serves, and the database passes integrity_check."""

from __future__ import annotations

import pytest

from appliance.bench.crashloop import CrashLoop

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def assert_log_holds_no_secret(loop: CrashLoop) -> None:
    """The appliance's log (at the suite's level, info) holds none of the secret keys, pubkeys and
    device tokens the bench minted, nor anything of its key file."""
    from appliance.nostr.keys import public_key
    from tests.leaks import check_log, sensitive

    for secret, pubkey, token in loop.wake_users:
        sensitive(secret, pubkey, token)
    for secret in loop.publishers:
        sensitive(secret, public_key(secret))
    for address in loop.addresses:
        sensitive(address.secret, address.pubkey)
    sensitive((loop.data / "appliance.key").read_bytes())
    log = loop.work / "appliance.log"
    assert "INFO" in log.read_text(errors="replace")  # the check reads info lines too
    assert check_log(log) == []


async def test_five_sigkills_under_load_lose_nothing_acknowledged(tmp_path):
    lines: list[str] = []
    loop = CrashLoop(tmp_path, seed=14, wake_users=12, churn_users=3, log=lines.append)
    report = await loop.run(5)
    assert report.violations == [], "\n".join(report.violations[:20] + lines)
    assert_log_holds_no_secret(loop)
    assert report.kills == 5
    # The load was real: events acknowledged before kills, mentions stored and woken, lease churn.
    assert report.acked > 50 and report.mentions_stored > 20 and report.wakes > 20
    assert report.lease_versions > 10
    # Each restart recovered the WAL its kill left (the check between them reads it read-only).
    assert len(report.wal_bytes) == 5 and all(report.wal_bytes), report.wal_bytes


async def test_the_integrity_check_leaves_the_killed_wal_for_the_restart(tmp_path):
    """The check between kill and restart reads the database read-only: a read-write connection,
    closed last, checkpoints the WAL into the database and deletes it, and the restart would never
    recover the state a SIGKILL leaves."""
    loop = CrashLoop(tmp_path, seed=3, wake_users=3, churn_users=1, log=lambda _line: None)
    loop.proc.start()
    try:
        await loop.setup()
        await loop.round()  # load, then SIGKILL
        wal = loop.data / "appliance.sqlite3-wal"
        before = wal.read_bytes() if wal.exists() else b""
        assert before, "the kill left no WAL to recover"
        loop.integrity()
        assert loop.report.violations == []
        after = wal.read_bytes() if wal.exists() else b""
        assert after == before, f"the check rewrote the crash state: WAL {len(before)} -> {len(after)} bytes"
        loop.proc.start()  # the appliance recovers the WAL itself
        await loop.verify()
        assert loop.report.violations == [], "\n".join(loop.report.violations[:20])
    finally:
        loop.proc.stop()
        loop.emu.stop_thread()
