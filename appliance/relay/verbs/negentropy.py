"""NEG-OPEN, NEG-MSG and NEG-CLOSE (NIP-77 negentropy syncing), answered by NEG-MSG or NEG-ERR.

A NEG-OPEN selects, with one filter, the events at the connection's origin that the connection
may read (the read scope of REQ: `can_read` as SQL, the same gate before it), builds their
negentropy records once (40 bytes each, at most `negentropy_max_records`) and answers the client's
initial message; each NEG-MSG is reconciled against those records. The protocol itself is
appliance.nostr.negentropy.

A session ends on NEG-CLOSE, on a NEG-ERR, when its connection ends, and after
`negentropy_idle_timeout` seconds without a message (`NEG-ERR "closed: ..."`). Answers are at most
half of `max_message_length` before hex encoding (the negentropy frame size limit), so no NEG-MSG
sent is larger than what the relay itself accepts.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import orjson

from appliance.nostr.filters import InvalidFilter, parse_filter
from appliance.nostr.negentropy import MIN_FRAME_SIZE_LIMIT, Negentropy, NegentropyError, Storage, TooManyRecords
from appliance.relay.authz import read_scope
from appliance.relay.governor import REFUSED, WAIT
from appliance.relay.verbs.base import MAX_SUB_ID_LENGTH, STOPPING_MESSAGE, Verb
from appliance.relay.verbs.req import RATE_LIMITED_MESSAGE, gate
from appliance.store.events import negentropy_rows
from appliance.store.interface import QueryTimeout

if TYPE_CHECKING:
    from appliance.relay.session import Session

log = logging.getLogger("appliance.relay")

TOO_MANY_RECORDS = "blocked: too many records"
QUERY_TIMEOUT_MESSAGE = "error: this query takes too long here; narrow its filter"
# Reconciling this few records is done on the loop; more go to a worker thread, so no other
# connection waits: docs/performance.md#inline_records
INLINE_RECORDS = 4096
# Reading a session's records may take longer than a REQ's page (a million records is a few
# seconds of SQL and packing on a small box): at least this long, whatever query_timeout says.
MIN_READ_SECONDS = 30.0
_HEX = re.compile(r"(?:[0-9a-f]{2})*").fullmatch

_workers: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _workers
    if _workers is None:
        _workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="negentropy")
    return _workers


def _dumps(obj) -> str:
    return orjson.dumps(obj).decode()


def frame_size_limit(max_message_length: int) -> int:
    """The longest negentropy message this relay sends (bytes, before hex encoding): its hex and
    the NEG-MSG around it fit in max_message_length."""
    return max(MIN_FRAME_SIZE_LIMIT, (max_message_length - 256) // 2)


class NegSession:
    """One open reconciliation: its records once read, and whether a message is being answered."""

    __slots__ = ("sub_id", "read", "ne", "busy", "last_active")

    def __init__(self, sub_id: str):
        self.sub_id = sub_id
        self.read = None  # the records' read while it runs (a handle with `cancel()`)
        self.ne: Negentropy | None = None
        self.busy = False  # a message is being reconciled
        self.last_active = time.monotonic()


class Negentropies:
    """The negentropy sessions of one connection."""

    def __init__(self, session: "Session"):
        self.session = session
        self.open: dict[str, NegSession] = {}
        self._timer: asyncio.TimerHandle | None = None

    # -- messages --------------------------------------------------------------------------------

    def on_open(self, msg: list, admitted: bool) -> None:
        session = self.session
        s = session.settings
        sub_id = self._sub_id(msg, "NEG-OPEN", '["NEG-OPEN", "<id>", {filter}, "<hex message>"]')
        if sub_id is None:
            return
        if not admitted:  # (its token is usually taken from the message's head: see NEG_OPEN)
            outcome = session.req_token()
            if outcome is WAIT:
                return
            if outcome is REFUSED:
                self.refused(sub_id)
                return
        self.close(sub_id)  # NIP-77: a NEG-OPEN for an open id closes that session first
        if len(msg) != 4:
            self.error(sub_id, 'invalid: NEG-OPEN takes ["NEG-OPEN", "<id>", {filter}, "<hex message>"]')
            return
        if not isinstance(msg[2], dict):
            self.error(sub_id, "invalid: NEG-OPEN takes one filter object")
            return
        query = _payload(msg[3])
        if query is None:
            self.error(sub_id, "invalid: the negentropy message must be lowercase hex")
            return
        try:
            # A filter's limit may ask for up to the record limit (one more tells it is exceeded).
            f = parse_filter(msg[2], max_values=s.max_filter_values, max_limit=s.negentropy_max_records + 1)
        except InvalidFilter as exc:
            self.error(sub_id, f"invalid: {exc.reason}")
            return
        refusal = gate(session, [f])  # REQ's gate, word for word
        if refusal is not None:
            self.error(sub_id, refusal)
            return
        if len(self.open) >= s.negentropy_max_sessions:
            self.error(sub_id, f"blocked: too many open negentropy sessions (max {s.negentropy_max_sessions})")
            return

        relay = session.relay
        origin = session.origin
        scope = read_scope(origin, session.reader, relay.groups)
        now = int(time.time())
        max_records = s.negentropy_max_records
        limit = frame_size_limit(s.max_message_length)

        def read(conn):  # on a reader thread: the records, and the answer to the first message
            t0 = time.thread_time()
            storage = Storage.from_rows(negentropy_rows(conn, origin.id, f, scope, now, max_records + 1),
                                        max_records)
            ne = Negentropy(storage, limit)
            try:
                reply = ne.reconcile(query)
            except NegentropyError as exc:
                return ne, None, exc, time.thread_time() - t0
            return ne, reply, None, time.thread_time() - t0

        neg = NegSession(sub_id)
        self.open[sub_id] = neg
        timeout = 0 if not s.query_timeout else max(s.query_timeout, MIN_READ_SECONDS)
        neg.read = relay.store.read_then(read, lambda result, exc: self._opened(neg, result, exc),
                                         timeout=timeout, owner=session)
        self._arm()

    def _opened(self, neg: NegSession, result, exc: BaseException | None) -> None:
        """On the loop, once a NEG-OPEN's records are read and its first message answered."""
        if self.open.get(neg.sub_id) is not neg:
            return  # closed or replaced meanwhile
        neg.read = None
        if exc is not None:
            if isinstance(exc, TooManyRecords):
                self.error(neg.sub_id, TOO_MANY_RECORDS, exc.limit)
            elif isinstance(exc, QueryTimeout):
                self.error(neg.sub_id, QUERY_TIMEOUT_MESSAGE)
            else:
                log.error("negentropy read failed", exc_info=exc)
                self.error(neg.sub_id, "error: could not read the events of this filter")
            return
        ne, reply, failed, spent = result
        self.session.governor.read_cost(spent)
        if failed is not None:
            self.error(neg.sub_id, f"invalid: negentropy message: {failed}")
            return
        neg.ne = ne
        neg.last_active = time.monotonic()
        self._reply(neg, reply)

    def on_msg(self, msg: list) -> None:
        sub_id = self._sub_id(msg, "NEG-MSG", '["NEG-MSG", "<id>", "<hex message>"]')
        if sub_id is None:
            return
        neg = self.open.get(sub_id)
        if neg is None:
            self.error(sub_id, "closed: unknown negentropy session; send NEG-OPEN first", keep=True)
            return
        if len(msg) != 3:
            self.error(sub_id, 'invalid: NEG-MSG takes ["NEG-MSG", "<id>", "<hex message>"]')
            return
        query = _payload(msg[2])
        if query is None:
            self.error(sub_id, "invalid: the negentropy message must be lowercase hex")
            return
        if neg.ne is None or neg.busy:
            # The protocol alternates: one message, one answer.
            self.error(sub_id, "invalid: NEG-MSG sent before the answer to the previous message")
            return
        neg.last_active = time.monotonic()
        ne = neg.ne
        if ne.storage.n <= INLINE_RECORDS:
            t0 = time.thread_time()
            try:
                reply = ne.reconcile(query)
            except NegentropyError as exc:
                self.error(sub_id, f"invalid: negentropy message: {exc}")
                return
            self.session.governor.read_cost(time.thread_time() - t0)
            self._reply(neg, reply)
            return
        neg.busy = True
        future = asyncio.get_running_loop().run_in_executor(_executor(), _reconcile_timed, ne, query)
        future.add_done_callback(lambda fut: self._reconciled(neg, fut))

    def _reconciled(self, neg: NegSession, fut: asyncio.Future) -> None:
        neg.busy = False
        if self.open.get(neg.sub_id) is not neg or self.session.closed:
            return
        try:
            reply, spent = fut.result()
        except NegentropyError as exc:
            self.error(neg.sub_id, f"invalid: negentropy message: {exc}")
            return
        except Exception as exc:
            log.error("negentropy reconcile failed", exc_info=exc)
            self.error(neg.sub_id, "error: could not reconcile")
            return
        self.session.governor.read_cost(spent)
        neg.last_active = time.monotonic()
        self._reply(neg, reply)

    def on_close(self, msg: list) -> None:
        sub_id = self._sub_id(msg, "NEG-CLOSE", '["NEG-CLOSE", "<id>"]')
        if sub_id is not None:
            self.close(sub_id)

    def refused(self, sub_id: str) -> None:
        """A NEG-OPEN refused for want of a REQ token: it also ends the session it would replace."""
        self.error(sub_id, RATE_LIMITED_MESSAGE)

    # -- sessions --------------------------------------------------------------------------------

    def _reply(self, neg: NegSession, reply: bytes) -> None:
        self.session.send('["NEG-MSG",' + _dumps(neg.sub_id) + ',"' + reply.hex() + '"]')

    def error(self, sub_id: str, reason: str, limit: int | None = None, keep: bool = False) -> None:
        """NEG-ERR: the session is closed (NIP-77), unless `keep` (it was never open)."""
        if not keep:
            self.close(sub_id)
        msg = ["NEG-ERR", sub_id, reason] if limit is None else ["NEG-ERR", sub_id, reason, limit]
        self.session.send(_dumps(msg))

    def close(self, sub_id: str) -> None:
        neg = self.open.pop(sub_id, None)
        if neg is not None and neg.read is not None:
            neg.read.cancel()
            neg.read = None

    def close_all(self) -> None:
        """The connection ended: every session's memory goes."""
        if self.open:
            log.debug("negentropy: %d session(s) closed with their connection", len(self.open))
        for sub_id in list(self.open):
            self.close(sub_id)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._timer is None and self.open:
            delay = self.session.settings.negentropy_idle_timeout
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        """Sessions without a message for negentropy_idle_timeout seconds are closed (NIP-77
        `closed:`); those still being read or answered are not idle."""
        self._timer = None
        if self.session.closed:
            return
        idle = self.session.settings.negentropy_idle_timeout
        now = time.monotonic()
        for neg in list(self.open.values()):
            if neg.read is None and not neg.busy and now - neg.last_active >= idle:
                self.error(neg.sub_id, f"closed: no negentropy message for {idle:g} s; send NEG-OPEN again")
        if self.open:
            # Next when the longest idle session would lapse (one being read or answered: a full
            # timeout from now, it is not idle).
            waiting = [neg.last_active for neg in self.open.values() if neg.read is None and not neg.busy]
            delay = min(waiting) + idle - now if waiting else idle
            self._timer = asyncio.get_running_loop().call_later(max(0.05, delay), self._expire)

    def _sub_id(self, msg: list, verb: str, usage: str) -> str | None:
        if len(msg) < 2 or not isinstance(msg[1], str):
            self.session.notice(f"invalid: {verb} takes {usage}")
            return None
        sub_id = msg[1]
        if not sub_id or len(sub_id) > MAX_SUB_ID_LENGTH:
            self.session.notice(f"invalid: subscription id must be 1 to {MAX_SUB_ID_LENGTH} characters")
            return None
        return sub_id


def _payload(value) -> bytes | None:
    """A NIP-77 message: lowercase hex of at least the version byte."""
    if not isinstance(value, str) or not value or not _HEX(value):
        return None
    return bytes.fromhex(value)


def _reconcile_timed(ne: Negentropy, query: bytes) -> tuple[bytes, float]:
    t0 = time.thread_time()
    reply = ne.reconcile(query)
    return reply, time.thread_time() - t0


# -- the verbs ------------------------------------------------------------------------------------


def sessions(session: "Session") -> Negentropies:
    """The connection's negentropy sessions, made at its first NEG message (released at its end)."""
    neg = session.negentropy
    if neg is None:
        neg = session.negentropy = Negentropies(session)
        session.at_end.append(neg.close_all)
    return neg


def on_neg_open(session: "Session", msg: list, admitted: bool = False) -> None:
    sessions(session).on_open(msg, admitted)


def on_neg_msg(session: "Session", msg: list, _admitted: bool = False) -> None:
    sessions(session).on_msg(msg)


def on_neg_close(session: "Session", msg: list, _admitted: bool = False) -> None:
    if session.negentropy is not None:  # no session was ever opened: nothing to close
        session.negentropy.on_close(msg)


def refused_open(session: "Session", sub_id: str) -> None:
    sessions(session).refused(sub_id)


def stopping_open(session: "Session", msg: list) -> None:
    """A NEG-OPEN while the relay stops: NEG-ERR, nothing read."""
    if len(msg) >= 2 and isinstance(msg[1], str) and 0 < len(msg[1]) <= MAX_SUB_ID_LENGTH:
        session.send(_dumps(["NEG-ERR", msg[1], STOPPING_MESSAGE]))


# A NEG-OPEN reads like a REQ: it costs a REQ token (a client waiting for its answer is held until
# the token comes; one that pipelines past its budget is refused), and its reads' CPU is charged.
NEG_OPEN = Verb(on_neg_open, metered=True, refused=refused_open, stopping=stopping_open)
NEG_MSG = Verb(on_neg_msg)
NEG_CLOSE = Verb(on_neg_close)
