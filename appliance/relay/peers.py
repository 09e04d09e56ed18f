"""Who is on the other end of a connection, and which addresses are this machine's own.

- `PeerLimits`: the client address of a connection (`client_address`: the TCP peer, or, when that
  peer is a trusted proxy, the address it forwards in `X-Forwarded-For`), a cap on open connections
  per client address, and the flood backoff: an address whose connection was closed for flooding
  may not connect again for a while (2 s, doubling with each repeat). Loopback peers are trusted
  proxies (a TLS proxy on the same box); unless `loopback_exempt` is off, a loopback address is
  neither capped nor backed off itself.
- `local_addresses` / `is_local_host` / `url_as_reached`: whether a host name in a URL names this
  machine (loopback names and the addresses of its own interfaces), for NIP-42 relay tags and
  NIP-98 `u` tags (NIP-86) on an unconfigured install.
"""

from __future__ import annotations

import fcntl
import ipaddress
import re
import socket
import struct
import time
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable

from appliance.errors import ConfigError
from appliance.origins import normalize_ip

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

    from appliance.front import WebSocketRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The first flood backoff; each further close for flooding doubles it (up to `flood_backoff`). An
# address that has not flooded for this long starts again from the first.
DEFAULT_FIRST_BACKOFF = 2.0
BACKOFF_MEMORY_SECONDS = 3600.0
# Addresses remembered for their backoff, at most: the oldest are forgotten first.
MAX_REMEMBERED_FLOODERS = 100_000

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def parse_networks(text: str) -> list[Network]:
    """`10.0.0.1, 192.168.0.0/16, ::1` -> networks; ValueError naming the bad entry."""
    nets = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network (CIDR), e.g. 10.0.0.2 or 10.0.0.0/8") from None
    return nets


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def is_loopback(text: str) -> bool:
    addr = _address(text)
    return addr is not None and addr.is_loopback


def peer_ip(conn: HTTPConnection | WebSocketRequest) -> str | None:
    """The connection's peer address (a starlette Request or WebSocket), in canonical form."""
    client = conn.client
    if client is None or not client.host:
        return None
    try:
        return normalize_ip(client.host)
    except ConfigError:
        return client.host


class PeerLimits:
    """Client addresses and the per-address connection cap (0: no cap)."""

    def __init__(self, max_per_ip: int, trusted_proxies: Iterable[Network] = (), *, trust_loopback: bool = True,
                 loopback_exempt: bool = True, max_backoff: float = 0.0):
        self.max_per_ip = max_per_ip
        self.trusted = list(trusted_proxies)
        self.trust_loopback = trust_loopback  # off only in tests of the cap itself
        self.loopback_exempt = loopback_exempt
        self.max_backoff = max_backoff
        self.open: dict[str, int] = {}
        self.refused = 0
        # address -> (closes for flooding in a row, when the last was, barred until)
        self.flooders: dict[str, tuple[int, float, float]] = {}
        self.barred_refused = 0

    def exempt(self, ip: str | None) -> bool:
        """Whether per-address limits spare `ip` (a loopback address, unless `loopback_exempt` is off)."""
        return ip is None or (self.loopback_exempt and is_loopback(ip))

    def flooded(self, ip: str | None) -> float:
        """A connection from `ip` was closed for flooding: bar the address from connecting for a
        while (longer each time). Returns the seconds barred (0: exempt or backoff off)."""
        if not self.max_backoff or self.exempt(ip):
            return 0.0
        now = time.monotonic()
        strikes, last, _until = self.flooders.pop(ip, (0, 0.0, 0.0))
        if now - last > BACKOFF_MEMORY_SECONDS:
            strikes = 0
        seconds = min(self.max_backoff, DEFAULT_FIRST_BACKOFF * 2 ** min(strikes, 30))
        self.flooders[ip] = (strikes + 1, now, now + seconds)  # re-inserted: newest last
        while len(self.flooders) > MAX_REMEMBERED_FLOODERS:
            del self.flooders[next(iter(self.flooders))]
        return seconds

    def barred(self, ip: str | None) -> float:
        """Seconds `ip` must still wait before connecting again (0: it may connect)."""
        if not self.flooders or ip is None:
            return 0.0
        entry = self.flooders.get(ip)
        if entry is None:
            return 0.0
        left = entry[2] - time.monotonic()
        if left <= 0:
            return 0.0
        self.barred_refused += 1
        return left

    def is_trusted(self, text: str) -> bool:
        addr = _address(text)
        if addr is None:
            return False
        return (self.trust_loopback and addr.is_loopback) or any(addr in net for net in self.trusted)

    def forwarded_client(self, peer: str, forwarded_for: list[str]) -> str | None:
        """The client behind a trusted `peer`: the rightmost `X-Forwarded-For` entry that is not a
        trusted proxy itself (entries further left are whatever the client claimed). None when the
        peer is not trusted, nothing is forwarded, or every entry is a trusted address."""
        if not forwarded_for or not self.is_trusted(peer):
            return None
        entries = [e.strip() for header in forwarded_for for e in header.split(",") if e.strip()]
        for entry in reversed(entries):
            if not self.is_trusted(entry):
                addr = _address(entry)
                return str(addr) if addr is not None else entry[:64]
        return None

    def client_address(self, conn: HTTPConnection | WebSocketRequest) -> str | None:
        """The client's address (a Request or WebSocket): behind a trusted proxy (loopback or
        `trusted_proxies`), the one it forwards in X-Forwarded-For; else the TCP peer. A client
        that is not a trusted proxy cannot name another address."""
        peer = conn.client.host if conn.client else ""
        return self.forwarded_client(peer, conn.headers.getlist("x-forwarded-for")) or peer_ip(conn)

    def acquire(self, ip: str) -> bool:
        """Count one more connection from `ip`; False (nothing counted) when it is at the cap."""
        n = self.open.get(ip, 0)
        if self.max_per_ip and n >= self.max_per_ip:
            self.refused += 1
            return False
        self.open[ip] = n + 1
        return True

    def release(self, ip: str) -> None:
        n = self.open.get(ip, 0) - 1
        if n > 0:
            self.open[ip] = n
        else:
            self.open.pop(ip, None)


# -- this machine's own addresses ---------------------------------------------------------------

_SIOCGIFADDR = 0x8915


def _interface_ipv4(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _interface_ipv6() -> list[str]:
    try:
        with open("/proc/net/if_inet6") as fh:
            lines = fh.read().split("\n")
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if fields:
            out.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return out


@lru_cache(maxsize=1)
def local_addresses() -> tuple[str, ...]:
    """Addresses of this machine's network interfaces (IPv4 and IPv6, loopback included)."""
    found: list[str] = []
    try:
        names = [name for _i, name in socket.if_nameindex()]
    except OSError:
        names = []
    for name in names:
        addr = _interface_ipv4(name)
        if addr is not None:
            found.append(addr)
    found += _interface_ipv6()
    try:
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)]
    except OSError:
        pass
    seen: dict[str, None] = {}
    for a in found:
        addr = _address(a.split("%")[0])
        if addr is not None:
            seen.setdefault(str(addr), None)
    return tuple(seen)


def is_local_host(host: str, also: Iterable[str] = ()) -> bool:
    """Whether a URL's host names this machine: a loopback name or address, or an address of one
    of its interfaces (or one of `also`, such as the address a connection arrived on)."""
    host = host.strip().lower().rstrip(".")
    if host in LOOPBACK_NAMES:
        return True
    addr = _address(host)
    if addr is None:
        return False
    if addr.is_loopback:
        return True
    text = str(addr)
    return text in local_addresses() or any(text == str(_address(a) or a) for a in also)


_HOST_HEADER = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::[0-9]{1,5})?").fullmatch


def url_as_reached(hosts: list[str], server_host: str, scheme: str, path: str) -> str | None:
    """`scheme://HOST/path` for a request whose one Host header names this machine (a loopback name,
    an address of its interfaces, or `server_host`, the address the connection arrived on); None
    for any other Host: a relay elsewhere could forward what its users sign for it to us."""
    if len(hosts) != 1:
        return None
    host = hosts[0].strip()
    # RFC 9110 7.2: Host is uri-host [":" port] and nothing else. Anything more (an "@", a path)
    # would make the URL below name another host than the one checked here.
    match = _HOST_HEADER(host)
    if match is None:
        return None
    hostname = match["v6"] or match["name"]
    if not is_local_host(hostname, also=(server_host,)):
        return None
    return f"{scheme}://{host}{path}"
