"""Origins (tenants): several isolated communities in one process, routed by Host and path."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from appliance.errors import ConfigError, at
from appliance.store import origin_rows
from appliance.store.interface import Connection

POLICIES = ("public", "members")

_HEX = frozenset("0123456789abcdef")


# Set-valued fields, stored as sorted lists.
LIST_FIELDS = ("allow", "block", "allow_kinds", "block_kinds", "ban_events", "block_ips")


def _is_pubkey(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _is_kind(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535


def normalize_ip(value: Any, where: str = "ip") -> str:
    """One IP address in its canonical text form (ConfigError naming `where` if it is not one)."""
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ConfigError(where, value, "expected an IPv4 or IPv6 address such as 203.0.113.7") from None


@dataclass(frozen=True)
class Origin:
    """One community: canonical origin string, routing, NIP-11 fields and access policy."""

    origin: str
    hosts: tuple[str, ...] = ()
    path: str = "/"
    name: str = ""
    description: str = ""
    contact: str = ""
    pubkey: str = ""
    access_policy: str = "public"
    auth_required: bool = False
    allow: frozenset[str] = frozenset()
    block: frozenset[str] = frozenset()
    #: NIP-11 icon URL
    icon: str = ""
    #: moderation (NIP-86): kinds accepted (empty: every kind) and refused; event ids refused;
    #: client addresses refused (the peer address of the connection)
    allow_kinds: frozenset[int] = frozenset()
    block_kinds: frozenset[int] = frozenset()
    ban_events: frozenset[str] = frozenset()
    block_ips: frozenset[str] = frozenset()
    #: NIP-PL push configuration (appliance.push.config); empty = push disabled here
    push: dict = field(default_factory=dict, hash=False)
    id: int = 0

    @property
    def relay_url(self) -> str:
        """The URL a NIP-42 AUTH event's relay tag must name."""
        return self.origin

    def config_json(self) -> str:
        data = asdict(self)
        data.pop("id")
        data.pop("origin")
        data["hosts"] = list(self.hosts)
        for name in LIST_FIELDS:
            data[name] = sorted(getattr(self, name))
        return json.dumps(data, sort_keys=True)

    def to_mapping(self) -> dict[str, Any]:
        """The origin as `from_mapping` takes it (without the id)."""
        return {"origin": self.origin, **json.loads(self.config_json())}

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, id: int = 0, where: str = "origin",
                     check_push: Callable[[Any, str], dict] | None = None,
                     push_where: str | None = None) -> "Origin":
        """Build and validate an origin from a config table or a stored JSON row. `where` names the
        origin's table as the operator wrote it (`origins[0]`), `push_where` its push table
        (default `where`.push; `[push]` for the default origin's)."""
        known = {f for f in cls.__dataclass_fields__ if f != "id"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(at(where, f"{unknown[0]}"), data[unknown[0]], "unknown origin field")
        origin = data.get("origin")
        parts = urlsplit(origin) if isinstance(origin, str) else None
        if parts is None or parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ConfigError(at(where, "origin"), origin, "expected a ws:// or wss:// URL such as wss://chat.example.org")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ConfigError(at(where, "origin"), origin, "an origin has no query, fragment or user part")
        hosts = data.get("hosts") or [parts.hostname]
        if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts):
            raise ConfigError(at(where, "hosts"), hosts, "expected a list of host names")
        path = data.get("path") or parts.path or "/"
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(at(where, "path"), path, "expected a path starting with /")
        policy = data.get("access_policy", "public")
        if policy not in POLICIES:
            raise ConfigError(at(where, "access_policy"), policy, "must be public or members")
        lists = {}
        for name in ("allow", "block", "ban_events"):
            values = data.get(name, [])
            if isinstance(values, str) or not isinstance(values, (list, tuple, set, frozenset)) \
                    or not all(_is_pubkey(v) for v in values):
                what = "event ids" if name == "ban_events" else "pubkeys"
                raise ConfigError(at(where, f"{name}"), values, f"expected a list of 64-hex {what}")
            lists[name] = frozenset(values)
        for name in ("allow_kinds", "block_kinds"):
            values = data.get(name, [])
            if not isinstance(values, (list, tuple, set, frozenset)) or not all(_is_kind(v) for v in values):
                raise ConfigError(at(where, f"{name}"), values, "expected a list of kind numbers (0-65535)")
            lists[name] = frozenset(values)
        ips = data.get("block_ips", [])
        if isinstance(ips, str) or not isinstance(ips, (list, tuple, set, frozenset)):
            raise ConfigError(at(where, "block_ips"), ips, "expected a list of IP addresses")
        lists["block_ips"] = frozenset(normalize_ip(ip, at(where, "block_ips")) for ip in ips)
        auth_required = data.get("auth_required", False)
        if not isinstance(auth_required, bool):
            raise ConfigError(at(where, "auth_required"), auth_required, "expected true or false")
        pubkey = data.get("pubkey", "")
        if pubkey and not _is_pubkey(pubkey):
            raise ConfigError(at(where, "pubkey"), pubkey, "expected 64 lowercase hex characters")
        for name in ("name", "description", "contact", "icon"):
            if not isinstance(data.get(name, ""), str):
                raise ConfigError(at(where, f"{name}"), data.get(name), "expected text")
        return cls(
            origin=origin,
            hosts=tuple(h.lower() for h in hosts),
            path=path.rstrip("/") or "/",
            name=data.get("name", ""),
            description=data.get("description", ""),
            contact=data.get("contact", ""),
            pubkey=pubkey,
            access_policy=policy,
            auth_required=auth_required or policy == "members",
            allow=lists["allow"],
            block=lists["block"],
            icon=data.get("icon", ""),
            allow_kinds=lists["allow_kinds"],
            block_kinds=lists["block_kinds"],
            ban_events=lists["ban_events"],
            block_ips=lists["block_ips"],
            push=_push_config(data.get("push"), at(where, "push") if push_where is None else push_where, check_push,
                              origin),
            id=id,
        )


def _push_config(push: Any, where: str, check_push: Callable[..., dict] | None, origin: str) -> dict:
    """The push table (`where` names it): checked in depth by the executor's rules when the caller
    supplies them."""
    if push is None:
        return {}
    if not isinstance(push, dict):
        raise ConfigError(where, push, "expected a [push] table")
    return check_push(push, where, origin) if check_push is not None else dict(push)


class UnknownOrigin(LookupError):
    """No origin is routed at this host and path."""


@dataclass
class OriginRegistry:
    """All origins of this process, with request routing."""

    origins: list[Origin] = field(default_factory=list)

    def by_id(self, origin_id: int) -> Origin:
        for o in self.origins:
            if o.id == origin_id:
                return o
        raise UnknownOrigin(origin_id)

    def by_origin(self, origin: str) -> Origin:
        for o in self.origins:
            if o.origin == origin:
                return o
        raise UnknownOrigin(origin)

    def resolve(self, host: str | None, path: str) -> Origin:
        """The origin a request belongs to, from the server's view of Host and path only.

        With a single origin every host routes to it (a single community behind any proxy just
        works); with several, the Host header must name one of them.
        """
        if len(self.origins) == 1:
            return self.origins[0]
        hostname = (host or "").lower()
        if hostname.startswith("["):
            hostname = hostname[1:].split("]", 1)[0]
        else:
            hostname = hostname.rsplit(":", 1)[0] if hostname.count(":") == 1 else hostname
            if hostname.endswith(".") and not hostname.endswith(".."):
                hostname = hostname[:-1]  # the fully qualified form names the same host
        best: Origin | None = None
        for o in self.origins:
            if hostname in o.hosts and _path_under(path, o.path):
                if best is None or len(o.path) > len(best.path):
                    best = o
        if best is None:
            raise UnknownOrigin(f"no community is served at host {hostname!r}")
        return best

    def replace(self, origin: Origin) -> None:
        self.origins = [origin if o.id == origin.id else o for o in self.origins]


def _path_under(path: str, prefix: str) -> bool:
    if prefix == "/":
        return True
    return path == prefix or path.startswith(prefix + "/")


def load_origins(conn: Connection) -> list[Origin]:
    return [
        Origin.from_mapping({"origin": origin, **json.loads(config)}, id=oid, where="origin")
        for oid, origin, config in origin_rows.origin_rows(conn)
    ]


def save_origin(conn: Connection, origin: Origin) -> Origin:
    """Insert or update an origin row (inside a write transaction); return it with its id."""
    oid = origin_rows.upsert_origin(conn, origin.origin, origin.config_json())
    return replace(origin, id=oid)


def sync_origins(conn: Connection, declared: Iterable[Origin]) -> list[Origin]:
    """Make the declared origins (default + config file) exist; keep CLI-created ones."""
    for o in declared:
        save_origin(conn, o)
    origins = load_origins(conn)
    check_routes(origins)
    return origins


def check_routes(origins: list[Origin]) -> None:
    """Refuse two origins claiming the same host and path (the appliance could not tell them apart)."""
    if len(origins) < 2:
        return
    seen: dict[str, str] = {}
    for o in origins:
        for host in o.hosts:
            key = f"{host}{o.path}"
            if key in seen:
                raise ConfigError("origins.hosts", host, f"routed to both {seen[key]} and {o.origin}")
            seen[key] = o.origin
