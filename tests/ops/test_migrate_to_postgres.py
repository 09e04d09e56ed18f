"""`appliance migrate-to-postgres URL`: a SQLite data dir copied into an empty PostgreSQL database,
keys included, counts verified and printed; a non-empty target refused and left untouched."""

from __future__ import annotations

import pytest

from tests import pg
from tests.conftest import Identity

from .helpers import PUSH_CONFIG, cli

pytestmark = pytest.mark.skipif(not pg.on_postgres(), reason="needs the suite's PostgreSQL cluster "
                                "(runs under --storage=postgresql: make test-postgres)")


async def test_copy_then_serve_from_postgres(make_server, connect, tmp_path):
    server = make_server(config=PUSH_CONFIG, env={"APPLIANCE_STORAGE": "sqlite"})
    config = server.data_dir.parent / f"config-{server.port}.toml"
    alice = Identity()
    client = await connect(server.url)
    events = [alice.sign(1, [["t", f"x{i % 3}"]], f"note {i}") for i in range(30)]
    for ev in events:
        assert (await client.publish(ev))[0]
    await client.close()
    descriptor = server.nip11()["push"]

    # A password in the URL (the test cluster trusts local connections, so any will do) is never shown.
    url = pg.empty_database().replace("postgres@", "postgres:s3cret-pw@", 1)
    refused = cli("migrate-to-postgres", url, "--data-dir", server.data_dir, "--config", config)
    assert refused.returncode != 0 and "in use by a running appliance" in refused.stderr
    assert pg.db_rows_at(url, "SELECT count(*) FROM information_schema.tables "
                              "WHERE table_schema = 'public'") == [(0,)]
    server.stop()

    out = cli("migrate-to-postgres", url, "--data-dir", server.data_dir, "--config", config)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:] if len(line.split()) == 3}
    assert rows["events"] == ["30", "30"] and rows["tags"] == ["30", "30"]
    assert rows["executor_keys"][0] == rows["executor_keys"][1] != "0"  # the wrapped keys are rows
    assert rows["origins"] == ["1", "1"]
    assert "verified:" in out.stdout and "every count equal" in out.stdout
    assert "postgres:***@" in lines[0] and "s3cret-pw" not in out.stdout + out.stderr

    # A second copy into the same (no longer empty) database is refused, and changes nothing there.
    again = cli("migrate-to-postgres", url, "--data-dir", server.data_dir, "--config", config)
    assert again.returncode != 0 and "is not empty" in again.stderr
    assert pg.db_rows_at(url, "SELECT count(*) FROM events") == [(30,)]

    # Served from PostgreSQL (same data dir: the key file stays the node's), the events, the
    # executor keys and a new event's id (past the copied ones) are all there.
    moved = make_server(config=PUSH_CONFIG, data_dir=server.data_dir, env={"APPLIANCE_STORAGE": url})
    client = await connect(moved.url)
    got, closed = await client.req("r", {"authors": [alice.pubkey]})
    assert closed is None and {e["id"] for e in got} == {e.id for e in events}
    got, _ = await client.req("t", {"#t": ["x1"]})
    assert len(got) == 10
    assert moved.nip11()["push"]["keys"] == descriptor["keys"]
    assert (await client.publish(alice.sign(1, content="after the move")))[0]
    assert pg.db_rows_at(url, "SELECT count(*) FROM events") == [(31,)]


def test_refuses_what_it_cannot_copy(tmp_path):
    out = cli("migrate-to-postgres", "sqlite", "--data-dir", tmp_path / "none")
    assert out.returncode == 2 and "postgresql:// URL" in out.stderr
    out = cli("migrate-to-postgres", pg.empty_database(), "--data-dir", tmp_path / "none")
    assert out.returncode == 2 and "no SQLite store" in out.stderr
