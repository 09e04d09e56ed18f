"""The configured origins: the default origin made from the flat settings and the config file's
`[[origins]]`, merged into the stored rows at every start (the configuration owns the fields it
declares; the CLI and the dashboard own the rest)."""

from __future__ import annotations

import json

from appliance.origins import Origin, load_origins, save_origin, sync_origins
from appliance.push.config import check_push_config, check_push_fits_relay
from appliance.settings import Settings
from appliance.store import meta, origin_rows
from appliance.store.interface import Store

# The meta key holding the default origin's row id (it keeps its row when public_url changes).
DEFAULT_ORIGIN_KEY = "default_origin"


def default_origin(settings: Settings) -> Origin:
    """The origin derived from the public URL and flat settings: the single-community setup."""
    return Origin.from_mapping(
        {
            "origin": settings.effective_public_url,
            "name": settings.relay_name,
            "description": settings.relay_description,
            "contact": settings.relay_contact,
            "pubkey": settings.relay_pubkey,
            "access_policy": settings.access_policy,
            "auth_required": settings.auth_required,
            "push": settings.push,
        },
        where="public_url",
        check_push=check_push_config,
        push_where="[push]",
    )


# The default origin's fields that come from flat settings, by origin field.
DEFAULT_ORIGIN_SETTINGS = {
    "name": "relay_name", "description": "relay_description", "contact": "relay_contact",
    "pubkey": "relay_pubkey", "access_policy": "access_policy", "auth_required": "auth_required",
}
# Always the configuration's: the default origin's URL and routing follow public_url.
DEFAULT_ORIGIN_FIXED = frozenset({"origin", "hosts", "path"})


def declared_fields(settings: Settings) -> dict[str, frozenset[str]]:
    """Which fields of which origin the configuration (flags, environment, config file) sets.

    Key "default" is the default origin; the others are the config file's `[[origins]]` by origin
    string. The configuration owns these: they are rewritten from it at every start, so the
    dashboard and the CLI refuse to edit them. Every other field is the database's.
    """
    default = set(DEFAULT_ORIGIN_FIXED)
    default |= {f for f, name in DEFAULT_ORIGIN_SETTINGS.items() if settings.sources.get(name, "default") != "default"}
    if settings.push:
        default.add("push")
    out = {"default": frozenset(default)}
    for o in settings.origins:
        if isinstance(o.get("origin"), str):
            out[o["origin"]] = frozenset(o) | {"origin"}
    return out


def _merge(current: Origin, declared: Origin, now: frozenset[str], before: frozenset[str]) -> Origin:
    """`current` with the fields the configuration declares now taken from `declared`, and the
    fields it declared at the previous start but no longer does set back to their defaults."""
    data = current.to_mapping()
    fresh = Origin(origin=declared.origin).to_mapping()
    wanted = declared.to_mapping()
    for name in before - now:
        data[name] = fresh.get(name)
    for name in now:
        data[name] = wanted.get(name)
    if "hosts" not in now and "hosts" in before - now:
        data.pop("hosts", None)  # derived from the origin again
    data = {k: v for k, v in data.items() if v is not None}
    return Origin.from_mapping(data, id=current.id, where="origin")


def _declared_before(conn, key: str) -> frozenset[str]:
    value = meta.meta_value(conn, f"declared:{key}")
    return frozenset(json.loads(value)) if value is not None else frozenset()


def _record_declared(conn, key: str, names: frozenset[str]) -> None:
    meta.set_meta(conn, f"declared:{key}", json.dumps(sorted(names)))


def default_origin_id(conn) -> int | None:
    value = meta.meta_value(conn, DEFAULT_ORIGIN_KEY)
    return int(value) if value is not None else None


def served_default_origin(conn, settings: Settings) -> Origin:
    """The default origin as `serve` makes it at start: the configuration's fields over the stored
    row (what the dashboard and the CLI saved for the rest); before the first start, the
    configuration's alone."""
    base = default_origin(settings)
    default_id = default_origin_id(conn)
    current = next((o for o in load_origins(conn) if o.id == default_id), None) if default_id is not None else None
    if current is None:
        return base
    return _merge(current, base, declared_fields(settings)["default"], _declared_before(conn, "default"))


def config_owned(conn, settings: Settings) -> dict[int, frozenset[str]]:
    """Origin id -> the fields the configuration owns (see `declared_fields`)."""
    declared = declared_fields(settings)
    out: dict[int, frozenset[str]] = {}
    default_id = default_origin_id(conn)
    for o in load_origins(conn):
        if o.id == default_id:
            out[o.id] = declared["default"]
        elif o.origin in declared:
            out[o.id] = declared[o.origin]
    return out


def prepare_origins(store: Store, settings: Settings, *, serving: bool = True) -> list[Origin]:
    """Make the default origin and the config file's origins exist; return all of them.

    The configuration owns the fields it declares (`declared_fields`); every other field keeps the
    value the CLI or the dashboard stored. A field the configuration stops declaring returns to its
    default. Only `serve` (serving=True) rewrites the default origin from the settings: the default
    origin keeps its row (and so its events) when the public URL changes.
    """
    base = default_origin(settings)
    declared_keys = declared_fields(settings)
    declared = [
        Origin.from_mapping(o, where=f"origins[{i}]", check_push=check_push_config)
        for i, o in enumerate(settings.origins)
    ]
    # Refused before anything is saved, by every command (a saved origin the server would refuse
    # stalls its reloads and its next start).
    check_push_fits_relay(base.push, "[push]", settings.max_content_length)
    for i, o in enumerate(declared):
        check_push_fits_relay(o.push, f"origins[{i}].push", settings.max_content_length)

    def op(conn):
        stored = {o.origin: o for o in load_origins(conn)}
        default_id = default_origin_id(conn)
        if default_id is None:
            save_origin(conn, base)
            oid = next(o.id for o in load_origins(conn) if o.origin == base.origin)
            meta.set_meta(conn, DEFAULT_ORIGIN_KEY, str(oid))
            _record_declared(conn, "default", declared_keys["default"])
        elif serving:
            current = next((o for o in stored.values() if o.id == default_id), None)
            merged = base if current is None else _merge(
                current, base, declared_keys["default"], _declared_before(conn, "default"))
            origin_rows.rewrite_origin(conn, default_id, merged.origin, merged.config_json())
            _record_declared(conn, "default", declared_keys["default"])
        for origin in declared:
            now = declared_keys[origin.origin]
            current = stored.get(origin.origin)
            if current is not None:
                origin = _merge(current, origin, now, _declared_before(conn, origin.origin))
            save_origin(conn, origin)
            _record_declared(conn, origin.origin, now)
        return sync_origins(conn, [])

    return store.write_sync(op)


def push_names(store: Store, settings: Settings) -> dict[int, str]:
    """Origin id -> its push table as the operator wrote it in the config file (`[push]`,
    `origins[0].push`), for messages; origins made with the CLI or the dashboard are not here."""
    names: dict[int, str] = {}

    def read(conn):
        default_id = default_origin_id(conn)
        if default_id is not None and settings.push:
            names[default_id] = "[push]"
        by_origin = {o.origin: o.id for o in load_origins(conn)}
        for i, o in enumerate(settings.origins):
            if isinstance(o.get("origin"), str) and o["origin"] in by_origin and o.get("push"):
                names[by_origin[o["origin"]]] = f"origins[{i}].push"

    store.read_sync(read)
    return names
