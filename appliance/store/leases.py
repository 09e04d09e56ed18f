"""Effective lease state: the `leases` rows, their `lease_watermarks` and the `lease_selectors`
match index. The acceptance rules live in `appliance.push`; this module only reads and writes rows."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from appliance.store import wakes
from appliance.store.interface import Connection
from appliance.store.statement import SQL, dialect_of

# One pass over the author's unexpired active leases at other addresses (<= max_leases_per_pubkey rows):
# (how many, how many hold the same (app_profile, transport, endpoint_hash)).
SQL_OTHER_ACTIVE = SQL(
    "SELECT count(*), coalesce(sum(app_profile = ? AND transport = ? AND endpoint_hash = ?), 0) FROM leases "
    "WHERE origin = ? AND pubkey = ? AND active = 1 AND expiration > ? AND d != ?",
    "SELECT count(*), coalesce(sum(app_profile = %s AND transport = %s AND endpoint_hash = %s), 0) FROM leases "
    "WHERE origin = %s AND pubkey = %s AND active = 1 AND expiration > %s AND d != %s",
)
# Same shape as the store's address lookup (events_address index); at most one row per address.
SQL_STORED_WINNER = SQL("SELECT id, created_at FROM events WHERE origin = ? AND pubkey = ? AND kind = ? AND d = ?",
                        "SELECT id, created_at FROM events WHERE origin = %s AND pubkey = %s AND kind = %s AND d = %s")
SQL_WATERMARK = SQL(
    "SELECT generation, last_active_expiration, tombstone_accepted_at FROM lease_watermarks "
    "WHERE origin = ? AND pubkey = ? AND d = ?",
    "SELECT generation, last_active_expiration, tombstone_accepted_at FROM lease_watermarks "
    "WHERE origin = %s AND pubkey = %s AND d = %s",
)
SQL_UPSERT_LEASE = SQL(
    "INSERT OR REPLACE INTO leases (origin, pubkey, d, event_id, created_at, expiration, generation, active, "
    "app_profile, transport, endpoint, endpoint_hash, subscriptions, exec_key_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "INSERT INTO leases (origin, pubkey, d, event_id, created_at, expiration, generation, active, "
    "app_profile, transport, endpoint, endpoint_hash, subscriptions, exec_key_id) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (origin, pubkey, d) DO UPDATE "
    "SET event_id = EXCLUDED.event_id, created_at = EXCLUDED.created_at, expiration = EXCLUDED.expiration, "
    "generation = EXCLUDED.generation, active = EXCLUDED.active, app_profile = EXCLUDED.app_profile, "
    "transport = EXCLUDED.transport, endpoint = EXCLUDED.endpoint, endpoint_hash = EXCLUDED.endpoint_hash, "
    "subscriptions = EXCLUDED.subscriptions, exec_key_id = EXCLUDED.exec_key_id, revoked_at = DEFAULT, "
    "invalidated_at = DEFAULT",
)
SQL_UPSERT_WATERMARK = SQL(
    "INSERT OR REPLACE INTO lease_watermarks (origin, pubkey, d, generation, last_active_expiration, "
    "tombstone_accepted_at, retain_until) VALUES (?, ?, ?, ?, ?, ?, ?)",
    "INSERT INTO lease_watermarks (origin, pubkey, d, generation, last_active_expiration, "
    "tombstone_accepted_at, retain_until) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (origin, pubkey, d) DO "
    "UPDATE SET generation = EXCLUDED.generation, last_active_expiration = EXCLUDED.last_active_expiration, "
    "tombstone_accepted_at = EXCLUDED.tombstone_accepted_at, retain_until = EXCLUDED.retain_until",
)
SQL_DELETE_SELECTORS = SQL("DELETE FROM lease_selectors WHERE origin = ? AND pubkey = ? AND d = ?",
                           "DELETE FROM lease_selectors WHERE origin = %s AND pubkey = %s AND d = %s")
SQL_INSERT_SELECTOR = SQL(
    "INSERT OR IGNORE INTO lease_selectors (origin, selector_type, value, pubkey, d) VALUES (?, ?, ?, ?, ?)",
    "INSERT INTO lease_selectors (origin, selector_type, value, pubkey, d) VALUES (%s, %s, %s, %s, %s) ON CONFLICT "
    "DO NOTHING",
)


def other_active(conn: Connection, origin: int, pubkey: str, d: str, app_profile: str, transport: str,
                 endpoint_hash: str, now: int) -> tuple[int, int]:
    """(the author's unexpired active leases at other addresses, how many hold this endpoint)."""
    others, conflicts = conn.execute(
        SQL_OTHER_ACTIVE, (app_profile, transport, endpoint_hash, origin, pubkey, now, d)).fetchone()
    return others, conflicts


def stored_lease_events(conn: Connection, origin: int, pubkey: str, kind: int, d: str) -> list[tuple[str, int]]:
    """(id, created_at) of the lease events stored at the address."""
    return conn.execute(SQL_STORED_WINNER, (origin, pubkey, kind, d)).fetchall()


def watermark(conn: Connection, origin: int, pubkey: str, d: str) -> tuple | None:
    """(generation, last_active_expiration, tombstone_accepted_at) at the address, if any."""
    return conn.execute(SQL_WATERMARK, (origin, pubkey, d)).fetchone()


def put_lease(conn: Connection, row: tuple) -> None:
    """Replace the effective lease row (columns of SQL_UPSERT_LEASE, in order)."""
    conn.execute(SQL_UPSERT_LEASE, row)


def put_watermark(conn: Connection, origin: int, pubkey: str, d: str, generation: int,
                  last_active: int | None, tombstone_at: int | None, retain_until: int) -> None:
    conn.execute(SQL_UPSERT_WATERMARK, (origin, pubkey, d, generation, last_active, tombstone_at, retain_until))


def delete_selectors(conn: Connection, origin: int, pubkey: str, d: str) -> None:
    conn.execute(SQL_DELETE_SELECTORS, (origin, pubkey, d))


def insert_selectors(conn: Connection, origin: int, pubkey: str, d: str, pairs) -> None:
    """Index the lease under each (selector type, value) pair."""
    conn.executemany(SQL_INSERT_SELECTOR, [(origin, t, v, pubkey, d) for t, v in pairs])


def purge(conn: Connection, now: int) -> int:
    """Drop expired lease rows (and their index) and watermarks past their retention."""
    conn.execute(
        SQL("DELETE FROM lease_selectors WHERE EXISTS (SELECT 1 FROM leases l WHERE l.origin = lease_selectors.origin "
            "AND l.pubkey = lease_selectors.pubkey AND l.d = lease_selectors.d AND l.expiration <= ?)",
            "DELETE FROM lease_selectors WHERE EXISTS (SELECT 1 FROM leases l WHERE l.origin = lease_selectors.origin "
            "AND l.pubkey = lease_selectors.pubkey AND l.d = lease_selectors.d AND l.expiration <= %s)"), (now,)
    )
    conn.execute(SQL("DELETE FROM leases WHERE expiration <= ?", "DELETE FROM leases WHERE expiration <= %s"), (now,))
    n = conn.changes()
    conn.execute(SQL("DELETE FROM lease_watermarks WHERE retain_until <= ?",
                     "DELETE FROM lease_watermarks WHERE retain_until <= %s"), (now,))
    return n + conn.changes()


# One statement per event: the (selector type, value) pairs the event offers, looked up in the
# lease_selectors primary key (json_each drives the loop: CROSS JOIN keeps that order), joined to
# the effective lease row. Cost follows the number of candidates, not the number of leases.
SQL_CANDIDATES = SQL(
    "SELECT DISTINCT l.pubkey, l.d, l.event_id, l.generation, l.app_profile, l.transport, l.endpoint_hash, "
    "l.subscriptions, l.endpoint, l.expiration FROM json_each(?) j CROSS JOIN lease_selectors s ON s.origin = ? "
    "AND s.selector_type = j.value ->> 0 AND s.value = j.value ->> 1 "
    "JOIN leases l ON l.origin = s.origin AND l.pubkey = s.pubkey AND l.d = s.d "
    "WHERE l.active = 1 AND l.expiration > ? AND l.invalidated_at IS NULL",
    "SELECT DISTINCT l.pubkey, l.d, l.event_id, l.generation, l.app_profile, l.transport, l.endpoint_hash, "
    "l.subscriptions, l.endpoint, l.expiration FROM jsonb_array_elements(%s::jsonb) j JOIN lease_selectors s "
    "ON s.origin = %s AND s.selector_type = j.value ->> 0 AND s.value = j.value ->> 1 "
    "JOIN leases l ON l.origin = s.origin AND l.pubkey = s.pubkey AND l.d = s.d "
    "WHERE l.active = 1 AND l.expiration > %s AND l.invalidated_at IS NULL",
)
SQL_EFFECTIVE = SQL(
    "SELECT generation, active, expiration, invalidated_at, app_profile, transport, endpoint, endpoint_hash "
    "FROM leases WHERE origin = ? AND pubkey = ? AND d = ?",
    "SELECT generation, active, expiration, invalidated_at, app_profile, transport, endpoint, endpoint_hash "
    "FROM leases WHERE origin = %s AND pubkey = %s AND d = %s",
)
SQL_INVALIDATE = SQL(
    "UPDATE leases SET invalidated_at = ? WHERE origin = ? AND pubkey = ? AND d = ? AND generation = ? "
    "AND invalidated_at IS NULL",
    "UPDATE leases SET invalidated_at = %s WHERE origin = %s AND pubkey = %s AND d = %s AND generation = %s "
    "AND invalidated_at IS NULL",
)


@dataclass(frozen=True)
class Candidate:
    """An effective, unexpired, active lease whose selectors name something in an event."""

    pubkey: str
    d: str
    event_id: str  # the lease event: keys the parsed-subscriptions cache
    generation: int
    app_profile: str
    transport: str
    endpoint_hash: str
    subscriptions: str  # JSON, as `subscriptions_json` wrote it
    endpoint: str
    expiration: int


def candidate_leases(conn: Connection, origin: int, author: str, p_values, h_values, now: int
                     ) -> list[Candidate]:
    """Leases at `origin` whose `authors`, `#p` or `#h` selectors name the event's author, one of
    its p tags or one of its h tags (the only selectors a lease filter can narrow by)."""
    keys = [("authors", author)] + [("p", v) for v in p_values] + [("h", v) for v in h_values]
    rows = conn.execute(SQL_CANDIDATES, (orjson.dumps(keys).decode(), origin, now))
    return [Candidate(*r) for r in rows]


@dataclass(frozen=True)
class EffectiveLease:
    generation: int
    active: bool
    expiration: int
    invalidated: bool
    app_profile: str | None
    transport: str | None
    endpoint: str | None
    endpoint_hash: str | None


def effective_lease(conn: Connection, origin: int, pubkey: str, d: str) -> EffectiveLease | None:
    """The effective state at a lease address now (None: no lease there any more)."""
    row = conn.execute(SQL_EFFECTIVE, (origin, pubkey, d)).fetchone()
    if row is None:
        return None
    gen, active, expiration, invalidated_at, profile, transport, endpoint, endpoint_hash = row
    return EffectiveLease(gen, bool(active), expiration, invalidated_at is not None, profile, transport, endpoint,
                          endpoint_hash)


def invalidate_generation(conn: Connection, origin: int, pubkey: str, d: str, generation: int,
                          now: float) -> bool:
    """The transport said this generation's endpoint is dead: no wake for it until a newer
    generation replaces the lease row (NIP-PL, Lease and Key Lifecycle: endpoint rotation)."""
    conn.execute(SQL_INVALIDATE, (now, origin, pubkey, d, generation))
    return conn.changes() > 0


# -- operator views (the dashboard) ----------------------------------------------------------------

LEASE_STATES = ("active", "expired", "tombstoned", "revoked", "endpoint-invalid")

_LEASE_COLUMNS = (
    "SELECT origin, pubkey, d, event_id, created_at, expiration, generation, active, app_profile, transport, "
    "endpoint_hash, subscriptions, exec_key_id, revoked_at, invalidated_at FROM leases"
)
SQL_LEASE = SQL(f"{_LEASE_COLUMNS} WHERE origin = ? AND pubkey = ? AND d = ?",
                f"{_LEASE_COLUMNS} WHERE origin = %s AND pubkey = %s AND d = %s")
# Each state as a condition (bound `now`, `{}` its mark); endpoint-invalid: the transport said this
# generation's endpoint is dead (delivery sets invalidated_at; a newer generation clears it).
_STATE_SQL = {
    "active": "(active = 1 AND invalidated_at IS NULL AND expiration > {})",
    "expired": "(expiration <= {})",
    "tombstoned": "(active = 0 AND revoked_at IS NULL AND expiration > {})",
    "revoked": "(revoked_at IS NOT NULL AND expiration > {})",
    "endpoint-invalid": "(active = 1 AND invalidated_at IS NOT NULL AND expiration > {})",
}
SQL_REVOKE = SQL(
    "UPDATE leases SET active = 0, endpoint = NULL, endpoint_hash = NULL, subscriptions = '[]', revoked_at = ? "
    "WHERE origin = ? AND pubkey = ? AND d = ? AND active = 1",
    "UPDATE leases SET active = 0, endpoint = NULL, endpoint_hash = NULL, subscriptions = '[]', revoked_at = %s "
    "WHERE origin = %s AND pubkey = %s AND d = %s AND active = 1",
)
SQL_LEASES_PER_AUTHOR = SQL(
    "SELECT pubkey, count(*) AS n FROM leases WHERE origin = ? AND active = 1 AND expiration > ? "
    "GROUP BY pubkey ORDER BY n DESC, pubkey LIMIT ?",
    "SELECT pubkey, count(*) AS n FROM leases WHERE origin = %s AND active = 1 AND expiration > %s "
    "GROUP BY pubkey ORDER BY n DESC, pubkey LIMIT %s",
)
# Active: the effective leases that can wake a device now (the Leases page's "active" state):
# not expired, not revoked, and their endpoint generation not invalidated by the provider.
SQL_LEASE_TOTALS = SQL(
    "SELECT origin, sum(active = 1 AND invalidated_at IS NULL AND revoked_at IS NULL AND expiration > ?), "
    "sum(active = 0 AND expiration > ?), count(*) FROM leases GROUP BY origin",
    "SELECT origin, sum(active = 1 AND invalidated_at IS NULL AND revoked_at IS NULL AND expiration > %s), "
    "sum(active = 0 AND expiration > %s), count(*) FROM leases GROUP BY origin",
)


def lease_state(row: dict, now: int) -> str:
    if row["expiration"] <= now:
        return "expired"
    if row["revoked_at"] is not None:
        return "revoked"
    if row["active"] and row.get("invalidated_at") is not None:
        return "endpoint-invalid"
    return "active" if row["active"] else "tombstoned"


def _lease_dict(r: tuple) -> dict:
    keys = ("origin", "pubkey", "d", "event_id", "created_at", "expiration", "generation", "active", "app_profile",
            "transport", "endpoint_hash", "subscriptions", "exec_key_id", "revoked_at", "invalidated_at")
    out = dict(zip(keys, r))
    out["subscriptions"] = orjson.loads(out["subscriptions"] or "[]")
    return out


def list_leases(conn: Connection, now: int, *, origin: int | None = None, app_profile: str | None = None,
                transport: str | None = None, state: str | None = None, expiring_within: int | None = None,
                limit: int = 100, offset: int = 0) -> list[dict]:
    """Lease rows for the operator, newest first, filtered (every value bound)."""
    dialect = dialect_of(conn)
    mark = dialect.mark
    where: list[str] = []
    args: list = []
    if origin is not None:
        where.append(f"origin = {mark}")
        args.append(origin)
    if app_profile:
        where.append(f"app_profile = {mark}")
        args.append(app_profile)
    if transport:
        where.append(f"transport = {mark}")
        args.append(transport)
    if state in _STATE_SQL:
        where.append(_STATE_SQL[state].format(mark))
        args.append(now)
    if expiring_within is not None:
        where.append(f"(expiration > {mark} AND expiration <= {mark})")
        args += [now, now + expiring_within]
    sql = dialect.text(_LEASE_COLUMNS + (" WHERE " + " AND ".join(where) if where else "") +
                       f" ORDER BY created_at DESC, pubkey, d LIMIT {mark} OFFSET {mark}")
    return [_lease_dict(r) for r in conn.execute(sql, (*args, limit, offset))]


def get_lease(conn: Connection, origin: int, pubkey: str, d: str) -> dict | None:
    row = conn.execute(SQL_LEASE, (origin, pubkey, d)).fetchone()
    return None if row is None else _lease_dict(row)


def revoke_lease(conn: Connection, origin: int, pubkey: str, d: str, now: int) -> bool:
    """An operator ends an active lease now: no further wakes; a newer lease from its author
    replaces it as usual. Whether there was an active lease to revoke."""
    conn.execute(SQL_REVOKE, (now, origin, pubkey, d))
    if conn.changes() != 1:
        return False
    conn.execute(SQL_DELETE_SELECTORS, (origin, pubkey, d))
    wakes.cancel_lease_jobs(conn, origin, pubkey, d, now, "lease revoked by the operator")
    return True


def top_lease_authors(conn: Connection, origin: int, now: int, limit: int = 10) -> list[tuple[str, int]]:
    """The authors holding the most active leases at an origin."""
    return conn.execute(SQL_LEASES_PER_AUTHOR, (origin, now, limit)).fetchall()


def lease_totals(conn: Connection, now: int) -> dict[int, tuple[int, int, int]]:
    """origin -> (active, inactive unexpired, rows)."""
    return {o: (a or 0, i or 0, n) for o, a, i, n in conn.execute(SQL_LEASE_TOTALS, (now, now))}
