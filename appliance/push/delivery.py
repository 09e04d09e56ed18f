"""Delivery workers: claim due wakes, re-check them, send them through their transport, record
what happened (NIP-PL "Wake Delivery", "Lease and Key Lifecycle").

One claimer task and up to `wake_workers` concurrent sends, all on the event loop. A claim is a
write transaction that, for each due wake:

- dead-letters it if its useful age passed;
- re-checks every job it covers right before the attempt: the lease is still the effective one
  at its address, active, unexpired, at the job's generation, not invalidated, and the lease
  author may read the event at the job's origin now (`authorize`: the relay's `can_read` over
  committed state). A job that fails is dropped silently; a wake with no job left is dropped;
- marks the wake claimed until now + `wake_visibility_timeout` (a crashed process's claim lapses
  and the wake is claimed again, with the same id) and notes the send for the rate cap.

The attempt's outcome (transports.base) then decides, in another write transaction: delivered;
endpoint generation invalidated; configuration alert and a later retry; transient retry with
exponential backoff, jitter and Retry-After; or dead letter. Every attempt is logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable

import apsw
import orjson

from appliance.nostr.event import Event, InvalidEvent, parse_event
from appliance.store import wakes
from appliance.store.wakes import WakeJob
from appliance.transports import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    PERMANENT,
    REFRESH_RETRY,
    TRANSIENT,
    Outcome,
    Transport,
    WakeRequest,
)

from .descriptor import CLASS_RANK
from .matcher import Authorize
from .state import effective_lease, invalidate_generation

log = logging.getLogger("appliance.push")

# Longest pause between two attempts of one job, whatever the backoff says (seconds).
MAX_BACKOFF = 600.0
# After a configuration fault, when to try the job again: the operator may have fixed it (seconds).
CONFIGURATION_RETRY = 60.0
# Longest a claimer sleeps with nothing due, in case a nudge was missed (seconds).
IDLE_POLL = 5.0

SQL_EVENT = "SELECT raw, expiration FROM events WHERE origin = ? AND id = ?"


@dataclass(frozen=True)
class DeliverySettings:
    workers: int = 64
    min_interval: float = 2.0
    max_attempts: int = 8
    useful_age: float = 3600.0
    retry_delay: float = 2.0
    visibility: float = 60.0
    log_retention: float = 7 * 86400.0

    @classmethod
    def from_settings(cls, s) -> "DeliverySettings":
        return cls(workers=s.wake_workers, min_interval=s.wake_min_interval, max_attempts=s.wake_max_attempts,
                   useful_age=s.wake_useful_age, retry_delay=s.wake_retry_delay,
                   visibility=s.wake_visibility_timeout, log_retention=s.delivery_log_retention)


@dataclass(frozen=True)
class Wake:
    """A claimed wake: the job whose id the provider sees, where it goes, and its class."""

    job: WakeJob
    endpoint: str
    cls: str
    attempt: int
    #: the latest expiration among the leases it wakes for: no provider holds the wake past it
    lease_until: float = float("inf")


def backoff(attempt: int, base: float, rng: Callable[[], float] = random.random) -> float:
    """Exponential backoff with jitter: base * 2^(attempt-1), at most MAX_BACKOFF, times 0.5..1."""
    return min(base * 2 ** (attempt - 1), MAX_BACKOFF) * (0.5 + rng() / 2)


def stored_event(conn: apsw.Connection, origin: int, event_id: str, now: float) -> Event | None:
    """The event as the store serves it now (None once deleted, purged or expired)."""
    row = conn.execute(SQL_EVENT, (origin, event_id)).fetchone()
    if row is None or (row[1] is not None and row[1] <= now):
        return None
    try:
        return parse_event(orjson.loads(row[0]))
    except (InvalidEvent, ValueError):
        return None


class Delivery:
    """The delivery workers of the push executor."""

    def __init__(self, store, *, transport_for: Callable[[int, str], Transport | None], authorize: Authorize,
                 settings: DeliverySettings, clock: Callable[[], float] = time.time):
        self.store = store
        self.transport_for = transport_for
        self.authorize = authorize
        self.settings = settings
        self.clock = clock
        self._wakeup = asyncio.Event()
        self._inflight: set[asyncio.Task] = set()
        self.stats = {"sent": 0, "accepted": 0, "failed": 0, "dropped": 0}

    def nudge(self) -> None:
        """New wakes may be due (called after the commit that wrote them)."""
        self._wakeup.set()

    # -- the claim (a write transaction) -----------------------------------------------------------

    def _recheck(self, conn: apsw.Connection, job: WakeJob, now: float):
        """(None, lease) if the job may still wake its endpoint, else (reason, None)."""
        lease = effective_lease(conn, job.origin, job.lease_pubkey, job.lease_d)
        if lease is None:
            return "lease gone", None
        if lease.generation != job.generation:
            return "lease replaced by a newer generation", None
        if not lease.active:
            return "lease revoked", None
        if lease.expiration <= now:
            return "lease expired", None
        if lease.invalidated:
            return "endpoint generation invalidated", None
        if (lease.app_profile, lease.transport, lease.endpoint_hash) != (job.app_profile, job.transport,
                                                                          job.endpoint_hash):
            return "lease endpoint changed", None
        ev = stored_event(conn, job.origin, job.event_id, now)
        # One reason for both, as the spec asks: the check must not tell whether the event exists.
        if ev is None or not self.authorize(conn, job.origin, job.lease_pubkey, ev):
            return "event not readable by the lease author", None
        return None, lease

    def claim(self, conn: apsw.Connection, now: float, limit: int) -> list[Wake]:
        out: list[Wake] = []
        for job in wakes.due_wakes(conn, now, limit):
            if now >= job.expires_at:
                why = "useful age passed" + (f" (last: {job.last_error})" if job.last_error else "")
                wakes.set_state(conn, job.id, "dead", now, why)
                log.warning("wake dead-lettered job=%s origin=%d app_profile=%s reason=%r", job.id, job.origin,
                            job.app_profile, why)
                continue
            if self.transport_for(job.origin, job.app_profile) is None:
                # The profile left the descriptor: nothing may be sent for it any more.
                wakes.set_state(conn, job.id, "dropped", now, "app profile no longer configured")
                self.stats["dropped"] += 1
                continue
            passing: list[WakeJob] = []
            endpoint = None
            own_reason = None
            until = 0.0
            for member in [job] + wakes.wake_members(conn, job.id):
                reason, lease = self._recheck(conn, member, now)
                if reason is None:
                    passing.append(member)
                    endpoint = endpoint or lease.endpoint
                    until = max(until, lease.expiration)
                elif member is job:
                    own_reason = reason
                else:
                    wakes.set_state(conn, member.id, "dropped", now, reason)
                    self.stats["dropped"] += 1
            if not passing:
                wakes.set_state(conn, job.id, "dropped", now, own_reason)
                self.stats["dropped"] += 1
                continue
            # The wake keeps this job's id (its apns-id) even when only jobs coalesced into it remain.
            cls = max((m.cls for m in passing), key=CLASS_RANK.__getitem__)
            wakes.claim_wake(conn, job, cls, now, self.settings.visibility)
            out.append(Wake(job, endpoint, cls, job.attempts + 1, until))
        return out

    # -- the outcome (a write transaction) ---------------------------------------------------------

    def record(self, conn: apsw.Connection, wake: Wake, outcome: Outcome, latency_ms: float | None,
               now: float) -> None:
        job, s = wake.job, self.settings
        wakes.log_attempt(conn, job, at=now, cls=wake.cls, attempt=wake.attempt, outcome=outcome.kind,
                          status=outcome.status, reason=outcome.reason, latency_ms=latency_ms,
                          detail=outcome.detail)
        kind = outcome.kind
        if kind not in (CONFIGURATION, REFRESH_RETRY):
            wakes.count_attempt(conn, job.id)
        what = f"{outcome.status or '-'} {outcome.reason or ''}".strip() + (f": {outcome.detail}" if outcome.detail
                                                                             else "")
        if kind == ACCEPTED:
            wakes.set_state(conn, job.id, "delivered", now)
            wakes.clear_alerts(conn, job.origin, job.app_profile, now)
            return
        if kind == INVALID_ENDPOINT:
            # Disable that endpoint generation only: every lease generation this wake covered (they
            # share the endpoint), nothing else of the author's. A gateway names the generation its
            # 410 is about: it is applied only while that is still the lease's current generation.
            members = [job] + wakes.wake_members(conn, job.id)
            if outcome.generation is not None:
                members = [m for m in members if m.generation == outcome.generation]
                if not members:
                    wakes.set_state(conn, job.id, "dropped", now,
                                    f"gateway invalidated generation {outcome.generation}, not the current one")
                    return
            for member in members:
                invalidate_generation(conn, member.origin, member.lease_pubkey, member.lease_d, member.generation,
                                      now)
            wakes.set_state(conn, job.id, "invalidated", now, what)
            log.info("endpoint generation invalidated origin=%d lease=%s app_profile=%s reason=%s", job.origin,
                     job.lease, job.app_profile, outcome.reason)
            return
        if kind in (CONFIGURATION, REFRESH_RETRY):
            # The operator's to fix: alert, touch no endpoint, keep the job for later. Not an
            # attempt against the job's budget (the endpoint was not at fault).
            if wakes.raise_alert(conn, job.origin, job.app_profile, outcome.reason or "configuration", what,
                                 outcome.status, now):
                log.error("push configuration fault origin=%d app_profile=%s: %s", job.origin, job.app_profile, what)
            due = now + CONFIGURATION_RETRY
            if due >= job.expires_at:
                wakes.set_state(conn, job.id, "dead", now, f"configuration fault: {what}")
            else:
                wakes.reschedule(conn, job.id, due, f"configuration fault: {what}")
            return
        if kind == TRANSIENT:
            delay = max(outcome.retry_after or 0.0, backoff(wake.attempt, s.retry_delay))
            if wake.attempt >= s.max_attempts or now + delay >= job.expires_at:
                why = f"gave up after {wake.attempt} attempts: {what}"
                wakes.set_state(conn, job.id, "dead", now, why)
                log.warning("wake dead-lettered job=%s origin=%d app_profile=%s reason=%r", job.id, job.origin,
                            job.app_profile, why)
            else:
                wakes.reschedule(conn, job.id, now + delay, what)
            return
        # PERMANENT: this request can never succeed.
        wakes.set_state(conn, job.id, "dead", now, f"permanent request fault: {what}")
        log.warning("wake refused as a permanent request fault job=%s origin=%d app_profile=%s: %s", job.id,
                    job.origin, job.app_profile, what)

    # -- the loop ----------------------------------------------------------------------------------

    async def _send(self, wake: Wake) -> Outcome:
        transport = self.transport_for(wake.job.origin, wake.job.app_profile)
        if transport is None:
            return Outcome(CONFIGURATION, detail="app profile no longer configured")
        # The wake's useful age, and never past the lease (a gateway also refuses a request that
        # outlives the grant the lease carries).
        request = WakeRequest(wake.endpoint, wake.job.id, int(min(wake.job.expires_at, wake.lease_until)))
        try:
            return await transport.send(request)
        except Exception as exc:  # a transport bug must not lose the job: retry it later
            log.exception("transport failed for job %s", wake.job.id)
            return Outcome(TRANSIENT, detail=f"transport error: {type(exc).__name__}")

    async def deliver(self, wake: Wake) -> Outcome:
        """Send one claimed wake and record the outcome."""
        t0 = time.perf_counter()
        outcome = await self._send(wake)
        latency = (time.perf_counter() - t0) * 1000
        self.stats["sent"] += 1
        self.stats["accepted" if outcome.kind == ACCEPTED else "failed"] += 1
        await self.store.write(lambda conn: self.record(conn, wake, outcome, latency, self.clock()))
        return outcome

    async def run_once(self) -> int:
        """Claim every due wake and deliver them all (tests drive the workers with this)."""
        claimed = await self.store.write(lambda conn: self.claim(conn, self.clock(), 10_000))
        await asyncio.gather(*(self.deliver(w) for w in claimed))
        return len(claimed)

    def _done(self, task: asyncio.Task) -> None:
        self._inflight.discard(task)
        self._wakeup.set()  # a slot is free
        if not task.cancelled() and task.exception() is not None:
            log.error("wake delivery failed", exc_info=task.exception())

    async def run(self) -> None:
        """The claimer: forever claim what is due (up to the free worker slots) and send it."""
        while True:
            try:
                await self._cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("wake delivery cycle failed")
                await asyncio.sleep(1.0)

    async def _cycle(self) -> None:
        self._wakeup.clear()
        free = self.settings.workers - len(self._inflight)
        if free > 0:
            claimed = await self.store.write(lambda conn: self.claim(conn, self.clock(), free))
            for wake in claimed:
                task = asyncio.create_task(self.deliver(wake))
                self._inflight.add(task)
                task.add_done_callback(self._done)
            if len(claimed) == free:
                return  # there may be more due: claim again as soon as slots free up
            nxt = await self.store.read(wakes.next_due)
            timeout = IDLE_POLL if nxt is None else min(IDLE_POLL, max(0.0, nxt - self.clock()))
        else:
            timeout = IDLE_POLL
        if timeout > 0:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        """Stop sending: in-flight attempts are abandoned; their claims lapse and are retried."""
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
