"""`appliance doctor` checks what is configured wherever it was configured: credentials saved from
the dashboard (a .p8 kept wrapped in the database) are unwrapped and sign a provider token;
`--online` reaches each profile's APNs host with a TLS handshake and an HTTP/2 preface; `config
show` shows the settings saved from the dashboard too."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.admin.helpers import csrf_of
from tests.conftest import Server
from tests.ops.helpers import cli
from tests.ops.test_push_cli import upload_key
from tests.pg import on_postgres
from tests.push.delivery_helpers import Apns
from tests.push.e2e_helpers import IOS, ORIGIN

pytestmark = pytest.mark.slow


@pytest.fixture
def apns(tmp_path):
    (tmp_path / "apns").mkdir()
    a = Apns(tmp_path / "apns").start()
    yield a
    a.stop()


def _durable() -> list[str]:
    # The suite's PostgreSQL cluster runs without fsync, which sync_mode "full" rightly fails.
    return ["--sync-mode", "normal"] if on_postgres() else []


def _checks(out) -> dict[str, tuple[str, str]]:
    found = {}
    for line in out.stdout.splitlines():
        status, _, rest = line.partition("  ")
        if status in ("PASS", "FAIL", "SKIP"):
            name, _, detail = rest.strip().partition("  ")
            found[name.strip()] = (status, detail.strip())
    return found


def test_credentials_uploaded_in_the_dashboard_are_checked_and_reached(tmp_path, apns):
    config = tmp_path / "appliance.toml"
    config.write_text(f'public_url = "{ORIGIN}"\nlease_workers = 0\n')
    server = Server(tmp_path / "data", config=config.read_text()).start()
    try:
        upload_key(server, apns)
        out = cli("doctor", "--online", "--data-dir", server.data_dir, "--config", config, *_durable())
        assert out.returncode == 0, out.stdout + out.stderr
        checks = _checks(out)
        status, detail = checks[f"apns credentials {ORIGIN} {IOS}"]
        assert status == "PASS" and "(stored)" in detail and "signs a provider token" in detail, out.stdout
        assert "no APNs credentials configured" not in out.stdout
        name = f"apns reachable 127.0.0.1:{apns.emulator.port}"
        status, detail = checks[name]
        assert status == "PASS" and "HTTP/2" in detail, out.stdout
    finally:
        server.stop()


def test_online_fails_a_tls_host_that_does_not_speak_http2(tmp_path, apns):
    """A handshake alone is not APNs: the HTTP/2 preface must be answered with SETTINGS."""
    import ssl
    import threading

    from appliance.testing.tls import make_test_pki

    pki = make_test_pki(tmp_path / "pki")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.cert_file, pki.key_file)
    ctx.set_alpn_protocols(["h2"])  # claims h2, answers the preface with nothing HTTP/2
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve():
        try:
            conn, _ = listener.accept()
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1024)
                tls.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        except OSError:
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    config = tmp_path / "appliance.toml"
    config.write_text(f'public_url = "{ORIGIN}"\n[push]\napp_profiles = [{{ id = "{IOS}", transport = "apns", '
                      f'topic = "com.example.app", team_id = "TEAM123456", key_id = "ABC123DEFG", '
                      f'key_file = "{apns.key_file}", environment = "production", '
                      f'apns_url = "https://127.0.0.1:{port}", ca_file = "{pki.ca_file}" }}]\npush_kinds = [9]\n')
    try:
        out = cli("doctor", "--online", "--data-dir", tmp_path / "data", "--config", config)
    finally:
        listener.close()
        thread.join(10)
    status, detail = _checks(out)[f"apns reachable 127.0.0.1:{port}"]
    assert out.returncode == 1 and status == "FAIL" and "HTTP/2" in detail, out.stdout


def test_config_show_includes_settings_saved_from_the_dashboard(tmp_path):
    server = Server(tmp_path / "data").start()
    try:
        from tests.admin.test_server import admin_url, set_password

        with httpx.Client(base_url=server.http, timeout=30) as c:
            assert set_password(c, admin_url(server)).status_code == 303
            page = c.get("/admin/settings")
            assert page.status_code == 200
            r = c.post("/admin/settings/edit", data={"csrf": csrf_of(page.text), "name": "delivery_log_retention",
                                                      "value": "86400"})
            assert r.status_code in (200, 303), r.text
        out = cli("config", "show", "--data-dir", server.data_dir)
        assert out.returncode == 0, out.stderr
        line = next(line for line in out.stdout.splitlines() if line.startswith("delivery_log_retention = "))
        assert line == "delivery_log_retention = 86400    # from dashboard", line
    finally:
        server.stop()
