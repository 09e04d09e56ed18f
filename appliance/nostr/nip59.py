"""Access rules for private envelopes (NIP-04 DMs, NIP-59 gift wraps); never decrypts."""

from __future__ import annotations

from .event import Event

__all__ = ["GIFT_WRAP_KINDS", "DM_KINDS", "recipients", "is_gated_kind", "may_read_private"]

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
