"""The one read-authorization rule: who may read which event at which origin.

`can_read` is the rule. `read_scope` is the same rule handed to the store as a `ReadScope`, so a
REQ's SQL never returns what `can_read` would refuse (a property test holds the two together).
Every read path uses them: REQ, COUNT, live broadcast, and the push matcher and wake workers.
"""

from __future__ import annotations

from typing import Protocol

from appliance.nostr.event import Event
from appliance.origins import Origin
from appliance.store.events import ReadScope, group_of

# NIP-04 DMs and NIP-59 gift wraps: readable by the author and p-tagged recipients only.
GATED_KINDS = frozenset({4, 1059, 1060})
# NIP-PL push leases: "to all other queriers the kind behaves as if no such events exist".
AUTHOR_ONLY_KINDS = frozenset({30350})


class GroupView(Protocol):
    """What read authorization needs to know about groups (implemented by relay.groups)."""

    def is_private(self, origin_id: int, group: str) -> bool: ...

    def is_member(self, origin_id: int, group: str, pubkey: str) -> bool: ...

    def hidden_groups(self, origin_id: int, reader: str | None) -> frozenset[str]: ...


class NoGroups:
    """A GroupView for relays without groups."""

    def is_private(self, origin_id: int, group: str) -> bool:
        return False

    def is_member(self, origin_id: int, group: str, pubkey: str) -> bool:
        return False

    def hidden_groups(self, origin_id: int, reader: str | None) -> frozenset[str]:
        return frozenset()


def may_enter(origin: Origin, reader: str | None) -> bool:
    """Origin-level gate: may this reader read anything at all here?"""
    if reader is not None and reader in origin.block:
        return False
    if origin.access_policy == "members":
        return reader is not None and reader in origin.allow
    return True


# NIP-29 member list snapshot: relay-signed (clients cannot publish 39000-39009), filed under
# its group so a private group's membership is as private as its messages.
GROUP_MEMBERS_KIND = 39002


def event_group(ev: Event) -> str | None:
    """The group an event belongs to for read authorization (the store's `grp` column)."""
    if ev.kind == GROUP_MEMBERS_KIND:
        return ev.first_tag("d")
    return group_of(ev)


def can_read(origin: Origin, reader: str | None, ev: Event, groups: GroupView) -> bool:
    """True when `reader` (an authenticated pubkey, or None) may read `ev` at `origin`."""
    if not may_enter(origin, reader):
        return False
    if ev.kind in AUTHOR_ONLY_KINDS and (reader is None or reader != ev.pubkey):
        return False
    if ev.kind in GATED_KINDS:
        if reader is None:
            return False
        if reader != ev.pubkey and reader not in ev.tag_values("p"):
            return False
    group = event_group(ev)
    if group is not None and groups.is_private(origin.id, group):
        return reader is not None and groups.is_member(origin.id, group, reader)
    return True


def read_scope(origin: Origin, reader: str | None, groups: GroupView) -> ReadScope:
    """`can_read` for the store's SQL (callers check `may_enter` first)."""
    return ReadScope(
        reader=reader,
        gated_kinds=GATED_KINDS,
        author_only_kinds=AUTHOR_ONLY_KINDS,
        hidden_groups=groups.hidden_groups(origin.id, reader),
    )


def needs_auth(kinds: frozenset[int] | None) -> bool:
    """Whether a filter asks explicitly for kinds only an authenticated reader can see."""
    return kinds is not None and bool(kinds) and kinds <= (GATED_KINDS | AUTHOR_ONLY_KINDS)
