"""Which transport delivers the wakes of each (origin, app profile).

Built from the origins' push tables whenever they are (re)loaded. An APNs profile with
credentials gets an `ApnsTransport` (shared by profiles with identical credentials, so they share
one connection). Every transport signing with one .p8 key shares that key's provider token,
whatever its topic, environment or origin (Apple: one token serves all of a team's apps, and a key
whose token changes more often than every 20 minutes is refused, 429 TooManyProviderTokenUpdates).
A profile with `gateway_url` gets a `GatewayTransport` (NIP-98 signed with its origin's relay
key); a profile without credentials, or of a transport this appliance has no kind for, gets
`Unconfigured`: its leases are accepted and its wakes wait as configuration faults until the
operator adds credentials (docs/spec-notes.md W8).
Any other transport is built by its `push.kinds` kind (its validator, then its constructor),
profiles with equal `share_key`s sharing one transport; a draft transport's profiles (fcm,
unifiedpush) get a transport only with `push_draft_transports` on.
A profile that is no longer in the descriptor has no transport: its wakes are dropped.
"""

from __future__ import annotations

import os
from typing import Callable

from appliance.errors import ConfigError, at
from appliance.origins import Origin
from appliance.transports import CONFIGURATION, Outcome, Transport, WakeRequest
from appliance.transports.apns import ApnsProfile, ApnsTransport
from appliance.transports.credentials import ProviderToken

from .config import delivery_profile, gateway_url_of, kind_profile
from .kinds import DRAFT_TRANSPORTS, KINDS, TransportContext, TransportKind


def _said_at(exc: ConfigError, origin: Origin) -> ConfigError:
    return exc if origin.origin in exc.hint else ConfigError(exc.name, exc.value, f"{exc.hint} (at {origin.origin})")


class Unconfigured:
    """The transport of a profile that cannot deliver: every send is a configuration fault."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail

    async def send(self, request: WakeRequest) -> Outcome:
        return Outcome(CONFIGURATION, reason=self.reason, detail=self.detail)

    async def close(self) -> None:
        pass


def file_signature(path: str | None) -> tuple:
    """What changes when a file is rewritten or replaced (None when it cannot be read)."""
    if not path or path.startswith("stored:"):
        return ()
    try:
        st = os.stat(path)
    except OSError:
        return (None,)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sharing_key(p: ApnsProfile, key_file: str) -> tuple:
    # The files' signatures too: a key or CA file changed on disk gets a transport that read it afresh.
    return (p.topic, p.environment, p.base_url, p.ca_file, p.key.team_id, p.key.key_id, key_file,
            file_signature(key_file), file_signature(p.ca_file))


class ProfileTransports:
    """(origin id, app profile id) -> Transport, rebuilt by `configure`."""

    def __init__(self, make_apns=ApnsTransport,
                 make_gateway: Callable[[int, str], Transport] | None = None, *,
                 kinds: dict[str, TransportKind] | None = None,
                 derive: Callable[[str], bytes] | None = None, store=None, keyfile=None,
                 wake_workers: int = 64):
        self._make_apns = make_apns
        #: (origin id, gateway_url) -> a gateway transport signing with that origin's relay key
        self._make_gateway = make_gateway
        self.kinds = KINDS if kinds is None else kinds
        self._derive = derive
        #: the store and key file the kinds keep their own keys in (TransportContext); Push sets them
        self.store, self.keyfile = store, keyfile
        self.wake_workers = wake_workers
        #: whether the draft transports (push.kinds.DRAFT_TRANSPORTS) are built: `configure` sets it
        self.drafts = False
        self._by_origin: dict[int, dict[str, Transport]] = {}
        self._shared: dict[tuple, Transport] = {}
        self._tokens: dict[tuple, ProviderToken] = {}
        #: the kinds' shared objects (TransportContext.shared), kept while a profile uses them
        self._objects: dict[tuple, object] = {}
        #: the files the profiles name (key_file, ca_file) and their signatures when last read
        self._files: dict[str, tuple] = {}

    def forget_files(self, paths: list[str]) -> None:
        """Take these files' current signatures as read (a change that failed to load is said once)."""
        for path in paths:
            if path in self._files:
                self._files[path] = file_signature(path)

    def files_changed(self) -> list[str]:
        """The key and CA files that changed on disk (rewritten, replaced, removed) since they were read."""
        return [path for path, sig in self._files.items() if file_signature(path) != sig]

    def get(self, origin_id: int, profile_id: str) -> Transport | None:
        return self._by_origin.get(origin_id, {}).get(profile_id)

    def is_off(self, transport: str) -> bool:
        """A draft transport while `push_draft_transports` is off: not advertised, not built."""
        return transport in DRAFT_TRANSPORTS and not self.drafts

    def configure(self, origins: list[Origin], stored_keys: dict[str, bytes] | None = None,
                  names: dict[int, str] | None = None, drafts: bool | None = None) -> list[Transport]:
        """Build the map for these origins (ConfigError if credentials do not load); returns the
        transports no longer used, for the caller to close on the event loop. `stored_keys` are the
        credentials kept in the database (fingerprint -> bytes: .p8 keys, service accounts).
        `drafts`: build the draft transports' profiles (the `push_draft_transports` setting)."""
        if drafts is not None:
            self.drafts = drafts
        by_origin: dict[int, dict[str, Transport]] = {}
        shared: dict[tuple, Transport] = {}
        tokens: dict[tuple, ProviderToken] = {}
        objects: dict[tuple, object] = {}
        files: dict[str, tuple] = {}
        for o in origins:  # before reading them: a change while they are read is seen next time
            for entry in o.push.get("app_profiles", []) if o.push else []:
                kind = self.kinds.get(entry.get("transport"))
                for name in ("key_file", "ca_file") + (kind.files if kind is not None else ()):
                    if isinstance(entry.get(name), str):
                        files[entry[name]] = file_signature(entry[name])

        def share(key: tuple, make: Callable[[], object]) -> object:
            obj = objects.get(key) or self._objects.get(key) or make()
            objects[key] = obj
            return obj

        for o in origins:
            if not o.push:
                continue
            table: dict[str, Transport] = {}
            for i, entry in enumerate(o.push.get("app_profiles", [])):
                pid = entry["id"]
                where = at((names or {}).get(o.id, "push"), f"app_profiles[{i}]")
                if self.is_off(entry["transport"]):
                    continue  # not advertised: no lease can name it, queued wakes are dropped
                kind = self.kinds.get(entry["transport"]) if entry["transport"] != "apns" else None
                if kind is not None:
                    try:
                        config = kind_profile(entry, where, stored_keys or {})
                    except ConfigError as exc:
                        raise _said_at(exc, o) from None
                    if config is None:
                        table[pid] = Unconfigured("no credentials", f"app profile {pid!r}: {kind.missing}")
                        continue
                    sigs = tuple(file_signature(entry.get(name)) for name in kind.files)
                    key = (kind.name,) + tuple(kind.share_key(config, o.id)) + sigs
                    transport = shared.get(key) or self._shared.get(key)
                    if transport is None:
                        transport = kind.build(config, TransportContext(o.id, share, self._derive, self.store, self.keyfile,
                                                                        self.wake_workers))
                    shared[key] = table[pid] = transport
                    continue
                try:
                    url = gateway_url_of(entry, where)
                except ConfigError as exc:
                    raise _said_at(exc, o) from None
                if url is not None:
                    if self._make_gateway is None:
                        table[pid] = Unconfigured("no gateway transport", f"app profile {pid!r}: gateway delivery "
                                                  "is not wired in this process")
                        continue
                    key = ("gateway", o.id, url)  # one client per origin: each signs with its relay key
                    transport = shared.get(key) or self._shared.get(key) or self._make_gateway(o.id, url)
                    shared[key] = table[pid] = transport
                    continue
                try:
                    profile = delivery_profile(entry, where, stored_keys or {})
                except ConfigError as exc:
                    raise _said_at(exc, o) from None
                if profile is None:
                    if entry["transport"] == "apns":
                        table[pid] = Unconfigured("no credentials", f"app profile {pid!r} has no APNs credentials "
                                                  "(topic, team_id, key_id, key_file, environment)")
                    else:
                        table[pid] = Unconfigured("unsupported transport", f"app profile {pid!r}: this appliance has "
                                                  f"no {entry['transport']} transport")
                    continue
                tkey = profile.key.identity
                token = tokens.get(tkey) or self._tokens.get(tkey) or ProviderToken(profile.key)
                tokens[tkey] = token
                key = _sharing_key(profile, entry.get("key_file") or "stored:" + entry["key_stored"])
                transport = shared.get(key) or self._shared.get(key)
                if transport is None:
                    transport = self._make_apns(profile, token=token)
                shared[key] = transport
                table[pid] = transport
            by_origin[o.id] = table
        retired = [t for k, t in self._shared.items() if k not in shared]
        # Shared objects with connections of their own (an FCM access token's) close with them.
        retired += [o for k, o in self._objects.items() if k not in objects and hasattr(o, "close")]
        self._by_origin, self._shared, self._tokens, self._files = by_origin, shared, tokens, files
        self._objects = objects
        return retired

    def all(self) -> list[Transport]:
        """Every transport, and every shared object that has connections to close."""
        return list(self._shared.values()) + [o for o in self._objects.values() if hasattr(o, "close")]
