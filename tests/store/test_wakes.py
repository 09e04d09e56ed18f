"""The wake outbox's store functions: job identity, coalescing, the rate cap, claims, the log,
alerts, retention, and the read functions an operator view uses."""

from __future__ import annotations

import apsw
import pytest

from appliance.store import wakes
from appliance.store.schema import MIGRATIONS
from appliance.store.statement import SQL
from tests import pg

T0 = 1_800_000_000.0


@pytest.fixture
def conn(tmp_path):
    """A connection to a fresh database, each statement its own transaction."""
    if pg.on_postgres():
        import psycopg

        from appliance.store.postgres import PgConnection, _configure

        raw = psycopg.connect(pg.database_for(tmp_path), autocommit=True)
        _configure(raw)
        c = PgConnection(raw)
        yield c
        c.close()
        return
    c = apsw.Connection(":memory:")
    for m in MIGRATIONS:
        c.execute(m)
    yield c


def add(conn, job_id, event_id, *, endpoint="h1", cls="default", now=T0, interval=2.0, origin=1, pubkey="a" * 64):
    return wakes.insert_job(conn, job_id=job_id, origin=origin, app_profile="ios", transport="apns",
                            endpoint_hash=endpoint, event_id=event_id, lease_pubkey=pubkey, lease_d="dd", generation=1,
                            cls=cls, now=now, useful_age=3600, min_interval=interval)


def test_one_job_per_endpoint_and_event(conn):
    assert add(conn, "j1", "e1") == "pending"
    assert add(conn, "j2", "e1") is None  # replayed: no second job
    assert add(conn, "j3", "e1", origin=2) == "pending"  # another origin is another job
    assert add(conn, "j4", "e1", endpoint="h2") == "pending"  # another endpoint too
    assert sorted(j.id for j in wakes.list_jobs(conn)) == ["j1", "j3", "j4"]


def test_matches_coalesce_into_the_pending_wake_each_keeping_its_class(conn):
    """The wake's class is chosen at each claim from the jobs that still pass (push.delivery)."""
    add(conn, "j1", "e1", cls="default")
    assert add(conn, "j2", "e2", cls="time_sensitive") == "coalesced"
    assert add(conn, "j3", "e3", cls="silent") == "coalesced"
    (wake,) = wakes.due_wakes(conn, T0, 10)
    assert (wake.id, wake.cls) == ("j1", "default")
    assert {(m.id, m.cls) for m in wakes.wake_members(conn, "j1")} == {("j2", "time_sensitive"), ("j3", "silent")}
    wakes.claim_wake(conn, wake, T0, visibility=60)
    assert wakes.jobs_by_id(conn, ["j1"])["j1"].cls == "default"


def test_the_rate_cap_delays_the_next_wake(conn):
    add(conn, "j1", "e1")
    (wake,) = wakes.due_wakes(conn, T0, 10)
    wakes.claim_wake(conn, wake, T0, visibility=60)
    wakes.set_state(conn, "j1", "delivered", T0 + 0.1)
    assert add(conn, "j2", "e2", now=T0 + 0.5) == "pending"
    assert wakes.due_wakes(conn, T0 + 1.9, 10) == []
    assert [w.id for w in wakes.due_wakes(conn, T0 + 2.0, 10)] == ["j2"]
    assert wakes.next_due(conn) == T0 + 2.0


def test_a_lapsed_claim_is_due_again(conn):
    add(conn, "j1", "e1")
    (wake,) = wakes.due_wakes(conn, T0, 10)
    wakes.claim_wake(conn, wake, T0, visibility=30)
    assert wakes.due_wakes(conn, T0 + 29, 10) == []
    (again,) = wakes.due_wakes(conn, T0 + 30, 10)
    assert again.id == "j1" and again.state == "claimed"


def test_cancel_frees_the_jobs_of_other_leases_that_had_joined(conn):
    add(conn, "j1", "e1", pubkey="a" * 64)
    add(conn, "j2", "e2", pubkey="b" * 64)  # another lease on the same endpoint joins j1
    assert wakes.cancel_lease_jobs(conn, 1, "a" * 64, "dd", T0, "lease revoked") == 1
    (j2,) = [j for j in wakes.list_jobs(conn) if j.id == "j2"]
    assert (j2.state, j2.wake_id) == ("pending", None)


def test_log_alerts_counts_and_reads(conn):
    add(conn, "j1", "e1")
    (job,) = wakes.due_wakes(conn, T0, 10)
    wakes.log_attempt(conn, job, at=T0, cls="default", attempt=1, outcome="transient", status=503,
                      reason="ServiceUnavailable", latency_ms=3.5)
    wakes.log_attempt(conn, job, at=T0 + 5, cls="default", attempt=2, outcome="accepted", status=200, reason=None,
                      latency_ms=2.0)
    rows = wakes.delivery_log(conn)
    assert [r["outcome"] for r in rows] == ["accepted", "transient"]
    assert rows[0]["lease"] == wakes.redact_lease("a" * 64, "dd") and "a" * 64 not in str(rows)
    assert [r["attempt"] for r in wakes.delivery_log(conn, outcome="transient")] == [1]
    assert wakes.delivery_log(conn, since=T0 + 1)[0]["status"] == 200
    with pytest.raises(TypeError):
        wakes.delivery_log(conn, endpoint="x")
    assert wakes.raise_alert(conn, 1, "ios", "InvalidProviderToken", "403 ...", 403, T0) is True
    assert wakes.raise_alert(conn, 1, "ios", "InvalidProviderToken", "403 ...", 403, T0 + 1) is False
    (alert,) = wakes.alerts(conn)
    assert (alert["count"], alert["first_at"], alert["last_at"]) == (2, T0, T0 + 1)
    assert wakes.clear_alerts(conn, 1, "ios", T0 + 2) == 1
    assert wakes.alerts(conn) == [] and len(wakes.alerts(conn, active_only=False)) == 1
    assert wakes.raise_alert(conn, 1, "ios", "InvalidProviderToken", "again", 403, T0 + 3) is True  # back
    counts = wakes.job_counts(conn)
    assert counts["pending"] == 1 and set(counts) == set(wakes.JOB_STATES)


def test_retention(conn):
    add(conn, "j1", "e1")
    add(conn, "j2", "e2", endpoint="h2")
    (job, _) = wakes.due_wakes(conn, T0, 10)
    wakes.set_state(conn, "j1", "delivered", T0)
    wakes.log_attempt(conn, job, at=T0, cls="default", attempt=1, outcome="accepted", status=200, reason=None,
                      latency_ms=1.0)
    assert wakes.purge(conn, T0 + 100, retention=1000) == 0
    assert wakes.purge(conn, T0 + 1001, retention=1000) == 2  # the finished job and its log row
    assert [j.id for j in wakes.list_jobs(conn)] == ["j2"]  # unfinished jobs are never purged


def _plan(conn, sql, args):
    return " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))


@pytest.mark.sqlite_only("reads SQLite's query plan (EXPLAIN QUERY PLAN)")
@pytest.mark.parametrize("name,args,uses", [
    ("SQL_DUE", (0.0, 10), "USING INDEX wake_jobs_due"),
    ("SQL_DUE_CHECKED", (0.0, 10), "USING INDEX wake_jobs_due"),
    ("SQL_MEMBERS_CHECKED", ('["a"]',), "USING INDEX wake_jobs_wake"),
    ("SQL_NEXT_DUE", (), "USING INDEX wake_jobs_due"),
    ("SQL_ENDPOINT", (1, "ios", "apns", "h"), "USING PRIMARY KEY"),
    ("SQL_IS_PENDING", ("j",), "USING PRIMARY KEY"),
    ("SQL_CANCEL_LEASE", (0.0, "", 1, "p", "d"), "USING INDEX wake_jobs_lease"),
])
def test_hot_statements_use_their_index(conn, name, args, uses):
    """The claim, the match and the lease hooks never walk every job (finished coalesced jobs, a
    backlog of rate-capped wakes) nor sort them."""
    plan = _plan(conn, getattr(wakes, name), args)
    assert uses in plan and "TEMP B-TREE FOR ORDER BY" not in plan, plan


@pytest.mark.sqlite_only("reads SQLite's query plan (EXPLAIN QUERY PLAN)")
def test_candidates_are_found_through_the_selector_index(conn):
    from appliance.store.leases import SQL_CANDIDATES

    plan = _plan(conn, SQL_CANDIDATES, ('[["p", "x"]]', 1, 0))
    assert "SEARCH s USING PRIMARY KEY (origin=? AND selector_type=? AND value=?)" in plan, plan
    assert "SCAN s" not in plan and "SCAN l" not in plan


def test_a_retried_or_released_wake_is_joined_by_later_matches(conn):
    """The endpoint's pending wake is a hint in wake_endpoints (no index of jobs by endpoint):
    every way a job becomes pending again names it there."""
    add(conn, "j1", "e1")
    (wake,) = wakes.due_wakes(conn, T0, 10)
    wakes.claim_wake(conn, wake, T0, visibility=60)
    assert add(conn, "j2", "e2", now=T0 + 0.1) == "pending"  # j1 is being sent: a new wake
    wakes.claim_wake(conn, wakes.jobs_by_id(conn, ["j2"])["j2"], T0 + 3, visibility=60)
    wakes.reschedule(conn, "j1", T0 + 10, "503")  # j1 failed: pending again
    assert add(conn, "j3", "e3", now=T0 + 4) == "coalesced"
    assert [m.id for m in wakes.wake_members(conn, "j1")] == ["j3"]
    assert wakes.release(conn, ["j2"], T0 + 5) == 1  # a graceful stop gives j2 back
    assert add(conn, "j4", "e4", now=T0 + 6) == "coalesced"
    assert {m.id for m in wakes.wake_members(conn, "j2")} == {"j4"}


def test_a_claim_batch_writes_what_claiming_its_wakes_one_by_one_writes(conn):
    """claim_wakes (a statement per step for the batch) against claim_wake per wake: the same job
    rows and the same endpoint rows (send noted, hints of the claimed wakes cleared, a row made for
    an endpoint never noted before, hints of other wakes kept)."""
    def state():
        jobs = conn.execute(SQL("SELECT id, state, due_at FROM wake_jobs ORDER BY id",
                                "SELECT id, state, due_at FROM wake_jobs ORDER BY id")).fetchall()
        ends = conn.execute(SQL("SELECT origin, endpoint_hash, last_sent_at, pending_wake FROM wake_endpoints "
                                "ORDER BY origin, endpoint_hash",
                                "SELECT origin, endpoint_hash, last_sent_at, pending_wake FROM wake_endpoints "
                                "ORDER BY origin, endpoint_hash")).fetchall()
        return [tuple(r) for r in jobs], [tuple(r) for r in ends]

    def setup(prefix):
        add(conn, f"{prefix}1", "e1", endpoint=f"{prefix}-a")  # pending, hinted
        add(conn, f"{prefix}2", "e1", endpoint=f"{prefix}-b", origin=2)  # another origin, hinted
        add(conn, f"{prefix}3", "e1", endpoint=f"{prefix}-c")
        wakes.claim_wake(conn, wakes.jobs_by_id(conn, [f"{prefix}3"])[f"{prefix}3"], T0, visibility=60)
        add(conn, f"{prefix}4", "e2", endpoint=f"{prefix}-c", now=T0 + 0.5)  # c: a claim out, a new wake
        add(conn, f"{prefix}5", "e1", endpoint=f"{prefix}-d")  # not claimed: its hint stays
        conn.execute(SQL("DELETE FROM wake_endpoints WHERE endpoint_hash = ?",
                         "DELETE FROM wake_endpoints WHERE endpoint_hash = %s"), (f"{prefix}-a",))  # never noted
        return [wakes.jobs_by_id(conn, [f"{prefix}{i}"])[f"{prefix}{i}"] for i in (1, 2, 3, 4)]

    def strip(rows, prefix):
        jobs, ends = rows
        return ([(i[len(prefix):], *r) for i, *r in jobs if i.startswith(prefix)],
                [(o, h[len(prefix):], t, p and p[len(prefix):]) for o, h, t, p in ends if h.startswith(prefix)])

    one = setup("x")
    for job in one:  # x3's claim lapsed and x4 is due: both go in this claim
        wakes.claim_wake(conn, job, T0 + 70, visibility=60)
    batch = setup("y")
    wakes.claim_wakes(conn, batch, T0 + 70, visibility=60)
    expected = strip(state(), "x")
    assert strip(state(), "y") == expected
    assert (1, "-a", T0 + 70, None) in expected[1]  # made
    assert (1, "-c", T0 + 70, None) in expected[1]  # two wakes of one endpoint in one claim
    assert (1, "-d", None, "5") in expected[1]  # kept


def test_a_stale_hint_starts_a_new_wake(conn):
    add(conn, "j1", "e1")
    wakes.set_state(conn, "j1", "dropped", T0, "lease gone")  # no longer pending
    assert add(conn, "j2", "e2") == "pending"
    assert add(conn, "j3", "e3") == "coalesced"
    assert [m.id for m in wakes.wake_members(conn, "j2")] == ["j3"]


def test_orphans_of_a_cancelled_wake_and_a_retried_dead_job_are_joined(conn):
    add(conn, "j1", "e1", pubkey="a" * 64)
    add(conn, "j2", "e2", pubkey="b" * 64)  # another lease's match joined j1's wake
    assert wakes.cancel_lease_jobs(conn, 1, "a" * 64, "dd", T0, "lease revoked") == 1
    assert add(conn, "j3", "e3", pubkey="b" * 64) == "coalesced"
    assert [m.id for m in wakes.wake_members(conn, "j2")] == ["j3"]
    add(conn, "k1", "e1", endpoint="h9")
    wakes.set_state(conn, "k1", "dead", T0, "gave up")
    assert wakes.retry_dead(conn, "k1", T0 + 1, 3600)
    assert add(conn, "k2", "e2", endpoint="h9", now=T0 + 2) == "coalesced"


def test_hint_rows_of_endpoints_never_sent_to_are_purged_once_stale(conn):
    add(conn, "j1", "e1")
    count = SQL("SELECT count(*) FROM wake_endpoints", "SELECT count(*) FROM wake_endpoints")
    wakes.purge(conn, T0, retention=1000)
    assert conn.execute(count).fetchone()[0] == 1  # j1 still pending: kept
    wakes.set_state(conn, "j1", "dropped", T0, "lease gone")
    wakes.purge(conn, T0, retention=1000)
    assert conn.execute(count).fetchone()[0] == 0


def test_migration_12_names_the_pending_wakes_of_an_existing_outbox():
    c = apsw.Connection(":memory:")
    for m in MIGRATIONS[:11]:
        c.execute(m)
    c.execute("INSERT INTO wake_jobs (id, origin, app_profile, transport, endpoint_hash, event_id, lease_pubkey, "
              "lease_d, generation, class, state, created_at, due_at, expires_at) VALUES "
              "('p1', 1, 'ios', 'apns', 'h1', 'e1', 'a', 'd', 1, 'default', 'pending', 0, 0, 9e9), "
              "('s1', 1, 'ios', 'apns', 'h2', 'e1', 'a', 'd', 1, 'default', 'claimed', 0, 0, 9e9)")
    c.execute("INSERT INTO wake_endpoints VALUES (1, 'ios', 'apns', 'h2', 5.0)")
    for m in MIGRATIONS[11:]:
        c.execute(m)
    rows = c.execute("SELECT endpoint_hash, last_sent_at, pending_wake FROM wake_endpoints ORDER BY 1").fetchall()
    assert rows == [("h1", None, "p1"), ("h2", 5.0, None)]
    assert wakes.insert_job(c, job_id="p2", origin=1, app_profile="ios", transport="apns", endpoint_hash="h1",
                            event_id="e2", lease_pubkey="a", lease_d="d", generation=1, cls="default", now=1.0,
                            useful_age=3600, min_interval=2) == "coalesced"


def test_the_orphans_of_a_cancelled_wake_become_one_wake_at_its_due_time(conn):
    """Two accounts (leases a and b) on one device: b's matches joined a's rate-capped wake. a's
    lease ends: b's matches still make ONE wake, due when the cancelled one was (not at once), and
    later matches join it."""
    add(conn, "j0", "e0", pubkey="a" * 64)
    wakes.claim_wake(conn, wakes.due_wakes(conn, T0, 10)[0], T0, visibility=60)  # a wake went at T0
    assert add(conn, "j1", "e1", pubkey="a" * 64, now=T0 + 0.5) == "pending"  # due at T0 + 2 (the cap)
    assert add(conn, "j2", "e2", pubkey="b" * 64, now=T0 + 0.6) == "coalesced"
    assert add(conn, "j3", "e3", pubkey="b" * 64, now=T0 + 0.7) == "coalesced"
    assert wakes.cancel_lease_jobs(conn, 1, "a" * 64, "dd", T0 + 0.8, "lease revoked") == 1
    assert add(conn, "j4", "e4", pubkey="b" * 64, now=T0 + 0.9) == "coalesced"
    assert wakes.due_wakes(conn, T0 + 1.9, 10) == []  # nothing before the cap
    (wake,) = wakes.due_wakes(conn, T0 + 2, 10)
    assert wake.due_at == T0 + 2
    members = {m.id for m in wakes.wake_members(conn, wake.id)}
    assert {wake.id} | members == {"j2", "j3", "j4"}
