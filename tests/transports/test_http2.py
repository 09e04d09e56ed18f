"""The HTTP/2 client (transports/http2.py) over real TLS: the parts of RFC 9113 a provider API may
use that the APNs tests do not reach (flow control, CONTINUATION, PING, SETTINGS, protocol errors)."""

from __future__ import annotations

import asyncio
import ssl
import struct
import time

import hpack
import pytest

from appliance.testing.tls import make_test_pki
from appliance.transports.apns import APNS_BODY
from appliance.transports.credentials import ApnsKey
from appliance.transports.http2 import Http2Client, Http2Error, StreamRefused

from .conftest import KEY_ID, TEAM, TOKEN, TOPIC

pytestmark = pytest.mark.anyio


def _headers(jwt: str, **extra: str) -> list[tuple[str, str]]:
    return [("authorization", f"bearer {jwt}"), ("apns-topic", TOPIC), ("apns-push-type", "alert"),
            ("apns-priority", "10"), *extra.items()]


async def test_a_body_past_the_flow_control_window_is_sent_in_steps(emulator, p8):
    """200 KB against the server's 64 KiB initial windows: sent as the server widens them."""
    jwt = ApnsKey.load(TEAM, KEY_ID, p8[0]).sign_token(int(time.time()))
    c = Http2Client(emulator.url, ssl.create_default_context(cafile=emulator.ca_file))
    try:
        body = b"{" + b" " * 200_000 + b"}"
        r = await c.request("POST", f"/3/device/{TOKEN}", _headers(jwt), body, 10)
        assert r.status == 413 and b"PayloadTooLarge" in r.body
        (rec,) = emulator.requests()
        assert rec.body == body  # every byte arrived, in order
        r = await c.request("POST", f"/3/device/{TOKEN}", _headers(jwt), APNS_BODY, 10)
        assert r.status == 200 and c.connections_made == 1
    finally:
        await c.close()


async def test_a_header_block_larger_than_a_frame_goes_in_continuation_frames(emulator, p8):
    jwt = ApnsKey.load(TEAM, KEY_ID, p8[0]).sign_token(int(time.time()))
    c = Http2Client(emulator.url, ssl.create_default_context(cafile=emulator.ca_file))
    try:
        r = await c.request("POST", f"/3/device/{TOKEN}", _headers(jwt, **{"x-pad": "p" * 40_000}), APNS_BODY, 10)
        assert r.status == 200
        (rec,) = emulator.requests()
        assert dict(rec.headers)["x-pad"] == "p" * 40_000
    finally:
        await c.close()


# -- a scripted server: frames written by hand ------------------------------------------------------

def _frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I B I", len(payload) << 8 | ftype, flags, stream_id) + payload


class _Scripted(asyncio.Protocol):
    """Reads the client's preface and frames; `script(server, stream_id)` answers each request."""

    def __init__(self, script, seen: list):
        self.script, self.seen, self.buf = script, seen, b""
        self.encoder = hpack.Encoder()

    def connection_made(self, transport):
        self.transport = transport
        transport.write(_frame(4, 0, 0, struct.pack(">HI", 3, 2)))  # SETTINGS: 2 streams at once

    def data_received(self, data):
        self.buf += data
        if self.buf.startswith(b"PRI * HTTP/2.0"):
            self.buf = self.buf[24:]
        while len(self.buf) >= 9:
            word, flags, sid = struct.unpack(">I B I", self.buf[:9])
            length = word >> 8
            if len(self.buf) < 9 + length:
                return
            payload, self.buf = self.buf[9:9 + length], self.buf[9 + length:]
            self.seen.append((word & 0xFF, flags, sid, payload))
            if word & 0xFF == 6 and not flags & 0x1:  # the client's PING (after a timeout): answered
                self.transport.write(_frame(6, 0x1, 0, payload))
            if word & 0xFF == 1 and flags & 0x1 or word & 0xFF == 0 and flags & 0x1:  # request complete
                self.script(self, sid)

    def answer(self, sid: int, status: int = 200, body: bytes = b"", **extra: str) -> None:
        block = self.encoder.encode([(":status", str(status)), *extra.items()])  # Huffman, indexed
        self.transport.write(_frame(1, 0x4 | (0 if body else 0x1), sid, block))
        if body:  # padded DATA
            self.transport.write(_frame(0, 0x1 | 0x8, sid, bytes((3,)) + body + b"\0\0\0"))


@pytest.fixture
async def scripted(tmp_path):
    pki = make_test_pki(tmp_path / "pki")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.cert_file, pki.key_file)
    ctx.set_alpn_protocols(["h2"])
    servers = []

    async def start(script):
        seen: list = []
        server = await asyncio.get_running_loop().create_server(lambda: _Scripted(script, seen), "127.0.0.1", 0,
                                                                ssl=ctx)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return Http2Client(f"https://127.0.0.1:{port}", ssl.create_default_context(cafile=str(pki.ca_file))), seen

    yield start
    for server in servers:
        server.close()


async def test_settings_ping_padding_and_the_servers_stream_limit(scripted):
    answered: list[int] = []

    def answer_both(server):
        for s in (3, 5):
            server.answer(s, 200, body=b'{"n":%d}' % s, **{"apns-id": f"id-{s}"})
            answered.append(s)

    def script(server, sid):
        if sid == 3:
            server.transport.write(_frame(6, 0, 0, b"12345678"))  # PING: answered with an ACK
        elif sid == 5:  # the server allows 2 streams: a third is opened only once one is answered
            asyncio.get_running_loop().call_later(0.2, answer_both, server)
        else:
            assert sid == 1 or answered == [3, 5], "a stream opened past SETTINGS_MAX_CONCURRENT_STREAMS"
            server.answer(sid, 200)

    c, seen = await scripted(script)
    try:
        assert (await c.request("POST", "/p/0", [], b"x", 5)).status == 200  # the server's SETTINGS are in
        tasks = [asyncio.create_task(c.request("POST", f"/p/{i}", [], b"x", 5)) for i in range(3)]
        answers = await asyncio.gather(*tasks)
        assert [(r.status, r.headers.get("apns-id"), r.body) for r in answers] == [
            (200, "id-3", b'{"n":3}'), (200, "id-5", b'{"n":5}'), (200, None, b"")]
        assert (4, 1, 0, b"") in seen  # our ACK of the server's SETTINGS
        assert (6, 1, 0, b"12345678") in seen  # PING ACK with the same payload
    finally:
        await c.close()


async def test_a_refused_stream_and_a_goaway(scripted):
    def script(server, sid):
        if sid == 1:
            server.transport.write(_frame(3, 0, sid, struct.pack(">I", 0x7)))  # RST_STREAM REFUSED_STREAM
        else:
            server.transport.write(_frame(7, 0, 0, struct.pack(">II", 0, 0) + b'{"reason":"Shutdown"}'))

    c, _seen = await scripted(script)
    try:
        with pytest.raises(StreamRefused, match="REFUSED_STREAM"):
            await c.request("POST", "/p", [], b"x", 5)
        with pytest.raises(StreamRefused, match="Shutdown"):
            await c.request("POST", "/p", [], b"x", 5)
    finally:
        await c.close()


async def test_a_request_unanswered_past_its_timeout_fails_and_its_stream_is_reset(scripted):
    held: list = []

    def script(server, sid):
        if sid == 1:
            server.answer(sid, 200)
        else:
            held.append(server)  # no answer (yet)

    c, seen = await scripted(script)
    try:
        assert (await c.request("POST", "/p", [], b"x", 5)).status == 200  # the connection is up
        slow = asyncio.create_task(c.request("POST", "/p", [], b"x", 30))  # stream 3
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):  # stream 5: a shorter timeout than the one before it
            await c.request("POST", "/p", [], b"x", 0.3)
        assert 0.25 < time.monotonic() - t0 < 10
        await asyncio.sleep(0.05)
        assert (3, 0, 5, struct.pack(">I", 0x8)) in seen  # RST_STREAM CANCEL for it
        assert not slow.done()
        held[0].answer(3, 200)
        assert (await slow).status == 200
        assert not any(f[0] == 3 and f[2] == 3 for f in seen)
    finally:
        await c.close()


@pytest.mark.parametrize("bad", [
    _frame(5, 0x4, 1, b"\0\0\0\2"),  # PUSH_PROMISE although push is off
    _frame(1, 0x4, 1, b"\xff\xff\xff\xff"),  # an undecodable header block
    _frame(0, 0x1, 9, b"x"),  # DATA on a stream never opened
    _frame(4, 0, 0, b"\0\5\0\0\0\1"),  # SETTINGS_MAX_FRAME_SIZE below 16384
])
async def test_a_protocol_error_ends_the_connection(scripted, bad):
    def script(server, sid):
        server.transport.write(bad)

    c, seen = await scripted(script)
    try:
        with pytest.raises(Http2Error, match="protocol error"):
            await c.request("POST", "/p", [], b"x", 5)
        await asyncio.sleep(0.05)
        assert seen[-1][0] == 7  # we said GOAWAY
    finally:
        await c.close()


def test_the_encoder_mirrors_its_dynamic_table_for_any_decoder():
    """Random requests through our encoder, decoded by hpack's decoder (an independent HPACK
    implementation), with the server shrinking and growing the table between them."""
    import random

    from appliance.transports.http2 import _Encoder

    rng = random.Random(1)
    for _trial in range(200):
        enc, dec = _Encoder(frozenset({":path", "apns-id"})), hpack.Decoder()
        pool = [(f"h{i}", "v" * rng.randrange(0, 300)) for i in range(12)] + [("authorization", "b" * 250)]
        for _step in range(40):
            if rng.random() < 0.1:
                size = rng.choice([0, 50, 300, 1000, 4096, 10000])
                enc.table_size_changed(size)
                dec.max_allowed_table_size = min(size, 4096)
            fields = rng.sample(pool, rng.randrange(1, 8)) + [(":path", f"/3/device/{rng.random()}"),
                                                              ("apns-id", str(rng.random()))]
            block = enc.encode(fields)
            assert dec.decode(block) == fields
        assert not {name for (name, _v), _size in enc._entries} & {":path", "apns-id"}


def test_repeated_fields_are_sent_as_indexes():
    from appliance.transports.http2 import _Encoder

    enc = _Encoder(frozenset({":path"}))
    fields = [(":method", "POST"), ("authorization", "bearer " + "t" * 200), (":path", "/3/device/ab")]
    first, second = enc.encode(fields), enc.encode(fields)
    assert len(first) > 200 and len(second) == 2 + 1 + (1 + 5) + (1 + 12)  # two indexes, the path literal
    assert hpack.Decoder().decode(first) == fields
