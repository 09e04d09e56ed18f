"""Property: what a REQ returns equals the stored matching events for which `can_read` is true.

Random events (groups public and private, DMs, gift wraps, leases, plain notes), random group
memberships, random readers and filters. The SQL path (`query_events` with `read_scope`) and the
pure rule (`matches` + `can_read`) must agree exactly; COUNT must agree too.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.nostr.event import sign_event
from appliance.nostr.filters import Filter, matches
from appliance.nostr.keys import generate_secret, public_key
from appliance.relay.authz import can_read, read_scope
from appliance.relay.groups import Group, GroupState
from appliance.origins import Origin
from appliance.store.events import count_events, query_events, store_event
from appliance.store.statement import SQL
from tests.pg import make_store

SECRETS = [generate_secret() for _ in range(4)]
PUBKEYS = [public_key(s) for s in SECRETS]
GROUPS = [str(uuid.UUID(int=i, version=4)) for i in (1, 2, 3)]
KINDS = [1, 4, 9, 1059, 30350, 7]
BASE = 1_700_000_000

event_spec = st.tuples(
    st.integers(0, 3),  # author
    st.sampled_from(KINDS),
    st.lists(st.integers(0, 3), max_size=2),  # p tags
    st.one_of(st.none(), st.integers(0, 2)),  # group
    st.integers(0, 20),  # created_at offset
)

filter_spec = st.fixed_dictionaries(
    {},
    optional={
        "authors": st.lists(st.integers(0, 3), min_size=1, max_size=2),
        "kinds": st.lists(st.sampled_from(KINDS), min_size=1, max_size=3),
        "#p": st.lists(st.integers(0, 3), min_size=1, max_size=2),
        "#h": st.lists(st.integers(0, 2), min_size=1, max_size=2),
        "since": st.integers(0, 20),
        "until": st.integers(0, 20),
    },
)


def to_filter(spec: dict) -> Filter:
    tags = {}
    if "#p" in spec:
        tags["p"] = frozenset(PUBKEYS[i] for i in spec["#p"])
    if "#h" in spec:
        tags["h"] = frozenset(GROUPS[i] for i in spec["#h"])
    return Filter(
        authors=frozenset(PUBKEYS[i] for i in spec["authors"]) if "authors" in spec else None,
        kinds=frozenset(spec["kinds"]) if "kinds" in spec else None,
        tags=tags,
        since=BASE + spec["since"] if "since" in spec else None,
        until=BASE + spec["until"] if "until" in spec else None,
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = make_store(tmp_path_factory.mktemp("prop"), sync_mode="normal").open()
    s.write_sync(lambda conn: conn.execute(SQL("INSERT INTO origins (id, origin) VALUES (1, 'ws://prop.test')",
                                               "INSERT INTO origins (id, origin) VALUES (1, 'ws://prop.test')")))
    yield s
    s.close()


counter = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(event_spec, min_size=1, max_size=25),
    private=st.lists(st.booleans(), min_size=3, max_size=3),
    membership=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=3, max_size=3),
    reader=st.one_of(st.none(), st.integers(0, 3)),
    filters=st.lists(filter_spec, min_size=1, max_size=3),
)
def test_req_equals_can_read_over_matching(store, events, private, membership, reader, filters):
    origin_id = 1000 + next(counter)  # a fresh origin per example: no state leaks between examples
    store.write_sync(lambda conn: conn.execute(SQL("INSERT INTO origins (id, origin) VALUES (?, ?)",
                                                   "INSERT INTO origins (id, origin) VALUES (%s, %s)"),
                                               (origin_id, f"ws://prop{origin_id}.test")))
    origin = Origin(origin=f"ws://prop{origin_id}.test", id=origin_id)
    state = GroupState()
    for i, h in enumerate(GROUPS):
        state.put(origin_id, h, Group(h, private=private[i], members={PUBKEYS[m]: "" for m in membership[i]}))
    stored = []
    for n, (author, kind, ps, grp, offset) in enumerate(events):
        tags = [["p", PUBKEYS[p]] for p in ps]
        if grp is not None:
            tags.append(["h", GROUPS[grp]])
        if kind == 30350:
            tags.append(["d", f"lease{n}"])
        ev = sign_event(SECRETS[author], kind, tags, f"c{n}", BASE + offset)
        stored.append(ev)
        store.write_sync(lambda conn, ev=ev: store_event(conn, origin_id, ev, raw=ev.to_json(), expiration=None,
                                                         now=BASE + 100))
    reader_pk = None if reader is None else PUBKEYS[reader]
    parsed = [to_filter(f) for f in filters]
    scope = read_scope(origin, reader_pk, state)
    got = store.read_sync(lambda conn: query_events(conn, origin_id, parsed, scope, BASE + 100,
                                                    default_limit=10_000, max_limit=10_000))
    import json

    got_ids = {json.loads(raw)["id"] for raw in got}
    expected = {ev.id for ev in stored
                if any(matches(f, ev) for f in parsed) and can_read(origin, reader_pk, ev, state)}
    assert got_ids == expected
    n = store.read_sync(lambda conn: count_events(conn, origin_id, parsed, scope, BASE + 100))
    assert n == len(expected)


def test_event_matching_several_tag_values_counts_once(store):
    origin_id = 999
    store.write_sync(lambda conn: conn.execute(SQL("INSERT INTO origins (id, origin) VALUES (?, 'ws://dup.test')",
                                                   "INSERT INTO origins (id, origin) VALUES (%s, 'ws://dup.test')"),
                                               (origin_id,)))
    origin = Origin(origin="ws://dup.test", id=origin_id)
    both = sign_event(SECRETS[0], 1, [["p", PUBKEYS[1]], ["p", PUBKEYS[2]]], "both", BASE + 5)
    older = sign_event(SECRETS[0], 1, [["p", PUBKEYS[1]]], "older", BASE + 1)
    for ev in (both, older):
        store.write_sync(lambda conn, ev=ev: store_event(conn, origin_id, ev, raw=ev.to_json(), expiration=None,
                                                         now=BASE + 100))
    f = Filter(tags={"p": frozenset(PUBKEYS[1:3])}, limit=2)
    scope = read_scope(origin, None, GroupState())
    assert store.read_sync(lambda conn: count_events(conn, origin_id, [f], scope, BASE + 100)) == 2
    got = store.read_sync(lambda conn: query_events(conn, origin_id, [f], scope, BASE + 100,
                                                    default_limit=10, max_limit=10))
    assert [raw for raw in got] == [both.to_json(), older.to_json()]
