"""The index that drives each filter's query, read from SQLite's own plan (EXPLAIN QUERY PLAN).

Without statistics (a database that grew since it was opened has none) SQLite used to pick an index
that yields the ORDER BY and scan every event of the origin in it: `ids` through events_time, the
tie reads of an author through events_id. These check the plan, not the speed.
"""

from __future__ import annotations

import pytest

from appliance.nostr.filters import parse_filter
from appliance.relay.authz import AUTHOR_ONLY_KINDS, GATED_KINDS
from appliance.store.events import ReadScope, build_query
from appliance.store.sqlite import SqliteStore
from appliance.store.statement import SQLITE

pytestmark = pytest.mark.sqlite_only("reads SQLite's query plan (EXPLAIN QUERY PLAN)")

A, B = "a" * 64, "b" * 64
SCOPE = ReadScope(None, GATED_KINDS, AUTHOR_ONLY_KINDS)


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "data", sync_mode="normal", reader_threads=1).open()
    yield s
    s.close()


def driving_step(store, flt: dict, **kw) -> str:
    sql, params = build_query(SQLITE, 1, parse_filter(flt), SCOPE, 2_000_000_000, 50, **kw)
    plan = store.read_sync(lambda conn: [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)])
    return plan[0]


@pytest.mark.parametrize("flt,at_second,index", [
    ({"ids": [A, B]}, None, "events_id (origin=? AND id=?)"),
    ({"ids": [A]}, 1, "events_id (origin=? AND id=?)"),
    ({"authors": [A]}, None, "events_author (origin=? AND pubkey=?)"),
    ({"authors": [A, B]}, None, "events_author (origin=? AND pubkey=?)"),
    ({"authors": [A]}, 1, "events_author (origin=? AND pubkey=? AND created_at=?)"),
    ({"authors": [A], "kinds": [1]}, None, "events_author (origin=? AND pubkey=?)"),
    ({"kinds": [1]}, 1, "events_kind (origin=? AND kind=? AND created_at=?)"),
    ({"since": 5}, None, "events_time (origin=? AND created_at>?)"),
    ({"kinds": [1], "#p": [A]}, None, "tags_lookup (origin=? AND name=? AND value=?)"),
    ({"kinds": [1], "#p": [A]}, 1, "tags_lookup (origin=? AND name=? AND value=? AND created_at=? AND kind=?)"),
])
def test_each_filter_is_driven_by_its_own_index(store, flt, at_second, index):
    # No statistics on events or tags (a new database): the planner's defaults decide.
    assert not store.read_sync(lambda conn: conn.execute(
        "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchall() and conn.execute(
        "SELECT 1 FROM sqlite_stat1 WHERE tbl IN ('events', 'tags')").fetchall())
    assert driving_step(store, flt, at_second=at_second).endswith(index)
