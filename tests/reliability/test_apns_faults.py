"""APNs misbehaving under a running appliance: down, slow, GOAWAY, connection resets, a 429 storm.
Whatever happens, every wake is delivered in the end, once per job (one apns-id, accepted once),
and the relay keeps answering while APNs does not."""

from __future__ import annotations

import pytest

from tests.conftest import Server
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, jobs, token, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def p_sub(user):
    return {"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": "time_sensitive"}


@pytest.fixture
async def world(tmp_path):
    apns = Apns(tmp_path).start()
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={
        "wake_retry_delay": 0.2, "wake_max_attempts": 30})).start()
    alice = await Pusher.connect(server)
    bobs = []
    for _ in range(4):
        bob = await Pusher.connect(server)
        bob.token = token()
        await bob.lease(bob.token, subscriptions=[p_sub(bob)])
        bobs.append(bob)
    yield apns, server, alice, bobs
    for p in [alice, *bobs]:
        await p.client.close()
    server.stop()
    apns.stop()


async def mention_each(alice, bobs) -> list:
    return [await alice.publish(9, [["p", bob.pubkey]]) for bob in bobs]


async def delivered_once(apns, server, bobs, events, timeout=60.0) -> list[dict]:
    """Every event's wake delivered, and APNs accepted each job's apns-id exactly once."""
    ids = [e.id for e in events]
    await wait_until(lambda: all(j["state"] == "delivered" for i in ids for j in jobs(server, event_id=i))
                     and all(jobs(server, event_id=i) for i in ids), timeout=timeout)
    out = []
    for bob, ev in zip(bobs, events):
        (job,) = jobs(server, event_id=ev.id)
        accepted = [r.header("apns-id") for r in apns.emulator.accepted(bob.token)]
        assert accepted.count(job["id"]) == 1, (accepted, job)
        out.append(job)
    return out


async def test_goaway_and_connection_resets_are_retried_on_a_new_connection(world):
    apns, server, alice, bobs = world
    for kind in ("goaway", "reset"):
        before = apns.emulator.disrupted
        apns.emulator.disrupt(kind, times=3)
        events = await mention_each(alice, bobs)
        done = await delivered_once(apns, server, bobs, events)
        assert apns.emulator.disrupted == before + 3
        if kind == "reset":  # a request in flight on a dropped connection costs its wake an attempt
            assert sum(j["attempts"] for j in done) >= len(done) + 1  # some wakes needed another attempt
        # (A request a GOAWAY left unprocessed is sent once more on a new connection within the same
        # attempt; only a wake refused twice so takes another, which depends on how the three land.)


async def test_a_429_storm_delays_but_loses_nothing(world):
    apns, server, alice, bobs = world
    apns.emulator.behave(None, 429, "TooManyRequests", times=12)
    events = await mention_each(alice, bobs)
    done = await delivered_once(apns, server, bobs, events)
    assert sum(j["attempts"] for j in done) >= len(done) + 12 - 1
    refused = [r for r in apns.emulator.requests() if r.status == 429]
    assert len(refused) == 12


async def test_apns_down_then_back_delivers_what_waited(world):
    apns, server, alice, bobs = world
    port = apns.emulator.port
    apns.emulator.stop_thread()
    events = await mention_each(alice, bobs)  # the relay acknowledges while APNs is unreachable
    await wait_until(lambda: all(jobs(server, event_id=e.id)[0]["attempts"] >= 1 for e in events), timeout=30)
    assert all(jobs(server, event_id=e.id)[0]["state"] in ("pending", "claimed") for e in events)
    apns.emulator.start_in_thread(port=port)
    await delivered_once(apns, server, bobs, events)


async def test_a_slow_apns_holds_no_publisher_back(world):
    apns, server, alice, bobs = world
    apns.emulator.behave(None, delay=8)
    events = await mention_each(alice, bobs)
    notes = [await alice.publish(1, [["t", "still-here"]]) for _ in range(5)]
    # Every OK came back while APNs still held every one of these wakes.
    held = [r for bob in bobs for r in apns.emulator.accepted(bob.token)]
    assert held == [], "a wake was answered before the publisher got its OK"
    events_stored, _ = await alice.client.req("n", {"ids": [e.id for e in notes]})
    assert len(events_stored) == 5
    apns.emulator.clear(None)
    await delivered_once(apns, server, bobs, events)


async def test_a_silent_connection_is_dropped_and_the_wake_goes_on_a_new_one(world):
    """APNs stops reading and answering on the open connection (PING included) without closing
    it. The wake's attempt times out (30 s), the PING after it goes unanswered, the connection is
    dropped, and the retry is delivered on a new connection, with the same apns-id."""
    apns, server, alice, bobs = world
    warm = await alice.publish(9, [["p", bobs[0].pubkey]])
    await delivered_once(apns, server, bobs[:1], [warm])
    connections = apns.emulator._connections
    apns.emulator.disrupt("silent")
    ev = await alice.publish(9, [["p", bobs[1].pubkey]])
    (job,) = await delivered_once(apns, server, bobs[1:2], [ev], timeout=100)
    assert apns.emulator.disrupted >= 1 and apns.emulator._connections == connections + 1
    assert job["attempts"] == 2
    (record,) = apns.emulator.accepted(bobs[1].token)
    assert record.header("apns-id") == job["id"]
