"""The draft transports (fcm, unifiedpush) are off unless `push_draft_transports` is on: off, their
profiles are not advertised (a lease naming one is refused as an unknown app profile), no
transport is built for them and every page that shows them says why; on, they are advertised."""

from __future__ import annotations

import re

import httpx
import pytest

from appliance.origins import Origin
from appliance.push.config import build_descriptor
from appliance.push.descriptor import ExecutorKey
from appliance.push.kinds import DRAFT_TRANSPORTS
from appliance.push.profiles import ProfileTransports
from appliance.settings import sample_config
from tests.conftest import Server
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, token
from tests.push.e2e_helpers import ANDROID, IOS, active, current_key, lease

KEY = ExecutorKey("k1", "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798", current=True)
UP = "org.example.app/up"
PUSH = {"app_profiles": [{"id": IOS, "transport": "apns"}, {"id": ANDROID, "transport": "fcm"},
                         {"id": UP, "transport": "unifiedpush"}],
        "class_support": {"apns": ["default"], "fcm": ["default"], "unifiedpush": ["silent"]}}


def test_the_descriptor_leaves_draft_profiles_out_unless_they_are_on():
    off = build_descriptor("wss://relay.example", PUSH, [KEY])
    assert [(p.id, p.transport) for p in off.app_profiles] == [(IOS, "apns")]
    assert set(off.class_support) == {"apns"}
    on = build_descriptor("wss://relay.example", PUSH, [KEY], drafts=True)
    assert {p.transport for p in on.app_profiles} == {"apns"} | DRAFT_TRANSPORTS
    assert set(on.class_support) == {"apns", "fcm", "unifiedpush"}


def test_no_transport_is_built_for_a_draft_profile_while_they_are_off():
    origin = Origin(id=1, origin="wss://relay.example", push=PUSH)
    transports = ProfileTransports()
    transports.configure([origin], {}, drafts=False)
    assert transports.get(1, ANDROID) is None and transports.get(1, UP) is None
    assert transports.get(1, IOS) is not None  # an APNs profile without credentials: Unconfigured
    assert transports.is_off("fcm") and not transports.is_off("apns")
    transports.configure([origin], {}, drafts=True)
    assert transports.get(1, ANDROID) is not None and transports.get(1, UP) is not None


def test_the_sample_config_labels_the_draft_transports():
    sample = sample_config()
    assert "# push_draft_transports = false" in sample
    assert 'transport = "fcm" }]  # fcm: DRAFT' in sample
    assert "DRAFT transports beyond NIP-PL v1 (fcm, unifiedpush)" in sample


@pytest.mark.anyio
@pytest.mark.parametrize("drafts", [False, True])
async def test_a_lease_naming_a_draft_profile_needs_the_setting(tmp_path, drafts):
    apns = Apns(tmp_path)
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"push_draft_transports": drafts},
                                                              profiles=[apns.profile(), f'{{ id = "{ANDROID}", transport = "fcm" }}'])).start()
    try:
        push = server.nip11()["push"]
        advertised = [p["transport"] for p in push["app_profiles"]]
        assert advertised == (["apns", "fcm"] if drafts else ["apns"])
        assert ("fcm" in push["class_support"]) is drafts
        bob = await Pusher.connect(server)
        exec_id, exec_pub = current_key(server.nip11())
        pt = active(bob.user, endpoint=token(), app_profile=ANDROID, transport="fcm",
                    subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
        ev = lease(bob.user, pt, exec_pub=exec_pub, exec_id=exec_id)
        ok, message = await bob.client.publish(ev)
        assert (ok, message) == ((True, "") if drafts else (False, "invalid: unknown app profile"))
        await bob.client.close()
        if not drafts:
            health = {t["app_profile"]: t for t in httpx.get(server.http + "/admin/health").json()["transports"]}
            assert health[ANDROID]["state"] == "fault" and health[ANDROID]["reason"] == "draft transport off"
            assert health[IOS]["state"] != "fault" or health[IOS]["reason"] != "draft transport off"
    finally:
        server.stop()


@pytest.mark.anyio
async def test_every_dashboard_page_that_shows_a_draft_profile_labels_it(tmp_path):
    from tests.admin.test_health import signed_in

    apns = Apns(tmp_path)
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"push_draft_transports": False},
                                                              profiles=[apns.profile(), f'{{ id = "{ANDROID}", transport = "fcm" }}'])).start()
    dash = None
    try:
        dash = signed_in(server)
        draft = '<span class="draft"'
        descriptor = dash.get("/admin/descriptor").text
        assert draft in descriptor and "fcm (draft)" in descriptor
        assert "not advertised and delivers nothing while the setting push_draft_transports is off" in descriptor
        overview = dash.get("/admin/").text
        assert draft in overview and "draft transport: not advertised" in overview
        assert "fcm (draft)" in dash.get("/admin/leases").text
        # The class support row of a draft transport, and the deliveries page's profile filter.
        assert re.search(r'<tr><td>fcm <span class="draft"[^>]*>draft</span></td>', descriptor)
        assert re.search(r'<tr><td>apns</td>', descriptor)
        deliveries = dash.get("/admin/deliveries").text
        assert f'<option value="{ANDROID}" >{ANDROID} · fcm (draft)</option>' in deliveries
        assert f'<option value="{IOS}" >{IOS}</option>' in deliveries
        # The test wake says why it cannot go while the draft transports are off.
        form = {"csrf": _csrf(descriptor), "origin": "1", "profile": ANDROID, "token": "fcm-token"}
        r = dash.post("/admin/descriptor/test-wake", data=form)
        assert "push_draft_transports is false" in r.text
    finally:
        if dash is not None:
            dash.close()
        server.stop()


def _csrf(page: str) -> str:
    import re

    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)
