"""Time series for the dashboard's charts and the metrics endpoint: the relay's counters sampled
every few seconds, kept for an hour, in memory (a restart starts them afresh)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from typing import Awaitable, Callable

from appliance.errors import Rejected

log = logging.getLogger("appliance.admin")

# Seconds between samples, and how many are kept (an hour).
DEFAULT_SAMPLE_INTERVAL = 10.0
DEFAULT_KEEP = 360
# Distinct refusal reasons counted one by one; any further reason is counted as "other". The
# relay's refusals are a fixed vocabulary, so this only bounds a surprise (labels stay bounded).
MAX_REASONS = 64

Probe = Callable[[], Awaitable[dict[str, float]]]

# Seconds between the event-loop lag watcher's ticks: often enough to catch a stall of a fraction of
# a second, rare enough to cost nothing (one timer callback).
DEFAULT_LAG_TICK = 0.25


class LoopLag:
    """How late the event loop runs a timer: each tick asks to wake `tick` seconds later and
    records how much later than that it woke. A blocked loop (a long synchronous call, a CPU
    storm) shows here before it shows anywhere else. `worst()` is the largest lag since the last
    call (the metrics endpoint reads it once per scrape), `last` the latest tick's."""

    def __init__(self, tick: float = DEFAULT_LAG_TICK):
        self.tick = tick
        self.last = 0.0
        self._worst = 0.0

    def worst(self) -> float:
        worst, self._worst = max(self._worst, self.last), 0.0
        return worst

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.tick
            await asyncio.sleep(self.tick)
            self.last = max(0.0, loop.time() - due)
            self._worst = max(self._worst, self.last)


class Recorder:
    def __init__(self, app, *, interval: float = DEFAULT_SAMPLE_INTERVAL, keep: int = DEFAULT_KEEP):
        self.app = app
        self.interval = interval
        self.samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=keep)
        # Refusals since start by (origin id, reason) and per sample interval.
        self.rejections: Counter[tuple[int, str]] = Counter()
        self.rejection_samples: deque[tuple[float, Counter[tuple[int, str]]]] = deque(maxlen=keep)
        self._pending: Counter[tuple[int, str]] = Counter()
        # More gauges, from other parts (the wake outbox's depth and wakes/s, when it exists).
        self.probes: list[Probe] = []
        self._last: tuple[float, int] | None = None

    def on_rejected(self, origin, _ev, exc: Rejected) -> None:
        key = (origin.id, exc.wire)
        if key not in self.rejections and len(self.rejections) >= MAX_REASONS:
            key = (origin.id, "other")
        self.rejections[key] += 1
        self._pending[key] += 1

    async def sample(self, now: float | None = None) -> dict[str, float]:
        now = time.time() if now is None else now
        accepted = self.app.relay.stats["accepted"]
        values: dict[str, float] = {"connections": float(len(self.app.relay.sessions))}
        if self._last is not None and now > self._last[0]:
            values["events_per_s"] = max(0, accepted - self._last[1]) / (now - self._last[0])
        else:
            values["events_per_s"] = 0.0
        self._last = (now, accepted)
        for probe in self.probes:
            try:
                values.update(await probe())
            except Exception:
                log.exception("a dashboard probe failed")
        self.samples.append((now, values))
        self.rejection_samples.append((now, self._pending))
        self._pending = Counter()
        return values

    async def run(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:
                log.exception("sampling the dashboard's counters failed")
            await asyncio.sleep(self.interval)

    def series(self, name: str) -> list[tuple[float, float]]:
        return [(t, v[name]) for t, v in self.samples if name in v]

    def latest(self, name: str, default: float = 0.0) -> float:
        for _t, values in reversed(self.samples):
            if name in values:
                return values[name]
        return default

    def rejection_series(self, origin_id: int, reason: str) -> list[tuple[float, float]]:
        return [(t, float(c.get((origin_id, reason), 0))) for t, c in self.rejection_samples]
