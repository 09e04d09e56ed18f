"""The relay's keepalive: a client that leaves a ping unanswered is cut (1011), but not while the
relay itself is not reading that client (its messages waiting their turn), when the pong may be
there unread. (Before, a client with REQs held longer than a ping's round was cut as dead.)"""

from __future__ import annotations

import asyncio

import pytest
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from appliance.front.websocket import NOTHING, Counters, WebSocketConnection

pytestmark = pytest.mark.anyio

INTERVAL = TIMEOUT = 0.05
MASK = b"\x01\x02\x03\x04"


class Transport:
    """Records what is written; says whether reading is paused and whether it was closed."""

    def __init__(self):
        self.out = b""
        self.paused = False
        self.closed = False

    def write(self, data):
        self.out += data

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    abort = close

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False


class Handler:
    """Takes the connection's messages only when told to (a session whose reads are held)."""

    def __init__(self, ws):
        self.ws = ws
        self.taking = False
        self.taken = []

    def pump(self):
        while self.taking:
            message = self.ws.next_message()
            if message is NOTHING:
                return
            self.taken.append(message)

    def take(self):
        self.taking = True
        self.pump()


def masked(opcode: Opcode, data: bytes) -> bytes:
    """A client's frame (masked, as RFC 6455 requires of clients)."""
    assert len(data) < 126
    masked = bytes(b ^ MASK[i % 4] for i, b in enumerate(data))
    return bytes([0x80 | opcode.value, 0x80 | len(data)]) + MASK + masked


def server_frames(out: bytes) -> list[Frame]:
    """The frames the relay wrote (unmasked, each a single frame)."""
    frames, rest = [], out
    while rest:
        length = rest[1] & 0x7F
        head = 2 if length < 126 else 4
        size = length if length < 126 else int.from_bytes(rest[2:4], "big")
        frames.append(Frame(Opcode(rest[0] & 0x0F), rest[head:head + size]))
        rest = rest[head + size:]
    return frames


async def open_connection():
    transport = Transport()
    ws = WebSocketConnection(ServerProtocol(state=State.OPEN), transport, counters=Counters(),
                             connections=set(), ping_interval=INTERVAL, ping_timeout=TIMEOUT)
    handler = Handler(ws)
    ws.attach(handler)
    return ws, transport, handler


async def until_pinged(transport, n: int = 1) -> bytes:
    """The payload of the n-th ping the relay sent."""
    while True:
        pings = [f for f in server_frames(transport.out) if f.opcode is Opcode.PING]
        if len(pings) >= n:
            return pings[n - 1].data
        await asyncio.sleep(INTERVAL / 5)


async def test_a_ping_left_unanswered_cuts_the_connection():
    ws, transport, handler = await open_connection()
    handler.take()
    await until_pinged(transport)
    await asyncio.sleep(TIMEOUT * 10)
    assert transport.closed
    closes = [f for f in server_frames(transport.out) if f.opcode is Opcode.CLOSE]
    assert Close.parse(closes[0].data).code == 1011


async def test_no_cut_while_the_relay_is_not_reading_the_client():
    ws, transport, handler = await open_connection()
    ws.data_received(masked(Opcode.TEXT, b'["REQ","a",{}]'))  # held: the session takes nothing
    assert transport.paused
    payload = await until_pinged(transport)
    ws.data_received(masked(Opcode.PONG, payload))  # (read by the kernel, not by the relay)
    await asyncio.sleep(TIMEOUT * 10)  # many timeouts of the old rule
    assert not transport.closed and ws.conn.state is State.OPEN
    handler.take()  # the relay reads again: the REQ, then the pong
    assert handler.taken == ['["REQ","a",{}]'] and not transport.paused
    second = await until_pinged(transport, 2)  # the pong counted: the next round began
    ws.data_received(masked(Opcode.PONG, second))
    await until_pinged(transport, 3)
    assert not transport.closed
