"""`appliance push make-lease|test-wake|try`: push from the command line.

- `make-lease` prints a signed kind 30350 lease for a test device, NIP-44 encrypted to the
  origin's current executor key. The descriptor (origin string, keys, profiles) is read from the
  running appliance's NIP-11 (its listen address from the data directory's instance record), else
  from the data directory itself, else from the origin URL. `--publish` also sends it (NIP-42 AUTH
  as the identity) and prints the relay's OK.
- `test-wake` is the dashboard's "send a test wake": one wake with the constant body to a token,
  through the profile's own credentials (a .p8 uploaded in the dashboard included), printing the
  provider's answer.
- `try` is the two-minute demo on a temporary data directory (`appliance.commands.push_try`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from appliance.errors import ApplianceError, ConfigError
from appliance.settings import Settings

LEASE_KIND = 30350
AUTH_KIND = 22242
# A test device's lease lives a day unless asked otherwise (capped by the descriptor's max_lease_ttl).
DEFAULT_TTL = 86400
# Seconds a test wake may wait for the provider's answer (as the dashboard's).
TEST_WAKE_TIMEOUT = 35.0
# Seconds the provider may hold a test wake (apns-expiration): it is worth nothing later.
TEST_WAKE_EXPIRY = 60
# Seconds to wait for the relay (NIP-11, AUTH, OK).
RELAY_TIMEOUT = 15.0


class PushCommandError(ApplianceError):
    """A push command that cannot do what was asked (the message says why)."""


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    sub = parser.add_subparsers(dest="push_command", metavar="ACTION", required=True)
    make = sub.add_parser(
        "make-lease", help="Print a signed push lease (kind 30350) for a test device.",
        description="Print a signed kind 30350 lease for a test device, NIP-44 encrypted to the origin's current "
        "executor key (read from the running appliance's NIP-11, or the data directory), ready to publish. "
        "Its one subscription wakes the device for events of --kinds that tag the identity (#p).")
    make.add_argument("--origin", metavar="URL",
                      help="The origin (relay URL) the lease is for. Default: the running appliance's relay URL.")
    make.add_argument("--profile", required=True, metavar="ID", help="The app profile id, e.g. com.example.app/ios.")
    make.add_argument("--token", required=True, metavar="HEX", help="The device's push token (APNs: hex).")
    make.add_argument("--identity", required=True, metavar="FILE",
                      help="File holding the device user's secret key (64 hex or nsec); the lease is signed with it.")
    make.add_argument("--kinds", metavar="K,K", help="Event kinds that wake the device (default: every push kind "
                      "the descriptor allows).")
    make.add_argument("--ttl", type=int, default=DEFAULT_TTL, metavar="S",
                      help=f"Seconds the lease lives (default {DEFAULT_TTL}, at most the descriptor's max_lease_ttl).")
    make.add_argument("--class", dest="wake_class", metavar="CLASS",
                      help="Priority class of the subscription (default: default, if the profile supports it).")
    make.add_argument("--d", dest="d", metavar="D", help="Lease address to replace (the d printed by an earlier "
                      "make-lease); default: a new random one.")
    make.add_argument("--publish", action="store_true",
                      help="Also publish it to the origin (NIP-42 AUTH as the identity) and print the relay's answer.")
    add_setting_flags(make)
    wake = sub.add_parser(
        "test-wake", help="Send one test wake to a device token and print the provider's answer.",
        description="The dashboard's test wake from the command line: one wake with the constant body to TOKEN "
        "through the app profile's credentials (also those uploaded in the dashboard), then the provider's answer. "
        "Exit 0 when the provider accepted it, 1 when not.")
    wake.add_argument("url", nargs="?", metavar="URL",
                      help="The origin whose app profile sends it. Default: the running appliance's relay URL.")
    wake.add_argument("--profile", required=True, metavar="ID", help="The APNs app profile id.")
    wake.add_argument("--token", required=True, metavar="HEX", help="The device token to wake.")
    add_setting_flags(wake)
    from appliance.commands import push_try

    push_try.add_parser(sub)


# -- the descriptor -----------------------------------------------------------------------------------


@dataclass
class Descriptor:
    """What a lease needs of an origin's NIP-11 `push` descriptor, and where it came from."""

    push: dict
    source: str

    @property
    def origin(self) -> str:
        return self.push["origin"]

    def current_key(self) -> tuple[str, str]:
        for k in self.push.get("keys", []):
            if k.get("current"):
                return k["id"], k["pubkey"]
        raise PushCommandError(f"the descriptor of {self.origin} advertises no current executor key")

    def profile(self, profile_id: str) -> dict:
        profiles = self.push.get("app_profiles", [])
        for p in profiles:
            if p.get("id") == profile_id:
                return p
        known = ", ".join(p.get("id", "?") for p in profiles) or "none"
        raise PushCommandError(f"no app profile {profile_id!r} at {self.origin} (its app profiles: {known})")


def _http_url(origin: str) -> str:
    return origin.replace("wss://", "https://", 1).replace("ws://", "http://", 1)


def fetch_nip11(origin: str, address: str | None = None) -> dict:
    """The NIP-11 document of `origin`, asked at `address` (HOST:PORT of the running appliance,
    with the origin's Host) or at the origin URL itself."""
    import httpx

    parts = urlsplit(origin)
    url = f"http://{address}{parts.path or '/'}" if address else _http_url(origin)
    headers = {"Accept": "application/nostr+json"}
    if address:
        headers["Host"] = parts.netloc
    r = httpx.get(url, headers=headers, timeout=RELAY_TIMEOUT)
    r.raise_for_status()
    return r.json()


def descriptor_from_data(settings: Settings, origin: str) -> Descriptor | None:
    """The descriptor as the data directory holds it (None when it knows no such push origin)."""
    from appliance.commands import open_data
    from appliance.origins import UnknownOrigin
    from appliance.push import keys as keystore
    from appliance.push.config import build_descriptor
    from appliance.push.descriptor import descriptor_to_json

    with open_data(settings) as (store, registry):
        try:
            o = registry.by_origin(origin)
        except UnknownOrigin:
            return None
        if not o.push:
            raise PushCommandError(f"push is not enabled at {origin} (add a push table)")
        now = int(time.time())
        keys = keystore.advertised(store.read_sync(lambda conn: keystore.list_keys(conn, o.id)), now)
        if not keys:
            raise PushCommandError(f"{origin} has no executor key yet: start the appliance once to make it")
        return Descriptor(descriptor_to_json(build_descriptor(o.origin, o.push, keys, drafts=settings.push_draft_transports)),
                          "the data directory")


def find_descriptor(settings: Settings, origin: str | None, running: dict | None) -> Descriptor:
    """The push descriptor of `origin`: the running appliance's NIP-11, the data directory, or the
    origin URL's own NIP-11, in that order."""
    import httpx

    if origin is None:
        if not running:
            raise PushCommandError("no appliance runs on this data directory: give --origin URL (or --data-dir)")
        origin = running["relay_url"]
    tried = []
    if running and running.get("listen"):
        try:
            doc = fetch_nip11(origin, running["listen"][0])
            if "push" in doc:
                return Descriptor(doc["push"], f"the running appliance's NIP-11 (pid {running['pid']})")
            tried.append("the running appliance advertises no push descriptor for it")
        except (httpx.HTTPError, ValueError) as exc:
            tried.append(f"the running appliance did not answer ({exc})")
    if settings.data_path.exists():
        found = descriptor_from_data(settings, origin)
        if found is not None:
            return found
        tried.append(f"the data directory {settings.data_path} has no origin {origin}")
    try:
        doc = fetch_nip11(origin)
    except (httpx.HTTPError, ValueError) as exc:
        tried.append(f"{_http_url(origin)} did not answer ({exc})")
        raise PushCommandError(f"no push descriptor for {origin}: " + "; ".join(tried)) from None
    if "push" not in doc:
        raise PushCommandError(f"{origin} advertises no push descriptor (NIP-11 has no \"push\")")
    return Descriptor(doc["push"], f"{_http_url(origin)} (NIP-11)")


# -- the lease -------------------------------------------------------------------------------------------


def new_d() -> str:
    """A fresh lease address: 128 random bits (NIP-PL: never derived from the token)."""
    return secrets.token_urlsafe(16)


def make_lease(secret: str, desc: Descriptor, *, profile_id: str, token: str, kinds: list[int] | None = None,
               ttl: int = DEFAULT_TTL, wake_class: str | None = None, d: str | None = None,
               now: int | None = None) -> tuple[dict, dict]:
    """(signed kind 30350 event as JSON, its plaintext) for one test device."""
    from appliance.nostr import nip44
    from appliance.nostr.event import sign_event
    from appliance.nostr.keys import public_key

    now = int(time.time()) if now is None else now
    profile = desc.profile(profile_id)
    key_id, key_pub = desc.current_key()
    push_kinds = list(desc.push.get("push_kinds", []))
    kinds = push_kinds if kinds is None else kinds
    refused = [k for k in kinds if k not in push_kinds]
    if not kinds or refused:
        raise PushCommandError(f"kind(s) {refused or kinds} cannot wake a device at {desc.origin} (its push kinds: "
                               f"{push_kinds})")
    limit = desc.push.get("limitation", {}).get("max_lease_ttl")
    if ttl <= 0 or (limit and ttl > limit):
        raise PushCommandError(f"--ttl {ttl}: expected 1 to {limit} seconds (the descriptor's max_lease_ttl)")
    supported = desc.push.get("class_support", {}).get(profile["transport"], [])
    if wake_class is None:
        wake_class = "default" if "default" in supported or not supported else supported[0]
    if not token:
        raise PushCommandError("--token: expected the device's push token")
    pubkey = public_key(secret)
    plaintext = {
        "v": 1,
        "origin": desc.origin,
        "app_profile": profile["id"],
        "transport": profile["transport"],
        "endpoint": token,
        # Strictly increasing per address: a later make-lease with the same --d replaces this one.
        "generation": now,
        "active": True,
        "subscriptions": [{"filter": {"kinds": kinds, "#p": [pubkey]}, "class": wake_class}],
    }
    content = nip44.encrypt(json.dumps(plaintext, separators=(",", ":")),
                            nip44.get_conversation_key(secret, key_pub))
    tags = [["d", d or new_d()], ["expiration", str(now + ttl)], ["exec", key_id], ["alt", "Push lease"]]
    return sign_event(secret, LEASE_KIND, tags, content, created_at=now).to_dict(), plaintext


# -- talking to the relay ---------------------------------------------------------------------------------


class RelayClient:
    """One websocket to an origin (at the running appliance's address, with the origin's Host, or
    at the origin URL itself), authenticated with NIP-42 as one identity."""

    def __init__(self, origin: str, address: str | None = None):
        self.origin = origin
        self.address = address
        self.ws = None
        self.challenge: str | None = None
        self.backlog: list = []

    async def __aenter__(self) -> "RelayClient":
        import websockets

        parts = urlsplit(self.origin)
        if self.address:
            host, _, port = self.address.rpartition(":")
            uri = f"ws://{parts.netloc}{parts.path or '/'}"
            self.ws = await websockets.connect(uri, host=host.strip("[]"), port=int(port), max_size=None,
                                               open_timeout=RELAY_TIMEOUT)
        else:
            self.ws = await websockets.connect(self.origin, max_size=None, open_timeout=RELAY_TIMEOUT)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()

    async def recv(self) -> list:
        return json.loads(await asyncio.wait_for(self.ws.recv(), RELAY_TIMEOUT))

    async def expect(self, predicate) -> list:
        for i, msg in enumerate(self.backlog):
            if predicate(msg):
                return self.backlog.pop(i)
        while True:
            msg = await self.recv()
            if predicate(msg):
                return msg
            if msg and msg[0] == "AUTH" and len(msg) > 1:
                self.challenge = msg[1]
            else:
                self.backlog.append(msg)

    async def auth(self, secret: str) -> None:
        from appliance.nostr.event import sign_event

        if self.challenge is None:
            msg = await self.expect(lambda m: m and m[0] == "AUTH")
            self.challenge = msg[1]
        ev = sign_event(secret, AUTH_KIND, [["relay", self.origin], ["challenge", self.challenge]], "")
        await self.ws.send(json.dumps(["AUTH", ev.to_dict()]))
        ok = await self.expect(lambda m: m and m[0] == "OK" and m[1] == ev.id)
        if ok[2] is not True:
            raise PushCommandError(f"the relay refused the NIP-42 AUTH: {ok[3]}")

    async def publish(self, event: dict) -> tuple[bool, str]:
        await self.ws.send(json.dumps(["EVENT", event]))
        ok = await self.expect(lambda m: m and m[0] == "OK" and m[1] == event["id"])
        return bool(ok[2]), str(ok[3])


# -- the test wake ---------------------------------------------------------------------------------------------


def token_fingerprint(token: str) -> str:
    from appliance.commands.emulator import token_fingerprint as fp

    return fp(token)


async def send_test_wake(transport, token: str) -> tuple[object | None, str, float]:
    """(outcome or None on timeout, apns-id, milliseconds) of one test wake."""
    from appliance.transports import WakeRequest

    request_id = str(uuid.uuid4())
    started = time.monotonic()
    try:
        outcome = await asyncio.wait_for(transport.send(WakeRequest(
            endpoint=token, request_id=request_id, expires_at=int(time.time()) + TEST_WAKE_EXPIRY)),
            TEST_WAKE_TIMEOUT)
    except asyncio.TimeoutError:
        outcome = None
    return outcome, request_id, (time.monotonic() - started) * 1000


def describe_outcome(outcome, request_id: str, ms: float, id_name: str = "apns-id") -> str:
    """The provider's answer to a test wake, in one line."""
    from appliance.transports import ACCEPTED

    if outcome is None:
        return f"not sent: no answer within {TEST_WAKE_TIMEOUT:.0f} s ({id_name} {request_id})"
    answer = f"the provider answered {outcome.status}" + (f" {outcome.reason}" if outcome.reason else "")
    if outcome.kind == ACCEPTED:
        return f"sent: {answer} ({id_name} {request_id}, {ms:.0f} ms)"
    shown = outcome.detail.replace("; not sent", "")
    if outcome.status is None:
        why = outcome.reason or outcome.kind
        detail = f": {shown}" if shown else ""
        return f"not sent ({outcome.kind}): {why}{detail}"
    detail = f"; {shown}" if shown else ""
    return f"not accepted ({outcome.kind}): {answer} ({id_name} {request_id}, {ms:.0f} ms){detail}"


def profile_transport(settings: Settings, origin_url: str, profile_id: str):
    """(transport, origin) of an app profile at an origin of the data directory, built from its
    stored configuration and credentials (a .p8 or service account uploaded in the dashboard
    included): APNs, and the draft transports (fcm) while push_draft_transports is on."""
    from appliance.commands import find_origin, open_data
    from appliance.push.profiles import ProfileTransports
    from appliance.relay.groups import RelayKeys
    from appliance.store.credentials import load_apns_keys
    from appliance.store.keyfile import KeyFile
    from appliance.transports.gateway import GatewayTransport

    with open_data(settings) as (store, registry):
        origin = find_origin(registry, origin_url)
        entry = next((p for p in (origin.push or {}).get("app_profiles", []) if p.get("id") == profile_id), None)
        if entry is not None and entry.get("transport") == "fcm":
            if not settings.push_draft_transports:
                raise ConfigError("profile", profile_id, "fcm is a draft transport, off while "
                                  "push_draft_transports is false: turn it on to send through this profile")
        elif entry is None or entry.get("transport") != "apns":
            known = ", ".join(p["id"] for p in (origin.push or {}).get("app_profiles", [])
                              if p.get("transport") == "apns") or "none"
            raise ConfigError("profile", profile_id, f"no APNs app profile of that name at {origin.origin} "
                              f"(its APNs profiles: {known})")
        keyfile = KeyFile.for_store(settings.data_path, store)
        stored = store.read_sync(lambda conn: load_apns_keys(conn, keyfile))
        relay_keys = RelayKeys(keyfile)
        secret, _pub = store.write_sync(lambda conn: relay_keys.get(conn, origin.id))
        transports = ProfileTransports(make_gateway=lambda _oid, url: GatewayTransport(url, lambda: secret))
        transports.configure([origin], stored, drafts=settings.push_draft_transports)
        return transports.get(origin.id, profile_id), origin


def run(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.commands import follow_running

    running = follow_running(settings)
    if args.push_command == "make-lease":
        return _run_make_lease(args, settings, running)
    return _run_test_wake(args, settings, running)


def _run_make_lease(args: argparse.Namespace, settings: Settings, running: dict | None) -> int:
    from pathlib import Path

    from appliance.nostr.nip19 import Nip19Error, parse_secret

    try:
        secret = parse_secret(Path(args.identity).read_text())
    except OSError as exc:
        raise PushCommandError(f"--identity {args.identity}: cannot read it: {exc.strerror or exc}") from None
    except (Nip19Error, UnicodeDecodeError) as exc:
        raise PushCommandError(f"--identity {args.identity}: {exc}") from None
    kinds = None
    if args.kinds:
        try:
            kinds = [int(k) for k in args.kinds.replace(" ", "").split(",") if k]
        except ValueError:
            raise PushCommandError(f"--kinds {args.kinds!r}: expected kind numbers separated by commas") from None
    desc = find_descriptor(settings, args.origin, running)
    event, plaintext = make_lease(secret, desc, profile_id=args.profile, token=args.token.strip(), kinds=kinds,
                                  ttl=args.ttl, wake_class=args.wake_class, d=args.d)
    print(json.dumps(event), flush=True)
    d = next(t[1] for t in event["tags"] if t[0] == "d")
    key_id = next(t[1] for t in event["tags"] if t[0] == "exec")
    print(f"appliance: a lease for app profile {args.profile} at {desc.origin} (d {d}, generation "
          f"{plaintext['generation']}, kinds {plaintext['subscriptions'][0]['filter']['kinds']}, token "
          f"{token_fingerprint(args.token.strip())}), encrypted to executor key {key_id} from {desc.source}; "
          + ("publishing it" if args.publish else "publish it as this identity (NIP-42 AUTH), or again with --publish"),
          file=sys.stderr)
    if not args.publish:
        return 0

    async def publish() -> tuple[bool, str]:
        address = running["listen"][0] if running and running.get("listen") else None
        async with RelayClient(desc.origin, address) as relay:
            await relay.auth(secret)
            return await relay.publish(event)

    ok, message = asyncio.run(publish())
    print(f"OK {'true' if ok else 'false'} {message}".rstrip(), flush=True)
    return 0 if ok else 1


def _run_test_wake(args: argparse.Namespace, settings: Settings, running: dict | None) -> int:
    url = args.url or (running or {}).get("relay_url")
    if not url:
        raise PushCommandError("no appliance runs on this data directory: give the origin URL")
    token = args.token.strip()
    transport, origin = profile_transport(settings, url, args.profile)

    async def wake():
        try:
            return await send_test_wake(transport, token)
        finally:
            await transport.close()
            shared = getattr(transport, "token", None)  # an FCM access token has a connection of its own
            if hasattr(shared, "close"):
                await shared.close()

    outcome, request_id, ms = asyncio.run(wake())
    if outcome is not None:
        # The profile's health takes the answer as the dashboard's test wake does: an accepted one
        # clears its alerts (a fixed configuration), a refused connection makes it failing.
        from appliance.commands import open_data
        from appliance.push.delivery import note_health

        with open_data(settings) as (store, _registry):
            store.write_sync(lambda conn: note_health(conn, origin.id, args.profile, outcome, time.time()))
    print(f"test wake to token {token_fingerprint(token)} through {args.profile} at {origin.origin}", flush=True)
    kind = next(p["transport"] for p in origin.push["app_profiles"] if p["id"] == args.profile)
    print(describe_outcome(outcome, request_id, ms, "apns-id" if kind == "apns" else "request id"), flush=True)
    from appliance.transports import ACCEPTED

    return 0 if outcome is not None and outcome.kind == ACCEPTED else 1
