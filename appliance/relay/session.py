"""One websocket connection: its state, its receive loop and what every message meets.

The parts: `appliance.relay.output` queues and writes what is sent, `appliance.relay.governor`
holds the rate limits and decides when the connection is read again, and each verb (EVENT, REQ,
COUNT, CLOSE, AUTH) is a module of `appliance.relay.verbs`, routed through its `VERBS` table.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from typing import Callable

import orjson
from appliance.front.websocket import CLOSED, NOTHING
from appliance.origins import Origin
from appliance.relay.authz import may_enter
from appliance.front.frames import Frames
from appliance.relay.governor import REFUSED, WAIT, Governor
from appliance.relay.output import Output
from appliance.relay.peers import peer_ip
from appliance.relay.relay import Relay
from appliance.relay.subscriptions import Subscription
from appliance.relay.verbs import VERBS
from appliance.relay.verbs.base import dumps as _dumps
from appliance.relay.verbs.event import DEFAULT_MAX_INFLIGHT
from appliance.relay.verbs.req import DEFAULT_MAX_PENDING_COUNTS

log = logging.getLogger("appliance.relay")

# A reader this far behind (messages, or bytes: at least two full REQ answers) is dropped rather
# than buffered without bound (before that `Output.full` pauses its answers; Relay.shed_output
# bounds all connections together).
DEFAULT_MAX_QUEUED = 20_000
DEFAULT_MAX_QUEUED_BYTES = 32 * 1024 * 1024
# How long one connection's receive loop handles messages before it lets the event loop run others:
# a pipelining client's buffered messages would hold the loop until drained.
DEFAULT_RECEIVE_SLICE = 0.002

# The metered verbs (REQ, COUNT) as clients write them: their verb and subscription id can be read
# without parsing the filters, so a refused one costs no JSON parse (see `handle_text`).
_METERED = tuple(name for name, verb in VERBS.items() if verb.metered)
_METERED_PREFIXES = tuple(f'["{name}"' for name in _METERED)
_REQ_HEAD = re.compile(r'\s*\[\s*"(' + "|".join(map(re.escape, _METERED))
                       + r')"\s*,\s*"([^"\\]{1,64})"\s*[,\]]').match


class Session:
    """State of one client connection: its origin, authenticated pubkey, subscriptions."""

    def __init__(self, relay: Relay, request, origin: Origin):
        self.relay = relay
        # The handshake (appliance.front.WebSocketRequest): path, headers, client, server, scheme.
        self.request = request
        self.origin = origin
        self.settings = relay.settings
        self.reader: str | None = None  # the NIP-42 authenticated pubkey
        self.peer_ip = peer_ip(request)
        self.challenge = secrets.token_hex(16)
        self.subs: dict[str, Subscription] = {}
        # The stored-events query of each REQ still running, by subscription id (a handle with
        # `cancel()`): a CLOSE or a replacing REQ cancels it, and only the subscription it belongs
        # to may send its answer.
        self.queries: dict[str, object] = {}
        self.counts: set = set()  # COUNT queries waiting for their answer (handles with `cancel()`)
        self.held_bytes = 0  # live events held behind pending stored answers (see live_event)
        # REQs whose stored answer waits until the client reads what it was sent (`Output.full`):
        # callables that start them again.
        self.held_reads: list[Callable[[], None]] = []
        self.held_demand = 0  # the most bytes their answers may take
        self.conn = None  # the websocket connection, once accepted (see `serve`)
        self.writer = None  # (the same: what writes frames)
        self.output: Output | None = None
        self.max_queued_bytes = max(DEFAULT_MAX_QUEUED_BYTES, 2 * relay.settings.max_query_bytes)
        self.closed = False
        # EVENTs being verified or committed. At the cap, messages are taken no more: TCP
        # backpressure instead of an unbounded queue (or an O(n) semaphore per event).
        self.inflight = 0
        self.tasks: set[asyncio.Task] = set()
        # Called once when the connection ends (a verb's per-connection state let go).
        self.at_end: list[Callable[[], None]] = []
        self.negentropy = None  # its NIP-77 sessions (appliance.relay.verbs.negentropy), once it opens one
        self.governor = Governor(self, self.settings)
        self._deferred: str | None = None  # a REQ/COUNT held until its token comes (`req_token`)
        self._text = ""  # the message being handled
        self.received_at = 0.0  # when it was taken (monotonic; a REQ held for its token keeps its own)
        self._loop = asyncio.get_running_loop()
        self._pumping = False
        self._idle = True  # the last pump found nothing to take
        self._idle_since = 0.0  # since when
        self._timer: asyncio.Handle | None = None  # the pump's next turn (a pause, the others' turn)
        self._slice_end = 0.0
        self._finished = False
        self._blocked = False  # at an in-flight cap: `wake` resumes the pump
        self._ended: asyncio.Future | None = None

    def _lost(self) -> None:
        """A write failed: the connection is over."""
        self.closed = True
        if not self._pumping and self.conn is not None:
            self._finish()

    @property
    def queued_bytes(self) -> int:
        """Bytes queued for this connection and not written yet."""
        return self.output.queued_bytes

    # -- output ---------------------------------------------------------------------------------

    def send(self, text: str | Frames) -> None:
        """Queue one message (or a `Frames` of several, already framed) for the sender."""
        if self.closed:
            return
        output = self.output
        n = len(text)
        if len(output.pending) >= DEFAULT_MAX_QUEUED or output.queued_bytes + n > self.max_queued_bytes:
            self.drop_slow()
            return
        relay = self.relay
        if relay.queued_bytes + n > relay.max_output_total:
            relay.shed_output(n, output)  # the connections with the most unread output go first
            if self.closed:
                return
        output.enqueue(text)

    def drop_slow(self) -> None:
        """This connection does not read what it is sent: cut it, its unsent output dropped now
        (a close frame would wait behind everything queued)."""
        output = self.output
        log.info("dropping slow connection origin=%s queued=%d queued_bytes=%d", self.origin.origin,
                 len(output.pending), output.queued_bytes)
        if self.closed:  # already closing (its close frame behind its output): cut it now
            self.writer.abort()
            output.abandon()
            return
        self.drop(1008, "slow consumer", abort=True)

    def drop(self, code: int, reason: str, *, notice: str | None = None, abort: bool = False) -> None:
        """End this connection from the relay's side: nothing more is queued; what is queued (and
        `notice`) is sent, then a close frame, unless `abort` cuts the connection at once."""
        if self.closed:
            return
        if notice is not None:
            self.output.enqueue(_dumps(["NOTICE", notice]))
        self.closed = True
        self.output.end(code, reason)
        self.cancel_queries()
        if abort:
            self.writer.abort()
            self.output.abandon()
        if not self._pumping:
            self._finish()  # (else the pump does, once the message being handled is done)

    def notice(self, message: str) -> None:
        self.send(_dumps(["NOTICE", message]))

    def ok(self, event_id: str, accepted: bool, message: str) -> None:
        self.send(_dumps(["OK", event_id, accepted, message]))

    def closed_msg(self, sub_id: str, message: str) -> None:
        self.send(_dumps(["CLOSED", sub_id, message]))

    def send_event(self, sub_id: str, raw: str) -> None:
        self.send('["EVENT",' + _dumps(sub_id) + "," + raw + "]")

    def live_event(self, sub: Subscription, event_id: str, raw: str) -> None:
        """A new event matching `sub`: sent now, or held until its stored answer and EOSE are out
        (NIP-01: what precedes EOSE is the stored answer, newest first, within its limits)."""
        if sub.held is None:
            skip = sub.skip
            if skip is not None:
                if event_id in skip:
                    skip.discard(event_id)  # the stored answer carried it (see verbs.req)
                    if not skip:
                        sub.skip = None
                    return
                if sub.skip_until and time.monotonic() > sub.skip_until:
                    sub.skip = None
            self.send_event(sub.sub_id, raw)
            return
        self.held_bytes += len(raw)
        if len(sub.held) < DEFAULT_MAX_QUEUED and self.queued_bytes + self.held_bytes <= self.max_queued_bytes:
            sub.held.append((event_id, raw))
        else:
            self.drop(1008, "slow consumer", abort=True)

    # -- the connection's state -----------------------------------------------------------------

    def origin_changed(self, origin: Origin | None) -> None:
        """The operator edited this connection's origin: its new policy applies from now on, and a
        connection it no longer admits is closed (the client reconnects under the new rules)."""
        if origin is None:
            self.drop(1008, "community removed", notice="error: this community is no longer served here")
            return
        self.origin = origin
        if not may_enter(origin, self.reader) or (self.reader is not None and self.reader in origin.block) \
                or self.peer_ip in origin.block_ips:
            self.drop(1008, "access policy changed",
                      notice="restricted: this community's access rules changed; reconnect")

    def cancel_queries(self) -> None:
        self.held_reads.clear()
        self.held_demand = 0
        for task in [*self.queries.values(), *self.counts]:
            task.cancel()
        self.queries.clear()
        self.counts.clear()

    def spawn(self, coro) -> asyncio.Task:
        """A task of this connection: the connection waits for it before it ends."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- rate limits ----------------------------------------------------------------------------

    def req_token(self) -> str | None:
        """Spend a REQ/COUNT token (see `Governor.req_token`): None when spent; WAIT when the
        message being handled is held until the token comes (handled again then); REFUSED."""
        outcome = self.governor.req_token(self.conn.pipelined)
        if outcome is WAIT:
            self._deferred = self._text
        return outcome

    # -- taking messages ------------------------------------------------------------------------

    async def serve(self, conn) -> None:
        """Serve `conn`, the accepted websocket connection, until it ends (and this connection's
        output and tasks are done)."""
        relay = self.relay
        self.conn = self.writer = conn
        # Past max_query_bytes unread, no new answer is produced for it until it reads half of that.
        self.output = Output(relay, conn, self._lost, high_water=self.settings.max_query_bytes,
                             drained=self._drained, shed=self.drop_slow)
        self._ended = self._loop.create_future()
        relay.sessions.add(self)
        if not relay.peers.exempt(self.peer_ip):
            self.governor.join(relay.budgets.join(self.peer_ip))
        self.send(_dumps(["AUTH", self.challenge]))
        conn.attach(self)
        await self._ended

    def pump(self) -> None:
        """Take and handle the connection's messages while this connection may: not past its
        in-flight caps, not paused by its rate limits, and for at most DEFAULT_RECEIVE_SLICE at a
        time (then the others' turn). Called by the connection when messages arrive, and by this
        session when it may take more again (`wake`, its timer)."""
        if self._pumping or self._finished:
            return
        self._pumping = True
        try:
            if self._idle:
                # A client that was quiet starts a new slice. One whose reads follow each other
                # (the event loop hands a connection up to 32 reads in a row while its socket has
                # data) goes on in the slice it has: it is not a new turn.
                self._idle = False
                now = time.monotonic()
                if now - self._idle_since > DEFAULT_RECEIVE_SLICE:
                    self._slice_end = now + DEFAULT_RECEIVE_SLICE
            conn = self.conn
            while self._ready():
                if self._deferred is not None:  # a REQ/COUNT held for its token (`req_token`)
                    text, self._deferred = self._deferred, None
                    self.handle_text(text, waited=True)
                    continue
                message = conn.next_message()
                if message is NOTHING:
                    self._idle = True
                    self._idle_since = time.monotonic()
                    return
                if message is CLOSED:
                    self._finish()
                    return
                if type(message) is str:
                    self.handle_text(message)
                else:
                    self.notice("error: binary frames are not supported; send JSON text frames")
            if self.closed:
                self._finish()
        finally:
            self._pumping = False

    def _ready(self) -> bool:
        """Whether to take another message now; if not, what wakes the pump is arranged."""
        if self.closed:
            return False
        if (self.inflight >= DEFAULT_MAX_INFLIGHT or len(self.counts) >= DEFAULT_MAX_PENDING_COUNTS
                or self.output.full):
            # `wake` comes when an EVENT or a COUNT is answered, or the client read its output
            self._blocked = True
            return False
        stopping = self.relay.stopping
        governor = self.governor
        if governor.resume_at and not stopping:
            # Over its budget: nothing more is read until it refills (see DEFAULT_MAX_PAUSE).
            delay = governor.resume_at - time.monotonic()
            if delay > 0:
                if self._timer is None:
                    self._timer = self._loop.call_later(delay, self._resume)
                return False
            governor.resume_at = 0.0
            self._slice_end = time.monotonic() + DEFAULT_RECEIVE_SLICE
        if not stopping and time.monotonic() > self._slice_end:
            # The others' turn (see DEFAULT_RECEIVE_SLICE); not once stopping, so that every
            # message already received is handled before the relay closes (Relay.shutdown).
            if self._timer is None:
                self._timer = self._loop.call_soon(self._resume)
            return False
        return True

    def _resume(self) -> None:
        self._timer = None
        self._slice_end = time.monotonic() + DEFAULT_RECEIVE_SLICE
        self.pump()

    def hold_read(self, start: Callable[[], None], demand: int) -> None:
        """A REQ's answer (up to `demand` bytes) waits until this client reads what it was sent
        (`start()` then). A client that asked for far more than it reads is a slow consumer: past
        max_queued_bytes unread and asked for, it is dropped."""
        self.held_reads.append(start)
        self.held_demand += demand
        self.output.held = True
        if self.output.queued_bytes + self.held_demand > self.max_queued_bytes:
            self.drop_slow()

    def _drained(self) -> None:
        """The client read what was queued for it: reads held for it go on, and so does the pump."""
        held, self.held_reads = self.held_reads, []
        self.held_demand = 0
        self.output.held = False  # (those still over budget are held again)
        for resume in held:
            if self.closed:
                break
            resume()
        self._blocked = True
        self.wake()

    def wake(self) -> None:
        """Take messages again soon: room was made under an in-flight cap, or the relay stops
        (then a pause ends now)."""
        if self._finished:
            return
        stopping = self.relay.stopping
        if not (self._blocked or stopping):
            return  # not waiting for room: nothing to wake
        self._blocked = False
        if self._timer is not None:
            if not stopping:
                return  # already due
            self._timer.cancel()
        self._timer = self._loop.call_soon(self._resume)

    def _finish(self) -> None:
        """The connection is over (or the relay ended it): let go of its state at once; its
        output is written (or dropped), its tasks awaited, then `serve` returns."""
        if self._finished:
            return
        self._finished = True
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        relay = self.relay
        if self.governor.budget is not None:
            relay.budgets.leave(self.governor.budget)
        self.cancel_queries()
        for release in self.at_end:
            try:
                release()
            except Exception:
                log.exception("releasing a connection's state failed")
        index = relay.index_for(self.origin)
        for sub in self.subs.values():
            index.remove(sub)
        self.subs.clear()
        relay.sessions.discard(self)
        self.output.end()
        self._loop.create_task(self._wind_up())

    async def _wind_up(self) -> None:
        try:
            await self.output.done.wait()
            self.output.discard()  # what was never sent leaves with it
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            if not self._ended.done():
                self._ended.set_result(None)

    def handle_text(self, text: str, waited: bool = False) -> None:
        """Handle one message; `waited`: a REQ/COUNT held for its token, already counted."""
        s = self.settings
        governor = self.governor
        self._text = text
        if not waited:
            self.received_at = time.monotonic()
            # Received bytes (counted as characters: cheap, and at most 4x short) only slow the
            # reading down; what was sent is handled.
            governor.received(len(text))
            if not governor.take_message():
                self.notice("rate-limited: too many messages, slow down")
                governor.refused_message()
                return
        # A str of n characters is at most 4n UTF-8 bytes: only long messages need encoding.
        if len(text) > s.max_message_length or (len(text) * 4 > s.max_message_length
                                                 and len(text.encode()) > s.max_message_length):
            self.refuse_too_large(text)
            return
        admitted = False
        if text[:16].lstrip().startswith(_METERED_PREFIXES) and not self.relay.stopping:
            head = _REQ_HEAD(text)
            if head is not None:
                # The token first: a refused REQ/COUNT is answered without parsing its filters.
                outcome = self.req_token()
                if outcome is WAIT:
                    return
                if outcome is REFUSED:
                    VERBS[head[1]].refused(self, head[2])
                    return
                admitted = True
        try:
            msg = orjson.loads(text)
        except orjson.JSONDecodeError:
            self.notice("invalid: could not parse message as JSON")
            return
        if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
            self.notice('invalid: a message is a JSON array starting with its type, like ["REQ", ...]')
            return
        name = msg[0]
        verb = VERBS.get(name)
        if verb is None:
            self.notice(f"invalid: unknown message type {name[:32]!r}")
        elif self.relay.stopping and verb.stopping is not None:
            verb.stopping(self, msg)
        else:
            verb.handle(self, msg, admitted)

    def refuse_too_large(self, text: str) -> None:
        """An oversized EVENT still gets its OK (a client waits for one); anything else a NOTICE.
        The server's frame limit (twice max_message_length) bounds what is parsed here."""
        message = f"invalid: message too large (max {self.settings.max_message_length} bytes)"
        try:
            msg = orjson.loads(text)
        except orjson.JSONDecodeError:
            msg = None
        if isinstance(msg, list) and len(msg) == 2 and msg[0] == "EVENT" and isinstance(msg[1], dict):
            event_id = msg[1].get("id")
            if isinstance(event_id, str) and len(event_id) <= 64:
                self.ok(event_id, False, message)
                return
        self.notice(message)
