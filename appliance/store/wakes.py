"""The wake outbox in SQL: durable wake jobs, the per-endpoint rate state, the delivery log and
operator alerts (NIP-PL "Wake Delivery"). Write functions run inside the writer's
transaction; the read functions (`list_jobs`, `job_counts`, `delivery_log`, `alerts`) are what an
operator view reads, on a reader connection.

A job's life (`state`):

    pending ──claim──> claimed ──accepted──> delivered
       ^                  │ ──transient / configuration──> pending (later)
       │                  │ ──invalid endpoint──> invalidated
       │                  │ ──permanent, too many attempts, too old──> dead
    coalesced (joined a pending wake: `wake_id`, fate of that wake)
    dropped   (re-check failed: lease gone, expired, replaced, event unreadable)
    cancelled (the lease was revoked or replaced before delivery)

Times are Unix seconds (REAL). Endpoint tokens and event contents are never written here.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any, Callable, NamedTuple

import orjson

from appliance.store.interface import Connection, is_sqlite
from appliance.store.statement import dialect_of
from appliance.store.meta import node_lock
from appliance.store.statement import SQL

__all__ = [
    "JOB_STATES",
    "FINISHED_STATES",
    "WakeJob",
    "redact_lease",
    "new_job_id",
    "insert_job",
    "due_wakes",
    "wake_members",
    "claim_wake",
    "set_state",
    "count_attempt",
    "reschedule",
    "cancel_lease_jobs",
    "log_attempt",
    "raise_alert",
    "clear_alerts",
    "dismiss_alert",
    "note_outcome",
    "transport_health",
    "purge",
    "next_due",
    "list_jobs",
    "job_counts",
    "delivery_log",
    "alerts",
]

JOB_STATES = ("pending", "claimed", "coalesced", "delivered", "dead", "dropped", "invalidated", "cancelled")
FINISHED_STATES = ("delivered", "dead", "dropped", "invalidated", "cancelled")

_JOB_COLUMNS = ("id, origin, app_profile, transport, endpoint_hash, event_id, lease_pubkey, lease_d, generation, "
                "class, state, wake_id, created_at, due_at, expires_at, attempts, finished_at, last_error")

SQL_INSERT_JOB = SQL(
    "INSERT INTO wake_jobs (id, origin, app_profile, transport, endpoint_hash, event_id, lease_pubkey, lease_d, "
    "generation, class, state, wake_id, created_at, due_at, expires_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash, event_id) DO NOTHING",
    "INSERT INTO wake_jobs (id, origin, app_profile, transport, endpoint_hash, event_id, lease_pubkey, lease_d, "
    "generation, class, state, wake_id, created_at, due_at, expires_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash, event_id) DO NOTHING",
)
# The endpoint's row: when a wake last went to it, and its pending wake (a hint, see SQL_IS_PENDING).
SQL_ENDPOINT = SQL(
    "SELECT last_sent_at, pending_wake FROM wake_endpoints WHERE origin = ? AND app_profile = ? AND transport = ? "
    "AND endpoint_hash = ?",
    "SELECT last_sent_at, pending_wake FROM wake_endpoints WHERE origin = %s AND app_profile = %s AND transport = %s "
    "AND endpoint_hash = %s",
)
SQL_IS_PENDING = SQL("SELECT 1 FROM wake_jobs WHERE id = ? AND state = 'pending'",
                     "SELECT 1 FROM wake_jobs WHERE id = %s AND state = 'pending'")
SQL_NOTE_PENDING = SQL(
    "INSERT INTO wake_endpoints (origin, app_profile, transport, endpoint_hash, pending_wake) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash) DO UPDATE SET pending_wake = excluded.pending_wake",
    "INSERT INTO wake_endpoints (origin, app_profile, transport, endpoint_hash, pending_wake) VALUES (%s, %s, %s, %s, "
    "%s) "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash) DO UPDATE SET pending_wake = excluded.pending_wake",
)
# A wake sent (claimed): noted for the rate cap; if it was the endpoint's pending wake, it no longer is.
SQL_NOTE_SENT = SQL(
    "INSERT INTO wake_endpoints (origin, app_profile, transport, endpoint_hash, last_sent_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash) DO UPDATE SET last_sent_at = excluded.last_sent_at, "
    "pending_wake = CASE WHEN pending_wake = ? THEN NULL ELSE pending_wake END",
    "INSERT INTO wake_endpoints (origin, app_profile, transport, endpoint_hash, last_sent_at) VALUES (%s, %s, %s, %s, "
    "%s) "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash) DO UPDATE SET last_sent_at = excluded.last_sent_at, "
    "pending_wake = CASE WHEN wake_endpoints.pending_wake = %s THEN NULL ELSE wake_endpoints.pending_wake END",
)
# Pending wakes that are due, and claims that lapsed (the process died while sending).
# INDEXED BY: without statistics the planner would rather walk every pending job by state and
# sort them; the partial index on due_at hands over the due ones in order.
SQL_DUE = SQL(
    f"SELECT {_JOB_COLUMNS} FROM wake_jobs INDEXED BY wake_jobs_due WHERE state IN ('pending', 'claimed') "
    "AND due_at <= ? ORDER BY due_at LIMIT ?",
    f"SELECT {_JOB_COLUMNS} FROM wake_jobs WHERE state IN ('pending', 'claimed') "
    "AND due_at <= %s ORDER BY due_at LIMIT %s",
)
SQL_MEMBERS = SQL(f"SELECT {_JOB_COLUMNS} FROM wake_jobs WHERE wake_id = ? AND state = 'coalesced'",
                  f"SELECT {_JOB_COLUMNS} FROM wake_jobs WHERE wake_id = %s AND state = 'coalesced'")
# The same, with what the re-check before an attempt needs: the lease row at the job's address and
# the stored event (one statement per claim batch instead of several per job).
_CHECK_COLUMNS = (
    "SELECT " + ", ".join(f"j.{c.strip()}" for c in _JOB_COLUMNS.split(",")) + ", "
    "l.generation, l.active, l.expiration, l.invalidated_at, l.app_profile, l.transport, l.endpoint, "
    "l.endpoint_hash, e.raw, e.expiration FROM wake_jobs j {indexed} "
    "LEFT JOIN leases l ON l.origin = j.origin AND l.pubkey = j.lease_pubkey AND l.d = j.lease_d "
    "LEFT JOIN events e ON e.origin = j.origin AND e.id = j.event_id "
)
SQL_DUE_CHECKED = SQL(
    _CHECK_COLUMNS.format(indexed="INDEXED BY wake_jobs_due")
    + "WHERE j.state IN ('pending', 'claimed') AND j.due_at <= ? ORDER BY j.due_at LIMIT ?",
    # PostgreSQL, where several nodes claim from one table: each takes the due wakes no other node's
    # open claim holds, without waiting, and keeps them locked until its claim commits (a row another
    # node held meanwhile is re-checked against the WHERE by PostgreSQL once free, or skipped).
    _CHECK_COLUMNS.format(indexed="")
    + "WHERE j.state IN ('pending', 'claimed') AND j.due_at <= %s ORDER BY j.due_at LIMIT %s "
    "FOR UPDATE OF j SKIP LOCKED",
)
# Several nodes over PostgreSQL: the decisions about one endpoint (coalesce into its pending
# wake, or a new wake due under the rate cap; claim it and note the send) are serialized by a
# transaction-scoped advisory lock on its key (meta.node_lock), taken before the first of them and
# held to the commit. On SQLite the one writer serializes them already. (docs/scaling.md, "Wakes
# across nodes", says why this lock rather than a row lock or a unique index.)
# (Finished coalesced jobs stay until retention: look them up by wake, never by state.)
SQL_MEMBERS_CHECKED = SQL(
    _CHECK_COLUMNS.format(indexed="INDEXED BY wake_jobs_wake")
    + "WHERE j.wake_id IN (SELECT value FROM json_each(?)) AND j.state = 'coalesced'",
    _CHECK_COLUMNS.format(indexed="")
    + "WHERE j.wake_id IN (SELECT value FROM jsonb_array_elements_text(%s::jsonb)) AND j.state = 'coalesced'",
)
SQL_JOB_CHECKED = SQL(_CHECK_COLUMNS.format(indexed="") + "WHERE j.id = ?",
                      _CHECK_COLUMNS.format(indexed="") + "WHERE j.id = %s")
SQL_CLAIM = SQL("UPDATE wake_jobs SET state = 'claimed', due_at = ? WHERE id = ?",
                "UPDATE wake_jobs SET state = 'claimed', due_at = %s WHERE id = %s")
# A claim batch in a statement for the jobs and two per (origin, app profile, transport) among
# them (one, nearly always), whatever its size (`claim_wakes`): the endpoints' rate state, existing
# rows, then the rows of endpoints never noted before, each looked up by its primary key from a
# list of endpoint hashes. A statement per wake cost the writer a round trip through the GIL each
# (see store.events on batches); endpoint keys as JSON arrays cost it four JSON extractions a row.
SQL_CLAIM_MANY = SQL(
    "UPDATE wake_jobs SET state = 'claimed', due_at = ? WHERE id IN (SELECT value FROM json_each(?))",
    "UPDATE wake_jobs SET state = 'claimed', due_at = %s WHERE id IN (SELECT value "
    "FROM jsonb_array_elements_text(%s::jsonb))",
)
SQL_NOTE_SENT_MANY = SQL(
    "UPDATE wake_endpoints SET last_sent_at = ?, "
    "pending_wake = CASE WHEN pending_wake IN (SELECT value FROM json_each(?)) THEN NULL ELSE pending_wake END "
    "WHERE origin = ? AND app_profile = ? AND transport = ? AND endpoint_hash IN (SELECT value FROM json_each(?))",
    "UPDATE wake_endpoints SET last_sent_at = %s, "
    "pending_wake = CASE WHEN pending_wake IN (SELECT value FROM jsonb_array_elements_text(%s::jsonb)) THEN NULL "
    "ELSE pending_wake END "
    "WHERE origin = %s AND app_profile = %s AND transport = %s AND endpoint_hash IN (SELECT value "
    "FROM jsonb_array_elements_text(%s::jsonb))",
)
SQL_NOTE_SENT_NEW = SQL(
    "INSERT INTO wake_endpoints (origin, app_profile, transport, endpoint_hash, last_sent_at) "
    "SELECT ?, ?, ?, value, ? FROM json_each(?) WHERE true "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash) DO NOTHING",
    "INSERT INTO wake_endpoints (origin, app_profile, transport, endpoint_hash, last_sent_at) "
    "SELECT %s::bigint, %s::text, %s::text, value, %s::double precision FROM jsonb_array_elements_text(%s::jsonb) "
    "ON CONFLICT (origin, app_profile, transport, endpoint_hash) DO NOTHING",
)
# Claims given back by a stopping process: due again at once (an outcome recorded meanwhile wins).
SQL_COUNT_ATTEMPT = SQL("UPDATE wake_jobs SET attempts = attempts + 1 WHERE id = ?",
                        "UPDATE wake_jobs SET attempts = attempts + 1 WHERE id = %s")
SQL_SET_STATE = SQL("UPDATE wake_jobs SET state = ?, finished_at = ?, last_error = ? WHERE id = ?",
                    "UPDATE wake_jobs SET state = %s, finished_at = %s, last_error = %s WHERE id = %s")
# An accepted attempt: counted and finished in one statement (`count_attempt` + `set_state`).
SQL_DELIVERED = SQL(
    "UPDATE wake_jobs SET attempts = attempts + 1, state = 'delivered', finished_at = ?, last_error = NULL "
    "WHERE id = ?",
    "UPDATE wake_jobs SET attempts = attempts + 1, state = 'delivered', finished_at = %s, last_error = NULL "
    "WHERE id = %s",
)
SQL_FINISH_MEMBERS = SQL(
    "UPDATE wake_jobs SET finished_at = ? WHERE wake_id = ? AND state = 'coalesced' AND finished_at IS NULL",
    "UPDATE wake_jobs SET finished_at = %s WHERE wake_id = %s AND state = 'coalesced' AND finished_at IS NULL",
)
# Accepted attempts, a statement per step for the whole run (`record_delivered`).
SQL_DELIVERED_MANY = SQL(
    "UPDATE wake_jobs SET attempts = attempts + 1, state = 'delivered', finished_at = ?, last_error = NULL "
    "WHERE id IN (SELECT value FROM json_each(?))",
    "UPDATE wake_jobs SET attempts = attempts + 1, state = 'delivered', finished_at = %s, last_error = NULL "
    "WHERE id IN (SELECT value FROM jsonb_array_elements_text(%s::jsonb))",
)
SQL_FINISH_MEMBERS_MANY = SQL(
    "UPDATE wake_jobs INDEXED BY wake_jobs_wake SET finished_at = ? WHERE wake_id IN (SELECT value FROM json_each(?)) "
    "AND state = 'coalesced' AND finished_at IS NULL",
    "UPDATE wake_jobs SET finished_at = %s WHERE wake_id IN (SELECT value FROM jsonb_array_elements_text(%s::jsonb)) "
    "AND state = 'coalesced' AND finished_at IS NULL",
)
SQL_RELEASE = SQL(
    "UPDATE wake_jobs SET state = 'pending', due_at = ? WHERE id IN (SELECT value FROM json_each(?)) "
    "AND state = 'claimed' RETURNING origin, app_profile, transport, endpoint_hash, id",
    "UPDATE wake_jobs SET state = 'pending', due_at = %s WHERE id IN (SELECT value "
    "FROM jsonb_array_elements_text(%s::jsonb)) "
    "AND state = 'claimed' RETURNING origin, app_profile, transport, endpoint_hash, id",
)
SQL_EXTEND_CLAIMS = SQL(
    "UPDATE wake_jobs SET due_at = ? WHERE id IN (SELECT value FROM json_each(?)) AND state = 'claimed'",
    "UPDATE wake_jobs SET due_at = %s WHERE id IN (SELECT value FROM jsonb_array_elements_text(%s::jsonb)) "
    "AND state = 'claimed'",
)
SQL_RESCHEDULE = SQL(
    "UPDATE wake_jobs SET state = 'pending', due_at = ?, last_error = ? WHERE id = ? "
    "RETURNING origin, app_profile, transport, endpoint_hash, id",
    "UPDATE wake_jobs SET state = 'pending', due_at = %s, last_error = %s WHERE id = %s "
    "RETURNING origin, app_profile, transport, endpoint_hash, id",
)
SQL_SHIFT_DUE = SQL("UPDATE wake_jobs SET due_at = due_at - ? WHERE state IN ('pending', 'claimed') AND due_at > ?",
                    "UPDATE wake_jobs SET due_at = due_at - %s WHERE state IN ('pending', 'claimed') AND due_at > %s")
SQL_CANCEL_LEASE = SQL(
    "UPDATE wake_jobs INDEXED BY wake_jobs_lease SET state = 'cancelled', finished_at = ?, last_error = ? "
    "WHERE origin = ? AND lease_pubkey = ? AND lease_d = ? AND state IN ('pending', 'coalesced') "
    "RETURNING id, due_at, wake_id IS NULL",
    "UPDATE wake_jobs SET state = 'cancelled', finished_at = %s, last_error = %s "
    "WHERE origin = %s AND lease_pubkey = %s AND lease_d = %s AND state IN ('pending', 'coalesced') "
    "RETURNING id, due_at, wake_id IS NULL",
)
# Jobs of other leases that had joined a cancelled wake (oldest first): they stay one wake.
SQL_ORPHANS = SQL(
    "SELECT id, origin, app_profile, transport, endpoint_hash FROM wake_jobs WHERE wake_id = ? "
    "AND state = 'coalesced' ORDER BY id",
    "SELECT id, origin, app_profile, transport, endpoint_hash FROM wake_jobs WHERE wake_id = %s "
    "AND state = 'coalesced' ORDER BY id",
)
SQL_LEAD_ORPHANS = SQL("UPDATE wake_jobs SET state = 'pending', wake_id = NULL, due_at = ? WHERE id = ?",
                       "UPDATE wake_jobs SET state = 'pending', wake_id = NULL, due_at = %s WHERE id = %s")
SQL_MOVE_ORPHANS = SQL("UPDATE wake_jobs SET wake_id = ? WHERE wake_id = ? AND state = 'coalesced'",
                       "UPDATE wake_jobs SET wake_id = %s WHERE wake_id = %s AND state = 'coalesced'")
SQL_LOG = SQL(
    "INSERT INTO delivery_log (at, origin, lease, app_profile, transport, class, job_id, attempt, outcome, status, "
    "reason, latency_ms, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "INSERT INTO delivery_log (at, origin, lease, app_profile, transport, class, job_id, attempt, outcome, status, "
    "reason, latency_ms, detail) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
)
SQL_ALERT = SQL(
    "INSERT INTO push_alerts (origin, app_profile, reason, detail, status, first_at, last_at, count, cleared_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, 1, NULL) "
    "ON CONFLICT (origin, app_profile, reason) DO UPDATE SET detail = excluded.detail, status = excluded.status, "
    "last_at = excluded.last_at, count = count + 1, "
    "first_at = CASE WHEN cleared_at IS NULL THEN first_at ELSE excluded.first_at END, cleared_at = NULL, "
    # dismissed by the operator: hidden for the rest of this episode, shown again once it came back
    "dismissed_at = CASE WHEN cleared_at IS NULL THEN dismissed_at ELSE NULL END "
    "RETURNING count, first_at = last_at",
    "INSERT INTO push_alerts (origin, app_profile, reason, detail, status, first_at, last_at, count, cleared_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, 1, NULL) "
    "ON CONFLICT (origin, app_profile, reason) DO UPDATE SET detail = excluded.detail, status = excluded.status, "
    "last_at = excluded.last_at, count = push_alerts.count + 1, "
    "first_at = CASE WHEN push_alerts.cleared_at IS NULL THEN push_alerts.first_at ELSE excluded.first_at END, "
    "cleared_at = NULL, "
    "dismissed_at = CASE WHEN push_alerts.cleared_at IS NULL THEN push_alerts.dismissed_at ELSE NULL END "
    "RETURNING count, first_at = last_at",
)
SQL_DISMISS_ALERT = SQL(
    "UPDATE push_alerts SET dismissed_at = ? WHERE origin = ? AND app_profile = ? AND reason = ? "
    "AND cleared_at IS NULL AND dismissed_at IS NULL",
    "UPDATE push_alerts SET dismissed_at = %s WHERE origin = %s AND app_profile = %s AND reason = %s "
    "AND cleared_at IS NULL AND dismissed_at IS NULL",
)
# One attempt's outcome in its profile's health row: transient failures count up (anything else
# the host answered resets them), `refused` is this attempt's, an accepted one notes when.
SQL_HEALTH = SQL(
    "INSERT INTO transport_health (origin, app_profile, failures, refused, last_at, last_outcome, last_detail, "
    "ok_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (origin, app_profile) DO UPDATE SET "
    "failures = CASE WHEN excluded.failures = 0 THEN 0 ELSE transport_health.failures + 1 END, "
    "refused = excluded.refused, last_at = excluded.last_at, last_outcome = excluded.last_outcome, "
    "last_detail = excluded.last_detail, ok_at = coalesce(excluded.ok_at, transport_health.ok_at) "
    "RETURNING failures, refused",
    "INSERT INTO transport_health (origin, app_profile, failures, refused, last_at, last_outcome, last_detail, "
    "ok_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (origin, app_profile) DO UPDATE SET "
    "failures = CASE WHEN excluded.failures = 0 THEN 0 ELSE transport_health.failures + 1 END, "
    "refused = excluded.refused, last_at = excluded.last_at, last_outcome = excluded.last_outcome, "
    "last_detail = excluded.last_detail, ok_at = coalesce(excluded.ok_at, transport_health.ok_at) "
    "RETURNING failures, refused",
)
SQL_HEALTH_ROWS = SQL(
    "SELECT origin, app_profile, failures, refused, last_at, last_outcome, last_detail, ok_at FROM transport_health",
    "SELECT origin, app_profile, failures, refused, last_at, last_outcome, last_detail, ok_at FROM transport_health",
)
SQL_CLEAR_ALERTS = SQL(
    "UPDATE push_alerts SET cleared_at = ? WHERE origin = ? AND app_profile = ? AND cleared_at IS NULL",
    "UPDATE push_alerts SET cleared_at = %s WHERE origin = %s AND app_profile = %s AND cleared_at IS NULL",
)
SQL_PURGE_JOBS = SQL("DELETE FROM wake_jobs WHERE finished_at IS NOT NULL AND finished_at < ?",
                     "DELETE FROM wake_jobs WHERE finished_at IS NOT NULL AND finished_at < %s")
SQL_PURGE_LOG = SQL("DELETE FROM delivery_log WHERE at < ?", "DELETE FROM delivery_log WHERE at < %s")
SQL_PURGE_ENDPOINTS = SQL("DELETE FROM wake_endpoints WHERE last_sent_at < ?",
                          "DELETE FROM wake_endpoints WHERE last_sent_at < %s")
# Rows that only named a pending wake, once it is gone (never sent to: no rate state to keep).
# This and SQL_PURGE_ENDPOINTS scan wake_endpoints (no index by last_sent_at: schema 13 says why).
SQL_PURGE_HINTS = SQL(
    "DELETE FROM wake_endpoints WHERE last_sent_at IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM wake_jobs WHERE id = pending_wake AND state = 'pending')",
    "DELETE FROM wake_endpoints WHERE last_sent_at IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM wake_jobs WHERE id = pending_wake AND state = 'pending')",
)
SQL_PURGE_ALERTS = SQL("DELETE FROM push_alerts WHERE cleared_at IS NOT NULL AND cleared_at < ?",
                       "DELETE FROM push_alerts WHERE cleared_at IS NOT NULL AND cleared_at < %s")
SQL_NEXT_DUE = SQL("SELECT min(due_at) FROM wake_jobs INDEXED BY wake_jobs_due WHERE state IN ('pending', 'claimed')",
                   "SELECT min(due_at) FROM wake_jobs WHERE state IN ('pending', 'claimed')")


class WakeJob(NamedTuple):
    """One row of `wake_jobs` (a named tuple: a claim batch makes hundreds of them, and a frozen
    dataclass of 18 fields cost several times as much to build)."""

    id: str
    origin: int
    app_profile: str
    transport: str
    endpoint_hash: str
    event_id: str
    lease_pubkey: str
    lease_d: str
    generation: int
    cls: str
    state: str
    wake_id: str | None
    created_at: float
    due_at: float
    expires_at: float
    attempts: int
    finished_at: float | None
    last_error: str | None

    @property
    def endpoint_key(self) -> tuple[int, str, str, str]:
        return (self.origin, self.app_profile, self.transport, self.endpoint_hash)

    @property
    def lease(self) -> str:
        return redact_lease(self.lease_pubkey, self.lease_d)

    def to_dict(self) -> dict[str, Any]:
        """For operator views: the lease address redacted, no endpoint."""
        return {
            "id": self.id, "origin": self.origin, "app_profile": self.app_profile, "transport": self.transport,
            "event_id": self.event_id, "lease": self.lease, "generation": self.generation, "class": self.cls,
            "state": self.state, "wake_id": self.wake_id, "created_at": self.created_at, "due_at": self.due_at,
            "expires_at": self.expires_at, "attempts": self.attempts, "finished_at": self.finished_at,
            "last_error": self.last_error,
        }


def _job(row: tuple) -> WakeJob:
    return WakeJob(*row)


def redact_lease(pubkey: str, d: str) -> str:
    """A lease address an operator can tell apart and correlate, without the full pubkey or d:
    `30350:<first 12 hex of the pubkey>…:<first 8 hex of SHA-256(d)>`."""
    return f"30350:{pubkey[:12]}…:{hashlib.sha256(d.encode()).hexdigest()[:8]}"


# -- job ids ------------------------------------------------------------------------------------------

_id_lock = threading.Lock()
_id_last = [0, 0]  # (unix ms, counter) of the last id made


def new_job_id() -> str:
    """A fresh job id: a canonical UUID, version 7 (RFC 9562 5.7), the wake's `apns-id`.

    Why version 7: ids made later sort later (48-bit Unix milliseconds, then a 12-bit counter
    within the millisecond, then 62 random bits), so the outbox's primary key, and the delivery
    log's job index, grow at their right edge. A claim or an outcome then rewrites B-tree pages
    its neighbours in time share, instead of a random page per wake (a random version 4 key cost
    about a quarter of the writer's work per wake at peak). APNs sees the send time anyway.
    """
    ms = time.time_ns() // 1_000_000
    with _id_lock:
        last_ms, counter = _id_last
        if ms <= last_ms:  # the same millisecond (or the clock went back): keep counting up
            ms, counter = last_ms, counter + 1
            if counter > 0xFFF:
                ms, counter = ms + 1, 0
        else:
            counter = 0
        _id_last[:] = (ms, counter)
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    h = f"{(ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# -- writes (inside the writer transaction) -------------------------------------------------------

def insert_job(conn: Connection, *, job_id: str, origin: int, app_profile: str, transport: str,
               endpoint_hash: str, event_id: str, lease_pubkey: str, lease_d: str, generation: int, cls: str,
               now: float, useful_age: float, min_interval: float, claim_for: float | None = None) -> str | None:
    """Write the job of one (endpoint, event) match; the state it got, None if it already existed.

    Coalescing: if the endpoint already has a pending wake, this job joins it (`coalesced`);
    otherwise it is a new pending wake, due at once or,
    under the per-endpoint rate cap, `min_interval` after the last wake sent to the endpoint.
    With `claim_for` (seconds), a new wake that is due at once is written already claimed for
    that long, and its send noted for the rate cap: the caller hands it to a worker itself after
    the commit (state `claimed`), saving the claim transaction on the way to the provider.
    """
    key = (origin, app_profile, transport, endpoint_hash)
    lock_endpoints(conn, [key])
    last_sent, pending = _endpoint(conn, key)
    if pending is not None:
        state, wake_id, due = "coalesced", pending, now
    else:
        # A last send "in the future" means the wall clock went back since: count it as sent now,
        # so the cap spaces wakes by `min_interval` and never holds one for the size of the jump.
        state, wake_id = "pending", None
        due = now if last_sent is None else max(now, min(last_sent, now) + min_interval)
        if claim_for is not None and due <= now:
            state, due = "claimed", now + claim_for
    conn.execute(SQL_INSERT_JOB, (job_id, origin, app_profile, transport, endpoint_hash, event_id, lease_pubkey,
                                  lease_d, generation, cls, state, wake_id, now, due, now + useful_age))
    if conn.changes() == 0:
        return None  # the same event matched this endpoint before: one job, not two
    if state == "claimed":
        conn.execute(SQL_NOTE_SENT, (*key, now, job_id))
    elif state == "pending":
        conn.execute(SQL_NOTE_PENDING, (*key, job_id))
    return state


def lock_endpoints(conn, keys) -> None:
    """Serialize this transaction's decisions about these endpoints with every other node's
    (PostgreSQL; nothing to do on SQLite's single writer). Every transaction takes these locks in
    one global order (meta.node_lock): a batch whose events match endpoints in another order than
    a batch of another node runs its operation again with the keys taken in order first, so two
    nodes never wait on each other in a cycle (docs/scaling.md)."""
    node_lock(conn, *(endpoint_lock_name(key) for key in keys))


def endpoint_lock_name(key: tuple) -> str:
    """The node lock name of an endpoint key (origin, app_profile, transport, endpoint_hash)."""
    o, p, t, h = key
    return f"wake-endpoint:{o}:{p}:{t}:{h}"


def _endpoint(conn: Connection, key: tuple) -> tuple[float | None, str | None]:
    """(when the last wake went to the endpoint, its pending wake) - the pending wake only if the
    hint still names a pending job. (A stale hint - the wake was sent, dropped, dead-lettered -
    only means a new match starts a new wake, under the rate cap, instead of joining one.)"""
    row = conn.execute(SQL_ENDPOINT, key).fetchone()
    if row is None:
        return None, None
    last_sent, pending = row
    if pending is not None and conn.execute(SQL_IS_PENDING, (pending,)).fetchone() is None:
        pending = None
    return last_sent, pending


def _note_pending(conn: Connection, rows: list[tuple]) -> None:
    """These jobs (origin, app_profile, transport, endpoint_hash, id) are pending again (a retry, a
    released claim, orphans of a cancelled wake): later matches for their endpoints join them.
    A decision about their endpoints like any other: under their node locks (several nodes), so a
    match on another node either joins the wake or comes before it, and every write of an
    endpoint's row is made holding its lock (no wait on a row between two lock holders)."""
    if rows:
        lock_endpoints(conn, [tuple(r[:4]) for r in rows])
        conn.executemany(SQL_NOTE_PENDING, rows)


def due_wakes(conn: Connection, now: float, limit: int) -> list[WakeJob]:
    """Pending wakes whose time came, and claims that lapsed, oldest due first."""
    return [_job(r) for r in conn.execute(SQL_DUE, (now, limit))]


_N_JOB = len(_JOB_COLUMNS.split(","))


def _checked(row: tuple) -> tuple[WakeJob, tuple | None, str | None, int | None]:
    """(job, lease row or None, event raw or None, event expiration) from a *_CHECKED row."""
    job = WakeJob(*row[:_N_JOB])
    lease = row[_N_JOB:_N_JOB + 8]
    return job, (None if lease[0] is None else lease), row[_N_JOB + 8], row[_N_JOB + 9]


def due_wakes_checked(conn: Connection, now: float, limit: int) -> list[tuple]:
    """`due_wakes`, each with its lease row (generation, active, expiration, invalidated_at,
    app_profile, transport, endpoint, endpoint_hash) and its event (raw, expiration)."""
    due = [_checked(r) for r in conn.execute(SQL_DUE_CHECKED, (now, limit))]
    if is_sqlite(conn):
        return due
    # Other nodes: wait for any transaction still deciding about these endpoints (a match joining
    # one of these wakes right now), so the members read next include what it committed.
    lock_endpoints(conn, [item[0].endpoint_key for item in due])
    return due


def members_checked(conn: Connection, wake_ids: list[str]) -> dict[str, list[tuple]]:
    """The coalesced jobs of these wakes, as `due_wakes_checked` gives them, by wake id."""
    out: dict[str, list[tuple]] = {}
    if wake_ids:
        for r in conn.execute(SQL_MEMBERS_CHECKED, (orjson.dumps(wake_ids).decode(),)):
            item = _checked(r)
            out.setdefault(item[0].wake_id, []).append(item)
    return out


def job_checked(conn: Connection, job_id: str) -> tuple | None:
    row = conn.execute(SQL_JOB_CHECKED, (job_id,)).fetchone()
    return None if row is None else _checked(row)


def claim_wakes(conn: Connection, jobs: list[WakeJob], now: float, visibility: float) -> None:
    """`claim_wake` for many at once (one statement, and two per (origin, app profile, transport))."""
    if not jobs:
        return
    conn.execute(SQL_CLAIM_MANY, (now + visibility, orjson.dumps([job.id for job in jobs]).decode()))
    groups: dict[tuple, tuple[list[str], list[str]]] = {}
    for job in jobs:
        ids, hashes = groups.setdefault((job.origin, job.app_profile, job.transport), ([], []))
        ids.append(job.id)
        hashes.append(job.endpoint_hash)
    for (origin, app_profile, transport), (ids, hashes) in groups.items():
        ids_json, hashes_json = orjson.dumps(ids).decode(), orjson.dumps(hashes).decode()
        # (and clears the hints naming these wakes)
        conn.execute(SQL_NOTE_SENT_MANY, (now, ids_json, origin, app_profile, transport, hashes_json))
        conn.execute(SQL_NOTE_SENT_NEW, (origin, app_profile, transport, now, hashes_json))


def wake_members(conn: Connection, wake_id: str) -> list[WakeJob]:
    """The jobs coalesced into a pending wake."""
    return [_job(r) for r in conn.execute(SQL_MEMBERS, (wake_id,))]


def claim_wake(conn: Connection, job: WakeJob, now: float, visibility: float) -> None:
    """Mark a wake as being sent (until now + visibility) and note the send for the rate cap.
    (The wake's class is not written: each job keeps its own match's class, and a wake's class is
    the highest among the jobs that pass the re-check before each attempt.)"""
    conn.execute(SQL_CLAIM, (now + visibility, job.id))
    conn.execute(SQL_NOTE_SENT, (*job.endpoint_key, now, job.id))


def set_state(conn: Connection, job_id: str, state: str, now: float, error: str | None = None) -> None:
    """A final state for a job (and the finish time of the jobs coalesced into it)."""
    conn.execute(SQL_SET_STATE, (state, now, error, job_id))
    conn.execute(SQL_FINISH_MEMBERS, (now, job_id))


def release(conn: Connection, job_ids: list[str], now: float) -> int:
    """Give back claims of wakes never sent, or whose sends were abandoned (a graceful stop):
    pending again, due at `now` (the same job ids, so the same apns-id). A job whose outcome was
    recorded meanwhile is no longer claimed and keeps it."""
    released = conn.execute(SQL_RELEASE, (now, orjson.dumps(job_ids).decode())).fetchall()
    _note_pending(conn, released)
    return len(released)


def extend_claims(conn: Connection, job_ids: list[str], until: float) -> None:
    """Claims the claiming process still holds (queued or being sent) stay its own until `until`."""
    conn.execute(SQL_EXTEND_CLAIMS, (until, orjson.dumps(job_ids).decode()))


def count_attempt(conn: Connection, job_id: str) -> None:
    """One more provider attempt against the job's budget (configuration faults are not counted)."""
    conn.execute(SQL_COUNT_ATTEMPT, (job_id,))


def shift_due(conn: Connection, seconds: float, now: float) -> int:
    """The wall clock went back `seconds`: bring waiting wakes (retries, rate-capped, claims) that
    many seconds closer, so each waits as long as it would have; the number moved."""
    conn.execute(SQL_SHIFT_DUE, (seconds, now))
    return conn.changes()


def reschedule(conn: Connection, job_id: str, due_at: float, error: str | None) -> None:
    """Back to pending, due at `due_at` (a retry keeps the job's id: the same apns-id)."""
    _note_pending(conn, conn.execute(SQL_RESCHEDULE, (due_at, error, job_id)).fetchall())


def cancel_lease_jobs(conn: Connection, origin: int, pubkey: str, d: str, now: float, why: str) -> int:
    """Cancel the undelivered jobs of a lease address (revoked or replaced)."""
    cancelled = conn.execute(SQL_CANCEL_LEASE, (now, why, origin, pubkey, d)).fetchall()
    for job_id, due_at, was_wake in cancelled:
        if was_wake:
            _adopt_orphans(conn, job_id, due_at)
    return len(cancelled)


def _adopt_orphans(conn: Connection, wake_id: str, due_at: float) -> None:
    """The jobs of other leases that had joined a cancelled wake stay one wake: they join the
    endpoint's pending wake if it has another, else the oldest of them becomes the wake, due when
    the cancelled one was (so neither the rate cap nor a retry's backoff is skipped), and the rest
    join it."""
    orphans = conn.execute(SQL_ORPHANS, (wake_id,)).fetchall()
    if not orphans:
        return
    lead, *key = orphans[0]
    lock_endpoints(conn, [tuple(key)])
    _last_sent, pending = _endpoint(conn, tuple(key))
    if pending is None:
        conn.execute(SQL_LEAD_ORPHANS, (due_at, lead))
        _note_pending(conn, [(*key, lead)])
        pending = lead
    conn.execute(SQL_MOVE_ORPHANS, (pending, wake_id))


def log_attempt(conn: Connection, job: WakeJob, *, at: float, cls: str, attempt: int, outcome: str,
                status: int | None, reason: str | None, latency_ms: float | None, detail: str = "",
                lease: str | None = None) -> None:
    """One attempt in the delivery log; `lease` is how the row names the lease (default `job.lease`;
    the executor gives the dashboard's fingerprint, `lease:1a2b3c4d5e`)."""
    conn.execute(SQL_LOG, (at, job.origin, lease or job.lease, job.app_profile, job.transport, cls, job.id, attempt,
                           outcome, status, reason, latency_ms, detail))


def record_delivered(conn: Connection, attempts: list[tuple], now: float,
                     lease_of: Callable[[WakeJob], str] | None = None) -> None:
    """Accepted attempts (job, class, attempt, status, reason, latency_ms, detail), all at `now`: what
    `log_attempt`, `count_attempt`, `set_state(..., "delivered")` and `clear_alerts` do for each,
    a statement per step for all of them (alerts cleared once per app profile). `lease_of` names
    each row's lease (as `log_attempt`'s `lease`)."""
    name = lease_of or (lambda job: job.lease)
    conn.executemany(SQL_LOG, [(now, job.origin, name(job), job.app_profile, job.transport, cls, job.id, attempt,
                                "accepted", status, reason, latency_ms, detail)
                               for job, cls, attempt, status, reason, latency_ms, detail in attempts])
    ids = orjson.dumps([job.id for job, *_ in attempts]).decode()
    conn.execute(SQL_DELIVERED_MANY, (now, ids))
    conn.execute(SQL_FINISH_MEMBERS_MANY, (now, ids))
    for origin, app_profile in {(job.origin, job.app_profile): None for job, *_ in attempts}:
        conn.execute(SQL_CLEAR_ALERTS, (now, origin, app_profile))
        note_outcome(conn, origin, app_profile, "accepted", "accepted", False, now)


def raise_alert(conn: Connection, origin: int, app_profile: str, reason: str, detail: str,
                status: int | None, now: float) -> bool:
    """Record a configuration fault; True if the alert is new (or came back after clearing)."""
    _count, fresh = conn.execute(SQL_ALERT, (origin, app_profile, reason, detail, status, now, now)).fetchone()
    return bool(fresh)


def dismiss_alert(conn: Connection, origin: int, app_profile: str, reason: str, now: float) -> bool:
    """The operator has seen an alert: hidden until it clears and comes back. Whether it was shown."""
    conn.execute(SQL_DISMISS_ALERT, (now, origin, app_profile, reason))
    return conn.changes() == 1


def note_outcome(conn: Connection, origin: int, app_profile: str, kind: str, detail: str, refused: bool,
                 now: float) -> tuple[int, bool]:
    """Record one attempt in its profile's health; (transient failures in a row, host refused)."""
    failures = 1 if kind == "transient" else 0
    failures, refused = conn.execute(SQL_HEALTH, (origin, app_profile, failures, int(bool(refused)), now, kind,
                                                  detail[:500], now if kind == "accepted" else None)).fetchone()
    return failures, bool(refused)


def transport_health(conn: Connection) -> dict[tuple[int, str], dict[str, Any]]:
    """Every profile's health row by (origin, app profile)."""
    keys = ("origin", "app_profile", "failures", "refused", "last_at", "last_outcome", "last_detail", "ok_at")
    return {(r[0], r[1]): dict(zip(keys, r)) for r in conn.execute(SQL_HEALTH_ROWS)}


def clear_alerts(conn: Connection, origin: int, app_profile: str, now: float) -> int:
    """A wake for this profile was accepted: its alerts are over."""
    conn.execute(SQL_CLEAR_ALERTS, (now, origin, app_profile))
    return conn.changes()


def purge(conn: Connection, now: float, retention: float) -> int:
    """Drop finished jobs, log rows, rate state and cleared alerts older than `retention` seconds."""
    cutoff = now - retention
    n = 0
    for sql in (SQL_PURGE_JOBS, SQL_PURGE_LOG, SQL_PURGE_ENDPOINTS, SQL_PURGE_ALERTS):
        conn.execute(sql, (cutoff,))
        n += conn.changes()
    conn.execute(SQL_PURGE_HINTS)
    return n


# -- reads ------------------------------------------------------------------------------------------

def next_due(conn: Connection) -> float | None:
    """When the next pending wake (or lapsing claim) is due; None if there is none."""
    return conn.execute(SQL_NEXT_DUE).fetchone()[0]


def list_jobs(conn: Connection, *, state: str | None = None, origin: int | None = None,
              limit: int = 100, before: float | None = None) -> list[WakeJob]:
    """Jobs, newest first; filtered by state, origin, created before `before` (paging)."""
    d = dialect_of(conn)
    where, args = [], []
    if state is not None:
        where.append(f"state = {d.mark}")
        args.append(state)
    if origin is not None:
        where.append(f"origin = {d.mark}")
        args.append(origin)
    if before is not None:
        where.append(f"created_at < {d.mark}")
        args.append(before)
    sql = f"SELECT {_JOB_COLUMNS} FROM wake_jobs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY created_at DESC LIMIT {d.mark}"
    return [_job(r) for r in conn.execute(d.text(sql), (*args, limit))]


def job_counts(conn: Connection, origin: int | None = None) -> dict[str, int]:
    """How many jobs are in each state (every state listed, zeros included)."""
    counts = dict.fromkeys(JOB_STATES, 0)
    if origin is None:
        rows = conn.execute(SQL("SELECT state, count(*) FROM wake_jobs GROUP BY state",
                                "SELECT state, count(*) FROM wake_jobs GROUP BY state"))
    else:
        rows = conn.execute(SQL("SELECT state, count(*) FROM wake_jobs WHERE origin = ? GROUP BY state",
                                "SELECT state, count(*) FROM wake_jobs WHERE origin = %s GROUP BY state"), (origin,))
    counts.update(dict(rows))
    return counts


_LOG_COLUMNS = ("id", "at", "origin", "lease", "app_profile", "transport", "class", "job_id", "attempt", "outcome",
                "status", "reason", "latency_ms", "detail")
_LOG_FILTERS = {"origin": "origin = {}", "outcome": "outcome = {}", "app_profile": "app_profile = {}",
                "transport": "transport = {}", "job_id": "job_id = {}", "since": "at >= {}", "until": "at < {}",
                "before_id": "id < {}"}  # `{}`: the binding's mark


def delivery_log(conn: Connection, *, limit: int = 100, **filters: Any) -> list[dict[str, Any]]:
    """Attempts, newest first. Filters: origin, outcome, app_profile, transport, job_id, since,
    until (times), before_id (paging)."""
    unknown = set(filters) - set(_LOG_FILTERS)
    if unknown:
        raise TypeError(f"unknown delivery log filter {sorted(unknown)[0]!r}")
    d = dialect_of(conn)
    where = [_LOG_FILTERS[k].format(d.mark) for k, v in filters.items() if v is not None]
    args = [v for v in filters.values() if v is not None]
    sql = f"SELECT {', '.join(_LOG_COLUMNS)} FROM delivery_log"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY id DESC LIMIT {d.mark}"
    return [dict(zip(_LOG_COLUMNS, r)) for r in conn.execute(d.text(sql), (*args, limit))]


_ALERT_COLUMNS = ("origin", "app_profile", "reason", "detail", "status", "first_at", "last_at", "count", "cleared_at",
                  "dismissed_at")


def alerts(conn: Connection, *, active_only: bool = True) -> list[dict[str, Any]]:
    """Configuration-fault alerts, most recent first; only uncleared ones unless asked."""
    sql = f"SELECT {', '.join(_ALERT_COLUMNS)} FROM push_alerts"
    if active_only:
        sql += " WHERE cleared_at IS NULL"
    sql += " ORDER BY last_at DESC"
    return [dict(zip(_ALERT_COLUMNS, r)) for r in conn.execute(dialect_of(conn).text(sql))]


# -- operator actions and views (the dashboard) -------------------------------------------------------

SQL_DEAD_JOB = SQL(f"SELECT {_JOB_COLUMNS} FROM wake_jobs WHERE id = ? AND state = 'dead'",
                   f"SELECT {_JOB_COLUMNS} FROM wake_jobs WHERE id = %s AND state = 'dead'")
SQL_RETRY_DEAD = SQL(
    "UPDATE wake_jobs SET state = ?, wake_id = ?, due_at = ?, expires_at = ?, attempts = 0, finished_at = NULL, "
    "last_error = NULL WHERE id = ? AND state = 'dead'",
    "UPDATE wake_jobs SET state = %s, wake_id = %s, due_at = %s, expires_at = %s, attempts = 0, finished_at = NULL, "
    "last_error = NULL WHERE id = %s AND state = 'dead'",
)
SQL_DISCARD_DEAD = SQL(
    "UPDATE wake_jobs SET state = 'cancelled', finished_at = ?, last_error = ? WHERE id = ? AND state = 'dead'",
    "UPDATE wake_jobs SET state = 'cancelled', finished_at = %s, last_error = %s WHERE id = %s AND state = 'dead'",
)
SQL_QUEUE_SUMMARY = SQL(
    "SELECT coalesce(sum(state IN ('pending', 'claimed')), 0), "
    "coalesce(sum(state IN ('pending', 'claimed') AND attempts > 0), 0), coalesce(sum(state = 'dead'), 0) "
    "FROM wake_jobs WHERE state IN ('pending', 'claimed', 'dead')",
    "SELECT coalesce(sum(state IN ('pending', 'claimed')), 0), "
    "coalesce(sum(state IN ('pending', 'claimed') AND attempts > 0), 0), coalesce(sum(state = 'dead'), 0) "
    "FROM wake_jobs WHERE state IN ('pending', 'claimed', 'dead')",
)
SQL_OUTCOME_COUNTS = SQL("SELECT outcome, count(*) FROM delivery_log WHERE at >= ? GROUP BY outcome",
                         "SELECT outcome, count(*) FROM delivery_log WHERE at >= %s GROUP BY outcome")
SQL_OUTCOME_COUNTS_ORIGIN = SQL(
    "SELECT outcome, count(*) FROM delivery_log WHERE at >= ? AND origin = ? GROUP BY outcome",
    "SELECT outcome, count(*) FROM delivery_log WHERE at >= %s AND origin = %s GROUP BY outcome",
)
# Per-minute attempts, mean and slowest latency (delivery_log_at index range).
SQL_LATENCY_MINUTES = SQL(
    "SELECT CAST(at / 60 AS INTEGER) * 60, count(*), avg(latency_ms), max(latency_ms) FROM delivery_log "
    "WHERE at >= ? AND latency_ms IS NOT NULL GROUP BY 1 ORDER BY 1",
    # PostgreSQL rounds a cast to an integer; SQLite truncates
    "SELECT CAST(floor(at / 60) AS BIGINT) * 60, count(*), avg(latency_ms), max(latency_ms) FROM delivery_log "
    "WHERE at >= %s AND latency_ms IS NOT NULL GROUP BY 1 ORDER BY 1",
)
# The latest attempt of each (origin, app profile): how its transport last answered.
SQL_LAST_OUTCOMES = SQL(
    "SELECT d.origin, d.app_profile, d.transport, d.outcome, d.status, d.reason, d.at FROM delivery_log d "
    "JOIN (SELECT origin, app_profile, max(id) AS id FROM delivery_log WHERE at >= ? GROUP BY origin, app_profile) m "
    "ON d.id = m.id",
    "SELECT d.origin, d.app_profile, d.transport, d.outcome, d.status, d.reason, d.at FROM delivery_log d "
    "JOIN (SELECT origin, app_profile, max(id) AS id FROM delivery_log WHERE at >= %s GROUP BY origin, app_profile) m "
    "ON d.id = m.id",
)


def retry_dead(conn: Connection, job_id: str, now: float, useful_age: float) -> bool:
    """The operator sends a dead-lettered wake again: due now, a fresh useful age and attempt count
    (it joins its endpoint's pending wake if there is one). Whether it was dead."""
    row = conn.execute(SQL_DEAD_JOB, (job_id,)).fetchone()
    if row is None:
        return False
    job = _job(row)
    lock_endpoints(conn, [job.endpoint_key])
    _last_sent, pending = _endpoint(conn, job.endpoint_key)
    state, wake_id = ("coalesced", pending) if pending else ("pending", None)
    conn.execute(SQL_RETRY_DEAD, (state, wake_id, now, now + useful_age, job_id))
    if state == "pending":
        _note_pending(conn, [(*job.endpoint_key, job_id)])
    return True


def discard_dead(conn: Connection, job_id: str, now: float) -> bool:
    """The operator gives up on a dead-lettered wake (kept, cancelled, until the log retention)."""
    conn.execute(SQL_DISCARD_DEAD, (now, "discarded by the operator", job_id))
    return conn.changes() == 1


def queue_summary(conn: Connection) -> dict[str, int]:
    """Wakes waiting (pending or being sent), of which retrying after a failure, and dead-lettered."""
    queued, retrying, dead = conn.execute(SQL_QUEUE_SUMMARY).fetchone()
    return {"queued": queued, "failed": retrying, "dead": dead}


def outcome_counts(conn: Connection, since: float, origin: int | None = None) -> dict[str, int]:
    rows = conn.execute(SQL_OUTCOME_COUNTS, (since,)) if origin is None else \
        conn.execute(SQL_OUTCOME_COUNTS_ORIGIN, (since, origin))
    return dict(rows.fetchall())


def latency_by_minute(conn: Connection, since: float) -> list[tuple[int, int, float, float]]:
    """(minute start, attempts, mean latency ms, slowest ms) since `since`."""
    return conn.execute(SQL_LATENCY_MINUTES, (since,)).fetchall()


def last_outcomes(conn: Connection, since: float) -> list[dict[str, Any]]:
    keys = ("origin", "app_profile", "transport", "outcome", "status", "reason", "at")
    return [dict(zip(keys, r)) for r in conn.execute(SQL_LAST_OUTCOMES, (since,))]


SQL_JOBS_BY_ID = SQL(f"SELECT {_JOB_COLUMNS} FROM wake_jobs WHERE id IN (SELECT value FROM json_each(?))",
                     f"SELECT {_JOB_COLUMNS} FROM wake_jobs WHERE id IN "
                     "(SELECT value FROM jsonb_array_elements_text(%s::jsonb))")


def jobs_by_id(conn: Connection, ids) -> dict[str, WakeJob]:
    import json

    return {j.id: j for j in map(_job, conn.execute(SQL_JOBS_BY_ID, (json.dumps(list(ids)),)))}
