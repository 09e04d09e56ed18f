"""Races between the loop and a thread, made to show within a few hundred tries."""

from __future__ import annotations

import asyncio
import sys
from contextlib import contextmanager


@contextmanager
def thread_switches_often():
    """A thread switch between nearly any two bytecodes, the interpreter's own setting restored
    after."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


async def churn_groups(state, origin: int, *, private: bool = False) -> None:
    """Groups created and deleted by events, applied on the loop (`GroupState.put`), until
    cancelled."""
    from appliance.relay.groups import Group

    n = 0
    while True:
        n += 1
        state.put(origin, f"live-{n}", Group(f"live-{n}", private=private))
        state.put(origin, f"live-{n - 1}", None)
        await asyncio.sleep(0)
