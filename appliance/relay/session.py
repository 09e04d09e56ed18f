"""One websocket connection speaking NIP-01 (EVENT, REQ, CLOSE), NIP-42 AUTH and NIP-45 COUNT."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect

from appliance.errors import AlreadyStored, Rejected, StorageFull
from appliance.nostr.event import InvalidEvent, parse_event
from appliance.nostr.filters import Filter, InvalidFilter, parse_filter
from appliance.nostr.nip42 import AuthError, validate_auth_event
from appliance.relay.frames import Frames, FrameWriter, frame_events
from appliance.relay.authz import GATED_KINDS, AUTHOR_ONLY_KINDS, may_enter
from appliance.relay.limits import ClientBudget, TokenBucket
from appliance.relay.peers import url_as_reached
from appliance.origins import Origin
from appliance.relay.relay import Relay, peer_ip
from appliance.relay.subscriptions import Subscription
from appliance.store.sqlite import QueryTimeout

log = logging.getLogger("appliance.relay")

# A reader this far behind is dropped rather than buffered without bound: so many messages, or
# so many bytes (at least two full REQ answers, see the max_query_bytes setting), whichever first.
DEFAULT_MAX_QUEUED = 20_000
DEFAULT_MAX_QUEUED_BYTES = 32 * 1024 * 1024
# All connections together: past this, any connection holding more than its fair share of unsent
# bytes is dropped (many slow readers, each under its own budget, must not exhaust the machine).
DEFAULT_MAX_QUEUED_TOTAL = 512 * 1024 * 1024
DEFAULT_FAIR_SHARE = 1024 * 1024
# EVENTs one connection may have in flight (verifying or committing) at once.
DEFAULT_MAX_INFLIGHT = 512
# How long one connection's receive loop may handle messages before it lets the event loop run
# others. A client that pipelines thousands of messages has them all buffered: receiving each
# returns at once without suspending, so without this one connection would hold the loop until
# its buffer was empty and every other connection would wait (issue #14: a flood starves no one).
DEFAULT_RECEIVE_SLICE = 0.002
# COUNTs one connection may have waiting for an answer. At the cap its receive loop stops reading
# (TCP backpressure), as for EVENTs: a pipelined flood of COUNTs queues in the client's socket, not
# as tasks here. (REQs are bounded already: one query per open subscription.)
DEFAULT_MAX_PENDING_COUNTS = 32
MAX_SUB_ID_LENGTH = 64
# (REQ/COUNT queries one connection may have in the database at once, and their fair share of the
# reader threads: see appliance.store.sqlite.ReadPool.)
# Rate-limited messages a connection may send within REFUSAL_WINDOW_SECONDS before it is closed
# (each refusal counting for the batch it waits for, see REFUSAL_BATCH_SECONDS): past this it is
# flooding (and its address waits before connecting again, see the flood_backoff setting).
DEFAULT_MAX_REFUSALS = 1000
REFUSAL_WINDOW_SECONDS = 60.0
# Longest pause of a connection's reading after a refusal or while its receive budget is in debt.
# A refused connection is read no faster than its budget refills: a flood of pipelined messages
# then waits in the client's own socket (TCP backpressure) instead of costing the relay a frame
# parse and a refusal each, so refusals stay cheap and few however fast the client sends.
DEFAULT_MAX_PAUSE = 2.0
# ... and once refused, a connection is read again when the bucket that refused it holds this
# many seconds of its refill (at most its burst), not one token: a flood is then served in
# batches (an EVENT flood at 100/s: ten events a tenth of a second, written with one commit,
# their OKs with one system call, one wake-up of the connection) at the same sustained rate. One
# token at a time, its steady 100 accepted and 100 refused EVENTs a second cost the relay a wake-up,
# a commit and two writes each; on a busy machine that churn, not the events' own work, is what
# made the other clients wait (issue #14).
REFUSAL_BATCH_SECONDS = 0.1
# A REQ/COUNT token buys this much CPU time of its query; a query that takes more costs one token
# more for each further share, paid from the same buckets (they may go into debt, and the
# connection is then read no faster than they refill). So the req_rate settings bound the database
# time a client takes, not only its message count: 16-filter COUNTs over a large store cost many
# tokens each, a page of 500 events one.
DEFAULT_READ_SECONDS_PER_TOKEN = 0.005
# Queued messages written together (one system call): a REQ's stored events, a burst of OKs.
SEND_BATCH = 256
# Several nodes: an event another node committed can be in a REQ's stored answer before its
# notification reaches this node; no id of the answer, however large, is sent again to that
# subscription when it does, for this many seconds (far longer than a notification takes). The ids
# are held that long, then dropped: at most the ids of the answers sent in the last few seconds.
REMOTE_SKIP_SECONDS = 5.0


# The head of a REQ/COUNT as clients write it: its verb and subscription id can be read without
# parsing the filters, so a refused one costs no JSON parse (see `handle_text`).
_REQ_HEAD = re.compile(r'\s*\[\s*"(REQ|COUNT)"\s*,\s*"([^"\\]{1,64})"\s*[,\]]').match
WAIT, REFUSED = "wait", "refused"  # outcomes of `_req_token` other than taken (None)

STOPPING_MESSAGE = "error: the relay is restarting; try again in a moment"
DISK_FULL_MESSAGE = "error: the relay's disk is full; nothing was stored, try again later"
QUERY_TIMEOUT_MESSAGE = "error: this query takes too long here; narrow its filters or lower its limit"


def _dumps(obj) -> str:
    return orjson.dumps(obj).decode()


class Session:
    """State of one client connection: its origin, authenticated pubkey, subscriptions."""

    def __init__(self, relay: Relay, ws: WebSocket, origin: Origin):
        self.relay = relay
        self.ws = ws
        self.origin = origin
        self.settings = relay.settings
        self.reader: str | None = None  # the NIP-42 authenticated pubkey
        self.peer_ip = peer_ip(ws)
        self.challenge = secrets.token_hex(16)
        self.subs: dict[str, Subscription] = {}
        # The stored-events query of each REQ still running, by subscription id (a handle with
        # `cancel()`): a CLOSE or a replacing REQ cancels it, and only the subscription it belongs
        # to may send its answer.
        self.queries: dict[str, object] = {}
        self.counts: set = set()  # COUNT queries waiting for their answer (handles with `cancel()`)
        self.refusals = 0
        self.refusals_since = time.monotonic()
        self.held_bytes = 0  # live events held behind pending stored answers (see live_event)
        # Output: messages wait in `_pending` until a callback scheduled on the loop writes all of
        # them with one system call (no task wakes for it); only when the peer is behind, or on
        # the plain ASGI path, does a task (`_drain`) write them as the peer takes them.
        self._loop = asyncio.get_running_loop()
        self._pending: list = []
        self._flush_scheduled = False
        self._drain_task: asyncio.Task | None = None
        self._end_output = False  # write what is pending, then the close frame (if any), then stop
        self._output_done = asyncio.Event()
        self.writer = FrameWriter(ws.scope, ws.send_text)
        self.close_code: int | None = None  # set when the relay ends the connection
        self.close_reason = ""
        self.queued_bytes = 0
        self.max_queued_bytes = max(DEFAULT_MAX_QUEUED_BYTES, 2 * relay.settings.max_query_bytes)
        self.closed = False
        # EVENTs being verified or committed. At the cap, the receive loop stops reading: TCP
        # backpressure instead of an unbounded queue (or an O(n) semaphore per event).
        self.inflight = 0
        self.drained = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        s = self.settings
        self.event_bucket = TokenBucket(s.event_rate, s.event_burst)
        self.req_bucket = TokenBucket(s.req_rate, s.req_burst)
        # Garbage floods: every message costs a token here. Twice the sum of the per-verb rates,
        # so it only bites on messages that no per-verb bucket accounts for; off if either is off.
        flood_rate = 0 if s.event_rate == 0 or s.req_rate == 0 else 2 * (s.event_rate + s.req_rate)
        self.message_bucket = TokenBucket(flood_rate, s.event_burst + s.req_burst)
        self.receive_bucket = TokenBucket(s.receive_rate, s.receive_burst)
        # The buckets this connection shares with every other from its client address (set by
        # `run` unless the address is exempt, see the loopback_exempt setting).
        self.budget: ClientBudget | None = None
        self.resume_at = 0.0  # the receive loop reads nothing more before this (time.monotonic)
        self._deferred: str | None = None  # a REQ/COUNT held until its token comes (`_req_token`)
        self._text = ""  # the message being handled
        # The server's queue of messages received and not yet handled (uvicorn's sans-I/O
        # protocol), to tell a client that waits for answers from one that pipelines; None when
        # the server is another (then every client counts as pipelining: refused, never held).
        proto = getattr(getattr(ws, "_receive", None), "__self__", None)
        inbox = getattr(proto, "queue", None)
        self._inbox: asyncio.Queue | None = inbox if isinstance(inbox, asyncio.Queue) else None
        self._proto = proto  # (its `unparsed`: received, not parsed yet, see appliance.server)

    # -- output ---------------------------------------------------------------------------------

    def send(self, text: str | Frames) -> None:
        """Queue one message (or a `Frames` of several, already framed) for the sender."""
        if self.closed:
            return
        if (len(self._pending) >= DEFAULT_MAX_QUEUED or self.queued_bytes + len(text) > self.max_queued_bytes
                or (self.relay.queued_bytes > DEFAULT_MAX_QUEUED_TOTAL and self.queued_bytes > DEFAULT_FAIR_SHARE)):
            log.info("dropping slow connection origin=%s queued=%d queued_bytes=%d", self.origin.origin,
                     len(self._pending), self.queued_bytes)
            # It is not reading: a close frame would wait behind everything queued. Cut it.
            self.drop(1008, "slow consumer", abort=True)
            return
        self._enqueue(text)

    def _enqueue(self, text: str | Frames) -> None:
        self._account(len(text))
        self._pending.append(text)
        if not self._flush_scheduled and self._drain_task is None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write everything pending at once (everything queued in this turn of the loop goes out
        together: a REQ's answer, a burst of OKs), or hand over to `_drain`."""
        self._flush_scheduled = False
        if self._drain_task is not None or self._output_done.is_set():
            return
        pending = self._pending
        if pending and self.writer.ready():
            self._pending = []
            try:
                self.writer.write_now(pending)
            except Exception:  # a transport that broke under us: this connection is over
                log.debug("write failed", exc_info=True)
                self.closed = True
                self.writer.abort()
                self._output_done.set()
                return
            self._account(-sum(map(len, pending)))
            pending = None
        if pending or self._end_output:  # the peer is behind (or plain ASGI), or output ends
            self._drain_task = asyncio.ensure_future(self._drain())

    def _end(self) -> None:
        """No more output after what is pending (and the close frame, if the relay is closing)."""
        if not self._end_output:
            self._end_output = True
            if not self._flush_scheduled and self._drain_task is None:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)

    def _account(self, n: int) -> None:
        """Unsent output grew (or, negative, shrank) by n: this connection's and the relay's."""
        self.queued_bytes += n
        self.relay.queued_bytes += n

    def drop(self, code: int, reason: str, *, notice: str | None = None, abort: bool = False) -> None:
        """End this connection from the relay's side: nothing more is queued; what is queued (and
        `notice`) is sent, then a close frame, unless `abort` cuts the connection at once."""
        if self.closed:
            return
        if notice is not None:
            self._enqueue(_dumps(["NOTICE", notice]))
        self.closed = True
        self.close_code = code
        self.close_reason = reason
        self._end()
        self.cancel_queries()
        if abort:
            self.writer.abort()

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
        for task in [*self.queries.values(), *self.counts]:
            task.cancel()
        self.queries.clear()
        self.counts.clear()

    def refused(self, mine: TokenBucket, shared: TokenBucket | None) -> None:
        """A message was rate-limited by this connection's bucket `mine` or its address's `shared`:
        read nothing more from this connection until both hold a batch of tokens again (see
        REFUSAL_BATCH_SECONDS). The refusal counts for the messages of that batch (as many as one
        refusal per token would have been); a connection refused for so many within a minute is
        flooding: it is closed, and its address backs off."""
        wait = mine.wait_for_batch(REFUSAL_BATCH_SECONDS)
        if shared is not None:
            wait = max(wait, shared.wait_for_batch(REFUSAL_BATCH_SECONDS))
        self.pause(wait)
        now = time.monotonic()
        if now - self.refusals_since > REFUSAL_WINDOW_SECONDS:
            self.refusals, self.refusals_since = 0, now
        batch = mine.batch(REFUSAL_BATCH_SECONDS) or (shared.batch(REFUSAL_BATCH_SECONDS) if shared else 0.0)
        self.refusals += max(1.0, batch)
        if self.refusals > DEFAULT_MAX_REFUSALS:
            self.drop(1008, "flooding", notice="rate-limited: too many refused messages; closing")
            barred = self.relay.peers.flooded(self.peer_ip)
            if self.budget is not None:
                self.budget.exhaust(barred)
            log.info("closed a flooding connection origin=%s barred_seconds=%g", self.origin.origin, barred)

    def pause(self, seconds: float) -> None:
        """Read nothing more from this connection for `seconds` (at most DEFAULT_MAX_PAUSE)."""
        until = time.monotonic() + min(seconds, DEFAULT_MAX_PAUSE)
        if until > self.resume_at:
            self.resume_at = until

    def _take(self, mine: TokenBucket, shared: TokenBucket | None) -> float:
        """Take a token from this connection's bucket and its address's: 0.0 when taken, else (none
        taken) the seconds until both have one."""
        if mine.take():
            if shared is None or shared.take():
                return 0.0
            mine.tokens += 1  # given back: the message is refused
            return shared.wait()
        return max(mine.wait(), shared.wait() if shared is not None else 0.0)

    def read_cost(self, seconds: float) -> None:
        """A REQ/COUNT query of this connection used `seconds` of CPU: charge what its token did
        not cover (see DEFAULT_READ_SECONDS_PER_TOKEN)."""
        extra = seconds / DEFAULT_READ_SECONDS_PER_TOKEN - 1.0
        if extra <= 0:
            return
        delay = self.req_bucket.charge(extra)
        if self.budget is not None:
            delay = max(delay, self.budget.req.charge(extra))
        if delay:
            self.pause(delay)

    def _pipelined(self) -> bool:
        """Whether this client's next messages have arrived already (it sends without waiting for
        answers)."""
        inbox = self._inbox
        return inbox is None or not inbox.empty() or getattr(self._proto, "unparsed", None) is not None

    def _req_token(self) -> str | None:
        """Spend a REQ/COUNT token: None when spent. Without one, a client that waits for this
        answer before sending more (paging through history) is held until the token comes (WAIT:
        the message is handled again then), not refused; one that pipelines is refused (REFUSED,
        `refused` called: the caller sends CLOSED).

        A held message that still finds no token when handled again is held again, for as long
        as the client sends nothing more: its wake-up may come a little before the token (the
        event loop's timers run early by up to a millisecond or so, more on a busy machine), or
        another connection from its address may have taken the token first. Only a client that
        sent more meanwhile is refused."""
        budget = self.budget
        wait = self._take(self.req_bucket, budget.req if budget is not None else None)
        if not wait:
            return None
        if not self._pipelined():
            self._deferred = self._text
            self.pause(wait + 0.001)
            return WAIT
        self.refused(self.req_bucket, budget.req if budget is not None else None)
        return REFUSED

    def send_event(self, sub_id: str, raw: str) -> None:
        self.send('["EVENT",' + _dumps(sub_id) + "," + raw + "]")

    def live_event(self, sub: Subscription, event_id: str, raw: str) -> None:
        """A new event matching `sub`: sent now, or held until its stored answer and EOSE are out
        (NIP-01: what precedes EOSE is the stored answer, newest first, within its limits)."""
        if sub.held is None:
            skip = sub.skip
            if skip is not None:
                if event_id in skip:
                    skip.discard(event_id)  # the stored answer carried it (see _answer_ready)
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

    def _release_held(self, sub: Subscription) -> list[tuple[str, str]]:
        held, sub.held = sub.held or [], None
        self.held_bytes -= sum(len(raw) for _id, raw in held)
        return held

    def notice(self, message: str) -> None:
        self.send(_dumps(["NOTICE", message]))

    def ok(self, event_id: str, accepted: bool, message: str) -> None:
        self.send(_dumps(["OK", event_id, accepted, message]))

    def closed_msg(self, sub_id: str, message: str) -> None:
        self.send(_dumps(["CLOSED", sub_id, message]))

    async def _drain(self) -> None:
        """The slow path of output: write pending messages as the peer takes them (or through
        plain ASGI sends), then, once output ends, the close frame."""
        writer = self.writer
        try:
            while not self._output_done.is_set():
                if self._pending:
                    texts = self._pending[:SEND_BATCH]
                    del self._pending[:SEND_BATCH]
                    try:
                        delivered = await writer.send_all(texts)
                    except Exception:  # a stalled or broken peer (the plain ASGI path raises)
                        delivered = False
                    if not delivered:
                        self.closed = True
                        writer.abort()
                        self._output_done.set()
                        break
                    self._account(-sum(map(len, texts)))
                    if writer.ready() and not self._end_output:
                        break  # the peer keeps up again: back to writing from the loop
                    continue
                if self._end_output:
                    if self.close_code is not None and not writer.aborted:
                        try:
                            await self.ws.close(code=self.close_code, reason=self.close_reason)
                        except Exception:  # the peer is gone already
                            pass
                    self._output_done.set()
                break
        finally:
            self._drain_task = None
            if (self._pending or self._end_output) and not self._output_done.is_set():
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)

    # -- main loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.ws.accept()
        self.relay.sessions.add(self)
        relay = self.relay
        if not relay.peers.exempt(self.peer_ip):
            budget = self.budget = relay.budgets.join(self.peer_ip)
            # A new connection has no more to spend than its address has left: reconnecting (after
            # a flood backoff, say) does not refill the connection's own buckets either.
            for mine, shared in ((self.event_bucket, budget.event), (self.req_bucket, budget.req),
                                 (self.message_bucket, budget.message)):
                mine.cap_at(shared)
        self.send(_dumps(["AUTH", self.challenge]))
        clock = time.monotonic
        slice_end = clock() + DEFAULT_RECEIVE_SLICE
        try:
            while not self.closed:
                if self.inflight >= DEFAULT_MAX_INFLIGHT or len(self.counts) >= DEFAULT_MAX_PENDING_COUNTS:
                    while self.inflight >= DEFAULT_MAX_INFLIGHT or len(self.counts) >= DEFAULT_MAX_PENDING_COUNTS:
                        self.drained.clear()
                        await self.drained.wait()
                    slice_end = clock() + DEFAULT_RECEIVE_SLICE
                elif self.resume_at and not relay.stopping:
                    # Over its budget: nothing more is read until it refills (see DEFAULT_MAX_PAUSE).
                    delay = self.resume_at - clock()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    self.resume_at = 0.0
                    slice_end = clock() + DEFAULT_RECEIVE_SLICE
                    continue
                elif clock() > slice_end and not relay.stopping:
                    # The others' turn (see DEFAULT_RECEIVE_SLICE); not once stopping, so that every
                    # message already received is handled before the relay closes (Relay.shutdown).
                    await asyncio.sleep(0)
                    slice_end = clock() + DEFAULT_RECEIVE_SLICE
                if self._deferred is not None:  # a REQ/COUNT held for its token (`_req_token`)
                    text, self._deferred = self._deferred, None
                    self.handle_text(text, waited=True)
                    continue
                message = await self.ws.receive()
                kind = message["type"]
                if kind == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    self.notice("error: binary frames are not supported; send JSON text frames")
                    continue
                self.handle_text(text)
        except WebSocketDisconnect:
            pass
        finally:
            self.closed = True
            if self.budget is not None:
                relay.budgets.leave(self.budget)
            self.cancel_queries()
            for sub in self.subs.values():
                self.relay.index_for(self.origin).remove(sub)
            self.subs.clear()
            self.relay.sessions.discard(self)
            self._end()
            await self._output_done.wait()
            self._account(-self.queued_bytes)  # what was never sent leaves with it
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)

    def handle_text(self, text: str, waited: bool = False) -> None:
        """Handle one message; `waited`: a REQ/COUNT held for its token, already counted."""
        s = self.settings
        budget = self.budget
        self._text = text
        if not waited:
            # Received bytes (counted as characters: cheap, and at most 4x short) only slow the
            # reading down; what was sent is handled.
            n = len(text)
            delay = self.receive_bucket.charge(n)
            if budget is not None:
                delay = max(delay, budget.received.charge(n))
            if delay:
                self.pause(delay)
            wait = self._take(self.message_bucket, budget.message if budget is not None else None)
            if wait:
                self.notice("rate-limited: too many messages, slow down")
                self.refused(self.message_bucket, budget.message if budget is not None else None)
                return
        # A str of n characters is at most 4n UTF-8 bytes: only long messages need encoding.
        if len(text) > s.max_message_length or (len(text) * 4 > s.max_message_length
                                                 and len(text.encode()) > s.max_message_length):
            self.refuse_too_large(text)
            return
        admitted = False
        if text[:16].lstrip().startswith(('["REQ"', '["COUNT"')) and not self.relay.stopping:
            head = _REQ_HEAD(text)
            if head is not None:
                # The token first: a refused REQ/COUNT is answered without parsing its filters.
                outcome = self._req_token()
                if outcome is WAIT:
                    return
                if outcome is REFUSED:
                    self._refuse_req(head[1], head[2])
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
        verb = msg[0]
        if self.relay.stopping and verb in ("EVENT", "REQ", "COUNT"):
            self.refuse_stopping(verb, msg)
            return
        if verb == "EVENT":
            self.on_event(msg)
        elif verb == "REQ":
            self.on_req(msg, admitted)
        elif verb == "COUNT":
            self.on_count(msg, admitted)
        elif verb == "CLOSE":
            self.on_close(msg)
        elif verb == "AUTH":
            self.on_auth(msg)
        else:
            self.notice(f"invalid: unknown message type {verb[:32]!r}")

    def refuse_stopping(self, verb: str, msg: list) -> None:
        """The relay is shutting down: new work is refused with a clear answer (nothing stored)."""
        if verb == "EVENT":
            arg = self._event_argument(msg, 'invalid: EVENT takes exactly one event object: ["EVENT", {...}]')
            if arg is not None:
                self.ok(arg[1], False, STOPPING_MESSAGE)
        elif len(msg) >= 2 and isinstance(msg[1], str) and 0 < len(msg[1]) <= MAX_SUB_ID_LENGTH:
            self.closed_msg(msg[1], STOPPING_MESSAGE)

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

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- EVENT ----------------------------------------------------------------------------------

    def _event_argument(self, msg: list, usage: str) -> tuple[dict, str] | None:
        """The event object of an EVENT/AUTH message and the id to answer OK with (NOTICE if malformed)."""
        if len(msg) != 2 or not isinstance(msg[1], dict):
            self.notice(usage)
            return None
        obj = msg[1]
        raw_id = obj.get("id")
        return obj, raw_id if isinstance(raw_id, str) and len(raw_id) <= 64 else ""

    def on_event(self, msg: list) -> None:
        arg = self._event_argument(msg, 'invalid: EVENT takes exactly one event object: ["EVENT", {...}]')
        if arg is None:
            return
        obj, event_id = arg
        budget = self.budget
        wait = self._take(self.event_bucket, budget.event if budget is not None else None)
        if wait:
            self.ok(event_id, False, "rate-limited: publishing too fast")
            self.refused(self.event_bucket, budget.event if budget is not None else None)
            return
        try:
            ev = parse_event(obj)
        except InvalidEvent as exc:
            self.ok(event_id, False, f"invalid: {exc.reason}")
            return
        self.inflight += 1  # counted before it is answered, so the receive loop sees it at once
        # Most events need nothing awaited: checked here and answered from the writer's commit,
        # with no task; the others (a kind with its own admission, say) take a task.
        if not self.relay.publish_then(self.origin, self.reader, ev,
                                       lambda message, exc: self._published(ev, message, exc)):
            self.spawn(self._publish(ev))

    async def _publish(self, ev) -> None:
        try:
            message = await self.relay.publish(self.origin, self.reader, ev)
        except Exception as exc:
            self._published(ev, None, exc)
        except BaseException:
            self._settled()
            raise
        else:
            self._published(ev, message, None)

    def _published(self, ev, message: str | None, exc: Exception | None) -> None:
        """An EVENT's outcome: its OK, and room for the next EVENT."""
        try:
            if exc is None:
                self.ok(ev.id, True, message)
            elif isinstance(exc, AlreadyStored):  # NIP-01: accepted, already stored
                self.relay.stats["duplicate"] += 1
                self.ok(ev.id, True, exc.wire)
            elif isinstance(exc, Rejected):  # counted by the relay
                self.ok(ev.id, False, exc.wire)
            elif isinstance(exc, StorageFull):  # the writer logged it; the operator frees space, the client retries
                self.ok(ev.id, False, DISK_FULL_MESSAGE)
            else:
                log.error("failed to store event %s", ev.id, exc_info=exc)
                self.ok(ev.id, False, "error: could not store the event, try again")
        finally:
            self._settled()

    def _settled(self) -> None:
        self.inflight -= 1
        if self.inflight < DEFAULT_MAX_INFLIGHT:
            self.drained.set()

    # -- REQ / COUNT / CLOSE --------------------------------------------------------------------

    def _parse_filters(self, raw_filters: list) -> list[Filter]:
        s = self.settings
        if not raw_filters:
            raise InvalidFilter("at least one filter is required")
        if len(raw_filters) > s.max_filters:
            raise InvalidFilter(f"too many filters (max {s.max_filters})")
        return [parse_filter(f, max_values=s.max_filter_values, max_limit=s.max_limit) for f in raw_filters]

    def _gate(self, filters: list[Filter]) -> str | None:
        """Why this reader may not run these filters at all, or None."""
        if not may_enter(self.origin, self.reader):
            if self.reader is None:
                return "auth-required: this community is for members; authenticate first"
            return "restricted: you are not a member of this community"
        if self.reader is None:
            if self.origin.auth_required:
                return "auth-required: authenticate first"
            private = GATED_KINDS | AUTHOR_ONLY_KINDS
            for f in filters:
                if f.kinds is not None and f.kinds & private:
                    return "auth-required: direct messages, gift wraps and push leases need authentication"
        return None

    def _refuse_req(self, verb: str, sub_id: str) -> None:
        """CLOSED for a REQ/COUNT refused for want of a token; a refused REQ also ends the
        subscription it would have replaced."""
        if verb == "REQ":
            self.end_subscription(sub_id)
        self.closed_msg(sub_id, "rate-limited: too many requests, slow down")

    def _req_arguments(self, msg: list, verb: str,
                       admitted: bool = False) -> tuple[str, list[Filter] | None] | None:
        """(subscription id, filters) of a REQ/COUNT; filters None once refused with CLOSED; None
        when the message has no usable subscription id (NOTICE sent) or waits for its token.
        `admitted`: its token is spent already."""
        if len(msg) < 2 or not isinstance(msg[1], str):
            self.notice(f'invalid: {verb} needs a subscription id: ["{verb}", "<id>", {{...}}]')
            return None
        sub_id = msg[1]
        if not sub_id or len(sub_id) > MAX_SUB_ID_LENGTH:
            self.notice(f"invalid: subscription id must be 1 to {MAX_SUB_ID_LENGTH} characters")
            return None
        if not admitted:
            outcome = self._req_token()
            if outcome is WAIT:
                return None
            if outcome is REFUSED:
                self.closed_msg(sub_id, "rate-limited: too many requests, slow down")
                return sub_id, None
        try:
            filters = self._parse_filters(msg[2:])
        except InvalidFilter as exc:
            self.closed_msg(sub_id, f"invalid: {exc.reason}")
            return sub_id, None
        refusal = self._gate(filters)
        if refusal is not None:
            self.closed_msg(sub_id, refusal)
            return sub_id, None
        return sub_id, filters

    def on_count(self, msg: list, admitted: bool = False) -> None:
        args = self._req_arguments(msg, "COUNT", admitted)
        if args is None or args[1] is None:
            return
        sub_id, filters = args

        def done(n, exc):  # on the loop, always after start_count has returned
            self._answer_count(handle, sub_id, n, exc)

        # No task or future: the store calls back (see Relay.start_count).
        handle = self.relay.start_count(self.origin, self.reader, filters, owner=self, cost=self.read_cost,
                                        done=done)
        self.counts.add(handle)

    def _answer_count(self, handle, sub_id: str, n, exc: BaseException | None) -> None:
        """On the loop, once a COUNT is counted: its answer, and room for the next COUNT."""
        counts = self.counts
        counts.discard(handle)
        if len(counts) < DEFAULT_MAX_PENDING_COUNTS:
            self.drained.set()
        if exc is None:
            self.send(_dumps(["COUNT", sub_id, {"count": n}]))
        elif isinstance(exc, QueryTimeout):
            self.closed_msg(sub_id, QUERY_TIMEOUT_MESSAGE)
        else:
            log.error("count failed", exc_info=exc)
            self.closed_msg(sub_id, "error: count failed")

    def on_req(self, msg: list, admitted: bool = False) -> None:
        """Open (or replace) a subscription at once, in message order; its stored events follow.

        Registration is synchronous so a CLOSE or another REQ with the same id that arrives next
        always finds it, and nothing is registered once the connection is gone."""
        args = self._req_arguments(msg, "REQ", admitted)
        if args is None:
            return
        sub_id, filters = args
        # A REQ replaces the subscription of the same id; a refused one (CLOSED sent) ends it.
        self.end_subscription(sub_id)
        if filters is None:
            return
        if len(self.subs) >= self.settings.max_subscriptions:
            self.closed_msg(sub_id, f"error: too many open subscriptions (max {self.settings.max_subscriptions})")
            return
        # Register before querying so nothing committed meanwhile is missed (duplicates are fine).
        sub = Subscription(self, sub_id, filters, held=[])
        self.subs[sub_id] = sub
        self.relay.index_for(self.origin).add(sub)
        raw_frames = self.writer.raw_frames
        self.queries[sub_id] = self.relay.start_query(
            self.origin, self.reader, filters, owner=self, raw_bytes=raw_frames, cost=self.read_cost,
            render=_answer_renderer(sub_id, raw_frames),
            done=lambda answer, exc: self._answer_ready(sub, answer, exc))

    def _answer_ready(self, sub: Subscription, answer, exc: BaseException | None) -> None:
        """On the loop, once a REQ's stored answer is read and rendered: send it and its EOSE, then
        the live events held meanwhile."""
        sub_id = sub.sub_id
        if self.subs.get(sub_id) is not sub:
            return  # closed or replaced meanwhile: its answer is not wanted
        if exc is not None:
            timed_out = isinstance(exc, QueryTimeout)
            if not timed_out:
                log.error("query failed", exc_info=exc)
            self.end_subscription(sub_id)
            self.closed_msg(sub_id, QUERY_TIMEOUT_MESSAGE if timed_out else "error: query failed")
            return
        del self.queries[sub_id]
        messages, rows = answer
        if type(messages) is Frames:
            self.send(messages)
        else:
            for text in messages:
                self.send(text)
        held = self._release_held(sub)
        unbroadcast = self.relay.unbroadcast
        remote = self.relay.other_nodes
        if held or unbroadcast or remote:
            # Held events the stored answer already carried are not sent twice; nor are events it
            # carried whose publishers have not broadcast them yet (committed, seen by the read,
            # their broadcast still to come on this loop).
            answered = {eid for eid, _raw in rows}
            for event_id, raw in held:
                if event_id not in answered:
                    self.send_event(sub_id, raw)
            if answered:
                if remote:
                    # Every id of the answer (those not broadcast yet among them), for a while.
                    skip = answered
                    sub.skip_until = time.monotonic() + REMOTE_SKIP_SECONDS
                    asyncio.get_running_loop().call_later(REMOTE_SKIP_SECONDS, _lapse_skip, sub, skip)
                else:
                    skip = {eid for eid in list(unbroadcast) if eid in answered}
                sub.skip = skip or None

    def end_subscription(self, sub_id: str) -> None:
        """Forget a subscription: out of the index, its pending query cancelled."""
        sub = self.subs.pop(sub_id, None)
        if sub is not None:
            self.relay.index_for(self.origin).remove(sub)
            self._release_held(sub)
        task = self.queries.pop(sub_id, None)
        if task is not None:
            task.cancel()

    def on_close(self, msg: list) -> None:
        if len(msg) != 2 or not isinstance(msg[1], str):
            self.notice('invalid: CLOSE takes a subscription id: ["CLOSE", "<id>"]')
            return
        self.end_subscription(msg[1])

    # -- AUTH -----------------------------------------------------------------------------------

    def _local_urls(self) -> tuple[str, ...]:
        """On an install with no public URL, the URL this client connected to also names the relay
        when its host is this machine (`ws://localhost:7777`, `ws://192.168.1.5:7777`). Any other
        Host header is never trusted: a relay elsewhere could forward our challenge to its own
        users and sign in here as them. With a configured origin, only that URL counts."""
        s = self.settings
        if s.public_url or self.origin.origin != s.effective_public_url:
            return ()
        server = self.ws.scope.get("server") or ("",)
        scheme = "wss" if self.ws.scope.get("scheme") == "wss" else "ws"
        url = url_as_reached(self.ws.headers.getlist("host"), str(server[0]), scheme, self.ws.scope.get("path", "/"))
        return (url,) if url else ()

    def on_auth(self, msg: list) -> None:
        arg = self._event_argument(msg, 'invalid: AUTH takes one signed event: ["AUTH", {...}]')
        if arg is None:
            return
        obj, event_id = arg
        try:
            ev = parse_event(obj)
            pubkey = validate_auth_event(
                ev,
                challenge=self.challenge,
                relay_url=self.origin.relay_url,
                now=int(time.time()),
                window=self.settings.auth_window,
                also_urls=self._local_urls(),
            )
        except (InvalidEvent, AuthError) as exc:
            self.ok(event_id, False, f"invalid: {exc.reason}")
            return
        if pubkey in self.origin.block:
            self.ok(ev.id, False, "blocked: this pubkey is blocked here")
            return
        self.reader = pubkey
        self.ok(ev.id, True, "")


def _answer_renderer(sub_id: str, raw_frames: bool):
    """The function a reader thread turns a REQ's stored rows into its messages with (the EVENTs
    and the EOSE): one `Frames` when the connection takes raw frames, else a list of texts.
    Returns (messages, rows)."""
    sub_json = _dumps(sub_id)
    if raw_frames:
        prefix = ('["EVENT",' + sub_json + ",").encode()
        eose = ('["EOSE",' + sub_json + "]").encode()

        def render(rows: list) -> tuple:
            return frame_events(prefix, [raw for _eid, raw in rows], eose), rows
    else:
        prefix_text = '["EVENT",' + sub_json + ","
        eose_text = '["EOSE",' + sub_json + "]"

        def render(rows: list) -> tuple:
            return [prefix_text + raw + "]" for _eid, raw in rows] + [eose_text], rows
    return render


def _lapse_skip(sub: Subscription, skip: set[str]) -> None:
    """The answer's ids of a subscription on several nodes are not held past REMOTE_SKIP_SECONDS
    (the set is dropped whether or not a live event came to check `skip_until`)."""
    if sub.skip is skip:
        sub.skip = None
