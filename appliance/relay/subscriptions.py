"""Live subscriptions, found for each new event through an inverted index (never a full scan)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator

from appliance.nostr.event import Event
from appliance.nostr.filters import Filter, matches


@dataclass(eq=False)
class Subscription:
    """One REQ kept open: its owner (a session), id and filters."""

    owner: Any
    sub_id: str
    filters: list[Filter]
    keys: list[tuple[str, Any]] = field(default_factory=list)  # index entries, for removal
    # Live events that arrived while the stored answer was being read: (id, raw), sent after EOSE
    # minus those the stored answer holds. None once the stored answer is out.
    held: list[tuple[str, str]] | None = None
    # Ids the stored answer carried that were committed but not broadcast yet when it was sent
    # (Relay.unbroadcast): their broadcast is not sent again. None when there are none.
    skip: set[str] | None = None
    # Several nodes: when `skip` (then holding every id of the answer) lapses (monotonic).
    skip_until: float = 0.0
    # When its REQ was taken (monotonic), for the time to its EOSE (Relay.on_req_answered).
    received: float = 0.0


def _index_keys(f: Filter) -> list[tuple[str, Any]]:
    """Index a filter under its most selective condition; a filter with none is a wildcard."""
    if f.ids is not None:
        return [("id", v) for v in f.ids]
    if f.authors is not None:
        return [("author", v) for v in f.authors]
    if f.tags:
        # The tag with the fewest values is the most selective entry point.
        name, values = min(f.tags.items(), key=lambda kv: (len(kv[1]), kv[0]))
        return [("tag", (name, v)) for v in values]
    if f.kinds is not None:
        return [("kind", v) for v in f.kinds]
    return [("all", None)]


class SubscriptionIndex:
    """Subscriptions of one origin, indexed by id, author, kind and tag value."""

    def __init__(self) -> None:
        self._index: dict[tuple[str, Any], set[Subscription]] = defaultdict(set)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, sub: Subscription) -> None:
        keys: set[tuple[str, Any]] = set()
        for f in sub.filters:
            keys.update(_index_keys(f))
        sub.keys = list(keys)
        for key in sub.keys:
            self._index[key].add(sub)
        self._count += 1

    def remove(self, sub: Subscription) -> None:
        for key in sub.keys:
            bucket = self._index.get(key)
            if bucket is not None:
                bucket.discard(sub)
                if not bucket:
                    del self._index[key]
        sub.keys = []
        self._count -= 1

    def candidates(self, ev: Event) -> set[Subscription]:
        """Subscriptions that might match `ev` (a superset; callers run the full matcher)."""
        found: set[Subscription] = set()
        get = self._index.get
        for key in (("id", ev.id), ("author", ev.pubkey), ("kind", ev.kind), ("all", None)):
            bucket = get(key)
            if bucket:
                found |= bucket
        for tag in ev.tags:
            if len(tag) >= 2 and len(tag[0]) == 1:
                bucket = get(("tag", (tag[0], tag[1])))
                if bucket:
                    found |= bucket
        return found

    def matching(self, ev: Event) -> Iterator[Subscription]:
        """Subscriptions with at least one filter matching `ev`."""
        for sub in self.candidates(ev):
            for f in sub.filters:
                if matches(f, ev):
                    yield sub
                    break
