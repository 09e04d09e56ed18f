"""POST /v1/deliveries/apns end to end: `appliance serve` with the gateway, the APNs emulator (HTTP/2 +
TLS, verifying provider tokens) behind it, relays signing NIP-98 with their keys."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

import pytest

from appliance.nostr.nip98 import make_http_auth
from appliance.transports.apns import APNS_BODY
from appliance.store.statement import SQL
from tests.conftest import ROOT
from tests.gateway.conftest import QUOTA, Relay
from tests.pg import db_rows, process_env
from tests.gateway.helpers import TOPIC, token

pytestmark = pytest.mark.anyio



def headers_of(record) -> dict:
    return {k: v for k, v in record.headers if not k.startswith(":")}


async def test_accepted_delivery_sends_the_constant_body_once(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    rid = str(uuid.uuid4())
    exp = int(time.time()) + 120
    r = await ctx.deliver(relay, inst.grants[relay.pubkey], request_id=rid, expires_at=exp)
    assert (r.status_code, r.json(), r.headers["content-type"]) == (200, {"status": "accepted"}, "application/json")
    [rec] = ctx.recs(inst.endpoint, 1)
    assert rec.body == APNS_BODY and rec.status == 200 and rec.path == f"/3/device/{inst.endpoint}"
    h = headers_of(rec)
    assert (h["apns-id"], h["apns-topic"], h["apns-push-type"], h["apns-priority"], h["apns-expiration"]) == \
        (rid, TOPIC, "alert", "10", str(exp))
    assert set(h) == {"authorization", "apns-push-type", "apns-priority", "apns-topic", "apns-id",
                      "apns-expiration", "content-length"}
    # The same request id again, with a fresh NIP-98 event: terminal, refused, nothing sent.
    r = await ctx.deliver(relay, inst.grants[relay.pubkey], request_id=rid)
    assert (r.status_code, r.json()) == (404, {"error": "invalid_grant"})
    ctx.recs(inst.endpoint, 1)


async def test_apns_expiration_is_capped_by_the_gateway(ctx):
    relay = Relay()
    inst = await ctx.installation(relay, lifetime=7200)
    t = int(time.time())
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey], expires_at=t + 7000)).status_code == 200
    [rec] = ctx.recs(inst.endpoint, 1)
    assert t + 3600 <= int(headers_of(rec)["apns-expiration"]) <= int(time.time()) + 3600


async def test_replayed_nip98_event_is_refused(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    body = ctx.body(inst.grants[relay.pubkey])
    auth = make_http_auth(relay.secret, ctx.url, "POST", body)
    assert (await ctx.post(body, auth)).status_code == 200
    r = await ctx.post(body, auth)
    assert (r.status_code, r.json()) == (404, {"error": "invalid_grant"})
    # Burned even when the delivery was refused: a refused event cannot be replayed later either.
    bad = ctx.body("nokey.AAAA")
    bad_auth = make_http_auth(relay.secret, ctx.url, "POST", bad)
    assert (await ctx.post(bad, bad_auth)).status_code == 404
    ctx.recs(inst.endpoint, 1)


async def test_invalid_auth(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    body = ctx.body(inst.grants[relay.pubkey])
    other = ctx.body(inst.grants[relay.pubkey])
    cases = {
        "absent": None,
        "not nostr": "Bearer x",
        "garbage": "Nostr !!!",
        "other URL": make_http_auth(relay.secret, ctx.base + "/v1/deliveries/apns/", "POST", body),
        "other host": make_http_auth(relay.secret, "https://push.example.org/v1/deliveries/apns", "POST", body),
        "GET": make_http_auth(relay.secret, ctx.url, "GET", body),
        "payload of another body": make_http_auth(relay.secret, ctx.url, "POST", other),
        "no payload": make_http_auth(relay.secret, ctx.url, "POST", None),
        "old": make_http_auth(relay.secret, ctx.url, "POST", body, created_at=int(time.time()) - 120),
        "future": make_http_auth(relay.secret, ctx.url, "POST", body, created_at=int(time.time()) + 120),
    }
    for name, auth in cases.items():
        r = await ctx.post(body, auth)
        assert (r.status_code, r.json()) == (401, {"error": "invalid_auth"}), name
    # A broken signature.
    import base64

    good = make_http_auth(relay.secret, ctx.url, "POST", body)
    ev = json.loads(base64.b64decode(good.split(" ", 1)[1]))
    ev["sig"] = ("0" if ev["sig"][0] != "0" else "1") + ev["sig"][1:]
    r = await ctx.post(body, "Nostr " + base64.b64encode(json.dumps(ev).encode()).decode())
    assert (r.status_code, r.json()) == (401, {"error": "invalid_auth"})
    # A malformed body is 400 before any authorization is looked at.
    r = await ctx.post(b'{"v":1}', None)
    assert (r.status_code, r.json()) == (400, {"error": "invalid_request"})
    assert ctx.emu.requests(inst.endpoint) == []


async def test_a_grant_that_is_not_unicode_text_is_an_invalid_request(ctx):
    # JSON can spell a lone surrogate ("\\ud800"); it is no Unicode text, so no grant: 400, not a 503.
    relay = Relay()
    rid = str(uuid.uuid4())
    for grant in (b"\\ud800", b"g20250101abcdef.\\udfff", b"\\ud83d"):
        body = b'{"v":1,"endpoint_grant":"%s","request_id":"%s","expires_at":%d}' % (
            grant, rid.encode(), int(time.time()) + 60)
        r = await ctx.post(body, make_http_auth(relay.secret, ctx.url, "POST", body))
        assert (r.status_code, r.json()) == (400, {"error": "invalid_request"}), grant


async def test_wrong_signer_tampered_grant_and_times(ctx):
    relay, intruder = Relay(), Relay()
    inst = await ctx.installation(relay, lifetime=600)
    grant = inst.grants[relay.pubkey]
    now = int(time.time())
    for r in (
        await ctx.deliver(intruder, grant),                                # signed by another relay
        await ctx.deliver(relay, grant[:-2] + ("AA" if grant[-2:] != "AA" else "BA")),  # tampered
        await ctx.deliver(relay, "x" + grant),                             # unknown key id
        await ctx.deliver(relay, grant, expires_at=now - 1),               # request already expired
        await ctx.deliver(relay, grant, expires_at=now + 700),             # outlives the grant
    ):
        assert (r.status_code, r.json()) == (404, {"error": "invalid_grant"})
    assert ctx.emu.requests(inst.endpoint) == []
    assert (await ctx.deliver(relay, grant)).status_code == 200


async def test_expired_grant(ctx):
    relay = Relay()
    now = int(time.time())
    inst = await ctx.installation(relay, not_before=now - 10, expires_at=now + 2)
    grant = inst.grants[relay.pubkey]
    deadline = time.monotonic() + 10
    while int(time.time()) <= now + 2:  # wait for the wall clock to pass the grant's expiry
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    r = await ctx.deliver(relay, grant, expires_at=now + 2)
    assert (r.status_code, r.json()) == (404, {"error": "invalid_grant"})
    assert ctx.emu.requests(inst.endpoint) == []


async def test_rotation_and_both_revocations(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    old_grant, old_token = inst.grants[relay.pubkey], inst.endpoint
    assert (await ctx.deliver(relay, old_grant)).status_code == 200
    assert (await inst.rotate(token())).status_code == 200
    assert (await ctx.deliver(relay, old_grant)).status_code == 404  # every grant of the old epoch
    assert (await inst.delegate(relay.pubkey, 2)).status_code == 201
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey])).status_code == 200
    ctx.recs(old_token, 1), ctx.recs(inst.endpoint, 1)
    # Delegation revocation, then a new generation.
    assert (await inst.revoke_delegation(relay.pubkey, 2)).status_code == 200
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey])).status_code == 404
    assert (await inst.delegate(relay.pubkey, 3)).status_code == 201
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey])).status_code == 200
    # Installation revocation: every delegation dies with it.
    other = Relay()
    assert (await inst.delegate(other.pubkey, 1)).status_code == 201
    assert (await inst.revoke()).status_code == 200
    for rel in (relay, other):
        r = await ctx.deliver(rel, inst.grants[rel.pubkey])
        assert (r.status_code, r.json()) == (404, {"error": "invalid_grant"})
    ctx.recs(inst.endpoint, 2)


async def test_send_begin_orders_against_revocation(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    ctx.emu.behave(inst.endpoint, delay=1.5, times=1)  # the admitted send takes a while at "Apple"
    grant = inst.grants[relay.pubkey]
    rid = str(uuid.uuid4())
    delivery = asyncio.ensure_future(ctx.deliver(relay, grant, request_id=rid))
    deadline = time.monotonic() + 10
    while not db_rows(ctx.server.data_dir, SQL("SELECT 1 FROM gateway_reservations WHERE request_id = ?",
                                               "SELECT 1 FROM gateway_reservations WHERE request_id = %s"), (rid,)):
        assert time.monotonic() < deadline  # wait for send-begin (the reservation's commit)
        await asyncio.sleep(0.02)
    assert not delivery.done()
    assert (await inst.revoke()).status_code == 200  # commits while the admitted send is in flight
    assert not delivery.done()
    r = await delivery
    assert (r.status_code, r.json()) == (200, {"status": "accepted"})  # a send admitted first may finish
    assert (await ctx.deliver(relay, grant)).status_code == 404  # nothing after the revocation commit
    ctx.recs(inst.endpoint, 1)


async def test_provider_outcomes_and_reservations(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    grant = inst.grants[relay.pubkey]
    emu, tok = ctx.emu, inst.endpoint

    # Transient with Retry-After: released, the same job may retry with a fresh NIP-98 event.
    rid = str(uuid.uuid4())
    emu.behave(tok, 503, "ServiceUnavailable", retry_after=7, times=1)
    r = await ctx.deliver(relay, grant, request_id=rid)
    assert (r.status_code, r.json()) == (503, {"status": "retry", "retry_after_seconds": 7})
    emu.behave(tok, 429, "TooManyRequests", times=1)
    r = await ctx.deliver(relay, grant, request_id=rid)
    assert (r.status_code, r.json()) == (503, {"status": "retry", "retry_after_seconds": None})
    assert (await ctx.deliver(relay, grant, request_id=rid)).status_code == 200
    assert [headers_of(x)["apns-id"] for x in ctx.recs(tok, 3)] == [rid] * 3

    # Configuration fault: released too.
    rid = str(uuid.uuid4())
    emu.behave(tok, 403, "InvalidProviderToken", times=1)
    r = await ctx.deliver(relay, grant, request_id=rid)
    assert (r.status_code, r.json()) == (503, {"error": "configuration_fault"})
    assert (await ctx.deliver(relay, grant, request_id=rid)).status_code == 200

    # A permanent request fault reached the provider: terminal.
    rid = str(uuid.uuid4())
    emu.behave(tok, 400, "BadExpirationDate", times=1)
    r = await ctx.deliver(relay, grant, request_id=rid)
    assert (r.status_code, r.json()) == (400, {"error": "invalid_request"})
    assert (await ctx.deliver(relay, grant, request_id=rid)).status_code == 404
    assert all(x.body == APNS_BODY for x in ctx.recs(tok, 6))


async def test_invalid_endpoint_carries_the_grant_generation(ctx):
    relay = Relay()
    inst = await ctx.installation(relay, generation=7)
    ctx.emu.unregister(inst.endpoint, at=1_700_000_000.5)
    rid = str(uuid.uuid4())
    r = await ctx.deliver(relay, inst.grants[relay.pubkey], request_id=rid)
    assert (r.status_code, r.json()) == (410, {"status": "invalid_endpoint", "generation": 7,
                                               "invalid_at": 1_700_000_000})
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey], request_id=rid)).status_code == 404  # terminal


async def test_expired_provider_token_is_refreshed_once(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey])).status_code == 200  # a token in use
    ctx.emu.expire_provider_tokens()
    rid = str(uuid.uuid4())
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey], request_id=rid)).status_code == 200
    attempts = [x for x in ctx.recs(inst.endpoint, 3) if headers_of(x)["apns-id"] == rid]
    assert [(x.status, x.reason) for x in attempts] == [(403, "ExpiredProviderToken"), (200, None)]
    assert attempts[0].jwt != attempts[1].jwt and attempts[0].body == attempts[1].body == APNS_BODY


async def test_endpoint_quota(ctx):
    relay, second = Relay(), Relay()
    inst = await ctx.installation(relay)
    assert (await inst.delegate(second.pubkey, 1)).status_code == 201
    ctx.emu.behave(inst.endpoint, 503, "ServiceUnavailable", times=2)
    answers = [(await ctx.deliver(relay, inst.grants[relay.pubkey])).status_code for _ in range(4)]
    answers += [(await ctx.deliver(second, inst.grants[second.pubkey])).status_code for _ in range(3)]
    # Six attempts per endpoint per window, transient ones included (never refunded), shared by relays.
    assert answers == [503, 503, 200, 200, 200, 200, 404]
    ctx.recs(inst.endpoint, QUOTA)


async def test_grant_key_rotation_keeps_old_grants(ctx):
    relay = Relay()
    inst = await ctx.installation(relay)
    old = inst.grants[relay.pubkey]
    p = subprocess.run([sys.executable, "-m", "appliance", "gateway", "keys", "rotate", "--data-dir",
                        str(ctx.server.data_dir)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env=process_env(data_dir=ctx.server.data_dir))
    assert p.returncode == 0, p.stderr
    new_id = json.loads(p.stdout)["id"]
    deadline = time.monotonic() + 10
    generation = 10
    while True:  # the running appliance picks the rotation up within a second
        generation += 1  # each delegation's generation above the last (a clock-derived one wrapped)
        assert (await inst.delegate(relay.pubkey, generation)).status_code == 201
        if inst.grants[relay.pubkey].startswith(new_id + "."):
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    assert not old.startswith(new_id + ".")
    # The newest grant works; the old grant's generation is superseded (not its key).
    assert (await ctx.deliver(relay, inst.grants[relay.pubkey])).status_code == 200
    other = Relay()
    inst2 = await ctx.installation(other)
    assert inst2.grants[other.pubkey].startswith(new_id + ".")


async def test_old_key_grant_still_opens_after_rotation(ctx, tmp_path):
    relay = Relay()
    inst = await ctx.installation(relay)
    grant = inst.grants[relay.pubkey]
    p = subprocess.run([sys.executable, "-m", "appliance", "gateway", "keys", "rotate", "--data-dir",
                        str(ctx.server.data_dir)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env=process_env(data_dir=ctx.server.data_dir))
    assert p.returncode == 0, p.stderr
    await ctx.server.caught_up()  # the rotation, applied by the reload loop
    other = Relay()
    inst2 = await ctx.installation(other)
    assert inst2.grants[other.pubkey].split(".")[0] != grant.split(".")[0]  # sealed by the new key
    assert (await ctx.deliver(relay, grant)).status_code == 200  # the predecessor still opens it
