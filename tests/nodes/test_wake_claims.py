"""Wake jobs across nodes, at the store (PostgreSQL, two connections standing for two nodes' writers):
claims skip what another node's open claim holds; coalescing and the per-endpoint rate cap hold
when two nodes match events for one endpoint at the same time."""

from __future__ import annotations

import threading
import time

import pytest

from appliance.store import wakes

psycopg = pytest.importorskip("psycopg", reason="several nodes need PostgreSQL: psycopg is not installed")
pytest.importorskip("appliance.store.postgres", reason="several nodes need the PostgreSQL store (appliance.store."
                    "postgres), which this build does not have")

T0 = time.time()


@pytest.fixture
def two(pg_cluster):
    from appliance.store.pg_schema import migrate
    from appliance.store.postgres import PgConnection, _configure

    url = pg_cluster.new_database()
    conns = []
    for _ in range(2):
        raw = psycopg.connect(url, autocommit=True)
        _configure(raw)
        conns.append(PgConnection(raw))
    migrate(conns[0].raw)
    yield conns
    for c in conns:
        c.close()


def add(conn, job_id, event_id, *, endpoint="h1", now=T0, interval=2.0):
    return wakes.insert_job(conn, job_id=job_id, origin=1, app_profile="ios", transport="apns",
                            endpoint_hash=endpoint, event_id=event_id, lease_pubkey="a" * 64, lease_d="dd",
                            generation=1, cls="default", now=now, useful_age=3600, min_interval=interval)


def in_thread(fn):
    """Run `fn` on a thread; returns (thread, result list)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_claims_skip_the_wakes_another_node_holds(two):
    a, b = two
    for i in range(4):
        assert add(a, f"j{i}", f"e{i}", endpoint=f"h{i}", now=T0 - 10) == "pending"
    with a:
        mine = wakes.due_wakes_checked(a, T0, 2)
        assert [job.id for job, *_ in mine] == ["j0", "j1"]
        with b:  # node B claims while A's claim is still open: it gets the others, at once
            theirs = wakes.due_wakes_checked(b, T0, 10)
            assert [job.id for job, *_ in theirs] == ["j2", "j3"]
            wakes.claim_wakes(b, [job for job, *_ in theirs], T0, visibility=60)
        wakes.claim_wakes(a, [job for job, *_ in mine], T0, visibility=60)
    with b:
        assert wakes.due_wakes_checked(b, T0 + 1, 10) == []  # all claimed, none lapsed
        # A claim lapses after the visibility timeout (the node that held it died): any node takes it.
        assert len(wakes.due_wakes_checked(b, T0 + 61, 10)) == 4


def test_two_nodes_matching_one_endpoint_make_one_wake(two):
    a, b = two
    with a:
        assert add(a, "j1", "e1") == "pending"
        # Node B matches another event for the same endpoint before A commits: it waits for A's
        # decision, then joins A's wake instead of making a second one.
        t, out = in_thread(lambda: add(b, "j2", "e2"))
        t.join(0.5)
        assert t.is_alive()
    t.join(10)
    assert out == ["coalesced"]
    assert [(j.id, j.state, j.wake_id) for j in sorted(wakes.list_jobs(a), key=lambda j: j.id)] == [
        ("j1", "pending", None), ("j2", "coalesced", "j1")]


def test_the_rate_cap_holds_across_nodes(two):
    a, b = two
    assert add(a, "j1", "e1", now=T0 - 1) == "pending"
    with a:
        (item,) = wakes.due_wakes_checked(a, T0, 10)
        wakes.claim_wakes(a, [item[0]], T0, visibility=60)  # sent now: the next one waits 2 s
        t, out = in_thread(lambda: add(b, "j2", "e2", now=T0))
        t.join(0.5)
        assert t.is_alive()
    t.join(10)
    assert out == ["pending"]
    (job,) = [j for j in wakes.list_jobs(b) if j.id == "j2"]
    assert job.due_at == pytest.approx(T0 + 2.0)
