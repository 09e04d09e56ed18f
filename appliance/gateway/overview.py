"""Read-only views of the gateway's tables for the operator (the dashboard's Gateway page).

Nothing here returns an APNs token, a wrapped secret or an App Attest key; installation handles,
token digests and relay pubkeys are returned for the caller to redact.
"""

from __future__ import annotations

import apsw

SQL_INSTALLATIONS = (
    "SELECT handle, app_profile, endpoint_epoch, token_sha256, sign_count, created_at, expires_at, revoked_at "
    "FROM gateway_installations ORDER BY created_at DESC LIMIT ? OFFSET ?"
)
SQL_INSTALLATION_COUNTS = (
    "SELECT app_profile, sum(revoked_at IS NULL AND expires_at >= ?), sum(revoked_at IS NOT NULL), count(*) "
    "FROM gateway_installations GROUP BY app_profile ORDER BY app_profile"
)
SQL_DELEGATIONS = (
    "SELECT handle, relay_pubkey, endpoint_epoch, generation, not_before, expires_at, revoked_at "
    "FROM gateway_delegations ORDER BY not_before DESC LIMIT ? OFFSET ?"
)
SQL_DELEGATION_COUNT = "SELECT count(*), sum(revoked_at IS NULL AND expires_at >= ?) FROM gateway_delegations"
SQL_RESERVATIONS = (
    "SELECT relay_pubkey, count(*), sum(expires_at >= ?), max(expires_at) FROM gateway_reservations "
    "GROUP BY relay_pubkey ORDER BY count(*) DESC LIMIT ?"
)
SQL_QUOTA = (
    "SELECT app_profile, token_sha256, window_start, admitted FROM gateway_endpoint_quota "
    "ORDER BY admitted DESC, window_start DESC LIMIT ?"
)


def installations(conn: apsw.Connection, limit: int = 100, offset: int = 0) -> list[dict]:
    keys = ("handle", "app_profile", "endpoint_epoch", "token_sha256", "sign_count", "created_at", "expires_at",
            "revoked_at")
    return [dict(zip(keys, row)) for row in conn.execute(SQL_INSTALLATIONS, (limit, offset))]


def installation_counts(conn: apsw.Connection, now: int) -> list[tuple[str, int, int, int]]:
    """(app profile, active, revoked, rows) per profile."""
    return [(p, a or 0, r or 0, n) for p, a, r, n in conn.execute(SQL_INSTALLATION_COUNTS, (now,))]


def delegations(conn: apsw.Connection, limit: int = 100, offset: int = 0) -> list[dict]:
    keys = ("handle", "relay_pubkey", "endpoint_epoch", "generation", "not_before", "expires_at", "revoked_at")
    return [dict(zip(keys, row)) for row in conn.execute(SQL_DELEGATIONS, (limit, offset))]


def delegation_count(conn: apsw.Connection, now: int) -> tuple[int, int]:
    """(rows, active)."""
    n, active = conn.execute(SQL_DELEGATION_COUNT, (now,)).fetchone()
    return n or 0, active or 0


def reservations(conn: apsw.Connection, now: int, limit: int = 20) -> list[tuple[str, int, int, int]]:
    """(relay pubkey, reservations, those still fencing their request id, latest expiry) for the busiest
    relays. A reservation is kept from send-begin (in flight, then a terminal outcome) until its
    request's expiry; transient outcomes delete theirs."""
    return [(pk, n, t or 0, e) for pk, n, t, e in conn.execute(SQL_RESERVATIONS, (now, limit))]


def quota_usage(conn: apsw.Connection, limit: int = 20) -> list[tuple[str, bytes, int, int]]:
    """(app profile, token digest, window start, admitted) for the most used endpoints."""
    return conn.execute(SQL_QUOTA, (limit,)).fetchall()
