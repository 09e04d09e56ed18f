"""The APNs gateway unavailable: a relay appliance delivering through a gateway appliance (a
second process) keeps acknowledging events while the gateway is down, retries its wakes as
transient, and delivers each once when the gateway is back."""

from __future__ import annotations

import httpx
import pytest

from appliance.testing.apns_emulator import ApnsEmulator
from appliance.testing.gateway_client import AppInstallation
from tests.conftest import Server
from tests.gateway.helpers import PROFILE, TOPIC, GatewaySetup, token
from tests.push.delivery_helpers import Pusher, jobs, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ORIGIN = "ws://push.test"


async def test_wakes_wait_for_an_unavailable_gateway_and_go_once_it_is_back(tmp_path):
    from cryptography.hazmat.primitives import serialization

    setup = GatewaySetup(tmp_path)
    emu = ApnsEmulator(topics=[TOPIC], pki_dir=tmp_path / "pki")
    emu.add_key("TEAM123456", "ABC123DEFG", serialization.load_pem_private_key(setup.p8.read_bytes(), None))
    emu.start_in_thread()
    gateway = Server(tmp_path / "gateway")
    gateway_url = f"http://127.0.0.1:{gateway.port}"
    gateway.config = setup.config(gateway_url, profiles=setup.profile_toml(apns_url=emu.url, ca_file=emu.ca_file))
    relay = Server(tmp_path / "relay", config="\n".join([
        f'public_url = "{ORIGIN}"', "wake_min_interval = 0", "wake_retry_delay = 0.5", "wake_max_attempts = 50",
        "[push]", f'app_profiles = [{{ id = "{PROFILE}", transport = "apns", gateway_url = "{gateway_url}" }}]',
        "push_kinds = [9]"]) + "\n")
    opened = []
    try:
        gateway.start()
        relay.start()
        async with httpx.AsyncClient(base_url=gateway.http, timeout=20) as http:
            app = AppInstallation(http, gateway_url, setup.attester(), PROFILE, token())
            assert (await app.enroll()).status_code == 201
            relay_pubkey = relay.nip11()["self"]
            assert (await app.delegate(relay_pubkey, 1)).status_code == 201
        alice, bob = await Pusher.connect(relay), await Pusher.connect(relay)
        opened += [alice, bob]
        await bob.lease(app.grants[relay_pubkey], generation=1, app_profile=PROFILE, ttl=1800,
                        subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "time_sensitive"}])

        gateway.stop()  # the gateway goes away: connection refused
        ev = await alice.publish(9, [["p", bob.pubkey]])  # acknowledged all the same
        await wait_until(lambda: jobs(relay, event_id=ev.id) and jobs(relay, event_id=ev.id)[0]["attempts"] >= 2,
                         timeout=30)
        (job,) = jobs(relay, event_id=ev.id)
        assert job["state"] in ("pending", "claimed") and job["last_error"], job
        assert emu.requests(app.endpoint) == []

        gateway.start()  # back on the same port and data: the enrollment and delegation hold
        await wait_until(lambda: jobs(relay, event_id=ev.id)[0]["state"] == "delivered", timeout=30)
        emu.wait_for(lambda rs: any(r.token == app.endpoint for r in rs))
        accepted = [r.header("apns-id") for r in emu.accepted(app.endpoint)]
        assert accepted == [job["id"]]
    finally:
        for p in opened:
            await p.client.close()
        relay.stop()
        gateway.stop()
        emu.stop_thread()
