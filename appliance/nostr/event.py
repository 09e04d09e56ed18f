"""NIP-01 events: strict parsing, canonical serialization, id and signature checks."""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

import orjson

from .keys import public_key, schnorr_sign, xonly_key

__all__ = [
    "Event",
    "InvalidEvent",
    "parse_event",
    "canonical_json",
    "compute_id",
    "verify_id",
    "verify_signature",
    "verify_event",
    "sign_event",
    "is_regular",
    "is_replaceable",
    "is_ephemeral",
    "is_addressable",
    "d_tag",
    "expiration",
    "MAX_SAFE_INT",
]

# JavaScript's Number.MAX_SAFE_INTEGER: the largest integer every client can
# round-trip through JSON without loss, so the only safe bound for timestamps.
MAX_SAFE_INT = 2**53 - 1

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
_DIGITS = re.compile(r"[0-9]{1,16}")
_FIELDS = ("id", "pubkey", "created_at", "kind", "tags", "content", "sig")
_FIELD_SET = frozenset(_FIELDS)


class InvalidEvent(ValueError):
    """An event that is malformed or fails validation; str() is the reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Event:
    """A NIP-01 event. Plain slots class (no dataclass machinery) to keep parsing cheap."""

    __slots__ = _FIELDS

    id: str
    pubkey: str
    created_at: int
    kind: int
    tags: list[list[str]]
    content: str
    sig: str

    def __init__(
        self,
        id: str,
        pubkey: str,
        created_at: int,
        kind: int,
        tags: list[list[str]],
        content: str,
        sig: str,
    ) -> None:
        self.id = id
        self.pubkey = pubkey
        self.created_at = created_at
        self.kind = kind
        self.tags = tags
        self.content = content
        self.sig = sig

    def to_dict(self) -> dict[str, Any]:
        """The event's fields in the order it is serialized (see `to_json_bytes`)."""
        return {
            "content": self.content,
            "created_at": self.created_at,
            "id": self.id,
            "kind": self.kind,
            "pubkey": self.pubkey,
            "sig": self.sig,
            "tags": self.tags,
        }

    def to_json_bytes(self) -> bytes:
        """Compact UTF-8 JSON (orjson escapes exactly as JSON.stringify does), keys in alphabetical
        order: strfry stores and exports every event in that form, so events moved between the two
        with `export`/`import` keep their bytes both ways (docs/spec-notes.md, JSON lines)."""
        return orjson.dumps(self.to_dict())

    def to_json(self) -> str:
        return self.to_json_bytes().decode()

    def tag_values(self, name: str) -> list[str]:
        """The second element of every tag whose first element is name."""
        return [t[1] for t in self.tags if len(t) > 1 and t[0] == name]

    def first_tag(self, name: str) -> str | None:
        """The value of the first tag called name that has a value, else None."""
        for t in self.tags:
            if len(t) > 1 and t[0] == name:
                return t[1]
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Event(id={self.id[:12]}…, pubkey={self.pubkey[:12]}…, kind={self.kind}, created_at={self.created_at})"


def _is_int(v: object, hi: int) -> bool:
    # type() rather than isinstance(): bool is an int subclass and must be refused.
    return type(v) is int and 0 <= v <= hi


def parse_event(obj: Any) -> Event:
    """Validate the shape of a decoded event object and build an Event.

    Checks shape only; call verify_event for the id and signature.
    """
    if type(obj) is not dict:
        raise InvalidEvent("event must be a JSON object")
    if len(obj) != 7 or obj.keys() != _FIELD_SET:
        missing = [f for f in _FIELDS if f not in obj]
        if missing:
            raise InvalidEvent(f"missing field: {missing[0]}")
        extra = sorted(str(k) for k in obj if k not in _FIELD_SET)
        raise InvalidEvent(f"unexpected field: {extra[0]}")
    id_ = obj["id"]
    if type(id_) is not str or not _HEX64.fullmatch(id_):
        raise InvalidEvent("id must be 64 lowercase hex characters")
    pubkey = obj["pubkey"]
    if type(pubkey) is not str or not _HEX64.fullmatch(pubkey):
        raise InvalidEvent("pubkey must be 64 lowercase hex characters")
    sig = obj["sig"]
    if type(sig) is not str or not _HEX128.fullmatch(sig):
        raise InvalidEvent("sig must be 128 lowercase hex characters")
    created_at = obj["created_at"]
    if not _is_int(created_at, MAX_SAFE_INT):
        raise InvalidEvent("created_at must be an integer between 0 and 2^53-1")
    kind = obj["kind"]
    if not _is_int(kind, 65535):
        raise InvalidEvent("kind must be an integer between 0 and 65535")
    tags = obj["tags"]
    if type(tags) is not list:
        raise InvalidEvent("tags must be an array")
    for t in tags:
        if type(t) is not list:
            raise InvalidEvent("each tag must be an array")
        if not t:
            raise InvalidEvent("tags must not be empty arrays")
        for v in t:
            if type(v) is not str:
                raise InvalidEvent("tag elements must be strings")
    content = obj["content"]
    if type(content) is not str:
        raise InvalidEvent("content must be a string")
    return Event(id_, pubkey, created_at, kind, tags, content, sig)


def canonical_json(pubkey: str, created_at: int, kind: int, tags: list, content: str) -> bytes:
    """NIP-01 id preimage: [0,pubkey,created_at,kind,tags,content], compact UTF-8.

    orjson escapes exactly like JSON.stringify (", \\, \\b \\f \\n \\r \\t, other
    C0 controls as lowercase \\u00xx, everything else raw UTF-8) and is verified
    against json.dumps(ensure_ascii=False) in the tests.
    """
    try:
        return orjson.dumps([0, pubkey, created_at, kind, tags, content])
    except TypeError as exc:
        # Lone surrogates (only reachable from json.loads, never orjson.loads)
        # have no UTF-8 form, so no id can exist for them.
        raise InvalidEvent(f"event cannot be serialized: {exc}") from None


def compute_id(pubkey: str, created_at: int, kind: int, tags: list, content: str) -> str:
    return hashlib.sha256(canonical_json(pubkey, created_at, kind, tags, content)).hexdigest()


def verify_id(ev: Event) -> bool:
    try:
        return compute_id(ev.pubkey, ev.created_at, ev.kind, ev.tags, ev.content) == ev.id
    except (InvalidEvent, TypeError):
        return False


def verify_signature(ev: Event) -> bool:
    """BIP-340 signature over the 32-byte id; False (never an exception) on bad hex or keys."""
    try:
        if len(ev.pubkey) != 64 or len(ev.sig) != 128 or len(ev.id) != 64:
            return False
        return xonly_key(ev.pubkey).verify(bytes.fromhex(ev.sig), bytes.fromhex(ev.id))
    except (ValueError, TypeError):
        return False


def verify_event(ev: Event) -> bool:
    """Id matches the content and the signature is valid."""
    return verify_id(ev) and verify_signature(ev)


def sign_event(
    secret_hex: str,
    kind: int,
    tags: list,
    content: str,
    created_at: int | None = None,
) -> Event:
    """Build and sign an event (for tests, clients and relay-authored events)."""
    if created_at is None:
        created_at = int(time.time())
    pubkey = public_key(secret_hex)
    tags = [list(t) for t in tags]
    id_ = compute_id(pubkey, created_at, kind, tags, content)
    sig = schnorr_sign(secret_hex, bytes.fromhex(id_))
    return Event(id_, pubkey, created_at, kind, tags, content, sig)


def is_event_id(value: object) -> bool:
    """Whether `value` is an event id as NIP-01 writes it: 64 lowercase hex characters."""
    return type(value) is str and _HEX64.fullmatch(value) is not None


def is_regular(kind: int) -> bool:
    return not (is_replaceable(kind) or is_ephemeral(kind) or is_addressable(kind))


def is_replaceable(kind: int) -> bool:
    return kind == 0 or kind == 3 or 10000 <= kind < 20000


def is_ephemeral(kind: int) -> bool:
    return 20000 <= kind < 30000


def is_addressable(kind: int) -> bool:
    return 30000 <= kind < 40000


def d_tag(ev: Event) -> str:
    """Value of the first d tag, or "" (NIP-01: a missing d tag counts as the empty identifier)."""
    for t in ev.tags:
        if t[0] == "d":
            return t[1] if len(t) > 1 else ""
    return ""


def expiration(ev: Event) -> int | None:
    """NIP-40 expiration timestamp, None if absent; raises InvalidEvent if malformed.

    A malformed value is refused rather than ignored: a relay that ignored it
    would keep forever an event its author meant to expire.
    """
    for t in ev.tags:
        if t[0] == "expiration":
            if len(t) < 2 or not _DIGITS.fullmatch(t[1]):
                raise InvalidEvent("malformed expiration tag")
            value = int(t[1])
            if value > MAX_SAFE_INT:
                raise InvalidEvent("malformed expiration tag")
            return value
    return None
