"""The relay: accepts events into the store, answers queries, fans new events out to live subscriptions.

The relay is a set of hook lists around one store (khatru's shape): other parts of the appliance
plug in from `app.py` without the relay importing them.

- `admission[kind]`: an async callable `(origin, authed_pubkey, event, verify) -> context` that
  replaces the generic "verify the signature" step for that kind, so a kind with its own ordered
  acceptance rules (NIP-PL leases: authentication before signature) decides its first failure. It
  raises `Rejected`; the context dict it returns reaches the store's in-transaction hooks.
- `store_hooks`: checks and "event stored" hooks run inside the writer transaction (see
  `appliance.store.events.WriteHooks`).
- `ephemeral_checks`: `(origin, event) -> None` callables that may raise `Rejected` for an
  ephemeral event, which never reaches the store and so never meets its in-transaction checks
  (groups: only members may post into a group, stored or not).
- `on_stored`: async callbacks after commit, with (origin, event).
- `on_ephemeral`: `(origin, event) -> None` callables after an ephemeral event was broadcast here
  (other nodes replay it: appliance.relay.nodes).
- `on_req_answered`: `(origin, seconds) -> None` callables once a REQ's stored answer and its EOSE
  are queued for its connection, with the time since the REQ was taken (the metrics' histogram).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Generator

from appliance.errors import Rejected
from appliance.nostr.event import Event, InvalidEvent, expiration as event_expiration, is_ephemeral, verify_event
from appliance.nostr.filters import Filter
from appliance.relay.authz import GroupView, NoGroups, can_read, read_scope
from appliance.origins import Origin, OriginRegistry, UnknownOrigin
from appliance.relay.limits import ClientBudgets
from appliance.relay.peers import PeerLimits
from appliance.relay.subscriptions import SubscriptionIndex
from appliance.settings import Settings
from appliance.relay.marmot import MARMOT_KINDS, check_marmot_event
from appliance.relay.sigcheck import PendingCheck, SignatureWorker
from appliance.store.events import PendingEvent, WriteHooks, batchable, count_events, query_events, query_rows
from appliance.store.interface import Store
from appliance.store.readpool import trim_heap

log = logging.getLogger("appliance.relay")

AUTH_KIND = 22242
# REQs whose filters ask for at most this many events in all may be answered on the event loop's
# thread (see appliance.store.sqlite.INLINE_MAX_STEPS): building a larger answer there would hold
# every other connection up.
INLINE_MAX_EVENTS = 100

# A large answer's rows are handed back to the OS once freed (see `read` in Relay.start_query).
TRIM_AFTER_BYTES = 1024 * 1024

# What `start_query` answers when it read nothing, its connection having too much unread.
HELD = object()

# Reads that used less CPU than this are not reported to their `cost` callback (most REQs: a
# callback per read would cost more than it tells).
COST_REPORT_SECONDS = 0.002

Admission = Callable[[Origin, "str | None", Event, Callable[[Event], Awaitable[bool]]], Awaitable[dict]]
StoredCallback = Callable[[Origin, Event], Awaitable[None]]
EphemeralCheck = Callable[[Origin, Event], None]


class Verifier:
    """Checks event ids and BIP-340 signatures: the signatures in a worker process once `start`
    has been called (appliance.relay.sigcheck), else on the loop.

    `begin(ev)` answers True/False when the answer is known at once, else a `PendingCheck`
    settled on the loop; answers come in the order the checks were begun.
    """

    def __init__(self) -> None:
        self.worker = SignatureWorker()

    def start(self) -> None:
        """On the loop, as the server starts: the worker process starts with the first check."""
        self.worker.start()

    def begin(self, ev: Event) -> "bool | PendingCheck":
        return self.worker.begin(ev)

    async def verify(self, ev: Event) -> bool:
        valid = self.worker.begin(ev)
        return valid if type(valid) is bool else await valid

    def close(self) -> None:
        self.worker.close()


@dataclass
class Relay:
    """Everything the websocket sessions share."""

    settings: Settings
    store: Store
    origins: OriginRegistry
    groups: GroupView = field(default_factory=NoGroups)
    admission: dict[int, Admission] = field(default_factory=dict)
    store_hooks: WriteHooks = field(default_factory=WriteHooks)
    on_stored: list[StoredCallback] = field(default_factory=list)
    ephemeral_checks: list[EphemeralCheck] = field(default_factory=list)
    on_ephemeral: list[EphemeralCheck] = field(default_factory=list)
    # Client addresses: which are exempt from per-address limits, and the flood backoff.
    peers: PeerLimits = field(default_factory=lambda: PeerLimits(0))

    def __post_init__(self) -> None:
        self.verifier = Verifier()
        self.budgets = ClientBudgets(self.settings)  # per client address, shared by its connections
        self.indexes: dict[int, SubscriptionIndex] = {}
        self.sessions: set = set()
        self.queued_bytes = 0  # unsent output of all connections (appliance.relay.output)
        self.outputs: set = set()  # their Outputs, while they hold any
        self.max_output_total = self.settings.max_output_buffer_total
        self.output_peak = 0  # the most unsent output there has been at once (metrics, tests)
        # Answers being built on reader threads, at twice what each may send (its rows and their
        # frames): they count toward max_output_buffer_total too (see `reserve_read`).
        self.reserved_bytes = 0
        self._reserve_lock = threading.Lock()
        # Reads held for room (their reserve, what starts them again), by the connection they
        # answer (its Output), each connection's in order (see `_wake_reads`).
        self.read_waiters: dict[object, deque[tuple[int, Callable[[], None]]]] = {}
        self._waking = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = {"accepted": 0, "rejected": 0, "duplicate": 0, "broadcast": 0}
        # Ids of events being written and not yet broadcast (a count per id). A reader can see such
        # an event committed before its publisher has broadcast it: a REQ answered meanwhile notes
        # it (Subscription.skip), so the broadcast does not send it to that REQ a second time.
        self.unbroadcast: dict[str, int] = {}
        self.stopping = False  # set by shutdown: new EVENT/REQ/COUNT are refused
        # Other nodes over the same database replay their events here (appliance.relay.nodes).
        self.other_nodes = False
        # Called for every refused EVENT with (origin, event, refusal): counters, the dashboard.
        self.on_rejected: list[Callable[[Origin, Event, Rejected], None]] = []
        self.on_req_answered: list[Callable[[Origin, float], None]] = []

    def rejected(self, origin: Origin, ev: Event, exc: Rejected) -> None:
        self.stats["rejected"] += 1
        for listener in self.on_rejected:
            listener(origin, ev, exc)

    async def shutdown(self, grace: float) -> None:
        """Stop gracefully (SIGTERM): refuse new work, let every EVENT in flight commit and queue
        its OK, then close each connection with 1001 once its queued output is written, and wait
        (up to `grace` seconds in all) for the clients to complete the closing handshake."""
        self.stopping = True
        # A session paused between received messages (its rate limits, the others' turn) resumes
        # now and handles the rest of what it received without pausing again: its EVENTs are then
        # in flight (and waited for below) or refused, none left unanswered.
        for session in list(self.sessions):
            session.wake()
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        sessions = list(self.sessions)
        while any(s.inflight for s in sessions) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for session in sessions:
            session.drop(1001, "going away")
        while self.sessions and loop.time() < deadline:
            await asyncio.sleep(0.01)

    def read_reserve(self, filters: list[Filter]) -> int:
        """The room a REQ's answer takes while it is built: twice the most it may send (its rows
        and their frames)."""
        s = self.settings
        wanted = sum(min(f.limit if f.limit is not None else s.default_limit, s.max_limit) for f in filters)
        return 2 * min(s.max_query_bytes, wanted * s.max_message_length)

    def has_room(self, n: int) -> bool:
        """Whether `reserve_read(n)` would succeed now (on the loop: a hint, the reader decides)."""
        return not self.reserved_bytes or self.queued_bytes + self.reserved_bytes + n <= self.max_output_total

    def wait_for_room(self, n: int, start: Callable[[], None], output: object) -> None:
        """A read of `n` reserved bytes for `output`'s connection found no room: `start()` once
        there is (see `_wake_reads`)."""
        waiters = self.read_waiters
        queue = waiters.get(output)
        if queue is None:
            queue = waiters[output] = deque()
        queue.append((n, start))
        # (Room may have been made between the reader's refusal and now: nothing else would say so.)
        self.room_made()

    def forget_waiters(self, output: object) -> None:
        """`output`'s connection is cut: its reads held for room are not started."""
        self.read_waiters.pop(output, None)

    def reserve_read(self, n: int) -> bool:
        """On a reader thread, before an answer of up to n bytes is built: whether there is room
        for it under max_output_buffer_total, with the unread output and the answers being built;
        reserved if so (`release_read` after). One read at a time always may: the budget slows
        the relay's reading down, it never stops it (what it answers then is shed)."""
        with self._reserve_lock:
            if self.reserved_bytes and self.queued_bytes + self.reserved_bytes + n > self.max_output_total:
                return False
            self.reserved_bytes += n
            return True

    def release_read(self, n: int) -> None:
        """Part or all of what `reserve_read` reserved is free again (on any thread): an answer's
        rows were freed, or the loop queued it, or it was not wanted."""
        with self._reserve_lock:
            self.reserved_bytes -= n
        if self.read_waiters:
            self.room_made(threadsafe=True)

    def room_made(self, threadsafe: bool = False) -> None:
        """Unread output shrank or a reservation ended: the reads held for room start again, as
        many as fit. (From another thread, the loop checks the room.)"""
        waiters = self.read_waiters
        if self._waking or not waiters or self._loop is None:
            return
        if not threadsafe and not self.has_room(waiters[self._next_waiting(waiters)][0][0]):
            return
        self._waking = True
        try:
            if threadsafe:
                self._loop.call_soon_threadsafe(self._wake_reads)
            else:
                self._loop.call_soon(self._wake_reads)
        except RuntimeError:  # the loop is closed: the server has stopped
            self._waking = False

    @staticmethod
    def _next_waiting(waiters: dict) -> object:
        """The connection whose held read starts next: the one with the least unread output (a
        client that reads what it is sent is not kept waiting behind those that do not), the
        longest waiting of those."""
        return min(waiters, key=_unread)

    def _wake_reads(self) -> None:
        """Start the reads held for room, as many as fit: the connections with the least unread
        output first, in turns among equals (one read each, then to the back)."""
        self._waking = False
        waiters = self.read_waiters
        planned = 0
        while waiters:
            output = self._next_waiting(waiters)
            queue = waiters[output]
            n, start = queue[0]
            if not self.has_room(planned + n):
                break
            queue.popleft()
            del waiters[output]
            if queue:
                waiters[output] = queue  # to the back of those with as little unread
            planned += n
            try:
                start()
            except Exception:  # one connection's failure holds up no other's reads
                planned -= n  # (nor does the room it would have taken)
                log.exception("a read held for room failed to start")

    def shed_output(self, incoming: int, output) -> None:
        """`incoming` more bytes for `output` would take the unsent output of all connections past
        max_output_buffer_total: the connections with the most unread output are dropped, largest
        first, until it fits (`output`'s own among them if it is one of the largest)."""
        limit = self.max_output_total
        for other in sorted(self.outputs, key=lambda o: o.queued_bytes + (incoming if o is output else 0),
                            reverse=True):
            if self.queued_bytes + incoming <= limit:
                break
            if other is output:
                incoming = 0  # (its message is not queued: it is dropped)
            other.shed()

    def index_for(self, origin: Origin) -> SubscriptionIndex:
        idx = self.indexes.get(origin.id)
        if idx is None:
            idx = self.indexes[origin.id] = SubscriptionIndex()
        return idx

    def close(self) -> None:
        self.verifier.close()

    def origins_changed(self) -> None:
        """After the operator edited origins: open connections follow their origin's new rules."""
        for session in list(self.sessions):
            try:
                origin = self.origins.by_id(session.origin.id)
            except UnknownOrigin:
                origin = None
            session.origin_changed(origin)

    # -- writing --------------------------------------------------------------------------------

    def check_envelope(self, ev: Event, now: int) -> None:
        """Limits that need no signature check: tags, content size, created_at bounds."""
        s = self.settings
        if len(ev.tags) > s.max_event_tags:
            raise Rejected("invalid", f"too many tags (max {s.max_event_tags})")
        # A str of n characters is at most 4n UTF-8 bytes: only long contents need encoding.
        if len(ev.content) * 4 > s.max_content_length and len(ev.content.encode()) > s.max_content_length:
            raise Rejected("invalid", f"content too long (max {s.max_content_length} bytes)")
        if s.created_at_future and ev.created_at > now + s.created_at_future:
            raise Rejected("invalid", "created_at is too far in the future")
        if s.created_at_past and ev.created_at < now - s.created_at_past:
            raise Rejected("invalid", "created_at is too far in the past")
        if ev.kind == AUTH_KIND:
            raise Rejected("invalid", "AUTH events are sent in AUTH messages, not stored")
        if ev.kind in MARMOT_KINDS:
            check_marmot_event(ev)

    def check_write_access(self, origin: Origin, authed: str | None, ev: Event) -> None:
        """Origin policy for writers (groups add their own checks in the store transaction)."""
        if ev.pubkey in origin.block or (authed is not None and authed in origin.block):
            raise Rejected("blocked", "this pubkey is blocked here")
        if ev.id in origin.ban_events:
            raise Rejected("blocked", "this event is banned here")
        if ev.kind in origin.block_kinds or (origin.allow_kinds and ev.kind not in origin.allow_kinds):
            raise Rejected("blocked", f"kind {ev.kind} is not accepted here")
        if origin.auth_required and authed is None:
            raise Rejected("auth-required", "authenticate to publish here")
        if origin.access_policy == "members":
            if authed not in origin.allow:
                raise Rejected("restricted", "only members may publish here")
            if ev.pubkey not in origin.allow:
                raise Rejected("restricted", "the event author is not a member")
        elif origin.allow and ev.pubkey not in origin.allow:
            raise Rejected("restricted", "this pubkey may not publish here")

    def needs_task(self, ev: Event) -> bool:
        """Whether publishing `ev` awaits something: an admission hook of its kind, or `on_stored`
        callbacks. Such an event is taken by `publish`."""
        return ev.kind in self.admission or bool(self.on_stored)

    async def publish(self, origin: Origin, authed: str | None, ev: Event) -> str:
        """Admit, store and fan out one event; return the OK message or raise Rejected (counted)
        or the error that stopped it. The steps are `_pipeline`'s, awaited where they must be."""
        answer = asyncio.get_running_loop().create_future()

        def done(message: str | None, exc: Exception | None) -> None:
            if answer.cancelled():  # the caller is gone (its task cancelled)
                return
            if exc is None:
                answer.set_result(message)
            else:
                answer.set_exception(exc)

        steps = self._pipeline(origin, authed, ev, done)
        value: object = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    step = steps.send(value) if error is None else steps.throw(error)
                except StopIteration as stop:
                    stored = stop.value
                    break
                try:
                    value, error = await step, None
                except Exception as exc:  # the pipeline decides what it means
                    value, error = None, exc
        finally:
            steps.close()
        message = await answer
        if stored:
            for callback in self.on_stored:
                try:
                    await callback(origin, ev)
                except Exception:  # a listener's failure must not turn an accepted event into an error
                    log.exception("on_stored callback failed for event %s", ev.id)
        return message

    def publish_then(self, origin: Origin, authed: str | None, ev: Event,
                     done: Callable[[str | None, Exception | None], None]) -> bool:
        """`publish` with no task and no future, for events that need nothing awaited (see
        `needs_task`): the same pipeline, then `done(message, None)` once committed and broadcast,
        or `done(None, exc)` (a refusal counted, as `publish` raises it). A signature checked in
        the worker process resumes the pipeline from its answer, still with no task. Called on the
        loop; `done` runs on it, possibly before this returns. False (and nothing done) for any
        other event: the caller awaits `publish`."""
        if self.needs_task(ev):
            return False
        self._step(self._pipeline(origin, authed, ev, done), None)
        return True

    def _step(self, steps: Generator, value: object) -> None:
        """Run the pipeline `steps` on to its end or to a signature check whose answer comes later
        (`PendingCheck.then` runs it on from there)."""
        try:
            step = steps.send(value)
        except StopIteration:
            return
        if type(step) is not PendingCheck:
            steps.close()  # a step to await: `needs_task` says there is none
            raise RuntimeError("publish_then cannot await a step")
        step.then(lambda valid: self._step(steps, valid))

    def _pipeline(self, origin: Origin, authed: str | None, ev: Event,
                  done: Callable[[str | None, Exception | None], None]) -> Generator[Awaitable, object, bool]:
        """The one way an event is published, its checks in their one order: the admission hook of
        its kind first if it has one (NIP-PL: authentication, then the signature, ...) and the
        relay-wide limits and policies after it, else the limits, the policies and the signature;
        then its expiration; then broadcast (ephemeral) or the write, its commit and broadcast.

        A generator: it yields an awaitable where a step must be awaited (an admission hook, a
        signature check answered later: a PendingCheck) and is sent its result (or thrown its exception). It calls
        `done(message, None)` once the event is committed and broadcast, or `done(None, exc)` for a
        refusal (counted) or an unexpected error: exactly once, whatever fails after its checks (a
        client without its OK would hold one of its connection's in-flight places for good), unless
        it is closed while awaiting. Returns whether the event went to the store."""
        now = int(time.time())
        try:
            admit = self.admission.get(ev.kind)
            if admit is not None:
                context = yield admit(origin, authed, ev, self.verifier.verify)
                self.check_envelope(ev, now)
                self.check_write_access(origin, authed, ev)
            else:
                self.check_envelope(ev, now)
                self.check_write_access(origin, authed, ev)
                valid = self.verifier.begin(ev)
                if type(valid) is not bool:  # checked elsewhere: its answer comes on the loop
                    valid = yield valid
                if not valid:
                    raise Rejected("invalid", "bad signature")
                context = {}
            expiration = self._expiration(ev, now)
            ephemeral = is_ephemeral(ev.kind)
            if ephemeral:
                self._ephemeral(origin, ev)
            else:
                raw = ev.to_json()
                pending = self._pending(origin, ev, raw, expiration, now, context)
        except Rejected as exc:
            try:
                self.rejected(origin, ev, exc)
            except Exception as failed:  # a listener failing: an error answer
                exc = failed
            done(None, exc)
            return False
        except Exception as exc:  # a failing hook: an error answer
            done(None, exc)
            return False
        if ephemeral:
            done("", None)
            return False

        def committed(result, exc: BaseException | None) -> None:  # on the loop, after the commit
            message = None
            try:
                try:
                    if exc is None:
                        self._committed(origin, ev, raw, result)
                except Exception as failed:
                    exc = failed
                finally:
                    self._broadcast_done(ev.id)
                if exc is None:
                    for extra in result.extra.get("broadcast", ()):
                        self.broadcast(origin, extra, extra.to_json())
                    message = result.message
                elif isinstance(exc, Rejected):
                    self.rejected(origin, ev, exc)
            except Exception as failed:  # a listener or a broadcast failing: an error answer
                exc = failed
            if exc is None:
                done(message, None)
            else:
                done(None, exc)

        try:
            self.store.write_then(pending if batchable(ev, self.store_hooks) else pending.__call__, committed)
        except Exception as exc:  # the store is closed
            self._broadcast_done(ev.id)
            done(None, exc)
            return False
        return True

    @staticmethod
    def _expiration(ev: Event, now: int) -> int | None:
        """NIP-40: the event's expiration, refused when malformed or already past."""
        try:
            expiration = event_expiration(ev)
        except InvalidEvent as exc:
            raise Rejected("invalid", exc.reason) from None
        if expiration is not None and expiration <= now:
            raise Rejected("invalid", "event has expired")
        return expiration

    def _ephemeral(self, origin: Origin, ev: Event) -> None:
        """An ephemeral event admitted: checked, broadcast, announced; never stored."""
        for check in self.ephemeral_checks:
            check(origin, ev)
        self.broadcast(origin, ev, ev.to_json())
        for announce in self.on_ephemeral:
            announce(origin, ev)

    def _pending(self, origin: Origin, ev: Event, raw: str, expiration: int | None, now: int,
                 context: dict) -> PendingEvent:
        """The write of an admitted event; its id counts as not broadcast yet until
        `_broadcast_done` (see `unbroadcast`)."""
        pending = PendingEvent(origin.id, ev, raw, expiration, now, self.store_hooks, context)
        unbroadcast = self.unbroadcast
        unbroadcast[ev.id] = unbroadcast.get(ev.id, 0) + 1
        return pending

    def _committed(self, origin: Origin, ev: Event, raw: str, result) -> None:
        """Committed: in-memory state changes applied before anything else is broadcast."""
        self.stats["accepted"] += 1
        for apply in result.extra.get("after_commit", ()):
            apply()
        self.broadcast(origin, ev, raw)

    def _broadcast_done(self, event_id: str) -> None:
        unbroadcast = self.unbroadcast
        left = unbroadcast.pop(event_id) - 1
        if left:
            unbroadcast[event_id] = left

    def broadcast(self, origin: Origin, ev: Event, raw: str) -> None:
        """Send `ev` to every live subscription at `origin` whose owner may read it."""
        idx = self.indexes.get(origin.id)
        if not idx:
            return
        readable: dict[str | None, bool] = {}
        for sub in idx.matching(ev):
            reader = sub.owner.reader
            ok = readable.get(reader)
            if ok is None:
                ok = readable[reader] = can_read(origin, reader, ev, self.groups)
            if ok:
                sub.owner.live_event(sub, ev.id, raw)
                self.stats["broadcast"] += 1

    # -- reading --------------------------------------------------------------------------------

    async def query(self, origin: Origin, reader: str | None, filters: list[Filter], owner: object = None) -> list[str]:
        """Stored events matching `filters` that `reader` may read; `owner` (the asking connection)
        shares the reader threads fairly with other connections."""
        scope = read_scope(origin, reader, self.groups)
        now = int(time.time())
        s = self.settings
        return await self.store.read(
            lambda conn: query_events(
                conn, origin.id, filters, scope, now, default_limit=s.default_limit, max_limit=s.max_limit,
                max_bytes=s.max_query_bytes,
            ),
            timeout=s.query_timeout,
            owner=owner,
        )

    def start_query(self, origin: Origin, reader: str | None, filters: list[Filter], *, owner: object,
                    render: Callable[[list], object], done: Callable[[object, BaseException | None], None],
                    raw_bytes: bool = False, cost: Callable[[float], None] | None = None,
                    hold: Callable[[], bool] | None = None):
        """The REQ path, with no task and no future: the stored events matching `filters` that
        `reader` may read, as (id, raw) rows, go to `render(rows)` on the reader thread (so a whole
        answer is built in one pass off the loop), and `done(rendered, exc)` runs on the loop.
        Returns a handle whose `cancel()` means the answer is not wanted. `cost(seconds)` is
        called on the loop with the CPU time the read took, when that was over
        COST_REPORT_SECONDS (also when the answer was no longer wanted). When `hold()` is true as
        the read comes to run (its connection has too much unread already), nothing is read and
        `done(HELD, None)` follows: the caller starts it again later."""
        scope = read_scope(origin, reader, self.groups)
        now = int(time.time())
        s = self.settings
        origin_id = origin.id

        wanted = sum(min(f.limit if f.limit is not None else s.default_limit, s.max_limit) for f in filters)
        reserve = self.read_reserve(filters)
        self._loop = asyncio.get_running_loop()

        def read(conn):
            if hold is not None and hold():
                return HELD
            if not self.reserve_read(reserve):
                return HELD
            claim = _Claim(self, reserve)
            try:
                answer = render(query_rows(conn, origin_id, filters, scope, now, default_limit=s.default_limit,
                                           max_limit=s.max_limit, max_bytes=s.max_query_bytes, raw_bytes=raw_bytes))
            except BaseException:
                claim.release()
                raise
            messages = answer[0] if type(answer) is tuple else None
            size = 0 if messages is None else len(messages) if type(messages) is not list else sum(map(len, messages))
            # The rows are freed: the answer keeps its own size under the budget until the loop
            # has queued it (`finished`), or until it is dropped unsent (`_Claim.__del__`).
            claim.shrink(size)
            if size > TRIM_AFTER_BYTES:
                # The rows of a large answer were freed on this thread: glibc keeps them in its
                # arena unless told to hand them back (rows of large events are not mapped alone).
                trim_heap()
            return _Claimed(answer, claim)

        def finished(result, exc: BaseException | None) -> None:
            if type(result) is not _Claimed:
                done(result, exc)
                return
            try:
                done(result.answer, exc)
            finally:
                result.claim.release()

        if cost is not None:
            read = _costed(read, cost)
        # A REQ asking for a few events may be answered on the loop's own thread (the store bounds
        # the SQL work; building the answer is bounded by this many events).
        return self.store.read_then(read, finished, timeout=s.query_timeout, owner=owner,
                                    inline=wanted <= INLINE_MAX_EVENTS)

    def start_count(self, origin: Origin, reader: str | None, filters: list[Filter], *, owner: object,
                    done: Callable[[object, BaseException | None], None],
                    cost: Callable[[float], None] | None = None):
        """NIP-45 COUNT as `start_query` answers a REQ, with no task and no future: how many stored
        events match `filters` that `reader` may read goes to `done(n, exc)` on the loop. Returns
        a handle whose `cancel()` means the answer is not wanted; `cost` as for `start_query`."""
        scope = read_scope(origin, reader, self.groups)
        now = int(time.time())
        origin_id = origin.id

        def read(conn):
            return count_events(conn, origin_id, filters, scope, now)

        return self.store.read_then(read if cost is None else _costed(read, cost), done,
                                    timeout=self.settings.query_timeout, owner=owner, inline=True)


def _unread(output) -> int:
    return output.queued_bytes


class _Claim:
    """The part of max_output_buffer_total a REQ's answer holds from when its read starts (twice
    what it may send: its rows and their frames) until its connection's output has taken it: an
    answer rendered on a reader thread and waiting for the loop is counted too. Released once, by
    `release` or when it is dropped (an answer no longer wanted is never handed to the loop)."""

    __slots__ = ("relay", "n")

    def __init__(self, relay: "Relay", n: int):
        self.relay, self.n = relay, n

    def shrink(self, n: int) -> None:
        """The answer now takes n bytes (its rows freed)."""
        if n < self.n:
            less, self.n = self.n - n, n
            self.relay.release_read(less)

    def release(self) -> None:
        n, self.n = self.n, 0
        if n:
            self.relay.release_read(n)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # (the interpreter shutting down)
            pass


class _Claimed:
    """A REQ's rendered answer and its claim on the budget, on their way to the loop."""

    __slots__ = ("answer", "claim")

    def __init__(self, answer: object, claim: _Claim):
        self.answer, self.claim = answer, claim


def _costed(fn: Callable, cost: Callable[[float], None]) -> Callable:
    """`fn` reporting the CPU time it took (its thread's: a read paused between time slices
    costs nothing while it waits) to `cost`, on the loop, when over COST_REPORT_SECONDS."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    clock = time.thread_time

    def run(conn):
        t0 = clock()
        try:
            return fn(conn)
        finally:
            spent = clock() - t0
            if spent > COST_REPORT_SECONDS:
                if threading.get_ident() == loop_thread:  # run inline, on the loop
                    loop.call_soon(cost, spent)
                else:
                    try:
                        loop.call_soon_threadsafe(cost, spent)
                    except RuntimeError:  # the loop is closed: the server has stopped
                        pass

    return run
