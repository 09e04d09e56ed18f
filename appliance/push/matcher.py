"""Matching stored events against effective leases (NIP-PL "Matching Semantics and Tenant
Isolation", "Suppression", "Priority Classes").

Runs inside the stored event's write transaction (the relay's "event stored" hook), so the wake
jobs it writes commit with the event. Per event, at one origin only:

1. only kinds the origin's descriptor makes push-eligible are looked at (others cost nothing);
2. candidate leases come from the lease index (`authors`, `#p` self, `#h`), in one statement;
3. each candidate's subscriptions run the NIP-01 matcher on the event's envelope (never its
   content, never inside a gift wrap), then suppression (`ignore`, `p_tags_max`), then class
   eligibility against the current descriptor (`class_support`, `urgent_kinds`);
4. an event never wakes its own author's leases (see docs/spec-notes.md W5);
5. the lease author must be allowed to read the event at this origin now (the relay's
   `can_read`, handed in as `authorize`);
6. matches are grouped per endpoint: one job per (origin, app_profile, transport, H(endpoint),
   event id), with the highest class among the endpoint's matches.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import orjson

from appliance.nostr.event import Event
from appliance.nostr.filters import Filter, matches, parse_filter

from .descriptor import CLASS_RANK, Descriptor
from appliance.store.interface import Connection
from appliance.store.leases import Candidate, candidate_leases

# (conn, origin id, reader pubkey, event) -> may that reader read the event at that origin now?
Authorize = Callable[[Connection, int, str, Event], bool]


@dataclass(frozen=True)
class ParsedSubscription:
    filter: Filter
    cls: str
    ignore: tuple[Filter, ...]
    p_tags_max: int | None


@dataclass(frozen=True)
class Match:
    """One endpoint to wake for one event: the lease chosen for it and the class of the wake."""

    pubkey: str
    d: str
    generation: int
    app_profile: str
    transport: str
    endpoint_hash: str
    cls: str
    endpoint: str
    expiration: int  # the lease's: no wake outlives it


def parse_subscriptions(text: str) -> tuple[ParsedSubscription, ...]:
    """The stored subscriptions JSON (written by `state.subscriptions_json`) as NIP-01 filters."""
    out = []
    for s in orjson.loads(text):
        out.append(ParsedSubscription(
            parse_filter(s["filter"]), s["class"], tuple(parse_filter(f) for f in s.get("ignore", ())),
            s.get("p_tags_max"),
        ))
    return tuple(out)


def lease_class(subs: tuple[ParsedSubscription, ...], ev: Event, p_count: int, supported: frozenset[str],
                urgent_kinds: frozenset[int]) -> str | None:
    """The highest class among the subscriptions the event matches and is not suppressed for."""
    best: str | None = None
    for sub in subs:
        if best is not None and CLASS_RANK[sub.cls] <= CLASS_RANK[best]:
            continue  # cannot raise the class: skip the work
        if not matches(sub.filter, ev):
            continue
        # Suppression, after a positive match (NIP-PL "Suppression").
        if sub.p_tags_max is not None and p_count > sub.p_tags_max:
            continue
        if any(matches(f, ev) for f in sub.ignore):
            continue
        # Class eligibility under the descriptor in force now: a class the descriptor no longer
        # supports for this transport, or urgent outside urgent_kinds, wakes nothing (fail-closed).
        if sub.cls not in supported or (sub.cls == "urgent" and ev.kind not in urgent_kinds):
            continue
        best = sub.cls
    return best


class Matcher:
    """Finds the endpoints an event wakes at one origin."""

    CACHE_SIZE = 20_000  # parsed subscriptions of this many lease events stay in memory

    def __init__(self, authorize: Authorize):
        self.authorize = authorize
        self._parsed: OrderedDict[str, tuple[ParsedSubscription, ...]] = OrderedDict()

    def _subscriptions(self, cand: Candidate) -> tuple[ParsedSubscription, ...]:
        subs = self._parsed.get(cand.event_id)
        if subs is None:
            subs = parse_subscriptions(cand.subscriptions)
            self._parsed[cand.event_id] = subs
            if len(self._parsed) > self.CACHE_SIZE:
                self._parsed.popitem(last=False)
        else:
            self._parsed.move_to_end(cand.event_id)
        return subs

    def match(self, conn: Connection, origin: int, descriptor: Descriptor, push_kinds: frozenset[int],
              ev: Event, now: int) -> list[Match]:
        if ev.kind not in push_kinds:
            return []
        p_values = ev.tag_values("p")
        candidates = candidate_leases(conn, origin, ev.pubkey, set(p_values), set(ev.tag_values("h")), now)
        if not candidates:
            return []
        urgent = frozenset(descriptor.urgent_kinds)
        by_endpoint: dict[tuple[str, str, str], Match] = {}
        readable: dict[str, bool] = {}
        for cand in candidates:
            if cand.pubkey == ev.pubkey:
                continue  # an author's own event never wakes the author's installations
            supported = frozenset(descriptor.class_support.get(cand.transport, ()))
            cls = lease_class(self._subscriptions(cand), ev, len(p_values), supported, urgent)
            if cls is None:
                continue
            ok = readable.get(cand.pubkey)
            if ok is None:
                ok = readable[cand.pubkey] = self.authorize(conn, origin, cand.pubkey, ev)
            if not ok:
                continue
            key = (cand.app_profile, cand.transport, cand.endpoint_hash)
            best = by_endpoint.get(key)
            if best is None or CLASS_RANK[cls] > CLASS_RANK[best.cls]:
                by_endpoint[key] = Match(cand.pubkey, cand.d, cand.generation, cand.app_profile, cand.transport,
                                         cand.endpoint_hash, cls, cand.endpoint, cand.expiration)
        return list(by_endpoint.values())
