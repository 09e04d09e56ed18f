"""The host's wall clock jumps forward and back under a running appliance (libfaketime moves
CLOCK_REALTIME only, as NTP stepping the clock would; the monotonic clock runs on): it keeps
accepting events, serving them and delivering wakes, each once.

libfaketime comes from Debian's `faketime` package (.ci/run installs it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import Server
from tests.pg import on_postgres
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, jobs, token, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIBFAKETIME = next((p for p in (Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
                                Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
                                Path("/usr/lib/faketime/libfaketime.so.1")) if p.exists()), None)


def p_sub(user):
    return {"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": "time_sensitive"}


@pytest.fixture
def clock(tmp_path):
    if LIBFAKETIME is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")

    def jump(seconds: int) -> None:
        offset.write_text(f"{seconds:+d}\n")

    jump.env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset), "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    return jump


async def test_clock_jumps_forward_and_back(tmp_path, clock):
    apns = Apns(tmp_path).start()
    # The default per-endpoint rate cap (2 s between wakes) is on: it is what a backward jump
    # could stall. Lease workers run in the event loop here: libfaketime breaks time.sleep.
    server = Server(tmp_path / "data", "--lease-workers", "0", env=clock.env,
                    config=delivery_config(apns, settings={"wake_min_interval": 2.0})).start()
    opened = []
    try:
        alice = await Pusher.connect(server)
        bob = await Pusher.connect(server)
        opened += [alice, bob]
        tok = token()
        await bob.lease(tok, subscriptions=[p_sub(bob)])
        acked = []

        async def wake_once() -> None:
            """One mention, acknowledged, stored and delivered once (its own apns-id)."""
            ev = await alice.publish(9, [["p", bob.pubkey]])
            acked.append(ev.id)
            await wait_until(lambda: jobs(server, event_id=ev.id)
                             and jobs(server, event_id=ev.id)[0]["state"] in ("delivered", "coalesced"), timeout=20)
            (job,) = jobs(server, event_id=ev.id)
            if job["state"] == "delivered":
                assert [r.header("apns-id") for r in apns.emulator.accepted(tok)].count(job["id"]) == 1

        await wake_once()
        for offset in (600, -600, 0):  # forward 10 minutes, back 20, forward 10 again
            clock(offset)
            await wake_once()
            await wake_once()
        events, closed = await alice.client.req("all", {"ids": acked})
        assert closed is None and {e["id"] for e in events} == set(acked)
    finally:
        for p in opened:
            await p.client.close()
        server.stop()
        apns.stop()
    if not on_postgres():  # (PostgreSQL's files are the database server's)
        db = sqlite3.connect(server.data_dir / "appliance.sqlite3")
        try:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            db.close()


async def test_a_retry_due_when_the_clock_went_back_is_not_held_for_the_jump(tmp_path, clock):
    """A wake waiting to be retried (due 3 s later) when the wall clock steps back 10 minutes
    goes about 3 s later still, not 10 minutes and 3 s later."""
    apns = Apns(tmp_path).start()
    server = Server(tmp_path / "data", "--lease-workers", "0", env=clock.env,
                    config=delivery_config(apns, settings={"wake_retry_delay": 3.0})).start()
    opened = []
    try:
        alice = await Pusher.connect(server)
        bob = await Pusher.connect(server)
        opened += [alice, bob]
        tok = token()
        await bob.lease(tok, subscriptions=[p_sub(bob)])
        apns.emulator.behave(tok, 503, "ServiceUnavailable", times=1)
        ev = await alice.publish(9, [["p", bob.pubkey]])
        await wait_until(lambda: jobs(server, event_id=ev.id)[0]["attempts"] == 1, timeout=20)
        clock(-600)
        await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered", timeout=20)
        (job,) = jobs(server, event_id=ev.id)
        assert [r.header("apns-id") for r in apns.emulator.accepted(tok)] == [job["id"]]
    finally:
        for p in opened:
            await p.client.close()
        server.stop()
        apns.stop()
