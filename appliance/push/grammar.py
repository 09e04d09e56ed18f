"""NIP-PL "Filter Constraints", "Suppression" and "Priority Classes" rules
(acceptance step 7, stateless part) — pure.

Order of checks inside one filter (first failure wins; see docs/spec-notes.md):

  0. narrowing selector (positive filters only): at least one of the members
     ``#p`` / ``#h`` / ``authors`` is present — first, so that the cases the
     spec words explicitly (bare kinds-only, since-only, empty filter) get
     exactly ``invalid: lease filter not narrowed``; a present-but-empty
     selector array is then rejected by (b);
  a. member names, by category over *all* members (so the outcome does not
     depend on JSON member order): since/until -> ids/limit/search ->
     multi-letter tag selectors -> other single-letter tag selectors ->
     any other unknown member;
  b. member shapes in fixed order kinds, authors, #p, #h, #e: array -> non-empty
     -> element types -> count bound -> no duplicate values;
  c. kinds present, each push-eligible;
  e. exact 64-lowercase-hex values for authors, #p, #e;
  f. #p self-only;
  g. #h non-empty, <= max_string_len bytes, and matching ``h_grammar``.

Across a lease (:func:`check_subscriptions`): for each subscription in order its
filter then its ignore list (count bound, then each ignore filter); classes are
checked afterwards by :func:`check_classes` (all "supported" checks, then all
"urgent" checks).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from .descriptor import H_GRAMMARS, Descriptor, is_never_push_eligible
from .errors import LeaseRejected
from .plaintext import (
    LeaseFilter,
    LeasePlaintext,
    RawSubscription,
    Subscription,
    check_p_tags_max,
    is_json_int,
)

__all__ = [
    "check_filter",
    "check_ignore",
    "check_p_tags_max",
    "check_subscription",
    "check_subscriptions",
    "check_classes",
]

_HEX64 = re.compile(r"[0-9a-f]{64}")
_TIME_TRAVEL = ("since", "until")
_FORBIDDEN = ("ids", "limit", "search")
_TAGS = ("#p", "#h", "#e")
_SHAPE_ORDER = ("kinds", "authors", "#p", "#h", "#e")


def _check_member_names(keys: Sequence[str]) -> None:
    if any(k in _TIME_TRAVEL for k in keys):
        raise LeaseRejected("time_travel_field")
    if any(k in _FORBIDDEN for k in keys):
        raise LeaseRejected("forbidden_filter_field")
    if any(k.startswith("#") and len(k) > 2 for k in keys):
        raise LeaseRejected("multi_letter_tag")
    if any(k.startswith("#") and len(k) == 2 and k not in _TAGS for k in keys):
        raise LeaseRejected("tag_not_permitted")
    if any(k not in _SHAPE_ORDER for k in keys):
        raise LeaseRejected("unknown_filter_field")


def _limit_for(key: str, descriptor: Descriptor) -> tuple[int, str]:
    lim = descriptor.limits
    return {
        "kinds": (lim.max_kinds, "too_many_kinds"),
        "authors": (lim.max_authors, "too_many_authors"),
        "#p": (lim.max_tag_values, "too_many_tag_values"),
        "#e": (lim.max_tag_values, "too_many_tag_values"),
        "#h": (lim.max_h, "too_many_h_values"),
    }[key]


def _check_shape(key: str, value: Any, descriptor: Descriptor) -> list:
    if not isinstance(value, (list, tuple)):
        raise LeaseRejected("wrong_type")
    if not value:
        raise LeaseRejected("empty_array")
    if key == "kinds":
        if not all(is_json_int(x) for x in value):
            raise LeaseRejected("wrong_type")
    elif not all(isinstance(x, str) for x in value):
        raise LeaseRejected("wrong_type")
    bound, code = _limit_for(key, descriptor)
    if len(value) > bound:
        raise LeaseRejected(code)
    if len(set(value)) != len(value):
        raise LeaseRejected("duplicate_value")
    return list(value)


def check_filter(
    obj: Mapping[str, Any], *, author: str, descriptor: Descriptor, narrowing: bool = True
) -> LeaseFilter:
    """Validate one lease filter (``narrowing=False`` for ignore filters)."""
    if not isinstance(obj, Mapping):
        raise LeaseRejected("wrong_type")
    keys = list(obj.keys())
    if narrowing and not any(k in obj for k in ("authors", "#p", "#h")):  # (0)
        raise LeaseRejected("not_narrowed")
    _check_member_names(keys)  # (a)
    vals: dict[str, list] = {}
    for key in _SHAPE_ORDER:  # (b)
        if key in obj:
            vals[key] = _check_shape(key, obj[key], descriptor)
    kinds = vals.get("kinds")  # (c)
    if kinds is None:
        raise LeaseRejected("missing_kinds")
    push_kinds = set(descriptor.push_kinds)
    for k in kinds:
        if k not in push_kinds or is_never_push_eligible(k):
            raise LeaseRejected("kind_not_push_eligible")
    authors = vals.get("authors", [])
    p = vals.get("#p", [])
    h = vals.get("#h", [])
    e = vals.get("#e", [])
    for x in (*authors, *p, *e):  # (e)
        if _HEX64.fullmatch(x) is None:
            raise LeaseRejected("non_exact_value")
    if any(x != author for x in p):  # (f)
        raise LeaseRejected("p_not_self")
    grammar = H_GRAMMARS.get(descriptor.h_grammar)
    for x in h:  # (g)
        if len(x.encode("utf-8", "surrogatepass")) > descriptor.limits.max_string_len:
            raise LeaseRejected("string_too_long")
        if not x or grammar is None or not grammar(x):
            raise LeaseRejected("invalid_h_value")
    return LeaseFilter(
        kinds=frozenset(kinds),
        authors=frozenset(authors),
        p=frozenset(p),
        h=frozenset(h),
        e=frozenset(e),
    )


def check_ignore(
    filters: Sequence[Mapping[str, Any]] | None, *, author: str, descriptor: Descriptor
) -> tuple[LeaseFilter, ...]:
    """Suppression ``ignore``: <= max_ignore filters, grammar minus narrowing."""
    if filters is None:
        return ()
    if len(filters) > descriptor.limits.max_ignore:
        raise LeaseRejected("too_many_ignore")
    return tuple(check_filter(f, author=author, descriptor=descriptor, narrowing=False) for f in filters)


def check_subscription(raw: RawSubscription, *, author: str, descriptor: Descriptor) -> Subscription:
    flt = check_filter(raw.filter, author=author, descriptor=descriptor, narrowing=True)
    ignore = check_ignore(raw.ignore, author=author, descriptor=descriptor)
    p_tags_max = None if raw.p_tags_max is None else check_p_tags_max(raw.p_tags_max)
    return Subscription(filter=flt, cls=raw.cls, ignore=ignore, p_tags_max=p_tags_max)


def check_subscriptions(plaintext: LeasePlaintext, *, author: str, descriptor: Descriptor) -> LeasePlaintext:
    """Run the filter grammar over every subscription of an active lease and
    return the plaintext with typed ``subscriptions`` filled in."""
    if not plaintext.active:
        return plaintext
    subs = tuple(
        check_subscription(r, author=author, descriptor=descriptor) for r in plaintext.raw_subscriptions
    )
    return replace(plaintext, subscriptions=subs)


def check_classes(subscriptions: Iterable[Subscription], descriptor: Descriptor, transport: str) -> None:
    """Every class supported for ``transport`` (``class not supported``), then
    ``urgent`` only where every filter kind is in ``urgent_kinds``."""
    subs = list(subscriptions)
    supported = descriptor.class_support.get(transport, ())
    for s in subs:
        if s.cls not in supported:
            raise LeaseRejected("class_not_supported")
    urgent_kinds = set(descriptor.urgent_kinds)
    for s in subs:
        if s.cls == "urgent" and not s.filter.kinds <= urgent_kinds:
            raise LeaseRejected("class_not_permitted")
