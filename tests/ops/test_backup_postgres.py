"""Backups of a PostgreSQL store: `appliance backup` and `restore` write nothing and say how (the
pg_dump and pg_restore commands, the URL without its password, the key file to keep), exit 2; the
printed pg_dump command, restored with the printed pg_restore command, gives back a store the
appliance serves with the same events and keys; the dashboard's Backup section says the same and
offers no download."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from tests.conftest import Identity

from .helpers import PUSH_CONFIG, cli, snapshot

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL store needs psycopg")

SECRET = "s3cret-backup-pw"


def with_password(url: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def count(url: str, sql: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(sql).fetchone()[0]


@pytest.mark.slow
async def test_backup_says_how_and_the_printed_commands_restore_a_served_store(pg_cluster, make_server, connect,
                                                                               tmp_path):
    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.fail("pg_dump and pg_restore (Debian's postgresql-client) are needed beside the PostgreSQL server")
    url = pg_cluster.new_database()
    data = tmp_path / "data"
    server = make_server(config=PUSH_CONFIG, data_dir=data, env={"APPLIANCE_STORAGE": url})
    config = data.parent / f"config-{server.port}.toml"
    alice = Identity()
    client = await connect(server.url)
    events = [alice.sign(1, [["t", "backup"]], f"note {i}") for i in range(12)]
    for ev in events:
        assert (await client.publish(ev))[0]
    keys = server.nip11()["push"]["keys"]

    target = tmp_path / "backups"
    target.mkdir()
    env = {"APPLIANCE_STORAGE": with_password(url)}
    out = cli("backup", f"{target}/", "--data-dir", data, "--config", config, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert SECRET not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert "keeps its data in PostgreSQL" in out.stderr and "changed nothing" in out.stderr
    assert "PGPASSWORD or ~/.pgpass" in out.stderr and f"cp {data.resolve()}/appliance.key" in out.stderr
    assert list(target.iterdir()) == []
    dump_line = next(line.strip() for line in out.stderr.splitlines() if line.strip().startswith("pg_dump "))
    restore_line = next(line.strip() for line in out.stderr.splitlines() if line.strip().startswith("pg_restore "))

    before = snapshot(data)
    out = cli("restore", target, "--data-dir", data, "--config", config, env=env)
    assert out.returncode == 2 and "`appliance restore` copies a SQLite store only" in out.stderr
    assert SECRET not in out.stdout + out.stderr and snapshot(data) == before

    # The printed commands, run as they stand (the password left out: the test cluster trusts
    # local connections; an operator's comes from PGPASSWORD or ~/.pgpass).
    dump_cmd = shlex.split(dump_line.split("   (", 1)[0])
    subprocess.run(dump_cmd, check=True, capture_output=True, timeout=120)
    (dump,) = list(target.iterdir())
    shutil.copy2(data / "appliance.key", target / "appliance.key")
    server.stop()
    fresh = pg_cluster.new_database()  # the printed createdb's empty database
    restore_cmd = shlex.split(restore_line.replace("URL-OF-NEWDB", fresh))
    assert restore_cmd[-1] == str(dump)
    subprocess.run(restore_cmd, check=True, capture_output=True, timeout=120)

    other = tmp_path / "restored"
    other.mkdir()
    shutil.copy2(target / "appliance.key", other / "appliance.key")
    restored = make_server(config=PUSH_CONFIG, data_dir=other, env={"APPLIANCE_STORAGE": fresh})
    client = await connect(restored.url)
    got, closed = await client.req("r", {"authors": [alice.pubkey]})
    assert closed is None and {e["id"] for e in got} == {e.id for e in events}
    assert restored.nip11()["push"]["keys"] == keys  # the wrapped executor keys came along, and unwrap
    assert (await client.publish(alice.sign(1, content="after the restore")))[0]
    assert count(fresh, "SELECT count(*) FROM events") == 13


async def test_the_dashboard_says_how_to_back_up_postgresql_and_offers_no_download(pg_cluster, tmp_path,
                                                                                   anyio_backend):
    from tests.admin.helpers import Dashboard

    url = pg_cluster.new_database()
    d = Dashboard(tmp_path / "data", storage=with_password(url))
    try:
        await d.set_up()
        page = await d.get("/admin/settings")
        assert page.status_code == 200
        assert "pg_dump --format=custom" in page.text and 'id="pg-restore"' in page.text
        assert "backup-button" not in page.text and "/settings/backup" not in page.text
        assert SECRET not in page.text and "PGPASSWORD" in page.text
        assert f"{(tmp_path / 'data').resolve()}/appliance.key" in page.text
        r = await d.post_form("/admin/settings/backup", {}, page="/admin/settings")
        assert r.status_code == 409 and r.headers["content-type"].startswith("text/html")
        assert "content-disposition" not in r.headers and "back the database up with pg_dump" in r.text
        assert not list((tmp_path / "data").glob(".backup-*"))
    finally:
        await d.close()
