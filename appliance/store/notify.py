"""The node bus: how several appliance processes over one database tell each other what they
committed (docs/scaling.md).

`LocalBus` is the single-node bus (SQLite, or one node on PostgreSQL that wants no fan-out): it
sends nothing and hears nothing. `PgBus` uses PostgreSQL LISTEN/NOTIFY on one channel:

- `announce(conn, payload)` runs inside the writer transaction that commits what it announces
  (`SELECT pg_notify(...)`): PostgreSQL delivers a transaction's notifications at its commit, in
  the order they were sent, and never those of a transaction that rolled back. So a node never
  announces what it did not commit, and a node that dies after its commit still announces it.
- `send(payload)` announces something that has no transaction (an ephemeral event), on a
  connection of its own.
- `run(deliver, connected)` LISTENs on an AsyncConnection on the event loop and hands every payload
  to `deliver`, one at a time, in order. It reconnects with backoff after the connection broke,
  and calls `connected()` after every (re)connection: notifications sent while it was away are
  lost (NOTIFY is not durable), so the caller reloads what it mirrors in memory there.

Payloads are text below PostgreSQL's 8000-byte limit (`MAX_PAYLOAD`); what they say is the
caller's (appliance.relay.nodes). Every node hears its own notifications too: the caller tags
payloads with `node_id` and ignores its own.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING, Awaitable, Callable

from appliance.store.statement import PgText

if TYPE_CHECKING:
    from appliance.store.interface import Store

log = logging.getLogger("appliance.store")

CHANNEL = "appliance_events"
# PostgreSQL refuses a NOTIFY payload of 8000 bytes or more (in the server encoding, UTF-8 here).
MAX_PAYLOAD = 7999
SQL_NOTIFY = PgText("SELECT pg_notify(%s, %s)")
# Reconnection backoff of the listener: from the first to the last pause, doubling.
DEFAULT_BACKOFF_FIRST = 0.1
DEFAULT_BACKOFF_MAX = 5.0

Deliver = Callable[[str], Awaitable[None]]
Connected = Callable[[], Awaitable[None]]


def fits(payload: str) -> bool:
    """Whether `payload` is small enough for one notification."""
    return len(payload) <= MAX_PAYLOAD // 4 or len(payload.encode()) <= MAX_PAYLOAD


class LocalBus:
    """One node: nothing to tell anyone."""

    multi_node = False

    def __init__(self) -> None:
        self.node_id = secrets.token_hex(6)

    def announce(self, conn, payload: str) -> None:
        pass

    async def send(self, payload: str) -> None:
        pass

    async def run(self, deliver: Deliver, connected: Connected) -> None:
        pass

    async def aclose(self) -> None:
        pass


class PgBus:
    """LISTEN/NOTIFY on the store's PostgreSQL database (see the module docstring)."""

    multi_node = True

    def __init__(self, dsn: str, *, channel: str = CHANNEL, backoff_first: float = DEFAULT_BACKOFF_FIRST,
                 backoff_max: float = DEFAULT_BACKOFF_MAX) -> None:
        self.dsn = dsn
        self.channel = channel
        self.node_id = secrets.token_hex(6)
        self.backoff_first = backoff_first
        self.backoff_max = backoff_max
        self._sender = None  # psycopg.AsyncConnection for `send`, opened on first use
        self._send_lock = asyncio.Lock()
        self._listener = None
        self.connects = 0  # listener (re)connections so far
        self.listening = asyncio.Event()

    def announce(self, conn, payload: str) -> None:
        """NOTIFY inside the caller's write transaction (delivered at its commit)."""
        conn.execute(SQL_NOTIFY, (self.channel, payload))

    async def send(self, payload: str) -> None:
        """NOTIFY now, outside any transaction; a failure is logged, never raised (the sender's
        own node has what it sent)."""
        from appliance.store.postgres import psycopg

        async with self._send_lock:
            for attempt in (1, 2):
                try:
                    if self._sender is None or self._sender.closed or self._sender.broken:
                        self._sender = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                    await self._sender.execute(SQL_NOTIFY, (self.channel, payload))
                    return
                except psycopg.Error as exc:
                    if self._sender is not None:
                        await self._sender.close()
                    self._sender = None
                    if attempt == 2:
                        log.warning("node bus: a notification was not sent (%s)", exc.__class__.__name__)

    async def run(self, deliver: Deliver, connected: Connected) -> None:
        """LISTEN until cancelled (see the module docstring)."""
        from appliance.store.postgres import psycopg

        pause = self.backoff_first
        queue: asyncio.Queue[str] = asyncio.Queue()
        worker = asyncio.create_task(self._deliver_all(queue, deliver))
        try:
            while True:
                try:
                    conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                except psycopg.Error as exc:
                    log.warning("node bus: cannot reach the database (%s); retrying in %.1f s",
                                exc.__class__.__name__, pause)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, self.backoff_max)
                    continue
                self._listener = conn
                try:
                    await conn.execute(f'LISTEN "{self.channel}"')
                    self.connects += 1
                    if self.connects > 1:
                        log.info("node bus: listening again (reconnection %d)", self.connects - 1)
                    # Whatever was announced while not listening is lost: the caller catches up.
                    try:
                        await connected()
                    except Exception:
                        log.exception("node bus: catching up after (re)connecting failed")
                    self.listening.set()
                    pause = self.backoff_first
                    async for note in conn.notifies():
                        queue.put_nowait(note.payload)
                except psycopg.Error as exc:
                    self.listening.clear()
                    log.warning("node bus: the listening connection broke (%s); reconnecting in %.1f s",
                                exc.__class__.__name__, pause)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, self.backoff_max)
                finally:
                    self._listener = None
                    try:
                        await conn.close()
                    except Exception:
                        pass
        finally:
            self.listening.clear()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

    @staticmethod
    async def _deliver_all(queue: "asyncio.Queue[str]", deliver: Deliver) -> None:
        while True:
            payload = await queue.get()
            try:
                await deliver(payload)
            except Exception:
                log.exception("node bus: handling a notification failed")

    async def aclose(self) -> None:
        if self._sender is not None:
            await self._sender.close()
            self._sender = None


def make_bus(store: Store) -> LocalBus | PgBus:
    """The node bus for this store: LISTEN/NOTIFY on PostgreSQL (every node over one database
    hears the others), nothing on SQLite (one node by construction)."""
    if store.dsn is not None:
        return PgBus(store.dsn)
    return LocalBus()
