"""Effective lease state in SQL: the stateful acceptance checks (step 7 quotas/uniqueness and
step 8 ordering/watermark) and the state update, as hooks inside the event's write transaction.

Raising inside a check hook rolls the event's SAVEPOINT back, so a rejected lease leaves the
stored event, the lease row and the watermark byte-for-byte unchanged.
"""

from __future__ import annotations

import orjson

from appliance.errors import Rejected
from appliance.store import leases

from .acceptance import (
    AcceptedLease,
    check_endpoint_unique,
    check_lease_quota,
    check_replacement,
    watermark_retention_until,
)
from .descriptor import LEASE_KIND, Limits
from .errors import LeaseRejected
from appliance.store.interface import Connection

def _reject(exc: LeaseRejected) -> Rejected:
    return Rejected.from_wire(exc.message)


_NO_WATERMARK = object()


def check_stateful(conn: Connection, origin: int, lease: AcceptedLease, limits: Limits, now: int):
    """Step 7 (endpoint uniqueness, lease quota; active leases only) then step 8.

    Returns the address's watermark row (or None) for `apply_lease` in the same transaction."""
    try:
        if lease.active:
            p = lease.plaintext
            others, conflicts = leases.other_active(conn, origin, lease.pubkey, lease.d, p.app_profile, p.transport,
                                                    lease.endpoint_hash, now)
            check_endpoint_unique(conflicts)
            check_lease_quota(others, limits)
        rows = leases.stored_lease_events(conn, origin, lease.pubkey, LEASE_KIND, lease.d)
        row = min(rows, key=lambda r: (-r[1], r[0])) if rows else None
        wm = leases.watermark(conn, origin, lease.pubkey, lease.d)
        check_replacement(
            row[1] if row else None, row[0] if row else None, wm[0] if wm else None,
            lease.created_at, lease.event_id, lease.generation,
        )
        return wm
    except LeaseRejected as exc:
        raise _reject(exc) from None


def subscriptions_json(lease: AcceptedLease) -> str:
    subs = []
    for s in lease.plaintext.subscriptions:
        entry: dict = {"filter": s.filter.to_nip01(), "class": s.cls}
        if s.ignore:
            entry["ignore"] = [f.to_nip01() for f in s.ignore]
        if s.p_tags_max is not None:
            entry["p_tags_max"] = s.p_tags_max
        subs.append(entry)
    return orjson.dumps(subs).decode()


def selectors(lease: AcceptedLease) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for s in lease.plaintext.subscriptions:
        out.update(("p", v) for v in s.filter.p)
        out.update(("h", v) for v in s.filter.h)
        out.update(("authors", v) for v in s.filter.authors)
    return out


def apply_lease(conn: Connection, origin: int, lease: AcceptedLease, limits: Limits, now: int,
                watermark=_NO_WATERMARK) -> None:
    """Write effective state, watermark and match index for an accepted lease.

    `watermark` is what `check_stateful` read in this transaction (saves a lookup)."""
    p = lease.plaintext
    leases.put_lease(
        conn,
        (origin, lease.pubkey, lease.d, lease.event_id, lease.created_at, lease.expiration, p.generation,
         1 if p.active else 0,
         p.app_profile if p.active else None, p.transport if p.active else None,
         p.endpoint if p.active else None, lease.endpoint_hash if p.active else None,
         subscriptions_json(lease) if p.active else "[]", lease.exec_key_id),
    )
    old = leases.watermark(conn, origin, lease.pubkey, lease.d) if watermark is _NO_WATERMARK else watermark
    last_active = old[1] if old else None
    tomb_at = old[2] if old else None
    if p.active:
        last_active = lease.expiration if last_active is None else max(last_active, lease.expiration)
    else:
        tomb_at = now
    retain = watermark_retention_until(last_active, tomb_at, limits)
    leases.put_watermark(conn, origin, lease.pubkey, lease.d, p.generation, last_active, tomb_at, retain)
    if old is not None:  # selectors exist only where a lease (and so a watermark) was stored before
        leases.delete_selectors(conn, origin, lease.pubkey, lease.d)
    if p.active:
        leases.insert_selectors(conn, origin, lease.pubkey, lease.d, selectors(lease))
