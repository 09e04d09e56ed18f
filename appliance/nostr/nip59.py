"""NIP-59 gift wraps: the relay's access rules for private envelopes (never decrypts), and the
client side (rumor -> seal -> gift wrap, and back) for tools that send and open them."""

from __future__ import annotations

import secrets as _secrets
import time as _time

import orjson

from . import nip44
from .event import Event, InvalidEvent, compute_id, parse_event, sign_event, verify_event, verify_id
from .keys import generate_secret, public_key

__all__ = ["GIFT_WRAP_KINDS", "DM_KINDS", "recipients", "is_gated_kind", "may_read_private",
           "UnwrapError", "make_rumor", "parse_rumor", "gift_wrap", "unwrap"]

GIFT_WRAP_KINDS = frozenset({1059, 1060})
DM_KINDS = frozenset({4})
_GATED = GIFT_WRAP_KINDS | DM_KINDS


def recipients(ev: Event) -> set[str]:
    """Values of the event's p tags."""
    return {t[1] for t in ev.tags if len(t) > 1 and t[0] == "p"}


def is_gated_kind(kind: int) -> bool:
    """Kinds whose events only their author and p-tagged recipients may read."""
    return kind in _GATED


def may_read_private(ev: Event, reader_pubkey: str | None) -> bool:
    """True if reader_pubkey is the author or a p-tagged recipient."""
    if not reader_pubkey:
        return False
    if ev.pubkey == reader_pubkey:
        return True
    for t in ev.tags:
        if len(t) > 1 and t[0] == "p" and t[1] == reader_pubkey:
            return True
    return False


# --- NIP-59 envelopes: rumor -> seal (kind 13) -> gift wrap (kind 1059) ---------------------------

SEAL_KIND = 13
GIFT_WRAP_KIND = 1059
# NIP-59: created_at of seals and wraps SHOULD be tweaked into the past to thwart timing analysis.
TIMESTAMP_TWEAK = 2 * 24 * 3600


class UnwrapError(ValueError):
    """A gift wrap, seal or rumor that cannot be opened or fails a NIP-59 check; str() is the reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def make_rumor(pubkey: str, kind: int, tags: list, content: str, created_at: int | None = None) -> dict:
    """An unsigned event (a rumor): every field of an event, with its id, but no sig."""
    if created_at is None:
        created_at = int(_time.time())
    tags = [list(t) for t in tags]
    return {"id": compute_id(pubkey, created_at, kind, tags, content), "pubkey": pubkey,
            "created_at": created_at, "kind": kind, "tags": tags, "content": content}


def parse_rumor(obj: object) -> dict:
    """Check a rumor's shape and id; a rumor never carries a sig (it would make it publishable)."""
    if type(obj) is not dict:
        raise UnwrapError("rumor must be a JSON object")
    if "sig" in obj:
        raise UnwrapError("rumor must not have a sig")
    try:
        # Same field rules as a signed event; the placeholder sig is never checked or kept.
        ev = parse_event({**obj, "sig": "0" * 128})
    except InvalidEvent as exc:
        raise UnwrapError(f"malformed rumor: {exc.reason}") from None
    if not verify_id(ev):
        raise UnwrapError("rumor id does not match its content")
    return {k: obj[k] for k in ("id", "pubkey", "created_at", "kind", "tags", "content")}


def _tweaked(now: int) -> int:
    return now - _secrets.randbelow(TIMESTAMP_TWEAK)


def gift_wrap(rumor: dict, sender_secret: str, recipient_pubkey: str, *, now: int | None = None) -> Event:
    """Seal a rumor from sender to recipient and wrap it with a one-time key (kind 1059, `p` = recipient)."""
    rumor = parse_rumor(rumor)
    if rumor["pubkey"] != public_key(sender_secret):
        raise ValueError("the rumor's pubkey must be the sender's")
    now = int(_time.time()) if now is None else now
    seal_key = nip44.get_conversation_key(sender_secret, recipient_pubkey)
    seal = sign_event(sender_secret, SEAL_KIND, [], nip44.encrypt(_json(rumor), seal_key), created_at=_tweaked(now))
    wrapper = generate_secret()
    wrap_key = nip44.get_conversation_key(wrapper, recipient_pubkey)
    return sign_event(wrapper, GIFT_WRAP_KIND, [["p", recipient_pubkey]],
                      nip44.encrypt(seal.to_json(), wrap_key), created_at=_tweaked(now))


def unwrap(wrap: Event, recipient_secret: str) -> tuple[dict, str]:
    """Open a gift wrap addressed to us: (rumor, sender pubkey). The seal's signer must be the rumor's author."""
    me = public_key(recipient_secret)
    if wrap.kind != GIFT_WRAP_KIND:
        raise UnwrapError(f"kind {wrap.kind} is not a gift wrap")
    if not verify_event(wrap):
        raise UnwrapError("gift wrap signature does not verify")
    if me not in recipients(wrap):
        raise UnwrapError("gift wrap is not addressed to this key")
    try:
        seal = parse_event(_loads(nip44.decrypt(wrap.content, nip44.get_conversation_key(recipient_secret,
                                                                                       wrap.pubkey))))
    except (nip44.Nip44Error, InvalidEvent, ValueError) as exc:
        raise UnwrapError(f"cannot open gift wrap: {exc}") from None
    if seal.kind != SEAL_KIND:
        raise UnwrapError(f"inner event kind {seal.kind} is not a seal")
    if not verify_event(seal):
        raise UnwrapError("seal signature does not verify")
    try:
        rumor = parse_rumor(_loads(nip44.decrypt(seal.content, nip44.get_conversation_key(recipient_secret,
                                                                                         seal.pubkey))))
    except (nip44.Nip44Error, ValueError) as exc:
        raise UnwrapError(f"cannot open seal: {exc}") from None
    if rumor["pubkey"] != seal.pubkey:
        raise UnwrapError("rumor author is not the seal's signer")
    return rumor, seal.pubkey


def _json(obj: dict) -> str:
    return orjson.dumps(obj).decode()


def _loads(text: str):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError("not JSON") from None
