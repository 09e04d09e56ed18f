"""`appliance doctor`: a pass/fail list, exit 1 on any failure, nothing changed."""

from __future__ import annotations

import os
import socket

import pytest

from appliance.testing.apns_emulator import ApnsEmulator
from appliance.testing.tls import make_p8

from .helpers import PUSH_CONFIG, cli, cli_as_stranger, snapshot

GATEWAY = """
[gateway]
enabled = true
[[gateway.profiles]]
id = "buzz-ios-production"
app_id = "TEAM123456.com.example.app"
environment = "production"
topic = "com.example.app"
team_id = "TEAM123456"
key_id = "ABC123DEFG"
key_file = "{p8}"
{extra}
"""


# These judge a SQLite data directory (file checks, quick_check); a PostgreSQL store's checks are
# tests/ops/test_doctor_postgres.py (on the suite's PostgreSQL cluster, whatever backend the suite runs).
pytestmark = pytest.mark.sqlite_only("doctor checks the SQLite database file (PostgreSQL: test_doctor_postgres.py)")

def lines(out) -> dict[str, str]:
    """check name -> status, from the printed list."""
    found = {}
    for line in out.stdout.splitlines():
        status, _, rest = line.partition("  ")
        if status in ("PASS", "FAIL", "SKIP"):
            found[rest.strip().split("  ")[0].strip()] = status
    return found


def test_a_fresh_install_passes_and_nothing_is_written(tmp_path):
    out = cli("doctor", "--data-dir", tmp_path / "data")
    assert out.returncode == 0, out.stdout + out.stderr
    got = lines(out)
    assert got["configuration"] == "PASS" and got["data directory"] == "PASS" and got["clock"] == "PASS"
    assert got["database"] == "SKIP" and got["key file"] == "SKIP"
    assert not (tmp_path / "data").exists()


def test_a_served_install_passes_every_check(server, tmp_path):
    config = tmp_path / "push.toml"
    config.write_text(PUSH_CONFIG)
    out = cli("doctor", "--data-dir", server.data_dir, "--port", server.port, "--config", config)
    assert out.returncode == 0, out.stdout
    got = lines(out)
    assert got["database"] == "PASS" and got["key file"] == "PASS"
    assert got[f"descriptor ws://127.0.0.1:{server.port}"] == "PASS"
    assert f"served now by pid {server.proc.pid}" in out.stdout


@pytest.mark.slow
def test_failures_are_listed_and_exit_non_zero(tmp_path):
    data = tmp_path / "data"
    config = tmp_path / "push.toml"
    config.write_text(PUSH_CONFIG)
    assert cli("keys", "rotate", "ws://127.0.0.1:7777", "--data-dir", data, "--config", config).returncode == 0
    before = snapshot(data)

    os.chmod(data / "appliance.key", 0o644)
    out = cli("doctor", "--data-dir", data, "--config", config)
    assert out.returncode == 1 and lines(out)["key file"] == "FAIL"
    assert "mode 0644" in out.stdout and "1 of" in out.stdout
    os.chmod(data / "appliance.key", 0o600)

    (data / "appliance.key").write_bytes(os.urandom(32))  # another database's key file
    out = cli("doctor", "--data-dir", data, "--config", config)
    assert out.returncode == 1 and lines(out)["key file"] == "FAIL" and "cannot unwrap" in out.stdout
    (data / "appliance.key").write_bytes(before["appliance.key"])

    bad = tmp_path / "bad.toml"
    bad.write_text(PUSH_CONFIG.replace("push_kinds = [9, 1059, 7]", "push_kinds = [9]\nurgent_kinds = [7]"))
    out = cli("doctor", "--data-dir", data, "--config", bad)
    assert out.returncode == 1 and lines(out)["descriptor ws://127.0.0.1:7777"] == "FAIL"

    out = cli("doctor", "--data-dir", data, "--max-filters", "0")
    assert out.returncode == 1 and lines(out) == {"configuration": "FAIL"} and "max_filters" in out.stdout
    after = snapshot(data)  # (a reader of a WAL database leaves its -shm/-wal files behind, empty of changes)
    assert {k: v for k, v in after.items() if not k.endswith(("-shm", "-wal"))} == before

    db = data / "appliance.sqlite3"
    for extra in ("appliance.sqlite3-wal", "appliance.sqlite3-shm"):
        (data / extra).unlink(missing_ok=True)
    raw = bytearray(db.read_bytes())
    for page in range(4096, len(raw), 4096):  # every b-tree page but the first gets a bad header
        raw[page:page + 8] = b"\xff" * 8
    db.write_bytes(bytes(raw))
    out = cli("doctor", "--data-dir", data, "--config", config)
    assert out.returncode == 1 and lines(out)["database"] == "FAIL"


def test_apns_credentials_and_the_online_probe(tmp_path):
    p8 = tmp_path / "AuthKey_ABC123DEFG.p8"
    key = make_p8(p8)
    emu = ApnsEmulator(pki_dir=tmp_path / "pki")
    emu.add_key("TEAM123456", "ABC123DEFG", key)
    emu.start_in_thread()
    try:
        config = tmp_path / "gw.toml"
        config.write_text(GATEWAY.format(p8=p8, extra=f'apns_url = "{emu.url}"\nca_file = "{emu.ca_file}"'))
        out = cli("doctor", "--online", "--data-dir", tmp_path / "data", "--config", config)
        assert out.returncode == 0, out.stdout + out.stderr
        got = lines(out)
        assert got["apns credentials gateway buzz-ios-production"] == "PASS"
        assert got[f"apns reachable 127.0.0.1:{emu.port}"] == "PASS" and "HTTP/2" in out.stdout
    finally:
        emu.stop_thread()

    # Nobody listens there any more: the probe fails, the offline checks still pass.
    out = cli("doctor", "--online", "--data-dir", tmp_path / "data", "--config", config)
    assert out.returncode == 1 and lines(out)[f"apns reachable 127.0.0.1:{emu.port}"] == "FAIL"
    assert cli("doctor", "--data-dir", tmp_path / "data", "--config", config).returncode == 0

    p8.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    out = cli("doctor", "--data-dir", tmp_path / "data", "--config", config)
    assert out.returncode == 1 and lines(out)["apns credentials gateway buzz-ios-production"] == "FAIL"


def test_a_host_that_does_not_speak_tls_fails_the_probe(tmp_path):
    p8 = tmp_path / "AuthKey_ABC123DEFG.p8"
    make_p8(p8)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        config = tmp_path / "gw.toml"
        config.write_text(GATEWAY.format(p8=p8, extra=f'apns_url = "https://127.0.0.1:{port}"'))
        out = cli("doctor", "--online", "--data-dir", tmp_path / "data", "--config", config, timeout=60)
    assert out.returncode == 1 and lines(out)[f"apns reachable 127.0.0.1:{port}"] == "FAIL"


def test_a_key_uploaded_through_the_dashboard_is_checked_and_unwrapped(tmp_path):
    """A .p8 kept in the database (`key_stored`): the doctor loads it through the key file, and
    backup/restore count it among the keys the key file must unwrap."""
    from appliance.commands.origins import store_apns_key
    from appliance.store.keyfile import KeyFile
    from appliance.store.sqlite import SqliteStore

    data = tmp_path / "data"
    config = tmp_path / "push.toml"
    config.write_text(PUSH_CONFIG)
    assert cli("keys", "rotate", "ws://127.0.0.1:7777", "--data-dir", data, "--config", config).returncode == 0
    make_p8(tmp_path / "AuthKey.p8")
    with SqliteStore(data) as store:
        keyfile = KeyFile.for_store(data, store)
        fp = store.write_sync(lambda conn: store_apns_key(conn, keyfile, (tmp_path / "AuthKey.p8").read_bytes(), 1))
    stored = tmp_path / "stored.toml"
    stored.write_text(PUSH_CONFIG.replace(
        '{ id = "com.example.app/ios", transport = "apns" }',
        f'{{ id = "com.example.app/ios", transport = "apns", topic = "com.example.app", team_id = "TEAM123456", '
        f'key_id = "ABC123DEFG", key_stored = "{fp}", environment = "production" }}'))
    out = cli("doctor", "--data-dir", data, "--config", stored)
    assert out.returncode == 0, out.stdout + out.stderr
    assert lines(out)["apns credentials ws://127.0.0.1:7777 com.example.app/ios"] == "PASS"
    assert "(stored)" in out.stdout and "unwraps all 3 wrapped key(s)" in out.stdout  # relay, executor, .p8

    (data / "appliance.key").write_bytes(os.urandom(32))
    out = cli("doctor", "--data-dir", data, "--config", stored)
    got = lines(out)
    assert out.returncode == 1 and got["key file"] == "FAIL"
    assert got["apns credentials ws://127.0.0.1:7777 com.example.app/ios"] == "SKIP"


def test_a_data_directory_this_user_cannot_read_fails_its_checks(tmp_path):
    """Run without sudo on a service's data directory: FAIL lines that say why, no traceback."""
    data = tmp_path / "data"
    assert cli("keys", "rotate", "ws://127.0.0.1:7777", "--data-dir", data, "--config", _push(tmp_path)).returncode == 0
    out = cli_as_stranger(data, "doctor", "--data-dir", data)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    got = lines(out)
    assert got["configuration"] == "PASS" and got["database"] == "FAIL" and got["data directory"] == "FAIL"
    assert "Permission denied" in out.stdout and "as the data directory's owner" in out.stdout


def _push(tmp_path):
    config = tmp_path / "push.toml"
    config.write_text(PUSH_CONFIG)
    return config


def test_an_fcm_profile_is_checked_only_with_the_draft_transports_on(tmp_path):
    import json

    from appliance.testing.fcm_emulator import FcmEmulator

    emu = FcmEmulator()
    emu.port = 4430  # not started: the key file only names its token endpoint
    sa = tmp_path / "sa.json"
    sa.write_text(json.dumps(emu.service_account("doctor-project")))
    profile = (f'{{ id = "com.example.app/android", transport = "fcm", service_account_file = "{sa}", '
               f'token_uri = "{emu.token_url}" }}')
    for drafts, status, words in ((False, "SKIP", "push_draft_transports is off"),
                                  (True, "PASS", "signs a grant; project doctor-project")):
        config = tmp_path / f"fcm-{drafts}.toml"
        config.write_text(f"push_draft_transports = {str(drafts).lower()}\n[push]\napp_profiles = [{profile}]\n")
        out = cli("doctor", "--data-dir", tmp_path / "data", "--config", config)
        name = "fcm credentials ws://127.0.0.1:7777 com.example.app/android (draft)"
        found = [line for line in out.stdout.splitlines() if "fcm credentials" in line]
        assert len(found) == 1 and found[0].startswith(status) and words in found[0], out.stdout
        assert name.split(" ws://")[0] in found[0]
    sa.write_text("{}")
    config.write_text(f"push_draft_transports = true\n[push]\napp_profiles = [{profile}]\n")
    out = cli("doctor", "--data-dir", tmp_path / "data", "--config", config)
    assert out.returncode != 0 and "service_account" in out.stdout + out.stderr
