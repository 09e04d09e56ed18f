"""NIP-77 negentropy over the real server: NEG-OPEN, NEG-MSG, NEG-CLOSE and NEG-ERR, the records a
connection may read (REQ's read rule), the limits, and how sessions end."""

from __future__ import annotations

import asyncio
import time

import pytest

from appliance.nostr.negentropy import Negentropy, Storage
from tests.conftest import Identity
from tests.relay.test_origins_groups import TWO_ORIGINS, make_group

pytestmark = pytest.mark.anyio


def storage_of(events) -> Storage:
    return Storage.from_items((e.created_at, bytes.fromhex(e.id)) for e in events)


async def reconcile(c, flt: dict, mine=(), sub: str = "neg", frame_size_limit: int = 0):
    """Reconcile `mine` (events) against the relay: (ids only we have, ids only it has, its messages)."""
    ne = Negentropy(storage_of(mine), frame_size_limit)
    await c.send(["NEG-OPEN", sub, flt, ne.initiate().hex()])
    have, need, replies = set(), set(), []
    while True:
        msg = await c.expect(lambda m: m[0] in ("NEG-MSG", "NEG-ERR") and m[1] == sub)
        if msg[0] == "NEG-ERR":
            raise AssertionError(f"NEG-ERR {msg}")
        replies.append(msg[2])
        out, h, n = ne.reconcile_client(bytes.fromhex(msg[2]))
        have.update(x.hex() for x in h)
        need.update(x.hex() for x in n)
        if out is None:
            await c.send(["NEG-CLOSE", sub])
            return have, need, replies
        await c.send(["NEG-MSG", sub, out.hex()])


async def neg_error(c, sub: str) -> list:
    return await c.expect(lambda m: m[0] in ("NEG-MSG", "NEG-ERR") and m[1] == sub)


async def test_reconcile_against_the_relay(server, connect, alice, bob):
    c = await connect(server.url)
    now = int(time.time())
    shared = [alice.sign(1, [], f"shared {i}", now - 500 + i) for i in range(60)]
    only_relay = [alice.sign(1, [], f"relay {i}", now - 400 + i) for i in range(7)]
    only_client = [alice.sign(1, [], f"client {i}", now - 300 + i) for i in range(5)]
    other_kind = bob.sign(7, [], "+", now - 100)
    for ev in shared + only_relay + [other_kind]:
        assert (await c.publish(ev))[0]
    have, need, _ = await reconcile(c, {"kinds": [1]}, shared + only_client)
    assert have == {e.id for e in only_client}
    assert need == {e.id for e in only_relay}
    # The filter selects: by author, by time.
    have, need, _ = await reconcile(c, {"authors": [bob.pubkey]}, [])
    assert (have, need) == (set(), {other_kind.id})
    have, need, _ = await reconcile(c, {"kinds": [1], "since": now - 400, "until": now - 394}, [])
    assert need == {e.id for e in only_relay[:7]}
    # Everything, against an empty side; and identical sides in one round.
    _, need, _ = await reconcile(c, {}, [])
    assert need == {e.id for e in shared + only_relay + [other_kind]}
    have, need, replies = await reconcile(c, {}, shared + only_relay + [other_kind])
    assert (have, need, len(replies)) == (set(), set(), 1)


async def test_nip11_advertises_negentropy(make_server):
    server = make_server("--negentropy-max-records", "1234")
    doc = server.nip11()
    assert 77 in doc["supported_nips"]
    assert doc["negentropy"] == 1
    assert doc["limitation"]["max_negentropy_records"] == 1234


async def test_only_what_the_connection_may_read(server, connect, alice, bob):
    """Gated kinds and private groups are invisible before AUTH, exactly as in REQ."""
    carol = Identity()
    ca = await connect(server.url)
    assert (await ca.auth(alice.secret, server.url))[0]
    h = await make_group(ca, alice, private=True)
    assert (await ca.publish(alice.sign(9000, [["h", h], ["p", bob.pubkey]], "")))[0]
    secret_plan = alice.sign(9, [["h", h]], "secret plans")
    dm = alice.sign(4, [["p", bob.pubkey]], "hi?iv=x")
    note = alice.sign(1, [], "public")
    for ev in (secret_plan, dm, note):
        assert (await ca.publish(ev))[0]

    cb = await connect(server.url)
    assert (await cb.auth(bob.secret, server.url))[0]
    cc = await connect(server.url)
    assert (await cc.auth(carol.secret, server.url))[0]
    anon = await connect(server.url)
    for client, sees in ((anon, False), (cc, False), (cb, True)):
        for flt in ({}, {"authors": [alice.pubkey]}, {"#h": [h]}):
            events, _ = await client.req("r", flt)
            _, need, _ = await reconcile(client, flt)
            assert need == {e["id"] for e in events}, (flt, sees)  # the same set as REQ
            assert (secret_plan.id in need) is sees
            if "#h" not in flt:
                assert note.id in need
                assert (dm.id in need) is sees
    # Asking for gated kinds by name before AUTH: refused as REQ is (NEG-ERR instead of CLOSED).
    _, closed = await anon.req("dm", {"kinds": [4]})
    await anon.send(["NEG-OPEN", "dm", {"kinds": [4]}, Negentropy(Storage()).initiate().hex()])
    err = await neg_error(anon, "dm")
    assert err[0] == "NEG-ERR" and err[2] == closed[2] and err[2].startswith("auth-required:")


async def test_each_origin_reconciles_its_own_events(make_server, connect, alice):
    server = make_server(config=TWO_ORIGINS)
    a = await connect(server.url, host="a.test")
    b = await connect(server.url, host="b.test")
    on_a = alice.sign(1, [], "on A")
    on_b = alice.sign(1, [], "on B")
    assert (await a.publish(on_a))[0]
    assert (await b.publish(on_b))[0]
    assert (await reconcile(a, {}))[1] == {on_a.id}
    assert (await reconcile(b, {}))[1] == {on_b.id}


async def test_too_many_records(make_server, connect, alice):
    server = make_server("--negentropy-max-records", "5")
    c = await connect(server.url)
    now = int(time.time())
    events = [alice.sign(1, [], str(i), now - 10 + i) for i in range(6)]
    for ev in events:
        assert (await c.publish(ev))[0]
    await c.send(["NEG-OPEN", "big", {}, Negentropy(Storage()).initiate().hex()])
    assert await neg_error(c, "big") == ["NEG-ERR", "big", "blocked: too many records", 5]
    # The session is closed: a NEG-MSG for it finds nothing.
    await c.send(["NEG-MSG", "big", "61"])
    err = await neg_error(c, "big")
    assert err[0] == "NEG-ERR" and err[2].startswith("closed:")
    # Within the limit: a narrower filter, or a limit.
    assert len((await reconcile(c, {"until": now - 6}))[1]) == 5
    _, need, _ = await reconcile(c, {"limit": 2})
    assert need == {events[-1].id, events[-2].id}  # the newest two


async def test_sessions_end_on_close_error_and_idle(make_server, connect, alice):
    server = make_server("--negentropy-idle-timeout", "1", "--negentropy-max-sessions", "2")
    c = await connect(server.url)
    for i in range(40):  # enough records that the first answer is not the last
        assert (await c.publish(alice.sign(1, [], str(i))))[0]
    initial = Negentropy(storage_of([alice.sign(1, [], "mine")])).initiate().hex()
    # NEG-CLOSE: a later NEG-MSG finds no session.
    await c.send(["NEG-OPEN", "s1", {}, initial])
    assert (await neg_error(c, "s1"))[0] == "NEG-MSG"
    await c.send(["NEG-CLOSE", "s1"])
    await c.send(["NEG-MSG", "s1", "6100000200"])
    err = await neg_error(c, "s1")
    assert err[0] == "NEG-ERR" and err[2].startswith("closed:")
    # At most negentropy_max_sessions open at once.
    for sub in ("s2", "s3"):
        await c.send(["NEG-OPEN", sub, {}, initial])
        assert (await neg_error(c, sub))[0] == "NEG-MSG"
    await c.send(["NEG-OPEN", "s4", {}, initial])
    err = await neg_error(c, "s4")
    assert err[0] == "NEG-ERR" and err[2].startswith("blocked:") and "max 2" in err[2]
    # Idle for negentropy_idle_timeout: closed, said with NEG-ERR `closed:`.
    for sub in ("s2", "s3"):
        err = await c.expect(lambda m: m[0] == "NEG-ERR" and m[1] == sub, timeout=15)
        assert err[2].startswith("closed:")
    # A NEG-OPEN with an open session's id replaces it.
    await c.send(["NEG-OPEN", "s5", {}, initial])
    first = await neg_error(c, "s5")
    await c.send(["NEG-OPEN", "s5", {"kinds": [7]}, initial])
    second = await neg_error(c, "s5")
    assert first[0] == second[0] == "NEG-MSG" and first[2] != second[2]


async def test_sessions_end_with_their_connection(server, connect, alice):
    c = await connect(server.url)
    assert (await c.publish(alice.sign(1, [], "x")))[0]
    await c.send(["NEG-OPEN", "gone", {}, Negentropy(Storage()).initiate().hex()])
    assert (await neg_error(c, "gone"))[0] == "NEG-MSG"
    await c.close()
    deadline = time.monotonic() + 10
    while "negentropy: 1 session(s) closed with their connection" not in server.log_path.read_text():
        assert time.monotonic() < deadline, "no sign of the session being released"
        await asyncio.sleep(0.1)


async def test_malformed_messages(server, connect):
    c = await connect(server.url)
    initial = Negentropy(Storage()).initiate().hex()
    bad = [
        (["NEG-OPEN", "a", {}, "zz"], "invalid:"),
        (["NEG-OPEN", "a", {}, "6"], "invalid:"),
        (["NEG-OPEN", "a", {}, "61AB"], "invalid:"),  # lowercase hex only (NIP-77)
        (["NEG-OPEN", "a", [{}], initial], "invalid:"),
        (["NEG-OPEN", "a", {"kinds": "x"}, initial], "invalid:"),
        (["NEG-OPEN", "a", {}], "invalid:"),
        (["NEG-OPEN", "a", {}, "61000003"], "invalid:"),  # a mode that does not exist
    ]
    for msg, prefix in bad:
        await c.send(msg)
        err = await neg_error(c, "a")
        assert err[0] == "NEG-ERR" and err[2].startswith(prefix), (msg, err)
    await c.send(["NEG-OPEN", 5, {}, initial])
    notice = await c.expect(lambda m: m[0] == "NOTICE")
    assert notice[1].startswith("invalid:")
    # A version this relay does not speak: it answers with its own (0x61), NIP-77's upgrade path.
    await c.send(["NEG-OPEN", "v", {}, "62aabb"])
    assert await neg_error(c, "v") == ["NEG-MSG", "v", "61"]
    # The connection goes on.
    _, need, _ = await reconcile(c, {})
    assert need == set()


@pytest.mark.slow
async def test_answers_fit_the_relay_message_limit(make_server, connect, alice):
    """A large difference takes several rounds of answers no longer than max_message_length."""
    server = make_server("--max-message-length", "8192", "--event-rate", "0")
    c = await connect(server.url)
    now = int(time.time())
    ours = [alice.sign(1, [], f"relay {i}", now - 2000 + i) for i in range(700)]
    for ev in ours:
        assert (await c.publish(ev))[0]
    have, need, replies = await reconcile(c, {}, [], frame_size_limit=4096)
    assert need == {e.id for e in ours}
    assert len(replies) > 3
    assert max(len(f'["NEG-MSG","neg","{r}"]') for r in replies) <= 8192
