"""Strict parsing of decrypted NIP-PL lease plaintext (acceptance step 5) — pure.

``parse_strict_json`` is a fail-closed JSON reader: size bound before parsing,
duplicate keys rejected at every depth, NaN/Infinity rejected, non-integral
numbers kept distinguishable from integers (``JsonFloat``), integers bounded by
2^53-1, trailing data rejected, every string measured in UTF-8 bytes.

``parse_lease_plaintext`` applies the v=1 schema.  The subscription *filter
grammar* (step 7) needs the lease author and the descriptor, so this step
keeps the filters as raw JSON objects (``RawSubscription``); the typed
``Subscription``/``LeaseFilter`` values are produced by
:func:`appliance.push.grammar.check_subscriptions`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .descriptor import CLASS_REGISTRY, TRANSPORTS, Limits
from .errors import LeaseRejected

__all__ = [
    "MAX_SAFE_INT",
    "MAX_DEPTH",
    "JsonFloat",
    "parse_strict_json",
    "LeaseFilter",
    "Subscription",
    "RawSubscription",
    "LeasePlaintext",
    "parse_lease_plaintext",
    "check_p_tags_max",
    "is_json_int",
]

MAX_SAFE_INT = 2**53 - 1
#: Deepest legitimate plaintext nesting is 5 (object > subscriptions > object >
#: ignore > filter > tag array); anything past this is rejected.
MAX_DEPTH = 16

_JSON_WS = " \t\n\r"

ACTIVE_FIELDS = frozenset(
    {"v", "origin", "app_profile", "transport", "endpoint", "generation", "active", "subscriptions"}
)
INACTIVE_FIELDS = frozenset({"v", "origin", "generation", "active"})
SUBSCRIPTION_FIELDS = frozenset({"filter", "class", "ignore", "suppress"})
SUBSCRIPTION_REQUIRED = frozenset({"filter", "class"})
SUPPRESS_FIELDS = frozenset({"p_tags_max"})


class JsonFloat(float):
    """A JSON number written with a fraction or exponent (``1.0``, ``1e3``).

    Kept distinct from ``int`` so that ``1.0`` never satisfies an integer rule.
    """

    __slots__ = ("text",)

    def __new__(cls, text: str) -> "JsonFloat":
        obj = super().__new__(cls, float(text))
        obj.text = text
        return obj


class _Reject(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


def is_json_int(v: Any) -> bool:
    """True for JSON integers only (not bool, not JsonFloat/float)."""
    return type(v) is int


def _parse_int(text: str) -> int:
    if len(text) > 17:  # 2**53-1 has 16 digits; avoids huge int() conversions
        raise _Reject("integer_out_of_range")
    n = int(text)
    if not -MAX_SAFE_INT <= n <= MAX_SAFE_INT:
        raise _Reject("integer_out_of_range")
    return n


def _parse_constant(_name: str) -> Any:
    raise _Reject("non_finite_number")


def _parse_float(text: str) -> JsonFloat:
    f = JsonFloat(text)
    if f != f or f in (float("inf"), float("-inf")):
        # e.g. 1e999 overflows to inf
        raise _Reject("non_finite_number")
    return f


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Reject("duplicate_key")
        out[k] = v
    return out


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs_hook,
    parse_float=_parse_float,
    parse_int=_parse_int,
    parse_constant=_parse_constant,
    strict=True,
)


def _utf8_len(s: str) -> int:
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogate from a "\ud800" escape
        raise _Reject("malformed_json") from None


def _walk(value: Any, limits: Limits, depth: int, path: tuple) -> None:
    """Depth and UTF-8 string-length bounds over the parsed tree."""
    if depth > MAX_DEPTH:
        raise _Reject("nesting_too_deep")
    if isinstance(value, str):
        n = _utf8_len(value)
        if path == ("endpoint",):
            if n > limits.max_endpoint_len:
                raise _Reject("endpoint_too_long")
        elif n > limits.max_string_len:
            raise _Reject("string_too_long")
    elif isinstance(value, dict):
        for k, v in value.items():
            if _utf8_len(k) > limits.max_string_len:
                raise _Reject("string_too_long")
            _walk(v, limits, depth + 1, path + (k,))
    elif isinstance(value, list):
        for v in value:
            _walk(v, limits, depth + 1, path + (None,))


def parse_strict_json(text: str, limits: Limits) -> Any:
    """Parse ``text`` strictly; raise :class:`LeaseRejected` on any violation.

    Order: UTF-8 size bound (before parsing) -> syntax / duplicate keys /
    non-finite / integer range (during parsing) -> trailing data -> nesting
    depth and string byte lengths.
    """
    if not isinstance(text, str):
        raise LeaseRejected("malformed_json")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise LeaseRejected("malformed_json") from None
    if size > limits.max_plaintext_len:
        raise LeaseRejected("plaintext_too_long")
    start = len(text) - len(text.lstrip(_JSON_WS))
    try:
        value, end = _DECODER.raw_decode(text, start)
    except _Reject as r:
        raise LeaseRejected(r.code) from None
    except RecursionError:
        raise LeaseRejected("nesting_too_deep") from None
    except (json.JSONDecodeError, ValueError):
        raise LeaseRejected("malformed_json") from None
    if text[end:].strip(_JSON_WS):
        raise LeaseRejected("trailing_data")
    try:
        _walk(value, limits, 0, ())
    except _Reject as r:
        raise LeaseRejected(r.code) from None
    return value


# ---------------------------------------------------------------------------
# typed plaintext
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseFilter:
    """A grammar-checked lease filter (a restriction of a NIP-01 filter)."""

    kinds: frozenset[int]
    authors: frozenset[str] = frozenset()
    p: frozenset[str] = frozenset()
    h: frozenset[str] = frozenset()
    e: frozenset[str] = frozenset()

    def to_nip01(self) -> dict:
        """A plain NIP-01 filter dict (sorted lists; absent selectors omitted)."""
        out: dict[str, list] = {"kinds": sorted(self.kinds)}
        if self.authors:
            out["authors"] = sorted(self.authors)
        if self.p:
            out["#p"] = sorted(self.p)
        if self.h:
            out["#h"] = sorted(self.h)
        if self.e:
            out["#e"] = sorted(self.e)
        return out


@dataclass(frozen=True)
class Subscription:
    filter: LeaseFilter
    cls: str
    ignore: tuple[LeaseFilter, ...] = ()
    p_tags_max: int | None = None


@dataclass(frozen=True)
class RawSubscription:
    """A subscription after the step-5 schema check; filters still raw JSON."""

    filter: Mapping[str, Any]
    cls: str
    ignore: tuple[Mapping[str, Any], ...] | None
    p_tags_max: int | None


@dataclass(frozen=True)
class LeasePlaintext:
    v: int
    origin: str
    generation: int
    active: bool
    app_profile: str | None = None
    transport: str | None = None
    #: transport endpoint material: kept out of repr() so it never lands in logs
    endpoint: str | None = field(default=None, repr=False)
    #: grammar-checked subscriptions (filled by grammar.check_subscriptions)
    subscriptions: tuple[Subscription, ...] = ()
    #: schema-checked subscriptions with raw filters (output of step 5)
    raw_subscriptions: tuple[RawSubscription, ...] = ()


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return MappingProxyType({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def check_p_tags_max(value: Any) -> int:
    """``suppress.p_tags_max``: a positive JSON integer."""
    if not is_json_int(value):
        raise LeaseRejected("wrong_type")
    if value < 1:
        raise LeaseRejected("p_tags_max_out_of_range")
    return value


def _check_members(obj: dict, allowed: frozenset[str], required: frozenset[str]) -> None:
    if any(k not in allowed for k in obj):
        raise LeaseRejected("unknown_field")
    if any(k not in obj for k in required):
        raise LeaseRejected("missing_field")


def _require_str(obj: dict, key: str) -> str:
    v = obj[key]
    if not isinstance(v, str):
        raise LeaseRejected("wrong_type")
    return v


def _parse_subscription(obj: Any) -> RawSubscription:
    if not isinstance(obj, dict):
        raise LeaseRejected("wrong_type")
    _check_members(obj, SUBSCRIPTION_FIELDS, SUBSCRIPTION_REQUIRED)
    flt = obj["filter"]
    if not isinstance(flt, dict):
        raise LeaseRejected("wrong_type")
    cls = _require_str(obj, "class")
    if cls not in CLASS_REGISTRY:
        raise LeaseRejected("unknown_class")
    ignore: tuple | None = None
    if "ignore" in obj:
        ig = obj["ignore"]
        if not isinstance(ig, list) or not all(isinstance(x, dict) for x in ig):
            raise LeaseRejected("wrong_type")
        if not ig:
            raise LeaseRejected("empty_ignore")
        ignore = tuple(_freeze(x) for x in ig)
    p_tags_max = None
    if "suppress" in obj:
        sup = obj["suppress"]
        if not isinstance(sup, dict):
            raise LeaseRejected("wrong_type")
        _check_members(sup, SUPPRESS_FIELDS, SUPPRESS_FIELDS)
        p_tags_max = check_p_tags_max(sup["p_tags_max"])
    return RawSubscription(filter=_freeze(flt), cls=cls, ignore=ignore, p_tags_max=p_tags_max)


def parse_lease_plaintext(text: str, limits: Limits) -> LeasePlaintext:
    """Acceptance step 5: size, strict JSON, unknown-field and v=1 schema.

    Check order (first failure wins): strict JSON (see ``parse_strict_json``)
    -> top level is an object -> ``v`` present, integer, == 1 -> ``active``
    present, boolean -> member set (unknown, then inactive-forbidden, then
    missing) -> member types in schema order (origin, app_profile, transport,
    endpoint, generation, subscriptions).
    """
    obj = parse_strict_json(text, limits)
    if not isinstance(obj, dict):
        raise LeaseRejected("not_an_object")
    # unknown members are judged against the union of the v=1 schemas first,
    # so that e.g. {"v":1,...,"extra":1} is "unknown field" whatever else.
    if "v" not in obj:
        raise LeaseRejected("missing_field")
    v = obj["v"]
    if not is_json_int(v):
        raise LeaseRejected("wrong_type")
    if v != 1:
        raise LeaseRejected("unsupported_version")
    if any(k not in ACTIVE_FIELDS for k in obj):
        raise LeaseRejected("unknown_field")
    if "active" not in obj:
        raise LeaseRejected("missing_field")
    active = obj["active"]
    if not isinstance(active, bool):
        raise LeaseRejected("wrong_type")
    if active:
        _check_members(obj, ACTIVE_FIELDS, ACTIVE_FIELDS)
    else:
        if any(k not in INACTIVE_FIELDS for k in obj):
            raise LeaseRejected("unexpected_field")
        _check_members(obj, INACTIVE_FIELDS, INACTIVE_FIELDS)

    origin = _require_str(obj, "origin")
    if not active:
        generation = _generation(obj["generation"])
        return LeasePlaintext(v=v, origin=origin, generation=generation, active=False)

    app_profile = _require_str(obj, "app_profile")
    transport = _require_str(obj, "transport")
    endpoint = _require_str(obj, "endpoint")
    generation = _generation(obj["generation"])
    subs = obj["subscriptions"]
    if not isinstance(subs, list):
        raise LeaseRejected("wrong_type")
    if not subs:
        raise LeaseRejected("empty_subscriptions")
    raw = tuple(_parse_subscription(s) for s in subs)
    # value rules after all type rules
    if transport not in TRANSPORTS:
        raise LeaseRejected("unknown_transport")
    if not endpoint or not app_profile:
        raise LeaseRejected("empty_string")
    return LeasePlaintext(
        v=v,
        origin=origin,
        generation=generation,
        active=True,
        app_profile=app_profile,
        transport=transport,
        endpoint=endpoint,
        raw_subscriptions=raw,
    )


def _generation(g: Any) -> int:
    if not is_json_int(g):
        raise LeaseRejected("wrong_type")
    if not 1 <= g <= MAX_SAFE_INT:
        raise LeaseRejected("generation_out_of_range")
    return g
