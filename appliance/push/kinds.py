"""Transport kinds: how an app profile of a transport other than APNs is checked and built.

APNs is built in (`config.delivery_profile`, `config.gateway_url_of`, `profiles.ProfileTransports`).
Every other transport is one `TransportKind` in `KINDS`, made of a config validator and a
constructor:

    fields      the delivery fields its `app_profiles` entry may carry (besides id and transport)
    load        (entry, stored) -> its delivery config, or None when the entry gives none; raises
                transports.ProfileError(field, why). `stored` holds the credentials kept in the
                database (fingerprint -> bytes); None when there is no database to read (a config
                check): then check shapes only and return None for a stored credential
    build       (config, TransportContext) -> a Transport (transports.base)
    share_key   (config, origin id) -> tuple: profiles with equal keys share one transport (one
                connection); include the origin id when the transport depends on it
    files       entry fields naming files on this server: a change on disk rebuilds the transport
    missing     what a profile without delivery fields lacks (its wakes wait as configuration faults)
    draft       beyond NIP-PL v1: advertised and built only with `push_draft_transports = true`

The draft transports (`DRAFT_TRANSPORTS`) are off unless the operator turns them on: off, their
profiles are not in the NIP-11 descriptor (a lease naming one is refused as an unknown app
profile) and have no transport (their queued wakes are dropped as "app profile no longer
configured").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from appliance.transports import ProfileError, Transport

__all__ = ["DRAFT_TRANSPORTS", "KINDS", "ProfileError", "TransportContext", "TransportKind", "is_draft", "kind_fields",
           "load_kind", "provider_name"]

#: Transports beyond NIP-PL v1 ("A future FCM profile MUST define ..."): labelled draft everywhere.
DRAFT_TRANSPORTS: frozenset[str] = frozenset({"fcm", "unifiedpush"})


def is_draft(transport: str) -> bool:
    return transport in DRAFT_TRANSPORTS


#: How the operator's pages name each transport's provider ("accepted by FCM").
PROVIDERS = {"apns": "APNs", "fcm": "FCM", "unifiedpush": "the push service"}


def provider_name(transport: str) -> str:
    return PROVIDERS.get(transport, transport)


@dataclass
class TransportContext:
    """What a kind's constructor may use besides its profile's own config."""

    origin_id: int
    #: shared(key, make) -> one object per key, shared by every profile asking for it and kept
    #: across reloads while a profile still uses it (an OAuth token cache, a rate limiter)
    shared: Callable[[tuple, Callable[[], Any]], Any]
    #: derive(label) -> a 32-byte secret for one purpose, stable across restarts (the key file's
    #: `derive`); None when the process has no key file (a config check)
    derive: Callable[[str], bytes] | None = None
    #: the store and its key file, for keys a transport makes and keeps wrapped (UnifiedPush's
    #: VAPID keys); None in a process without them
    store: Any = None
    keyfile: Any = None
    #: the executor's delivery workers (`wake_workers`), which a kind may keep from filling up
    wake_workers: int = 64


@dataclass(frozen=True)
class TransportKind:
    name: str
    fields: tuple[str, ...]
    load: Callable[[dict, Mapping[str, bytes] | None], Any | None]
    build: Callable[[Any, TransportContext], Transport]
    share_key: Callable[[Any, int], tuple]
    files: tuple[str, ...] = ()
    missing: str = "no delivery settings"
    draft: bool = True
    #: what the dashboard's test-wake form asks for (the endpoint a lease of this profile carries)
    endpoint_hint: str = "the endpoint a lease carries"


#: transport name -> its kind. A transport of NIP-PL's list without an entry here is accepted in
#: a descriptor but cannot deliver (`Unconfigured`, "unsupported transport").
KINDS: dict[str, TransportKind] = {}


def kind_fields(transport: str) -> tuple[str, ...]:
    kind = KINDS.get(transport)
    return kind.fields if kind is not None else ()


def load_kind(kind: TransportKind, entry: dict, stored: Mapping[str, bytes] | None) -> Any | None:
    """The kind's delivery config of `entry`, or None when it gives no delivery field."""
    if not any(f in entry for f in kind.fields):
        return None
    return kind.load(entry, stored)


def _fcm() -> TransportKind:
    """FCM HTTP v1 (appliance.transports.fcm): one transport (one HTTP/2 connection) per service
    account, project and host; one access token per account, shared by all its profiles."""
    from appliance.transports import fcm

    def build(config: fcm.FcmProfile, ctx: TransportContext) -> Transport:
        token = ctx.shared(config.token_key, lambda: fcm.AccessToken(config.account, config.token_uri,
                                                                     config.ca_file))
        return fcm.FcmTransport(config, token=token)

    def share_key(config: fcm.FcmProfile, _origin_id: int) -> tuple:
        return (config.account.client_email, config.account.fingerprint, config.project_id, config.fcm_url,
                config.token_uri, config.ca_file)

    return TransportKind("fcm", fcm.FCM_FIELDS, fcm.load_profile, build, share_key,
                         files=("service_account_file", "ca_file"),
                         missing="no FCM service account (service_account_file, or one uploaded in the dashboard)",
                         endpoint_hint="the app's FCM registration token")


KINDS["fcm"] = _fcm()

# -- UnifiedPush (draft) ----------------------------------------------------------------------------


def _build_unifiedpush(config, ctx: TransportContext) -> Transport:
    from appliance.transports.unifiedpush import HostRates, InFlight, UnifiedPushTransport

    from .vapid import VapidKeys

    if ctx.store is None or ctx.keyfile is None:
        raise RuntimeError("a UnifiedPush transport keeps its VAPID keys in the store: build it with one")
    # One token bucket per (origin, push host), shared by that origin's profiles with the same cap:
    # NIP-PL partitions rate limits by origin, so one community's lease holders cannot use up
    # another's wakes to a push host (origins are the operator's, so their number bounds the sum).
    rates = ctx.shared(("unifiedpush-rates", ctx.origin_id, config.host_rate, config.host_burst),
                       lambda: HostRates(config.host_rate, config.host_burst))
    # Attempts in flight per origin (and per push host): the delivery workers are shared with the
    # APNs wakes, and a push host that never answers holds a worker for the whole timeout.
    limit = max(1, ctx.wake_workers // 4)
    inflight = ctx.shared(("unifiedpush-inflight", ctx.origin_id, limit),
                          lambda: InFlight(limit, max(1, limit // 2)))
    return UnifiedPushTransport(config, VapidKeys(ctx.store, ctx.keyfile, ctx.origin_id), rates=rates,
                                inflight=inflight)


def _unifiedpush_kind() -> TransportKind:
    from appliance.transports.unifiedpush import PROFILE_FIELDS, load_profile

    return TransportKind(
        name="unifiedpush",
        fields=PROFILE_FIELDS,
        load=load_profile,
        build=_build_unifiedpush,
        # VAPID keys are the origin's own: one transport per origin and settings.
        share_key=lambda c, origin_id: (origin_id, c.vapid_subject, tuple(sorted(c.allow_hosts)), c.host_rate,
                                        c.host_burst, c.ca_file),
        files=("ca_file",),
        missing="no vapid_subject (the operator contact every VAPID token names)",
        draft=True,
        endpoint_hint="https://push.example.net/up/...#p256dh=<base64url>&auth=<base64url>",
    )


KINDS["unifiedpush"] = _unifiedpush_kind()
