"""`appliance doctor` on a PostgreSQL store: the same pass/fail list and exit codes as on SQLite,
with the database's own checks (reachable, schema version, tables, rows, server settings); the
storage URL's password is never printed; nothing is written."""

from __future__ import annotations

import os
import re

import pytest

from appliance.store.pg_schema import SCHEMA_VERSION

from .helpers import PUSH_CONFIG, cli
from .test_doctor import lines

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL store needs psycopg")

SECRET = "s3cret-doctor-pw"


def with_password(url: str) -> str:
    """The URL with a password (the test cluster trusts local connections: it is never asked for,
    but it is part of the setting, so it must never be printed)."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def doctor(data, url, *extra):
    out = cli("doctor", "--data-dir", data, *extra, env={"APPLIANCE_STORAGE": with_password(url)})
    assert SECRET not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return out


def state(url) -> tuple:
    """What a doctor run must not change: every table's row count and the generation."""
    with psycopg.connect(url, autocommit=True) as c:
        tables = [t for (t,) in c.execute("SELECT table_name FROM information_schema.tables "
                                          "WHERE table_schema = 'public' ORDER BY table_name")]
        counts = {t: c.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        gen = c.execute("SELECT value FROM meta WHERE name = 'config_generation'").fetchone()
    return counts, gen


def fsync_on(url) -> bool:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute("SHOW fsync").fetchone()[0] == "on"


@pytest.fixture
def store(tmp_path, pg_cluster):
    """A data directory (key file) over a PostgreSQL database holding an origin with an executor key."""
    url = pg_cluster.new_database()
    data = tmp_path / "data"
    config = tmp_path / "push.toml"
    config.write_text(PUSH_CONFIG)
    out = cli("keys", "rotate", "ws://127.0.0.1:7777", "--data-dir", data, "--config", config,
              env={"APPLIANCE_STORAGE": url})
    assert out.returncode == 0, out.stderr
    return data, url, config


@pytest.mark.slow
def test_a_postgresql_store_passes_every_check_and_nothing_is_written(store, make_server):
    data, url, config = store
    srv = make_server("--config", config, env={"APPLIANCE_STORAGE": url}, data_dir=data)
    before = state(url)
    out = doctor(data, url, "--config", config, "--sync-mode", "normal")
    assert out.returncode == 0, out.stdout + out.stderr
    got = lines(out)
    # The running appliance's own URL (issue #27: the port it really listens on, not the default's).
    for name in ("database", "database tables", "database rows", "database settings", "key file",
                 f"descriptor ws://127.0.0.1:{srv.port}"):
        assert got[name] == "PASS", (name, out.stdout)
    assert f"schema version {SCHEMA_VERSION} (the latest)" in out.stdout
    assert "postgresql://postgres:***@/" in out.stdout  # the URL is named, its password is not
    assert f"served now by pid {srv.proc.pid}" in out.stdout
    assert re.search(r"unwraps all [2-9] wrapped key\(s\)", out.stdout)  # the relay's and the executor's
    assert out.stdout.rstrip().endswith("checks)") and "no problem found" in out.stdout
    assert state(url) == before

    # sync_mode "full" promises durable acknowledgements: a server without fsync breaks it.
    out = doctor(data, url, "--config", config)
    if fsync_on(url):
        assert out.returncode == 0 and lines(out)["database settings"] == "PASS"
    else:
        assert out.returncode == 1 and lines(out)["database settings"] == "FAIL"
        assert "fsync is off" in out.stdout and "1 of" in out.stdout


@pytest.mark.slow
def test_a_damaged_or_foreign_postgresql_store_fails_and_says_why(store, pg_cluster, tmp_path):
    data, url, config = store
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ALTER TABLE wake_jobs DROP COLUMN last_error")
    out = doctor(data, url, "--config", config, "--sync-mode", "normal")
    got = lines(out)
    assert out.returncode == 1 and got["database"] == "PASS" and got["database tables"] == "FAIL"
    assert "wake_jobs lacks column(s) last_error" in out.stdout and "1 of" in out.stdout
    assert "key file" in got  # the checks that read the store are not run on a broken one, but listed

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ALTER TABLE wake_jobs ADD COLUMN last_error TEXT")
        c.execute("DELETE FROM meta WHERE name = 'config_generation'")
    out = doctor(data, url, "--config", config, "--sync-mode", "normal")
    got = lines(out)
    assert out.returncode == 1 and got["database tables"] == "PASS" and got["database rows"] == "FAIL"
    assert "meta config_generation" in out.stdout

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("INSERT INTO meta (name, value) VALUES ('config_generation', '3')")
        c.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    out = doctor(data, url, "--config", config, "--sync-mode", "normal")
    assert out.returncode == 1 and lines(out)["database"] == "FAIL" and "upgrade the appliance" in out.stdout

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION,))
    (data / "appliance.key").write_bytes(os.urandom(32))  # another database's key file
    out = doctor(data, url, "--config", config, "--sync-mode", "normal")
    got = lines(out)
    assert out.returncode == 1 and got["key file"] == "FAIL" and "cannot unwrap" in out.stdout
    assert got["database rows"] == "PASS"

    foreign = pg_cluster.new_database()
    with psycopg.connect(foreign, autocommit=True) as c:
        c.execute("CREATE TABLE something (x int)")
    out = doctor(tmp_path / "other", foreign, "--sync-mode", "normal")
    assert out.returncode == 1 and lines(out)["database"] == "FAIL" and "did not create" in out.stdout

    gone = pg_cluster.url("appliance_no_such_database")
    out = doctor(tmp_path / "other", gone, "--sync-mode", "normal")
    assert out.returncode == 1 and lines(out)["database"] == "FAIL"
    assert "cannot connect to postgresql://postgres:***@/appliance_no_such_database" in out.stdout


def test_an_empty_postgresql_database_is_fine_before_the_first_start(pg_cluster, tmp_path):
    out = doctor(tmp_path / "data", pg_cluster.new_database(), "--sync-mode", "normal")
    assert out.returncode == 0, out.stdout + out.stderr
    got = lines(out)
    assert got["database"] == "SKIP" and got["database settings"] == "PASS" and got["key file"] == "SKIP"
    assert "schema is made at first start" in out.stdout
