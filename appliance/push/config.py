"""Per-origin push configuration (the `[push]` / `[[origins]].push` TOML tables).

An empty table means push is disabled for that origin. The table is shape-checked when the
origin is loaded (`check_push_config`, raising ConfigError that names the field); the full
descriptor validity rules run once the executor keys are known (`build_descriptor`).
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from typing import Any, Mapping, Sequence

from appliance.errors import ConfigError, at
from appliance.transports.apns import ENVIRONMENTS, ApnsProfile, check_apns_url, check_ca_file
from appliance.transports.credentials import ApnsKey, CredentialError, check_apple_id
from appliance.transports.gateway import check_gateway_url

from .descriptor import (
    CLASS_REGISTRY,
    TRANSPORTS,
    AppProfile,
    Descriptor,
    ExecutorKey,
    Limits,
    validate_descriptor,
)
from .errors import DescriptorError
from .kinds import DRAFT_TRANSPORTS, KINDS, ProfileError, kind_fields, load_kind

__all__ = ["PUSH_FIELDS", "APP_PROFILE_FIELDS", "CREDENTIAL_FIELDS", "check_push_config", "check_app_profile",
           "delivery_profile", "kind_profile", "gateway_url_of", "push_limits", "build_descriptor",
           "DEFAULT_PUSH_KINDS", "profile_fields"]

DEFAULT_PUSH_KINDS = (9, 1059, 7)
PUSH_FIELDS = (
    "app_profiles", "push_kinds", "urgent_kinds", "h_grammar", "class_support", "limitation",
    "allowed_skew", "endpoint",
)


#: Keys of one `app_profiles` entry. Only `id` and `transport` are ever advertised (NIP-11); the
#: rest are the profile's delivery credentials (APNs token-based auth), all or none of the required
#: ones: topic, team_id, key_id, key_file, environment; apns_url and ca_file are optional overrides.
#: Instead of `key_file`, `key_stored` names a .p8 uploaded through the dashboard (kept in the
#: database wrapped by the key file) by its fingerprint.
CREDENTIAL_FIELDS = ("topic", "team_id", "key_id", "key_file", "key_stored", "environment", "apns_url", "ca_file")
REQUIRED_CREDENTIALS = ("topic", "team_id", "key_id", "key_file", "environment")
#: Instead of credentials, an APNs profile may deliver through an APNs gateway (NIP-PL, Public APNs
#: Gateway Profile): its leases' endpoints are then the gateway's opaque grants.
GATEWAY_FIELD = "gateway_url"
APP_PROFILE_FIELDS = ("id", "transport") + CREDENTIAL_FIELDS + (GATEWAY_FIELD,)


def profile_fields(transport: str) -> tuple[str, ...]:
    """The keys an `app_profiles` entry of this transport may have (other transports: push.kinds)."""
    if transport == "apns":
        return APP_PROFILE_FIELDS
    return ("id", "transport") + kind_fields(transport)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_push_config(push: Any, where: str, origin: str = "wss://config.check") -> dict:
    """Shape-check a push table (`where` names it as the operator wrote it: `[push]`,
    `origins[0].push`, `push`); return it as a plain dict (JSON/TOML round-trippable)."""
    if push is None:
        return {}
    if not isinstance(push, dict):
        raise ConfigError(where, push, "expected a [push] table")
    unknown = sorted(set(push) - set(PUSH_FIELDS))
    if unknown:
        raise ConfigError(at(where, f"{unknown[0]}"), push[unknown[0]],
                          "unknown push field; known: " + ", ".join(PUSH_FIELDS))
    if not push:
        return {}
    profiles = push.get("app_profiles", [])
    if not isinstance(profiles, list):
        raise ConfigError(at(where, "app_profiles"), profiles,
                          'expected a list of {id = "...", transport = "apns|fcm|unifiedpush", ...}')
    if not profiles:
        raise ConfigError(at(where, "app_profiles"), profiles,
                          "push is on but has no app profile, so no lease could name one and no device could be "
                          'woken: add one (app_profiles = [{ id = "com.example.app/ios", transport = "apns", ... }]) '
                          "or turn push off")
    for i, entry in enumerate(profiles):
        check_app_profile(entry, at(where, f"app_profiles[{i}]"))
    for name in ("push_kinds", "urgent_kinds"):
        ks = push.get(name, [])
        if not isinstance(ks, list) or not all(_is_int(k) for k in ks):
            raise ConfigError(at(where, f"{name}"), ks, "expected a list of kind numbers")
    if not isinstance(push.get("h_grammar", "uuid-v4-lowercase"), str):
        raise ConfigError(at(where, "h_grammar"), push.get("h_grammar"), "expected text")
    cs = push.get("class_support", {})
    if not isinstance(cs, dict) or not all(isinstance(v, list) and all(isinstance(c, str) for c in v)
                                           for v in cs.values()):
        raise ConfigError(at(where, "class_support"), cs, "expected a table transport = [classes]")
    lim = push.get("limitation", {})
    known = set(Limits.ADVERTISED)
    if not isinstance(lim, dict):
        raise ConfigError(at(where, "limitation"), lim, "expected a table of limits")
    for k, v in lim.items():
        if k not in known:
            raise ConfigError(at(where, f"limitation.{k}"), v, "unknown limit; known: " + ", ".join(sorted(known)))
        if not _is_int(v) or v <= 0:
            raise ConfigError(at(where, f"limitation.{k}"), v, "expected a positive whole number")
    skew = push.get("allowed_skew", Limits.allowed_skew)
    if not _is_int(skew) or skew <= 0:
        raise ConfigError(at(where, "allowed_skew"), skew, "expected a positive whole number of seconds")
    ep = push.get("endpoint")
    if ep is not None and not isinstance(ep, str):
        raise ConfigError(at(where, "endpoint"), ep, "expected an https:// URL")
    # Every descriptor rule that does not depend on the executor keys, now: an origin saved with a
    # descriptor the appliance would refuse to serve could stop the next start (or a reload).
    build_descriptor(origin, push, [ExecutorKey("config-check", _PROBE_PUBKEY, current=True)])
    return dict(push)


def check_app_profile(entry: Any, where: str) -> None:
    """Shape-check one `app_profiles` entry and load its credentials (ConfigError naming the profile)."""
    if not isinstance(entry, dict):
        raise ConfigError(where, entry, 'expected {id = "...", transport = "apns|fcm|unifiedpush", ...}')
    pid, transport = entry.get("id"), entry.get("transport")
    if not isinstance(pid, str) or not isinstance(transport, str):
        raise ConfigError(where, entry, 'expected {id = "...", transport = "apns|fcm|unifiedpush", ...}')
    known = profile_fields(transport)
    unknown = sorted(set(entry) - set(known))
    if unknown:
        if transport != "apns" and unknown[0] in APP_PROFILE_FIELDS:
            why = (f"{unknown[0]} is an APNs setting; a {transport} profile takes "
                   + (", ".join(known[2:]) if known[2:] else "no delivery settings in this appliance"))
        else:
            why = "unknown field; known: " + ", ".join(known)
        raise ConfigError(at(where, f"{unknown[0]}"), entry[unknown[0]], f"app profile {pid!r}: {why}")
    if transport == "apns":
        delivery_profile(entry, where)
    elif transport in KINDS:
        kind_profile(entry, where)


def kind_profile(entry: dict, where: str = "app_profiles", stored: Mapping[str, bytes] | None = None):
    """The delivery config of a profile whose transport is a `push.kinds` kind (FCM, UnifiedPush),
    or None when it gives none (or names a stored credential and `stored` is None: shape checked).
    ConfigError names the profile and the field."""
    kind = KINDS.get(entry.get("transport"))
    if kind is None:
        return None
    try:
        return load_kind(kind, entry, stored)
    except ProfileError as exc:
        raise ConfigError(at(where, exc.field), entry.get(exc.field),
                          f"app profile {entry.get('id')!r}: {exc}") from None


def delivery_profile(entry: dict, where: str = "app_profiles",
                     stored_keys: Mapping[str, bytes] | None = None) -> ApnsProfile | None:
    """The delivery credentials of an app profile (its .p8 key loaded), or None when it has none.

    A profile without credentials is still advertised and accepts leases; its wakes wait as
    configuration faults (see docs/spec-notes.md W8). ConfigError names the profile and the reason.
    A `key_stored` key is loaded from `stored_keys` (fingerprint -> PEM); without them (a check that
    has no database) only its shape is checked and None is returned.
    """
    pid = entry.get("id")
    given = [k for k in CREDENTIAL_FIELDS if k in entry]
    if gateway_url_of(entry, where) is not None:
        return None
    if not given or entry.get("transport") != "apns":
        return None  # another transport's settings: `kind_profile`
    if "key_file" in entry and "key_stored" in entry:
        raise ConfigError(at(where, "key_stored"), entry["key_stored"],
                          f"app profile {pid!r}: give key_file or key_stored, not both")
    required = [k if k != "key_file" or "key_stored" not in entry else "key_stored" for k in REQUIRED_CREDENTIALS]
    missing = [k for k in required if k not in entry]
    if missing:
        raise ConfigError(at(where, f"{missing[0]}"), None,
                          f"app profile {pid!r}: credentials need all of " + ", ".join(REQUIRED_CREDENTIALS)
                          + " (or key_stored instead of key_file); missing: " + ", ".join(missing))
    for k in given:
        if not isinstance(entry[k], str) or not entry[k]:
            raise ConfigError(at(where, f"{k}"), entry[k], f"app profile {pid!r}: expected non-empty text")
    for k in ("key_file", "ca_file"):
        if k in entry and not os.path.isabs(entry[k]):
            raise ConfigError(at(where, f"{k}"), entry[k], f"app profile {pid!r}: use an absolute path (the file "
                              "is read again at every start and reload, from wherever that runs)")
    if entry["environment"] not in ENVIRONMENTS:
        raise ConfigError(at(where, "environment"), entry["environment"],
                          f"app profile {pid!r}: expected " + " or ".join(f'"{e}"' for e in ENVIRONMENTS))
    field = "apns_url"
    try:
        apns_url = check_apns_url(entry["apns_url"]) if "apns_url" in entry else None
        for field in ("team_id", "key_id"):
            check_apple_id(field, entry[field])
        if "ca_file" in entry:  # checked here too: a stored key's profile returns before loading it below
            field = "ca_file"
            check_ca_file(entry["ca_file"])
        if "key_stored" in entry:
            field = "key_stored"
            pem = (stored_keys or {}).get(entry["key_stored"])
            if pem is None:
                if stored_keys is None:
                    return None  # shape checked; the key itself is in the database
                raise CredentialError(f"no uploaded .p8 key {entry['key_stored']} in this database")
            key = ApnsKey.from_pem(entry["team_id"], entry["key_id"], pem)
        else:
            field = "key_file"
            key = ApnsKey.load(entry["team_id"], entry["key_id"], entry["key_file"])
        field = "ca_file"
        profile = ApnsProfile(pid, entry["topic"], entry["environment"], key,
                              apns_url=apns_url, ca_file=entry.get("ca_file"))
        profile.ssl_context()  # a ca_file that does not load fails here, not at the first wake
    except CredentialError as exc:
        raise ConfigError(at(where, field), entry.get(field), f"app profile {pid!r}: {exc}") from None
    return profile


def gateway_url_of(entry: dict, where: str = "app_profiles") -> str | None:
    """The `gateway_url` an APNs profile delivers through, or None. It excludes credentials: the
    gateway holds those (one way to deliver per profile)."""
    if GATEWAY_FIELD not in entry:
        return None
    pid, url = entry.get("id"), entry[GATEWAY_FIELD]
    if entry.get("transport") != "apns":
        raise ConfigError(at(where, f"{GATEWAY_FIELD}"), url,
                          f"app profile {pid!r}: an APNs gateway delivers transport \"apns\" only")
    given = [k for k in CREDENTIAL_FIELDS if k in entry]
    if given:
        raise ConfigError(at(where, f"{given[0]}"), entry[given[0]],
                          f"app profile {pid!r}: a profile with gateway_url has no APNs credentials of its "
                          "own (the gateway holds them); remove one or the other")
    try:
        return check_gateway_url(url)
    except ValueError as exc:
        raise ConfigError(at(where, f"{GATEWAY_FIELD}"), url, f"app profile {pid!r}: {exc}") from None


# Any valid x-only public key will do for the key-independent checks (this is the generator's).
_PROBE_PUBKEY = "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"


def push_limits(push: dict) -> Limits:
    values = {f.name: getattr(Limits(), f.name) for f in fields(Limits)}
    values.update(push.get("limitation", {}))
    values["allowed_skew"] = push.get("allowed_skew", Limits.allowed_skew)
    return Limits(**values)


def build_descriptor(origin: str, push: dict, keys: Sequence[ExecutorKey], drafts: bool = False) -> Descriptor:
    """The descriptor of a push-enabled origin; ConfigError naming origin and failing rule if invalid.

    Every profile is checked, but the draft transports' profiles (push.kinds.DRAFT_TRANSPORTS) and
    their class support are advertised only with `drafts` (the `push_draft_transports` setting)."""
    profiles = tuple(AppProfile(p["id"], p["transport"]) for p in push.get("app_profiles", []))
    default_cs = {t: tuple(CLASS_REGISTRY) for t in sorted({p.transport for p in profiles} & TRANSPORTS)}
    cs = push.get("class_support")
    desc = Descriptor(
        origin=origin,
        keys=tuple(keys),
        app_profiles=profiles,
        push_kinds=tuple(push.get("push_kinds", DEFAULT_PUSH_KINDS)),
        urgent_kinds=tuple(push.get("urgent_kinds", [])),
        h_grammar=push.get("h_grammar", "uuid-v4-lowercase"),
        class_support=default_cs if cs is None else {t: tuple(v) for t, v in cs.items()},
        limits=push_limits(push),
        endpoint=push.get("endpoint"),
    )
    try:
        validate_descriptor(desc)
    except DescriptorError as exc:
        raise ConfigError(f"push descriptor of {origin}", exc.rule, exc.detail or exc.rule) from None
    if not drafts:
        desc = replace(desc, app_profiles=tuple(p for p in desc.app_profiles if p.transport not in DRAFT_TRANSPORTS),
                       class_support={t: v for t, v in desc.class_support.items() if t not in DRAFT_TRANSPORTS})
    return desc


def check_push_fits_relay(push: dict, where: str, max_content_length: int) -> None:
    """A descriptor may not advertise more than the relay accepts (its `max_content_length`)."""
    if not push:
        return
    limit = push_limits(push).max_content_len
    if limit > max_content_length:
        raise ConfigError(at(where, f"limitation.max_content_len"), limit,
                          f"more than the relay accepts (max_content_length = {max_content_length}); "
                          "lower it or raise max_content_length")
