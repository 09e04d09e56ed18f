"""A subscription's life over a real websocket: CLOSE, replacement and refusal end it at once,
even while its stored-events query is still running; one REQ's answer is bounded in bytes; a
reader that stops reading is dropped instead of buffered without bound."""

from __future__ import annotations

import asyncio
import time

import pytest
import websockets

from tests.conftest import Client

pytestmark = pytest.mark.anyio


async def probe(c, event_id: str) -> list[list]:
    """Everything `c` received up to the EOSE of a REQ sent now (messages are answered in order)."""
    seen = list(c.backlog)
    c.backlog.clear()
    await c.send(["REQ", "probe", {"ids": [event_id]}])
    while True:
        msg = await c.recv()
        seen.append(msg)
        if msg[0] == "EOSE" and msg[1] == "probe":
            await c.send(["CLOSE", "probe"])
            return seen


async def test_close_right_after_req_ends_the_subscription(server, alice, bob, connect):
    c = await connect(server.url)
    other = await connect(server.url)
    await c.send(["REQ", "s", {"kinds": [1]}])
    await c.send(["CLOSE", "s"])
    ev = bob.sign(1, [], "after close")
    assert await other.publish(ev) == (True, "")  # broadcast happens before this OK
    seen = await probe(c, ev.id)
    assert not [m for m in seen if m[0] == "EVENT" and m[1] == "s"], seen


async def test_refused_req_ends_the_subscription_it_named(server, alice, bob, connect):
    c = await connect(server.url)
    other = await connect(server.url)
    events, closed = await c.req("t", {"kinds": [1], "authors": [bob.pubkey]})
    assert closed is None
    _, closed = await c.req("t", {"kinds": ["x"]})
    assert closed[2].startswith("invalid:")
    ev = bob.sign(1, [], "after refusal")
    assert await other.publish(ev) == (True, "")
    seen = await probe(c, ev.id)
    assert not [m for m in seen if m[0] == "EVENT" and m[1] == "t"], seen
    # The refused id no longer counts as open: it can be opened again.
    events, closed = await c.req("t", {"ids": [ev.id]})
    assert closed is None and [e["id"] for e in events] == [ev.id]


async def test_replaced_req_answers_once_for_each_filter(server, alice, connect):
    c = await connect(server.url)
    tag = f"replace-{time.time_ns()}"
    for i in range(3):
        assert (await c.publish(alice.sign(1, [["t", tag]], f"e{i}")))[0]
    marker = alice.sign(1, [], "marker")
    assert (await c.publish(marker))[0]
    for _ in range(20):
        await c.send(["REQ", "s", {"#t": [tag], "limit": 3}])
        await c.send(["REQ", "s", {"ids": ["0" * 64]}])
        kinds: list[str] = []
        while not kinds or kinds[-1] != "EOSE" or kinds.count("EOSE") < 1 + ("EVENT" in kinds):
            msg = await c.recv()
            if msg[1] == "s":
                kinds.append(msg[0])
        # Queries run concurrently: one more round trip gives a stray late answer time to show.
        kinds += [m[0] for m in await probe(c, marker.id) if m[1] == "s"]
        # Either the first answer was complete before the replacement arrived, or it was dropped:
        # never a replaced filter's events after (or without) its own EOSE.
        assert kinds in (["EOSE"], ["EVENT"] * 3 + ["EOSE", "EOSE"]), kinds
        await c.send(["CLOSE", "s"])


async def test_one_answer_is_bounded_in_bytes(make_server, alice, connect):
    server = make_server("--max-query-bytes", "65536")
    c = await connect(server.url)
    now = int(time.time())
    published = []
    for i in range(8):
        ev = alice.sign(1, [["t", "big"]], f"{i:02d}" + "x" * 20_000, created_at=now - 100 + i)
        assert (await c.publish(ev))[0]
        published.append(ev)
    events, _ = await c.req("big", {"kinds": [1], "authors": [alice.pubkey]})
    newest_first = [e.id for e in reversed(published)]
    assert [e["id"] for e in events] == newest_first[:3]  # 3 x ~20 KB fit in 64 KiB, the 4th would not
    # Two filters share the budget evenly; each still returns its newest events (at least one).
    events, _ = await c.req("two", {"kinds": [1], "authors": [alice.pubkey]}, {"#t": ["big"]})
    assert [e["id"] for e in events] == newest_first[:1]
    # A filter whose single newest event exceeds its share still gets that event.
    events, _ = await c.req("many", *([{"kinds": [1], "authors": [alice.pubkey]}] * 16))
    assert [e["id"] for e in events] == newest_first[:1]


async def test_reader_that_stops_reading_is_dropped(make_server, alice, connect):
    server = make_server("--log-level", "info")
    writer = await connect(server.url)
    for i in range(40):
        assert (await writer.publish(alice.sign(1, [["t", "bulk"]], f"{i:02d}" + "y" * 60_000)))[0]
    # No compression: these repetitive events would shrink a thousandfold on the wire and fit in
    # the socket buffers, and this test is about a reader that really leaves bytes unread.
    lazy = Client(await websockets.connect(server.url, max_size=None, compression=None))
    assert (await lazy.recv())[0] == "AUTH"
    # 30 answers of ~2.4 MB each, never read: far past the per-connection budget of 32 MiB.
    for i in range(30):
        await lazy.send(["REQ", f"r{i}", {"#t": ["bulk"]}])
    deadline = time.monotonic() + 30
    while b"dropping slow connection" not in server.log_path.read_bytes():
        tail = server.log_path.read_bytes()[-2000:].decode(errors="replace")
        assert time.monotonic() < deadline, f"the slow reader was never dropped; server log ends:\n{tail}"
        await asyncio.sleep(0.1)
    eose = 0
    try:
        while True:
            msg = await lazy.recv(timeout=10)
            eose += msg[0] == "EOSE"
    except websockets.exceptions.ConnectionClosed:
        pass  # cut, not merely silent (a timeout would fail the test here)
    assert eose < 30
    await lazy.ws.close()
    # The relay itself is unharmed.
    events, _ = await writer.req("after", {"#t": ["bulk"], "limit": 1})
    assert len(events) == 1


async def test_stored_answer_stays_clean_during_ingest(server, alice, connect):
    """Events arriving while a REQ's stored answer is read are held until after its EOSE: before
    EOSE only the stored answer (newest first, within the limit), and no event twice."""
    publisher = await connect(server.url)
    reader = await connect(server.url)
    tag = f"flow-{time.time_ns()}"
    events = [alice.sign(1, [["t", tag]], f"e{i}") for i in range(900)]

    async def publish_all():
        for ev in events:
            await publisher.send(["EVENT", ev.to_dict()])

    pub = asyncio.create_task(publish_all())
    try:
        for n in range(25):
            sub = f"r{n}"
            await reader.send(["REQ", sub, {"#t": [tag], "limit": 2}])
            before, after, seen = [], [], set()
            while True:
                msg = await reader.recv()
                if msg[1] != sub:
                    continue
                if msg[0] == "EOSE":
                    break
                before.append(msg[2])
            assert len(before) <= 2
            assert [e["created_at"] for e in before] == sorted((e["created_at"] for e in before), reverse=True)
            seen.update(e["id"] for e in before)
            await reader.send(["REQ", "barrier", {"ids": [events[0].id]}])
            while True:
                msg = await reader.recv()
                if msg[0] == "EOSE" and msg[1] == "barrier":
                    break
                if msg[1] == sub and msg[0] == "EVENT":
                    after.append(msg[2]["id"])
            assert not (set(after) & seen) and len(after) == len(set(after))
            await reader.send(["CLOSE", sub])
    finally:
        await pub
        oks = 0
        while oks < len(events):  # read the publisher's answers, so its connection closes cleanly
            oks += (await publisher.recv())[0] == "OK"


async def test_expensive_query_is_abandoned_with_closed(make_server, alice, connect):
    server = make_server("--query-timeout", "0.000001", "--event-rate", "0")
    c = await connect(server.url)
    for i in range(0, 3000, 500):
        for j in range(500):
            await c.send(["EVENT", alice.sign(1, [], f"{i + j}").to_dict()])
        for _ in range(500):
            await c.expect(lambda m: m[0] == "OK")
    filters = [{"kinds": [1], "since": k} for k in range(16)]
    events, closed = await c.req("slow", *filters)
    assert closed == ["CLOSED", "slow", "error: this query takes too long here; narrow its filters or lower its limit"]
    count = await c.count("slowc", *filters)
    assert count[0] == "CLOSED" and count[2].startswith("error: this query takes too long")
    # The connection stays usable (with a budget this small every read times out: the budget
    # counts from the REQ, waiting for a reader included).
    events, closed = await c.req("ok", {"ids": ["0" * 64]})
    assert closed is None or closed[2].startswith("error: this query takes too long")
    assert (await c.publish(alice.sign(1, [], "still here")))[0]


@pytest.mark.slow
async def test_flooding_connection_is_closed(server, connect):
    c = await connect(server.url)
    for _ in range(4000):
        await c.send("[]")
    deadline = asyncio.get_running_loop().time() + 20
    with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
        while True:
            await c.recv(max(0.01, deadline - asyncio.get_running_loop().time()))
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008
