"""The delivery side in the dashboard, in-process with the APNs emulator: the delivery log, the
overview's wake counters and alerts, dead letters retried and discarded, "send a test wake", and
a .p8 key uploaded through the descriptor page (stored wrapped by the key file)."""

from __future__ import annotations

import asyncio

import pytest

from appliance.nostr.event import sign_event
from appliance.store.statement import SQL
from tests import pg
from tests.pg import db_rows
from tests.push.delivery_helpers import KEY_ID, TEAM, TOPIC, Apns, token
from tests.push.e2e_helpers import Installation, active, current_key, lease

from .helpers import Dashboard, nip11, publish

pytestmark = pytest.mark.anyio

ORIGIN = "ws://push.test"


def config(apns: Apns, *, profile: str | None = None, extra: str = "") -> str:
    return (f'public_url = "{ORIGIN}"\nlease_workers = 0\nwake_min_interval = 0\nwake_retry_delay = 0.05\n{extra}'
            "[push]\n"
            f"app_profiles = [{profile or apns.profile()}]\n"
            "push_kinds = [9, 1059, 7]\nurgent_kinds = [9]\n")


@pytest.fixture
def apns(tmp_path):
    a = Apns(tmp_path).start()
    yield a
    a.stop()


async def lease_and_wake(d: Dashboard, user: Installation, endpoint: str) -> None:
    exec_id, exec_pub = current_key(await nip11(d))
    await publish(d, user.pubkey, lease(user, active(user, endpoint=endpoint, origin=ORIGIN), exec_pub=exec_pub,
                                        exec_id=exec_id))
    sender = Installation()
    await publish(d, None, sign_event(sender.secret, 9, [["p", user.pubkey]], "wake up").to_dict())


async def test_delivery_log_overview_and_dead_letters(tmp_path, apns, anyio_backend):
    d = Dashboard(tmp_path / "data", config=config(apns, extra="wake_max_attempts = 1\n"))
    try:
        await d.set_up()
        user, endpoint = Installation(), token()
        await lease_and_wake(d, user, endpoint)
        assert (await d.get("/admin/overview/stats")).text.count('id="jobs-queued">1<') == 1
        assert await d.app.push.delivery.run_once() >= 1
        apns.emulator.wait_for(lambda rs: any(r.token == endpoint for r in rs))
        for _ in range(100):
            page = await d.get("/admin/deliveries")
            if "outcome-accepted" in page.text:
                break
            await asyncio.sleep(0.05)
        assert "outcome-accepted" in page.text and "200" in page.text
        assert "lease:" in page.text
        assert endpoint not in page.text and user.pubkey not in page.text
        assert "<svg" in page.text
        assert ">1<" in (await d.get("/admin/deliveries?outcome=accepted")).text
        # A provider that keeps failing: the wake is dead-lettered after one attempt (wake_max_attempts = 1).
        user2, endpoint2 = Installation(), token()
        apns.emulator.behave(endpoint2, 503, "ServiceUnavailable")
        await lease_and_wake(d, user2, endpoint2)
        for _ in range(100):
            await d.app.push.delivery.run_once()
            dead = await d.app.store.read(lambda c: c.execute(
                SQL("SELECT id FROM wake_jobs WHERE state = 'dead'",
                    "SELECT id FROM wake_jobs WHERE state = 'dead'")).fetchall())
            if dead:
                break
            await asyncio.sleep(0.05)
        assert len(dead) == 1
        page = await d.get("/admin/deliveries")
        assert dead[0][0] in page.text and "retry" in page.text
        stats = await d.get("/admin/overview/stats")
        assert 'id="jobs-dead">1<' in stats.text
        # Retry after the provider recovers: delivered.
        apns.emulator.clear(endpoint2)
        r = await d.post_form("/admin/deliveries/dead", {"job": dead[0][0], "action": "retry"},
                              page="/admin/deliveries")
        assert r.status_code == 303
        for _ in range(100):
            await d.app.push.delivery.run_once()
            if apns.emulator.accepted(endpoint2):
                break
            await asyncio.sleep(0.05)
        assert apns.emulator.accepted(endpoint2)
        # Discard: another dead one is cancelled and leaves the list.
        user3, endpoint3 = Installation(), token()
        apns.emulator.behave(endpoint3, 503, "ServiceUnavailable")
        await lease_and_wake(d, user3, endpoint3)
        for _ in range(100):
            await d.app.push.delivery.run_once()
            dead = await d.app.store.read(lambda c: c.execute(
                SQL("SELECT id FROM wake_jobs WHERE state = 'dead'",
                    "SELECT id FROM wake_jobs WHERE state = 'dead'")).fetchall())
            if dead:
                break
            await asyncio.sleep(0.05)
        r = await d.post_form("/admin/deliveries/dead", {"job": dead[0][0], "action": "discard"},
                              page="/admin/deliveries")
        assert r.status_code == 303
        state = await d.app.store.read(lambda c: c.execute(SQL("SELECT state FROM wake_jobs WHERE id = ?",
                                                               "SELECT state FROM wake_jobs WHERE id = %s"),
                                                           (dead[0][0],)).fetchone()[0])
        assert state == "cancelled"
        # The recorder's wake gauges feed the overview's charts.
        await d.admin.recorder.sample()
        await d.admin.recorder.sample()
        assert d.admin.recorder.series("queue_depth")
    finally:
        await d.close()


async def test_alerts_and_transport_health(tmp_path, apns, anyio_backend):
    d = Dashboard(tmp_path / "data", config=config(apns))
    try:
        await d.set_up()
        apns.emulator.behave(None, 403, "InvalidProviderToken")
        user, endpoint = Installation(), token()
        await lease_and_wake(d, user, endpoint)
        for _ in range(100):
            await d.app.push.delivery.run_once()
            stats = await d.get("/admin/overview/stats")
            if "InvalidProviderToken" in stats.text:
                break
            await asyncio.sleep(0.05)
        assert "InvalidProviderToken" in stats.text and "state-fault" in stats.text
    finally:
        await d.close()


async def test_send_a_test_wake(tmp_path, apns, anyio_backend):
    d = Dashboard(tmp_path / "data", config=config(apns))
    try:
        await d.set_up()
        page = await d.get("/admin/descriptor?origin=1")
        assert "Send a test wake" in page.text
        good = token()
        r = await d.post_form("/admin/descriptor/test-wake", {"origin": "1", "profile": "com.example.app/ios",
                                                               "token": good}, page="/admin/descriptor?origin=1")
        assert r.status_code == 200 and "accepted by APNs" in r.text and good not in r.text
        assert len(apns.emulator.accepted(good)) == 1
        assert apns.emulator.accepted(good)[0].body == b'{"aps":{"alert":{"body":"Reconnect to your relay now"},' \
                                                         b'"mutable-content":1}}'
        gone = token()
        apns.emulator.unregister(gone)
        r = await d.post_form("/admin/descriptor/test-wake", {"origin": "1", "profile": "com.example.app/ios",
                                                               "token": gone}, page="/admin/descriptor?origin=1")
        assert "410" in r.text and "Unregistered" in r.text
        r = await d.post_form("/admin/descriptor/test-wake", {"origin": "1", "profile": "com.example.app/ios",
                                                               "token": "not-a-token"}, page="/admin/descriptor?origin=1")
        assert "invalid_endpoint" in r.text
    finally:
        await d.close()


async def test_p8_upload_is_stored_wrapped_and_delivers(tmp_path, apns, anyio_backend):
    d = Dashboard(tmp_path / "data", config=f'public_url = "{ORIGIN}"\nlease_workers = 0\n')
    try:
        await d.set_up()
        pem = apns.key_file.read_bytes()
        form = {"origin": "1", "push_enabled": "on", "push_kinds": "9, 1059, 7", "urgent_kinds": "9",
                "profile_id": "com.example.app/ios", "profile_transport": "apns",
                "profile_original_0": "com.example.app/ios", "cs_apns_default": "on", "cs_apns_time_sensitive": "on",
                "cred_0_topic": TOPIC, "cred_0_team_id": TEAM, "cred_0_key_id": KEY_ID,
                "cred_0_environment": "production", "cred_0_apns_url": apns.emulator.url,
                "cred_0_ca_file": apns.emulator.ca_file}
        # Push on first, without credentials (a profile with none is allowed: its wakes wait).
        r = await d.post_form("/admin/descriptor", {k: v for k, v in form.items() if not k.startswith("cred_")},
                              page="/admin/descriptor?origin=1")
        assert r.status_code == 303
        # A broken key is refused with the reason, nothing saved.
        r = await d.post_form("/admin/descriptor", form, page="/admin/descriptor?origin=1",
                              files={"cred_0_p8": ("AuthKey.p8", b"not a key", "application/octet-stream")})
        assert r.status_code == 400 and "PEM" in r.text
        r = await d.post_form("/admin/descriptor", form, page="/admin/descriptor?origin=1",
                              files={"cred_0_p8": ("AuthKey_ABC123DEFG.p8", pem, "application/octet-stream")})
        assert r.status_code == 303, r.text
        entry = d.app.relay.origins.by_id(1).push["app_profiles"][0]
        assert entry["key_stored"].startswith("p8:") and "key_file" not in entry
        page = await d.get("/admin/descriptor?origin=1")
        assert entry["key_stored"] in page.text and "uploaded, in the database" in page.text
        assert pem.decode() not in page.text
        # Not in the clear in the database.
        body = pem.split(b"\n")[1]
        if pg.on_postgres():  # the database's files are the server's: the stored row, then
            assert all(body not in bytes(w) for (w,) in db_rows(d.settings.data_path, "SELECT wrapped FROM apns_keys"))
        else:
            raw = (d.settings.data_path / "appliance.sqlite3").read_bytes()
            wal = d.settings.data_path / "appliance.sqlite3-wal"
            assert body not in raw and (not wal.exists() or body not in wal.read_bytes())
        good = token()
        r = await d.post_form("/admin/descriptor/test-wake", {"origin": "1", "profile": "com.example.app/ios",
                                                               "token": good}, page="/admin/descriptor?origin=1")
        assert "accepted by APNs" in r.text
        # NIP-11 still advertises only id and transport.
        assert (await nip11(d))["push"]["app_profiles"] == [{"id": "com.example.app/ios", "transport": "apns"}]
        # After a restart the stored key still loads.
        await d.close()
        again = Dashboard(d.settings.data_path, config=f'public_url = "{ORIGIN}"\nlease_workers = 0\n')
        try:
            transport = again.app.push.transports.get(1, "com.example.app/ios")
            from appliance.transports.apns import ApnsTransport

            assert isinstance(transport, ApnsTransport)
        finally:
            await again.close()
    finally:
        await d.close()
