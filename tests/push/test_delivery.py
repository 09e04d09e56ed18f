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
from appliance.push.descriptor import CLASS_RANK
from appliance.store import wakes
from appliance.store.sqlite import SqliteStore
from appliance.transports.apns import APNS_HOSTS, ApnsProfile
from appliance.transports.credentials import ApnsKey

ORIGIN = 1
ALICE = generate_secret()
BOB = public_key(generate_secret())
NOW = time.time()
JOB_ID = "0b7d3c8e-8f2a-4c41-9d55-6a1e2f3b4c5d"


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "data", sync_mode="normal").open()
    s.write_sync(lambda c: c.execute("INSERT INTO origins (id, origin) VALUES (1, 'wss://a.example')"))
    yield s
    s.close()


def seed(store, *, active=1, expiration=NOW + 3600, invalidated=None, generation=1, event_expiration=None,
         expires_at=None, authorized=True):
    """A lease for BOB, an event by ALICE mentioning him, and a pending wake job for it."""
    ev = sign_event(ALICE, 9, [["p", BOB]], "hi")
    ep_hash = hashlib.sha256(b"tok").hexdigest()

    def op(conn):
        conn.execute(
            "INSERT INTO leases (origin, pubkey, d, event_id, created_at, expiration, generation, active, "
            "app_profile, transport, endpoint, endpoint_hash, subscriptions, exec_key_id, invalidated_at) "
            "VALUES (1, ?, 'd1', 'lease', 0, ?, ?, ?, 'ios', 'apns', 'ab' , ?, '[]', 'k', ?)",
            (BOB, expiration, generation, active, ep_hash, invalidated))
        conn.execute("INSERT INTO events (origin, id, pubkey, created_at, kind, raw, expiration) "
                     "VALUES (1, ?, ?, ?, 9, ?, ?)", (ev.id, ev.pubkey, ev.created_at, ev.to_json(), event_expiration))
        wakes.insert_job(conn, job_id=JOB_ID, origin=1, app_profile="ios", transport="apns", endpoint_hash=ep_hash,
                         event_id=ev.id, lease_pubkey=BOB, lease_d="d1", generation=1, cls="default", now=NOW,
                         useful_age=3600, min_interval=0, rank=CLASS_RANK)
        if expires_at is not None:
            conn.execute("UPDATE wake_jobs SET expires_at = ? WHERE id = ?", (expires_at, JOB_ID))

    store.write_sync(op)
    return Delivery(store, transport_for=lambda o, p: object(), settings=DeliverySettings(),
                    authorize=lambda conn, origin, reader, e: authorized and reader == BOB and e.id == ev.id)


def state(store):
    return store.read_sync(lambda c: c.execute("SELECT state, last_error FROM wake_jobs WHERE id = ?", (JOB_ID,))
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
    store.write_sync(lambda c: c.execute("DELETE FROM leases"))
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
        store.write_sync(lambda c: c.execute("UPDATE leases SET endpoint = ?", ("ab" * 32,)))
        d.transport_for = lambda o, p: transport
        assert await d.run_once() == 1
        assert state(store) == ("delivered", None)
        (rec,) = emu.requests("ab" * 32)
        assert rec.header("apns-id") == JOB_ID
        assert await d.run_once() == 0
    finally:
        await transport.close()
        await emu.stop()
