"""Differential property test of NIP-50 search: the search index (FTS5 on SQLite, tsvector on
PostgreSQL) with the rest of the SQL selects exactly what the pure matcher (`matches` on the
filter narrowed to the searchable kinds) and `can_read` select; COUNT agrees; and the answer is
ordered by relevance, then created_at."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from appliance.nostr.filters import matches, only_searchable, parse_filter
from appliance.relay.authz import NoGroups, can_read

from .test_property_sql_vs_matcher import (AUTHORS, OUTSIDER, PROPERTY, _count, _event, _fresh_origin, _query,
                                           _store_all, _stored, filter_dicts, store, tag_strategy)

__all__ = ["store"]  # the fixture, shared

# On PostgreSQL the reader pool's background threads draw from `random` (psycopg_pool's jitter when
# it opens a connection), now and then while hypothesis draws an example: not the strategies' doing.
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")

SEARCH_KINDS = (1, 30023)  # the default search_kinds (the store's kinds table)
WORDS = ["heron", "Heron", "egret", "egrets", "heron-egret", "HERON!", "ibis_heron", "42", "x"]

content = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
event = st.builds(_event, author=st.integers(0, len(AUTHORS) - 1), kind=st.sampled_from([1, 1, 30023, 7, 4]),
                  created=st.integers(0, 5), tags=st.lists(tag_strategy, max_size=2).map(tuple), content=content)
search = st.lists(st.sampled_from(["heron", "heron", "EGRET", "egrets", "ibis", "42", "lang:en", "x", "?!"]),
                  min_size=1, max_size=2).map(" ".join)

STATS = {"examples": 0, "nonempty": 0}


@PROPERTY
@given(events=st.lists(event, min_size=2, max_size=20), data=st.data(), reader=st.sampled_from([None, *AUTHORS, OUTSIDER]))
def search_sql_matches_matcher(store, events, data, reader):
    origin = _fresh_origin(store)
    _store_all(store, origin, events)
    stored = _stored(store, origin)
    # Half the filters have no other field: the others are selective enough to match little.
    raw = data.draw(st.one_of(st.builds(dict), filter_dicts(sorted({ev.id for ev in events}))), label="filter")
    raw["search"] = data.draw(search, label="search")
    f = only_searchable(parse_filter(raw), SEARCH_KINDS)
    want = {ev.id for ev in stored if matches(f, ev) and can_read(origin, reader, ev, NoGroups())}
    got = _query(store, origin, reader, [f])
    assert set(got) == want and len(got) == len(want)
    assert _count(store, origin, reader, [f]) == len(want)
    # Among events alike in everything the rank sees (the same content), the newest comes first.
    by_id = {ev.id: ev for ev in stored}
    for i, a in enumerate(got):
        for b in got[i + 1:]:
            if by_id[a].content == by_id[b].content:
                assert by_id[a].created_at >= by_id[b].created_at
    STATS["examples"] += 1
    STATS["nonempty"] += bool(want)


def test_search_sql_matches_matcher(store):
    """The property over random events, searches and readers; then, in the same test (parallel
    workers would run a separate one elsewhere), a good share of its examples found something."""
    before = dict(STATS)
    search_sql_matches_matcher(store)
    examples, nonempty = STATS["examples"] - before["examples"], STATS["nonempty"] - before["nonempty"]
    assert examples >= 20, STATS
    assert nonempty >= examples // 5, STATS
