"""End-to-end NIP-01/09/40/42/45 behaviour over real websockets against a real server process."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets

from tests.conftest import Client, Identity

pytestmark = pytest.mark.anyio


async def test_publish_then_query(server, alice, connect):
    c = await connect(server.url)
    ev = alice.sign(1, [["t", "hello"]], "hi")
    assert await c.publish(ev) == (True, "")
    events, closed = await c.req("s", {"authors": [alice.pubkey]})
    assert closed is None
    assert [e["id"] for e in events] == [ev.id]
    assert events[0] == ev.to_dict()
    # NIP-01: a duplicate is accepted (already stored) and stored once.
    assert await c.publish(ev) == (True, "duplicate: already have this event")
    events, _ = await c.req("t", {"#t": ["hello"]})
    assert len(events) == 1
    await c.close()


async def test_bad_signature_and_bad_id(server, alice, connect):
    c = await connect(server.url)
    ev = alice.sign(1, [], "x").to_dict()
    forged = dict(ev, sig="0" * 128)
    ok, msg = await c.publish(forged)
    assert not ok and msg.startswith("invalid:")
    tampered = dict(ev, content="y")
    ok, msg = await c.publish(tampered)
    assert not ok and msg.startswith("invalid:")
    events, _ = await c.req("s", {"authors": [alice.pubkey]})
    assert events == []
    await c.close()


async def test_replaceable_and_addressable(server, alice, connect):
    c = await connect(server.url)
    now = int(time.time())
    old = alice.sign(0, [], "old", now - 10)
    new = alice.sign(0, [], "new", now)
    assert (await c.publish(old))[0]
    assert (await c.publish(new))[0]
    ok, msg = await c.publish(alice.sign(0, [], "older", now - 20))
    assert not ok and msg.startswith("duplicate:")
    events, _ = await c.req("k0", {"kinds": [0], "authors": [alice.pubkey]})
    assert [e["content"] for e in events] == ["new"]
    # Addressable: one per d tag; a tie on created_at keeps the lowest id.
    a1 = alice.sign(30023, [["d", "x"]], "a1", now)
    a2 = alice.sign(30023, [["d", "x"]], "a2", now)
    low, high = sorted([a1, a2], key=lambda e: e.id)
    assert (await c.publish(high))[0]
    assert (await c.publish(low))[0]
    ok, _ = await c.publish(high)
    assert not ok
    assert (await c.publish(alice.sign(30023, [["d", "y"]], "other", now)))[0]
    events, _ = await c.req("a", {"kinds": [30023], "authors": [alice.pubkey]})
    assert sorted(e["content"] for e in events) == sorted([low.content, "other"])
    await c.close()


async def test_ephemeral_is_broadcast_not_stored(server, alice, connect):
    sub = await connect(server.url)
    pub = await connect(server.url)
    _, _ = await sub.req("live", {"kinds": [20001]})
    ev = alice.sign(20001, [], "blink")
    assert await pub.publish(ev) == (True, "")
    msg = await sub.expect(lambda m: m[0] == "EVENT" and m[1] == "live")
    assert msg[2]["id"] == ev.id
    events, _ = await pub.req("later", {"kinds": [20001]})
    assert events == []


async def test_deletion_by_e_and_a(server, alice, bob, connect):
    c = await connect(server.url)
    note = alice.sign(1, [], "regret")
    bobs = bob.sign(1, [], "bob's")
    art = alice.sign(30023, [["d", "post"]], "article")
    for ev in (note, bobs, art):
        assert (await c.publish(ev))[0]
    deletion = alice.sign(5, [["e", note.id], ["e", bobs.id], ["a", f"30023:{alice.pubkey}:post"]], "")
    assert (await c.publish(deletion))[0]
    events, _ = await c.req("s", {"kinds": [1, 30023]})
    assert [e["id"] for e in events] == [bobs.id]  # only the author's own events go
    ok, msg = await c.publish(note)
    assert not ok and msg.startswith("blocked:")
    ok, msg = await c.publish(alice.sign(30023, [["d", "post"]], "again", deletion.created_at - 1))
    assert not ok and msg.startswith("blocked:")
    # A newer version of the address after the deletion is allowed.
    assert (await c.publish(alice.sign(30023, [["d", "post"]], "new", deletion.created_at + 1)))[0]
    # An `e` tag names an event id: a coordinate written there deletes (and blocks) nothing.
    draft = alice.sign(30023, [["d", "draft"]], "draft", deletion.created_at - 5)
    assert (await c.publish(draft))[0]
    assert (await c.publish(alice.sign(5, [["e", f"30023:{alice.pubkey}:draft"]], "")))[0]
    events, _ = await c.req("d", {"kinds": [30023], "#d": ["draft"]})
    assert [e["id"] for e in events] == [draft.id]
    assert (await c.publish(alice.sign(30023, [["d", "draft"]], "v2", deletion.created_at - 4)))[0]
    await c.close()


async def test_expiration(server, alice, connect):
    c = await connect(server.url)
    now = int(time.time())
    ok, msg = await c.publish(alice.sign(1, [["expiration", str(now - 1)]], "stale"))
    assert not ok and msg.startswith("invalid:")
    soon = alice.sign(1, [["expiration", str(now + 2)]], "soon")
    assert (await c.publish(soon))[0]
    events, _ = await c.req("a", {"ids": [soon.id]})
    assert len(events) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events, _ = await c.req("b", {"ids": [soon.id]})
        if not events:
            break
        await asyncio.sleep(0.3)
    assert events == []
    await c.close()


async def test_live_subscription_close_and_count(server, alice, bob, connect):
    sub = await connect(server.url)
    pub = await connect(server.url)
    await sub.req("mine", {"authors": [alice.pubkey]})
    await sub.req("tagged", {"#p": [bob.pubkey]})
    e1 = alice.sign(1, [], "one")
    e2 = bob.sign(1, [["p", bob.pubkey]], "two")
    e3 = bob.sign(1, [], "not for anyone")
    for ev in (e1, e2, e3):
        assert (await pub.publish(ev))[0]
    m1 = await sub.expect(lambda m: m[0] == "EVENT" and m[1] == "mine")
    m2 = await sub.expect(lambda m: m[0] == "EVENT" and m[1] == "tagged")
    assert m1[2]["id"] == e1.id and m2[2]["id"] == e2.id
    await sub.send(["CLOSE", "mine"])
    await asyncio.sleep(0.1)
    assert (await pub.publish(alice.sign(1, [], "after close")))[0]
    n = await pub.count("c", {"authors": [alice.pubkey, bob.pubkey]})
    assert n == ["COUNT", "c", {"count": 4}]
    # No EVENT for the closed subscription arrives (COUNT round trip orders after the publish).
    await sub.count("barrier", {"kinds": [1]})
    assert not [m for m in sub.backlog if m[0] == "EVENT" and m[1] == "mine"]


async def test_limit_and_since_until(server, alice, connect):
    c = await connect(server.url)
    base = int(time.time()) - 100
    evs = [alice.sign(1, [], str(i), base + i) for i in range(10)]
    for ev in evs:
        assert (await c.publish(ev))[0]
    events, _ = await c.req("l", {"authors": [alice.pubkey], "limit": 3})
    assert [e["content"] for e in events] == ["9", "8", "7"]
    events, _ = await c.req("w", {"authors": [alice.pubkey], "since": base + 2, "until": base + 4})
    assert sorted(e["content"] for e in events) == ["2", "3", "4"]
    await c.close()


async def test_dm_gating_every_read_path(server, alice, bob, connect):
    carol = Identity()
    c_anon = await connect(server.url)
    dm = alice.sign(4, [["p", bob.pubkey]], "ciphertext")
    wrap = alice.sign(1059, [["p", bob.pubkey]], "wrapped")
    public = alice.sign(1, [], "public")
    # Unauthenticated publishing of a DM is allowed (the author signed it), reading is not.
    for ev in (dm, wrap, public):
        assert (await c_anon.publish(ev))[0]
    _, closed = await c_anon.req("dm", {"kinds": [4]})
    assert closed and closed[2].startswith("auth-required:")
    msg = await c_anon.count("cnt", {"kinds": [1059]})
    assert msg[0] == "CLOSED" and msg[2].startswith("auth-required:")
    # Filters without kinds cannot reveal gated kinds.
    events, _ = await c_anon.req("all", {"authors": [alice.pubkey]})
    assert [e["id"] for e in events] == [public.id]
    assert (await c_anon.count("n", {"authors": [alice.pubkey]}))[2] == {"count": 1}

    c_bob = await connect(server.url)
    assert await c_bob.auth(bob.secret, server.url) == (True, "")
    events, _ = await c_bob.req("b", {"authors": [alice.pubkey]})
    assert {e["id"] for e in events} == {dm.id, wrap.id, public.id}
    c_carol = await connect(server.url)
    assert (await c_carol.auth(carol.secret, server.url))[0]
    events, _ = await c_carol.req("c", {"#p": [bob.pubkey]})
    assert events == []
    assert (await c_carol.count("n", {"kinds": [4, 1059]}))[2] == {"count": 0}

    # Live broadcast: open subscriptions without kinds; only bob sees the new DM.
    await c_anon.req("live", {"authors": [alice.pubkey]})
    await c_carol.req("live", {"authors": [alice.pubkey]})
    await c_bob.req("live", {"authors": [alice.pubkey]})
    dm2 = alice.sign(4, [["p", bob.pubkey]], "second")
    note = alice.sign(1, [], "marker")
    assert (await c_anon.publish(dm2))[0]
    assert (await c_anon.publish(note))[0]
    got = await c_bob.expect(lambda m: m[0] == "EVENT" and m[1] == "live" and m[2]["id"] == dm2.id)
    assert got
    for cl in (c_anon, c_carol):
        await cl.expect(lambda m: m[0] == "EVENT" and m[1] == "live" and m[2]["id"] == note.id)
        assert not [m for m in cl.backlog if m[0] == "EVENT" and m[2]["id"] == dm2.id]


async def test_auth_validation(server, alice, connect):
    from appliance.nostr.event import sign_event

    c = await connect(server.url)
    bad_relay = sign_event(alice.secret, 22242, [["relay", "wss://elsewhere.example"], ["challenge", c.challenge]], "")
    await c.send(["AUTH", bad_relay.to_dict()])
    msg = await c.expect(lambda m: m[0] == "OK")
    assert msg[2] is False and msg[3].startswith("invalid:")
    bad_challenge = sign_event(alice.secret, 22242, [["relay", server.url], ["challenge", "nope"]], "")
    await c.send(["AUTH", bad_challenge.to_dict()])
    msg = await c.expect(lambda m: m[0] == "OK")
    assert msg[2] is False
    assert await c.auth(alice.secret, server.url) == (True, "")
    # AUTH events are not storable via EVENT.
    ok, msg = await c.publish(sign_event(alice.secret, 22242, [], ""))
    assert not ok and msg.startswith("invalid:")


async def test_bad_input_keeps_connection_usable(server, alice, connect):
    c = await connect(server.url)
    good = alice.sign(1, [], "kept")
    assert (await c.publish(good))[0]
    for junk in ("not json", "{}", "[]", "[1,2]", '["EVENT"]', '["EVENT", 5]', '["REQ"]', '["REQ", 5]',
                 '["CLOSE"]', '["WAT", 1]', '["AUTH", "x"]'):
        await c.send(junk)
        msg = await c.expect(lambda m: m[0] == "NOTICE")
        assert ":" in msg[1]
    await c.ws.send(b"\x00\x01binary")
    msg = await c.expect(lambda m: m[0] == "NOTICE")
    assert "binary" in msg[1]
    # Bad filters get CLOSED with a prefix.
    _, closed = await c.req("bad", {"kinds": ["x"]})
    assert closed[2].startswith("invalid:")
    _, closed = await c.req("bad2", {"authors": ["abc"]})
    assert closed[2].startswith("invalid:")
    _, closed = await c.req("bad3", *([{"kinds": [1]}] * 17))
    assert closed[2].startswith("invalid:")
    # Oversized EVENT: its OK (a client waits for one); other oversized messages: a NOTICE. The
    # connection survives both.
    big = alice.sign(1, [], "x" * 140_000)
    await c.send(json.dumps(["EVENT", big.to_dict()]))
    msg = await c.expect(lambda m: m[0] == "OK")
    assert msg[1:] == [big.id, False, "invalid: message too large (max 131072 bytes)"]
    await c.send(json.dumps(["REQ", "big", {"#t": ["x" * 140_000]}]))
    msg = await c.expect(lambda m: m[0] == "NOTICE")
    assert msg[1] == "invalid: message too large (max 131072 bytes)"
    # Malformed events: OK false with invalid:
    ev = alice.sign(1, [], "y").to_dict()
    for broken in (dict(ev, kind="1"), dict(ev, tags="no"), {k: v for k, v in ev.items() if k != "sig"},
                   dict(ev, created_at=1.5), dict(ev, extra=1)):
        await c.send(["EVENT", broken])
        msg = await c.expect(lambda m: m[0] == "OK")
        assert msg[2] is False and msg[3].startswith("invalid:")
    events, _ = await c.req("still", {"ids": [good.id]})
    assert len(events) == 1


async def test_too_many_subscriptions(make_server, alice, connect):
    server = make_server("--max-subscriptions", "3")
    c = await connect(server.url)
    for i in range(3):
        _, closed = await c.req(f"s{i}", {"kinds": [1]})
        assert closed is None
    _, closed = await c.req("s3", {"kinds": [1]})
    assert closed[2].startswith("error:") and "subscriptions" in closed[2]
    _, closed = await c.req("s0", {"kinds": [2]})  # replacing an open id is fine
    assert closed is None


@pytest.mark.slow
async def test_event_rate_limit(make_server, alice, connect):
    server = make_server("--event-rate", "1", "--event-burst", "5")
    c = await connect(server.url)
    results = []
    for i in range(12):
        results.append(await c.publish(alice.sign(1, [], str(i))))
    assert any(msg.startswith("rate-limited:") for ok, msg in results if not ok)
    assert sum(ok for ok, _ in results) >= 5


async def test_nip11(server, connect):
    r = httpx.get(server.http + "/", headers={"Accept": "application/nostr+json"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["content-type"].startswith("application/nostr+json")
    doc = r.json()
    assert {1, 9, 11, 40, 42, 45} <= set(doc["supported_nips"])
    lim = doc["limitation"]
    assert lim["max_message_length"] == 131072 and lim["max_subscriptions"] == 32
    assert lim["auth_required"] is False
    r = httpx.get(server.http + "/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]


@pytest.mark.slow
async def test_concurrent_publishers_all_acknowledged_and_stored(server, connect):
    ids: list[str] = []

    async def worker(n: int):
        who = Identity()
        c = await connect(server.url)
        evs = [who.sign(1, [["t", "load"]], f"{n}-{i}") for i in range(50)]
        for ev in evs:
            await c.send(["EVENT", ev.to_dict()])
        oks = 0
        while oks < len(evs):
            msg = await c.expect(lambda m: m[0] == "OK")
            assert msg[2] is True, msg
            oks += 1
        ids.extend(ev.id for ev in evs)
        await c.close()

    await asyncio.gather(*(worker(n) for n in range(6)))
    c = await connect(server.url)
    assert (await c.count("n", {"#t": ["load"]}))[2] == {"count": 300}


async def test_every_tag_is_indexed(server, alice, bob, connect):
    """A tag far down a long tag list is found by `#x` queries and grants a DM recipient access,
    as live matching does (no indexing cap below max_event_tags)."""
    c = await connect(server.url)
    filler = [["t", f"filler-{i}"] for i in range(600)]
    needle = alice.sign(1, filler + [["t", "needle-600"]], "deep tag")
    assert await c.publish(needle) == (True, "")
    events, _ = await c.req("n", {"#t": ["needle-600"]})
    assert [e["id"] for e in events] == [needle.id]
    dm = alice.sign(4, filler + [["p", bob.pubkey]], "ciphertext")
    assert await c.publish(dm) == (True, "")
    cb = await connect(server.url)
    assert (await cb.auth(bob.secret, server.url))[0]
    events, _ = await cb.req("dm", {"kinds": [4]})
    assert dm.id in [e["id"] for e in events]
    assert (await cb.count("dmc", {"ids": [dm.id]}))[2] == {"count": 1}
