"""Node locks in one global order: two nodes whose write transactions match the same endpoints in
opposite orders never wait on each other in a cycle (PostgreSQL's deadlock detection never has to
fail one of them). Two appliance processes over one database; side connections of the test hold
endpoint locks to pin each node's transaction at the point where the cycle would close."""

from __future__ import annotations

import secrets

import httpx
import pytest

from appliance.nostr.event import sign_event
from appliance.store.meta import lock_key
from appliance.store.wakes import endpoint_lock_name
from appliance.store.statement import SQL
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, token, wait_until

psycopg = pytest.importorskip("psycopg", reason="several nodes need PostgreSQL: psycopg is not installed")

pytestmark = pytest.mark.anyio

METRICS_TOKEN = "lock-order-metrics"


@pytest.fixture(scope="module")
def apns(tmp_path_factory):
    a = Apns(tmp_path_factory.mktemp("apns")).start()
    yield a
    a.stop()


def metric(srv, name: str) -> int:
    r = httpx.get(f"{srv.http}/admin/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    r.raise_for_status()
    for line in r.text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no {name} metric")


def writes_queued(srv) -> int:
    return metric(srv, "appliance_store_writes_queued")


def waiting_advisory_locks(n) -> int:
    return n.rows("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                  "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")[0][0]


def hold(n, name: str):
    """A side connection holding the node lock `name` until it commits."""
    conn = psycopg.connect(n.url, autocommit=True)
    conn.execute("BEGIN")
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(name),))
    return conn


# 9: the batched path (the three events of a node are one write); 30078 (addressable): one write each.
@pytest.mark.slow
@pytest.mark.parametrize("kind", [9, 30078])
async def test_two_nodes_locking_endpoints_in_opposite_orders_both_commit(nodes, apns, kind):
    config = delivery_config(apns, settings={"metrics_token": METRICS_TOKEN})
    if kind != 9:
        config = config.replace("push_kinds = [9, 1059, 7]", f"push_kinds = [9, 1059, 7, {kind}]")
    n = nodes(config)
    a, b = n.add("a"), n.add("b")
    # Four devices: E1 and E2 are locked in opposite orders, E3 and E4 are the gates.
    recipients = [await Pusher.connect(a) for _ in range(4)]
    alice, bob = await Pusher.connect(a), await Pusher.connect(b)
    clients = recipients + [alice, bob]
    gates = []
    try:
        for r in recipients:
            await r.lease(token(), subscriptions=[{"filter": {"kinds": [kind], "#p": [r.pubkey]},
                                                   "class": "default"}])
        by_pubkey = {row[0]: endpoint_lock_name(row[1:]) for row in n.rows(
            "SELECT pubkey, origin, app_profile, transport, endpoint_hash FROM leases")}
        e1, e2, e3, e4 = (by_pubkey[r.pubkey] for r in recipients)
        sent: list[tuple[Pusher, str]] = []

        async def send(who: Pusher, to: Pusher) -> None:
            ev = sign_event(who.user.secret, kind, [["d", secrets.token_hex(8)], ["p", to.pubkey]], "hi")
            await who.client.send(["EVENT", ev.to_dict()])
            sent.append((who, ev.id))

        gates = [hold(n, e3), hold(n, e4)]
        # Each node's writer waits for E3 with one event, while the next three queue behind it:
        # node A then locks E1, E4, E2; node B E2, E4, E1.
        for who, srv, base in ((alice, a, 1), (bob, b, 2)):
            await send(who, recipients[2])
            await wait_until(lambda: waiting_advisory_locks(n) == base)
        for who, srv, order in ((alice, a, (0, 3, 1)), (bob, b, (1, 3, 0))):
            for i, k in enumerate(order):
                await send(who, recipients[k])
                await wait_until(lambda: writes_queued(srv) >= i + 1)
        gates.pop(0).close()  # E3 free: both first transactions commit, both second ones start
        await wait_until(lambda: waiting_advisory_locks(n) == 2)  # both wait for E4 now
        gates.pop(0).close()
        for who, event_id in sent:
            msg = await who.client.expect(lambda m, e=event_id: m[0] == "OK" and m[1] == e, timeout=30)
            assert msg[2] is True, msg
        jobs = n.rows("SELECT count(*) FROM wake_jobs")[0][0]
        deadlocks = n.rows("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")[0][0]
        assert jobs == len(sent) and deadlocks == 0
        if kind != 9:
            # One of the two orders descends somewhere, whatever the keys: that node ran a write
            # again. (Written together, the three events' endpoints are locked at once, in order.)
            assert metric(a, "appliance_store_lock_reorders_total") + metric(b, "appliance_store_lock_reorders_total") >= 1
        assert {e1, e2, e3, e4} == set(by_pubkey.values())
    finally:
        for g in gates:
            g.close()
        for c in clients:
            await c.client.close()


def test_a_write_asking_for_a_lock_below_one_it_holds_runs_again_with_its_locks_in_order(tmp_path, pg_cluster):
    """The writer itself, on one PostgreSQL store: the write before the out-of-order one commits
    and is answered once, the out-of-order one runs again from a clean start with its keys taken
    first, ascending, and a lock taken in a savepoint that was rolled back is known to be free."""
    pytest.importorskip("appliance.store.postgres")
    from appliance.store.meta import node_lock
    from appliance.store.postgres import PostgresStore

    url = pg_cluster.new_database()
    names = sorted((f"lock-order-{i}" for i in range(3)), key=lock_key)  # low, middle, high key
    runs: list[list[int]] = []

    def first(conn):
        node_lock(conn, names[1])
        return "first"

    def descending(conn):
        runs.append(list(conn.locks.taken))
        node_lock(conn, names[2])
        node_lock(conn, names[0])  # below the key held: run again
        return list(conn.locks.taken)

    def savepoint(conn):
        try:
            with conn:
                node_lock(conn, names[0])
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        free = conn.locks.keys.isdisjoint({lock_key(names[0])})
        with psycopg.connect(url, autocommit=True) as side:
            taken = side.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(names[0]),)).fetchone()[0]
            side.execute("SELECT pg_advisory_unlock_all()")
        return free, taken

    with PostgresStore(url, tmp_path / "data") as store:
        import asyncio

        # One batch or two, as the writer thread takes them: the same answers either way.
        async def both():
            return await asyncio.gather(store.write(first), store.write(descending))

        results = asyncio.run(both())
        assert results[0] == "first"
        assert results[1] == sorted(lock_key(n) for n in names[0::2])  # taken first, in order
        assert runs[-1] == results[1] and store.lock_reorders >= 1
        assert store.write_sync(savepoint) == (True, True)


def test_a_wake_pending_again_is_noted_under_its_endpoint_lock(tmp_path, pg_cluster):
    """A retry (and a released claim, the orphans of a cancelled wake) names its endpoint's pending
    wake holding the endpoint's node lock, like a match: it waits for another node's transaction
    that holds it (deciding about the same device) instead of writing beside it."""
    pytest.importorskip("appliance.store.postgres")
    import asyncio
    import time

    from appliance.store import wakes
    from appliance.store.postgres import PostgresStore

    url = pg_cluster.new_database()
    key = (1, "ios", "apns", "h1")
    with PostgresStore(url, tmp_path / "data") as store:
        def add(conn):
            wakes.insert_job(conn, job_id="j1", origin=1, app_profile="ios", transport="apns", endpoint_hash="h1",
                             event_id="e1", lease_pubkey="a" * 64, lease_d="dd", generation=1, cls="default",
                             now=1_800_000_000.0, useful_age=3600, min_interval=0, claim_for=60)

        store.write_sync(add)
        side = psycopg.connect(url, autocommit=True)
        try:
            side.execute("BEGIN")
            side.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(endpoint_lock_name(key)),))

            async def retry():
                write = store.write(lambda conn: wakes.reschedule(conn, "j1", 1_800_000_010.0, "503"))
                deadline = time.monotonic() + 20
                while not side.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                       "AND NOT granted").fetchone()[0]:
                    assert time.monotonic() < deadline, "the retry did not wait for the endpoint's lock"
                    await asyncio.sleep(0.02)
                assert not write.done()
                side.execute("COMMIT")
                await write

            asyncio.run(retry())
        finally:
            side.close()
        rows = store.read_sync(lambda conn: conn.execute(
            SQL("SELECT state, pending_wake FROM wake_jobs, wake_endpoints WHERE id = 'j1'",
                "SELECT state, pending_wake FROM wake_jobs, wake_endpoints WHERE id = 'j1'")).fetchall())
        assert rows == [("pending", "j1")]
