"""`appliance push make-lease` and `appliance push test-wake` against a real appliance and the
APNs emulator; `appliance push try` end to end."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from appliance.nostr.keys import generate_secret, public_key
from appliance.transports.apns import APNS_BODY
from tests.admin.helpers import csrf_of
from tests.admin.test_server import admin_url, set_password
from tests.conftest import Client, Server
from tests.leaks import sensitive
from tests.ops.helpers import cli
from tests.push.delivery_helpers import KEY_ID, TEAM, TOPIC, Apns, Pusher, delivery_config, token
from tests.push.e2e_helpers import IOS, ORIGIN

pytestmark = pytest.mark.slow


@pytest.fixture
def apns(tmp_path):
    (tmp_path / "apns").mkdir()
    a = Apns(tmp_path / "apns").start()
    yield a
    a.stop()


def _identity(tmp_path) -> tuple[str, str]:
    secret = generate_secret()
    sensitive(secret)
    path = tmp_path / "device.key"
    path.write_text(secret + "\n")
    return str(path), secret


def _wait_request(apns: Apns, tok: str):
    apns.emulator.wait_for(lambda recs: any(r.token == tok for r in recs), 30)
    return apns.emulator.requests(tok)


def test_make_lease_publish_then_an_event_wakes_the_device(tmp_path, apns):
    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    try:
        ident, secret = _identity(tmp_path)
        tok = token()
        # No --origin, no --port: the running appliance's relay URL and address.
        out = cli("push", "make-lease", "--data-dir", server.data_dir, "--profile", IOS, "--token", tok,
                  "--identity", ident, "--kinds", "9", "--publish")
        assert out.returncode == 0, out.stdout + out.stderr
        event_line, ok_line = out.stdout.splitlines()
        lease = json.loads(event_line)
        assert lease["kind"] == 30350 and lease["pubkey"] == public_key(secret)
        assert [t[0] for t in lease["tags"]] == ["d", "expiration", "exec", "alt"]
        assert ok_line.startswith("OK true")
        assert "running appliance's NIP-11" in out.stderr and tok not in out.stdout + out.stderr

        async def mention() -> None:
            alice = await Pusher.connect(server)
            await alice.publish(9, [["p", public_key(secret)]])
            await alice.client.close()

        asyncio.run(mention())
        (rec,) = _wait_request(apns, tok)
        assert rec.status == 200 and rec.body == APNS_BODY
    finally:
        server.stop()


def test_a_lease_made_from_the_data_directory_is_accepted_by_the_next_start(tmp_path, apns):
    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    server.stop()  # not running: the descriptor comes from the data directory
    ident, secret = _identity(tmp_path)
    tok = token()
    cfg = tmp_path / "push.toml"
    cfg.write_text(delivery_config(apns))
    out = cli("push", "make-lease", "--data-dir", server.data_dir, "--config", cfg, "--origin", ORIGIN,
              "--profile", IOS, "--token", tok, "--identity", ident)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "from the data directory" in out.stderr
    lease = json.loads(out.stdout)
    again = Server(server.data_dir, config=delivery_config(apns)).start()
    try:
        async def publish() -> tuple[bool, str]:
            client = await Client.connect(again.url)
            ok, msg = await client.auth(secret, ORIGIN)
            assert ok, msg
            result = await client.publish(lease)
            await client.close()
            return result

        ok, msg = asyncio.run(publish())
        assert ok, msg
    finally:
        again.stop()


def test_make_lease_refuses_what_the_descriptor_does_not_allow(tmp_path, apns):
    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    try:
        ident, _secret = _identity(tmp_path)
        out = cli("push", "make-lease", "--data-dir", server.data_dir, "--profile", "no/such", "--token", "ab" * 32,
                  "--identity", ident)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.splitlines() == [
            f"appliance: no app profile 'no/such' at {ORIGIN} (its app profiles: {IOS}, com.example.app/android)"]
        out = cli("push", "make-lease", "--data-dir", server.data_dir, "--profile", IOS, "--token", "ab" * 32,
                  "--identity", ident, "--kinds", "1")
        assert out.returncode == 2 and "cannot wake a device" in out.stderr
    finally:
        server.stop()


def test_test_wake_prints_the_providers_answer(tmp_path, apns):
    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    try:
        tok = token()
        out = cli("push", "test-wake", ORIGIN, "--data-dir", server.data_dir, "--profile", IOS, "--token", tok)
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"^sent: the provider answered 200 \(apns-id [0-9a-f-]{36}, \d+ ms\)$", out.stdout, re.M), \
            out.stdout
        (rec,) = _wait_request(apns, tok)
        assert rec.body == APNS_BODY and rec.header("apns-topic") == TOPIC
        assert tok not in out.stdout
        # The running appliance's URL when none is given; APNs' refusal, exit 1.
        apns.emulator.unregister(tok)
        out = cli("push", "test-wake", "--data-dir", server.data_dir, "--profile", IOS, "--token", tok)
        assert out.returncode == 1
        assert "not accepted (invalid_endpoint): the provider answered 410 Unregistered" in out.stdout, out.stdout
        # An accepted test wake clears the profile's configuration alert, as the dashboard's does.
        apns.emulator.behave(None, 403, "InvalidProviderToken", times=1)
        asyncio.run(_mention_wake(server))
        assert asyncio.run(_alerts_after(server, lambda alerts: alerts))
        out = cli("push", "test-wake", "--data-dir", server.data_dir, "--profile", IOS, "--token", token())
        assert out.returncode == 0, out.stdout
        assert asyncio.run(_alerts_after(server, lambda alerts: not alerts)) == []
        out = cli("push", "test-wake", "--data-dir", server.data_dir, "--profile", "com.example.app/android",
                  "--token", tok)
        # An fcm profile (a draft transport): refused while push_draft_transports is off here.
        assert out.returncode == 2 and "push_draft_transports is false" in out.stderr, out.stderr
    finally:
        server.stop()


async def _mention_wake(server: Server) -> None:
    """A lease and an event that wakes it (the answer is the emulator's business)."""
    alice, bob = await Pusher.connect(server), await Pusher.connect(server)
    await bob.lease(token(), subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
    await alice.publish(9, [["p", bob.pubkey]])
    await alice.client.close()
    await bob.client.close()


async def _alerts_after(server: Server, predicate, timeout: float = 30):
    """The active alerts once `predicate(alerts)` holds."""
    from tests.pg import db_rows
    from tests.push.delivery_helpers import wait_until

    def active():
        return db_rows(server.data_dir, "SELECT app_profile, reason FROM push_alerts WHERE cleared_at IS NULL")

    await wait_until(lambda: predicate(active()) or None, timeout=timeout)
    return active()


def test_test_wake_uses_a_key_uploaded_in_the_dashboard(tmp_path, apns):
    """Credentials saved from the dashboard (the .p8 kept wrapped in the database, `key_stored`)."""
    config = f'public_url = "{ORIGIN}"\nlease_workers = 0\n'
    server = Server(tmp_path / "data", config=config).start()
    try:
        upload_key(server, apns)
        tok = token()
        out = cli("push", "test-wake", "--data-dir", server.data_dir, "--profile", IOS, "--token", tok)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "sent: the provider answered 200" in out.stdout
        _wait_request(apns, tok)
    finally:
        server.stop()


def upload_key(server: Server, apns: Apns) -> None:
    """Push on for the default origin from the dashboard, with the .p8 uploaded there."""
    form = {"origin": "1", "push_enabled": "on", "push_kinds": "9, 1059, 7", "urgent_kinds": "9",
            "profile_id": IOS, "profile_transport": "apns", "profile_original_0": IOS,
            "cs_apns_default": "on", "cs_apns_time_sensitive": "on",
            "cred_0_topic": TOPIC, "cred_0_team_id": TEAM, "cred_0_key_id": KEY_ID,
            "cred_0_environment": "production", "cred_0_apns_url": apns.emulator.url,
            "cred_0_ca_file": apns.emulator.ca_file}
    with httpx.Client(base_url=server.http, timeout=30) as c:
        url = admin_url(server)  # names public_url's host: asked at the server's address
        assert set_password(c, server.http + url[url.index("/admin/"):]).status_code == 303
        page = c.get("/admin/descriptor?origin=1")
        r = c.post("/admin/descriptor", data={"csrf": csrf_of(page.text), **form},
                   files={"cred_0_p8": ("AuthKey.p8", apns.key_file.read_bytes(), "application/octet-stream")})
        assert r.status_code == 303, r.text


def test_push_try_shows_every_step_and_exits_0(tmp_path):
    out = cli("push", "try", timeout=240, env={"APPLIANCE_DATA_DIR": str(tmp_path / "mine")})
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for step in ("[1/7] APNs emulator listening on https://127.0.0.1:", "[2/7] appliance serving ws://127.0.0.1:",
                 "[3/7] lease accepted: OK true for kind 30350", "[4/7] event stored: OK true for kind 9",
                 "[5/7] wake job ", "[6/7] APNs request: POST /3/device/",
                 f"      body {APNS_BODY.decode()}", "[7/7] delivery log: attempt 1 accepted (status 200)"):
        assert step in text, text
    assert "the emulator answered 200" in text
    assert re.search(r"^stopped the appliance and the APNs emulator; removed /\S+$", text, re.M), text
    work = re.search(r"temporary data directory \((\S+)\)", text).group(1)
    from pathlib import Path

    assert not Path(work).exists()
    assert not (tmp_path / "mine").exists()  # never the operator's data directory


def test_the_readme_shows_how_to_try_push_and_links_the_specs():
    from tests.ops.helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Try push in two minutes"):readme.index("## Push executor (NIP-PL)")]
    for text in ("appliance push try", "appliance emulator apns", "appliance push test-wake",
                 "appliance push make-lease", "https://github.com/block/buzz/blob/main/docs/nips/NIP-PL.md",
                 "https://github.com/marmot-protocol/marmot"):
        assert text in section, text


def test_a_test_wake_refused_for_its_configuration_shows_as_a_fault(tmp_path, apns):
    """A test wake answered 403 InvalidProviderToken (a wrong key id, team or .p8) is the operator's
    first sight of a configuration problem: the profile is `fault` with an alert, as after a
    wake so answered, not `ok` (the last answer alone naming the 403)."""
    import httpx

    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    try:
        apns.emulator.behave(None, 403, "InvalidProviderToken", times=1)
        out = cli("push", "test-wake", "--data-dir", server.data_dir, "--profile", IOS, "--token", token())
        assert out.returncode == 1 and "403 InvalidProviderToken" in out.stdout, out.stdout
        assert asyncio.run(_alerts_after(server, lambda alerts: alerts, timeout=10)) == [(IOS, "InvalidProviderToken")]
        health = httpx.get(server.http + "/admin/health").json()
        (row,) = [t for t in health["transports"] if t["app_profile"] == IOS]
        assert row["state"] == "fault", health
        out = cli("push", "test-wake", "--data-dir", server.data_dir, "--profile", IOS, "--token", token())
        assert out.returncode == 0, out.stdout
        assert asyncio.run(_alerts_after(server, lambda alerts: not alerts)) == []
    finally:
        server.stop()
