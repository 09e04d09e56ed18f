"""Wake authorization end to end, between the match and the attempt: what changes after a wake job
was written (the lease author banned, the event replaced or expired, the lease expired or replaced)
drops the wake before any provider request; read authorization never crosses origins (issue #8,
NIP-PL "Matching Semantics and Tenant Isolation", "Lease and Key Lifecycle")."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest

from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret, public_key
from appliance.nostr.nip98 import make_http_auth
from tests.conftest import Server
from tests.push.delivery_helpers import Apns, Pusher, jobs, log_rows, token, wait_until
from tests.push.e2e_helpers import ANDROID, ORIGIN

pytestmark = pytest.mark.anyio

OTHER = "ws://other.test"
ADMIN = generate_secret()


def p_sub(user, kinds=(9,), cls="default"):
    return {"filter": {"kinds": list(kinds), "#p": [user.pubkey]}, "class": cls}


def config(apns: Apns) -> str:
    push = (f'app_profiles = [{apns.profile()}, {{ id = "{ANDROID}", transport = "fcm" }}], '
            'push_kinds = [9, 1059, 7, 30023], urgent_kinds = [9], '
            'class_support = { apns = ["silent", "default", "time_sensitive", "urgent"], fcm = ["silent"] }')
    return "\n".join([
        f'public_url = "{ORIGIN}"',
        "wake_min_interval = 0", "wake_retry_delay = 0.2", "purge_interval = 3600",
        f'admin_pubkeys = ["{public_key(ADMIN)}"]',
        "[push]",
        f"app_profiles = [{apns.profile()}]",
        "push_kinds = [9, 1059, 7, 30023]",
        "urgent_kinds = [9]",
        'class_support = { apns = ["silent", "default", "time_sensitive", "urgent"] }',
        "[[origins]]",
        f'origin = "{OTHER}"',
        'hosts = ["other.test"]',
        f"push = {{ {push} }}",
    ]) + "\n"


@pytest.fixture(scope="module")
def apns(tmp_path_factory):
    a = Apns(tmp_path_factory.mktemp("apns")).start()
    yield a
    a.stop()


@pytest.fixture(scope="module")
def server(apns, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("authz") / "data", config=config(apns)).start()
    yield s
    s.stop()


@pytest.fixture
async def users(server):
    opened = []

    async def make(origin: str = ORIGIN, host: str = "push.test", user=None) -> Pusher:
        p = await Pusher.connect(server, origin, host=host, user=user)
        opened.append(p)
        return p

    yield make
    for p in opened:
        await p.client.close()


async def nip86(server: Server, method: str, *params) -> dict:
    body = json.dumps({"method": method, "params": list(params)}).encode()
    headers = {"Content-Type": "application/nostr+json+rpc", "Host": "push.test",
               "Authorization": make_http_auth(ADMIN, ORIGIN, "POST", body)}
    async with httpx.AsyncClient() as c:
        r = await c.post(server.http + "/", content=body, headers=headers)
    assert r.status_code == 200 and r.json().get("result") is not None, r.text
    return r.json()


async def first_attempt_failed(server, apns, ev, tok) -> dict:
    """Wait until the wake's first attempt was answered 503 and the job waits for its retry."""
    await wait_until(lambda: (j := jobs(server, event_id=ev.id)) and j[0]["state"] == "pending"
                     and j[0]["attempts"] == 1)
    assert [r.status for r in apns.emulator.requests(tok)] == [503]
    return jobs(server, event_id=ev.id)[0]


async def dropped(server, apns, ev, tok, reason: str) -> None:
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] in ("dropped", "cancelled"), timeout=15)
    job = jobs(server, event_id=ev.id)[0]
    assert job["last_error"] == reason, job
    await asyncio.sleep(0.3)
    assert [r.status for r in apns.emulator.requests(tok)] == [503]  # no second attempt


@pytest.mark.slow
async def test_a_banned_lease_author_is_woken_no_more(server, apns, users):
    alice, bob, carol = await users(), await users(), await users()
    tb, tc = token(), token()
    await bob.lease(tb, subscriptions=[p_sub(bob)])
    await carol.lease(tc, subscriptions=[p_sub(carol)])
    # A wake for carol is written and waits for its retry; then the operator bans her.
    apns.emulator.behave(tc, 503, "ServiceUnavailable", retry_after=2, times=1)
    e1 = await alice.publish(9, [["p", carol.pubkey]])
    await first_attempt_failed(server, apns, e1, tc)
    await nip86(server, "banpubkey", carol.pubkey, "spam")
    await dropped(server, apns, e1, tc, "event not readable by the lease author")
    # Banned before the event: not even a job.
    await nip86(server, "banpubkey", bob.pubkey, "spam")
    e2 = await alice.publish(9, [["p", bob.pubkey]])
    assert jobs(server, event_id=e2.id) == []
    await asyncio.sleep(0.3)
    assert apns.emulator.requests(tb) == []


async def test_a_replaced_event_is_not_woken_for(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[p_sub(bob, kinds=(30023,))])
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=2, times=1)
    now = int(time.time())
    old = sign_event(alice.user.secret, 30023, [["d", "post"], ["p", bob.pubkey]], "draft", created_at=now - 5)
    assert (await alice.client.publish(old))[0]
    await first_attempt_failed(server, apns, old, tok)
    # The newer version no longer mentions bob: the old one is gone, its wake with it.
    new = sign_event(alice.user.secret, 30023, [["d", "post"]], "final", created_at=now)
    assert (await alice.client.publish(new))[0]
    await dropped(server, apns, old, tok, "event not readable by the lease author")


async def test_an_event_expiring_before_the_attempt_is_not_woken_for(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    # Readable for the first attempt however busy the machine (from the expiration's whole second,
    # + 2 left as little as one), expired by the retry.
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=5, times=1)
    ev = await alice.publish(9, [["p", bob.pubkey], ["expiration", str(int(time.time()) + 4)]])
    await first_attempt_failed(server, apns, ev, tok)
    await dropped(server, apns, ev, tok, "event not readable by the lease author")


async def test_a_lease_expiring_before_the_attempt_wakes_nothing(server, apns, users):
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, ttl=5, subscriptions=[p_sub(bob)])  # alive for the first attempt, not the retry
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=6, times=1)
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await first_attempt_failed(server, apns, ev, tok)
    await dropped(server, apns, ev, tok, "lease expired")


async def test_a_newer_generation_before_the_attempt_cancels_the_wake(server, apns, users):
    alice, bob = await users(), await users()
    old, new = token(), token()
    await bob.lease(old, generation=1, subscriptions=[p_sub(bob)])
    apns.emulator.behave(old, 503, "ServiceUnavailable", retry_after=2, times=1)
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await first_attempt_failed(server, apns, ev, old)
    await bob.lease(new, generation=2, subscriptions=[p_sub(bob)])  # the token rotated
    await dropped(server, apns, ev, old, "lease replaced by a newer generation")
    await asyncio.sleep(2.2)
    assert apns.emulator.requests(new) == []  # a wake matched for generation 1 never goes to generation 2


async def test_group_membership_at_one_origin_never_authorizes_a_wake_at_another(server, apns, users):
    h = str(uuid.uuid4())
    admin_a, bob_a = await users(), await users()
    admin_b = await users(OTHER, "other.test")
    bob_b = await users(OTHER, "other.test", user=bob_a.user)
    # The same group id, private at both origins; bob is a member at A only.
    for admin, members in ((admin_a, [bob_a.pubkey]), (admin_b, [])):
        assert (await admin.client.publish(sign_event(admin.user.secret, 9007, [["h", h]], "")))[0]
        assert (await admin.client.publish(sign_event(admin.user.secret, 9002, [["h", h], ["private"]], "")))[0]
        for pk in members:
            assert (await admin.client.publish(sign_event(admin.user.secret, 9000, [["h", h], ["p", pk]], "")))[0]
    tok = token()
    await bob_b.lease(tok, d="at-b", subscriptions=[{"filter": {"kinds": [9], "#h": [h]}, "class": "default"}])
    ev_b = await admin_b.publish(9, [["h", h]])
    assert jobs(server, event_id=ev_b.id) == []
    # The same lease at A (its own d) is woken by A's group, where bob is a member.
    await bob_a.lease(tok, d="at-a", subscriptions=[{"filter": {"kinds": [9], "#h": [h]}, "class": "default"}])
    ev_a = await admin_a.publish(9, [["h", h]])
    (job,) = jobs(server, event_id=ev_a.id)
    assert job["lease_d"].startswith("at-a")
    apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
    await asyncio.sleep(0.3)
    assert len(apns.emulator.requests(tok)) == 1


async def test_a_coalesced_match_dropped_before_the_attempt_does_not_raise_the_wakes_class(server, apns, users):
    """The wake's class is the highest among the matches still eligible when it is sent."""
    alice, carol, bob = await users(), await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[
        p_sub(bob, cls="default"),
        {"filter": {"kinds": [9], "authors": [carol.pubkey], "#p": [bob.pubkey]}, "class": "time_sensitive"},
    ])
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=3, times=1)
    e1 = await alice.publish(9, [["p", bob.pubkey]])
    head = await first_attempt_failed(server, apns, e1, tok)
    e2 = await carol.publish(9, [["p", bob.pubkey]])  # joins the waiting wake, time_sensitive
    (member,) = jobs(server, event_id=e2.id)
    assert (member["state"], member["wake_id"], member["class"]) == ("coalesced", head["id"], "time_sensitive")
    await carol.publish(5, [["e", e2.id]])  # NIP-09: carol deletes it before the retry
    await wait_until(lambda: jobs(server, event_id=e1.id)[0]["state"] == "delivered", timeout=15)
    assert jobs(server, event_id=e2.id)[0]["last_error"] == "event not readable by the lease author"
    rows = [r for r in log_rows(server) if r["job_id"] == head["id"]]
    assert [(r["status"], r["class"]) for r in rows] == [(503, "default"), (200, "default")]


async def test_an_event_whose_author_is_banned_before_the_attempt_wakes_no_one(server, apns, users):
    """A ban refuses the author's new events (and closes the author's connections); what the author
    wrote before it wakes no one either (docs/spec-notes.md W15)."""
    alice, bob = await users(), await users()
    tok = token()
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    apns.emulator.behave(tok, 503, "ServiceUnavailable", retry_after=2, times=1)
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await first_attempt_failed(server, apns, ev, tok)
    await nip86(server, "banpubkey", alice.pubkey, "spam")
    await dropped(server, apns, ev, tok, "event not readable by the lease author")


@pytest.mark.slow
async def test_a_wake_waiting_for_a_busy_worker_is_rechecked_before_its_attempt(apns, tmp_path):
    """One delivery worker, held up by a slow provider answer: a wake claimed meanwhile waits for it,
    and a group removal committed while it waits drops it (the re-check is not the claim's, seconds
    old, but one made right before the attempt)."""
    server = Server(tmp_path / "data", config=config(apns).replace("wake_min_interval = 0",
                                                                   "wake_min_interval = 0\nwake_workers = 1")).start()
    opened = []
    try:
        async def user():
            p = await Pusher.connect(server, host="push.test")
            opened.append(p)
            return p

        admin, alice, bob, carol = await user(), await user(), await user(), await user()
        h = str(uuid.uuid4())
        assert (await admin.client.publish(sign_event(admin.user.secret, 9007, [["h", h]], "")))[0]
        assert (await admin.client.publish(sign_event(admin.user.secret, 9002, [["h", h], ["private"]], "")))[0]
        assert (await admin.client.publish(sign_event(admin.user.secret, 9000, [["h", h], ["p", bob.pubkey]], "")))[0]
        tb, tc = token(), token()
        await bob.lease(tb, subscriptions=[{"filter": {"kinds": [9], "#h": [h]}, "class": "default"}])
        await carol.lease(tc, subscriptions=[p_sub(carol)])
        apns.emulator.behave(tb, 503, "ServiceUnavailable", retry_after=2, times=1)
        e1 = await admin.publish(9, [["h", h]])
        await first_attempt_failed(server, apns, e1, tb)
        # The only worker is busy for 4 s with carol's wake while bob's retry falls due and is claimed.
        apns.emulator.behave(tc, None, delay=4, times=1)
        await alice.publish(9, [["p", carol.pubkey]])
        await wait_until(lambda: jobs(server, event_id=e1.id)[0]["state"] == "claimed", timeout=5)
        assert (await admin.client.publish(sign_event(admin.user.secret, 9001, [["h", h], ["p", bob.pubkey]], "")))[0]
        await dropped(server, apns, e1, tb, "event not readable by the lease author")
        assert len(apns.emulator.accepted(tc)) == 1
        # The worker goes on with the next wake.
        await alice.publish(9, [["p", carol.pubkey]])
        apns.emulator.wait_for(lambda r: sum(x.token == tc and x.status == 200 for x in r) == 2)
    finally:
        for p in opened:
            await p.client.close()
        server.stop()
