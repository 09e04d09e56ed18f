"""NIP-PL executor descriptor (the NIP-11 ``push`` object) — pure.

``validate_descriptor`` enforces the "Executor Discovery" validity rules plus
the push-eligibility rules of "Filter Constraints" §4, failing closed with a
:class:`DescriptorError` naming the violated rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from .errors import DescriptorError

__all__ = [
    "CLASS_REGISTRY",
    "CLASS_RANK",
    "TRANSPORTS",
    "LEASE_KIND",
    "H_GRAMMARS",
    "Limits",
    "ExecutorKey",
    "AppProfile",
    "Descriptor",
    "is_never_push_eligible",
    "validate_descriptor",
    "descriptor_to_json",
]

LEASE_KIND = 30350

#: Priority classes, strictly ordered silent < default < time_sensitive < urgent.
CLASS_REGISTRY: tuple[str, ...] = ("silent", "default", "time_sensitive", "urgent")
CLASS_RANK: Mapping[str, int] = {c: i for i, c in enumerate(CLASS_REGISTRY)}

#: Transport identifiers defined by NIP-PL ("apns" | "fcm" | "unifiedpush").
TRANSPORTS: frozenset[str] = frozenset({"apns", "fcm", "unifiedpush"})

_UUID_V4_LOWER = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _uuid_v4_lowercase(value: str) -> bool:
    return isinstance(value, str) and _UUID_V4_LOWER.fullmatch(value) is not None


#: Registered channel-identifier grammars: name -> validator(str) -> bool.
H_GRAMMARS: Mapping[str, Callable[[str], bool]] = {"uuid-v4-lowercase": _uuid_v4_lowercase}


def is_never_push_eligible(kind: int) -> bool:
    """Kinds that MUST NOT be push-eligible whatever a descriptor says:
    ephemeral (20000-29999, which also covers presence/typing/AUTH), the
    relay-signed NIP-29 snapshot kinds 39000-39009 and the lease kind itself."""
    return 20000 <= kind <= 29999 or 39000 <= kind <= 39009 or kind == LEASE_KIND


# Upper bounds on configured limits. The spec asks only for positive integers; these keep every
# time computation (now + max_lease_ttl + allowed_skew, watermark retention) inside SQLite's 64-bit
# integers with centuries to spare, and refuse values that could only be typos.
MAX_LIMIT = 2**31 - 1
LIMIT_BOUNDS = {"max_lease_ttl": 10 * 366 * 86400, "allowed_skew": 86400}


@dataclass(frozen=True)
class Limits:
    max_lease_ttl: int = 2592000
    max_leases_per_pubkey: int = 16
    max_subscriptions_per_lease: int = 16
    max_kinds: int = 16
    max_authors: int = 20
    max_h: int = 50
    max_tag_values: int = 20
    max_ignore: int = 8
    max_content_len: int = 65536
    max_plaintext_len: int = 32768
    max_endpoint_len: int = 4096
    max_string_len: int = 512
    #: clock-skew allowance; executor-local, NOT advertised in ``limitation``.
    allowed_skew: int = 900

    #: names advertised in the descriptor's ``limitation`` object
    ADVERTISED = (
        "max_lease_ttl",
        "max_leases_per_pubkey",
        "max_subscriptions_per_lease",
        "max_kinds",
        "max_authors",
        "max_h",
        "max_tag_values",
        "max_ignore",
        "max_content_len",
        "max_plaintext_len",
        "max_endpoint_len",
        "max_string_len",
    )


#: One line per limit, with its unit: what the dashboard and the sample config say about it.
LIMIT_HELP: dict[str, str] = {
    "max_lease_ttl": "Longest a lease may last, from now to its expiration (seconds; 2592000 is 30 days).",
    "max_leases_per_pubkey": "Active leases one author may hold at this origin (leases).",
    "max_subscriptions_per_lease": "Subscriptions in one lease (subscriptions).",
    "max_kinds": "Kinds in one subscription filter (kinds).",
    "max_authors": "Pubkeys in one filter's authors (pubkeys).",
    "max_h": "Channel ids in one filter's #h (channels).",
    "max_tag_values": "Values in one filter's #p or #e (values).",
    "max_ignore": "Ignore filters in one subscription (filters).",
    "max_content_len": "Largest encrypted lease content accepted (bytes; at most the relay's max_content_length).",
    "max_plaintext_len": "Largest decrypted lease accepted (bytes).",
    "max_endpoint_len": "Longest device endpoint (token) in a lease (bytes).",
    "max_string_len": "Longest string value in a lease (bytes).",
    "allowed_skew": "Clock difference allowed for a lease's times; not advertised (seconds).",
}


@dataclass(frozen=True)
class ExecutorKey:
    id: str
    pubkey: str
    current: bool = False
    retiring: bool = False


@dataclass(frozen=True)
class AppProfile:
    id: str
    transport: str


@dataclass(frozen=True)
class Descriptor:
    origin: str
    keys: tuple[ExecutorKey, ...]
    app_profiles: tuple[AppProfile, ...]
    push_kinds: tuple[int, ...]
    urgent_kinds: tuple[int, ...]
    h_grammar: str = "uuid-v4-lowercase"
    class_support: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    #: optional executor URL; when present it MUST be an https:// URL.
    endpoint: str | None = None

    # -- convenience lookups (no validation) -----------------------------
    def key(self, key_id: str) -> ExecutorKey | None:
        for k in self.keys:
            if k.id == key_id:
                return k
        return None

    def accepts_key(self, key_id: str) -> bool:
        """True if ``key_id`` is currently advertised (current or retiring)."""
        k = self.key(key_id)
        return k is not None and (k.current or k.retiring)

    def app_profile(self, profile_id: str) -> AppProfile | None:
        for p in self.app_profiles:
            if p.id == profile_id:
                return p
        return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_https_url(url: Any) -> None:
    if not isinstance(url, str) or not url.startswith("https://"):
        raise DescriptorError("endpoint-https", "endpoint must be an https:// URL")
    if any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise DescriptorError("endpoint-https", "endpoint contains whitespace/control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise DescriptorError("endpoint-https", f"unparseable URL: {exc}") from None
    if parts.scheme != "https" or not parts.hostname or "@" in parts.netloc:
        raise DescriptorError("endpoint-https", "endpoint must be https://host[...] without userinfo")


def validate_descriptor(d: Descriptor) -> None:
    """Raise :class:`DescriptorError` unless ``d`` is a valid push descriptor.

    Rules (``DescriptorError.rule``):
    origin, limits-positive, limits-range, keys-shape, one-current-key, unique-key-ids,
    app-profiles-shape, unique-app-profile-ids, app-profile-transport,
    kinds-shape, never-push-eligible, urgent-subset, class-support-transport,
    class-support-registry, h-grammar, endpoint-https.
    """
    lim = d.limits
    if not isinstance(lim, Limits):
        raise DescriptorError("limits-positive", "limits must be a Limits instance")
    for f in fields(Limits):
        v = getattr(lim, f.name)
        if not _is_int(v) or v <= 0:
            raise DescriptorError("limits-positive", f"{f.name} must be a positive integer")
        bound = LIMIT_BOUNDS.get(f.name, MAX_LIMIT)
        if v > bound:
            raise DescriptorError("limits-range", f"{f.name} must be at most {bound}")

    if not isinstance(d.origin, str) or not d.origin:
        raise DescriptorError("origin", "origin must be a non-empty string")
    if len(d.origin.encode("utf-8", "surrogatepass")) > lim.max_string_len:
        raise DescriptorError("origin", "origin longer than max_string_len")

    # keys
    if not isinstance(d.keys, (tuple, list)) or not d.keys:
        raise DescriptorError("keys-shape", "keys must be a non-empty sequence")
    for k in d.keys:
        if not isinstance(k, ExecutorKey):
            raise DescriptorError("keys-shape", "keys entries must be ExecutorKey")
        if not isinstance(k.id, str) or not k.id or len(k.id.encode("utf-8", "surrogatepass")) > lim.max_string_len:
            raise DescriptorError("keys-shape", "key id must be a non-empty string <= max_string_len")
        if not isinstance(k.pubkey, str) or _HEX64.fullmatch(k.pubkey) is None:
            raise DescriptorError("keys-shape", f"key {k.id!r} pubkey must be 64 lowercase hex")
        if not isinstance(k.current, bool) or not isinstance(k.retiring, bool):
            raise DescriptorError("keys-shape", "current/retiring must be booleans")
        if k.current == k.retiring:
            raise DescriptorError("keys-shape", f"key {k.id!r} must be exactly one of current or retiring")
    if sum(1 for k in d.keys if k.current) != 1:
        raise DescriptorError("one-current-key", "exactly one key must be marked current")
    ids = [k.id for k in d.keys]
    if len(set(ids)) != len(ids):
        raise DescriptorError("unique-key-ids", "key ids must be unique")

    # app profiles
    if not isinstance(d.app_profiles, (tuple, list)):
        raise DescriptorError("app-profiles-shape", "app_profiles must be a sequence")
    for p in d.app_profiles:
        if not isinstance(p, AppProfile) or not isinstance(p.id, str) or not p.id:
            raise DescriptorError("app-profiles-shape", "app profile ids must be non-empty strings")
        if len(p.id.encode("utf-8", "surrogatepass")) > lim.max_string_len:
            raise DescriptorError("app-profiles-shape", "app profile id longer than max_string_len")
        if p.transport not in TRANSPORTS:
            raise DescriptorError("app-profile-transport", f"unknown transport {p.transport!r}")
    pids = [p.id for p in d.app_profiles]
    if len(set(pids)) != len(pids):
        raise DescriptorError("unique-app-profile-ids", "app profile ids must be unique")

    # kinds
    for name in ("push_kinds", "urgent_kinds"):
        ks = getattr(d, name)
        if not isinstance(ks, (tuple, list, frozenset, set)):
            raise DescriptorError("kinds-shape", f"{name} must be a sequence")
        for k in ks:
            if not _is_int(k) or not 0 <= k <= 65535:
                raise DescriptorError("kinds-shape", f"{name} entries must be integers 0..65535")
        if len(set(ks)) != len(list(ks)):
            raise DescriptorError("kinds-shape", f"{name} has duplicate entries")
    for k in d.push_kinds:
        if is_never_push_eligible(k):
            raise DescriptorError("never-push-eligible", f"kind {k} can never be push-eligible")
    if not set(d.urgent_kinds) <= set(d.push_kinds):
        raise DescriptorError("urgent-subset", "urgent_kinds must be a subset of push_kinds")

    # class support
    if not isinstance(d.class_support, Mapping):
        raise DescriptorError("class-support-transport", "class_support must be a mapping")
    for transport, classes in d.class_support.items():
        if transport not in TRANSPORTS:
            raise DescriptorError("class-support-transport", f"unknown transport {transport!r}")
        if not isinstance(classes, (tuple, list)):
            raise DescriptorError("class-support-registry", "class_support values must be sequences")
        for c in classes:
            if c not in CLASS_REGISTRY:
                raise DescriptorError("class-support-registry", f"unknown class {c!r}")
        if len(set(classes)) != len(classes):
            raise DescriptorError("class-support-registry", "duplicate class")

    if d.h_grammar not in H_GRAMMARS:
        raise DescriptorError("h-grammar", f"unknown h_grammar {d.h_grammar!r}")

    if d.endpoint is not None:
        _check_https_url(d.endpoint)


def descriptor_to_json(d: Descriptor) -> dict:
    """The NIP-11 ``push`` member value (without the outer ``{"push": ...}``)."""
    keys = []
    for k in d.keys:
        entry: dict[str, Any] = {"id": k.id, "pubkey": k.pubkey}
        if k.current:
            entry["current"] = True
        if k.retiring:
            entry["retiring"] = True
        keys.append(entry)
    out: dict[str, Any] = {"origin": d.origin}
    if d.endpoint is not None:
        out["endpoint"] = d.endpoint
    out.update(
        {
            "keys": keys,
            "app_profiles": [{"id": p.id, "transport": p.transport} for p in d.app_profiles],
            "push_kinds": list(d.push_kinds),
            "urgent_kinds": list(d.urgent_kinds),
            "h_grammar": d.h_grammar,
            "class_support": {t: list(cs) for t, cs in d.class_support.items()},
            "limitation": {name: getattr(d.limits, name) for name in Limits.ADVERTISED},
        }
    )
    return out
