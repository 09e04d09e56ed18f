"""Frames the relay builds itself (connections without compression) are the frames websockets builds."""

from __future__ import annotations

import json

import pytest
import websockets
from websockets.frames import Frame, Opcode

from appliance.front import frames

pytestmark = pytest.mark.anyio


class _Transport:
    def __init__(self):
        self.out = b""

    def write(self, data):
        self.out += data

    def is_closing(self):
        return False

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def _connection():
    """An open websocket connection over a recording transport, a ping of its own queued first
    (whatever the protocol queued goes out before the messages)."""
    from websockets.protocol import State
    from websockets.server import ServerProtocol

    from appliance.front.websocket import Counters, WebSocketConnection

    conn = ServerProtocol(state=State.OPEN)
    conn.send_ping(b"ping")
    return WebSocketConnection(conn, _Transport(), counters=Counters(), connections=set(), ping_interval=None)


PING = Frame(Opcode.PING, b"ping").serialize(mask=False)


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65535, 65536, 200_000])
async def test_text_frames_match_websockets(n):
    text = "é" * (n // 2) + "x" * (n % 2)
    writer = _connection()
    assert await writer.send_all([text, "[]"])
    expected = PING + Frame(Opcode.TEXT, text.encode()).serialize(mask=False) + \
        Frame(Opcode.TEXT, b"[]").serialize(mask=False)
    assert writer.transport.out == expected


@pytest.mark.parametrize("sizes", [[], [0], [10, 125, 126, 300], [65_535, 70_000]])
async def test_a_framed_answer_is_the_frames_websockets_builds(sizes):
    """A REQ's answer framed in one pass on the reader thread: each EVENT and the EOSE as the
    text frame websockets would send, in order."""
    raws = [b'{"id":"' + b"x" * n + b'"}' for n in sizes]
    prefix, eose = b'["EVENT","sub",', b'["EOSE","sub"]'
    framed = frames.frame_events(prefix, raws, eose)
    expected = b"".join(Frame(Opcode.TEXT, prefix + raw + b"]").serialize(mask=False) for raw in raws)
    assert framed.data == expected + Frame(Opcode.TEXT, eose).serialize(mask=False)
    assert framed.count == len(raws) + 1
    writer = _connection()
    assert writer.raw_frames and writer.ready()
    assert await writer.send_all(["[1]", framed])
    assert writer.transport.out == PING + Frame(Opcode.TEXT, b"[1]").serialize(mask=False) + framed.data


async def test_uncompressed_client_reads_every_size(server, alice, connect):
    c = await connect(server.url)
    sizes = [0, 40, 200, 65_400]  # the last answer is over 65,535 bytes: 8-byte length
    ids = []
    for size in sizes:
        ev = alice.sign(1, [["t", "sizes"]], "y" * size)
        assert (await c.publish(ev))[0]
        ids.append(ev.id)
    ws = await websockets.connect(server.url, compression=None, max_size=None)
    await ws.recv()
    await ws.send(json.dumps(["REQ", "s", {"#t": ["sizes"]}]))
    got = []
    while True:
        msg = json.loads(await ws.recv())
        if msg[0] == "EOSE":
            break
        got.append(msg[2]["id"])
    assert sorted(got) == sorted(ids)
    await ws.close()


@pytest.mark.parametrize("sizes", [[], [10], [65_535, 70_000], [3_000] * 300, [200_000, 10, 300_000]])
async def test_a_large_answer_is_framed_in_chunks_let_go_as_written(sizes):
    """A large answer is several `Frames` of about a write piece each, whole frames in order: the
    same bytes as one `Frames`; an answer no larger than a chunk is one."""
    raws = [b'{"id":"' + b"x" * n + b'"}' for n in sizes]
    prefix, eose = b'["EVENT","sub",', b'["EOSE","sub"]'
    whole = frames.frame_events(prefix, raws, eose)
    chunks = frames.frame_chunks(prefix, raws, eose, 64 * 1024)
    assert b"".join(bytes(c.data) for c in chunks) == whole.data
    assert sum(c.count for c in chunks) == whole.count
    if len(whole) <= 64 * 1024:
        assert len(chunks) == 1
    for c in chunks[:-1]:  # each chunk ends at a frame boundary once it holds 64 KiB or more
        assert len(c) >= 64 * 1024
        head, rest = c.split(len(c))
        assert rest is None
    largest = max(sizes, default=0) + len(prefix) + 20
    assert all(len(c) < 64 * 1024 + largest for c in chunks)
