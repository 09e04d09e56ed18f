"""The matcher, differentially: what it finds through the lease index equals a brute-force scan of
every lease at the origin with the plain NIP-01 rules (filter, ignore, p_tags_max, class support,
urgent kinds, own events, read authorization, one match per endpoint with the highest class)."""

from __future__ import annotations

import hashlib

import apsw
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.nostr.event import Event
from appliance.nostr.filters import matches
from appliance.push.descriptor import CLASS_RANK
from appliance.push.matcher import Matcher
from appliance.store.schema import MIGRATIONS
from tests.push.helpers import make_descriptor

NOW = 1_800_000_000
PUBKEYS = [hashlib.sha256(bytes([i])).hexdigest() for i in range(6)]
CHANNELS = ["3f2b8c1e-9d4a-4b6e-8f01-23456789abc" + str(i) for i in range(3)]
EVENT_IDS = [hashlib.sha256(b"e" + bytes([i])).hexdigest() for i in range(3)]
KINDS = [9, 7, 1059]
DESC = make_descriptor(push_kinds=(9, 7, 1059), urgent_kinds=(9,),
                       class_support={"apns": ("silent", "default", "time_sensitive", "urgent"),
                                      "fcm": ("silent", "default")})


@pytest.fixture(scope="module")
def conn():
    c = apsw.Connection(":memory:")
    for m in MIGRATIONS:
        c.execute(m)
    return c


def narrow_filter():
    selector = st.one_of(
        st.builds(lambda p: {"#p": [p]}, st.sampled_from(PUBKEYS)),
        st.builds(lambda a: {"authors": a}, st.lists(st.sampled_from(PUBKEYS), min_size=1, max_size=2, unique=True)),
        st.builds(lambda h: {"#h": h}, st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=2, unique=True)),
    )
    extra = st.one_of(st.just({}), st.builds(lambda e: {"#e": [e]}, st.sampled_from(EVENT_IDS)))
    kinds = st.lists(st.sampled_from(KINDS), min_size=1, max_size=2, unique=True)
    return st.builds(lambda s, x, k: {**s, **x, "kinds": k}, selector, extra, kinds)


def ignore_filter():
    return st.builds(lambda a, k: {"authors": [a], "kinds": k}, st.sampled_from(PUBKEYS),
                     st.lists(st.sampled_from(KINDS), min_size=1, max_size=2, unique=True))


subscription = st.builds(
    lambda f, c, ig, pm: {"filter": f, "class": c, **({"ignore": ig} if ig else {}),
                          **({"p_tags_max": pm} if pm else {})},
    narrow_filter(), st.sampled_from(list(CLASS_RANK)), st.lists(ignore_filter(), max_size=2),
    st.one_of(st.none(), st.integers(1, 3)))

lease = st.fixed_dictionaries({
    "origin": st.sampled_from([1, 1, 1, 2]),
    "pubkey": st.sampled_from(PUBKEYS),
    "transport": st.sampled_from(["apns", "apns", "fcm"]),
    "endpoint": st.sampled_from(["tokA", "tokB", "tokC", "tokD"]),
    "active": st.sampled_from([1, 1, 1, 0]),
    "expired": st.sampled_from([False, False, False, True]),
    "invalidated": st.sampled_from([False, False, False, True]),
    "subscriptions": st.lists(subscription, min_size=1, max_size=3),
})

event = st.builds(
    lambda author, kind, ps, hs, es: Event("ab" * 32, author, NOW, kind,
                                          [["p", p] for p in ps] + [["h", h] for h in hs] + [["e", e] for e in es],
                                          "", "00" * 64),
    st.sampled_from(PUBKEYS), st.sampled_from(KINDS), st.lists(st.sampled_from(PUBKEYS), max_size=4),
    st.lists(st.sampled_from(CHANNELS), max_size=1), st.lists(st.sampled_from(EVENT_IDS), max_size=1))


def store_leases(conn, leases):
    conn.execute("DELETE FROM leases")
    conn.execute("DELETE FROM lease_selectors")
    for i, lz in enumerate(leases):
        d = f"d{i}"
        profile = "ios" if lz["transport"] == "apns" else "android"
        conn.execute(
            "INSERT INTO leases (origin, pubkey, d, event_id, created_at, expiration, generation, active, app_profile, "
            "transport, endpoint, endpoint_hash, subscriptions, exec_key_id, invalidated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, 'k', ?)",
            (lz["origin"], lz["pubkey"], d, f"lease{i}-{hash(str(lz))}", NOW, NOW - 1 if lz["expired"] else NOW + 99,
             lz["active"], profile, lz["transport"], lz["endpoint"], hashlib.sha256(lz["endpoint"].encode()).hexdigest(),
             orjson.dumps(lz["subscriptions"]).decode(), NOW if lz["invalidated"] else None))
        sels = set()
        for s in lz["subscriptions"]:
            f = s["filter"]
            sels |= {("p", v) for v in f.get("#p", [])} | {("h", v) for v in f.get("#h", [])}
            sels |= {("authors", v) for v in f.get("authors", [])}
        for t, v in sels:
            conn.execute("INSERT INTO lease_selectors VALUES (?, ?, ?, ?, ?)", (lz["origin"], t, v, lz["pubkey"], d))


def brute_force(leases, ev: Event, readers_denied: set[str]) -> dict:
    """Every lease at origin 1, NIP-01 by hand: {endpoint key: best class}."""
    from appliance.nostr.filters import parse_filter

    best: dict = {}
    p_count = len([t for t in ev.tags if t[0] == "p"])
    for lz in leases:
        if lz["origin"] != 1 or not lz["active"] or lz["expired"] or lz["invalidated"]:
            continue
        if lz["pubkey"] == ev.pubkey or lz["pubkey"] in readers_denied:
            continue
        supported = DESC.class_support[lz["transport"]]
        for s in lz["subscriptions"]:
            if not matches(parse_filter(s["filter"]), ev):
                continue
            if "p_tags_max" in s and p_count > s["p_tags_max"]:
                continue
            if any(matches(parse_filter(f), ev) for f in s.get("ignore", [])):
                continue
            if s["class"] not in supported or (s["class"] == "urgent" and ev.kind not in DESC.urgent_kinds):
                continue
            key = (lz["transport"], hashlib.sha256(lz["endpoint"].encode()).hexdigest())
            if key not in best or CLASS_RANK[s["class"]] > CLASS_RANK[best[key]]:
                best[key] = s["class"]
    return best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(leases=st.lists(lease, max_size=8), ev=event, denied=st.sets(st.sampled_from(PUBKEYS), max_size=2))
def test_index_matching_equals_brute_force(conn, leases, ev, denied):
    store_leases(conn, leases)
    matcher = Matcher(lambda c, origin, reader, e: origin == 1 and reader not in denied)
    got = {(m.transport, m.endpoint_hash): m.cls for m in matcher.match(conn, 1, DESC, frozenset(KINDS), ev, NOW)}
    assert got == brute_force(leases, ev, denied)


def test_kinds_outside_push_kinds_cost_no_lookup(conn):
    class Counting:
        def __init__(self, c):
            self.c, self.n = c, 0

        def execute(self, *a):
            self.n += 1
            return self.c.execute(*a)

    counting = Counting(conn)
    ev = Event("ab" * 32, PUBKEYS[0], NOW, 1, [["p", PUBKEYS[1]]], "", "00" * 64)
    assert Matcher(lambda *a: True).match(counting, 1, DESC, frozenset(KINDS), ev, NOW) == []
    assert counting.n == 0
