"""Stateless lease validation (NIP-PL steps 2-7) in a worker process, a batch at a time.

Checking a lease is pure Python (signature, NIP-44, strict JSON, filter grammar) that would cap
acceptance on the event loop (docs/performance.md#lease-checks-in-a-worker-process). The checks
need no database, so they run in a separate process: the loop keeps step 1 (authentication),
hands over the event, the descriptor and the conversation key for the named executor key, and
gets back the accepted lease or the refusal. Private keys never leave the main process.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any

from appliance.children import watch_parent
from appliance.nostr import nip44
from appliance.nostr.event import verify_event
from appliance.push.acceptance import check_lease_stateless
from appliance.push.errors import LeaseRejected

log = logging.getLogger("appliance.push")

# Leases handed to the worker in one message: amortises the pickling round trip.
BATCH = 64


def validate(ev: Any, authed: str, descriptor: Any, keys: dict[str, bytes], now: int) -> tuple[str, Any]:
    """Steps 2-7 without state: ("ok", AcceptedLease) or ("rejected", OK message)."""

    def decrypt(key_id: str, content: str) -> str:
        ck = keys.get(key_id)
        if ck is None:
            raise KeyError(key_id)
        try:
            return nip44.decrypt(content, ck)
        except nip44.Nip44Error as exc:
            raise ValueError(str(exc)) from None

    try:
        lease = check_lease_stateless(ev, authed_pubkey=authed, descriptor=descriptor, decrypt=decrypt, now=now,
                                      verify=verify_event)
    except LeaseRejected as exc:
        return ("rejected", exc.message)
    # The raw (read-only mapping) subscriptions served step 7 and cannot cross a process boundary.
    return ("ok", replace(lease, plaintext=replace(lease.plaintext, raw_subscriptions=())))


def _validate_batch(jobs: list[tuple]) -> list[tuple[str, Any]]:
    return [validate(*job) for job in jobs]


class LeaseValidator:
    """Runs `validate` in worker processes (or inline with workers=0), batching what arrives together."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._pending: list[tuple[tuple, asyncio.Future]] = []
        self._scheduled = False
        self._closed = False

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    async def validate(self, *job) -> tuple[str, Any]:
        if self.workers == 0:
            return validate(*job)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((job, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush, loop)
        return await fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        pending, self._pending, self._scheduled = self._pending, [], False
        for start in range(0, len(pending), BATCH):
            self._submit(loop, pending[start : start + BATCH], retries=1)

    def _current_pool(self) -> ProcessPoolExecutor:
        if self._closed:
            raise RuntimeError("the lease validator is shut down")
        if self._pool is None:
            # spawn: the parent has threads (writer, readers), which fork would copy mid-state.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=watch_parent, initargs=(os.getpid(),))
        return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """Forget a broken pool (a worker died: OOM killer, a signal); the next batch starts a new one."""
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, loop: asyncio.AbstractEventLoop, chunk: list, retries: int) -> None:
        """Hand one batch to the pool. A batch caught by a dying worker is retried once on a fresh
        pool, then refused (its leases get an `error:` OK): every lease gets an answer."""
        try:
            pool = self._current_pool()
        except Exception as exc:  # shut down, or no process could be started (EMFILE, ENOMEM)
            _fail(chunk, exc)
            return
        try:
            job = loop.run_in_executor(pool, _validate_batch, [j for j, _ in chunk])
        except BrokenProcessPool as exc:
            self._discard(pool)
            if retries:
                log.warning("lease worker pool was broken; starting a new one")
                self._submit(loop, chunk, retries - 1)
            else:
                _fail(chunk, exc)
            return
        except Exception as exc:
            _fail(chunk, exc)
            return

        def settle(done: asyncio.Future) -> None:
            if not done.cancelled() and isinstance(done.exception(), BrokenProcessPool):
                self._discard(pool)
                if retries:
                    log.warning("a lease worker died; retrying its batch of %d on a new one", len(chunk))
                    self._submit(loop, chunk, retries - 1)
                    return
            _settle(done, chunk)

        job.add_done_callback(settle)


def _fail(chunk: list, exc: BaseException) -> None:
    for _job, fut in chunk:
        if not fut.done():
            fut.set_exception(exc)


def _settle(done: asyncio.Future, chunk: list) -> None:
    exc = asyncio.CancelledError() if done.cancelled() else done.exception()
    if exc is not None:
        _fail(chunk, exc)
        return
    results = done.result()
    for i, (_job, fut) in enumerate(chunk):
        if not fut.done():
            fut.set_result(results[i])
