"""Rate limits: token buckets per connection and per client address.

A connection spends tokens from its own buckets and from its client address's (`ClientBudgets`:
every connection from one address shares them), so reconnecting or opening more connections buys
no new budget. What the relay does when a bucket is empty is in `appliance.relay.governor`: refuse
with `rate-limited:` and read that connection no faster than its budget refills.
"""

from __future__ import annotations

import time

# Idle address records (no connection open) are forgotten once their buckets would be full again
# anyway; the sweep that finds them runs at most this often.
PRUNE_INTERVAL = 30.0


class TokenBucket:
    """A classic token bucket; rate 0 means unlimited. `charge` may run it into debt."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float):
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, n: float = 1.0) -> bool:
        if self.rate <= 0:
            return True
        self._refill(time.monotonic())
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def wait(self, n: float = 1.0) -> float:
        """Seconds until `n` tokens are there (0: now)."""
        if self.rate <= 0:
            return 0.0
        self._refill(time.monotonic())
        return max(0.0, (n - self.tokens) / self.rate)

    def batch(self, seconds: float) -> float:
        """Tokens in `seconds` of its refill: at least one, at most its burst (0 when unlimited)."""
        return min(self.burst, max(1.0, self.rate * seconds)) if self.rate > 0 else 0.0

    def wait_for_batch(self, seconds: float) -> float:
        """Seconds until the bucket holds `batch(seconds)` tokens (0: now)."""
        if self.rate <= 0:
            return 0.0
        return self.wait(self.batch(seconds))

    def charge(self, n: float) -> float:
        """Take `n` tokens whatever is left; the seconds until the bucket is out of debt (0: not in debt)."""
        if self.rate <= 0:
            return 0.0
        self._refill(time.monotonic())
        self.tokens -= n
        return max(0.0, -self.tokens / self.rate)

    def cap_at(self, other: "TokenBucket") -> None:
        """Hold no more tokens than `other` has (none when it is in debt)."""
        if self.rate > 0 and other.rate > 0:
            other.take(0)  # brought up to date
            self.tokens = min(self.tokens, max(other.tokens, 0.0))

    def full_at(self) -> float:
        """When (time.monotonic) the bucket is full again if nothing more is taken."""
        if self.rate <= 0:
            return 0.0
        return self.stamp + max(0.0, self.burst - self.tokens) / self.rate


class ClientBudget:
    """The buckets one client address's connections share."""

    __slots__ = ("address", "event", "req", "message", "received", "sessions", "__weakref__")

    def __init__(self, address: str, settings):
        s = settings
        self.address = address
        self.event = TokenBucket(s.ip_event_rate, s.ip_event_burst)
        self.req = TokenBucket(s.ip_req_rate, s.ip_req_burst)
        # Every message costs a token here too (garbage, CLOSEs): twice the sum of the verb rates,
        # as per connection (see Session), so only messages no verb bucket counts meet it.
        both = s.ip_event_rate and s.ip_req_rate
        self.message = TokenBucket(2 * (s.ip_event_rate + s.ip_req_rate) if both else 0,
                                   s.ip_event_burst + s.ip_req_burst)
        self.received = TokenBucket(s.receive_rate, s.receive_burst)
        self.sessions = 0

    def exhaust(self, seconds: float) -> None:
        """Its connection was closed for flooding and it may not connect for `seconds`: its next
        connection starts with nothing to spend (the budget does not refill while it waits)."""
        for bucket in (self.event, self.req, self.message):
            if bucket.rate > 0:
                bucket.take(0)  # brought up to date
                bucket.tokens = min(bucket.tokens, 0.0) - bucket.rate * seconds

    def idle_and_full(self, now: float) -> bool:
        return self.sessions == 0 and all(b.full_at() <= now for b in (self.event, self.req, self.message,
                                                                        self.received))


class ClientBudgets:
    """The per-address buckets of the connections open now (and of addresses that left recently
    with their budget spent: a reconnect finds it as it was left)."""

    def __init__(self, settings):
        self.settings = settings
        self.by_address: dict[str, ClientBudget] = {}
        self._pruned = time.monotonic()

    def join(self, address: str) -> ClientBudget:
        now = time.monotonic()
        if now - self._pruned > PRUNE_INTERVAL:
            self._pruned = now
            for key in [k for k, b in self.by_address.items() if b.idle_and_full(now)]:
                del self.by_address[key]
        budget = self.by_address.get(address)
        if budget is None:
            budget = self.by_address[address] = ClientBudget(address, self.settings)
        budget.sessions += 1
        return budget

    def leave(self, budget: ClientBudget) -> None:
        budget.sessions -= 1
        if budget.idle_and_full(time.monotonic()):
            self.by_address.pop(budget.address, None)
