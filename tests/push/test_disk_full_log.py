"""A full disk while wakes are due: every delivery cycle's claim, every commit and every WAL
checkpoint fails about once a second for as long as it lasts. The log says so once with the cause,
then at most once a minute with a count, and once more when writes fit again; meanwhile nothing is
lost (the wakes go out once space returns)."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3

import pytest

from appliance.nostr.event import sign_event
from appliance.store.faultlog import FaultLog
from tests.conftest import Server
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, jobs, token, wait_until
from tests.reliability.test_disk_full import grow, small_disk  # noqa: F401 - the fixture

pytestmark = pytest.mark.anyio


def test_a_repeating_failure_is_logged_once_then_once_a_minute_then_when_it_ends(caplog):
    now = [100.0]
    faults = FaultLog(logging.getLogger("appliance.test"), "writing", clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="appliance.test")
    for _ in range(60):  # a minute of failures, one a second
        faults.failed(OSError("disk full"), note="commit")
        now[0] += 1
    assert [r.getMessage() for r in caplog.records] == ["writing failed (commit): disk full"]
    faults.failed(OSError("disk full"))
    assert caplog.records[-1].getMessage() == (
        "writing still failing: 60 more failure(s) in the last 60 s, 61 in 60 s: disk full")
    now[0] += 10
    faults.failed(ValueError("another cause"))  # another kind of failure is news at once
    assert caplog.records[-1].getMessage() == "writing failed: another cause"
    now[0] += 5
    faults.recovered()  # a write fitted: at the edge of a full disk the next may not
    now[0] += 5
    faults.failed(ValueError("another cause"))  # the same outage goes on
    for _ in range(10):
        faults.recovered()
        now[0] += 1
    assert len(caplog.records) == 3
    faults.recovered()  # ten seconds of successes and no failure: it works again
    faults.recovered()
    assert caplog.records[-1].getMessage() == "writing works again, after 10 s and 2 failure(s)"
    assert caplog.records[-1].levelno == logging.WARNING and len(caplog.records) == 4
    faults.failed(OSError("disk full"))  # a new outage starts a new series
    assert len(caplog.records) == 5 and caplog.records[-1].getMessage() == "writing failed: disk full"


def mention_sub(user):
    return {"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": "time_sensitive"}


def hold_snapshot(db_path) -> sqlite3.Connection:
    """A reader in the middle of a read transaction, as a backup would be."""
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM events").fetchall()
    return reader


def fill_up(path) -> None:
    """Take every free block left on the filesystem."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def error_lines(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line and needle in line]


@pytest.mark.slow
@pytest.mark.sqlite_only("fills the data directory's filesystem, where SQLite keeps the database")
async def test_a_full_disk_with_wakes_due_logs_once_not_every_second(small_disk, tmp_path):  # noqa: F811
    apns = Apns(tmp_path).start()
    settings = {"wake_max_attempts": 100, "wake_retry_delay": 1.0}
    server = Server(small_disk / "data", config=delivery_config(apns, settings=settings))
    server.log_path = tmp_path / "server.log"  # not on the full disk
    server.start()
    try:
        alice = await Pusher.connect(server)
        bob = await Pusher.connect(server)
        await bob.lease(token(), subscriptions=[mention_sub(bob)])
        apns.emulator.behave(None, 503, "ServiceUnavailable", times=100_000)  # the wakes stay due
        mentions = [await alice.publish(9, [["p", bob.pubkey]]) for _ in range(3)]
        refusals = []
        for i in range(400):  # ~24 KB notes until the disk refuses three
            ev = sign_event(alice.user.secret, 1, [["t", "fill"]], f"{i} " + os.urandom(12_000).hex())
            ok, msg = await alice.client.publish(ev)
            if not ok:
                refusals.append(msg)
                if len(refusals) >= 3:
                    break
        assert refusals and all(m.startswith("error: ") and "disk is full" in m for m in refusals), refusals
        # Keep the disk full for the small writes too: a reader's snapshot stops the checkpoint from
        # restarting the WAL (whose file space small commits would otherwise reuse), and a filler
        # takes the room the refused notes left at the edge.
        snapshot = hold_snapshot(small_disk / "data" / "appliance.sqlite3")
        fill_up(small_disk / "filler")
        # The claimer retries its due wakes every second and fails each time: the first failure is
        # logged with its cause; the next minute's are only counted.
        await wait_until(lambda: error_lines(server.log_path.read_text(), "wake delivery cycle failed"), timeout=60)
        await asyncio.sleep(5)
        log = server.log_path.read_text()
        assert "Traceback" not in log, log[-3000:]
        [cycle] = error_lines(log, "wake delivery cycle failed")
        assert "the disk holding the database is full" in cycle
        # (At the edge of the full disk some writes still fit: that is the same outage.)
        assert len(error_lines(log, "writing to the database failed")) == 1, log[-3000:]
        assert len(error_lines(log, "SQLite: writing to the disk failed")) <= 1, log[-3000:]
        assert len(error_lines(log, "recording wake outcomes failed")) <= 1, log[-3000:]
        assert len(error_lines(log, "")) <= 4 and "works again" not in log, log[-3000:]
        # Space returns: the wakes go out, and the log says the failures ended.
        snapshot.close()
        apns.emulator.clear(None)
        grow(small_disk, "64m")
        await wait_until(lambda: all(j["state"] in ("delivered", "coalesced")
                                     for m in mentions for j in jobs(server, event_id=m.id)
                                     ) and all(jobs(server, event_id=m.id) for m in mentions), timeout=60)
        # Once writes have gone on fitting for 10 s, one line each says so.
        says = ("wake delivery cycle works again", "writing to the database works again",
                "SQLite: writing to the disk works again")
        for i in range(600):
            if all(s in server.log_path.read_text() for s in says):
                break
            await alice.publish(1, [["t", "after"]])  # commits go on
            await asyncio.sleep(0.1)
        log = server.log_path.read_text()
        assert all(log.count(s) == 1 for s in says), log[-3000:]
        assert "Traceback" not in log
    finally:
        server.stop()
        apns.stop()
    db = sqlite3.connect(small_disk / "data" / "appliance.sqlite3")
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()
