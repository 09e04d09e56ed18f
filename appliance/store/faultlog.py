"""A failure that repeats, logged without flooding the log.

A full disk fails every commit, every WAL checkpoint and every wake delivery cycle, each about
once a second, for as long as it lasts. `FaultLog` turns that into three kinds of lines: the first
failure with its cause, then at most one line a minute saying how many more there were, and one
line once the work has gone on succeeding for a while (`settle`: at the edge of a full disk some
writes fit and some do not, and that is one outage, not many). A failure of another kind
(another exception class) is news: it is logged in full at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

# One line a minute while a failure lasts: enough to see it is still there, a few hundred
# lines a day at most rather than one a second.
DEFAULT_REPEAT_EVERY = 60.0
# Seconds of successes, without a failure, before the work counts as working again.
DEFAULT_SETTLE = 10.0


class FaultLog:
    """The log lines of one kind of work (`what`) that may fail over and over; thread-safe."""

    def __init__(self, logger: logging.Logger, what: str, *, every: float = DEFAULT_REPEAT_EVERY,
                 settle: float = DEFAULT_SETTLE, level: int = logging.ERROR,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.what = what
        self.every = every
        self.settle = settle
        self.level = level
        self.clock = clock
        self._lock = threading.Lock()
        self._kind: type | None = None  # the exception class failing now; None: working
        self._since = 0.0
        self._last_line = 0.0
        self._failures = 0  # since it started failing
        self._unlogged = 0  # since the last line
        self._ok_since: float | None = None  # succeeding again since, with no failure after

    @property
    def failing(self) -> bool:
        return self._kind is not None

    def failed(self, exc: BaseException | str, *, note: str = "", traceback: bool = False) -> None:
        """One more failure: a line for the first (with `note`, and the exception's traceback if
        `traceback`), then one a minute with the count; `exc` may be a message (SQLite's error log)."""
        now = self.clock()
        kind = type(exc) if isinstance(exc, BaseException) else str
        exc_info = exc if traceback and isinstance(exc, BaseException) else None
        with self._lock:
            self._ok_since = None
            if self._kind is not kind:
                self._kind, self._since, self._last_line = kind, now, now
                self._failures, self._unlogged = 1, 0
                line = f"{self.what} failed{f' ({note})' if note else ''}: {exc}"
            else:
                self._failures += 1
                self._unlogged += 1
                if now - self._last_line < self.every:
                    return
                line = (f"{self.what} still failing: {self._unlogged} more failure(s) in the last "
                        f"{now - self._last_line:.0f} s, {self._failures} in {now - self._since:.0f} s: {exc}")
                self._last_line, self._unlogged, exc_info = now, 0, None
        self.logger.log(self.level, "%s", line, exc_info=exc_info)

    def recovered(self) -> None:
        """The work succeeded: one line once it has gone on succeeding for `settle` seconds."""
        if self._kind is None:  # the common case, without the lock
            return
        now = self.clock()
        with self._lock:
            if self._kind is None:
                return
            if self._ok_since is None:
                self._ok_since = now
                return
            if now - self._ok_since < self.settle:
                return
            failures, lasted = self._failures, self._ok_since - self._since
            self._kind = self._ok_since = None
        self.logger.warning("%s works again, after %.0f s and %d failure(s)", self.what, lasted, failures)
