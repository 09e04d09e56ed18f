"""Truthful transport health in a real `appliance serve` process with the APNs emulator: APNs down
(connection refused) makes the profile `failing` on the overview, in `/admin/health` and in
`/admin/metrics`, and raises an alert; APNs back, the next wake is accepted and clears it. A CA
file changed on disk is read again without a restart."""

from __future__ import annotations

import re
import shutil

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Server
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, jobs, token, wait_until
from tests.push.e2e_helpers import IOS

from .test_server import admin_url, set_password

pytestmark = pytest.mark.anyio

METRICS_TOKEN = "metrics-token-for-the-health-test"


def p_sub(user) -> list:
    return [{"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": "time_sensitive"}]


def signed_in(server: Server) -> httpx.Client:
    client = httpx.Client(base_url=server.http)
    url = admin_url(server)  # it names public_url's host: reach it on the loopback port instead
    r = set_password(client, server.http + url[url.index("/admin/"):])
    assert r.status_code == 303, r.text
    return client


def profile_state(server: Server) -> dict:
    body = httpx.get(server.http + "/admin/health").json()
    return {t["app_profile"]: t for t in body.get("transports", [])}


def metric(server: Server, state: str) -> str | None:
    text = httpx.get(server.http + "/admin/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "appliance_transport_state" and s.labels.get("app_profile") == IOS \
                    and s.labels.get("state") == state:
                return f"{s.value:g}"
    return None


async def test_apns_down_is_failing_with_an_alert_and_the_next_success_clears_it(tmp_path):
    apns = Apns(tmp_path).start()
    port = apns.emulator.port
    config = delivery_config(apns, settings={"metrics_token": METRICS_TOKEN, "wake_retry_delay": 0.3},
                             profiles=[apns.profile()])
    apns.stop()  # APNs is down: nothing listens on its port
    server = Server(tmp_path / "data", config=config).start()
    try:
        dash = signed_in(server)
        alice, bob = await Pusher.connect(server), await Pusher.connect(server)
        tok = token()
        await bob.lease(tok, subscriptions=p_sub(bob))
        ev = await alice.publish(9, [["p", bob.pubkey]])
        await wait_until(lambda: profile_state(server).get(IOS, {}).get("state") == "failing", timeout=30)
        health = profile_state(server)[IOS]
        assert health["reason"] == "connection refused" and "127.0.0.1" not in str(health)
        assert metric(server, "failing") == "1" and metric(server, "ok") == "0"
        stats = dash.get("/admin/overview/stats").text
        assert "state-failing" in stats and "connection refused" in stats
        assert re.search(r'class="alert">[^<]*connection refused', stats), stats
        (job,) = jobs(server, event_id=ev.id)
        assert job["state"] in ("pending", "claimed")  # kept for when APNs is back

        apns.emulator.start_in_thread(port=port)  # APNs back on the same address
        try:
            apns.emulator.wait_for(lambda rs: any(r.token == tok and r.status == 200 for r in rs), timeout=60)
            await wait_until(lambda: profile_state(server)[IOS]["state"] == "ok", timeout=30)
            assert metric(server, "failing") == "0" and metric(server, "ok") == "1"
            stats = dash.get("/admin/overview/stats").text
            assert "state-failing" not in stats and 'class="alert"' not in stats and 'id="no-alerts"' in stats
        finally:
            apns.stop()
        for p in (alice, bob):
            await p.client.close()
        dash.close()
    finally:
        server.stop()
    assert "push transport failing" in server.log_path.read_text()


@pytest.mark.slow
async def test_a_ca_file_changed_on_disk_is_read_again(tmp_path):
    """The profile's ca_file first holds a CA that did not sign APNs' certificate (the TLS check
    fails, a configuration fault); replaced on disk by the right one, the running appliance uses it."""
    apns = Apns(tmp_path).start()
    try:
        ca_file = tmp_path / "apns-ca.pem"
        from appliance.testing.tls import make_test_pki

        ca_file.write_bytes(make_test_pki(tmp_path / "other-pki").ca_file.read_bytes())
        config = delivery_config(apns, profiles=[apns.profile(ca_file=str(ca_file))])
        server = Server(tmp_path / "data", config=config).start()
        try:
            dash = signed_in(server)
            page = dash.get("/admin/descriptor?origin=1")
            form = {"csrf": re.search(r'name="csrf" value="([^"]+)"', page.text).group(1), "origin": "1",
                    "profile": IOS, "token": token()}
            r = dash.post("/admin/descriptor/test-wake", data=form)
            assert "not trusted" in r.text and "Not sent" in r.text
            shutil.copyfile(apns.emulator.ca_file, ca_file)  # the operator fixes the file in place

            def accepted() -> bool:
                return "accepted by APNs" in dash.post("/admin/descriptor/test-wake", data=form).text

            await wait_until(accepted, timeout=20, interval=0.5)
            assert "read again after a change on disk" in server.log_path.read_text()
            dash.close()
        finally:
            server.stop()
    finally:
        apns.stop()
