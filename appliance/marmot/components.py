"""Marmot app components and MLS code points: registry values, and the state bytes of the two
GroupContext components the tooling writes (admin policy 0x8003, Nostr routing 0x8004).

The authorization-proof components (0x8009 on a LeafNode, 0x800a in an AppEphemeral) carry exactly
one 104-byte proof and live in `proofs.py`. Encodings are the Marmot binary profile; decoders refuse
anything that is not canonical (canonical-encoding.md: no trimming, reordering or deduplicating).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import ComponentError, EncodingError
from .wire import Reader, quic_vector

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


@dataclass(frozen=True)
class MdkGroupData:
    """MDK 0.8.0's `marmot_group_data` GroupContext extension (0xf2ee, MIP-01), read-only.

    `version(u16) || nostr_group_id[32] || name<V> || description<V> || admin_pubkeys<V> ||
    relays<V> || ...` (QUIC-prefixed vectors; later fields depend on the version and are not read
    here: the MLS core keeps the extension's bytes as they are). Spec note M4.
    """

    version: int
    nostr_group_id: bytes
    name: bytes
    description: bytes
    admins: tuple[bytes, ...]
    relays: tuple[bytes, ...]

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
        admins = tuple(admin_body[i:i + 32] for i in range(0, len(admin_body), 32))
        return cls(version, group_id, name, description, admins, tuple(relays))

    @property
    def h(self) -> str:
        return self.nostr_group_id.hex()

    def relay_urls(self) -> list[str]:
        return [u.decode("utf-8", "replace") for u in self.relays]

    def to_json(self) -> dict:
        return {"extension": "0xf2ee", "name": "marmot_group_data (MDK)", "version": self.version,
                "nostr_group_id": self.h, "group_name": self.name.decode("utf-8", "replace"),
                "admins": [a.hex() for a in self.admins], "relays": self.relay_urls()}
