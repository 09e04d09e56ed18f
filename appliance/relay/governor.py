"""One connection's rate governor: its token buckets, its address's, and when to read it again.

A message that finds a bucket empty is refused (`rate-limited:`) and the connection is read no
faster than the bucket refills: a flood waits in the client's own socket (TCP backpressure)
instead of costing the relay a parse and a refusal per message. A client that waits for each
answer (paging through history) is held until its token comes, never refused. The buckets
themselves are in `appliance.relay.limits`.
"""

from __future__ import annotations

import logging
import time

from appliance.relay.limits import ClientBudget, TokenBucket

log = logging.getLogger("appliance.relay")

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
# ... and once refused, a connection is read again when the bucket that refused it holds this many
# seconds of its refill (at most its burst), not one token: a flood is served in batches that share
# commits, wake-ups and writes: docs/performance.md#refusal_batch_seconds
REFUSAL_BATCH_SECONDS = 0.1
# A REQ/COUNT token buys this much CPU time of its query; a query that takes more costs one token
# more for each further share, paid from the same buckets (they may go into debt, and the
# connection is then read no faster than they refill). So the req_rate settings bound the database
# time a client takes, not only its message count: 16-filter COUNTs over a large store cost many
# tokens each, a page of 500 events one.
DEFAULT_READ_SECONDS_PER_TOKEN = 0.005

WAIT, REFUSED = "wait", "refused"  # outcomes of `req_token` other than taken (None)


class Governor:
    """The buckets of one connection (`session`) and its reading schedule (`resume_at`)."""

    def __init__(self, session, settings):
        self.session = session
        s = settings
        self.event_bucket = TokenBucket(s.event_rate, s.event_burst)
        self.req_bucket = TokenBucket(s.req_rate, s.req_burst)
        # Garbage floods: every message costs a token here. Twice the sum of the per-verb rates,
        # so it only bites on messages that no per-verb bucket accounts for; off if either is off.
        flood_rate = 0 if s.event_rate == 0 or s.req_rate == 0 else 2 * (s.event_rate + s.req_rate)
        self.message_bucket = TokenBucket(flood_rate, s.event_burst + s.req_burst)
        self.receive_bucket = TokenBucket(s.receive_rate, s.receive_burst)
        # The buckets this connection shares with every other from its client address (set by
        # `join` unless the address is exempt, see the loopback_exempt setting).
        self.budget: ClientBudget | None = None
        self.resume_at = 0.0  # the receive loop reads nothing more before this (time.monotonic)
        self.refusals = 0
        self.refusals_since = time.monotonic()

    def join(self, budget: ClientBudget) -> None:
        """Share `budget`, the buckets of this connection's address. A new connection has no more
        to spend than its address has left: reconnecting (after a flood backoff, say) does not
        refill the connection's own buckets either."""
        self.budget = budget
        for mine, shared in ((self.event_bucket, budget.event), (self.req_bucket, budget.req),
                             (self.message_bucket, budget.message)):
            mine.cap_at(shared)

    def received(self, n: int) -> None:
        """n characters received: they only slow the reading down (what was sent is handled)."""
        delay = self.receive_bucket.charge(n)
        budget = self.budget
        if budget is not None:
            delay = max(delay, budget.received.charge(n))
        if delay:
            self.pause(delay)

    def take_message(self) -> bool:
        """Any message's token (garbage floods): False without one (the caller answers, then
        calls `refused_message`)."""
        budget = self.budget
        return not self._take(self.message_bucket, budget.message if budget is not None else None)

    def refused_message(self) -> None:
        budget = self.budget
        self.refused(self.message_bucket, budget.message if budget is not None else None)

    def take_event(self) -> bool:
        """An EVENT's token: False without one (the caller answers, then calls `refused_event`)."""
        budget = self.budget
        return not self._take(self.event_bucket, budget.event if budget is not None else None)

    def refused_event(self) -> None:
        budget = self.budget
        self.refused(self.event_bucket, budget.event if budget is not None else None)

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
            session = self.session
            session.drop(1008, "flooding", notice="rate-limited: too many refused messages; closing")
            barred = session.relay.peers.flooded(session.peer_ip)
            if self.budget is not None:
                self.budget.exhaust(barred)
            log.info("closed a flooding connection origin=%s barred_seconds=%g", session.origin.origin, barred)

    def pause(self, seconds: float) -> None:
        """Read nothing more from this connection for `seconds` (at most DEFAULT_MAX_PAUSE)."""
        until = time.monotonic() + min(seconds, DEFAULT_MAX_PAUSE)
        if until > self.resume_at:
            self.resume_at = until

    @staticmethod
    def _take(mine: TokenBucket, shared: TokenBucket | None) -> float:
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

    def req_token(self, pipelined: bool) -> str | None:
        """Spend a REQ/COUNT token: None when spent. Without one, a client that waits for this
        answer before sending more (not `pipelined`: paging through history) is held until the
        token comes (WAIT: the caller handles the message again then), not refused; one that
        pipelines is refused (REFUSED, `refused` called: the caller sends CLOSED).

        A held message that still finds no token when handled again is held again, for as long
        as the client sends nothing more: its wake-up may come a little before the token (the
        event loop's timers run early by up to a millisecond or so, more on a busy machine), or
        another connection from its address may have taken the token first. Only a client that
        sent more meanwhile is refused."""
        budget = self.budget
        shared = budget.req if budget is not None else None
        wait = self._take(self.req_bucket, shared)
        if not wait:
            return None
        if not pipelined:
            self.pause(wait + 0.001)
            return WAIT
        self.refused(self.req_bucket, shared)
        return REFUSED
