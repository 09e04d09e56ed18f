"""`appliance origins ...`: list, add, edit and remove communities from the command line.

The edits are functions over a write transaction (`add_origin`, `edit_origin`, `change_list`,
`set_push`): the CLI runs them through `store.write_sync`, the dashboard and the NIP-86 API through
the running appliance's writer. Each validates with the same rules, refuses fields the
configuration owns, checks routes and bumps the config generation (a running appliance applies
it within a second; the dashboard applies it at once).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Iterable

from appliance.commands import add_list_options, print_list
from appliance.errors import ConfigError
from appliance.origins import Origin, check_routes, load_origins, save_origin
from appliance.settings import Settings
from appliance.store.interface import Connection

# Fields an operator edits as a whole (lists have `change_list`).
EDITABLE = ("hosts", "path", "name", "description", "contact", "pubkey", "icon", "access_policy", "auth_required")
LISTS = ("allow", "block", "allow_kinds", "block_kinds", "ban_events", "block_ips")


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="origins_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="List origins (a table; --json for every field).",
                        description="List every origin: a table, or with --json one object per line with every field.")
    add_list_options(ls)
    add_setting_flags(ls)
    add = sub.add_parser("add", help="Add an origin.", description="Add a community served by this process.")
    add.add_argument("origin", help="Canonical origin, e.g. wss://chat.example.org")
    _origin_fields(add)
    add_setting_flags(add)
    edit = sub.add_parser("set", help="Change an origin's fields.", description="Edit an existing origin.")
    edit.add_argument("origin")
    _origin_fields(edit)
    edit.add_argument("--push-json", dest="push_json", metavar="JSON",
                      help='The push table as JSON (NIP-PL descriptor settings), e.g. \'{"push_kinds": [9]}\'; '
                      "'{}' disables push. Checked against every descriptor rule before it is saved.")
    add_setting_flags(edit)
    for verb, helptext in (("allow", "Add pubkeys to the allowlist (members)."),
                           ("disallow", "Remove pubkeys from the allowlist."),
                           ("block", "Add pubkeys to the blocklist."),
                           ("unblock", "Remove pubkeys from the blocklist.")):
        p = sub.add_parser(verb, help=helptext, description=helptext)
        p.add_argument("origin", help="The origin's URL, or its ID as `appliance origins list` shows it.")
        p.add_argument("pubkeys", nargs="+", metavar="PUBKEY",
                       help="64 hex characters, npub1..., or a fingerprint pk:... the dashboard shows (a pubkey "
                       "this appliance has seen)")
        add_setting_flags(p)


def _origin_fields(p: argparse.ArgumentParser) -> None:
    p.add_argument("--route-host", dest="hosts", action="append", metavar="HOST",
                   help="Host name routed to this origin (repeatable). Default: the origin's host.")
    p.add_argument("--route-path", dest="route_path", metavar="PATH", help="Path prefix routed to this origin.")
    p.add_argument("--name", dest="origin_name", help="NIP-11 name.")
    p.add_argument("--description", dest="origin_description", help="NIP-11 description.")
    p.add_argument("--policy", dest="policy", choices=("public", "members"), help="Access policy.")


def _fields(args: argparse.Namespace) -> dict:
    out = {}
    for attr, key in (("hosts", "hosts"), ("route_path", "path"), ("origin_name", "name"),
                      ("origin_description", "description"), ("policy", "access_policy")):
        value = getattr(args, attr, None)
        if value is not None:
            out[key] = value
    return out


# -- the edits ------------------------------------------------------------------------------------


def find(conn: Connection, origin: str | int) -> Origin:
    """An origin by its origin string or id, as an int or as the digits `origins list` shows
    (ConfigError if there is none)."""
    for o in load_origins(conn):
        if o.origin == origin or o.id == origin or str(o.id) == str(origin):
            return o
    raise ConfigError("origin", origin, "no such origin; `appliance origins list` shows them")


def owned_fields(conn: Connection, settings: Settings, origin: Origin) -> frozenset[str]:
    """The fields of `origin` the configuration owns (rewritten from it at every start)."""
    from appliance.origin_config import config_owned

    return config_owned(conn, settings).get(origin.id, frozenset())


def _refuse_owned(conn: Connection, settings: Settings, origin: Origin, fields: Iterable[str]) -> None:
    owned = owned_fields(conn, settings, origin)
    for name in fields:
        if name in owned:
            raise ConfigError(f"{origin.origin}.{name}", getattr(origin, name, None),
                              "set by the configuration (a flag, the environment or the config file), which "
                              "rewrites it at every start: change it there")


def _save(conn: Connection, settings: Settings, origin: Origin) -> Origin:
    """Validate in depth (push descriptor rules, relay limits, routes), save, bump the generation."""
    from appliance.push.config import check_push_config, check_push_fits_relay
    from appliance.store.meta import bump_generation

    data = origin.to_mapping()
    # Named as the edit names them (`push.app_profiles[0].key_file`), the origin said in the hint.
    try:
        checked = Origin.from_mapping(data, id=origin.id, where="", check_push=check_push_config,
                                      push_where="push")
        check_push_fits_relay(checked.push, "push", settings.max_content_length)
    except ConfigError as exc:
        if origin.origin in exc.hint or exc.name == "origin":
            raise
        raise ConfigError(exc.name, exc.value, f"{exc.hint} (at {origin.origin})") from None
    saved = save_origin(conn, checked)
    check_routes(load_origins(conn))  # refused here, not at the next start
    bump_generation(conn)  # a running appliance reloads origins within a second
    return saved


def add_origin(conn: Connection, settings: Settings, data: dict[str, Any]) -> Origin:
    """Create an origin from `data` (the fields of `Origin.from_mapping`)."""
    origin = Origin.from_mapping(data)
    if any(o.origin == origin.origin for o in load_origins(conn)):
        raise ConfigError("origin", origin.origin, "already exists; use `appliance origins set`")
    return _save(conn, settings, origin)


def edit_origin(conn: Connection, settings: Settings, origin: str | int, changes: dict[str, Any]) -> Origin:
    """Change some of an origin's fields (`EDITABLE`)."""
    current = find(conn, origin)
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ConfigError(unknown[0], changes[unknown[0]], "not an editable origin field; editable: "
                          + ", ".join(EDITABLE))
    changed = [k for k, v in changes.items() if current.to_mapping().get(k) != (list(v) if k == "hosts" else v)]
    _refuse_owned(conn, settings, current, changed)
    data = {**current.to_mapping(), **changes}
    if "hosts" in changes and not changes["hosts"]:
        data.pop("hosts")  # back to the origin's own host
    return _save(conn, settings, Origin.from_mapping(data, id=current.id, where=current.origin))


def change_list(conn: Connection, settings: Settings, origin: str | int, name: str, *,
                add: Iterable = (), remove: Iterable = ()) -> Origin:
    """Add values to and remove values from one of an origin's lists (`LISTS`), validated."""
    if name not in LISTS:
        raise ConfigError("list", name, "one of " + ", ".join(LISTS))
    current = find(conn, origin)
    _refuse_owned(conn, settings, current, [name])
    # Parsed as the origin parses them (hex pubkeys and ids, kind numbers, canonical addresses).
    add_set = getattr(Origin.from_mapping({"origin": current.origin, name: list(add)}, where=current.origin), name)
    remove_set = getattr(Origin.from_mapping({"origin": current.origin, name: list(remove)}, where=current.origin),
                         name)
    values = (getattr(current, name) | add_set) - remove_set
    data = {**current.to_mapping(), name: sorted(values)}
    return _save(conn, settings, Origin.from_mapping(data, id=current.id, where=current.origin))


def set_push(conn: Connection, settings: Settings, origin: str | int, push: dict[str, Any]) -> Origin:
    """Replace an origin's push table (the NIP-PL descriptor settings; {} disables push), after
    every descriptor rule (ConfigError naming the failing rule)."""
    current = find(conn, origin)
    if current.push != push:
        _refuse_owned(conn, settings, current, ["push"])
    data = {**current.to_mapping(), "push": push}
    return _save(conn, settings, Origin.from_mapping(data, id=current.id, where=current.origin))


def origin_json(o: Origin) -> dict:
    return {"id": o.id, **o.to_mapping()}


def _push_summary(o: dict) -> str:
    profiles = (o.get("push") or {}).get("app_profiles") or []
    if not o.get("push"):
        return "off"
    return ", ".join(p.get("id", "?") + (" (key stored)" if p.get("key_stored") else "") for p in profiles) or "on"


ORIGIN_COLUMNS = [
    ("ID", lambda o: o["id"]),
    ("ORIGIN", lambda o: o["origin"]),
    ("HOSTS", lambda o: ",".join(o.get("hosts") or [])),
    ("PATH", lambda o: o.get("path")),
    ("POLICY", lambda o: o.get("access_policy", "public")),
    ("ALLOW", lambda o: len(o.get("allow") or [])),
    ("BLOCK", lambda o: len(o.get("block") or [])),
    ("PUSH", _push_summary),
]


# -- the command line -----------------------------------------------------------------------------


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.origin_config import prepare_origins
    from appliance.store.backend import store_for

    with store_for(settings) as store:
        prepare_origins(store, settings, serving=False)
        cmd = args.origins_command
        if cmd == "list":
            print_list([origin_json(o) for o in store.read_sync(load_origins)], ORIGIN_COLUMNS, as_json=args.json,
                       empty="no origins")
            return 0
        if cmd == "add":
            def op(conn):
                return add_origin(conn, settings, {"origin": args.origin, **_fields(args)})
        elif cmd == "set":
            push = None
            if args.push_json is not None:
                try:
                    push = json.loads(args.push_json)
                except ValueError as exc:
                    raise ConfigError("push-json", args.push_json, f"not JSON: {exc}") from None

            def op(conn):
                saved = edit_origin(conn, settings, args.origin, _fields(args)) if _fields(args) else None
                if push is not None:
                    saved = set_push(conn, settings, args.origin, push)
                return saved or find(conn, args.origin)
        else:
            from appliance.commands.moderation import resolve_pubkey
            from appliance.store.fingerprints import KEY_PURPOSE
            from appliance.store.keyfile import KeyFile

            name = "allow" if cmd in ("allow", "disallow") else "block"
            adding = cmd in ("allow", "block")
            key = KeyFile.for_store(settings.data_path, store).derive(KEY_PURPOSE)
            refs: list = []

            def op(conn):
                # hex, npub1... or the dashboard's fingerprint of a pubkey seen here (pk:...)
                origin = find(conn, args.origin)
                refs[:] = [resolve_pubkey(conn, v, origin=origin, fingerprint_key=key) for v in args.pubkeys]
                keys = [r.pubkey for r in refs]
                return change_list(conn, settings, args.origin, name,
                                   add=keys if adding else (), remove=() if adding else keys)
        saved = store.write_sync(op)
        if cmd in ("allow", "disallow", "block", "unblock"):
            # One line per key: a fingerprint given is named as such, never as the full key it resolved to.
            done = {"allow": "allowed", "disallow": "no longer allowed", "block": "blocked",
                    "unblock": "unblocked"}[cmd]
            for r in refs:
                print(f"{done} {r.shown} at {saved.origin}")
            return 0
        print(json.dumps(origin_json(saved)))
    return 0


def store_service_account(conn: Connection, keyfile, data: bytes, now: int) -> str:
    """Keep an FCM service account key file in the database, wrapped by the key file (as .p8
    keys are); its fingerprint (`sa:...`), which an fcm profile names as `service_account_stored`."""
    from appliance.store.credentials import save_apns_key
    from appliance.transports.credentials import CredentialError
    from appliance.transports.fcm import ServiceAccount

    try:
        account = ServiceAccount.parse(data)
    except CredentialError as exc:
        raise ConfigError("service_account", "(the uploaded service account file)", str(exc)) from None
    save_apns_key(conn, keyfile, account.fingerprint, data, now)
    return account.fingerprint


def store_apns_key(conn: Connection, keyfile, pem: bytes, now: int) -> str:
    """Keep an APNs .p8 signing key in the database, wrapped by the key file; its fingerprint, which
    an app profile names as `key_stored` (the key itself is never shown again)."""
    from appliance.store.credentials import save_apns_key
    from appliance.transports.credentials import CredentialError, key_fingerprint, parse_p8

    try:
        key = parse_p8(pem)
    except CredentialError as exc:
        raise ConfigError("key", "(the uploaded .p8 file)", str(exc)) from None
    fingerprint = key_fingerprint(key)
    save_apns_key(conn, keyfile, fingerprint, pem, now)
    return fingerprint
