"""The store under failure: a transaction SQLite rolls back by itself fails its batch and nothing
else; unusable files and directories give a clear message, never a traceback or a silent repair."""

from __future__ import annotations

import subprocess
import sys

import apsw
import pytest

from appliance.errors import StorageFull, StoreError
from appliance.store.meta import health_probe
from appliance.store.sqlite import SqliteStore
from appliance.store.statement import SQL
from tests.pg import make_store
from tests.conftest import ROOT


@pytest.mark.sqlite_only("SQLite itself rolling a transaction back (disk full) mid-batch")
def test_writer_survives_a_transaction_sqlite_rolled_back(tmp_path):
    with SqliteStore(tmp_path / "data") as store:
        store.write_sync(lambda conn: conn.execute("CREATE TABLE t (x)"))

        def doomed(conn):
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("ROLLBACK")  # what SQLite does on disk full or an I/O error mid-write
            raise apsw.FullError("database or disk is full")

        # A full disk is one error callers can name (StorageFull), and the store remembers it until
        # an ordinary write fits again (the health check's probe row does not count).
        with pytest.raises(StorageFull) as refused:
            store.write_sync(doomed)
        assert isinstance(refused.value.__cause__, apsw.FullError) and store.full_since is not None
        store.write_sync(health_probe(0.0))
        assert store.full_since is not None
        store.write_sync(lambda conn: conn.execute("INSERT INTO t VALUES (2)"))
        assert store.full_since is None
        assert store.read_sync(lambda conn: conn.execute("SELECT x FROM t").fetchall()) == [(2,)]


def run(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    from tests.pg import process_env

    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60, env=process_env(args))


@pytest.mark.parametrize("case", ["garbage", "foreign", "file-as-dir"])
@pytest.mark.sqlite_only("a damaged or foreign database file")
def test_unusable_data_gives_a_message(tmp_path, case):
    data = tmp_path / "data"
    if case == "file-as-dir":
        data.write_text("not a directory")
        expect = "cannot use the data directory"
    else:
        data.mkdir()
        db = data / "appliance.sqlite3"
        if case == "garbage":
            db.write_bytes(b"this is not a database" * 300)
            expect = "is not a usable SQLite database"
        else:
            conn = apsw.Connection(str(db))
            conn.execute("CREATE TABLE events (x)")
            conn.close()
            expect = "holds tables this appliance did not create"
    out = run("origins", "list", "--data-dir", str(data))
    assert out.returncode == 2 and expect in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_missing_key_file_is_never_replaced(tmp_path):
    data = tmp_path / "data"
    assert run("groups", "create", "ws://127.0.0.1:7777", "--data-dir", str(data)).returncode == 0
    (data / "appliance.key").unlink()
    out = run("groups", "create", "ws://127.0.0.1:7777", "--data-dir", str(data))
    assert out.returncode == 2 and "key file" in out.stderr and "missing" in out.stderr, out.stderr
    assert not (data / "appliance.key").exists()


def test_config_file_problems_give_a_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"port = \xff\xfe")
    for path, expect in ((bad, "not UTF-8"), (tmp_path, "cannot read the config file")):
        out = run("config", "show", "--config", str(path))
        assert out.returncode == 2 and expect in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow
def test_groups_cli_checks_pubkeys(tmp_path):
    data = ["--data-dir", str(tmp_path / "data")]
    out = run("groups", "create", "ws://127.0.0.1:7777", "--admin", "nothex", *data)
    assert out.returncode == 2 and "is not a pubkey" in out.stderr, out.stderr
    created = run("groups", "create", "ws://127.0.0.1:7777", *data)
    assert created.returncode == 0, created.stderr
    import json

    h = json.loads(created.stdout)["id"]
    out = run("groups", "remove", "ws://127.0.0.1:7777", h, "a" * 64, *data)
    assert out.returncode == 2 and "not a member" in out.stderr, out.stderr


@pytest.mark.slow
def test_version_on_every_subcommand():
    for args in (["--version"], ["serve", "--version"], ["origins", "add", "--version"], ["--port", "1", "--version"]):
        out = run(*args)
        assert out.returncode == 0 and out.stdout.startswith("appliance "), (args, out.stderr)


def test_read_past_its_time_budget_is_abandoned(tmp_path):
    from appliance.store.sqlite import QueryTimeout

    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    endless = SQL(endless, endless)
    with make_store(tmp_path / "data") as store:
        with pytest.raises(QueryTimeout):
            store.read_sync(lambda conn: conn.execute(endless).fetchone(), timeout=0.05)
        # The reader connection is fine afterwards, with and without a budget.
        assert store.read_sync(lambda conn: conn.execute(SQL("SELECT 1", "SELECT 1")).fetchone(), timeout=1) == (1,)
        assert store.read_sync(lambda conn: conn.execute(SQL("SELECT 2", "SELECT 2")).fetchone()) == (2,)
