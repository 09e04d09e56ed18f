"""The node bus on PostgreSQL alone (appliance.store.notify.PgBus): notifications announced inside
a transaction are heard at its commit, in order, never after a rollback; a broken listening
connection comes back and says so (the caller catches up then)."""

from __future__ import annotations

import asyncio

import pytest

psycopg = pytest.importorskip("psycopg", reason="several nodes need PostgreSQL: psycopg is not installed")

from appliance.store.notify import MAX_PAYLOAD, LocalBus, PgBus, fits


class Conn:
    """The one method of the store's connection `announce` uses, over a plain psycopg connection."""

    def __init__(self, raw):
        self.raw = raw

    def execute(self, sql, params):
        return self.raw.execute(sql, params)  # announce's statement is PostgreSQL's own (a PgText)


async def _wait(cond, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_payload_limit():
    assert fits("x" * MAX_PAYLOAD)
    assert not fits("x" * (MAX_PAYLOAD + 1))
    assert not fits("é" * 4000)  # 8000 bytes in UTF-8
    assert fits("é" * 3999)


def test_local_bus_is_silent():
    bus = LocalBus()
    assert not bus.multi_node
    bus.announce(None, "anything")  # no connection needed: nothing is sent


def test_notifications_follow_commits(pg_cluster):
    url = pg_cluster.new_database()

    async def main():
        listener = PgBus(url, backoff_first=0.05)
        heard: list[str] = []
        connects: list[int] = []

        async def deliver(payload):
            heard.append(payload)

        async def connected():
            connects.append(listener.connects)

        task = asyncio.create_task(listener.run(deliver, connected))
        try:
            await asyncio.wait_for(listener.listening.wait(), 10)
            sender = PgBus(url)
            with psycopg.connect(url, autocommit=True) as raw:
                conn = Conn(raw)
                with raw.transaction():
                    sender.announce(conn, "one")
                    sender.announce(conn, "two")
                    await asyncio.sleep(0.2)
                    assert heard == []  # not before the commit
                try:
                    with raw.transaction():
                        sender.announce(conn, "rolled back")
                        raise RuntimeError("abort")
                except RuntimeError:
                    pass
                with raw.transaction():
                    sender.announce(conn, "three")
            await sender.send("ephemeral")
            await _wait(lambda: len(heard) >= 4)
            assert heard == ["one", "two", "three", "ephemeral"]
            await sender.aclose()

            # The listening connection dies (a database restart, a network cut): the bus comes back,
            # tells its caller (who then reloads what it mirrors), and hears what follows.
            with psycopg.connect(url, autocommit=True) as raw:
                raw.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE query LIKE 'LISTEN%%' AND datname = current_database()")
            await _wait(lambda: listener.connects >= 2)
            await asyncio.wait_for(listener.listening.wait(), 10)
            assert connects == [1, 2]
            with psycopg.connect(url, autocommit=True) as raw:
                PgBus(url).announce(Conn(raw), "after")
            await _wait(lambda: heard[-1:] == ["after"])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await listener.aclose()

    asyncio.run(main())


def test_listener_waits_for_the_database(pg_cluster):
    """A database that cannot be reached yet: the bus retries with backoff until cancelled."""

    async def main():
        bus = PgBus(pg_cluster.url("no_such_database_here"), backoff_first=0.01, backoff_max=0.05)

        async def nothing(*_a):
            pass

        task = asyncio.create_task(bus.run(nothing, nothing))
        await asyncio.sleep(0.3)
        assert not task.done() and bus.connects == 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
