"""NIP-PL lease acceptance, stateless steps 1-7, plus pure helpers for the
stateful checks that run inside the store's write transaction — pure.

``check_lease_stateless`` evaluates, in order (first failure wins):

1. NIP-42 auth: authenticated, and authed pubkey == event pubkey
2. ``verify(event)`` (NIP-01 id + signature)
3. public tags (:mod:`.tags`), ending with the expiration bound
4. exec names an advertised key -> content <= max_content_len -> decrypt
5. plaintext size / strict JSON / unknown field / v=1 schema (:mod:`.plaintext`)
6. origin byte-equality with the descriptor's canonical origin
7. (active only) app_profile advertised -> transport equal -> filter grammar
   -> classes -> subscriptions-per-lease quota

What remains for the write transaction (in this order): endpoint uniqueness
(:func:`check_endpoint_unique`), active-lease quota (:func:`check_lease_quota`)
— both only for active leases — then step 8 (:func:`check_replacement`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .descriptor import LEASE_KIND, Descriptor, Limits
from .errors import LeaseRejected
from .grammar import check_classes, check_subscriptions
from .plaintext import LeasePlaintext, parse_lease_plaintext
from .tags import check_public_tags

__all__ = [
    "LeaseEvent",
    "AcceptedLease",
    "endpoint_hash",
    "check_lease_stateless",
    "check_replacement",
    "check_endpoint_unique",
    "check_lease_quota",
    "check_subscription_quota",
    "watermark_retention_until",
    "addressable_wins",
]


class LeaseEvent(Protocol):
    id: str
    pubkey: str
    created_at: int
    kind: int
    tags: Any
    content: str
    sig: str


@dataclass(frozen=True)
class AcceptedLease:
    pubkey: str
    d: str
    expiration: int
    exec_key_id: str
    plaintext: LeasePlaintext
    #: sha256 hex of the UTF-8 endpoint (None for inactive tombstones)
    endpoint_hash: str | None
    event_id: str
    created_at: int

    @property
    def address(self) -> tuple[str, str]:
        """(pubkey, d); the kind is always 30350."""
        return (self.pubkey, self.d)

    @property
    def active(self) -> bool:
        return self.plaintext.active

    @property
    def generation(self) -> int:
        return self.plaintext.generation

    @property
    def endpoint_key(self) -> tuple[str, str, str, str] | None:
        """(origin, app_profile, transport, endpoint_hash) for uniqueness lookups."""
        if not self.plaintext.active:
            return None
        p = self.plaintext
        assert p.app_profile is not None and p.transport is not None and self.endpoint_hash is not None
        return (p.origin, p.app_profile, p.transport, self.endpoint_hash)


def endpoint_hash(endpoint: str) -> str:
    return hashlib.sha256(endpoint.encode("utf-8")).hexdigest()


def check_subscription_quota(n_subscriptions: int, limits: Limits) -> None:
    if n_subscriptions > limits.max_subscriptions_per_lease:
        raise LeaseRejected("quota_exceeded")


def check_lease_stateless(
    event: LeaseEvent,
    *,
    authed_pubkey: str | None,
    descriptor: Descriptor,
    decrypt: Callable[[str, str], str],
    now: int,
    verify: Callable[[Any], bool] | None = None,
) -> AcceptedLease:
    """Steps 1-7 minus the stateful quota/uniqueness parts.

    ``decrypt(key_id, content) -> str`` raises ``KeyError`` for unknown /
    no-longer-accepted key ids and ``ValueError`` for undecryptable content.
    ``verify(event) -> bool`` checks NIP-01 id and signature; when omitted,
    ``appliance.nostr.event.verify_event`` is used (imported lazily).
    Raises :class:`LeaseRejected`; ``ValueError`` if ``event.kind != 30350``.
    """
    if event.kind != LEASE_KIND:
        raise ValueError("check_lease_stateless called with a non-30350 event")
    limits = descriptor.limits

    # 1. NIP-42
    if not authed_pubkey:
        raise LeaseRejected("auth_required")
    if authed_pubkey != event.pubkey:
        raise LeaseRejected("pubkey_mismatch")

    # 2. id + signature
    if verify is None:
        from appliance.nostr.event import verify_event as verify  # lazy: sibling package
    try:
        ok = verify(event)
    except Exception:  # a verifier that chokes on garbage is a failed verify
        ok = False
    if ok is not True:
        raise LeaseRejected("bad_signature")

    # 3. public tags + expiration bound
    tags = check_public_tags(event.tags, now=now, limits=limits)

    # 4. executor key + decryption
    if not descriptor.accepts_key(tags.exec_key_id):
        raise LeaseRejected("unknown_executor_key")
    content = event.content
    if not isinstance(content, str):
        raise LeaseRejected("undecryptable")
    if len(content.encode("utf-8", "surrogatepass")) > limits.max_content_len:
        raise LeaseRejected("content_too_long")
    try:
        text = decrypt(tags.exec_key_id, content)
    except KeyError:
        raise LeaseRejected("unknown_executor_key") from None
    except (ValueError, TypeError, UnicodeError):
        raise LeaseRejected("undecryptable") from None
    if not isinstance(text, str):
        raise LeaseRejected("undecryptable")

    # 5. schema
    pt = parse_lease_plaintext(text, limits)

    # 6. origin binding (byte-for-byte; no normalisation)
    if pt.origin.encode("utf-8") != descriptor.origin.encode("utf-8"):
        raise LeaseRejected("origin_mismatch")

    # 7. active-only checks; tombstones never consult profiles/endpoints
    ep_hash: str | None = None
    if pt.active:
        assert pt.app_profile is not None and pt.transport is not None and pt.endpoint is not None
        profile = descriptor.app_profile(pt.app_profile)
        if profile is None:
            raise LeaseRejected("unknown_app_profile")
        if profile.transport != pt.transport:
            raise LeaseRejected("transport_mismatch")
        pt = check_subscriptions(pt, author=event.pubkey, descriptor=descriptor)
        check_classes(pt.subscriptions, descriptor, pt.transport)
        check_subscription_quota(len(pt.subscriptions), limits)
        ep_hash = endpoint_hash(pt.endpoint)

    return AcceptedLease(
        pubkey=event.pubkey,
        d=tags.d,
        expiration=tags.expiration,
        exec_key_id=tags.exec_key_id,
        plaintext=pt,
        endpoint_hash=ep_hash,
        event_id=event.id,
        created_at=event.created_at,
    )


# ---------------------------------------------------------------------------
# stateful-check helpers (call inside the write transaction)
# ---------------------------------------------------------------------------


def check_endpoint_unique(conflicting_active_addresses: int) -> None:
    """Step 7 endpoint uniqueness: ``conflicting_active_addresses`` is the number
    of the same author's *other* addresses (different d) holding an unexpired
    active lease with the same (origin, app_profile, transport, endpoint_hash)."""
    if conflicting_active_addresses > 0:
        raise LeaseRejected("endpoint_already_leased")


def check_lease_quota(other_active_addresses: int, limits: Limits) -> None:
    """Step 7 quota: ``other_active_addresses`` counts the author's unexpired
    active leases at this origin at addresses *other than* the incoming one."""
    if other_active_addresses + 1 > limits.max_leases_per_pubkey:
        raise LeaseRejected("quota_exceeded")


def addressable_wins(stored_created_at: int, stored_id: str, incoming_created_at: int, incoming_id: str) -> bool:
    """NIP-01 addressable ordering: greater created_at, tie -> lowest id."""
    if incoming_created_at != stored_created_at:
        return incoming_created_at > stored_created_at
    return incoming_id < stored_id


def check_replacement(
    stored_created_at: int | None,
    stored_id: str | None,
    watermark: int | None,
    incoming_created_at: int,
    incoming_id: str,
    incoming_generation: int,
) -> None:
    """Step 8.  ``stored_*`` is the currently stored winner at the address (None
    if none); ``watermark`` the persisted generation watermark (None if none).
    (a) NIP-01 ordering, then (b) generation strictly above the watermark."""
    if stored_created_at is not None:
        if stored_id is None:
            raise ValueError("stored_id required with stored_created_at")
        if not addressable_wins(stored_created_at, stored_id, incoming_created_at, incoming_id):
            raise LeaseRejected("stale_replacement")
    if watermark is not None and incoming_generation <= watermark:
        raise LeaseRejected("stale_generation")


def watermark_retention_until(
    last_active_expiration: int | None, tombstone_accepted_at: int | None, limits: Limits
) -> int:
    """Earliest time the generation watermark for an address may be dropped:
    ``max(last_active_expiration, tombstone_accepted_at + max_lease_ttl) +
    allowed_skew`` with a tombstone, else ``last_active_expiration +
    allowed_skew``.  A missing ``last_active_expiration`` (address only ever
    held a tombstone) contributes nothing to the max."""
    if tombstone_accepted_at is None:
        if last_active_expiration is None:
            raise ValueError("need last_active_expiration or tombstone_accepted_at")
        return last_active_expiration + limits.allowed_skew
    candidates = [tombstone_accepted_at + limits.max_lease_ttl]
    if last_active_expiration is not None:
        candidates.append(last_active_expiration)
    return max(candidates) + limits.allowed_skew
