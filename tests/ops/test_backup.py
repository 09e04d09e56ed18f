"""`appliance backup` / `appliance restore`: a consistent copy while serving, the key file beside
it, restores refused while serving and checked before anything is replaced."""

from __future__ import annotations

import os
import secrets

import apsw

import pytest

from tests.conftest import Identity

from .helpers import PUSH_CONFIG, cli, cli_as_stranger, snapshot

pytestmark = pytest.mark.sqlite_only("`appliance backup` and `restore` copy the SQLite database file; a PostgreSQL "
                                     "store is backed up with the database's own tools")


async def test_backup_while_serving_then_restore_elsewhere(make_server, connect, tmp_path):
    server = make_server(config=PUSH_CONFIG)
    config = server.data_dir.parent / f"config-{server.port}.toml"
    alice = Identity()
    client = await connect(server.url)
    events = [alice.sign(1, content=f"note {i}") for i in range(20)]
    for ev in events:
        assert (await client.publish(ev))[0]
    descriptor = server.nip11()["push"]

    out = cli("backup", tmp_path / "bk" / "copy.sqlite3", "--data-dir", server.data_dir, "--config", config)
    assert out.returncode == 0, out.stderr
    copy, key = tmp_path / "bk" / "copy.sqlite3", tmp_path / "bk" / "appliance.key"
    assert key.read_bytes() == (server.data_dir / "appliance.key").read_bytes()
    assert key.stat().st_mode & 0o777 == 0o600 and copy.stat().st_mode & 0o777 == 0o600
    assert "backed up" in out.stdout and str(key) in out.stdout
    conn = apsw.Connection(str(copy), flags=apsw.SQLITE_OPEN_READONLY)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one self-contained file
    assert conn.execute("SELECT count(*) FROM events WHERE kind = 1").fetchone()[0] == 20
    conn.close()

    # A second backup to the same name is refused, unless --force.
    again = cli("backup", copy, "--data-dir", server.data_dir)
    assert again.returncode != 0 and "exists already" in again.stderr
    assert cli("backup", copy, "--data-dir", server.data_dir, "--force").returncode == 0

    # Restoring over the running instance's data is refused and changes nothing.
    before = snapshot(server.data_dir)
    refused = cli("restore", copy, "--data-dir", server.data_dir)
    assert refused.returncode != 0
    assert f"in use by a running appliance (pid {server.proc.pid})" in refused.stderr
    after = snapshot(server.data_dir)
    assert before.keys() == after.keys() and after["appliance.key"] == before["appliance.key"]

    # Restored into a fresh directory, a new server has the events and unwraps the same keys.
    fresh = tmp_path / "restored"
    done = cli("restore", copy, "--data-dir", fresh)
    assert done.returncode == 0, done.stderr
    assert (fresh / "appliance.key").read_bytes() == key.read_bytes()
    restored = make_server(config=PUSH_CONFIG, data_dir=fresh)
    client2 = await connect(restored.url)
    got, closed = await client2.req("r", {"authors": [alice.pubkey]})
    assert closed is None and {e["id"] for e in got} == {e.id for e in events}
    assert restored.nip11()["push"]["keys"] == descriptor["keys"]


@pytest.mark.slow
def test_restore_moves_the_replaced_data_aside(tmp_path):
    data, other = tmp_path / "data", tmp_path / "other"
    for d in (data, other):
        _with_keys(d, tmp_path)
    assert cli("backup", f"{tmp_path / 'bk'}/", "--data-dir", other).returncode == 0  # a directory
    old = snapshot(data)
    out = cli("restore", tmp_path / "bk", "--data-dir", data)
    assert out.returncode == 0, out.stderr
    aside = [p for p in data.iterdir() if p.name.startswith("before-restore-")]
    assert len(aside) == 1 and str(aside[0]) in out.stdout
    assert (aside[0] / "appliance.key").read_bytes() == old["appliance.key"]
    assert (aside[0] / "appliance.sqlite3").read_bytes() == old["appliance.sqlite3"]
    assert (data / "appliance.key").read_bytes() == (other / "appliance.key").read_bytes()


@pytest.mark.slow
def test_restore_refuses_a_key_file_that_does_not_match(tmp_path):
    data = tmp_path / "data"
    _with_keys(data, tmp_path)
    bk = tmp_path / "bk"
    assert cli("backup", f"{bk}/", "--data-dir", data).returncode == 0  # a trailing slash: a directory
    (bk / "appliance.key").write_bytes(secrets.token_bytes(32))
    target = tmp_path / "target"
    assert cli("origins", "list", "--data-dir", target).returncode == 0
    before = snapshot(target)
    out = cli("restore", bk, "--data-dir", target)
    assert out.returncode != 0
    assert "does not match the keys wrapped in" in out.stderr and "nothing was replaced" in out.stderr
    assert snapshot(target) == before

    # Without the key file at all: refused the same way.
    os.unlink(bk / "appliance.key")
    out = cli("restore", bk, "--data-dir", target)
    assert out.returncode != 0 and "nothing was replaced" in out.stderr
    assert snapshot(target) == before


def test_restore_refuses_what_is_not_a_backup(tmp_path):
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database" * 100)
    out = cli("restore", junk, "--data-dir", tmp_path / "data")
    assert out.returncode != 0 and "not a usable SQLite database" in out.stderr
    missing = cli("restore", tmp_path / "nothing.sqlite3", "--data-dir", tmp_path / "data")
    assert missing.returncode != 0 and "no database copy" in missing.stderr


@pytest.mark.slow
def test_backup_never_mixes_key_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        _with_keys(d, tmp_path)
    assert cli("backup", tmp_path / "bk" / "a.sqlite3", "--data-dir", a).returncode == 0
    out = cli("backup", tmp_path / "bk" / "b.sqlite3", "--data-dir", b)
    assert out.returncode != 0 and "key file of another database" in out.stderr
    assert not (tmp_path / "bk" / "b.sqlite3").exists()
    inside = cli("backup", a / "copy.sqlite3", "--data-dir", a)
    assert inside.returncode != 0 and "inside the data directory" in inside.stderr


def test_a_second_server_on_the_same_data_dir_is_refused(server):
    out = cli("serve", "--data-dir", server.data_dir, "--port", "0")
    assert out.returncode != 0
    assert f"in use by a running appliance (pid {server.proc.pid})" in out.stderr


def _with_keys(data_dir, tmp_path) -> None:
    """A data directory whose database holds keys wrapped by its key file (an executor key)."""
    out = cli("keys", "rotate", "ws://127.0.0.1:7777", "--data-dir", data_dir, "--config", _push_config(tmp_path))
    assert out.returncode == 0, out.stderr
    assert (data_dir / "appliance.key").exists()


def _push_config(tmp_path) -> str:
    path = tmp_path / "push.toml"
    path.write_text(PUSH_CONFIG)
    return str(path)


def test_a_backup_is_private_while_it_is_written(tmp_path):
    """The copy holds users' private events: no other user may read it, not even while it is being
    written (a backup directory is often world-readable). The source is held locked here so the
    copy waits, half-made, while its file is looked at."""
    import subprocess
    import sys
    import time

    from .helpers import ROOT

    source, dest = tmp_path / "live.sqlite3", tmp_path / "out" / "copy.sqlite3"
    dest.parent.mkdir()
    conn = apsw.Connection(str(source))
    # A rollback-journal database: its EXCLUSIVE transaction keeps every reader out (a WAL one would not).
    for sql in ("PRAGMA journal_mode = DELETE", "CREATE TABLE t(x)", "INSERT INTO t VALUES ('secret')",
                "BEGIN EXCLUSIVE", "INSERT INTO t VALUES ('more')"):
        conn.execute(sql).fetchall()
    # Its own process, as `appliance backup` is (this one may carry connection hooks of other tests).
    code = "import sys; from appliance.store.sqlite import backup_database; backup_database(sys.argv[1], sys.argv[2])"
    old_umask = os.umask(0o022)
    try:
        proc = subprocess.Popen([sys.executable, "-c", code, str(source), str(dest)], cwd=ROOT)
    finally:
        os.umask(old_umask)
    try:
        deadline = time.monotonic() + 8  # (the copy waits up to the busy timeout, 10 s)
        seen = {}
        while not seen and time.monotonic() < deadline:
            seen = {p.name: p.stat().st_mode & 0o777 for p in dest.parent.iterdir()}
            time.sleep(0.005)
    finally:
        conn.execute("COMMIT")
        conn.close()
        assert proc.wait(30) == 0
    assert ".copy.sqlite3.partial" in seen, seen  # seen while the copy waited for the source
    assert all(mode & 0o077 == 0 for mode in seen.values()), seen
    assert dest.stat().st_mode & 0o777 == 0o600
    copy = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READONLY)
    assert [r[0] for r in copy.execute("SELECT x FROM t ORDER BY rowid")] == ["secret", "more"]
    copy.close()


def test_a_backup_by_a_user_who_cannot_read_the_data_says_so(tmp_path):
    data = tmp_path / "data"
    assert cli("keys", "rotate", "ws://127.0.0.1:7777", "--data-dir", data, "--config", _push(tmp_path)).returncode == 0
    for command in ("backup", "restore"):
        out = cli_as_stranger(data, command, tmp_path / "elsewhere" / "copy.sqlite3", "--data-dir", data)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("appliance: "), out.stderr
        assert "ermission denied" in out.stderr or "not permitted" in out.stderr, out.stderr


def _push(tmp_path):
    config = tmp_path / "push.toml"
    config.write_text(PUSH_CONFIG)
    return config
