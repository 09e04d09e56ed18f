"""UnifiedPush delivery (draft profile): RFC 8030 Web Push of one constant, encrypted message.

A lease's endpoint is the distributor's push URL with the subscription's Web Push keys in its
fragment (NIP-PL's lease plaintext has no other place for them; a fragment is never sent):

    https://push.example.net/up/AbC123?x=1#p256dh=<65-byte P-256 point, base64url>&auth=<16 bytes, base64url>

Every attempt is one request, the same but for the encryption's randomness (salt, sender key):

    POST <the push URL, fragment removed>      sent to the one address the host resolved to
    Host: <host[:port]>                        (TLS SNI and certificate check: the host name)
    TTL: <seconds left of the job's useful age>
    Urgency: high
    Content-Encoding: aes128gcm
    Content-Type: application/octet-stream
    Authorization: vapid t=<ES256 JWT: aud = the push URL's origin, exp <= 24 h, sub = operator contact>, k=<key>
    <body: UNIFIEDPUSH_PLAINTEXT encrypted to the subscription (RFC 8291)>

The endpoint is chosen by whoever holds a lease, so it is treated as hostile (each rule tested in
tests/transports/test_unifiedpush.py): https only (http only to an allowlisted host); the host
resolved once per attempt, every address it resolves to checked (no loopback, private,
link-local, multicast, unspecified, reserved or otherwise non-global address unless the host is
allowlisted) and the request sent to that address (no second resolution, no proxy from the
environment); no redirect followed; DEFAULT_TIMEOUT seconds for the whole attempt; at most
MAX_RESPONSE_BYTES of the answer's body read; a per-host rate cap (token bucket). Logs name the
host only: a push URL is a capability.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import re
import socket
import ssl
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from .apns import load_ca_file, parse_retry_after
from .base import ACCEPTED, INVALID_ENDPOINT, PERMANENT, TRANSIENT, Outcome, ProfileError, WakeRequest
from .credentials import CredentialError
from .webpush import VapidKey, b64url_decode, encrypt, load_p256_public

log = logging.getLogger("appliance.transports")

__all__ = [
    "DEFAULT_HOST_RATE",
    "DEFAULT_TIMEOUT",
    "MAX_RESPONSE_BYTES",
    "UNIFIEDPUSH_PLAINTEXT",
    "EndpointError",
    "HostRates",
    "InFlight",
    "PushSubscription",
    "UnifiedPushProfile",
    "UnifiedPushTransport",
    "PROFILE_FIELDS",
    "check_vapid_subject",
    "classify",
    "forbidden_address",
    "load_profile",
    "parse_endpoint",
]

#: This profile's constant: the plaintext of every message (docs/spec-notes.md, UnifiedPush draft).
UNIFIEDPUSH_PLAINTEXT = b'{"nip-pl":"wake"}'

#: Seconds one attempt may take, resolution, connection, TLS and answer included.
DEFAULT_TIMEOUT = 5.0
#: Bytes of an answer's body read at most (the status and Retry-After are all that is used); past
#: them the connection is dropped (docs/spec-notes.md U5 says what still crosses the network).
MAX_RESPONSE_BYTES = 4096
#: Requests per second to one push host (a token bucket of DEFAULT_HOST_BURST), unless the profile
#: says otherwise: a lease cannot turn the appliance into a flood aimed at one host.
DEFAULT_HOST_RATE = 10.0
DEFAULT_HOST_BURST = 20
#: The longest TTL asked of a push service (RFC 8030 leaves it to the server; a wake's useful age
#: is far shorter anyway).
MAX_TTL = 4 * 7 * 24 * 3600
#: VAPID tokens: valid 12 hours (RFC 8292: at most 24), remade once less than 6 hours are left.
VAPID_LIFETIME = 12 * 3600
VAPID_RENEW = 6 * 3600
#: Connections kept open at most (one pool per (host, port, address)); the least used is closed.
MAX_CLIENTS = 64
#: Requests in flight (each on its own HTTP/1.1 connection) to one (host, port, address) at most:
#: the HTTP client checks every pooled connection at each request, so more cost CPU per wake
#: (docs/performance.md#connections_per_host).
CONNECTIONS_PER_HOST = 8

_UA_PUBLIC_LEN, _AUTH_LEN = 65, 16
# host: a DNS name (ASCII labels; an IDN in its xn-- form), an IPv4 literal or a bracketed IPv6 one.
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOST = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}\.?|\[[0-9A-Fa-f:.]+\]")
# path and query: RFC 3986 pchar (percent-escapes checked apart), '/' and '?' (query only).
_PATH = re.compile(r"(?:/[A-Za-z0-9\-._~!$&'()*+,;=:@%]*)*")
_QUERY = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@%/?]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_FRAGMENT = re.compile(r"p256dh=([A-Za-z0-9_-]+)&auth=([A-Za-z0-9_-]+)")
_AUTHORITY = re.compile(r"(?P<host>\[[^\]]*\]|[^:]*)(?::(?P<port>[0-9]{1,5}))?")


class EndpointError(ValueError):
    """A lease endpoint that is not this profile's push URL with its keys; the message says why
    (never the endpoint itself: it is a capability)."""


@dataclass(frozen=True)
class PushSubscription:
    """A parsed UnifiedPush endpoint."""

    scheme: str  # "https" (or "http", sent only to an allowlisted host)
    host: str  # lowercase; an IPv6 literal without brackets
    port: int
    target: str = field(repr=False)  # path and query, as given (part of the capability)
    p256dh: bytes = field(repr=False)
    auth: bytes = field(repr=False)

    @property
    def authority(self) -> str:
        """host[:port] as the Host header names it (the port only when it is not the scheme's)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"

    @property
    def origin(self) -> str:
        """The push resource's origin (RFC 6454 serialisation): the VAPID `aud`."""
        return f"{self.scheme}://{self.authority}"


def parse_endpoint(endpoint: str) -> PushSubscription:
    """Parse a lease endpoint strictly; EndpointError for anything but exactly this grammar:

        ("https" | "http") "://" host [":" port] [path ["?" query]] "#p256dh=" B64URL "&auth=" B64URL

    B64URL is unpadded, canonical base64url; p256dh is an uncompressed P-256 point on the curve
    (65 bytes), auth 16 bytes. No user info, no whitespace or other character outside RFC 3986,
    well-formed percent-escapes, an ASCII host (an IDN in its xn-- form)."""
    if not isinstance(endpoint, str) or not endpoint.isascii() or not endpoint.isprintable() or " " in endpoint:
        raise EndpointError("not a push URL: only printable ASCII without spaces")
    url, sep, fragment = endpoint.partition("#")
    if not sep:
        raise EndpointError("no subscription keys: the push URL must end in #p256dh=...&auth=...")
    keys = _FRAGMENT.fullmatch(fragment)
    if keys is None:
        raise EndpointError("the fragment must be exactly p256dh=<base64url>&auth=<base64url>")
    try:
        p256dh, auth = b64url_decode(keys.group(1)), b64url_decode(keys.group(2))
    except ValueError:
        raise EndpointError("the subscription keys are not canonical unpadded base64url") from None
    if len(p256dh) != _UA_PUBLIC_LEN or len(auth) != _AUTH_LEN:
        raise EndpointError("p256dh must be a 65-byte P-256 point and auth 16 bytes")
    try:
        load_p256_public(p256dh)
    except ValueError:
        raise EndpointError("p256dh is not a point on P-256") from None
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("https", "http"):
        raise EndpointError("the push URL must be https:// (or http:// to an allowlisted host)")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, target = rest[:cut], rest[cut:]
    if "@" in authority:
        raise EndpointError("the push URL must not carry user information")
    m = _AUTHORITY.fullmatch(authority)
    if m is None or not m.group("host") or _HOST.fullmatch(m.group("host")) is None:
        raise EndpointError("the push URL has no valid host")
    host = m.group("host").lower()
    if host.startswith("["):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise EndpointError("the push URL's IPv6 address is not valid") from None
    host = host.rstrip(".")
    port_text = m.group("port")
    if port_text is not None and (not port_text or port_text[0] == "0" or not 1 <= int(port_text) <= 65535):
        raise EndpointError("the push URL's port must be 1 to 65535 (no leading zero)")
    port = int(port_text) if port_text else (443 if scheme == "https" else 80)
    path, _, query = target.partition("?")
    if (_PATH.fullmatch(path) is None or _QUERY.fullmatch(query) is None or _BAD_ESCAPE.search(target)):
        raise EndpointError("the push URL's path or query has characters RFC 3986 does not allow")
    return PushSubscription(scheme, host, port, target or "/", p256dh, auth)


def check_endpoint(endpoint: str) -> None:
    """Acceptance-time shape check of a lease endpoint (EndpointError); nothing is resolved."""
    parse_endpoint(endpoint)


def forbidden_address(address: str) -> str | None:
    """Why a resolved address may not be sent to (loopback, private, ...), or None if it may."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address in IPv6 form reaches that IPv4 host: judge it as such.
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None:
            why = forbidden_address(str(embedded))
            if why:
                return why
    # site_local: fec0::/10 (deprecated by RFC 3879, still routed inside some networks, and not in
    # ipaddress's private or reserved lists).
    for what in ("loopback", "private", "link_local", "site_local", "multicast", "unspecified", "reserved"):
        if getattr(ip, f"is_{what}", False):
            return what.replace("_", "-")
    if not ip.is_global:  # shared address space (100.64/10) and the like
        return "not global"
    return None


def check_vapid_subject(value: object) -> str:
    """The VAPID `sub`: a mailto: or https: URI where the push service can reach the operator."""
    if not isinstance(value, str) or not value.isascii() or not value.isprintable() or " " in value:
        raise CredentialError("vapid_subject must be a mailto: or https: URI (ASCII, no spaces)")
    if not (re.fullmatch(r"mailto:[^@\s]+@[^@\s]+", value) or re.fullmatch(r"https://[^/\s]+(/\S*)?", value)):
        raise CredentialError("vapid_subject must be mailto:operator@example.org or an https:// URL "
                              "(RFC 8292: how the push service reaches the operator)")
    return value


class HostRates:
    """A token bucket per push host: `rate` requests per second, bursts of `burst`."""

    MAX_HOSTS = 4096

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst < 1:
            raise ValueError("a host rate is positive and a burst at least 1")
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # host -> (tokens, at)

    def take(self, host: str) -> float:
        """0 if a request to `host` may go now (one token taken), else the seconds until it may."""
        now = self.clock()
        tokens, at = self._buckets.pop(host, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens >= 1.0:
            self._buckets[host] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[host] = (tokens, now)
            wait = (1.0 - tokens) / self.rate
        if len(self._buckets) > self.MAX_HOSTS:
            # The least recently used host: its bucket has refilled longest, so forgetting it
            # (a full bucket next time) costs the least.
            self._buckets.popitem(last=False)
        return wait


class InFlight:
    """Attempts under way, at most `limit` in all and `per_host` to one push host; an attempt waits
    a moment for a slot (`acquire`), never the length of a stalled attempt."""

    #: Retry-After of an attempt refused because the limit is reached.
    RETRY = 1.0
    #: How long an attempt waits for a slot: long enough for an answering host's slots to turn
    #: over (so a busy host is not turned back), short enough that a stalled one holds no worker.
    WAIT = 0.25

    def __init__(self, limit: int, per_host: int):
        if limit < 1 or per_host < 1:
            raise ValueError("in-flight limits are at least 1")
        self.limit, self.per_host = limit, per_host
        self.total = 0
        self.hosts: dict[str, int] = {}
        self._waiters: list[asyncio.Future] = []

    async def acquire(self, host: str, wait: float | None = None) -> bool:
        """`enter`, waiting up to `wait` seconds (WAIT) for a slot to be left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.WAIT if wait is None else wait)
        while not self.enter(host):
            left = deadline - loop.time()
            if left <= 0:
                return False
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return False
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return True

    def enter(self, host: str) -> bool:
        """True if an attempt to `host` may start now (then `leave` it), False if it may not."""
        if self.total >= self.limit or self.hosts.get(host, 0) >= self.per_host:
            return False
        self.total += 1
        self.hosts[host] = self.hosts.get(host, 0) + 1
        return True

    def leave(self, host: str) -> None:
        self.total -= 1
        left = self.hosts[host] - 1
        if left:
            self.hosts[host] = left
        else:
            del self.hosts[host]
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # each tries again (the slot may suit only some of them)
            if not waiter.done():
                waiter.set_result(None)


Resolver = Callable[[str, int], Awaitable[list[str]]]


#: Name resolutions in flight at most, each on a thread of its own pool: getaddrinfo cannot be
#: interrupted (a timeout abandons it, the thread stays blocked until the resolver gives up), so a
#: lease's name whose DNS never answers must not hold the default pool that asyncio.to_thread uses.
RESOLVER_THREADS = 4
#: Retry-After of an attempt refused because every resolver thread is busy.
RESOLVER_BUSY_RETRY = 2.0
_resolver_pool = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="unifiedpush-dns")
_resolver_slots = threading.BoundedSemaphore(RESOLVER_THREADS)


class ResolverBusy(Exception):
    """Every resolver thread is taken (names that do not answer): this attempt is not made."""


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (TCP), by the system resolver, in its order; ResolverBusy
    at once if RESOLVER_THREADS resolutions are already under way."""
    if not _resolver_slots.acquire(blocking=False):
        raise ResolverBusy()
    try:
        future = _resolver_pool.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except BaseException:
        _resolver_slots.release()
        raise
    # Released when the thread is done, not when the attempt gives up on it.
    future.add_done_callback(lambda _done: _resolver_slots.release())
    infos = await asyncio.wrap_future(future)
    return [info[4][0] for info in infos]


@dataclass(frozen=True)
class UnifiedPushProfile:
    """What one `transport = "unifiedpush"` app profile configures."""

    profile_id: str
    vapid_subject: str  # the operator contact every VAPID token names (RFC 8292 `sub`)
    allow_hosts: frozenset[str] = frozenset()  # may be http and resolve to non-global addresses
    host_rate: float = DEFAULT_HOST_RATE
    host_burst: int = DEFAULT_HOST_BURST
    ca_file: str | None = None  # extra CA bundle trusted for push hosts (a test distributor)

    def ssl_context(self) -> ssl.SSLContext:
        import certifi

        ctx = ssl.create_default_context(cafile=certifi.where())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca_file:
            load_ca_file(ctx, self.ca_file)
        return ctx


#: The settings of a `transport = "unifiedpush"` app profile (besides id and transport).
PROFILE_FIELDS = ("vapid_subject", "allow_hosts", "host_rate", "host_burst", "ca_file")
#: Highest host_rate / host_burst accepted: a cap far above this is no cap.
MAX_HOST_RATE = 100_000


def _allowed_host(value: object) -> str:
    if isinstance(value, str):
        host = value.lower()
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            if _HOST.fullmatch(host) and not host.startswith("[") and not host.endswith("."):
                return host
    raise ProfileError("allow_hosts", f"{value!r} is not a host name or IP address (no scheme, port or path)")


def load_profile(entry: dict, stored=None) -> UnifiedPushProfile:
    """The UnifiedPushProfile of an `app_profiles` entry (push.kinds); ProfileError naming the field."""
    pid = entry.get("id")
    if "vapid_subject" not in entry:
        raise ProfileError("vapid_subject", "a UnifiedPush profile needs vapid_subject, the operator contact "
                           "every VAPID token names (mailto:you@example.org or an https:// URL)")
    try:
        subject = check_vapid_subject(entry["vapid_subject"])
    except CredentialError as exc:
        raise ProfileError("vapid_subject", str(exc)) from None
    hosts = entry.get("allow_hosts", [])
    if not isinstance(hosts, list):
        raise ProfileError("allow_hosts", "expected a list of host names that may be http:// and resolve to "
                           "private or loopback addresses (a distributor on your own network)")
    allow = frozenset(_allowed_host(h) for h in hosts)
    rate = entry.get("host_rate", DEFAULT_HOST_RATE)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= MAX_HOST_RATE:
        raise ProfileError("host_rate", f"expected requests per second to one push host, above 0 and at most "
                           f"{MAX_HOST_RATE}")
    burst = entry.get("host_burst", DEFAULT_HOST_BURST)
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_HOST_RATE:
        raise ProfileError("host_burst", f"expected a whole number of requests, 1 to {MAX_HOST_RATE}")
    ca_file = entry.get("ca_file")
    if ca_file is not None:
        if not isinstance(ca_file, str) or not os.path.isabs(ca_file):
            raise ProfileError("ca_file", "use an absolute path (the file is read again at every start and reload)")
        try:
            load_ca_file(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca_file)
        except CredentialError as exc:
            raise ProfileError("ca_file", str(exc)) from None
    return UnifiedPushProfile(pid, subject, allow, float(rate), burst, ca_file)


# Statuses RFC 8030 and RFC 8292 give a meaning; the rest by class (see `classify`).
_STATUS: dict[int, str] = {
    200: ACCEPTED, 201: ACCEPTED, 202: ACCEPTED,
    400: PERMANENT,  # a malformed request: ours never varies, so it cannot succeed later
    401: PERMANENT,  # the push service refused our VAPID token
    403: INVALID_ENDPOINT,  # the subscription is restricted to another application server key
    404: INVALID_ENDPOINT, 410: INVALID_ENDPOINT,  # the subscription is gone
    413: PERMANENT,
    429: TRANSIENT,
}


def classify(status: int) -> str:
    """The outcome kind of a push service's answer."""
    kind = _STATUS.get(status)
    if kind is not None:
        return kind
    if 200 <= status < 300:
        return ACCEPTED
    if 300 <= status < 400:
        # Never followed: a push resource does not move, and a redirect could point anywhere.
        return INVALID_ENDPOINT
    return TRANSIENT if status >= 500 else PERMANENT


VapidKeys = Callable[[str], Awaitable[VapidKey]]


class UnifiedPushTransport:
    """Sends the constant wake to UnifiedPush endpoints for one app profile of one origin.

    `vapid_keys(push_origin)` gives the VAPID key this origin uses with that push service (made on
    first use and kept wrapped in the store, `appliance.push.vapid`); `resolve` is the resolver
    (the system's), given to tests.
    """

    def __init__(self, profile: UnifiedPushProfile, vapid_keys: VapidKeys, *,
                 resolve: Resolver = system_resolve, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.time, rates: HostRates | None = None,
                 inflight: InFlight | None = None):
        self.profile = profile
        self.vapid_keys = vapid_keys
        self.resolve = resolve
        self.timeout = timeout
        self.clock = clock
        #: the per-host token buckets; shared by one origin's profiles with the same cap (push.kinds)
        self.rates = rates or HostRates(profile.host_rate, profile.host_burst)
        #: the attempts under way; shared by one origin's profiles (push.kinds), None: unbounded
        self.inflight = inflight
        self._ssl = profile.ssl_context()
        self._clients: OrderedDict[tuple, tuple[httpx.AsyncClient, asyncio.Semaphore]] = OrderedDict()
        self._closing: set[asyncio.Task] = set()
        self._tokens: OrderedDict[tuple[str, str], tuple[int, str]] = OrderedDict()  # (key, aud) -> (exp, header)
        #: the encryption's randomness: (salt, sender key) per message (tests fix it)
        self.fresh: Callable[[], tuple[bytes, ec.EllipticCurvePrivateKey]] = (
            lambda: (os.urandom(16), ec.generate_private_key(ec.SECP256R1())))

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client, _slots in clients:
            await client.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def body(self, sub: PushSubscription) -> bytes:
        """The request body for `sub`: the constant, encrypted with fresh randomness."""
        salt, sender = self.fresh()
        return encrypt(UNIFIEDPUSH_PLAINTEXT, sub.p256dh, sub.auth, salt=salt, sender=sender)

    async def _authorization(self, sub: PushSubscription, now: int) -> str:
        key = await self.vapid_keys(sub.origin)
        slot = (key.public_key, sub.origin)
        cached = self._tokens.get(slot)
        if cached is not None and cached[0] - now > VAPID_RENEW:
            self._tokens.move_to_end(slot)
            return cached[1]
        exp = now + VAPID_LIFETIME
        header = key.header(sub.origin, self.profile.vapid_subject, exp)
        self._tokens[slot] = (exp, header)
        if len(self._tokens) > MAX_CLIENTS * 4:
            self._tokens.popitem(last=False)
        return header

    def _client(self, sub: PushSubscription, address: str) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        slot = (sub.scheme, sub.host, sub.port, address)
        pooled = self._clients.get(slot)
        if pooled is not None:
            self._clients.move_to_end(slot)
            return pooled
        # trust_env=False: no proxy (it would resolve the name again) and no CA bundle from the
        # environment; redirects are never followed.
        client = httpx.AsyncClient(verify=self._ssl, trust_env=False, follow_redirects=False, http1=True,
                                   http2=False, timeout=httpx.Timeout(self.timeout),
                                   limits=httpx.Limits(max_connections=CONNECTIONS_PER_HOST,
                                                       max_keepalive_connections=CONNECTIONS_PER_HOST))
        pooled = self._clients[slot] = (client, asyncio.Semaphore(CONNECTIONS_PER_HOST))
        if len(self._clients) > MAX_CLIENTS:
            _slot, (old, _slots) = self._clients.popitem(last=False)
            task = asyncio.get_running_loop().create_task(old.aclose())
            self._closing.add(task)  # held until done (the loop keeps only a weak reference)
            task.add_done_callback(self._closing.discard)
        return pooled

    async def send(self, request: WakeRequest) -> Outcome:
        try:
            sub = parse_endpoint(request.endpoint)
        except EndpointError as exc:
            return Outcome(INVALID_ENDPOINT, reason="BadEndpoint", detail=f"{exc}; not sent", endpoint_fault=True)
        allowed = sub.host in self.profile.allow_hosts
        if sub.scheme != "https" and not allowed:
            return Outcome(INVALID_ENDPOINT, reason="InsecureEndpoint", endpoint_fault=True,
                           detail=f"http:// push URL to {sub.host}, which allow_hosts does not name; not sent")
        inflight = self.inflight
        if inflight is not None and not await inflight.acquire(sub.host):
            # Answered after a moment: waiting longer would hold a delivery worker the APNs wakes need.
            return Outcome(TRANSIENT, reason="TooManyInFlight", retry_after=InFlight.RETRY, endpoint_fault=True,
                           detail=f"too many attempts under way (to {sub.host} or in all); not sent")
        try:
            wait = self.rates.take(sub.host)
            if wait > 0:
                return Outcome(TRANSIENT, reason="HostRateCap", retry_after=wait, endpoint_fault=True,
                               detail=f"the rate cap of push host {sub.host} ({self.profile.host_rate:g}/s); not sent")
            return await self._send(request, sub, allowed)
        finally:
            if inflight is not None:
                inflight.leave(sub.host)

    async def _send(self, request: WakeRequest, sub: PushSubscription, allowed: bool) -> Outcome:
        try:
            async with asyncio.timeout(self.timeout):
                outcome = await self._attempt(request, sub, allowed)
        except TimeoutError:
            outcome = Outcome(TRANSIENT, reason="Timeout",
                              detail=f"no complete answer from {sub.host} in {self.timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - send never raises (Transport's contract)
            # The host is chosen by a lease holder: whatever its answer trips is its fault, never
            # the profile's health nor an operator alert.
            log.warning("unifiedpush: unexpected %s from push host %s", type(exc).__name__, sub.host)
            outcome = Outcome(TRANSIENT, reason="PushHostError",
                              detail=f"{sub.host}: unexpected {type(exc).__name__}")
        return outcome if outcome.kind == ACCEPTED else dataclasses.replace(outcome, endpoint_fault=True)

    async def _attempt(self, request: WakeRequest, sub: PushSubscription, allowed: bool) -> Outcome:
        host = sub.host
        try:
            ipaddress.ip_address(host)
            addresses = [host]  # a literal: nothing to resolve
        except ValueError:
            try:
                addresses = await self.resolve(host, sub.port)
            except ResolverBusy:
                return Outcome(TRANSIENT, reason="ResolverBusy", retry_after=RESOLVER_BUSY_RETRY,
                               detail=f"{host} not resolved: every resolver thread is busy; not sent")
            except (OSError, UnicodeError) as exc:
                return Outcome(TRANSIENT, reason="ResolveFailed", detail=f"{host} does not resolve ({exc})")
        if not addresses:
            return Outcome(TRANSIENT, reason="ResolveFailed", detail=f"{host} resolves to no address")
        if not allowed:
            for address in addresses:
                why = forbidden_address(address)
                if why is not None:
                    # Fail-closed: a push host that leads anywhere but the public internet is never
                    # tried again for this endpoint generation (docs/spec-notes.md, UnifiedPush).
                    return Outcome(INVALID_ENDPOINT, reason="ForbiddenAddress",
                                   detail=f"{host} resolves to a {why} address; not sent")
        address = addresses[0].split("%", 1)[0]
        now = int(self.clock())
        ttl = max(0, min(int(request.expires_at) - now, MAX_TTL))
        headers = {
            "host": sub.authority,
            "ttl": str(ttl),
            "urgency": "high",
            "content-encoding": "aes128gcm",
            "content-type": "application/octet-stream",
            "authorization": await self._authorization(sub, now),
            "accept-encoding": "identity",
            "user-agent": "appliance",
        }
        literal = f"[{address}]" if ":" in address else address
        url = f"{sub.scheme}://{literal}:{sub.port}{sub.target}"
        extensions = {"sni_hostname": host} if sub.scheme == "https" else {}
        client, slots = self._client(sub, address)
        try:
            # Requests wait for a connection here, not in the HTTP client's pool: its queue costs
            # work per waiting request at every completion, ours nothing.
            async with slots, client.stream("POST", url, headers=headers, content=self.body(sub),
                                            extensions=extensions) as response:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= MAX_RESPONSE_BYTES:
                        break  # the rest is never read: closing the stream drops the connection
                status = response.status_code
                retry_after = response.headers.get("retry-after")
        except httpx.TimeoutException:
            return Outcome(TRANSIENT, reason="Timeout", detail=f"no complete answer from {host} in {self.timeout:g} s")
        except httpx.ConnectError as exc:
            cause = exc.__cause__ or exc.__context__
            while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
                cause = cause.__cause__ or cause.__context__
            if cause is not None:
                # Our trust store and the host's certificate disagree: retrying this job soon will
                # not change that, and the next wake tries again.
                return Outcome(PERMANENT, reason="TlsUntrusted",
                               detail=f"the TLS certificate of {host} is not trusted ({cause.verify_message})")
            return Outcome(TRANSIENT, reason="ConnectFailed", detail=f"cannot connect to {host}")
        except httpx.HTTPError as exc:
            return Outcome(TRANSIENT, reason="ProtocolError", detail=f"{host}: {type(exc).__name__}")
        kind = classify(status)
        detail = f"{host} answered {status}"
        if 300 <= status < 400:
            detail += " (a redirect: not followed)"
        return Outcome(kind, status, retry_after=parse_retry_after(retry_after) if kind == TRANSIENT else None,
                       detail=detail)
