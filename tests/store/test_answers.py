"""A filter's stored answer: its limit, its byte budget and NIP-01's order (newest first, ties by
the lowest id), the same whether it is read in one pass (one row per event) or row by row (a
driving tag with several values). Order and sizes, never speed."""

from __future__ import annotations

import random

import pytest

from appliance.nostr.filters import parse_filter
from appliance.relay.authz import AUTHOR_ONLY_KINDS, GATED_KINDS
from appliance.store.events import ReadScope, any_expired, count_events, query_rows
from appliance.store.sqlite import SqliteStore

SCOPE = ReadScope(None, GATED_KINDS, AUTHOR_ONLY_KINDS)
P, NOBODY, AUTHOR = "a" * 64, "f" * 64, "b" * 64
NOW = 2_000_000_000


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "data", sync_mode="normal", reader_threads=1).open()
    yield s
    s.close()


def fill(store, rng: random.Random, n: int) -> dict[str, tuple[int, int]]:
    """n kind-1 events by AUTHOR tagging P, a few per second (many ties), of varied sizes:
    {id: (created_at, size of raw)}."""
    made: dict[str, tuple[int, int]] = {}

    def write(conn):
        conn.execute("INSERT OR IGNORE INTO origins (id, origin) VALUES (1, 'wss://answers.example')")
        for i in range(n):
            eid = f"{rng.getrandbits(256):064x}"
            created_at = 1_000 + rng.randrange(n // 3 + 1)
            raw = '{"id":"%s","content":"%s"}' % (eid, "x" * rng.randrange(10, 400))
            rowid = conn.execute(
                "INSERT INTO events (origin, id, pubkey, created_at, kind, raw) VALUES (1, ?, ?, ?, 1, ?) "
                "RETURNING rowid", (eid, AUTHOR, created_at, raw)).fetchone()[0]
            conn.execute("INSERT INTO tags (event, origin, name, value, created_at, kind) VALUES (?, 1, 'p', ?, ?, 1)",
                         (rowid, P, created_at))
            made[eid] = (created_at, len(raw))

    store.write_sync(write)
    return made


def answer(store, flt: dict, limit: int, max_bytes: int | None) -> list[str]:
    f = parse_filter({**flt, "limit": limit})
    rows = store.read_sync(lambda conn: query_rows(conn, 1, [f], SCOPE, NOW, default_limit=limit, max_limit=limit,
                                                   max_bytes=max_bytes))
    return [eid for eid, _raw in rows]


def test_one_pass_and_row_by_row_answers_agree_on_limits_budgets_and_ties(store):
    rng = random.Random(15)
    made = fill(store, rng, 120)
    everything = sorted(made, key=lambda eid: (-made[eid][0], eid))
    for limit in (1, 2, 3, 5, 8, 13, 50, 119, 120, 121, 500):
        for max_bytes in (None, 1, 150, 1_000, 5_000, 20_000, 10_000_000):
            one_pass = answer(store, {"kinds": [1], "#p": [P]}, limit, max_bytes)
            by_author = answer(store, {"authors": [AUTHOR]}, limit, max_bytes)
            row_by_row = answer(store, {"kinds": [1], "#p": [P, NOBODY]}, limit, max_bytes)
            assert one_pass == by_author == row_by_row, (limit, max_bytes)
            # NIP-01: the newest, ties by the lowest id; within the limit and, past the first
            # event, the byte budget.
            assert one_pass == everything[:len(one_pass)]
            assert 1 <= len(one_pass) <= limit
            if max_bytes is None or sum(made[e][1] for e in everything[:limit]) <= max_bytes:
                assert len(one_pass) == min(limit, len(everything))
            else:
                assert len(one_pass) == 1 or sum(made[e][1] for e in one_pass) <= max_bytes


def test_expired_events_not_yet_purged_are_neither_answered_nor_counted(store):
    """NIP-40: an event past its expiration is never served, whether or not it was purged yet; the
    check is the event row's own (a REQ reads the row) or the expiration index (an index-only
    COUNT), the same answer either way, for every driving index."""

    def write(conn):
        conn.execute("INSERT OR IGNORE INTO origins (id, origin) VALUES (1, 'wss://answers.example')")
        for i, expiration in enumerate([None, NOW - 1, NOW, NOW + 1, None, NOW - 100]):
            eid = f"{i:064x}"
            rowid = conn.execute(
                "INSERT INTO events (origin, id, pubkey, created_at, kind, expiration, raw) "
                "VALUES (1, ?, ?, ?, 1, ?, ?) RETURNING rowid",
                (eid, AUTHOR, 1_000 + i, expiration, '{"id":"%s"}' % eid)).fetchone()[0]
            conn.execute("INSERT INTO tags (event, origin, name, value, created_at, kind) VALUES (?, 1, 'p', ?, ?, 1)",
                         (rowid, P, 1_000 + i))

    store.write_sync(write)
    live = [f"{i:064x}" for i in (4, 3, 0)]  # newest first; expiration NOW means expired at NOW
    shapes = [{"#p": [P]}, {"kinds": [1], "#p": [P]}, {"#p": [P, NOBODY]}, {"authors": [AUTHOR]}, {"kinds": [1]},
              {"ids": [f"{i:064x}" for i in range(6)]}, {}]
    for flt in shapes:
        assert answer(store, flt, 10, None) == live, flt
        assert answer(store, flt, 2, None) == live[:2], flt
        f = parse_filter(flt)
        assert store.read_sync(lambda conn, f=f: count_events(conn, 1, [f], SCOPE, NOW)) == 3, flt
    both = [parse_filter({"authors": [AUTHOR]}), parse_filter({"#p": [P]})]
    assert store.read_sync(lambda conn: count_events(conn, 1, both, SCOPE, NOW)) == 3
    rows = store.read_sync(lambda conn: query_rows(conn, 1, both, SCOPE, NOW, default_limit=10, max_limit=10))
    assert [eid for eid, _raw in rows] == live


def test_a_count_checks_expiration_only_while_an_expired_event_is_stored(store):
    """COUNT leaves the expiration check out of its statement when the snapshot holds no expired
    event (every row scanned would pay for it), and counts the same either way."""
    fill(store, random.Random(3), 30)
    flt = [parse_filter({"kinds": [1]})]

    def count(conn):
        return any_expired(conn, NOW), count_events(conn, 1, flt, SCOPE, NOW)

    assert store.read_sync(count) == (False, 30)
    store.write_sync(lambda conn: conn.execute("UPDATE events SET expiration = ? WHERE rowid IN "
                                               "(SELECT rowid FROM events ORDER BY rowid LIMIT 4)", (NOW,)))
    assert store.read_sync(count) == (True, 26)
    store.write_sync(lambda conn: conn.execute("UPDATE events SET expiration = ? WHERE expiration IS NOT NULL",
                                               (NOW + 1,)))
    assert store.read_sync(count) == (False, 30)


def test_a_limit_of_large_events_is_read_only_as_far_as_its_byte_budget(store):
    """A one-row-per-event read with a large limit stops reading rows once past the filter's byte
    budget (then finishes row by row), rather than reading limit + 1 rows to cut them after: a
    reader holds about max_query_bytes of rows (max_output_buffer_total counts on it)."""
    from appliance.store.events import FETCH_MORE_ROWS

    def write(conn):
        conn.execute("INSERT OR IGNORE INTO origins (id, origin) VALUES (1, 'wss://answers.example')")
        for i in range(300):  # one event a second, about 2 KB each
            eid = f"{i:064x}"
            conn.execute("INSERT INTO events (origin, id, pubkey, created_at, kind, raw) VALUES (1, ?, ?, ?, 1, ?)",
                         (eid, AUTHOR, 1_000 + i, '{"id":"%s","content":"%s"}' % (eid, "x" * 2_000)))

    store.write_sync(write)
    consumed = []

    class Counting:
        def __init__(self, cursor):
            self.cursor = cursor

        def __iter__(self):
            for row in self.cursor:
                consumed.append(row[1])
                yield row

        def fetchall(self):
            return list(self)

        def fetchone(self):
            return next(iter(self), None)

    class Conn:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, sql, params=None):
            return Counting(self.conn.execute(sql, params))

    f = parse_filter({"kinds": [1], "limit": 500})
    rows = store.read_sync(lambda conn: query_rows(Conn(conn), 1, [f], SCOPE, NOW, default_limit=500,
                                                   max_limit=500, max_bytes=200_000))
    ids = [eid for eid, _raw in rows]
    assert ids == [f"{i:064x}" for i in range(299, 299 - len(ids), -1)]  # the newest, within the budget
    assert sum(len(raw) for _eid, raw in rows) <= 200_000 < sum(len(raw) for _eid, raw in rows) + 2_100
    assert len(consumed) <= len(ids) + FETCH_MORE_ROWS + 2  # not the 301 rows of limit + 1
