"""Hypothesis settings for the fuzz tests: a short run in the default suite, a long one on demand.

`pytest -m fuzz --fuzz-scale 50` (or `FUZZ_SCALE=50 pytest -m fuzz`) multiplies every fuzz test's
example count by 50; the default scale is 1, sized so the whole suite stays quick."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALE = float(os.environ.get("FUZZ_SCALE", "1") or 1)  # replaced by --fuzz-scale in pytest_configure


def fuzz(max_examples: int, **kw) -> settings:
    """Settings for a fuzz test: `max_examples` at scale 1, no deadline (the machine is shared)."""
    kw.setdefault("suppress_health_check", [HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                            HealthCheck.data_too_large, HealthCheck.filter_too_much])
    return settings(max_examples=max(1, int(max_examples * SCALE)), deadline=None, **kw)
