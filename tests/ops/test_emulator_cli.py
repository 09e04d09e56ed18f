"""`appliance emulator apns`: the APNs emulator as a subcommand. Its printed settings point a real
appliance's profile at it, and a wake shows up as one line per request."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest

from appliance.transports.apns import APNS_BODY
from tests.conftest import Server
from tests.ops.helpers import Running, cli
from tests.push.delivery_helpers import Pusher, token
from tests.push.e2e_helpers import IOS, ORIGIN

pytestmark = pytest.mark.slow

SETTING = re.compile(r'^(apns_url|ca_file|team_id|key_id|key_file|environment) = "([^"]*)"$')


def _settings(emu: Running) -> dict[str, str]:
    emu.wait_line(lambda line: line.startswith("environment = "))
    return {m.group(1): m.group(2) for line in emu.lines if (m := SETTING.match(line))}


def test_printed_settings_point_a_profile_at_it_and_each_request_is_one_line(tmp_path):
    emu = Running("emulator", "apns", "--listen", "127.0.0.1:0", "--dir", tmp_path / "apns")
    server = None
    try:
        found = _settings(emu)
        assert set(found) == {"apns_url", "ca_file", "team_id", "key_id", "key_file", "environment"}
        assert found["apns_url"].startswith("https://127.0.0.1:")
        assert found["key_file"].startswith(str(tmp_path / "apns")) and found["key_file"].endswith(".p8")
        profile = ", ".join(f'{k} = "{v}"' for k, v in found.items())
        config = (f'public_url = "{ORIGIN}"\nwake_min_interval = 0\n[push]\n'
                  f'app_profiles = [{{ id = "{IOS}", transport = "apns", topic = "com.example.app", {profile} }}]\n'
                  "push_kinds = [9]\n")
        server = Server(tmp_path / "data", config=config).start()

        async def wake() -> str:
            alice, bob = await Pusher.connect(server), await Pusher.connect(server)
            tok = token()
            await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
            await alice.publish(9, [["p", bob.pubkey]])
            await alice.client.close()
            await bob.client.close()
            return tok

        tok = asyncio.run(wake())
        line = emu.wait_line(lambda line: " apns-id=" in line)
        assert re.fullmatch(r"\d\d:\d\d:\d\d apns-id=[0-9a-f-]{36} topic=com\.example\.app push-type=alert "
                            rf"priority=10 token=sha256:[0-9a-f]{{12}} body={len(APNS_BODY)} bytes status=200", line), line
        assert tok not in emu.text()  # the token itself is never printed
    finally:
        if server is not None:
            server.stop()
        assert emu.stop() == 0


def test_the_same_dir_keeps_the_key_and_certificate(tmp_path):
    first = Running("emulator", "apns", "--listen", "127.0.0.1:0", "--dir", tmp_path / "apns")
    try:
        before = _settings(first)
        ca = (tmp_path / "apns" / "ca.pem").read_bytes()
    finally:
        first.stop()
    again = Running("emulator", "apns", "--listen", "127.0.0.1:0", "--dir", tmp_path / "apns")
    try:
        after = _settings(again)
    finally:
        again.stop()
    for name in ("team_id", "key_id", "key_file", "ca_file"):
        assert after[name] == before[name]
    assert (tmp_path / "apns" / "ca.pem").read_bytes() == ca


def test_an_address_in_use_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = cli("emulator", "apns", "--listen", f"127.0.0.1:{port}", "--dir", tmp_path / "apns")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines() == [f"appliance: cannot listen on 127.0.0.1:{port}: address already in use"]


FCM_SETTING = re.compile(r'^(service_account_file|token_uri|fcm_url|ca_file) = "([^"]*)"$')


def test_the_fcm_emulator_prints_a_working_draft_profile(tmp_path):
    from tests.push.delivery_helpers import fcm_token
    from tests.push.e2e_helpers import ANDROID

    emu = Running("emulator", "fcm", "--listen", "127.0.0.1:0", "--dir", tmp_path / "fcm")
    server = None
    try:
        emu.wait_line(lambda line: line.startswith("ca_file = "))
        found = {m.group(1): m.group(2) for line in emu.lines if (m := FCM_SETTING.match(line))}
        assert set(found) == {"service_account_file", "token_uri", "fcm_url", "ca_file"}
        assert found["token_uri"] == found["fcm_url"] + "/token"
        assert "push_draft_transports = true" in emu.text()
        profile = ", ".join(f'{k} = "{v}"' for k, v in found.items())
        config = (f'public_url = "{ORIGIN}"\nwake_min_interval = 0\npush_draft_transports = true\n[push]\n'
                  f'app_profiles = [{{ id = "{ANDROID}", transport = "fcm", {profile} }}]\npush_kinds = [9]\n')
        server = Server(tmp_path / "data", config=config).start()

        async def wake() -> str:
            alice, bob = await Pusher.connect(server), await Pusher.connect(server)
            tok = fcm_token()
            await bob.lease(tok, app_profile=ANDROID, transport="fcm",
                            subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
            await alice.publish(9, [["p", bob.pubkey]])
            await alice.client.close()
            await bob.client.close()
            return tok

        tok = asyncio.run(wake())
        line = emu.wait_line(lambda line: " send " in line)
        assert re.fullmatch(r"\d\d:\d\d:\d\d send /v1/projects/appliance-emulator/messages:send "
                            r"token=sha256:[0-9a-f]{12} body=\d+ bytes status=200", line), line
        assert any(re.fullmatch(r"\d\d:\d\d:\d\d grant status=200", x) for x in emu.lines)
        assert tok not in emu.text() and "PRIVATE KEY" not in emu.text()
    finally:
        if server is not None:
            server.stop()
        assert emu.stop() == 0
