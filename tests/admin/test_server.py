"""The dashboard in a real `appliance serve` process: the start banner's admin line, `appliance
admin reset` beside a running server, the dashboard on its own listener, NIP-86 over the wire."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx
import pytest

from appliance.nostr.nip98 import make_http_auth
from tests.conftest import ROOT, Identity, Server, free_port

from .helpers import PASSWORD, csrf_of

ADMIN_LINE = re.compile(r"^  admin  (http://\S+)$", re.M)


def admin_url(server: Server) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = ADMIN_LINE.search(server.log_path.read_text())
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError(server.log_path.read_text())


def set_password(client: httpx.Client, url: str, password: str = PASSWORD) -> httpx.Response:
    page = client.get(url)
    assert page.status_code == 200, page.text
    token = url.split("token=", 1)[1]
    return client.post(url.split("?")[0], data={"csrf": csrf_of(page.text), "token": token, "password": password,
                                                "confirm": password})


def cli(*args: str) -> subprocess.CompletedProcess:
    from tests.pg import process_env

    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True,
                          env=process_env(args),
                          cwd=ROOT, timeout=60)


@pytest.mark.slow
def test_first_start_prints_a_setup_url_then_reset_prints_a_fresh_one(make_server):
    server = make_server()
    banner = server.log_path.read_text()
    url = admin_url(server)
    assert url.startswith(f"http://127.0.0.1:{server.port}/admin/setup?token=")
    lines = banner.splitlines()
    relay = next(i for i, line in enumerate(lines) if line.startswith("  relay  "))
    admin = next(i for i, line in enumerate(lines) if line.startswith("  admin  "))
    listening = next(i for i, line in enumerate(lines) if line.startswith("  listening on"))
    assert relay < admin < listening  # on its own line, beside the relay URL
    with httpx.Client(base_url=server.http) as c:
        assert c.get(f"{server.http}/admin/", follow_redirects=False).status_code == 303
        r = set_password(c, url)
        assert r.status_code == 303
        assert c.get(f"{server.http}/admin/").status_code == 200
        # The relay is still the relay on the same listener.
        assert c.get(server.http + "/", headers={"Accept": "application/nostr+json"}).json()["software"] == "appliance"
    # Restarted with a password set: the line shows the plain dashboard URL, no token.
    server.stop()
    again = Server(server.data_dir).start()
    try:
        assert admin_url(again) == f"http://127.0.0.1:{again.port}/admin/"
        # `appliance admin reset` while it runs: a fresh one-time URL; the old password stops working.
        out = cli("admin", "reset", "--data-dir", str(again.data_dir), "--port", str(again.port))
        assert out.returncode == 0, out.stderr
        fresh = ADMIN_LINE.search(out.stdout).group(1)
        assert "/admin/setup?token=" in fresh
        with httpx.Client() as c:
            page = c.get(f"{again.http}/admin/login")
            r = c.post(f"{again.http}/admin/login", data={"csrf": csrf_of(page.text), "password": PASSWORD})
            assert r.status_code == 401
            assert set_password(c, fresh, "brand new password").status_code == 303
            assert c.get(f"{again.http}/admin/").status_code == 200
            assert c.get(fresh).status_code == 403  # used once
    finally:
        again.stop()


def test_dashboard_on_its_own_listener(make_server):
    port = free_port()
    server = make_server("--admin-listen", f"127.0.0.1:{port}")
    url = admin_url(server)
    assert url.startswith(f"http://127.0.0.1:{port}/admin/setup?token=")
    with httpx.Client() as c:
        # Not on the relay's listener (there /admin/... is just a relay URL).
        page = c.get(f"{server.http}/admin/login")
        assert "Sign in" not in page.text and "Nostr relay" in page.text
        assert c.get(f"http://127.0.0.1:{port}/health").json()["status"] == "ok"
        assert c.get(f"http://127.0.0.1:{port}/metrics").status_code == 200  # its own (private) listener
        assert set_password(c, url).status_code == 303
        assert c.get(f"http://127.0.0.1:{port}/admin/").status_code == 200


def test_admin_listen_on_a_busy_port_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = cli("serve", "--data-dir", str(tmp_path / "d"), "--port", str(free_port()),
                  "--admin-listen", f"127.0.0.1:{port}")
    assert out.returncode == 2 and "admin_listen" in out.stderr and "cannot listen" in out.stderr


def test_nip86_over_the_wire(make_server):
    admin = Identity()
    server = make_server("--admin-pubkeys", admin.pubkey)
    body = json.dumps({"method": "changerelayname", "params": ["From NIP-86"]}).encode()
    r = httpx.post(server.http + "/", content=body, headers={
        "Content-Type": "application/nostr+json+rpc",
        "Authorization": make_http_auth(admin.secret, server.url, "POST", body)})
    assert r.status_code == 200 and r.json() == {"result": True}
    assert server.nip11()["name"] == "From NIP-86"


def test_a_dashboard_edit_reaches_open_connections(make_server):
    """Switching the origin to members-only from the dashboard closes an open anonymous connection at
    once (as a CLI edit would within a second)."""
    from websockets.sync.client import connect

    server = make_server()
    with httpx.Client() as c:
        assert set_password(c, admin_url(server)).status_code == 303
        with connect(server.url) as ws:
            assert json.loads(ws.recv())[0] == "AUTH"
            page = c.get(f"{server.http}/admin/origins/1")
            r = c.post(f"{server.http}/admin/origins/1", data={"csrf": csrf_of(page.text), "access_policy": "members",
                                                              "auth_required_present": "1"})
            assert r.status_code == 303
            notice = json.loads(ws.recv(timeout=5))
            assert notice[0] == "NOTICE" and "access rules changed" in notice[1]
            with pytest.raises(Exception):
                ws.recv(timeout=5)
            assert ws.close_code == 1008


def test_debug_logs_keep_device_tokens_and_credentials_out(make_server, tmp_path):
    """At --log-level debug too: a wake sent to APNs (here "send a test wake" with a pasted device
    token) leaves neither the device token nor the APNs provider token in the log; the setup token
    appears only in the start banner."""
    from tests.push.delivery_helpers import Apns, delivery_config, token

    apns = Apns(tmp_path).start()
    try:
        server = make_server("--log-level", "debug", config=delivery_config(apns, origin="ws://push.test"))
        url = admin_url(server)
        setup_token = url.split("token=", 1)[1]
        with httpx.Client(base_url=server.http, headers={"Host": "push.test"}) as c:
            page = c.get(f"/admin/setup?token={setup_token}")
            r = c.post("/admin/setup", data={"csrf": csrf_of(page.text), "token": setup_token, "password": PASSWORD,
                                             "confirm": PASSWORD})
            assert r.status_code == 303
            device = token()
            page = c.get("/admin/descriptor")
            r = c.post("/admin/descriptor/test-wake", data={"csrf": csrf_of(page.text), "origin": "1",
                                                             "profile": "com.example.app/ios", "token": device})
            assert r.status_code == 200 and "accepted by APNs" in r.text, r.text
        apns.emulator.wait_for(lambda records: any(rec.token == device for rec in records))
        server.stop()
        log = server.log_path.read_text()
        assert "DEBUG" in log
        assert device not in log
        assert "bearer" not in log.lower() and "authorization" not in log.lower()
        assert [line for line in log.splitlines() if setup_token in line] == [f"  admin  {url}"]
        assert PASSWORD not in log
    finally:
        apns.stop()
