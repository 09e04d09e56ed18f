"""Wake outbox and APNs delivery, end to end: a replayed event wakes once; one provider token per
signing key, whatever the number of profiles, topics or connections using it (Apple throttles a key
whose token changes more often than every 20 minutes: 429 TooManyProviderTokenUpdates)."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import Server
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, jobs, token, wait_until
from tests.push.e2e_helpers import db_rows

pytestmark = pytest.mark.anyio

BETA = "com.example.app/ios-beta"
BETA_TOPIC = "com.example.app.beta"


def p_sub(user, cls="default"):
    return {"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": cls}


@pytest.fixture
def apns(tmp_path):
    a = Apns(tmp_path)
    a.emulator.token_update_interval = 20 * 60  # Apple's: a new token per key at most every 20 minutes
    a.emulator.add_topic(BETA_TOPIC)
    a.start()
    yield a
    a.stop()


async def test_a_replayed_event_creates_no_second_job_or_push(apns, tmp_path):
    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    try:
        alice, bob, mallory = (await Pusher.connect(server), await Pusher.connect(server),
                               await Pusher.connect(server))
        tok = token()
        await bob.lease(tok, subscriptions=[p_sub(bob)])
        ev = await alice.publish(9, [["p", bob.pubkey]])
        apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
        # The same event again: by its author, and replayed by someone else on another connection.
        for p in (alice, mallory):
            ok, msg = await p.client.publish(ev)
            assert ok and msg.startswith("duplicate:"), msg
        await asyncio.sleep(0.5)
        (job,) = jobs(server, event_id=ev.id)
        assert job["state"] == "delivered"
        assert len(apns.emulator.requests(tok)) == 1
        for p in (alice, bob, mallory):
            await p.client.close()
    finally:
        server.stop()


async def test_profiles_sharing_a_signing_key_share_one_provider_token(apns, tmp_path):
    """Two apps of one team (two topics, one .p8 key) at one origin: one JWT for both, so APNs never
    sees that key's token change within 20 minutes (Apple: one token for all of a team's apps)."""
    beta = apns.profile(BETA, topic=BETA_TOPIC)
    server = Server(tmp_path / "data", config=delivery_config(apns, profiles=[apns.profile(), beta])).start()
    try:
        alice, bob, carol = (await Pusher.connect(server), await Pusher.connect(server),
                             await Pusher.connect(server))
        t_ios, t_beta = token(), token()
        await bob.lease(t_ios, subscriptions=[p_sub(bob)])
        await carol.lease(t_beta, app_profile=BETA, subscriptions=[p_sub(carol)])
        await alice.publish(9, [["p", bob.pubkey]])
        apns.emulator.wait_for(lambda r: any(x.token == t_ios for x in r))
        await alice.publish(9, [["p", carol.pubkey]])
        apns.emulator.wait_for(lambda r: any(x.token == t_beta for x in r))
        recs = apns.emulator.requests()
        assert [(r.status, r.reason) for r in recs] == [(200, None), (200, None)], recs
        assert recs[0].header("apns-topic") != recs[1].header("apns-topic")
        assert recs[0].jwt == recs[1].jwt
        assert db_rows(server.data_dir, "SELECT reason FROM push_alerts") == []
        for p in (alice, bob, carol):
            await p.client.close()
    finally:
        server.stop()


@pytest.mark.slow
async def test_a_wake_waiting_for_a_worker_past_its_claim_is_sent_once(apns, tmp_path):
    """Every worker is held by a slow APNs answer longer than the visibility timeout: the wake
    queued behind them must not be claimed a second time and sent twice."""
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={
        "wake_workers": 2, "wake_visibility_timeout": 1})).start()
    try:
        alice = await Pusher.connect(server)
        slow = [await Pusher.connect(server) for _ in range(2)]
        bob = await Pusher.connect(server)
        slow_tokens = [token() for _ in slow]
        tok = token()
        for p, t in zip(slow, slow_tokens):
            apns.emulator.behave(t, delay=3, times=1)
            await p.lease(t, subscriptions=[p_sub(p)])
        await bob.lease(tok, subscriptions=[p_sub(bob)])
        for p in slow:
            await alice.publish(9, [["p", p.pubkey]])
        ev = await alice.publish(9, [["p", bob.pubkey]])
        await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered", timeout=20)
        await asyncio.sleep(1.0)
        (job,) = jobs(server, event_id=ev.id)
        assert [r.header("apns-id") for r in apns.emulator.requests(tok)] == [job["id"]]
        # The slow sends themselves outlived their claims: each went once too.
        await wait_until(lambda: all(len(apns.emulator.requests(t)) == 1 for t in slow_tokens), timeout=10)
        await asyncio.sleep(1.5)
        assert [len(apns.emulator.requests(t)) for t in slow_tokens] == [1, 1]
        for p in (alice, bob, *slow):
            await p.client.close()
    finally:
        server.stop()


@pytest.mark.slow
async def test_a_retry_keeps_to_the_per_endpoint_rate_cap(apns, tmp_path):
    """wake_min_interval is the least time between two requests to one device, retries included
    (a 429 TooManyRequests is Apple saying exactly that)."""
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={
        "wake_min_interval": 2, "wake_retry_delay": 0.1})).start()
    try:
        alice, bob = await Pusher.connect(server), await Pusher.connect(server)
        tok = token()
        apns.emulator.behave(tok, 429, "TooManyRequests", times=1)
        await bob.lease(tok, subscriptions=[p_sub(bob)])
        await alice.publish(9, [["p", bob.pubkey]])
        recs = apns.emulator.wait_for(lambda r: sum(x.token == tok for x in r) == 2, timeout=15)
        first, second = [r for r in recs if r.token == tok]
        assert (first.status, second.status) == (429, 200)
        assert second.at - first.at >= 1.9, second.at - first.at
        for p in (alice, bob):
            await p.client.close()
    finally:
        server.stop()
