"""Moderation of one origin: banned and allowed pubkeys, events, kinds and client addresses.

These are the operations of the NIP-86 management API and of the dashboard's Origins page, as
functions over a write transaction. Each keeps the origin's lists (what the relay enforces, see
`Origin`) and the reasons given (`moderation_notes`) together, and bumps the config generation.

Readings of NIP-86 (docs/spec-notes.md A1-A3): banning a pubkey removes it from the allowlist and
allowing removes it from the blocklist; an allowlist, once it has an entry, restricts writers (as
`appliance origins allow` always has); banning an event deletes the stored copy and refuses it
from then on; allowing an event lifts a ban (there is no moderation queue); allowing a kind puts it
on the kind allowlist (which, once it has an entry, admits only the kinds on it) and lifts a
disallow, disallowing takes it off the allowlist and refuses it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from appliance.errors import ConfigError
from appliance.origins import Origin, normalize_ip
from appliance.settings import Settings
from appliance.nostr.nip19 import Nip19Error, decode_key
from appliance.store import admin as notes
from appliance.store.fingerprints import FINGERPRINT_HEX, matching, seen_pubkeys

from .origins import change_list, edit_origin, find
from appliance.store.interface import Connection

_HEX = frozenset("0123456789abcdef")


_FINGERPRINT = re.compile(r"pk:[0-9a-f]{%d}" % FINGERPRINT_HEX)


@dataclass(frozen=True)
class PubkeyRef:
    """A pubkey as the operator gave it: `pubkey` (64 hex) and, when given as a fingerprint, that
    fingerprint (what to say about it: the full key is not repeated)."""

    pubkey: str
    fingerprint: str | None = None

    @property
    def shown(self) -> str:
        return self.fingerprint or self.pubkey


def resolve_pubkey(conn: Connection, value: Any, *, origin: Origin | None = None,
                   fingerprint_key: bytes | None = None, what: str = "pubkey") -> PubkeyRef:
    """A pubkey given as 64 hex characters, as `npub1...`, or as a fingerprint (`pk:...`) of a
    pubkey this instance has seen (at `origin` first, then anywhere). An unknown fingerprint, or
    one that two seen pubkeys share, is refused with what to give instead."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and len(text) == 64 and set(text.lower()) <= _HEX:
        return PubkeyRef(text.lower())
    if isinstance(text, str) and text.lower().startswith("npub1"):
        try:
            return PubkeyRef(decode_key(text.lower(), "npub").hex())
        except Nip19Error as exc:
            raise ConfigError(what, text, f"not a valid npub ({exc}): expected 64 lowercase hex characters, an "
                              "npub1..., or a fingerprint pk:... as the dashboard shows it") from None
    if isinstance(text, str) and text.lower().startswith(("nsec1", "ncryptsec1")):
        raise ConfigError(what, text, "that is a secret key: give the pubkey (hex or npub1...), and keep the "
                          "secret private")
    if isinstance(text, str) and _FINGERPRINT.fullmatch(text):
        if fingerprint_key is None:
            raise ConfigError(what, text, "a fingerprint is resolved by the appliance that showed it: use the "
                              "dashboard, or give the pubkey as hex or npub1...")
        found = matching(fingerprint_key, text, [*(sorted(origin.block | origin.allow) if origin else []),
                                                 *seen_pubkeys(conn, origin.id if origin else None)])
        if not found and origin is not None:
            found = matching(fingerprint_key, text, seen_pubkeys(conn))
        if len(found) == 1:
            return PubkeyRef(found[0], text)
        if not found:
            raise ConfigError(what, text, "no pubkey this appliance has seen has that fingerprint (fingerprints "
                              "are this appliance's own: copy it from its dashboard), or give the pubkey as hex "
                              "or npub1...")
        raise ConfigError(what, text, f"ambiguous: {len(found)} pubkeys this appliance has seen share that "
                          "fingerprint; give the pubkey as hex or npub1... instead")
    raise ConfigError(what, value, "expected a pubkey: 64 lowercase hex characters, an npub1..., or a "
                      "fingerprint pk:... as the dashboard shows it")


def _pubkey(conn: Connection, value: Any, origin: str | int, fingerprint_key: bytes | None) -> PubkeyRef:
    return resolve_pubkey(conn, value, origin=find(conn, origin), fingerprint_key=fingerprint_key)


def _hex64(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise ConfigError(what, value, "expected 64 lowercase hex characters")
    return value


def _kind(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError("kind", value, "expected a kind number from 0 to 65535")
    return value


def _reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str) or len(reason) > 1000:
        raise ConfigError("reason", reason, "expected text of at most 1000 characters")
    return reason


def _now() -> int:
    return int(time.time())


# -- pubkeys ----------------------------------------------------------------------------------------


def ban_pubkey(conn: Connection, settings: Settings, origin: str | int, pubkey: str,
               reason: str | None = None, *, fingerprint_key: bytes | None = None) -> Origin:
    pubkey = _pubkey(conn, pubkey, origin, fingerprint_key).pubkey
    o = find(conn, origin)
    if pubkey in o.allow:
        change_list(conn, settings, o.id, "allow", remove=[pubkey])
        notes.drop_note(conn, o.id, "allowed_pubkey", pubkey)
    saved = change_list(conn, settings, o.id, "block", add=[pubkey])
    notes.save_note(conn, o.id, "banned_pubkey", pubkey, _reason(reason), _now())
    return saved


def unban_pubkey(conn: Connection, settings: Settings, origin: str | int, pubkey: str, *,
                 fingerprint_key: bytes | None = None) -> Origin:
    pubkey = _pubkey(conn, pubkey, origin, fingerprint_key).pubkey
    o = find(conn, origin)
    notes.drop_note(conn, o.id, "banned_pubkey", pubkey)
    return change_list(conn, settings, o.id, "block", remove=[pubkey])


def allow_pubkey(conn: Connection, settings: Settings, origin: str | int, pubkey: str,
                 reason: str | None = None, *, fingerprint_key: bytes | None = None) -> Origin:
    pubkey = _pubkey(conn, pubkey, origin, fingerprint_key).pubkey
    o = find(conn, origin)
    if pubkey in o.block:
        change_list(conn, settings, o.id, "block", remove=[pubkey])
        notes.drop_note(conn, o.id, "banned_pubkey", pubkey)
    saved = change_list(conn, settings, o.id, "allow", add=[pubkey])
    notes.save_note(conn, o.id, "allowed_pubkey", pubkey, _reason(reason), _now())
    return saved


def unallow_pubkey(conn: Connection, settings: Settings, origin: str | int, pubkey: str, *,
                   fingerprint_key: bytes | None = None) -> Origin:
    pubkey = _pubkey(conn, pubkey, origin, fingerprint_key).pubkey
    o = find(conn, origin)
    notes.drop_note(conn, o.id, "allowed_pubkey", pubkey)
    return change_list(conn, settings, o.id, "allow", remove=[pubkey])


def list_pubkeys(conn: Connection, origin: str | int, which: str) -> list[tuple[str, str]]:
    """(pubkey, reason) on the origin's `block` or `allow` list."""
    o = find(conn, origin)
    reasons = notes.notes(conn, o.id, "banned_pubkey" if which == "block" else "allowed_pubkey")
    return [(pk, reasons.get(pk, ("", 0))[0]) for pk in sorted(getattr(o, which))]


# -- events -------------------------------------------------------------------------------------------


def ban_event(conn: Connection, settings: Settings, origin: str | int, event_id: str,
              reason: str | None = None) -> Origin:
    """Delete the stored event and refuse it from now on."""
    from appliance.store.events import delete_event

    event_id = _hex64(event_id, "event id")
    o = find(conn, origin)
    delete_event(conn, o.id, event_id)
    notes.drop_note(conn, o.id, "allowed_event", event_id)
    saved = change_list(conn, settings, o.id, "ban_events", add=[event_id])
    notes.save_note(conn, o.id, "banned_event", event_id, _reason(reason), _now())
    return saved


def unban_event(conn: Connection, settings: Settings, origin: str | int, event_id: str) -> Origin:
    event_id = _hex64(event_id, "event id")
    o = find(conn, origin)
    notes.drop_note(conn, o.id, "banned_event", event_id)
    return change_list(conn, settings, o.id, "ban_events", remove=[event_id])


def allow_event(conn: Connection, settings: Settings, origin: str | int, event_id: str,
                reason: str | None = None) -> Origin:
    """Lift a ban and note the approval (there is no moderation queue to release it from)."""
    saved = unban_event(conn, settings, origin, event_id)
    notes.save_note(conn, saved.id, "allowed_event", event_id, _reason(reason), _now())
    return saved


def unallow_event(conn: Connection, origin: str | int, event_id: str) -> None:
    event_id = _hex64(event_id, "event id")
    notes.drop_note(conn, find(conn, origin).id, "allowed_event", event_id)


def list_events(conn: Connection, origin: str | int, which: str) -> list[tuple[str, str]]:
    """(event id, reason) banned (`which` = "banned") or allowed ("allowed")."""
    o = find(conn, origin)
    if which == "banned":
        reasons = notes.notes(conn, o.id, "banned_event")
        return [(eid, reasons.get(eid, ("", 0))[0]) for eid in sorted(o.ban_events)]
    return [(eid, reason) for eid, (reason, _at) in notes.notes(conn, o.id, "allowed_event").items()]


# -- kinds ---------------------------------------------------------------------------------------------


def allow_kind(conn: Connection, settings: Settings, origin: str | int, kind: int) -> Origin:
    kind = _kind(kind)
    o = find(conn, origin)
    if kind in o.block_kinds:
        change_list(conn, settings, o.id, "block_kinds", remove=[kind])
    return change_list(conn, settings, o.id, "allow_kinds", add=[kind])


def disallow_kind(conn: Connection, settings: Settings, origin: str | int, kind: int) -> Origin:
    kind = _kind(kind)
    o = find(conn, origin)
    if kind in o.allow_kinds:
        change_list(conn, settings, o.id, "allow_kinds", remove=[kind])
    return change_list(conn, settings, o.id, "block_kinds", add=[kind])


def clear_kind(conn: Connection, settings: Settings, origin: str | int, kind: int) -> Origin:
    """Take a kind off both lists (the dashboard's "remove")."""
    kind = _kind(kind)
    change_list(conn, settings, origin, "allow_kinds", remove=[kind])
    return change_list(conn, settings, origin, "block_kinds", remove=[kind])


# -- client addresses -------------------------------------------------------------------------------------


def block_ip(conn: Connection, settings: Settings, origin: str | int, ip: str,
             reason: str | None = None) -> Origin:
    ip = normalize_ip(ip)
    saved = change_list(conn, settings, origin, "block_ips", add=[ip])
    notes.save_note(conn, saved.id, "blocked_ip", ip, _reason(reason), _now())
    return saved


def unblock_ip(conn: Connection, settings: Settings, origin: str | int, ip: str) -> Origin:
    ip = normalize_ip(ip)
    saved = change_list(conn, settings, origin, "block_ips", remove=[ip])
    notes.drop_note(conn, saved.id, "blocked_ip", ip)
    return saved


def list_blocked_ips(conn: Connection, origin: str | int) -> list[tuple[str, str]]:
    o = find(conn, origin)
    reasons = notes.notes(conn, o.id, "blocked_ip")
    return [(ip, reasons.get(ip, ("", 0))[0]) for ip in sorted(o.block_ips)]


# -- relay information ------------------------------------------------------------------------------------


def change_info(conn: Connection, settings: Settings, origin: str | int, field: str, value: Any) -> Origin:
    """NIP-11 name, description or icon of the origin."""
    if field not in ("name", "description", "icon"):
        raise ConfigError("field", field, "one of name, description, icon")
    if not isinstance(value, str) or len(value) > 4096:
        raise ConfigError(field, value, "expected text of at most 4096 characters")
    return edit_origin(conn, settings, origin, {field: value})
