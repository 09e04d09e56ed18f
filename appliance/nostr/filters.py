"""NIP-01 subscription filters: strict parsing and event matching."""

from __future__ import annotations

import re
from typing import Any, Iterable

from .event import MAX_SAFE_INT, Event
from .search import content_matches, search_terms

__all__ = [
    "Filter",
    "InvalidFilter",
    "parse_filter",
    "only_searchable",
    "matches",
    "matches_any",
    "DEFAULT_MAX_VALUES",
    "DEFAULT_MAX_LIMIT",
]

DEFAULT_MAX_VALUES = 1000
DEFAULT_MAX_LIMIT = 5000

_HEX64 = re.compile(r"[0-9a-f]{64}")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class InvalidFilter(ValueError):
    """A malformed filter; str() is the reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Filter:
    """A parsed filter. None means "condition absent"; an empty frozenset matches nothing."""

    __slots__ = ("ids", "authors", "kinds", "tags", "since", "until", "limit", "search")

    def __init__(
        self,
        *,
        ids: frozenset[str] | None = None,
        authors: frozenset[str] | None = None,
        kinds: frozenset[int] | None = None,
        tags: dict[str, frozenset[str]] | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int | None = None,
        search: str | None = None,
    ) -> None:
        self.ids = ids
        self.authors = authors
        self.kinds = kinds
        self.tags = tags if tags is not None else {}
        self.since = since
        self.until = until
        self.limit = limit
        self.search = search

    def to_dict(self) -> dict[str, Any]:
        """Back to the NIP-01 wire shape (lists sorted, for stable output)."""
        out: dict[str, Any] = {}
        if self.ids is not None:
            out["ids"] = sorted(self.ids)
        if self.authors is not None:
            out["authors"] = sorted(self.authors)
        if self.kinds is not None:
            out["kinds"] = sorted(self.kinds)
        for name, values in self.tags.items():
            out["#" + name] = sorted(values)
        for key in ("since", "until", "limit", "search"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Filter):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # mutable tags dict

    def __repr__(self) -> str:
        return f"Filter({self.to_dict()!r})"


def _str_list(value: Any, key: str, max_values: int) -> list:
    if type(value) is not list:
        raise InvalidFilter(f"{key} must be an array")
    if len(value) > max_values:
        raise InvalidFilter("too many values in filter")
    return value


def _hex_set(value: Any, key: str, max_values: int) -> frozenset[str]:
    for v in _str_list(value, key, max_values):
        # NIP-01 today asks for exact 64-char ids/pubkeys; prefix matching was dropped.
        if type(v) is not str or not _HEX64.fullmatch(v):
            raise InvalidFilter(f"{key} must contain 64-character lowercase hex strings")
    return frozenset(value)


def _nonneg_int(value: Any, key: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INT:
        raise InvalidFilter(f"{key} must be a non-negative integer")
    return value


def parse_filter(
    obj: Any,
    *,
    max_values: int = DEFAULT_MAX_VALUES,
    max_limit: int = DEFAULT_MAX_LIMIT,
) -> Filter:
    """Parse one REQ/COUNT filter object.

    Unknown keys are ignored, as NIP-01 relays do, so newer clients keep
    working. The exception is "#..." keys: only single-letter tags are indexed
    (NIP-01), and silently dropping a multi-letter tag condition would widen
    the result, so those are refused. A limit above max_limit is clamped.
    """
    if type(obj) is not dict:
        raise InvalidFilter("filter must be a JSON object")
    f = Filter()
    for key, value in obj.items():
        if key == "ids":
            f.ids = _hex_set(value, "ids", max_values)
        elif key == "authors":
            f.authors = _hex_set(value, "authors", max_values)
        elif key == "kinds":
            for k in _str_list(value, "kinds", max_values):
                if type(k) is not int or not 0 <= k <= 65535:
                    raise InvalidFilter("kinds must contain integers between 0 and 65535")
            f.kinds = frozenset(value)
        elif key == "since":
            f.since = _nonneg_int(value, "since")
        elif key == "until":
            f.until = _nonneg_int(value, "until")
        elif key == "limit":
            f.limit = min(_nonneg_int(value, "limit"), max_limit)
        elif key == "search":
            if type(value) is not str:
                raise InvalidFilter("search must be a string")
            f.search = value
        elif type(key) is str and key.startswith("#"):
            name = key[1:]
            if len(name) != 1 or name not in _LETTERS:
                raise InvalidFilter("unsupported tag filter")
            for v in _str_list(value, key, max_values):
                if type(v) is not str:
                    raise InvalidFilter(f"{key} must contain strings")
            f.tags[name] = frozenset(value)
        # any other key: ignored on purpose (see docstring)
    return f


def only_searchable(f: Filter, search_kinds: Iterable[int]) -> Filter:
    """A filter with `search` narrowed to the kinds a relay's search index holds (all of them
    when it names none), so stored and live events match it alike; others unchanged."""
    if f.search is not None:
        kinds = frozenset(search_kinds)
        f.kinds = kinds if f.kinds is None else f.kinds & kinds
    return f


def matches(f: Filter, ev: Event) -> bool:
    """NIP-01: every present condition must hold; within one list any value may match.

    since and until are inclusive. limit plays no part (it bounds stored
    results only). search, when present, requires every word of it (NIP-50
    key:value extensions aside) as a word of the content, case and diacritics
    folded (nostr.search: the store's index splits and folds the same way).
    """
    if f.ids is not None and ev.id not in f.ids:
        return False
    if f.authors is not None and ev.pubkey not in f.authors:
        return False
    if f.kinds is not None and ev.kind not in f.kinds:
        return False
    if f.since is not None and ev.created_at < f.since:
        return False
    if f.until is not None and ev.created_at > f.until:
        return False
    for name, values in f.tags.items():
        for t in ev.tags:
            if len(t) > 1 and t[0] == name and t[1] in values:
                break
        else:
            return False
    if f.search is not None and not content_matches(search_terms(f.search), ev.content):
        return False
    return True


def matches_any(filters: Iterable[Filter], ev: Event) -> bool:
    """True if ev matches at least one filter (filters of one REQ are OR-ed)."""
    for f in filters:
        if matches(f, ev):
            return True
    return False
