"""Durability: every event acknowledged with OK true survives SIGKILL; a newer schema refuses to start."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import apsw
import orjson
import pytest

from appliance.store.schema import SCHEMA_VERSION
from appliance.store.sqlite import DB_FILENAME
from tests.conftest import ROOT, Client, Identity

pytestmark = pytest.mark.anyio

EVENTS = 2000
CLIENTS = 4
WINDOW = 50


async def _publisher(url: str, events: list, acked: set[str], first_oks: asyncio.Event) -> None:
    """Pipeline EVENTs (WINDOW in flight) and record every OK true until the connection dies."""
    client = await Client.connect(url)
    slots = asyncio.Semaphore(WINDOW)

    async def reader():
        try:
            while True:
                msg = orjson.loads(await client.ws.recv())
                if msg[0] == "OK":
                    if msg[2]:
                        acked.add(msg[1])
                        if len(acked) >= 200:
                            first_oks.set()
                    slots.release()
        finally:
            for _ in range(WINDOW):  # unblock the sender once the connection is gone
                slots.release()

    task = asyncio.create_task(reader())
    try:
        for ev in events:
            await slots.acquire()
            if task.done():
                break
            await client.ws.send(orjson.dumps(["EVENT", ev.to_dict()]).decode())
        await task
    except Exception:  # the server was killed: the connection drops mid-stream
        pass
    finally:
        task.cancel()
        try:
            await client.close()
        except Exception:
            pass


@pytest.mark.slow
async def test_acknowledged_events_survive_sigkill(make_server, tmp_path, connect):
    data = tmp_path / "data"
    server = make_server("--event-rate", "0", "--req-rate", "0", data_dir=data)
    authors = [Identity() for _ in range(CLIENTS)]
    events = [authors[i % CLIENTS].sign(1, [["t", "restart"]], f"note {i}") for i in range(EVENTS)]
    acked: set[str] = set()
    first_oks = asyncio.Event()
    shares = [events[i::CLIENTS] for i in range(CLIENTS)]
    tasks = [asyncio.create_task(_publisher(server.url, share, acked, first_oks)) for share in shares]
    await asyncio.wait_for(first_oks.wait(), 60)
    server.kill()  # SIGKILL while EVENTs are still in flight
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert 200 <= len(acked) < EVENTS, "the kill should land mid-stream"

    restarted = make_server("--event-rate", "0", "--req-rate", "0", data_dir=data)
    c = await connect(restarted.url)
    found: set[str] = set()
    ids = sorted(acked)
    for start in range(0, len(ids), 500):
        got, closed = await c.req(f"q{start}", {"ids": ids[start:start + 500], "limit": 500})
        assert closed is None
        found.update(e["id"] for e in got)
    assert found == acked, f"{len(acked - found)} acknowledged events lost"
    # The store is still writable after the crash.
    late = authors[0].sign(1, [], "after restart")
    assert await c.publish(late) == (True, "")


def test_newer_schema_refuses_to_start(tmp_path):
    from tests import pg

    data = tmp_path / "data"
    data.mkdir()
    if pg.on_postgres():
        from appliance.store.pg_schema import SCHEMA_VERSION as known

        url = pg.database_for(data)
        pg.db_rows_at(url, "UPDATE schema_version SET version = %s RETURNING version", (known + 5,))

        def version() -> int:
            return pg.db_rows_at(url, "SELECT version FROM schema_version")[0][0]
    else:
        known = SCHEMA_VERSION
        conn = apsw.Connection(str(data / DB_FILENAME))
        conn.execute(f"PRAGMA user_version = {known + 5}")
        conn.close()

        def version() -> int:
            conn = apsw.Connection(str(data / DB_FILENAME))
            try:
                return conn.execute("PRAGMA user_version").fetchone()[0]
            finally:
                conn.close()
    args = ["serve", "--data-dir", str(data), "--port", "0"]
    out = subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True,
                         env=pg.process_env(args), cwd=ROOT, timeout=60)
    assert out.returncode != 0
    message = out.stderr
    assert f"schema version {known + 5}" in message, message
    assert str(known) in message and "upgrade" in message
    assert "Traceback" not in message
    # The database was not touched.
    assert version() == known + 5
