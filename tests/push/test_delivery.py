"""The delivery workers' decisions, on a real store: the re-check before an attempt (every reason),
dead letters at the end of the useful age, the backoff, and the APNs hosts per environment."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret, public_key
from appliance.push.delivery import MAX_BACKOFF, Delivery, DeliverySettings, backoff
from appliance.store import wakes
from appliance.transports.apns import APNS_HOSTS, ApnsProfile
from appliance.transports.credentials import ApnsKey
from appliance.store.statement import SQL
from tests.pg import make_store

ORIGIN = 1
ALICE = generate_secret()
BOB = public_key(generate_secret())
NOW = time.time()
JOB_ID = "0b7d3c8e-8f2a-4c41-9d55-6a1e2f3b4c5d"


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path / "data", sync_mode="normal").open()
    s.write_sync(lambda c: c.execute(SQL("INSERT INTO origins (id, origin) VALUES (1, 'wss://a.example')",
                                         "INSERT INTO origins (id, origin) VALUES (1, 'wss://a.example')")))
    yield s
    s.close()


def seed(store, *, active=1, expiration=NOW + 3600, invalidated=None, generation=1, event_expiration=None,
         expires_at=None, authorized=True):
    """A lease for BOB, an event by ALICE mentioning him, and a pending wake job for it."""
    ev = sign_event(ALICE, 9, [["p", BOB]], "hi")
    ep_hash = hashlib.sha256(b"tok").hexdigest()

    def op(conn):
        conn.execute(
            SQL("INSERT INTO leases (origin, pubkey, d, event_id, created_at, expiration, generation, active, "
                "app_profile, transport, endpoint, endpoint_hash, subscriptions, exec_key_id, invalidated_at) "
                "VALUES (1, ?, 'd1', 'lease', 0, ?, ?, ?, 'ios', 'apns', 'ab' , ?, '[]', 'k', ?)",
                "INSERT INTO leases (origin, pubkey, d, event_id, created_at, expiration, generation, active, "
                "app_profile, transport, endpoint, endpoint_hash, subscriptions, exec_key_id, invalidated_at) "
                "VALUES (1, %s, 'd1', 'lease', 0, %s, %s, %s, 'ios', 'apns', 'ab' , %s, '[]', 'k', %s)"),
            (BOB, expiration, generation, active, ep_hash, invalidated))
        conn.execute(SQL("INSERT INTO events (origin, id, pubkey, created_at, kind, raw, expiration) "
                         "VALUES (1, ?, ?, ?, 9, ?, ?)",
                         "INSERT INTO events (origin, id, pubkey, created_at, kind, raw, expiration) "
                         "VALUES (1, %s, %s, %s, 9, %s, %s) RETURNING rowid", returns_id=True),
                     (ev.id, ev.pubkey, ev.created_at, ev.to_json(), event_expiration))
        wakes.insert_job(conn, job_id=JOB_ID, origin=1, app_profile="ios", transport="apns", endpoint_hash=ep_hash,
                         event_id=ev.id, lease_pubkey=BOB, lease_d="d1", generation=1, cls="default", now=NOW,
                         useful_age=3600, min_interval=0)
        if expires_at is not None:
            conn.execute(SQL("UPDATE wake_jobs SET expires_at = ? WHERE id = ?",
                             "UPDATE wake_jobs SET expires_at = %s WHERE id = %s"), (expires_at, JOB_ID))

    store.write_sync(op)
    return Delivery(store, transport_for=lambda o, p: object(), settings=DeliverySettings(),
                    authorize=lambda conn, origin, reader, e: authorized and reader == BOB and e.id == ev.id)


def state(store):
    return store.read_sync(lambda c: c.execute(SQL("SELECT state, last_error FROM wake_jobs WHERE id = ?",
                                                   "SELECT state, last_error FROM wake_jobs WHERE id = %s"), (JOB_ID,))
                           .fetchone())


@pytest.mark.parametrize("kw,reason", [
    ({}, None),
    ({"active": 0}, "lease revoked"),
    ({"expiration": NOW - 1}, "lease expired"),
    ({"generation": 2}, "lease replaced by a newer generation"),
    ({"invalidated": NOW}, "endpoint generation invalidated"),
    ({"event_expiration": int(NOW) - 1}, "event not readable by the lease author"),
    ({"authorized": False}, "event not readable by the lease author"),
])
def test_the_recheck_before_an_attempt(store, kw, reason):
    d = seed(store, **kw)
    claimed = store.write_sync(lambda c: d.claim(c, time.time(), 10))
    if reason is None:
        assert [w.job.id for w in claimed] == [JOB_ID] and claimed[0].endpoint == "ab"
        assert state(store)[0] == "claimed"
    else:
        assert claimed == [] and state(store) == ("dropped", reason)


def test_a_lease_gone_drops_the_wake(store):
    d = seed(store)
    store.write_sync(lambda c: c.execute(SQL("DELETE FROM leases", "DELETE FROM leases")))
    assert store.write_sync(lambda c: d.claim(c, time.time(), 10)) == []
    assert state(store) == ("dropped", "lease gone")


def test_past_its_useful_age_a_wake_is_dead_lettered(store):
    d = seed(store, expires_at=NOW - 1)
    assert store.write_sync(lambda c: d.claim(c, time.time(), 10)) == []
    assert state(store) == ("dead", "useful age passed")


def test_a_profile_that_left_the_descriptor_drops_its_wakes(store):
    d = seed(store)
    d.transport_for = lambda o, p: None
    assert store.write_sync(lambda c: d.claim(c, time.time(), 10)) == []
    assert state(store) == ("dropped", "app profile no longer configured")


def test_backoff_doubles_with_jitter_and_is_bounded():
    assert backoff(1, 2.0, rng=lambda: 1.0) == 2.0 and backoff(1, 2.0, rng=lambda: 0.0) == 1.0
    assert backoff(4, 2.0, rng=lambda: 1.0) == 16.0
    assert backoff(40, 2.0, rng=lambda: 1.0) == MAX_BACKOFF


def test_environments_pick_apples_hosts(tmp_path):
    from appliance.testing.tls import make_p8

    make_p8(tmp_path / "k.p8")
    key = ApnsKey.load("TEAM123456", "ABC123DEFG", tmp_path / "k.p8")
    assert ApnsProfile("p", "t", "production", key).base_url == "https://api.push.apple.com"
    assert ApnsProfile("p", "t", "sandbox", key).base_url == "https://api.sandbox.push.apple.com"
    assert ApnsProfile("p", "t", "sandbox", key, apns_url="https://127.0.0.1:8443/").base_url == \
        "https://127.0.0.1:8443"
    assert set(APNS_HOSTS) == {"production", "sandbox"}
    assert json.dumps(APNS_HOSTS)


@pytest.mark.anyio
async def test_run_once_drives_one_round_through_apns(store, tmp_path, anyio_backend):
    """The workers step by step: claim, send to the (emulated) APNs, record."""
    from appliance.testing.apns_emulator import ApnsEmulator
    from appliance.testing.tls import make_p8
    from appliance.transports.apns import ApnsTransport

    key = make_p8(tmp_path / "k.p8")
    emu = ApnsEmulator(topics=["com.example.app"], pki_dir=tmp_path / "pki")
    emu.add_key("TEAM123456", "ABC123DEFG", key)
    await emu.start()
    transport = ApnsTransport(ApnsProfile("ios", "com.example.app", "production",
                                          ApnsKey.load("TEAM123456", "ABC123DEFG", tmp_path / "k.p8"),
                                          apns_url=emu.url, ca_file=emu.ca_file))
    try:
        d = seed(store)
        store.write_sync(lambda c: c.execute(SQL("UPDATE leases SET endpoint = ?",
                                                 "UPDATE leases SET endpoint = %s"), ("ab" * 32,)))
        d.transport_for = lambda o, p: transport
        assert await d.run_once() == 1
        assert state(store) == ("delivered", None)
        (rec,) = emu.requests("ab" * 32)
        assert rec.header("apns-id") == JOB_ID
        assert await d.run_once() == 0
    finally:
        await transport.close()
        await emu.stop()


def test_outcomes_recorded_together_write_what_recording_them_one_by_one_writes():
    """`record_many` (runs of accepted attempts written a statement per step) leaves every table
    as `record` called per outcome in the same order does: log rows, job states and attempt
    counts, coalesced members' finish times, alerts raised and cleared in between."""
    import apsw

    from appliance.push.delivery import Wake
    from appliance.store.schema import MIGRATIONS
    from appliance.transports import ACCEPTED, CONFIGURATION, PERMANENT, Outcome

    def world():
        c = apsw.Connection(":memory:")
        for m in MIGRATIONS:
            c.execute(m)
        jobs = []
        for i, (profile, ep) in enumerate([("ios", "h1"), ("ios", "h2"), ("mac", "h3"), ("ios", "h4"), ("ios", "h5"),
                                           ("mac", "h6")]):
            wakes.insert_job(c, job_id=f"j{i}", origin=1, app_profile=profile, transport="apns", endpoint_hash=ep,
                             event_id=f"e{i}", lease_pubkey="a" * 64, lease_d=f"d{i}", generation=1, cls="default",
                             now=NOW, useful_age=3600, min_interval=2.0)
        # a second match for h1 joins j0's wake (a coalesced member finishes with it)
        wakes.insert_job(c, job_id="m0", origin=1, app_profile="ios", transport="apns", endpoint_hash="h1",
                         event_id="e9", lease_pubkey="a" * 64, lease_d="d0", generation=1, cls="time_sensitive",
                         now=NOW, useful_age=3600, min_interval=2.0)
        wakes.raise_alert(c, 1, "mac", "BadTopic", "old", 400, NOW - 10)
        for job in wakes.due_wakes(c, NOW, 10):
            wakes.claim_wake(c, job, NOW, 60)
            jobs.append(job)
        return c, sorted(jobs, key=lambda j: j.id)

    outcomes = [Outcome(ACCEPTED, 200), Outcome(ACCEPTED, 200, detail="via gateway"),
                Outcome(CONFIGURATION, 403, "InvalidProviderToken"), Outcome(ACCEPTED, 200),
                Outcome(PERMANENT, 400, "BadPriority"), Outcome(ACCEPTED, 200)]
    dl = Delivery(None, transport_for=lambda o, p: None, authorize=lambda *a: True, settings=DeliverySettings())
    dump = []
    for together in (False, True):
        c, jobs = world()
        items = [(Wake(job, "ab", job.cls, 1), out, 1.5 + i) for i, (job, out) in enumerate(zip(jobs, outcomes))]
        with c:
            if together:
                dl.record_many(c, items, NOW + 1)
            else:
                for item in items:
                    dl.record(c, *item, NOW + 1)
        dump.append([list(c.execute(f"SELECT * FROM {t} ORDER BY 1, 2"))
                     for t in ("wake_jobs", "delivery_log", "push_alerts")])
    assert dump[0] == dump[1]
    jobs_after = {r[0]: r for r in dump[1][0]}
    assert jobs_after["j0"][10] == "delivered" and jobs_after["j0"][15] == 1
    assert jobs_after["m0"][16] == NOW + 1  # the coalesced member finished with its wake
    assert [r[9] for r in dump[1][1]] == ["accepted", "accepted", "configuration", "accepted", "permanent", "accepted"]
    # the mac alert raised by j2 was cleared again by j5 (accepted, later in the same batch)
    assert {(r[1], r[2]): r[8] for r in dump[1][2]}[("mac", "InvalidProviderToken")] == NOW + 1
