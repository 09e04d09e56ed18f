"""The migration ladder: every database, whatever version it started from, ends with one schema."""

import apsw

from appliance.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate


def schema_of(conn: apsw.Connection) -> list[tuple]:
    return conn.execute("SELECT type, name, sql FROM sqlite_schema ORDER BY type, name").fetchall()


def test_old_endpoint_index_dropped_and_schemas_converge(tmp_path):
    fresh = apsw.Connection(str(tmp_path / "fresh.sqlite3"))
    assert migrate(fresh) == 0
    assert fresh.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION

    old = apsw.Connection(str(tmp_path / "old.sqlite3"))
    for version, step in enumerate(MIGRATIONS[:3]):
        with old:
            old.execute(step)
            old.execute(f"PRAGMA user_version = {version + 1}")
    old.execute("CREATE INDEX leases_endpoint ON leases(origin, pubkey, app_profile, transport, endpoint_hash) "
                "WHERE active = 1")
    assert migrate(old) == 3
    assert old.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'leases_endpoint'").fetchone()[0] == 0
    assert schema_of(old) == schema_of(fresh)
