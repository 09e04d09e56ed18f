"""The migration ladder: every database, whatever version it started from, ends with one schema."""

import apsw
import pytest

from appliance.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from tests import pg


def schema_of(conn: apsw.Connection) -> list[tuple]:
    return conn.execute("SELECT type, name, sql FROM sqlite_schema ORDER BY type, name").fetchall()


@pytest.mark.sqlite_only("SQLite's own migration ladder (PostgreSQL's: test_postgres_schema_matches)")
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


@pytest.mark.sqlite_only("SQLite's own migration ladder (PostgreSQL's: test_postgres_schema_matches)")
def test_tag_index_backfill_gives_every_tag_row_its_event_kind(tmp_path):
    """Migration 10 fills `tags.kind` from the events already stored (an upgrade, not a fresh
    start) and leaves the schema a fresh database gets; new rows are written with their kind."""
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import generate_secret
    from appliance.store.events import store_event

    step = next(i for i, sql in enumerate(MIGRATIONS) if "tags ADD COLUMN kind" in sql)
    old = apsw.Connection(str(tmp_path / "old.sqlite3"))
    for version, sql in enumerate(MIGRATIONS[:step]):
        with old:
            old.execute(sql)
            old.execute(f"PRAGMA user_version = {version + 1}")
    with old:
        old.execute("INSERT INTO origins (origin) VALUES ('wss://x.example.org')")
        secret = generate_secret()
        for i, kind in enumerate((1, 7, 1059, 30023)):
            ev = sign_event(secret, kind, [["p", "a" * 64], ["t", f"t{i}"], ["d", "x"]], "hi", 1_700_000_000 + i)
            old.execute("INSERT INTO events (origin, id, pubkey, created_at, kind, raw) VALUES (1, ?, ?, ?, ?, ?)",
                        (ev.id, ev.pubkey, ev.created_at, ev.kind, ev.to_json()))
            rowid = old.last_insert_rowid()
            for name, value in (("p", "a" * 64), ("t", f"t{i}")):
                old.execute("INSERT INTO tags (event, origin, name, value, created_at) VALUES (?, 1, ?, ?, ?)",
                            (rowid, name, value, ev.created_at))
    assert migrate(old) == step
    assert old.execute("SELECT count(*) FROM tags").fetchone()[0] == 8
    assert old.execute("SELECT count(*) FROM tags t JOIN events e ON e.rowid = t.event "
                       "WHERE t.kind = e.kind").fetchone()[0] == 8
    with old:
        ev = sign_event(secret, 6, [["p", "b" * 64]], "", 1_700_000_100)
        store_event(old, 1, ev, raw=ev.to_json(), expiration=None, now=1_700_000_200)
    assert old.execute("SELECT kind FROM tags WHERE value = ?", ("b" * 64,)).fetchall() == [(6,)]

    fresh = apsw.Connection(str(tmp_path / "fresh.sqlite3"))
    migrate(fresh)
    assert schema_of(old) == schema_of(fresh)
    plan = old.execute("EXPLAIN QUERY PLAN SELECT count(*) FROM tags t WHERE t.origin = 1 AND t.name = 'p' "
                       "AND t.value = ? AND t.kind = 1 AND t.event > 0", ("a" * 64,)).fetchall()
    assert any("COVERING INDEX tags_lookup" in row[3] for row in plan), plan


@pytest.mark.skipif(not pg.on_postgres(), reason="the PostgreSQL schema (runs under --storage=postgresql)")
def test_postgres_schema_matches(tmp_path):
    """PostgreSQL's migration 1 has SQLite's tables and columns, in the same order, and a second
    start finds it current; a database holding tables of something else is refused."""
    import psycopg

    from appliance.errors import StoreError
    from appliance.store.pg_schema import SCHEMA_VERSION as PG_VERSION, SQLITE_SCHEMA_VERSION
    from appliance.store.postgres import PostgresStore

    assert SQLITE_SCHEMA_VERSION == SCHEMA_VERSION, "a SQLite migration needs its PostgreSQL step"
    lite = apsw.Connection(":memory:")
    migrate(lite)
    # The search index is each backend's own (an FTS5 table and its shadow tables; events_search).
    want = {t: [r[1] for r in lite.execute(f"PRAGMA table_info({t})")]
            for (t,) in lite.execute("SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table' "
                                     "AND name NOT LIKE 'sqlite_%'")}
    url = pg.empty_database()
    store = PostgresStore(url, tmp_path)
    assert store.create_schema() == 0
    assert store.create_schema() == PG_VERSION  # found current: nothing to do
    with psycopg.connect(url) as c:
        got: dict = {}
        for t, col in c.execute("SELECT table_name, column_name FROM information_schema.columns "
                                "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"):
            got.setdefault(t, []).append(col)
    assert got.pop("schema_version") == ["version"]
    assert got.pop("events_search") == ["event", "tsv"]
    assert got == want
    foreign = pg.empty_database()
    with psycopg.connect(foreign) as c:
        c.execute("CREATE TABLE something (x int)")
    with pytest.raises(StoreError, match="tables this appliance did not create"):
        PostgresStore(foreign, tmp_path).open()
