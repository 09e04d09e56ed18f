"""Wake delivery end to end: real appliance process, real websockets, the HTTP/2 + TLS APNs emulator
(verifying every provider token) standing in for Apple (issue #8's test list)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid

import pytest

from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret, public_key
from appliance.transports.apns import APNS_BODY
from appliance.store.statement import SQL
from tests.conftest import Server
from tests.push.delivery_helpers import (
    TOPIC,
    Apns,
    Pusher,
    delivery_config,
    jobs,
    log_rows,
    token,
    wait_until,
)
from tests.push.e2e_helpers import db_rows

pytestmark = pytest.mark.anyio


def ehash(endpoint: str) -> str:
    return hashlib.sha256(endpoint.encode()).hexdigest()


def p_sub(user, cls="time_sensitive", **extra):
    return {"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": cls, **extra}


@pytest.fixture(scope="module")
def apns(tmp_path_factory):
    a = Apns(tmp_path_factory.mktemp("apns")).start()
    yield a
    a.stop()


@pytest.fixture(scope="module")
def server(apns, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("deliver") / "data", config=delivery_config(apns)).start()
    yield s
    s.stop()


@pytest.fixture
async def users(server):
    opened = []

    async def make() -> Pusher:
        p = await Pusher.connect(server)
        opened.append(p)
        return p

    yield make
    for p in opened:
        await p.client.close()


def requests_for(apns, endpoint):
    return apns.emulator.requests(endpoint)


async def test_one_push_for_two_matching_subscriptions_with_the_highest_class(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[
        {"filter": {"kinds": [9], "authors": [alice.pubkey]}, "class": "default"},
        p_sub(bob, "time_sensitive"),
    ])
    ev = await alice.publish(9, [["p", bob.pubkey]])
    recs = apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
    await asyncio.sleep(0.3)  # a second request, if any, would have come by now
    (rec,) = requests_for(apns, tok)
    assert rec.status == 200 and rec.body == APNS_BODY
    (job,) = jobs(server, event_id=ev.id)
    assert (job["class"], job["lease_pubkey"], job["endpoint_hash"]) == ("time_sensitive", bob.pubkey, ehash(tok))
    assert rec.header("apns-id") == job["id"]
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered")
    (row,) = [r for r in log_rows(server) if r["job_id"] == job["id"]]
    assert (row["outcome"], row["status"], row["class"], row["attempt"]) == ("accepted", 200, "time_sensitive", 1)
    # The log never holds the endpoint token, the full lease address, or the event.
    flat = json.dumps(log_rows(server))
    assert tok not in flat and bob.pubkey not in flat and ev.id not in flat and "hi" not in flat.split('"detail"')[0]
    assert recs


async def test_headers_are_exactly_the_fixed_set(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    ev = await alice.publish(9, [["p", bob.pubkey]], content="secret words")
    apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
    (rec,) = requests_for(apns, tok)
    (job,) = jobs(server, event_id=ev.id)
    headers = dict(rec.headers)
    assert set(headers) == {"authorization", "apns-push-type", "apns-priority", "apns-topic", "apns-id",
                            "apns-expiration", "content-length"}
    assert (headers["apns-push-type"], headers["apns-priority"], headers["apns-topic"]) == ("alert", "10", TOPIC)
    assert headers["apns-id"] == job["id"] and uuid.UUID(job["id"]).version == 7  # time-ordered (store/wakes.py)
    # apns-expiration: the job's useful age (an hour by default), nothing from the lease.
    assert 3500 < int(headers["apns-expiration"]) - time.time() <= 3600
    assert rec.path == f"/3/device/{tok}" and rec.body == APNS_BODY
    assert b"secret" not in rec.body and ev.id not in str(rec.headers)


async def test_the_authors_own_events_never_wake_the_author(server, apns, users):
    bob = await users()
    tok = token()
    await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "authors": [bob.pubkey]}, "class": "default"},
                                        p_sub(bob)])
    ev = await bob.publish(9, [["p", bob.pubkey]])
    assert jobs(server, event_id=ev.id) == []


async def test_suppression_by_ignore_and_p_tags_max(server, apns, users):
    alice, bob, carol = await users(), await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[p_sub(bob, ignore=[{"kinds": [9], "authors": [carol.pubkey]}],
                                              suppress={"p_tags_max": 3})])
    others = [["p", public_key(generate_secret())] for _ in range(3)]
    ignored = await carol.publish(9, [["p", bob.pubkey]])
    hellthread = await alice.publish(9, [["p", bob.pubkey], *others])  # 4 p tags > 3
    fine = await alice.publish(9, [["p", bob.pubkey], *others[:2]])  # 3 p tags
    assert jobs(server, event_id=ignored.id) == [] and jobs(server, event_id=hellthread.id) == []
    assert len(jobs(server, event_id=fine.id)) == 1
    apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
    await asyncio.sleep(0.3)
    assert len(requests_for(apns, tok)) == 1


async def test_a_class_not_eligible_for_the_kind_wakes_nothing(server, apns, users):
    """urgent is allowed for kind 9 only (urgent_kinds = [9]); on kind 7 it would be ineligible."""
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "urgent"}])
    ev = await alice.publish(9, [["p", bob.pubkey]])
    (job,) = jobs(server, event_id=ev.id)
    assert job["class"] == "urgent"


async def test_gift_wraps_wake_only_their_outer_recipient(server, apns, users):
    bob, carol, dave = await users(), await users(), await users()
    wrapper = generate_secret()
    tb, tc, td = token(), token(), token()
    await bob.lease(tb, subscriptions=[{"filter": {"kinds": [1059], "#p": [bob.pubkey]}, "class": "default"}])
    await carol.lease(tc, subscriptions=[{"filter": {"kinds": [1059], "#p": [carol.pubkey]}, "class": "default"}])
    # dave names the wrap's (one-time) signer: a match by envelope, but he is no recipient.
    await dave.lease(td, subscriptions=[{"filter": {"kinds": [1059], "authors": [public_key(wrapper)]},
                                         "class": "default"}])
    # The inner rumor would name carol; the executor never opens it.
    wrap = sign_event(wrapper, 1059, [["p", bob.pubkey]], f"nip44-ciphertext-mentioning-{carol.pubkey}")
    ok, msg = await bob.client.publish(wrap)
    assert ok, msg
    (job,) = jobs(server, event_id=wrap.id)
    assert job["lease_pubkey"] == bob.pubkey and job["endpoint_hash"] == ehash(tb)
    apns.emulator.wait_for(lambda r: any(x.token == tb for x in r))
    assert requests_for(apns, tc) == [] and requests_for(apns, td) == []


async def test_no_wake_after_expiry_tombstone_or_newer_generation(server, apns, users):
    alice, bob, carol, dave = await users(), await users(), await users(), await users()
    t_exp, t_tomb, t_old, t_new = token(), token(), token(), token()
    await bob.lease(t_exp, ttl=2, subscriptions=[p_sub(bob)])
    await carol.lease(t_tomb, subscriptions=[p_sub(carol)])
    await carol.revoke(generation=2)
    await dave.lease(t_old, generation=1, subscriptions=[p_sub(dave)])
    await dave.lease(t_new, generation=2, subscriptions=[p_sub(dave)])
    await asyncio.sleep(2.2)  # bob's lease expires
    e1 = await alice.publish(9, [["p", bob.pubkey]])
    e2 = await alice.publish(9, [["p", carol.pubkey]])
    e3 = await alice.publish(9, [["p", dave.pubkey]])
    assert jobs(server, event_id=e1.id) == [] and jobs(server, event_id=e2.id) == []
    (job,) = jobs(server, event_id=e3.id)
    assert (job["endpoint_hash"], job["generation"]) == (ehash(t_new), 2)
    apns.emulator.wait_for(lambda r: any(x.token == t_new for x in r))
    assert requests_for(apns, t_exp) == requests_for(apns, t_tomb) == requests_for(apns, t_old) == []


async def test_a_revocation_cancels_undelivered_wakes(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=30, times=1)
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    ev = await alice.publish(9, [["p", bob.pubkey]])
    apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "pending")
    await bob.revoke(generation=2)
    (job,) = jobs(server, event_id=ev.id)
    assert (job["state"], job["last_error"]) == ("cancelled", "lease revoked")


async def test_410_disables_the_generation_and_a_new_generation_reenables(server, apns, users):
    alice, bob = await users(), await users()
    dead, fresh = token(), token()
    sibling = token()
    await bob.lease(dead, generation=1, subscriptions=[p_sub(bob)])
    await bob.lease(sibling, d="other-install", subscriptions=[p_sub(bob)])  # another installation
    apns.emulator.unregister(dead)
    e1 = await alice.publish(9, [["p", bob.pubkey]])
    await wait_until(lambda: {j["state"] for j in jobs(server, event_id=e1.id)} == {"invalidated", "delivered"})
    assert [r for r in db_rows(server.data_dir, SQL("SELECT generation, invalidated_at IS NOT NULL FROM leases "
                                                    "WHERE pubkey = ? ORDER BY d",
                                                    "SELECT generation, invalidated_at IS NOT NULL FROM leases "
                                                    "WHERE pubkey = %s ORDER BY d"), (bob.pubkey,))] == [(1, 1), (1, 0)]
    # No more wakes for that generation; the sibling installation is untouched.
    e2 = await alice.publish(9, [["p", bob.pubkey]])
    (j2,) = jobs(server, event_id=e2.id)
    assert j2["endpoint_hash"] == ehash(sibling)
    assert len(requests_for(apns, dead)) == 1
    # The token rotated: a newer generation at the same address re-enables delivery.
    await bob.lease(fresh, generation=2, subscriptions=[p_sub(bob)])
    e3 = await alice.publish(9, [["p", bob.pubkey]])
    assert {j["endpoint_hash"] for j in jobs(server, event_id=e3.id)} == {ehash(fresh), ehash(sibling)}
    apns.emulator.wait_for(lambda r: any(x.token == fresh and x.status == 200 for x in r))
    outcomes = [(r["outcome"], r["status"], r["reason"]) for r in log_rows(server)
                if r["job_id"] in {j["id"] for j in jobs(server, event_id=e1.id)}]
    assert ("invalid_endpoint", 410, "Unregistered") in outcomes


@pytest.mark.parametrize("status,reason", [(503, "ServiceUnavailable"), (429, "TooManyRequests")])
async def test_transient_answers_are_retried_with_the_same_apns_id(server, apns, users, status, reason):
    alice, bob = await users(), await users()
    tok = token()
    apns.emulator.behave(tok, status, reason, times=2)
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    ev = await alice.publish(9, [["p", bob.pubkey]])
    recs = apns.emulator.wait_for(lambda r: any(x.token == tok and x.status == 200 for x in r))
    mine = [r for r in recs if r.token == tok]
    assert [r.status for r in mine] == [status, status, 200]
    (job,) = jobs(server, event_id=ev.id)
    assert {r.header("apns-id") for r in mine} == {job["id"]}
    assert len({r.header("apns-expiration") for r in mine}) == 1
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered")
    assert jobs(server, event_id=ev.id)[0]["attempts"] == 3
    assert [r["attempt"] for r in log_rows(server) if r["job_id"] == job["id"]] == [1, 2, 3]


async def test_retry_after_is_honoured(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=2, times=1)
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    await alice.publish(9, [["p", bob.pubkey]])
    recs = apns.emulator.wait_for(lambda r: sum(x.token == tok for x in r) == 2, timeout=15)
    first, second = [r for r in recs if r.token == tok]
    assert second.at - first.at >= 1.9  # not the 0.2 s backoff: the provider's 2 s


async def test_expired_provider_token_is_refreshed_once(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    await alice.publish(9, [["p", bob.pubkey]])  # a provider token in use (also when run alone)
    apns.emulator.wait_for(lambda r: any(x.token == tok and x.status == 200 for x in r))
    apns.emulator.expire_provider_tokens()
    ev = await alice.publish(9, [["p", bob.pubkey]])
    recs = apns.emulator.wait_for(lambda r: sum(x.token == tok and x.status == 200 for x in r) == 2)
    mine = [r for r in recs if r.token == tok][1:]
    assert [(r.status, r.reason) for r in mine] == [(403, "ExpiredProviderToken"), (200, None)]
    assert mine[0].jwt != mine[1].jwt and mine[0].header("apns-id") == mine[1].header("apns-id")
    # The delivery log row of that attempt tells the refused request too.
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered")
    (row,) = [r for r in log_rows(server) if r["job_id"] == jobs(server, event_id=ev.id)[0]["id"]]
    assert row["outcome"] == "accepted" and "after 403 ExpiredProviderToken" in row["detail"]


async def test_private_group_removal_stops_wakes_at_match_and_at_delivery(server, apns, users):
    admin, bob = await users(), await users()
    h = str(uuid.uuid4())
    assert (await admin.client.publish(sign_event(admin.user.secret, 9007, [["h", h]], "")))[0]
    assert (await admin.client.publish(sign_event(admin.user.secret, 9002, [["h", h], ["private"]], "")))[0]
    assert (await admin.client.publish(sign_event(admin.user.secret, 9000, [["h", h], ["p", bob.pubkey]], "")))[0]
    tok = token()
    await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#h": [h]}, "class": "default"}])
    # A member: woken.
    e1 = await admin.publish(9, [["h", h]])
    apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
    assert len(jobs(server, event_id=e1.id)) == 1
    # Removed after leasing: not even a job.
    assert (await admin.client.publish(sign_event(admin.user.secret, 9001, [["h", h], ["p", bob.pubkey]], "")))[0]
    e2 = await admin.publish(9, [["h", h]])
    assert jobs(server, event_id=e2.id) == []
    # Removed after the job was created: the re-check before the next attempt drops it.
    # (Content differs from the first add: the same event twice in one second is one event.)
    assert (await admin.client.publish(sign_event(admin.user.secret, 9000, [["h", h], ["p", bob.pubkey]], "again")))[0]
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=2, times=1)
    e3 = await admin.publish(9, [["h", h]])
    await wait_until(lambda: (j := jobs(server, event_id=e3.id)) and j[0]["state"] == "pending"
                     and j[0]["attempts"] == 1)
    assert (await admin.client.publish(sign_event(admin.user.secret, 9001, [["h", h], ["p", bob.pubkey]], "again")))[0]
    await wait_until(lambda: jobs(server, event_id=e3.id)[0]["state"] == "dropped", timeout=15)
    assert jobs(server, event_id=e3.id)[0]["last_error"] == "event not readable by the lease author"
    assert [r.status for r in requests_for(apns, tok)] == [200, 503]


async def test_a_deleted_event_is_not_woken_for(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=2, times=1)
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["attempts"] == 1)
    await alice.publish(5, [["e", ev.id]])  # NIP-09: the author deletes it
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "dropped", timeout=15)
    assert len(requests_for(apns, tok)) == 1
