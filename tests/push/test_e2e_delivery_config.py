"""Wake delivery across restarts, origins and configurations (each case with its own appliance)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from appliance.store.statement import SQL
from tests.conftest import ROOT, Server
from tests.push.delivery_helpers import (
    Apns,
    Pusher,
    delivery_config,
    jobs,
    log_rows,
    token,
    wait_until,
)
from tests.push.e2e_helpers import ANDROID, IOS, ORIGIN, db_rows

pytestmark = pytest.mark.anyio


def p_sub(user, cls="default"):
    return {"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": cls}


@pytest.fixture
def apns(tmp_path):
    a = Apns(tmp_path).start()
    yield a
    a.stop()


@pytest.mark.slow
async def test_sigkill_after_ok_before_delivery_then_restart_delivers_exactly_once(apns, tmp_path):
    # APNs is unreachable at first (nothing listens on the discard port): the wake waits in the
    # outbox, attempted at most once (transient), due again a few seconds later.
    down = apns.profile(apns_url="https://127.0.0.1:9")
    # (A claim the kill interrupts lapses after the visibility timeout: 3 s here, 60 s by default.)
    server = Server(tmp_path / "data", config=delivery_config(apns, profiles=[down], settings={
        "wake_retry_delay": 4.0, "wake_visibility_timeout": 3})).start()
    alice, bob = await Pusher.connect(server), await Pusher.connect(server)
    tok = token()
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    ev = await alice.publish(9, [["p", bob.pubkey]])  # OK true: committed together with its wake job
    server.kill()
    await alice.client.close()
    await bob.client.close()
    (job,) = jobs(server, event_id=ev.id)
    assert job["state"] in ("pending", "claimed")
    assert apns.emulator.requests(tok) == []
    # Restarted on the same data directory with APNs reachable: delivered once, with the job's id.
    server.config = delivery_config(apns, settings={"wake_visibility_timeout": 3})
    server.start()
    try:
        await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered", timeout=30)
        await asyncio.sleep(0.5)
        mine = apns.emulator.requests(tok)
        assert len(mine) == 1 and mine[0].status == 200 and mine[0].header("apns-id") == job["id"]
    finally:
        server.stop()


@pytest.mark.slow
async def test_a_crashed_claim_is_retried_after_the_visibility_timeout(apns, tmp_path):
    """SIGKILL while the request is in flight: the claim lapses and the wake goes again, same apns-id."""
    tok = token()
    apns.emulator.behave(tok, delay=30)  # APNs holds the first request: the appliance dies waiting
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"wake_visibility_timeout": 5})
                    ).start()
    alice, bob = await Pusher.connect(server), await Pusher.connect(server)
    await bob.lease(tok, subscriptions=[p_sub(bob)])
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "claimed")
    server.kill()
    await alice.client.close()
    await bob.client.close()
    apns.emulator.clear(tok)
    server.start()
    try:
        await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered", timeout=30)
        (job,) = jobs(server, event_id=ev.id)
        assert {r.header("apns-id") for r in apns.emulator.accepted(tok)} == {job["id"]}
    finally:
        server.stop()


async def test_no_cross_origin_wake(apns, tmp_path):
    other = "ws://other.test"
    extra = f'''
[[origins]]
origin = "{other}"
hosts = ["other.test"]
push = {{ app_profiles = [{apns.profile()}], push_kinds = [9] }}
'''
    server = Server(tmp_path / "data", config=delivery_config(apns, extra=extra)).start()
    opened = []
    try:
        async def at(origin, host, user=None):
            p = await Pusher.connect(server, origin, host=host, user=user)
            opened.append(p)
            return p

        alice_a, bob_a = await at(ORIGIN, "push.test"), await at(ORIGIN, "push.test")
        alice_b = await at(other, "other.test")
        bob_b = await at(other, "other.test", user=bob_a.user)
        tok = token()
        await bob_a.lease(tok, subscriptions=[p_sub(bob_a)])  # bob leases at origin A only
        ev_b = await alice_b.publish(9, [["p", bob_a.pubkey]])
        assert jobs(server, event_id=ev_b.id) == []  # an event at B never matches a lease at A
        ev_a = await alice_a.publish(9, [["p", bob_a.pubkey]])
        (job_a,) = jobs(server, event_id=ev_a.id)
        # The same installation leased at B too (its own d, as the spec requires): each origin
        # wakes it for its own events, independently.
        await bob_b.lease(tok, d="lease-at-b", subscriptions=[p_sub(bob_a)])
        ev_b2 = await alice_b.publish(9, [["p", bob_a.pubkey]])
        (job_b,) = jobs(server, event_id=ev_b2.id)
        assert job_b["origin"] != job_a["origin"] and job_b["lease_d"].startswith("lease-at-b")
        apns.emulator.wait_for(lambda r: sum(x.token == tok for x in r) == 2)
    finally:
        for p in opened:
            await p.client.close()
        server.stop()


async def test_a_profile_without_credentials_accepts_leases_and_alerts_on_delivery(tmp_path):
    server = Server(tmp_path / "data", config=delivery_config(None, profiles=[
        f'{{ id = "{IOS}", transport = "apns" }}', f'{{ id = "{ANDROID}", transport = "fcm" }}'])).start()
    try:
        alice, bob, carol = (await Pusher.connect(server), await Pusher.connect(server),
                             await Pusher.connect(server))
        tok = token()
        await bob.lease(tok, subscriptions=[p_sub(bob)])
        await carol.lease("fcm-registration-token", app_profile=ANDROID, transport="fcm",
                          subscriptions=[p_sub(carol)])
        ev = await alice.publish(9, [["p", bob.pubkey], ["p", carol.pubkey]])
        await wait_until(lambda: len(db_rows(server.data_dir, "SELECT * FROM push_alerts")) == 2)
        alerts = db_rows(server.data_dir, "SELECT app_profile, reason, detail FROM push_alerts ORDER BY app_profile")
        assert [(a[0], a[1]) for a in alerts] == [(ANDROID, "no credentials"), (IOS, "no credentials")]
        # The jobs are kept for when the operator adds credentials; no endpoint was touched.
        assert {j["state"] for j in jobs(server, event_id=ev.id)} == {"pending"}
        assert db_rows(server.data_dir, "SELECT count(*) FROM leases WHERE invalidated_at IS NOT NULL") == [(0,)]
        assert {r["outcome"] for r in log_rows(server)} == {"configuration"}
        await alice.client.close()
        await bob.client.close()
        await carol.client.close()
    finally:
        server.stop()
    assert "push configuration fault" in server.log_path.read_text()


def _serve(tmp_path, config: str) -> subprocess.CompletedProcess:
    """`appliance serve` with this config; it is expected to refuse to start."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text(config)
    from tests.pg import process_env

    args = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--config", str(cfg)]
    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=process_env(args))


BAD = [
    ({"key_file": "/nonexistent/AuthKey.p8"}, "does not exist"),
    ({"key_file": "garbage"}, "absolute path"),
    ({"team_id": "team"}, "team_id must be the 10-character identifier"),
    ({"environment": "staging"}, '"production" or "sandbox"'),
    ({"apns_url": "http://api.push.apple.com"}, "https://"),
    ({"apns_url": "https://api.push.apple.com/3/device"}, "no user, path"),
    ({"ca_file": "/nonexistent/ca.pem"}, "cannot be read: no such file or directory"),
    ({"topic": None}, "credentials need all of"),
    ({"color": "blue"}, "unknown field"),
    ("not-a-key", "not a PEM private key"),
]


def _bad_profile(tmp_path, change) -> str:
    a = Apns(tmp_path)
    if change == "not-a-key":
        a.key_file.write_text("hello")
        change = {}
    return a.profile(**{"apns_url": "https://127.0.0.1:1", "ca_file": None, **change})


@pytest.mark.parametrize("change,words", BAD)
def test_bad_credentials_are_refused_naming_the_profile(tmp_path, change, words):
    import tomllib

    from appliance.errors import ConfigError
    from appliance.push.config import check_push_config

    push = tomllib.loads(delivery_config(None, profiles=[_bad_profile(tmp_path, change)]))["push"]
    with pytest.raises(ConfigError) as err:
        check_push_config(push, "push")
    assert IOS in str(err.value) and words in str(err.value), str(err.value)
    assert "PRIVATE KEY" not in str(err.value)


def test_bad_credentials_stop_the_start(tmp_path):
    proc = _serve(tmp_path, delivery_config(None, profiles=[_bad_profile(tmp_path, {"team_id": "team"})]))
    assert proc.returncode != 0
    assert IOS in proc.stderr and "team_id must be the 10-character identifier" in proc.stderr, proc.stderr


def test_credentials_only_for_apns_profiles(tmp_path):
    a = Apns(tmp_path)
    profile = a.profile(ANDROID, transport="fcm", apns_url="https://127.0.0.1:1", ca_file=None)
    proc = _serve(tmp_path, delivery_config(a, profiles=[profile]))
    assert proc.returncode != 0 and "apns_url is an APNs setting; a fcm profile takes" in proc.stderr, proc.stderr


async def test_nip11_advertises_only_id_and_transport_and_fcm_needs_a_profile(apns, tmp_path):
    server = Server(tmp_path / "data", config=delivery_config(apns, profiles=[apns.profile()])).start()
    try:
        assert server.nip11()["push"]["app_profiles"] == [{"id": IOS, "transport": "apns"}]
        text = str(server.nip11())
        assert "TEAM123456" not in text and "AuthKey" not in text and "127.0.0.1" not in text
        # FCM and UnifiedPush are no v1 profiles: a lease naming them needs such a configured profile.
        bob = await Pusher.connect(server)
        for over, reason in ((dict(app_profile=ANDROID, transport="fcm"), "invalid: unknown app profile"),
                             (dict(transport="unifiedpush"), "invalid: transport mismatch")):
            from tests.push.e2e_helpers import active, current_key, lease

            exec_id, exec_pub = current_key(server.nip11())
            ev = lease(bob.user, active(bob.user, endpoint=token(), **over), exec_pub=exec_pub, exec_id=exec_id)
            assert await bob.client.publish(ev) == (False, reason)
        await bob.client.close()
    finally:
        server.stop()


@pytest.mark.slow
async def test_coalescing_and_the_per_endpoint_rate_cap(apns, tmp_path):
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"wake_min_interval": 3})).start()
    try:
        alice, bob = await Pusher.connect(server), await Pusher.connect(server)
        tok = token()
        await bob.lease(tok, subscriptions=[p_sub(bob, "default"),
                                            {"filter": {"kinds": [9], "authors": [alice.pubkey], "#p": [bob.pubkey]},
                                             "class": "time_sensitive"}])
        first = await alice.publish(9, [["p", bob.pubkey]])
        apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))
        # Within the interval: these wait for one wake (due 3 s after the first was sent).
        burst = [await alice.publish(9, [["p", bob.pubkey]]) for _ in range(4)]
        states = [jobs(server, event_id=e.id)[0] for e in burst]
        assert [j["state"] for j in states] == ["pending"] + ["coalesced"] * 3
        assert {j["wake_id"] for j in states[1:]} == {states[0]["id"]}
        recs = apns.emulator.wait_for(lambda r: sum(x.token == tok for x in r) == 2, timeout=15)
        mine = [r for r in recs if r.token == tok]
        assert mine[1].at - mine[0].at >= 2.5  # the cap (3 s) runs from the claim, the record at the answer
        assert mine[1].header("apns-id") == states[0]["id"]
        await asyncio.sleep(0.5)
        assert len(apns.emulator.requests(tok)) == 2  # five events, two wakes
        (wake_log,) = [r for r in log_rows(server) if r["job_id"] == states[0]["id"]]
        assert wake_log["class"] == "time_sensitive"  # the highest class among the coalesced matches
        assert jobs(server, event_id=first.id)[0]["state"] == "delivered"
        await alice.client.close()
        await bob.client.close()
    finally:
        server.stop()


async def test_dead_letters_after_the_attempt_budget_and_on_permanent_faults(apns, tmp_path):
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"wake_max_attempts": 3,
                                                                             "wake_retry_delay": 0.05})).start()
    try:
        alice, bob, carol = (await Pusher.connect(server), await Pusher.connect(server),
                             await Pusher.connect(server))
        t1, t2 = token(), token()
        apns.emulator.behave(t1, 500, "InternalServerError")
        apns.emulator.behave(t2, 413, "PayloadTooLarge")
        await bob.lease(t1, subscriptions=[p_sub(bob)])
        await carol.lease(t2, subscriptions=[p_sub(carol)])
        e1 = await alice.publish(9, [["p", bob.pubkey]])
        e2 = await alice.publish(9, [["p", carol.pubkey]])
        await wait_until(lambda: jobs(server, event_id=e1.id)[0]["state"] == "dead", timeout=20)
        await wait_until(lambda: jobs(server, event_id=e2.id)[0]["state"] == "dead")
        j1, j2 = jobs(server, event_id=e1.id)[0], jobs(server, event_id=e2.id)[0]
        assert j1["attempts"] == 3 and len(apns.emulator.requests(t1)) == 3
        assert "gave up after 3 attempts" in j1["last_error"]
        assert j2["attempts"] == 1 and "permanent request fault" in j2["last_error"]
        # The endpoints stay usable: neither outcome says the token is dead.
        assert db_rows(server.data_dir, "SELECT count(*) FROM leases WHERE invalidated_at IS NOT NULL") == [(0,)]
        await alice.client.close()
        await bob.client.close()
        await carol.client.close()
    finally:
        server.stop()
    assert "wake dead-lettered" in server.log_path.read_text()


async def test_a_configuration_fault_alerts_and_clears(apns, tmp_path):
    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    try:
        alice, bob, carol = (await Pusher.connect(server), await Pusher.connect(server),
                             await Pusher.connect(server))
        t1, t2 = token(), token()
        apns.emulator.behave(t1, 403, "InvalidProviderToken")
        await bob.lease(t1, subscriptions=[p_sub(bob)])
        await carol.lease(t2, subscriptions=[p_sub(carol)])
        ev = await alice.publish(9, [["p", bob.pubkey]])
        await wait_until(lambda: db_rows(server.data_dir, "SELECT reason, cleared_at IS NULL FROM push_alerts")
                         == [("InvalidProviderToken", 1)])
        (job,) = jobs(server, event_id=ev.id)
        assert job["state"] == "pending" and job["attempts"] == 0  # kept, and not counted against it
        assert db_rows(server.data_dir, "SELECT count(*) FROM leases WHERE invalidated_at IS NOT NULL") == [(0,)]
        # Another wake of the profile is accepted: the alert clears.
        await alice.publish(9, [["p", carol.pubkey]])
        await wait_until(lambda: db_rows(server.data_dir, "SELECT cleared_at IS NULL FROM push_alerts") == [(0,)])
        for p in (alice, bob, carol):
            await p.client.close()
    finally:
        server.stop()
    assert "push configuration fault" in server.log_path.read_text()


@pytest.mark.slow
async def test_a_graceful_stop_releases_claimed_wakes_not_yet_sent(apns, tmp_path):
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"wake_workers": 1})).start()
    alice, bob, carol = (await Pusher.connect(server), await Pusher.connect(server),
                         await Pusher.connect(server))
    held, waiting = token(), token()
    apns.emulator.behave(held, delay=30)  # the one worker is stuck on this request
    await bob.lease(held, subscriptions=[p_sub(bob)])
    await carol.lease(waiting, subscriptions=[p_sub(carol)])
    e1 = await alice.publish(9, [["p", bob.pubkey]])
    e2 = await alice.publish(9, [["p", carol.pubkey]])
    await wait_until(lambda: jobs(server, event_id=e2.id)[0]["state"] == "claimed")
    for p in (alice, bob, carol):
        await p.client.close()
    server.stop()  # SIGTERM
    # The wake that never left is pending again (due now); so is the one whose send was still
    # under way when the grace ran out (abandoned: the next start sends it again, same apns-id).
    assert jobs(server, event_id=e2.id)[0]["state"] == "pending"
    assert jobs(server, event_id=e1.id)[0]["state"] == "pending"
    assert apns.emulator.requests(waiting) == []
    apns.emulator.clear(held)
    server.start()
    try:
        await wait_until(lambda: jobs(server, event_id=e2.id)[0]["state"] == "delivered", timeout=15)
        await wait_until(lambda: jobs(server, event_id=e1.id)[0]["state"] == "delivered", timeout=15)
    finally:
        server.stop()


@pytest.mark.slow
async def test_matches_coalesced_into_a_cancelled_wake_stay_one_wake_at_its_due_time(apns, tmp_path):
    """Two accounts on one device (bob's and carol's leases name one endpoint). Carol's matches
    join the wake bob's match made under the rate cap; bob revokes his lease, cancelling that wake:
    carol's matches stay ONE wake, due when bob's was, and a later match joins it too."""
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"wake_min_interval": 10})).start()
    try:
        alice, bob, carol = (await Pusher.connect(server), await Pusher.connect(server),
                             await Pusher.connect(server))
        tok = token()
        await bob.lease(tok, subscriptions=[p_sub(bob)])
        await carol.lease(tok, subscriptions=[p_sub(carol)])
        await alice.publish(9, [["p", bob.pubkey]])
        apns.emulator.wait_for(lambda r: any(x.token == tok for x in r))  # the first wake went at once
        held = await alice.publish(9, [["p", bob.pubkey]])  # due 10 s after the first
        mates = [await alice.publish(9, [["p", carol.pubkey]]) for _ in range(3)]
        (wake,) = jobs(server, event_id=held.id)
        assert wake["state"] == "pending"
        assert [jobs(server, event_id=e.id)[0]["wake_id"] for e in mates] == [wake["id"]] * 3
        due = SQL("SELECT due_at FROM wake_jobs WHERE id = ?", "SELECT due_at FROM wake_jobs WHERE id = %s")
        (held_due,), = db_rows(server.data_dir, due, (wake["id"],))
        await bob.revoke(generation=2)
        assert jobs(server, event_id=held.id)[0]["state"] == "cancelled"
        late = await alice.publish(9, [["p", carol.pubkey]])
        orphans = [jobs(server, event_id=e.id)[0] for e in [*mates, late]]
        lead = orphans[0]
        assert [j["state"] for j in orphans] == ["pending", "coalesced", "coalesced", "coalesced"]
        assert {j["wake_id"] for j in orphans[1:]} == {lead["id"]}
        assert db_rows(server.data_dir, due, (lead["id"],)) == [(held_due,)]
        await wait_until(lambda: jobs(server, event_id=mates[0].id)[0]["state"] == "delivered", timeout=60)
        await asyncio.sleep(0.5)
        mine = apns.emulator.requests(tok)
        assert len(mine) == 2 and mine[1].header("apns-id") == lead["id"]  # six matches, two wakes
        for c in (alice, bob, carol):
            await c.client.close()
    finally:
        server.stop()


def test_a_stored_keys_profile_with_a_missing_ca_file_is_refused(tmp_path):
    """The dashboard's descriptor form saves a profile whose .p8 is in the database: its ca_file is
    still checked before the profile is saved (it was accepted, then failed at the first wake)."""
    import tomllib

    from appliance.errors import ConfigError
    from appliance.push.config import check_push_config

    profile = _bad_profile(tmp_path, {"ca_file": "/nonexistent/ca.pem"})
    push = tomllib.loads(delivery_config(None, profiles=[profile]))["push"]
    entry = push["app_profiles"][0]
    del entry["key_file"]
    entry["key_stored"] = "p8:0123456789"
    with pytest.raises(ConfigError) as err:
        check_push_config(push, "push")
    assert "app_profiles[0].ca_file" in str(err.value), str(err.value)
    assert "cannot be read: no such file or directory" in str(err.value), str(err.value)


def test_doctor_names_a_profiles_setting_as_written_not_by_its_origin(tmp_path):
    from appliance.commands.doctor import FAIL, _credentials

    profile = _bad_profile(tmp_path, {"ca_file": "/nonexistent/ca.pem"})
    entry = tomllib_profile(profile)
    [check] = list(_credentials([("ws://127.0.0.1:18300 " + IOS, "push.app_profiles[0]", entry)], {}))
    assert check.status == FAIL, check
    assert "push.app_profiles[0].ca_file" in check.detail and "ws://" not in check.detail, check.detail
    assert "Errno" not in check.detail, check.detail


def tomllib_profile(profile) -> dict:
    import tomllib

    return tomllib.loads(delivery_config(None, profiles=[profile]))["push"]["app_profiles"][0]
