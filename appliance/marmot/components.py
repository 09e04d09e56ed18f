"""Marmot app components and MLS code points: registry values, and the state bytes of the two
GroupContext components the tooling writes (admin policy 0x8003, Nostr routing 0x8004).

The authorization-proof components (0x8009 on a LeafNode, 0x800a in an AppEphemeral) carry exactly
one 104-byte proof and live in `proofs.py`. Encodings are the Marmot binary profile; decoders refuse
anything that is not canonical (canonical-encoding.md: no trimming, reordering or deduplicating).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import ComponentError, EncodingError
from .wire import Reader, quic_vector, uint16

__all__ = [
    "APP_COMPONENTS",
    "LAST_RESORT_KEY_PACKAGE",
    "APP_DATA_DICTIONARY",
    "APP_DATA_UPDATE",
    "APP_EPHEMERAL",
    "SELF_REMOVE",
    "ADMIN_POLICY",
    "NOSTR_ROUTING",
    "ACCOUNT_IDENTITY_PROOF",
    "MULTI_DEVICE_JOIN_AUTHORIZATION",
    "EXT_MDK_GROUP_DATA",
    "EXT_ENCRYPTED_DEVICE_NAME",
    "EXT_MULTI_DEVICE",
    "EXT_ACCOUNT_IDENTITY_PROOF_V1",
    "COMPONENT_NAMES",
    "AdminPolicy",
    "NostrRouting",
    "check_relay_url",
    "MdkGroupData",
    "mdk_relay_url",
    "mdk_relay_list",
]

# Upstream MLS extensions draft (-09) code points pinned by foundation/registries.md.
APP_COMPONENTS = 0x0001          # ComponentID: supported (LeafNode) / required (GroupContext) component ids
LAST_RESORT_KEY_PACKAGE = 0x0004  # ComponentID
APP_DATA_DICTIONARY = 0x0006      # extension type
APP_DATA_UPDATE = 0x0008          # proposal type
APP_EPHEMERAL = 0x0009            # proposal type (the draft multi-device carrier)
SELF_REMOVE = 0x000A              # proposal type

# Marmot component ids (private range).
ADMIN_POLICY = 0x8003
NOSTR_ROUTING = 0x8004
ACCOUNT_IDENTITY_PROOF = 0x8009
MULTI_DEVICE_JOIN_AUTHORIZATION = 0x800A

# Marmot custom MLS extension types.
EXT_MDK_GROUP_DATA = 0xF2EE            # MDK 0.8.0's monolithic group data (not in the spec set; note M4)
EXT_ENCRYPTED_DEVICE_NAME = 0xF2EF     # marmot.encrypted-device-name.v1 (LeafNode)
EXT_MULTI_DEVICE = 0xF2F0              # marmot.multi-device.v1 (GroupContext signaling gate)
EXT_ACCOUNT_IDENTITY_PROOF_V1 = 0xF2F1  # legacy; never a substitute for component 0x8009

COMPONENT_NAMES = {
    ADMIN_POLICY: "marmot.group.admin-policy.v1",
    NOSTR_ROUTING: "marmot.transport.nostr.routing.v1",
    ACCOUNT_IDENTITY_PROOF: "marmot.member.account-identity-proof.v2",
    MULTI_DEVICE_JOIN_AUTHORIZATION: "marmot.authorization.multi-device-join.v1",
}

MAX_RELAY_URL = 512


@dataclass(frozen=True)
class AdminPolicy:
    """marmot.group.admin-policy.v1 (0x8003): a sorted, unique, non-empty list of x-only admin keys."""

    admins: tuple[bytes, ...]

    def __post_init__(self) -> None:
        admins = tuple(bytes(a) for a in self.admins)
        object.__setattr__(self, "admins", admins)
        if not admins:
            raise ComponentError("admin list is empty", "component.admin_policy.empty")
        for key in admins:
            if len(key) != 32:
                raise ComponentError("admin key is not 32 bytes", "component.admin_policy.key_length")
        for a, b in zip(admins, admins[1:]):
            if a == b:
                raise ComponentError("admin list has a duplicate", "component.admin_policy.duplicate")
            if a > b:
                raise ComponentError("admin list is not sorted", "component.admin_policy.unsorted")

    @classmethod
    def of(cls, admins) -> "AdminPolicy":
        """Producer convenience: sort and deduplicate keys given as bytes or hex."""
        keys = {bytes.fromhex(a) if isinstance(a, str) else bytes(a) for a in admins}
        return cls(tuple(sorted(keys)))

    def encode(self) -> bytes:
        # MarmotAdminKeyV1 is a fixed 32-byte struct, so the list body is the keys back to back.
        return quic_vector(b"".join(self.admins))

    @classmethod
    def decode(cls, data: bytes) -> "AdminPolicy":
        r = Reader(data, "MarmotAdminPolicyV1")
        body = r.vector(field="admins")
        r.done()
        if len(body) % 32:
            raise EncodingError("admins list is not a whole number of 32-byte keys", "encoding.truncated")
        return cls(tuple(body[i:i + 32] for i in range(0, len(body), 32)))

    def is_admin(self, pubkey: bytes) -> bool:
        return bytes(pubkey) in self.admins

    def to_json(self) -> dict:
        return {"component": "0x8003", "name": COMPONENT_NAMES[ADMIN_POLICY],
                "admins": [a.hex() for a in self.admins]}


def check_relay_url(url: bytes) -> None:
    """The relay URL profile we apply (spec note M6): ws/wss, a host, no credentials or fragment."""
    if not 1 <= len(url) <= MAX_RELAY_URL:
        raise ComponentError(f"relay URL length {len(url)} outside 1..{MAX_RELAY_URL}", "component.routing.url")
    try:
        text = url.decode("ascii")
    except UnicodeDecodeError:
        raise ComponentError("relay URL is not ASCII", "component.routing.url") from None
    if any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7F for c in text):
        raise ComponentError("relay URL contains whitespace or control characters", "component.routing.url")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ComponentError(f"relay URL {text!r} is malformed", "component.routing.url") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ComponentError(f"relay URL {text!r} is not a ws:// or wss:// URL with a host",
                             "component.routing.url")
    if parts.username is not None or parts.password is not None or parts.fragment:
        raise ComponentError(f"relay URL {text!r} carries credentials or a fragment", "component.routing.url")


@dataclass(frozen=True)
class NostrRouting:
    """marmot.transport.nostr.routing.v1 (0x8004): the group's `h` value and its canonical relay list."""

    nostr_group_id: bytes
    relays: tuple[bytes, ...]

    def __post_init__(self) -> None:
        relays = tuple(r.encode() if isinstance(r, str) else bytes(r) for r in self.relays)
        object.__setattr__(self, "relays", relays)
        object.__setattr__(self, "nostr_group_id", bytes(self.nostr_group_id))
        if len(self.nostr_group_id) != 32:
            raise ComponentError("nostr_group_id is not 32 bytes", "component.routing.group_id")
        if not relays:
            raise ComponentError("relay list is empty", "component.routing.empty")
        for url in relays:
            check_relay_url(url)
        # Sorted by the URL bytes themselves, not by their length-prefixed encodings (spec note M5).
        for a, b in zip(relays, relays[1:]):
            if a == b:
                raise ComponentError("relay list has a duplicate", "component.routing.duplicate")
            if a > b:
                raise ComponentError("relay list is not sorted", "component.routing.unsorted")

    @classmethod
    def of(cls, nostr_group_id: bytes, relays) -> "NostrRouting":
        """Producer convenience: sorted, unique relay list."""
        urls = {r.encode() if isinstance(r, str) else bytes(r) for r in relays}
        return cls(nostr_group_id, tuple(sorted(urls)))

    def encode(self) -> bytes:
        body = b"".join(quic_vector(url) for url in self.relays)
        return self.nostr_group_id + quic_vector(body)

    @classmethod
    def decode(cls, data: bytes) -> "NostrRouting":
        r = Reader(data, "MarmotNostrRoutingV1")
        group_id = r.fixed(32)
        body = r.vector(field="relays")
        r.done()
        items = Reader(body, "MarmotNostrRoutingV1.relays")
        relays = []
        while not items.at_end():
            relays.append(items.vector(1, MAX_RELAY_URL, field="url"))
        return cls(group_id, tuple(relays))

    @property
    def h(self) -> str:
        """The kind 445 `h` tag value."""
        return self.nostr_group_id.hex()

    def relay_urls(self) -> list[str]:
        return [u.decode("ascii") for u in self.relays]

    def to_json(self) -> dict:
        return {"component": "0x8004", "name": COMPONENT_NAMES[NOSTR_ROUTING],
                "nostr_group_id": self.h, "relays": self.relay_urls()}


# MDK's relay URLs are nostr's `RelayUrl`: the WHATWG URL serialization (scheme and host lower case,
# default port dropped, empty path "/"), shown without its trailing slashes unless the text given
# had one; its `BTreeSet` orders them by the full serialization. We rebuild that only for URLs whose
# serialization follows from these rules; anything WHATWG would rewrite further is refused.
_HOST_LABEL = re.compile(r"[a-z0-9_-]+")
_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*")
_QUERY_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&()*+,;=:@%/?]*")
_DEFAULT_PORTS = {"ws": 80, "wss": 443}


def mdk_relay_url(text: str) -> tuple[str, str]:
    """(sort key, bytes MDK writes) of a relay URL, as MDK 0.8.0's group data carries it."""
    check_relay_url(text.encode("utf-8") if isinstance(text, str) else b"")
    scheme, sep, rest = text.partition("://")
    if not sep or "\\" in text or "#" in text:
        raise ComponentError(f"relay URL {text!r} is not a plain ws:// or wss:// URL", "component.group_data.relay")
    scheme = scheme.lower()
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    path, _, query = tail.partition("?")
    has_query = "?" in tail
    if authority.startswith("["):
        host_text, _, port_text = authority[1:].partition("]")
        if port_text and not port_text.startswith(":"):
            raise ComponentError(f"relay URL {text!r} has a malformed host", "component.group_data.relay")
        port_text = port_text[1:] if port_text else None
        try:
            host = f"[{ipaddress.IPv6Address(host_text).compressed}]"
        except ValueError:
            raise ComponentError(f"relay URL {text!r} has a malformed IPv6 host", "component.group_data.relay") \
                from None
    else:
        host_text, colon, port_text = authority.partition(":")
        port_text = port_text if colon else None
        host = host_text.lower()
        labels = host.split(".")
        if not all(_HOST_LABEL.fullmatch(label) and not label.startswith("xn--") for label in labels):
            raise ComponentError(f"relay URL {text!r}: the host is not a plain DNS name or IPv4 address",
                                 "component.group_data.relay")
        if labels[-1].isdigit() or labels[-1].startswith("0x"):  # WHATWG reads it as an IPv4 address
            try:
                ip = ipaddress.IPv4Address(host)
            except ValueError:
                raise ComponentError(f"relay URL {text!r}: {host!r} is not a dotted-quad IPv4 address",
                                     "component.group_data.relay") from None
            if str(ip) != host:
                raise ComponentError(f"relay URL {text!r}: {host!r} is not a canonical IPv4 address",
                                     "component.group_data.relay")
    port = ""
    if port_text is not None:
        if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
            raise ComponentError(f"relay URL {text!r} has an invalid port", "component.group_data.relay")
        if int(port_text) != _DEFAULT_PORTS[scheme]:
            port = f":{int(port_text)}"
    if not _PATH_CHARS.fullmatch(path) or not _QUERY_CHARS.fullmatch(query):
        raise ComponentError(f"relay URL {text!r} has characters a URL parser would percent-encode",
                             "component.group_data.relay")
    segments = path.split("/")[1:]
    if any(seg.lower() in (".", "..", "%2e", ".%2e", "%2e.", "%2e%2e") for seg in segments):
        raise ComponentError(f"relay URL {text!r} has dot path segments", "component.group_data.relay")
    serialization = f"{scheme}://{host}{port}{path or '/'}{'?' + query if has_query else ''}"
    shown = serialization if text.endswith("/") else serialization.rstrip("/")
    return serialization, shown


_FORBIDDEN_DOMAIN = set("\x00\t\n\r #%/:<>?@[\\]^|\x7f") | {chr(c) for c in range(0x20)}


def _ipv4_number(part: str) -> int | None:
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if digits == "":
        return 0 if base != 10 else None
    try:
        return int(digits, base) if digits.isascii() and digits.isalnum() else None
    except ValueError:
        return None


def mdk_relay_refusal(text: str) -> str | None:
    """Why MDK 0.8.0 cannot read a relay URL of received group data (nostr's `RelayUrl`: a WHATWG URL
    with scheme ws or wss), or None. Only failures WHATWG parsing certainly has are named: hosts with
    non-ASCII characters or xn-- labels are taken (the UTS 46 tables are not rebuilt; MDK writes
    only ASCII serializations)."""
    text = text.strip("".join(chr(c) for c in range(0x21)))
    text = "".join(c for c in text if c not in "\t\n\r")
    scheme, colon, rest = text.partition(":")
    if not colon or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return "it is not an absolute URL"
    if scheme.lower() not in ("ws", "wss"):
        return f"its scheme {scheme!r} is not ws or wss"
    rest = rest.lstrip("/\\")
    authority = re.split(r"[/\\?#]", rest, maxsplit=1)[0]
    host_port = authority.rpartition("@")[2]
    if host_port.startswith("["):
        inner, bracket, port = host_port[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            return "its IPv6 host is malformed"
        try:
            if "%" in inner:
                raise ValueError
            ipaddress.IPv6Address(inner)
        except ValueError:
            return "its IPv6 host is malformed"
        host, port = None, port[1:]
    else:
        host, _, port = host_port.partition(":")
        if host == "":
            return "it has no host"
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return f"its port {port!r} is not a number up to 65535"
    if host is None:
        return None
    decoded = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes.fromhex(m.group(1).decode()), host.encode("utf-8"))
    try:
        domain = decoded.decode("utf-8").lower()
    except UnicodeDecodeError:
        return f"its host {host!r} is not UTF-8 once percent-decoded"
    if domain == "" or any(c in _FORBIDDEN_DOMAIN for c in domain):
        return f"its host {host!r} has a character a URL host cannot have"
    labels = domain.split(".")
    if not domain.isascii() or any(label.startswith("xn--") for label in labels):
        return None  # left to IDNA (UTS 46), not rebuilt here
    parts = labels[:-1] if len(labels) > 1 and labels[-1] == "" else labels
    if parts[-1] and (parts[-1].isascii() and parts[-1].isdigit() or _ipv4_number(parts[-1]) is not None):
        numbers = [_ipv4_number(p) if p else None for p in parts]
        if len(parts) > 4 or None in numbers or any(n > 255 for n in numbers[:-1]) \
                or numbers[-1] >= 256 ** (5 - len(numbers)):
            return f"its host {host!r} is not an IPv4 address"
    return None


def mdk_relay_list(relays) -> tuple[bytes, ...]:
    """MDK's relay list for the given URLs: normalized, ordered and deduplicated as its BTreeSet
    does (collected from a list: of two URLs with the same serialization, the last one is kept)."""
    chosen: dict[str, str] = {}
    for url in relays:
        key, shown = mdk_relay_url(url.decode("ascii") if isinstance(url, (bytes, bytearray)) else url)
        chosen[key] = shown
    if not chosen:
        raise ComponentError("relay list is empty", "component.group_data.relay")
    return tuple(chosen[k].encode("ascii") for k in sorted(chosen))


@dataclass(frozen=True)
class MdkGroupData:
    """MDK 0.8.0's `marmot_group_data` GroupContext extension (0xf2ee, MIP-01), spec note M4.

    Its `TlsNostrGroupDataExtension` (MLS vector encoding, the field order below): `version(u16) ||
    nostr_group_id[32] || name<V> || description<V> || admin_pubkeys<V> (32-byte keys) ||
    relays<V> (each url<V>) || image_hash<V> || image_key<V> || image_nonce<V> ||
    image_upload_key<V>`; empty image fields mean none. Decoded exactly (MDK refuses trailing
    bytes) and re-encoded byte for byte, so an admin change keeps the image fields as they are.
    """

    version: int
    nostr_group_id: bytes
    name: bytes
    description: bytes
    admins: tuple[bytes, ...]
    relays: tuple[bytes, ...]
    image_hash: bytes = b""
    image_key: bytes = b""
    image_nonce: bytes = b""
    image_upload_key: bytes = b""

    CURRENT_VERSION = 2
    # MDK refuses any other length for a present image field.
    _IMAGE_LENGTHS = {"image_hash": 32, "image_key": 32, "image_nonce": 12, "image_upload_key": 32}

    def __post_init__(self) -> None:
        if len(self.nostr_group_id) != 32:
            raise ComponentError("nostr_group_id is not 32 bytes", "component.group_data.group_id")
        for field, size in self._IMAGE_LENGTHS.items():
            value = getattr(self, field)
            if value and len(value) != size:
                raise ComponentError(f"marmot_group_data {field} is {len(value)} bytes, not {size}",
                                     "component.group_data.image")
        for key in self.admins:
            if len(key) != 32:
                raise ComponentError("admin key is not 32 bytes", "component.group_data.admin")
        for text, what in ((self.name, "name"), (self.description, "description"), *((r, "relay") for r in self.relays)):
            try:
                bytes(text).decode("utf-8")
            except UnicodeDecodeError:
                raise ComponentError(f"marmot_group_data {what} is not UTF-8", "component.group_data.utf8") from None

    @classmethod
    def of(cls, *, nostr_group_id: bytes, name: str, description: str, admins, relays) -> "MdkGroupData":
        """What MDK 0.8.0's `NostrGroupDataExtension::new` writes for these values (version 2, no image):
        admins sorted by key bytes and deduplicated (a BTreeSet), relays as `mdk_relay_list`."""
        keys = sorted({bytes.fromhex(a) if isinstance(a, str) else bytes(a) for a in admins})
        if not keys:
            raise ComponentError("admin list is empty", "component.group_data.admin")
        return cls(cls.CURRENT_VERSION, bytes(nostr_group_id), name.encode("utf-8"), description.encode("utf-8"),
                   tuple(keys), mdk_relay_list(relays))

    def with_admins(self, admins) -> "MdkGroupData":
        keys = sorted({bytes(a) for a in admins})
        return MdkGroupData(self.version, self.nostr_group_id, self.name, self.description, tuple(keys), self.relays,
                            self.image_hash, self.image_key, self.image_nonce, self.image_upload_key)

    def encode(self) -> bytes:
        return b"".join([
            uint16(self.version), self.nostr_group_id, quic_vector(self.name), quic_vector(self.description),
            quic_vector(b"".join(self.admins)), quic_vector(b"".join(quic_vector(r) for r in self.relays)),
            quic_vector(self.image_hash), quic_vector(self.image_key), quic_vector(self.image_nonce),
            quic_vector(self.image_upload_key),
        ])

    @classmethod
    def decode(cls, data: bytes) -> "MdkGroupData":
        r = Reader(data, "marmot_group_data")
        version = r.uint16()
        if version == 0:
            raise ComponentError("marmot_group_data version 0 is invalid", "component.group_data.version")
        group_id = r.fixed(32)
        name, description = r.vector(field="name"), r.vector(field="description")
        admin_body = r.vector(field="admin_pubkeys")
        if len(admin_body) % 32:
            raise EncodingError("admin_pubkeys is not a whole number of 32-byte keys", "encoding.truncated")
        relays_reader = Reader(r.vector(field="relays"), "marmot_group_data.relays")
        relays = []
        while not relays_reader.at_end():
            relays.append(relays_reader.vector(field="relay"))
        images = [r.vector(field=f) for f in ("image_hash", "image_key", "image_nonce", "image_upload_key")]
        r.done()
        admins = tuple(admin_body[i:i + 32] for i in range(0, len(admin_body), 32))
        data = cls(version, group_id, name, description, admins, tuple(relays), *images)
        for url in data.relays:  # MDK refuses group data with a relay URL it cannot parse
            why = mdk_relay_refusal(bytes(url).decode("utf-8"))
            if why is not None:
                raise ComponentError(f"marmot_group_data relay {bytes(url)[:80]!r}: {why}", "component.group_data.relay")
        return data

    @property
    def h(self) -> str:
        return self.nostr_group_id.hex()

    def relay_urls(self) -> list[str]:
        return [u.decode("utf-8") for u in self.relays]

    def to_json(self) -> dict:
        out = {"extension": "0xf2ee", "name": "marmot_group_data (MDK)", "version": self.version,
               "nostr_group_id": self.h, "group_name": self.name.decode("utf-8"),
               "description": self.description.decode("utf-8"),
               "admins": [a.hex() for a in self.admins], "relays": self.relay_urls()}
        if self.image_hash:
            out["image_hash"] = self.image_hash.hex()  # the key, nonce and upload key are secrets
        return out
