"""Several nodes: two `appliance serve` processes on two loopback ports over one PostgreSQL
database (issue #16), with the same key file and the same public URL (a load balancer's)."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid

import pytest

from tests.conftest import Client, Identity

psycopg = pytest.importorskip("psycopg", reason="several nodes need PostgreSQL: psycopg is not installed")

pytestmark = pytest.mark.anyio

from tests.nodes.conftest import PUBLIC


async def authed(url: str, who: Identity, relay: str = PUBLIC) -> Client:
    c = await Client.connect(url)
    ok, msg = await c.auth(who.secret, relay)
    assert ok, msg
    return c


async def test_a_subscriber_on_a_receives_what_is_published_on_b(nodes):
    n = nodes()
    a, b = n.add("a"), n.add("b")
    alice, bob = Identity(), Identity()
    ca, cb = await authed(a.url, alice), await authed(b.url, bob)
    try:
        events, _ = await ca.req("live", {"authors": [bob.pubkey]})
        assert events == []
        small = bob.sign(1, [], "hello from node b")
        ok, msg = await cb.publish(small)
        assert ok, msg
        got = await ca.expect(lambda m: m[0] == "EVENT" and m[1] == "live")
        assert got[2] == small.to_dict()
        # Too big for a notification (8000 bytes): only its id travels, node A reads it back.
        big = bob.sign(1, [], "x" * 20_000)
        ok, msg = await cb.publish(big)
        assert ok, msg
        got = await ca.expect(lambda m: m[0] == "EVENT" and m[1] == "live")
        assert got[2] == big.to_dict()
        # Ephemeral events are never stored: announced on their own.
        eph = bob.sign(20001, [], "typing")
        await cb.send(["EVENT", eph.to_dict()])
        got = await ca.expect(lambda m: m[0] == "EVENT" and m[1] == "live")
        assert got[2] == eph.to_dict()
        # And the other way round; a node does not replay its own events (sent once, not twice).
        events, _ = await cb.req("back", {"authors": [alice.pubkey]})
        mine = alice.sign(1, [], "from node a")
        await ca.send(["REQ", "own", {"authors": [alice.pubkey]}])
        await ca.expect(lambda m: m[0] == "EOSE" and m[1] == "own")
        ok, msg = await ca.publish(mine)
        assert ok, msg
        got = await cb.expect(lambda m: m[0] == "EVENT" and m[1] == "back")
        assert got[2] == mine.to_dict()
        await ca.expect(lambda m: m[0] == "EVENT" and m[1] == "own")
        marker = bob.sign(1, [], "marker")
        ok, msg = await cb.publish(marker)
        assert ok, msg
        await ca.expect(lambda m: m[0] == "EVENT" and m[1] == "live" and m[2]["id"] == marker.id)
        assert not [m for m in ca.backlog if m[0] == "EVENT" and m[1] == "own"]
    finally:
        await ca.close()
        await cb.close()


async def make_group(c: Client, admin: Identity, *, private: bool) -> str:
    h = str(uuid.uuid4())
    ok, msg = await c.publish(admin.sign(9007, [["h", h]], ""))
    assert ok, msg
    ok, msg = await c.publish(admin.sign(9002, [["h", h], ["name", "team"], ["private" if private else "public"]], ""))
    assert ok, msg
    return h


@pytest.mark.slow
async def test_a_private_group_membership_change_on_b_is_enforced_on_a(nodes):
    n = nodes()
    a, b = n.add("a"), n.add("b")
    admin, carol = Identity(), Identity()
    cb = await authed(b.url, admin)
    ca = await authed(a.url, carol)
    try:
        h = await make_group(cb, admin, private=True)
        # Carol on A, not a member yet: the group's messages are hidden from her, stored and live.
        await ca.send(["REQ", "g", {"kinds": [9], "#h": [h]}, {"kinds": [1], "authors": [admin.pubkey]}])
        await ca.expect(lambda m: m[0] == "EOSE" and m[1] == "g")
        hidden = admin.sign(9, [["h", h]], "before carol joined")
        ok, msg = await cb.publish(hidden)
        assert ok, msg
        # Added on B: A's read authorization knows at once (the next message reaches her there).
        ok, msg = await cb.publish(admin.sign(9000, [["h", h], ["p", carol.pubkey]], ""))
        assert ok, msg
        seen = admin.sign(9, [["h", h]], "carol is in")
        ok, msg = await cb.publish(seen)
        assert ok, msg
        got = await ca.expect(lambda m: m[0] == "EVENT" and m[1] == "g" and m[2]["kind"] == 9)
        assert got[2]["id"] == seen.id
        # Removed on B: the next message is not sent to her on A.
        ok, msg = await cb.publish(admin.sign(9001, [["h", h], ["p", carol.pubkey]], ""))
        assert ok, msg
        after = admin.sign(9, [["h", h]], "carol is out")
        ok, msg = await cb.publish(after)
        assert ok, msg
        marker = admin.sign(1, [], "public marker, committed after the removal")
        ok, msg = await cb.publish(marker)
        assert ok, msg
        await ca.expect(lambda m: m[0] == "EVENT" and m[1] == "g" and m[2]["id"] == marker.id)
        leaked = [m for m in ca.backlog if m[0] == "EVENT" and m[2]["id"] in (hidden.id, after.id)]
        assert leaked == []
        events, _ = await ca.req("again", {"kinds": [9], "#h": [h]})
        assert events == []
    finally:
        await ca.close()
        await cb.close()


@pytest.mark.slow
async def test_an_edit_through_the_cli_reaches_every_node(nodes):
    """Origins, blocklists, keys: the configuration generation row in the shared database."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    n = nodes()
    a, b = n.add("a"), n.add("b")
    mallory = Identity()
    env = {"APPLIANCE_STORAGE": n.url, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "appliance", "origins", "block", PUBLIC, mallory.pubkey,
                          "--data-dir", str(a.data_dir)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for srv in (a, b):
        c = await Client.connect(srv.url)
        try:
            deadline = time.monotonic() + 10
            while True:
                ok, msg = await c.publish(mallory.sign(1, [], secrets.token_hex(4)))
                if not ok:
                    assert msg.startswith("blocked:")
                    break
                assert time.monotonic() < deadline, "the block did not reach this node"
                await asyncio.sleep(0.2)
        finally:
            await c.close()


@pytest.mark.slow
def test_a_node_without_the_key_file_refuses_to_start(nodes, tmp_path):
    """The keys in the database are wrapped by the first node's key file: a node with another one
    (or none) must not start, rather than make keys of its own."""
    from tests.conftest import Server

    n = nodes()
    n.add("a")
    for name, key in (("fresh", None), ("other", b"\x07" * 32)):
        data = tmp_path / name
        data.mkdir()
        if key is not None:
            (data / "appliance.key").write_bytes(key)
            (data / "appliance.key").chmod(0o600)
        srv = Server(data, "--public-url", PUBLIC, env={"APPLIANCE_STORAGE": n.url})
        try:
            with pytest.raises(RuntimeError, match="exited early") as info:
                srv.start()
        finally:
            srv.stop()
        assert "key file" in str(info.value), str(info.value)[-2000:]


@pytest.mark.slow
async def test_group_snapshots_of_a_cli_edit_reach_live_subscribers_on_every_node(nodes):
    """A group created and edited from the CLI (no relay EVENT): its relay-signed snapshots are
    announced in the edit's transaction, and every node sends them to its live subscribers."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    n = nodes()
    a, b = n.add("a"), n.add("b")
    watcher, carol = Identity(), Identity()
    subs = [await authed(srv.url, watcher) for srv in (a, b)]
    h = str(uuid.uuid4())
    env = {"APPLIANCE_STORAGE": n.url, "PATH": "/usr/bin:/bin"}
    try:
        for c in subs:
            await c.send(["REQ", "snap", {"kinds": [39000, 39002], "#d": [h]}])
            await c.expect(lambda m: m[0] == "EOSE" and m[1] == "snap")
        for args in (["create", PUBLIC, "--id", h, "--name", "from the cli"], ["add", PUBLIC, h, carol.pubkey]):
            out = subprocess.run([sys.executable, "-m", "appliance", "groups", *args, "--data-dir", str(a.data_dir)],
                                 capture_output=True, text=True, env=env, cwd=ROOT)
            assert out.returncode == 0, out.stderr
        for c in subs:
            meta = await c.expect(lambda m: m[0] == "EVENT" and m[1] == "snap" and m[2]["kind"] == 39000)
            assert ["name", "from the cli"] in meta[2]["tags"]
            await c.expect(lambda m: m[0] == "EVENT" and m[1] == "snap" and m[2]["kind"] == 39002
                           and ["p", carol.pubkey] in m[2]["tags"])
    finally:
        for c in subs:
            await c.close()


@pytest.mark.slow
async def test_a_large_answer_is_not_sent_again_when_the_notifications_of_its_events_arrive(nodes):
    """S4: an answer of any size. Node A's one reader thread is held (a read of the leases table,
    locked by a side connection) while node B stores more events than any fixed window, each too
    large for its notification (A reads it back, behind the REQ): the REQ answers with all of them,
    their notifications come after, and none is sent to the subscription a second time."""
    import httpx

    token = "s4-metrics"
    n = nodes(f'public_url = "{PUBLIC}"\nreader_threads = 1\nmetrics_token = "{token}"\n')
    a, b = n.add("a"), n.add("b")
    alice, watcher = Identity(), Identity()
    pub = await authed(b.url, alice)
    sub = await authed(a.url, watcher)
    side = psycopg.connect(n.url, autocommit=True)
    held = None
    try:
        side.execute("BEGIN")
        side.execute("LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")

        async def metrics():
            async with httpx.AsyncClient(timeout=60) as client:
                return await client.get(f"{a.http}/admin/metrics", headers={"Authorization": f"Bearer {token}"})

        held = asyncio.create_task(metrics())  # A's reader thread waits on the lock
        deadline = time.monotonic() + 20
        while not n.rows("SELECT count(*) FROM pg_locks WHERE relation = 'leases'::regclass AND NOT granted")[0][0]:
            assert time.monotonic() < deadline, "the metrics read never reached the leases table"
            await asyncio.sleep(0.02)
        await sub.send(["REQ", "big", {"kinds": [1], "authors": [alice.pubkey], "limit": 500}])
        published = []
        for i in range(80):  # more than the 64 ids the window used to keep
            ev = alice.sign(1, [], f"{i} " + "x" * 8200)  # over NOTIFY's 8000 bytes: read back on A
            ok, msg = await pub.publish(ev)
            assert ok, msg
            published.append(ev.id)
        side.execute("COMMIT")  # A reads again: the REQ, then the read-backs of the notifications
        assert (await held).status_code == 200
        answer, closed = [], None
        while True:
            msg = await sub.expect(lambda m: m[0] in ("EVENT", "EOSE") and m[1] == "big")
            if msg[0] == "EOSE":
                break
            answer.append(msg[2]["id"])
        assert sorted(answer) == sorted(published)
        # A marker on a second subscription: A replays notifications in commit order, so once it
        # arrives every notification of the 80 events has been handled.
        await sub.send(["REQ", "marker", {"kinds": [7], "authors": [alice.pubkey]}])
        await sub.expect(lambda m: m[0] == "EOSE" and m[1] == "marker")
        marker = alice.sign(7, [], "+")
        ok, msg = await pub.publish(marker)
        assert ok, msg
        await sub.expect(lambda m: m[0] == "EVENT" and m[1] == "marker" and m[2]["id"] == marker.id)
        again = [m[2]["id"] for m in sub.backlog if m[0] == "EVENT" and m[1] == "big"]
        assert again == []
    finally:
        side.close()
        if held is not None and not held.done():
            held.cancel()
        await pub.close()
        await sub.close()
