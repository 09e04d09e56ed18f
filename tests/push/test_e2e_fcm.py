"""The fcm profile (a draft) end to end over the real server: lease -> event -> the FCM emulator
receives the one constant message; every error class does to the job, the lease and the alerts
what it should; the access token is cached and refreshed; test wakes and health work for it."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from tests.conftest import Server
from tests.push.delivery_helpers import Fcm, Pusher, delivery_config, fcm_token, jobs, log_rows, wait_until
from tests.push.e2e_helpers import ANDROID, db_rows

pytestmark = pytest.mark.anyio


def p_sub(user, cls="default"):
    return [{"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": cls}]


@pytest.fixture
def fcm(tmp_path):
    f = Fcm(tmp_path).start()
    yield f
    f.stop()


@pytest.fixture
def server(fcm, tmp_path):
    s = Server(tmp_path / "data", config=delivery_config(None, profiles=[fcm.profile()], settings={
        "push_draft_transports": True, "wake_retry_delay": 0.3})).start()
    yield s
    s.stop()


async def _lease(server, tok):
    user = await Pusher.connect(server)
    await user.lease(tok, app_profile=ANDROID, transport="fcm", subscriptions=p_sub(user))
    return user


async def test_a_lease_and_an_event_send_the_constant_message(server, fcm):
    alice = await Pusher.connect(server)
    toks = [fcm_token(), fcm_token()]
    bob, carol = [await _lease(server, t) for t in toks]
    ev = await alice.publish(9, [["p", bob.pubkey], ["p", carol.pubkey]])
    records = fcm.emulator.wait_for(lambda r: sum(x.status == 200 for x in r) == 2)
    for tok in toks:
        (rec,) = [r for r in records if r.token == tok]
        assert rec.message["data"] == {"nip_pl": "reconnect"}
        assert rec.message["android"]["priority"] == "high"
        assert 0 < int(rec.message["android"]["ttl"][:-1]) <= 3600
        assert rec.path == f"/v1/projects/{fcm.project}/messages:send"
    # Nothing of the event or the leases: the two bodies differ by the token (and ttl) only.
    skel = {r.body.replace(r.token.encode(), b"T").replace(r.message["android"]["ttl"].encode(), b"N")
            for r in records}
    assert len(skel) == 1 and ev.id.encode() not in records[0].body and bob.pubkey.encode() not in records[0].body
    await wait_until(lambda: {j["state"] for j in jobs(server, event_id=ev.id)} == {"delivered"})
    assert {(r["transport"], r["outcome"], r["status"]) for r in log_rows(server)} == {("fcm", "accepted", 200)}
    assert fcm.emulator.grants == 1  # one access token for both
    for p in (alice, bob, carol):
        await p.client.close()


async def test_unregistered_disables_that_endpoint_generation(server, fcm):
    alice, tok = await Pusher.connect(server), fcm_token()
    bob = await _lease(server, tok)
    fcm.emulator.unregister(tok)
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] not in ("pending", "claimed"))
    assert db_rows(server.data_dir, "SELECT generation, invalidated_at IS NOT NULL FROM leases") == [(1, 1)]
    assert ("invalid_endpoint", 404, "UNREGISTERED") in {(r["outcome"], r["status"], r["reason"])
                                                        for r in log_rows(server)}
    # The dead generation wakes nothing more.
    before = len(fcm.emulator.requests(tok))
    await alice.publish(9, [["p", bob.pubkey]])
    await asyncio.sleep(0.5)
    assert len(fcm.emulator.requests(tok)) == before
    for p in (alice, bob):
        await p.client.close()


async def test_sender_id_mismatch_raises_an_alert_and_touches_no_endpoint(server, fcm):
    alice, tok = await Pusher.connect(server), fcm_token()
    bob = await _lease(server, tok)
    fcm.emulator.behave(tok, "SENDER_ID_MISMATCH")
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await wait_until(lambda: db_rows(server.data_dir, "SELECT app_profile, reason FROM push_alerts"))
    assert db_rows(server.data_dir, "SELECT app_profile, reason FROM push_alerts") == [(ANDROID, "SENDER_ID_MISMATCH")]
    assert jobs(server, event_id=ev.id)[0]["state"] == "pending"  # kept for when the operator fixes it
    assert db_rows(server.data_dir, "SELECT count(*) FROM leases WHERE invalidated_at IS NOT NULL") == [(0,)]
    health = {t["app_profile"]: t for t in httpx.get(server.http + "/admin/health").json()["transports"]}
    assert health[ANDROID]["state"] == "fault"
    from tests.admin.test_health import signed_in

    dash = signed_in(server)
    try:  # the overview's alert line says the profile's transport is a draft
        alert = re.search(r'<li class="alert">(.*?)<form', dash.get("/admin/").text, re.S).group(1)
        assert ANDROID in alert and "SENDER_ID_MISMATCH" in alert and '(fcm <span class="draft"' in alert
    finally:
        dash.close()
    for p in (alice, bob):
        await p.client.close()


async def test_quota_exceeded_is_retried_after_its_retry_after(server, fcm):
    alice, tok = await Pusher.connect(server), fcm_token()
    bob = await _lease(server, tok)
    fcm.emulator.behave(tok, "QUOTA_EXCEEDED", retry_after=1, times=1)
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered", timeout=15)
    reqs = fcm.emulator.requests(tok)
    assert [r.status for r in reqs] == [429, 200]
    assert reqs[1].at - reqs[0].at >= 0.9  # Retry-After honoured (the backoff alone is 0.3 s)
    outcomes = [(r["outcome"], r["reason"]) for r in log_rows(server)]
    assert outcomes == [("transient", "QUOTA_EXCEEDED"), ("accepted", None)]
    for p in (alice, bob):
        await p.client.close()


async def test_internal_errors_give_up_into_a_dead_letter(fcm, tmp_path):
    server = Server(tmp_path / "d2", config=delivery_config(None, profiles=[fcm.profile()], settings={
        "push_draft_transports": True, "wake_retry_delay": 0.1, "wake_max_attempts": 2})).start()
    try:
        alice, tok = await Pusher.connect(server), fcm_token()
        bob = await _lease(server, tok)
        fcm.emulator.behave(tok, "INTERNAL")
        ev = await alice.publish(9, [["p", bob.pubkey]])
        await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "dead", timeout=15)
        assert "gave up after 2 attempts: 500 INTERNAL" in jobs(server, event_id=ev.id)[0]["last_error"]
        for p in (alice, bob):
            await p.client.close()
    finally:
        server.stop()


async def test_a_stale_access_token_is_refreshed_once_and_the_wake_goes(server, fcm):
    alice, tok = await Pusher.connect(server), fcm_token()
    bob = await _lease(server, tok)
    await alice.publish(9, [["p", bob.pubkey]])
    fcm.emulator.wait_for(lambda r: len(r) == 1)
    fcm.emulator.expire_access_tokens()
    await asyncio.sleep(0.1)
    await alice.publish(9, [["p", bob.pubkey]])
    fcm.emulator.wait_for(lambda r: [x.status for x in r] == [200, 401, 200])
    assert fcm.emulator.grants == 2
    await wait_until(lambda: len(log_rows(server)) == 2)
    assert "retried once with a new access token after 401" in log_rows(server)[1]["detail"]
    for p in (alice, bob):
        await p.client.close()
    assert "ya29.emu-" not in server.log_path.read_text()  # access tokens are never logged


async def test_a_test_wake_from_the_dashboard_goes_through_fcm(server, fcm):
    from tests.admin.test_health import signed_in

    dash = signed_in(server)
    try:
        page = dash.get("/admin/descriptor").text
        assert "FCM registration token" in page and '<span class="draft"' in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        tok = fcm_token()
        r = dash.post("/admin/descriptor/test-wake", data={"csrf": csrf, "origin": "1", "profile": ANDROID,
                                                           "token": tok})
        assert "Sent: accepted by FCM" in r.text and tok not in r.text
        assert fcm.emulator.accepted(tok)
        fcm.emulator.unregister(tok)
        r = dash.post("/admin/descriptor/test-wake", data={"csrf": csrf, "origin": "1", "profile": ANDROID,
                                                           "token": tok})
        assert "Refused by FCM: 404 UNREGISTERED" in r.text
        health = {t["app_profile"]: t for t in httpx.get(server.http + "/admin/health").json()["transports"]}
        assert health[ANDROID]["state"] == "ok"
    finally:
        dash.close()


async def test_a_service_account_uploaded_in_the_dashboard_is_stored_wrapped_and_delivers(fcm, tmp_path):
    from tests.admin.test_health import signed_in
    from tests.pg import on_postgres

    from tests.push.e2e_helpers import ORIGIN

    # Push off at first: the dashboard turns it on with the uploaded account.
    server = Server(tmp_path / "d3", config=f'public_url = "{ORIGIN}"\npush_draft_transports = true\n').start()
    dash = signed_in(server)
    try:
        page = dash.get("/admin/descriptor?origin=1").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        form = {"csrf": csrf, "origin": "1", "push_enabled": "on", "push_kinds": "9", "urgent_kinds": "",
                "profile_id": ANDROID, "profile_transport": "fcm", "profile_original_0": ANDROID,
                "cs_fcm_default": "on", "new_profile_id": ""}
        r = dash.post("/admin/descriptor", data={k: v for k, v in form.items()})
        assert r.status_code in (200, 303), r.text
        account = fcm.sa_file.read_bytes()
        r = dash.post("/admin/descriptor", data={**form, "cred_0_token_uri": fcm.emulator.token_url,
                                                 "cred_0_fcm_url": fcm.emulator.url,
                                                 "cred_0_ca_file": fcm.emulator.ca_file},
                      files={"cred_0_sa": ("sa.json", b"{not json", "application/json")})
        assert r.status_code == 400 and "not JSON" in r.text
        r = dash.post("/admin/descriptor", data={**form, "cred_0_token_uri": fcm.emulator.token_url,
                                                 "cred_0_fcm_url": fcm.emulator.url,
                                                 "cred_0_ca_file": fcm.emulator.ca_file},
                      files={"cred_0_sa": ("sa.json", account, "application/json")})
        assert r.status_code == 303, r.text
        page = dash.get("/admin/descriptor?origin=1").text
        assert re.search(r"service account sa:[0-9a-f]{16} \(uploaded, in the database\)", page), page
        key_line = json.loads(account)["private_key"].splitlines()[1].encode()
        assert key_line.decode() not in page
        if not on_postgres():
            raw = (server.data_dir / "appliance.sqlite3").read_bytes()
            wal = server.data_dir / "appliance.sqlite3-wal"
            assert key_line not in raw and (not wal.exists() or key_line not in wal.read_bytes())
        tok = fcm_token()

        async def sent():
            r = dash.post("/admin/descriptor/test-wake", data={"csrf": csrf, "origin": "1", "profile": ANDROID,
                                                               "token": tok})
            return "Sent: accepted by FCM" in r.text

        for _ in range(50):  # the running appliance picks the saved descriptor up within a second
            if await sent():
                break
            await asyncio.sleep(0.2)
        assert fcm.emulator.accepted(tok)
    finally:
        dash.close()
        server.stop()


def test_appliance_push_test_wake_goes_through_an_fcm_profile(server, fcm):
    from tests.ops.helpers import cli

    tok = fcm_token()
    args = ("push", "test-wake", "--data-dir", server.data_dir, "--profile", ANDROID, f"--token={tok}")
    out = cli(*args)  # the draft transports are off for this command's own settings
    assert out.returncode == 2 and "push_draft_transports is false" in out.stderr, out.stderr
    out = cli(*args, env={"APPLIANCE_PUSH_DRAFT_TRANSPORTS": "true"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^sent: the provider answered 200 \(request id [0-9a-f-]{36}, \d+ ms\)$", out.stdout, re.M)
    assert fcm.emulator.accepted(tok) and tok not in out.stdout + out.stderr


def _browser_form(page: str, form_id: str) -> list[tuple[str, str]]:
    """The fields a browser submits for the form `form_id`, left as the page shows them."""
    from html.parser import HTMLParser

    class Form(HTMLParser):
        def __init__(self):
            super().__init__()
            self.inside, self.fields, self.select, self.textarea, self.option = False, [], None, None, False

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "form":
                self.inside = a.get("id") == form_id
            elif not self.inside:
                return
            elif tag == "input" and a.get("name") and a.get("type") not in ("file", "submit", "button"):
                if a.get("type") in ("checkbox", "radio"):
                    if "checked" in a:
                        self.fields.append((a["name"], a.get("value", "on")))
                else:
                    self.fields.append((a["name"], a.get("value") or ""))
            elif tag == "select":
                self.select = [a.get("name"), None]
            elif tag == "option" and self.select is not None and ("selected" in a or self.select[1] is None):
                # An option without a value attribute submits its text.
                self.select[1] = a.get("value")
                self.option = "value" not in a
            elif tag == "textarea":
                self.textarea = [a.get("name"), ""]

        def handle_data(self, data):
            if self.option and self.select is not None:
                self.select[1], self.option = data.strip(), False
            if self.textarea is not None:
                self.textarea[1] += data

        def handle_endtag(self, tag):
            if tag == "form":
                self.inside = False
            elif tag == "select" and self.select is not None:
                if self.select[0]:
                    self.fields.append((self.select[0], self.select[1] or ""))
                self.select = None
            elif tag == "textarea" and self.textarea is not None:
                self.fields.append(tuple(self.textarea))
                self.textarea = None

    parser = Form()
    parser.feed(page)
    return parser.fields


def test_saving_the_descriptor_page_unchanged_keeps_every_fcm_and_unifiedpush_field(fcm, tmp_path):
    from tests.admin.test_health import signed_in
    from tests.ops.helpers import cli
    from tests.push.e2e_helpers import ORIGIN

    up = "org.example.app/unifiedpush"
    push = {"app_profiles": [
        {"id": ANDROID, "transport": "fcm", "service_account_file": str(fcm.sa_file), "project_id": fcm.project,
         "fcm_url": fcm.emulator.url, "token_uri": fcm.emulator.token_url, "ca_file": fcm.emulator.ca_file},
        {"id": up, "transport": "unifiedpush", "vapid_subject": "mailto:ops@example.org",
         "allow_hosts": ["push.example.net"], "host_rate": 50, "host_burst": 100, "ca_file": fcm.emulator.ca_file}],
        "push_kinds": [9], "class_support": {"fcm": ["default"], "unifiedpush": ["default"]}}
    server = Server(tmp_path / "data", config=f'public_url = "{ORIGIN}"\npush_draft_transports = true\n'
                                              'lease_workers = 0\n').start()

    def stored() -> dict:
        out = cli("origins", "list", "--json", "--data-dir", server.data_dir)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[0])["push"]

    dash = None
    try:
        out = cli("origins", "set", ORIGIN, "--push-json", json.dumps(push), "--data-dir", server.data_dir)
        assert out.returncode == 0, out.stdout + out.stderr
        before = stored()
        assert before["app_profiles"] == push["app_profiles"]
        dash = signed_in(server)
        page = dash.get("/admin/descriptor?origin=1").text
        form = _browser_form(page, "descriptor-form")
        assert ("cred_0_ca_file", fcm.emulator.ca_file) in form
        # The operator changes one thing that is no profile's: an urgent kind.
        data: dict[str, list[str]] = {}
        for k, v in form:
            data.setdefault(k, []).append("9" if k == "urgent_kinds" else v)
        r = dash.post("/admin/descriptor", data=data)
        assert r.status_code == 303, r.text
        after = stored()
        assert after["urgent_kinds"] == [9]
        assert after["app_profiles"] == before["app_profiles"]
    finally:
        if dash is not None:
            dash.close()
        server.stop()
