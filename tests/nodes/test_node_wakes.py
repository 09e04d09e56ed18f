"""Wakes across nodes, end to end: two appliance processes over one PostgreSQL database, the APNs
emulator standing in for Apple. A lease accepted on one node wakes for an event stored on the other,
once; a node killed mid-load loses no acknowledged event and no due wake."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import Client
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, token, wait_until

psycopg = pytest.importorskip("psycopg", reason="several nodes need PostgreSQL: psycopg is not installed")

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def apns(tmp_path_factory):
    a = Apns(tmp_path_factory.mktemp("apns")).start()
    yield a
    a.stop()


def job_rows(n, event_ids) -> dict[str, tuple]:
    rows = n.rows("SELECT event_id, id, state, wake_id FROM wake_jobs WHERE event_id = ANY(%s)", (list(event_ids),))
    return {r[0]: r[1:] for r in rows}


async def test_a_lease_accepted_on_a_wakes_once_for_an_event_stored_on_b(nodes, apns):
    n = nodes(delivery_config(apns))
    a, b = n.add("a"), n.add("b")
    bob = await Pusher.connect(a)
    alice = await Pusher.connect(b)
    try:
        tok = token()
        await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
        ev = await alice.publish(9, [["p", bob.pubkey]])
        apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
        await wait_until(lambda: job_rows(n, [ev.id]).get(ev.id, (None, None))[1] == "delivered")
        await asyncio.sleep(0.5)  # a second send, by either node, would have come by now
        (rec,) = apns.emulator.requests(tok)
        (job_id, state, _wake) = job_rows(n, [ev.id])[ev.id]
        assert rec.status == 200 and rec.header("apns-id") == job_id and state == "delivered"
        assert n.rows("SELECT count(*) FROM wake_jobs")[0][0] == 1
    finally:
        await bob.client.close()
        await alice.client.close()


@pytest.mark.slow
async def test_sigkill_one_node_mid_load_loses_no_acknowledged_event_nor_due_wake(nodes, apns):
    n = nodes(delivery_config(apns, settings={"wake_visibility_timeout": 1.0}))
    a, b = n.add("a"), n.add("b")
    bob = await Pusher.connect(a)
    tok = token()
    await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
    acked: list[str] = []

    async def load(srv, who):
        """Publish until the connection dies; the ids of events acknowledged with OK true."""
        c = await Client.connect(srv.url)
        try:
            from appliance.nostr.event import sign_event

            i = 0
            while True:
                ev = sign_event(who.user.secret, 9, [["p", bob.pubkey]], f"load {i}")
                i += 1
                ok, msg = await c.publish(ev)
                assert ok, msg
                acked.append(ev.id)
        except Exception:
            return
        finally:
            await c.close()

    alice_b = await Pusher.connect(b)
    try:
        task = asyncio.create_task(load(b, alice_b))
        await wait_until(lambda: len(acked) >= 60, timeout=30)
        b.kill()  # SIGKILL: no graceful stop, no released claims
        await asyncio.wait_for(task, 10)
        assert len(acked) >= 60
        stored = {r[0] for r in n.rows("SELECT id FROM events WHERE id = ANY(%s)", (acked,))}
        assert stored == set(acked)  # every OK true survived the kill

        def all_woken() -> bool:
            jobs = job_rows(n, acked)
            if set(jobs) != set(acked):
                return False
            state = dict(n.rows("SELECT id, state FROM wake_jobs"))
            return all(st == "delivered" or (st == "coalesced" and state.get(w) == "delivered")
                       for _id, st, w in jobs.values())

        # Node A takes over the wakes B claimed and never sent (their claims lapse after 1 s).
        await wait_until(all_woken, timeout=30)
        assert apns.emulator.requests(tok)
    finally:
        await bob.client.close()
        await alice_b.client.close()


@pytest.mark.slow
async def test_an_executor_key_rotated_through_one_node_is_used_by_every_node(nodes, apns):
    """The rotation bumps the configuration generation: node B advertises the new key and accepts
    leases encrypted to it, within its reload interval."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.push.e2e_helpers import ORIGIN, current_key

    n = nodes(delivery_config(apns))
    a, b = n.add("a"), n.add("b")
    old_id, _pub = current_key(b.nip11())
    cfg = a.data_dir.parent / f"config-{a.port}.toml"
    out = subprocess.run([sys.executable, "-m", "appliance", "keys", "rotate", ORIGIN, "--data-dir", str(a.data_dir),
                          "--config", str(cfg)], capture_output=True, text=True, cwd=ROOT,
                         env={"APPLIANCE_STORAGE": n.url, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rotated = json.loads(out.stdout)
    assert rotated["id"] != old_id
    await wait_until(lambda: current_key(b.nip11())[0] == rotated["id"])
    user = await Pusher.connect(b)
    try:
        await user.lease(token())  # encrypted to the new key, accepted by node B
    finally:
        await user.client.close()
