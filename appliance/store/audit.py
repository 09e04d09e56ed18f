"""Rows a crash test reads back from a stopped (or killed) appliance's database to check what it
promised: every lease's endpoint hash, every wake job, every lease with its watermark."""

from __future__ import annotations

from appliance.store.interface import Connection
from appliance.store.statement import SQL

SQL_ENDPOINT_HASHES = SQL("SELECT endpoint, endpoint_hash FROM leases WHERE endpoint IS NOT NULL",
                          "SELECT endpoint, endpoint_hash FROM leases WHERE endpoint IS NOT NULL")
SQL_WAKE_JOBS = SQL("SELECT id, event_id, endpoint_hash, app_profile, transport, origin, state, wake_id FROM wake_jobs",
                    "SELECT id, event_id, endpoint_hash, app_profile, transport, origin, state, wake_id FROM wake_jobs")
SQL_LEASE_GENERATIONS = SQL(
    "SELECT l.pubkey, l.d, l.event_id, l.generation, l.active, w.generation FROM leases l "
    "LEFT JOIN lease_watermarks w USING (origin, pubkey, d)",
    "SELECT l.pubkey, l.d, l.event_id, l.generation, l.active, w.generation FROM leases l "
    "LEFT JOIN lease_watermarks w USING (origin, pubkey, d)",
)


def endpoint_hashes(conn: Connection) -> dict[str, bytes]:
    """endpoint -> endpoint_hash, for every lease that still holds its endpoint."""
    return dict(conn.execute(SQL_ENDPOINT_HASHES).fetchall())


def wake_jobs(conn: Connection) -> list[tuple]:
    """(id, event_id, endpoint_hash, app_profile, transport, origin, state, wake_id) of every job."""
    return [tuple(r) for r in conn.execute(SQL_WAKE_JOBS).fetchall()]


def lease_generations(conn: Connection) -> list[tuple]:
    """(pubkey, d, event_id, generation, active, watermark generation) of every lease."""
    return [tuple(r) for r in conn.execute(SQL_LEASE_GENERATIONS).fetchall()]
