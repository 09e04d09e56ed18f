"""REQ and CLOSE (NIP-01), COUNT (NIP-45): subscriptions, their stored answers, counts."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from appliance.nostr.filters import Filter, InvalidFilter, only_searchable, parse_filter
from appliance.relay.authz import AUTHOR_ONLY_KINDS, GATED_KINDS, may_enter
from appliance.front.frames import Frames, frame_chunks
from appliance.relay.governor import REFUSED, WAIT
from appliance.relay.relay import HELD
from appliance.relay.subscriptions import Subscription
from appliance.relay.verbs.base import MAX_SUB_ID_LENGTH, Verb, dumps, refuse_subscription_stopping
from appliance.store.interface import QueryTimeout

if TYPE_CHECKING:
    from appliance.relay.session import Session

log = logging.getLogger("appliance.relay")

# COUNTs one connection may have waiting for an answer. At the cap its receive loop stops reading
# (TCP backpressure), as for EVENTs: a pipelined flood of COUNTs queues in the client's socket, not
# as tasks here. (REQs are bounded already: one query per open subscription.)
DEFAULT_MAX_PENDING_COUNTS = 32
# Several nodes: an event another node committed can be in a REQ's stored answer before its
# notification reaches this node; no id of the answer, however large, is sent again to that
# subscription when it does, for this many seconds (far longer than a notification takes). The ids
# are held that long, then dropped: at most the ids of the answers sent in the last few seconds.
REMOTE_SKIP_SECONDS = 5.0
QUERY_TIMEOUT_MESSAGE = "error: this query takes too long here; narrow its filters or lower its limit"
RATE_LIMITED_MESSAGE = "rate-limited: too many requests, slow down"


def parse_filters(session: "Session", raw_filters: list) -> list[Filter]:
    s = session.settings
    if not raw_filters:
        raise InvalidFilter("at least one filter is required")
    if len(raw_filters) > s.max_filters:
        raise InvalidFilter(f"too many filters (max {s.max_filters})")
    return [parse_filter(f, max_values=s.max_filter_values, max_limit=s.max_limit) for f in raw_filters]


def gate(session: "Session", filters: list[Filter]) -> str | None:
    """Why this reader may not run these filters at all, or None."""
    origin, reader = session.origin, session.reader
    if not may_enter(origin, reader):
        if reader is None:
            return "auth-required: this community is for members; authenticate first"
        return "restricted: you are not a member of this community"
    if reader is None:
        if origin.auth_required:
            return "auth-required: authenticate first"
        private = GATED_KINDS | AUTHOR_ONLY_KINDS
        for f in filters:
            if f.kinds is not None and f.kinds & private:
                return "auth-required: direct messages, gift wraps and push leases need authentication"
    return None


def subscription_arguments(session: "Session", msg: list, verb: str,
                           admitted: bool = False) -> tuple[str, list[Filter] | None] | None:
    """(subscription id, filters) of a REQ/COUNT; filters None once refused with CLOSED; None
    when the message has no usable subscription id (NOTICE sent) or waits for its token.
    `admitted`: its token is spent already."""
    if len(msg) < 2 or not isinstance(msg[1], str):
        session.notice(f'invalid: {verb} needs a subscription id: ["{verb}", "<id>", {{...}}]')
        return None
    sub_id = msg[1]
    if not sub_id or len(sub_id) > MAX_SUB_ID_LENGTH:
        session.notice(f"invalid: subscription id must be 1 to {MAX_SUB_ID_LENGTH} characters")
        return None
    if not admitted:
        outcome = session.req_token()
        if outcome is WAIT:
            return None
        if outcome is REFUSED:
            session.closed_msg(sub_id, RATE_LIMITED_MESSAGE)
            return sub_id, None
    try:
        filters = parse_filters(session, msg[2:])
    except InvalidFilter as exc:
        session.closed_msg(sub_id, f"invalid: {exc.reason}")
        return sub_id, None
    refusal = gate(session, filters)
    if refusal is not None:
        session.closed_msg(sub_id, refusal)
        return sub_id, None
    # NIP-50: a search selects only the kinds indexed, stored or live (after the gate, which
    # judges the kinds the client asked for).
    search_kinds = session.settings.search_kinds
    return sub_id, [only_searchable(f, search_kinds) for f in filters]


# -- COUNT ----------------------------------------------------------------------------------------


def on_count(session: "Session", msg: list, admitted: bool = False) -> None:
    args = subscription_arguments(session, msg, "COUNT", admitted)
    if args is None or args[1] is None:
        return
    sub_id, filters = args

    def done(n, exc):  # on the loop, always after start_count has returned
        _answer_count(session, handle, sub_id, n, exc)

    # No task or future: the store calls back (see Relay.start_count).
    handle = session.relay.start_count(session.origin, session.reader, filters, owner=session,
                                       cost=session.governor.read_cost, done=done)
    session.counts.add(handle)


def _answer_count(session: "Session", handle, sub_id: str, n, exc: BaseException | None) -> None:
    """On the loop, once a COUNT is counted: its answer, and room for the next COUNT."""
    counts = session.counts
    counts.discard(handle)
    if len(counts) < DEFAULT_MAX_PENDING_COUNTS:
        session.wake()
    if exc is None:
        session.send(dumps(["COUNT", sub_id, {"count": n}]))
    elif isinstance(exc, QueryTimeout):
        session.closed_msg(sub_id, QUERY_TIMEOUT_MESSAGE)
    else:
        log.error("count failed", exc_info=exc)
        session.closed_msg(sub_id, "error: count failed")


def refused_count(session: "Session", sub_id: str) -> None:
    """A COUNT refused for want of a token."""
    session.closed_msg(sub_id, RATE_LIMITED_MESSAGE)


# -- REQ ------------------------------------------------------------------------------------------


def on_req(session: "Session", msg: list, admitted: bool = False) -> None:
    """Open (or replace) a subscription at once, in message order; its stored events follow.

    Registration is synchronous so a CLOSE or another REQ with the same id that arrives next
    always finds it, and nothing is registered once the connection is gone."""
    args = subscription_arguments(session, msg, "REQ", admitted)
    if args is None:
        return
    sub_id, filters = args
    # A REQ replaces the subscription of the same id; a refused one (CLOSED sent) ends it.
    end_subscription(session, sub_id)
    if filters is None:
        return
    max_subscriptions = session.settings.max_subscriptions
    if len(session.subs) >= max_subscriptions:
        session.closed_msg(sub_id, f"error: too many open subscriptions (max {max_subscriptions})")
        return
    # Register before querying so nothing committed meanwhile is missed (duplicates are fine).
    sub = Subscription(session, sub_id, filters, held=[], received=session.received_at)
    session.subs[sub_id] = sub
    session.relay.index_for(session.origin).add(sub)
    _query(session, sub)


class _Held:
    """The handle of a REQ's read held until its connection reads what it was sent."""

    def cancel(self) -> None:
        pass


def _query(session: "Session", sub: Subscription) -> None:
    """Start the read of `sub`'s stored answer; held while the connection has too much unread
    (the readers produce nothing more for it until it reads, see `Output.full`)."""
    if session.subs.get(sub.sub_id) is not sub or session.closed:
        return  # closed or replaced meanwhile
    output = session.output
    subs = session.subs
    output.forget_unwanted(lambda other: subs.get(other.sub_id) is other)
    relay = session.relay
    reserve = relay.read_reserve(sub.filters)
    if output.over_budget():
        session.queries[sub.sub_id] = _Held()
        session.hold_read(lambda: _query(session, sub), reserve // 2)
        return
    if not relay.has_room(reserve):
        if relay.queued_bytes + reserve // 2 > relay.max_output_total:
            # Unread output is what fills the budget: the connections with the most of it go
            # (max_output_buffer_total), this one too if it is one of them.
            relay.shed_output(reserve // 2, output)
            if session.closed:
                return
        if not relay.has_room(reserve):  # answers being built fill it: wait until they are queued
            session.queries[sub.sub_id] = _Held()
            relay.wait_for_room(reserve, lambda: _query(session, sub), output)
            return
    raw_frames = session.writer.raw_frames
    renderer = answer_renderer(sub.sub_id, raw_frames)

    def render(rows: list) -> tuple:  # on the reader thread
        answer = renderer(rows)
        messages = answer[0]
        # (Asked under the output's lock: a CLOSE just after a check here would leave it counted.)
        output.building(sub, len(messages) if type(messages) is Frames else sum(map(len, messages)),
                        lambda: subs.get(sub.sub_id) is sub)
        return answer

    session.queries[sub.sub_id] = relay.start_query(
        session.origin, session.reader, sub.filters, owner=session, raw_bytes=raw_frames,
        cost=session.governor.read_cost, render=render, hold=output.over_budget,
        done=lambda answer, exc: _answer_ready(session, sub, answer, exc))


def _answer_ready(session: "Session", sub: Subscription, answer, exc: BaseException | None) -> None:
    """On the loop, once a REQ's stored answer is read and rendered: send it and its EOSE, then
    the live events held meanwhile."""
    sub_id = sub.sub_id
    session.output.built(sub)
    if session.subs.get(sub_id) is not sub:
        return  # closed or replaced meanwhile: its answer is not wanted
    if answer is HELD:  # no room for its answer when the read came to run: it waits for some
        retry = lambda: _query(session, sub)  # noqa: E731
        reserve = session.relay.read_reserve(sub.filters)
        session.queries[sub_id] = _Held()
        if session.output.over_budget():
            session.hold_read(retry, reserve // 2)  # until this client reads
        else:  # until the relay's unread output shrinks
            session.relay.wait_for_room(reserve, retry, session.output)
        return
    if exc is not None:
        timed_out = isinstance(exc, QueryTimeout)
        if not timed_out:
            log.error("query failed", exc_info=exc)
        end_subscription(session, sub_id)
        session.closed_msg(sub_id, QUERY_TIMEOUT_MESSAGE if timed_out else "error: query failed")
        return
    del session.queries[sub_id]
    messages, ids = answer
    if type(messages) is Frames:
        session.send(messages)
    else:
        for text in messages:
            session.send(text)
    relay = session.relay
    if relay.on_req_answered:
        elapsed = time.monotonic() - sub.received
        for observe in relay.on_req_answered:
            observe(session.origin, elapsed)
    held = release_held(session, sub)
    unbroadcast = relay.unbroadcast
    remote = relay.other_nodes
    if held or unbroadcast or remote:
        # Held events the stored answer already carried are not sent twice; nor are events it
        # carried whose publishers have not broadcast them yet (committed, seen by the read,
        # their broadcast still to come on this loop).
        answered = set(ids)
        for event_id, raw in held:
            if event_id not in answered:
                session.send_event(sub_id, raw)
        if answered:
            if remote:
                # Every id of the answer (those not broadcast yet among them), for a while.
                skip = answered
                sub.skip_until = time.monotonic() + REMOTE_SKIP_SECONDS
                asyncio.get_running_loop().call_later(REMOTE_SKIP_SECONDS, _lapse_skip, sub, skip)
            else:
                skip = {eid for eid in list(unbroadcast) if eid in answered}
            sub.skip = skip or None


def release_held(session: "Session", sub: Subscription) -> list[tuple[str, str]]:
    """The live events held behind `sub`'s stored answer, which from now on is out."""
    held, sub.held = sub.held or [], None
    session.held_bytes -= sum(len(raw) for _id, raw in held)
    return held


def end_subscription(session: "Session", sub_id: str) -> None:
    """Forget a subscription: out of the index, its pending query cancelled."""
    sub = session.subs.pop(sub_id, None)
    if sub is not None:
        session.relay.index_for(session.origin).remove(sub)
        release_held(session, sub)
        if session.output.built(sub):
            session.output.owed_less()  # (no write may follow to start reads held for it)
    task = session.queries.pop(sub_id, None)
    if task is not None:
        task.cancel()


def refused_req(session: "Session", sub_id: str) -> None:
    """A REQ refused for want of a token: CLOSED, and the subscription it would have replaced
    ends too."""
    end_subscription(session, sub_id)
    session.closed_msg(sub_id, RATE_LIMITED_MESSAGE)


def answer_renderer(sub_id: str, raw_frames: bool):
    """The function a reader thread turns a REQ's stored rows into its messages with (the EVENTs
    and the EOSE): one `Frames` when the connection takes raw frames (a list of them, each about
    a write piece, for a large answer), else a list of texts.
    Returns (messages, the events' ids): the rows' own bytes are let go on the reader thread."""
    sub_json = dumps(sub_id)
    if raw_frames:
        prefix = ('["EVENT",' + sub_json + ",").encode()
        eose = ('["EOSE",' + sub_json + "]").encode()

        def render(rows: list) -> tuple:
            chunks = frame_chunks(prefix, [raw for _eid, raw in rows], eose)
            return chunks[0] if len(chunks) == 1 else chunks, [eid for eid, _raw in rows]
    else:
        prefix_text = '["EVENT",' + sub_json + ","
        eose_text = '["EOSE",' + sub_json + "]"

        def render(rows: list) -> tuple:
            return [prefix_text + raw + "]" for _eid, raw in rows] + [eose_text], [eid for eid, _raw in rows]
    return render


def _lapse_skip(sub: Subscription, skip: set[str]) -> None:
    """The answer's ids of a subscription on several nodes are not held past REMOTE_SKIP_SECONDS
    (the set is dropped whether or not a live event came to check `skip_until`)."""
    if sub.skip is skip:
        sub.skip = None


# -- CLOSE ----------------------------------------------------------------------------------------


def on_close(session: "Session", msg: list, _admitted: bool = False) -> None:
    if len(msg) != 2 or not isinstance(msg[1], str):
        session.notice('invalid: CLOSE takes a subscription id: ["CLOSE", "<id>"]')
        return
    end_subscription(session, msg[1])


REQ = Verb(on_req, metered=True, refused=refused_req, stopping=refuse_subscription_stopping)
COUNT = Verb(on_count, metered=True, refused=refused_count, stopping=refuse_subscription_stopping)
CLOSE = Verb(on_close)
