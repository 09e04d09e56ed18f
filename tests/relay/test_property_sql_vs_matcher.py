"""Differential property test: the SQL query path selects exactly what the pure matcher selects.

Random events go into a real SQLite store through `store_event`; random filters and readers are run
through `query_events`/`count_events` and compared with `matches` + `can_read` over the events that
are actually stored (read back from the table, so replacement and deletion need no model here).
"""

from __future__ import annotations

import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from appliance.errors import Rejected
from appliance.nostr.event import Event, expiration as event_expiration, sign_event
from appliance.nostr.filters import matches, parse_filter
from appliance.nostr.keys import generate_secret, public_key
from appliance.relay.authz import NoGroups, can_read, read_scope
from appliance.origins import Origin
from appliance.store.events import count_events, query_events, store_event
from appliance.store.origin_rows import upsert_origin
from appliance.store.sqlite import SqliteStore
from appliance.store.statement import SQL
from tests.pg import make_store

SECRETS = [generate_secret() for _ in range(3)]
AUTHORS = [public_key(s) for s in SECRETS]
OUTSIDER = public_key(generate_secret())
NOW = int(time.time())
BASE = NOW - 1000

KINDS = [1, 4, 1059, 30023, 0, 7]
P_VALUES = AUTHORS[:2] + [OUTSIDER]
E_VALUES = ["e" * 64, "f" * 64]
T_VALUES = ["nostr", "python", "x"]
H_VALUES = ["g1", "g2"]

# Signing is slow; a pool of pre-signed events keyed by their description keeps examples fast.
_signed: dict = {}


def _event(author: int, kind: int, created: int, tags: tuple, content: str) -> Event:
    key = (author, kind, created, tags, content)
    ev = _signed.get(key)
    if ev is None:
        ev = _signed[key] = sign_event(SECRETS[author], kind, [list(t) for t in tags], content, BASE + created)
    return ev


tag_strategy = st.one_of(
    st.tuples(st.just("p"), st.sampled_from(P_VALUES)),
    st.tuples(st.just("e"), st.sampled_from(E_VALUES)),
    st.tuples(st.just("t"), st.sampled_from(T_VALUES)),
    st.tuples(st.just("h"), st.sampled_from(H_VALUES)),
    st.tuples(st.just("d"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("expiration"), st.sampled_from([str(NOW + 3600), str(NOW + 7200)])),
)

event_strategy = st.builds(
    _event,
    author=st.integers(0, len(AUTHORS) - 1),
    kind=st.sampled_from(KINDS),
    created=st.integers(0, 5),
    tags=st.lists(tag_strategy, max_size=4).map(tuple),
    content=st.sampled_from(["", "hello", "world"]),
)


FILTER_KEYS = ["ids", "authors", "kinds", "#p", "#t", "#e", "#h", "since", "until"]


@st.composite
def filter_dicts(draw, known_ids: list[str]) -> dict:
    """A filter with up to three conditions (more would almost never match anything)."""
    d: dict = {}
    for key in draw(st.sets(st.sampled_from(FILTER_KEYS), max_size=3)):
        if key == "ids":
            d[key] = draw(st.lists(st.sampled_from([*known_ids, "0" * 64]), max_size=3))
        elif key == "authors":
            d[key] = draw(st.lists(st.sampled_from(AUTHORS + [OUTSIDER]), max_size=3))
        elif key == "kinds":
            d[key] = draw(st.lists(st.sampled_from(KINDS + [3]), max_size=3))
        elif key in ("since", "until"):
            d[key] = BASE + draw(st.integers(0, 6))
        else:
            pool = {"#p": P_VALUES, "#t": T_VALUES, "#e": E_VALUES, "#h": H_VALUES}[key]
            d[key] = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2))
    return d


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = make_store(tmp_path_factory.mktemp("prop"), sync_mode="normal").open()
    yield s
    s.close()


_origin_counter = iter(range(1, 10**9))


def _fresh_origin(store: SqliteStore) -> Origin:
    """A new origin row per example: examples share the database but never each other's events."""
    n = next(_origin_counter)
    url = f"wss://prop{n}.example.org"

    return Origin.from_mapping({"origin": url}, id=store.write_sync(lambda conn: upsert_origin(conn, url, "{}")),
                               where="test")


def _store_all(store: SqliteStore, origin: Origin, events: list[Event]) -> None:
    for ev in events:
        raw = ev.to_json()
        try:
            store.write_sync(lambda conn, ev=ev, raw=raw: store_event(
                conn, origin.id, ev, raw=raw, expiration=event_expiration(ev), now=NOW))
        except Rejected:
            pass  # duplicates, older replaceable versions, deleted targets: the table tells what stayed


def _stored(store: SqliteStore, origin: Origin) -> list[Event]:
    rows = store.read_sync(lambda conn: conn.execute(SQL("SELECT raw FROM events WHERE origin = ?",
                                                         "SELECT raw FROM events "
                                                         "WHERE origin = %s"), (origin.id,)).fetchall())
    return [Event(**orjson.loads(raw)) for (raw,) in rows]


def _expected(stored: list[Event], origin: Origin, reader: str | None, flt) -> list[str]:
    chosen = [ev for ev in stored if matches(flt, ev) and can_read(origin, reader, ev, NoGroups())]
    chosen.sort(key=lambda ev: (-ev.created_at, ev.id))
    return [ev.id for ev in chosen]


def _query(store, origin, reader, filters, limit=10_000):
    scope = read_scope(origin, reader, NoGroups())
    raws = store.read_sync(lambda conn: query_events(conn, origin.id, filters, scope, NOW,
                                                     default_limit=limit, max_limit=limit))
    return [orjson.loads(r)["id"] for r in raws]


def _count(store, origin, reader, filters) -> int:
    scope = read_scope(origin, reader, NoGroups())
    return store.read_sync(lambda conn: count_events(conn, origin.id, filters, scope, NOW))


STATS = {"examples": 0, "nonempty": 0}

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                              HealthCheck.function_scoped_fixture])


@PROPERTY
@given(
    events=st.lists(event_strategy, min_size=0, max_size=25),
    data=st.data(),
    reader=st.sampled_from([None, *AUTHORS, OUTSIDER]),
    limit=st.integers(1, 8),
)
def sql_matches_matcher(store, events, data, reader, limit):
    origin = _fresh_origin(store)
    _store_all(store, origin, events)
    stored = _stored(store, origin)
    known_ids = sorted({ev.id for ev in events})
    raw_filters = data.draw(st.lists(filter_dicts(known_ids), min_size=1, max_size=3), label="filters")
    filters = [parse_filter(d) for d in raw_filters]

    # No limit: the SQL result is exactly the matcher's selection, in (-created_at, id) order.
    expected_union: set[str] = set()
    for f in filters:
        expected_union.update(_expected(stored, origin, reader, f))
    got = _query(store, origin, reader, filters)
    assert set(got) == expected_union
    by_id = {ev.id: ev for ev in stored}
    assert got == sorted(got, key=lambda i: (-by_id[i].created_at, i))
    assert _count(store, origin, reader, filters) == len(expected_union)
    STATS["nonempty"] += bool(expected_union)
    STATS["examples"] += 1

    # With a limit, each filter gives exactly its newest `limit` matches, ties broken by the lowest
    # id (NIP-01), also when the limit cuts through events of one second.
    for f in filters:
        limited = parse_filter({**f.to_dict(), "limit": limit})
        want = _expected(stored, origin, reader, f)
        assert _query(store, origin, reader, [limited], limit=limit) == want[:limit]


def test_sql_matches_matcher(store):
    """The property over random events, filters and readers; then, in the same test (parallel
    workers would run a separate one elsewhere), a good share of its examples selected something."""
    before = dict(STATS)
    sql_matches_matcher(store)
    examples, nonempty = STATS["examples"] - before["examples"], STATS["nonempty"] - before["nonempty"]
    assert examples >= 20, STATS
    assert nonempty >= examples // 4, STATS


def test_replacement_and_deletion_leave_what_the_rules_say(store):
    """The random test reads the stored set back; this pins down the rules it relies on."""
    origin = _fresh_origin(store)
    a = SECRETS[0]
    old = sign_event(a, 0, [], "old", BASE + 1)
    new = sign_event(a, 0, [], "new", BASE + 2)
    art1 = sign_event(a, 30023, [["d", "x"]], "1", BASE + 1)
    art2 = sign_event(a, 30023, [["d", "x"]], "2", BASE + 3)
    note = sign_event(a, 1, [["t", "nostr"]], "note", BASE + 1)
    dm = sign_event(a, 4, [["p", AUTHORS[1]]], "secret", BASE + 1)
    deletion = sign_event(a, 5, [["e", note.id]], "", BASE + 5)
    _store_all(store, origin, [new, old, art1, art2, note, dm, deletion])
    ids = {ev.id for ev in _stored(store, origin)}
    assert ids == {new.id, art2.id, dm.id, deletion.id}
    everyone = parse_filter({})
    assert set(_query(store, origin, None, [everyone])) == {new.id, art2.id, deletion.id}
    assert set(_query(store, origin, AUTHORS[1], [everyone])) == ids
    assert set(_query(store, origin, AUTHORS[2], [everyone])) == ids - {dm.id}
    assert _count(store, origin, AUTHORS[1], [parse_filter({"kinds": [4]})]) == 1
    assert _count(store, origin, None, [parse_filter({"kinds": [4]})]) == 0
