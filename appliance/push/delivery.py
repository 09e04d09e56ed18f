"""Delivery workers: take due wakes, re-check them, send them through their transport, record
what happened (NIP-PL "Wake Delivery", "Lease and Key Lifecycle").

`wake_workers` worker tasks on the event loop take claimed wakes from a queue and send them; the
claimer keeps the queue fed. Two ways in:

- a wake due at once is written already claimed in the event's own transaction (`insert_job`
  with `claim_for`) and handed to the queue after that commit; its worker re-reads the committed
  state (`_recheck_before_send`) right before the first attempt;
- every other wake (rate-capped, retried, or left by a crash) is claimed by the claimer in a write
  transaction that, for each due wake, dead-letters it past its useful age, re-checks every job
  it covers (`_verdict`: the lease is still the effective one at its address, active, unexpired,
  at the job's generation, not invalidated, and the lease author may read the event at the job's
  origin now, by the relay's `can_read` over committed state), drops the jobs that fail, and
  marks the wake claimed until now + `wake_visibility_timeout` (a crashed process's claim lapses
  and the wake is claimed again, with the same id) noting the send for the rate cap; a claimed
  wake that then waits longer than RECHECK_AFTER for a worker is re-checked again (a read) right
  before its attempt.

The attempt's outcome (transports.base) then decides, in a write transaction shared by the
outcomes that arrive together: delivered; endpoint generation invalidated; configuration alert
and a later retry; transient retry with exponential backoff, jitter and Retry-After; or dead
letter. Every attempt is logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import orjson

from appliance.nostr.event import InvalidEvent, parse_event
from appliance.errors import StorageFull
from appliance.store import wakes
from appliance.store.faultlog import FaultLog
from appliance.store.interface import Connection
from appliance.store.wakes import WakeJob
from appliance.transports import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    REFRESH_RETRY,
    TRANSIENT,
    Outcome,
    Transport,
    WakeRequest,
)

from .descriptor import CLASS_RANK
from .matcher import Authorize
from appliance.store.leases import invalidate_generation

log = logging.getLogger("appliance.push")

# Longest pause between two attempts of one job, whatever the backoff says (seconds).
MAX_BACKOFF = 600.0
# After a configuration fault, when to try the job again: the operator may have fixed it (seconds).
CONFIGURATION_RETRY = 60.0
# Longest a claimer sleeps with nothing due, in case a nudge was missed (seconds).
IDLE_POLL = 5.0
# Seconds the wall clock may fall behind the monotonic clock between two cycles before we call it
# a step back and move waiting wakes: NTP's slewing stays far below it; smaller steps barely delay.
CLOCK_STEP_TOLERANCE = 2.0
# A claimed wake that waited longer than this for a worker (a slow provider holds every worker)
# is re-checked again right before its attempt: no wake is sent on an older re-check (seconds).
RECHECK_AFTER = 0.5
# The claimer keeps up to CLAIM_AHEAD x `wake_workers` wakes claimed (queued or being sent), and
# claims once at least half of them are free (sooner if the workers ran dry). The writer's work
# per wake falls with the size of a claim (the rows of one batch share index pages and a commit):
# this makes claims large without opening more HTTP/2 streams than there are workers.
CLAIM_AHEAD = 4
# Transient failures in a row after which an app profile's transport is failing (an alert).
FAILING_AFTER = 3



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
    fresh: bool = False  # claimed at match time: re-checked (read only) by the worker before sending
    #: the latest expiration among the leases it wakes for: no provider holds the wake past it
    lease_until: float = float("inf")
    #: when it was last re-checked (time.monotonic()): see RECHECK_AFTER
    checked_at: float = field(default_factory=time.monotonic)


def describe(outcome: Outcome) -> str:
    """An outcome for the operator: `503 ServiceUnavailable: detail`, the detail alone without an answer."""
    if outcome.status is None and not outcome.reason:
        return outcome.detail or outcome.kind
    return f"{outcome.status or '-'} {outcome.reason or ''}".strip() + (f": {outcome.detail}" if outcome.detail
                                                                        else "")


def note_health(conn: Connection, origin: int, app_profile: str, outcome: Outcome, now: float) -> None:
    """An attempt's outcome (a wake's or a test wake's) in its profile's health: an accepted one
    clears the profile's alerts; FAILING_AFTER transient failures in a row, or a host refusing the
    connection, make the profile failing and raise an alert (cleared by the next accepted one); a
    configuration answer (403 InvalidProviderToken, say) raises one at once. A failure of an
    endpoint's own host (`endpoint_fault`) is the lease holder's, not the operator's: left out.
    (docs/spec-notes.md U6)"""
    if outcome.endpoint_fault:
        return
    what = describe(outcome)
    failures, refused = wakes.note_outcome(conn, origin, app_profile, outcome.kind, what, outcome.refused, now)
    if outcome.kind == ACCEPTED:
        wakes.clear_alerts(conn, origin, app_profile, now)
    elif outcome.kind in (CONFIGURATION, REFRESH_RETRY):
        # The operator's to fix (a wrong key, team or topic): a fault with an alert, whether a wake
        # or a test wake met it.
        if wakes.raise_alert(conn, origin, app_profile, outcome.reason or "configuration", what, outcome.status,
                             now):
            log.error("push configuration fault origin=%d app_profile=%s: %s", origin, app_profile, what)
    elif outcome.kind == TRANSIENT and (refused or failures >= FAILING_AFTER):
        reason = "connection refused" if refused else "failing"
        detail = what if refused else f"{failures} attempts in a row failed; the last: {what}"
        if wakes.raise_alert(conn, origin, app_profile, reason, detail, outcome.status, now):
            log.warning("push transport failing origin=%d app_profile=%s: %s", origin, app_profile, detail)


def backoff(attempt: int, base: float, rng: Callable[[], float] = random.random) -> float:
    """Exponential backoff with jitter: base * 2^(attempt-1), at most MAX_BACKOFF, times 0.5..1."""
    return min(base * 2 ** (attempt - 1), MAX_BACKOFF) * (0.5 + rng() / 2)


class Delivery:
    """The delivery workers of the push executor."""

    def __init__(self, store, *, transport_for: Callable[[int, str], Transport | None], authorize: Authorize,
                 settings: DeliverySettings, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 lease_ref: Callable[[str, str], str] | None = None):
        self.store = store
        # How the delivery log and log lines name a lease, from (pubkey, d): the dashboard's
        # fingerprint (`lease:1a2b3c4d5e`) when the executor gives its key.
        self.lease_ref = lease_ref or wakes.redact_lease
        self.transport_for = transport_for
        self.authorize = authorize
        self.settings = settings
        self.clock = clock
        self.monotonic = monotonic
        self._clocks: tuple[float, float] | None = None  # (wall, monotonic) at the last cycle
        self._wakeup = asyncio.Event()
        self._inflight: set[asyncio.Task] = set()
        self._queue: asyncio.Queue = asyncio.Queue()
        # Wakes claimed for the workers whose outcome is not recorded yet (queued or being sent),
        # by job id: a graceful stop gives their claims back (`close`).
        self._held: dict[str, Wake] = {}
        self._running = False  # workers are taking wakes (the fast path is open)
        self._stopping = False
        self._busy = 0
        self._outcomes: list | None = None
        self._recorded: asyncio.Future | None = None
        self._flushing = False  # a batch of outcomes is with the writer (the next one waits for it)
        self._recording = 0  # outcomes sent to the writer and not yet committed
        self.stats = {"sent": 0, "accepted": 0, "failed": 0, "dropped": 0}
        # Called when a provider answered an attempt, with (origin id, outcome kind, seconds since
        # the wake's job was written, that is since its event was accepted): the metrics' histogram.
        self.on_answered: list[Callable[[int, str, float], None]] = []
        # Failures that repeat each cycle while they last (a full disk): once, then once a minute.
        self._cycle_faults = FaultLog(log, "wake delivery cycle", clock=monotonic)
        self._record_faults = FaultLog(log, "recording wake outcomes", clock=monotonic)

    def _lease(self, job) -> str:
        return self.lease_ref(job.lease_pubkey, job.lease_d)

    def nudge(self) -> None:
        """New wakes may be due (called after the commit that wrote them)."""
        self._wakeup.set()

    # -- the fast path: wakes claimed in the event's own transaction --------------------------------

    def has_room(self) -> bool:
        """Whether a wake claimed at match time would find a worker soon (read from the writer
        thread: an estimate is enough; without room the wake waits as pending for the claimer)."""
        return self._running and self._queue.qsize() + self._busy < 4 * self.settings.workers

    def fresh_wake(self, job_id: str, origin: int, event_id: str, m, now: float) -> "Wake":
        """The Wake of a job `insert_job` just wrote as claimed (the match `m` gave its fields)."""
        job = WakeJob(job_id, origin, m.app_profile, m.transport, m.endpoint_hash, event_id, m.pubkey, m.d,
                      m.generation, m.cls, "claimed", None, now, now + self.settings.visibility,
                      now + self.settings.useful_age, 0, None, None)
        return Wake(job, m.endpoint, m.cls, 1, fresh=True, lease_until=m.expiration)

    def submit(self, fresh: list["Wake"]) -> None:
        """After the commit that wrote them: hand match-time claimed wakes to the workers."""
        for wake in fresh:
            self._enqueue(wake)

    def _enqueue(self, wake: "Wake") -> None:
        self._held[wake.job.id] = wake
        self._queue.put_nowait(wake)

    # -- the claim (a write transaction) -----------------------------------------------------------

    def _verdict(self, conn: Connection, job: WakeJob, lease: tuple | None, raw: str | None,
                 ev_expiration: int | None, now: float, parsed: dict | None = None) -> tuple[str | None, str | None]:
        """(None, lease row) if the job may still wake its endpoint, else (reason, None). `lease`
        (generation, active, expiration, invalidated_at, app_profile, transport, endpoint,
        endpoint_hash) and the event are the rows at the job's lease address and event id.
        `parsed`: events already parsed in this batch, by (origin, id) (one event wakes many)."""
        if lease is None:
            return "lease gone", None
        generation, active, expiration, invalidated_at, profile, transport, endpoint, endpoint_hash = lease
        if generation != job.generation:
            return "lease replaced by a newer generation", None
        if not active:
            return "lease revoked", None
        if expiration <= now:
            return "lease expired", None
        if invalidated_at is not None:
            return "endpoint generation invalidated", None
        if (profile, transport, endpoint_hash) != (job.app_profile, job.transport, job.endpoint_hash):
            return "lease endpoint changed", None
        ev = None
        if raw is not None and (ev_expiration is None or ev_expiration > now):
            key = (job.origin, job.event_id)
            if parsed is not None and key in parsed:
                ev = parsed[key]
            else:
                try:
                    ev = parse_event(orjson.loads(raw))
                except (InvalidEvent, ValueError):
                    ev = None
                if parsed is not None:
                    parsed[key] = ev
        # One reason for both, as the spec asks: the check must not tell whether the event exists.
        if ev is None or not self.authorize(conn, job.origin, job.lease_pubkey, ev):
            return "event not readable by the lease author", None
        return None, lease

    def claim(self, conn: Connection, now: float, limit: int) -> list[Wake]:
        out: list[Wake] = []
        due = wakes.due_wakes_checked(conn, now, limit)
        members = wakes.members_checked(conn, [job.id for job, *_ in due])
        claims: list[WakeJob] = []
        alive: list[str] = []
        parsed: dict = {}  # the batch's events, parsed once each
        for job, lease, raw, ev_expiration in due:
            if job.state == "claimed" and job.id in self._held:
                # Its claim lapsed while it waited for a worker or for APNs, but this process
                # still holds it (the timeout is for crashed processes): extend it, send once.
                alive.append(job.id)
                continue
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
            for member, m_lease, m_raw, m_exp in [(job, lease, raw, ev_expiration)] + members.get(job.id, []):
                reason, row = self._verdict(conn, member, m_lease, m_raw, m_exp, now, parsed)
                if reason is None:
                    passing.append(member)
                    endpoint = endpoint or row[6]  # (generation, active, expiration, ..., endpoint, hash)
                    until = max(until, row[2])
                elif member is job:
                    own_reason = reason
                else:
                    wakes.set_state(conn, member.id, "dropped", now, reason)
                    self.stats["dropped"] += 1
            if not passing:
                wakes.set_state(conn, job.id, "dropped", now, own_reason)
                self.stats["dropped"] += 1
                continue
            # The wake keeps this job's id (its apns-id) even when only jobs coalesced into it remain;
            # its class is the highest among the matches that pass now (each job keeps its own).
            cls = max((m.cls for m in passing), key=CLASS_RANK.__getitem__)
            claims.append(job)
            out.append(Wake(job, endpoint, cls, job.attempts + 1, lease_until=until))
        if claims:
            wakes.claim_wakes(conn, claims, now, self.settings.visibility)
        if alive:
            wakes.extend_claims(conn, alive, now + self.settings.visibility)
        return out

    # -- the outcome (a write transaction) ---------------------------------------------------------

    def record(self, conn: Connection, wake: Wake, outcome: Outcome, latency_ms: float | None,
               now: float) -> None:
        job, s = wake.job, self.settings
        wakes.log_attempt(conn, job, at=now, cls=wake.cls, attempt=wake.attempt, outcome=outcome.kind,
                          status=outcome.status, reason=outcome.reason, latency_ms=latency_ms,
                          detail=outcome.detail, lease=self._lease(job))
        kind = outcome.kind
        if kind not in (CONFIGURATION, REFRESH_RETRY):
            wakes.count_attempt(conn, job.id)
        what = f"{outcome.status or '-'} {outcome.reason or ''}".strip() + (f": {outcome.detail}" if outcome.detail
                                                                             else "")
        note_health(conn, job.origin, job.app_profile, outcome, now)
        if kind == ACCEPTED:
            wakes.set_state(conn, job.id, "delivered", now)
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
                     self._lease(job), job.app_profile, outcome.reason)
            return
        if kind in (CONFIGURATION, REFRESH_RETRY):
            # The operator's to fix (note_health raised the alert): touch no endpoint, keep the job
            # for later. Not an attempt against the job's budget (the endpoint was not at fault).
            due = now + CONFIGURATION_RETRY
            if due >= job.expires_at:
                wakes.set_state(conn, job.id, "dead", now, f"configuration fault: {what}")
            else:
                wakes.reschedule(conn, job.id, due, f"configuration fault: {what}")
            return
        if kind == TRANSIENT:
            # Never sooner than the per-endpoint rate cap either: a retry is a request to the device too.
            delay = max(outcome.retry_after or 0.0, backoff(wake.attempt, s.retry_delay), s.min_interval)
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

    def record_many(self, conn: Connection, items: list[tuple[Wake, Outcome, float | None]], now: float) -> None:
        """`record` for each (wake, outcome, latency_ms) in order; runs of accepted attempts are
        written together (the same rows, a statement per step for the run)."""
        run: list = []
        for wake, outcome, latency in items:
            if outcome.kind == ACCEPTED:
                run.append((wake.job, wake.cls, wake.attempt, outcome.status, outcome.reason, latency,
                            outcome.detail))
                continue
            if run:
                wakes.record_delivered(conn, run, now, self._lease)
                run = []
            self.record(conn, wake, outcome, latency, now)
        if run:
            wakes.record_delivered(conn, run, now, self._lease)

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
            return Outcome(TRANSIENT, detail="the transport failed unexpectedly (the log has the details)")

    async def _attempt(self, wake: Wake) -> tuple[Outcome, float]:
        t0 = time.perf_counter()
        outcome = await self._send(wake)
        latency = (time.perf_counter() - t0) * 1000
        self.stats["sent"] += 1
        self.stats["accepted" if outcome.kind == ACCEPTED else "failed"] += 1
        if outcome.status is not None and self.on_answered:
            job = wake.job
            waited = max(0.0, self.clock() - job.created_at)
            for observe in self.on_answered:
                observe(job.origin, outcome.kind, waited)
        return outcome, latency

    async def deliver(self, wake: Wake) -> Outcome:
        """Send one claimed wake and record the outcome (returns once it is committed)."""
        outcome, latency = await self._attempt(wake)
        await asyncio.shield(self._record_soon(wake, outcome, latency))
        return outcome

    def _record_soon(self, wake: Wake, outcome: Outcome, latency: float) -> asyncio.Future:
        """Queue the outcome for the next write; outcomes that arrive together, or while the
        previous batch is with the writer, are recorded in one transaction. The future resolves
        once it is committed; until then the wake stays held (a stop gives its claim back; a record
        that committed first wins)."""
        if self._outcomes is None:
            loop = asyncio.get_running_loop()
            self._outcomes = []
            self._recorded = loop.create_future()
            if not self._flushing:
                loop.call_soon(self._flush_outcomes)
        self._outcomes.append((wake, outcome, latency))
        self._recording += 1
        return self._recorded

    def _flush_outcomes(self) -> None:
        if self._flushing or self._outcomes is None:
            return
        batch, done = self._outcomes, self._recorded
        self._outcomes = self._recorded = None
        self._flushing = True

        def op(conn):
            self.record_many(conn, batch, self.clock())

        def finished(fut: asyncio.Future) -> None:
            self._flushing = False
            if self._outcomes is not None:  # arrived meanwhile: their turn
                asyncio.get_running_loop().call_soon(self._flush_outcomes)
            self._recording -= len(batch)
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:  # their claims lapse and they are tried again (same job ids)
                self._record_faults.failed(exc, note=f"{len(batch)} wake outcome(s)")
            elif not fut.cancelled():
                self._record_faults.recovered()
            for wake, _outcome, _latency in batch:
                if self._held.get(wake.job.id) is wake:
                    del self._held[wake.job.id]
            self._wakeup.set()
            if done.done():
                return
            if fut.cancelled():
                done.cancel()
            elif exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(None)
            if not done.cancelled() and exc is not None:
                done.exception()  # retrieved: a worker that moved on does not wait for it

        try:
            self.store.write(op).add_done_callback(finished)
        except BaseException:
            self._flushing = False
            raise

    async def run_once(self) -> int:
        """Claim every due wake and deliver them all (tests drive the workers with this)."""
        claimed = await self.store.write(lambda conn: self.claim(conn, self.clock(), 10_000))
        await asyncio.gather(*(self.deliver(w) for w in claimed))
        return len(claimed)

    async def _recheck_before_send(self, wake: Wake) -> Wake | None:
        """The re-check right before an attempt, a read of committed state: for a wake claimed at
        match time (the claim is already written), and for one that waited longer than
        RECHECK_AFTER for a worker since the claim re-checked it. The jobs that fail it are dropped;
        None if none passes, else the wake with the class, endpoint and lease end of those that do."""
        now = self.clock()

        def read(conn):
            checked = wakes.job_checked(conn, wake.job.id)
            if checked is None:
                return [(wake.job, "job gone", None)]
            items = [checked] + ([] if wake.fresh else wakes.members_checked(conn, [wake.job.id]).get(wake.job.id, []))
            return [(job, *self._verdict(conn, job, lease, raw, exp, now)) for job, lease, raw, exp in items]

        verdicts = await self.store.read(read)
        passing = [(job, row) for job, reason, row in verdicts if reason is None]
        # The wake keeps its job's id (its apns-id) even when only jobs coalesced into it pass.
        failed = [(job, reason) for job, reason, _row in verdicts
                  if reason is not None and not (passing and job.id == wake.job.id)]
        if failed:
            self.stats["dropped"] += len(failed)

            def drop(conn):
                for job, reason in failed:
                    wakes.set_state(conn, job.id, "dropped", self.clock(), reason)

            await self.store.write(drop)
        if not passing:
            return None
        cls = max((job.cls for job, _row in passing), key=CLASS_RANK.__getitem__)
        return replace(wake, cls=cls, endpoint=passing[0][1][6], lease_until=max(row[2] for _job, row in passing),
                       checked_at=time.monotonic())

    async def _worker(self) -> None:
        """One delivery worker: take a claimed wake, send it, record the outcome; forever."""
        while True:
            wake = await self._queue.get()
            if self._stopping:  # a graceful stop releases it instead
                self._queue.put_nowait(wake)
                return
            self._busy += 1
            recording = False
            send: Wake | None = wake
            try:
                if wake.fresh or time.monotonic() - wake.checked_at > RECHECK_AFTER:
                    send = await self._recheck_before_send(wake)
                    if send is not None and self._held.get(wake.job.id) is wake:
                        self._held[wake.job.id] = send  # held as what is sent (recorded as such)
                if send is not None:
                    # The worker moves on once the answer is in: the outcome is recorded with
                    # the others that arrive meanwhile (the wake stays held until it is).
                    outcome, latency = await self._attempt(send)
                    self._record_soon(send, outcome, latency)
                    recording = True
            except asyncio.CancelledError:
                raise
            except Exception:  # its claim lapses and the wake is tried again: log, keep working
                log.exception("wake delivery failed for job %s", wake.job.id)
            finally:
                self._busy -= 1
                self._wakeup.set()  # room to claim more
            held = self._held.get(wake.job.id)
            if not recording and held is not None and (held is wake or held is send):
                del self._held[wake.job.id]  # (not when cancelled mid-send: close() gives it back)

    async def run(self) -> None:
        """The claimer and `workers` delivery workers. The claimer claims ahead of the workers (up
        to CLAIM_AHEAD times their number, in batches), so no commit stands between one send and
        the next."""
        n = self.settings.workers
        workers = [asyncio.create_task(self._worker()) for _ in range(n)]
        self._running = True
        self._inflight.update(workers)
        try:
            while True:
                try:
                    await self._cycle(n)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # A full disk fails every cycle's claim: its cause is enough. Anything else
                    # is a bug: its traceback. Either way once, then once a minute (FaultLog).
                    self._cycle_faults.failed(exc, traceback=not isinstance(exc, StorageFull))
                    await asyncio.sleep(1.0)
                else:
                    self._cycle_faults.recovered()
        finally:
            self._running = False
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self._inflight.difference_update(workers)

    async def _follow_clock(self) -> None:
        """Due times are wall-clock times (they outlive the process). When the wall clock steps
        back (NTP, an operator), every waiting wake would wait that much longer: move them closer
        by the step. A step forward needs nothing: waits end early, claims lapse early (the same
        wake may go twice, with the same apns-id; spec note W11)."""
        wall, mono = self.clock(), self.monotonic()
        last, self._clocks = self._clocks, (wall, mono)
        if last is None:
            return
        back = (mono - last[1]) - (wall - last[0])
        if back > CLOCK_STEP_TOLERANCE:
            moved = await self.store.write(lambda conn: wakes.shift_due(conn, back, wall))
            log.warning("the wall clock went back %.0f s: %d waiting wakes brought forward as much", back, moved)

    async def _cycle(self, n: int) -> None:
        self._wakeup.clear()
        await self._follow_clock()
        queued = self._queue.qsize()
        room = CLAIM_AHEAD * n - queued - self._busy
        timeout = IDLE_POLL
        # Claim in batches (twice the workers at least) unless the workers are starving.
        if room >= CLAIM_AHEAD * n // 2 or (room > 0 and queued == 0):
            claimed = await self.store.write(lambda conn: self.claim(conn, self.clock(), room))
            for wake in claimed:
                self._enqueue(wake)
            if len(claimed) == room:
                return  # there may be more due: claim again once the workers made room
            nxt = await self.store.read(wakes.next_due)
            if nxt is not None:
                timeout = min(IDLE_POLL, max(0.0, nxt - self.clock()))
        if timeout > 0:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    async def stop(self, grace: float = 2.0) -> None:
        """Graceful stop: no new attempts; those under way get `grace` seconds to finish and be
        recorded; wakes claimed but not yet sent are released (pending, due now)."""
        self._stopping = True
        self._running = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while (self._busy or self._recording) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        queued: list[Wake] = []
        while not self._queue.empty():
            queued.append(self._queue.get_nowait())
        if queued:
            ids = [w.job.id for w in queued]
            for job_id in ids:
                self._held.pop(job_id, None)
            try:
                await self.store.write(lambda conn: wakes.release(conn, ids, self.clock()))
            except Exception:  # their claims lapse instead
                log.exception("releasing %d claimed wakes failed", len(ids))

    async def close(self) -> None:
        """Stop sending: in-flight attempts are abandoned and the claims of every wake not sent
        yet (queued or in flight) are given back, due at once, so the next start sends them first
        (the same job ids) instead of waiting for the claims to lapse (`wake_visibility_timeout`).
        A send whose outcome was recorded meanwhile keeps it."""
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        abandoned, self._held = list(self._held), {}
        if abandoned:
            now = self.clock()
            try:
                released = await self.store.write(lambda conn: wakes.release(conn, abandoned, now))
                log.info("released %d claimed wake(s) for the next start", released)
            except Exception:  # they lapse instead: sent after wake_visibility_timeout
                log.exception("releasing claimed wakes failed")
