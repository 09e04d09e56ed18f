"""The running instance: `serve` binds its addresses before anything else (an address in use is one
line, exit 2, nothing created), records its pid and listen addresses in the data directory, and
the commands run beside it (`admin reset`, `doctor`) name the port it really listens on."""

from __future__ import annotations

import json
import re
import socket

import httpx
import pytest

from tests.conftest import Server
from tests.ops.helpers import Running, cli
from tests.pg import on_postgres

pytestmark = pytest.mark.slow


def _busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_a_port_in_use_is_one_line_before_anything_is_created(tmp_path):
    busy, port = _busy_port()
    with busy:
        out = cli("serve", "--data-dir", tmp_path / "data", "--port", port)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines() == [f"appliance: cannot listen on 127.0.0.1:{port}: address already in use"]
    assert not (tmp_path / "data").exists()  # no data directory, no database, no setup token


def test_admin_listen_in_use_is_checked_first_too(tmp_path):
    busy, port = _busy_port()
    with busy:
        out = cli("serve", "--data-dir", tmp_path / "data", "--port", "0", "--admin-listen", f"127.0.0.1:{port}")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"appliance: cannot listen on 127.0.0.1:{port}: address already in use (admin_listen)"]
    assert not (tmp_path / "data").exists()


def test_a_second_start_names_the_appliance_already_there(tmp_path):
    server = Server(tmp_path / "data").start()
    try:
        auth_before = _setup_token_rows(server)
        out = cli("serve", "--data-dir", server.data_dir, "--port", server.port)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.splitlines() == [
            f"appliance: cannot listen on 127.0.0.1:{server.port}: address already in use "
            f"(another appliance runs here, pid {server.proc.pid})"]
        assert _setup_token_rows(server) == auth_before  # no setup token minted
    finally:
        server.stop()


def _setup_token_rows(server: Server) -> list:
    from tests.pg import db_rows

    return db_rows(server.data_dir, "SELECT * FROM admin_auth")


def test_the_instance_record_names_the_real_port_of_port_0(tmp_path):
    data = tmp_path / "data"
    proc = Running("serve", "--data-dir", data, "--port", "0")
    try:
        line = proc.wait_line(lambda line: line.startswith("  listening on "))
        port = int(line.rsplit(":", 1)[1])
        assert port != 0
        relay = proc.wait_line(lambda line: line.startswith("  relay  "))
        assert f"ws://127.0.0.1:{port} " in relay
        info = json.loads((data / "instance.json").read_text())
        assert info["pid"] == proc.proc.pid
        assert info["listen"] == [f"127.0.0.1:{port}"]
        assert info["relay_url"] == f"ws://127.0.0.1:{port}"
        assert info["admin_url"] == f"http://127.0.0.1:{port}/admin/"
        assert oct((data / "instance.json").stat().st_mode & 0o777) == "0o600"
        proc.wait_line(lambda line: "appliance.server listening on http://" in line)
        r = httpx.get(f"http://127.0.0.1:{port}/", headers={"Accept": "application/nostr+json"}, timeout=10)
        assert r.json()["software"] == "appliance"
    finally:
        proc.stop()


def test_admin_reset_and_doctor_name_the_port_the_appliance_listens_on(tmp_path):
    server = Server(tmp_path / "data").start()
    try:
        out = cli("admin", "reset", "--data-dir", server.data_dir)  # no --port: the running one's
        assert out.returncode == 0, out.stderr
        assert re.search(rf"admin  http://127\.0\.0\.1:{server.port}/admin/setup\?token=\S+", out.stdout), out.stdout
        # (The suite's PostgreSQL cluster runs without fsync, which sync_mode "full" rightly fails.)
        doctor = cli("doctor", "--data-dir", server.data_dir, *(["--sync-mode", "normal"] if on_postgres() else []))
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert f"ws://127.0.0.1:{server.port}" in doctor.stdout
        assert ":7777" not in doctor.stdout
        assert f"served now by pid {server.proc.pid} on 127.0.0.1:{server.port}" in doctor.stdout
    finally:
        server.stop()


def test_a_record_left_by_a_dead_process_names_nobody(tmp_path):
    """A crash leaves instance.json behind: with nobody holding the lock it is ignored."""
    server = Server(tmp_path / "data").start()
    port = server.port
    server.kill()
    assert (server.data_dir / "instance.json").exists()
    out = cli("admin", "reset", "--data-dir", server.data_dir, "--port", "7799")
    assert out.returncode == 0, out.stderr
    assert "http://127.0.0.1:7799/admin/setup?token=" in out.stdout and f":{port}/" not in out.stdout
