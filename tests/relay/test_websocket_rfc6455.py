"""The relay's websocket path against RFC 6455's rules, byte by byte over a plain socket to the real
server: masking, fragmentation, control frames, close codes, UTF-8 and size limits."""

from __future__ import annotations

import asyncio
import json
import os
import struct

import pytest

pytestmark = pytest.mark.anyio

KEY = "dGhlIHNhbXBsZSBub25jZQ=="
OPENED: list = []  # every client a test opened, closed after it whatever happened


@pytest.fixture
def server(module_server):
    """Frames on connections of their own: one server for the module."""
    return module_server


@pytest.fixture(autouse=True)
async def _close_clients():
    yield
    for writer in OPENED:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass
    OPENED.clear()
TEXT, BINARY, CONT, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0,
          length: int | None = None) -> bytes:
    """One client frame (RFC 6455 5.2), masked unless told otherwise."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([bit | 127]) + struct.pack(">Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return struct.pack(">H", code) + reason


class Raw:
    """A websocket client that writes exactly the bytes a test gives it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, extensions: str | None = None) -> "Raw":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        OPENED.append(writer)
        ext = f"Sec-WebSocket-Extensions: {extensions}\r\n" if extensions else ""
        writer.write(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{ext}\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101"), head
        raw = cls(reader, writer)
        raw.head = head
        opcode, payload = await raw.read()
        assert opcode == TEXT  # the AUTH challenge (compressed when an extension was negotiated)
        if not extensions:
            assert json.loads(payload)[0] == "AUTH"
        raw.first = payload
        return raw

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def read(self) -> tuple[int, bytes]:
        """The next frame from the server (which never masks): (opcode, payload); (None, b"") at EOF."""
        try:
            first = await asyncio.wait_for(self.reader.readexactly(2), 20)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return None, b""
        assert first[1] & 0x80 == 0, "a server frame must not be masked"
        assert first[0] & 0x80, "the server sends whole messages"
        n = first[1] & 0x7F
        if n == 126:
            n = struct.unpack(">H", await self.reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", await self.reader.readexactly(8))[0]
        return first[0] & 0x0F, await self.reader.readexactly(n)

    async def message(self) -> list:
        while True:
            opcode, payload = await self.read()
            assert opcode is not None, "the connection ended"
            if opcode == TEXT:
                return json.loads(payload)

    async def closed_with(self) -> int | None:
        """Read until the server's close frame: its code (None: the connection ended without one)."""
        while True:
            opcode, payload = await self.read()
            if opcode is None:
                return None
            if opcode == CLOSE:
                return struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005

    async def ends(self) -> bool:
        """Whether the server ends the TCP connection (EOF) within the deadline."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), 20):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()


def req(sub: str) -> bytes:
    return json.dumps(["REQ", sub, {"kinds": [1], "limit": 1}]).encode()


async def test_a_fragmented_message_is_reassembled_and_a_ping_between_its_fragments_is_answered(server):
    raw = await Raw.open(server.port)
    data = req("frag")
    raw.send(frame(TEXT, data[:5], fin=False) + frame(CONT, data[5:10], fin=False)
             + frame(PING, b"between") + frame(CONT, data[10:]))
    opcode, payload = await raw.read()
    assert (opcode, payload) == (PONG, b"between")  # control frames may come between fragments (5.4)
    assert await raw.message() == ["EOSE", "frag"]
    raw.close()


async def test_a_ping_is_answered_with_its_payload(server):
    raw = await Raw.open(server.port)
    raw.send(frame(PING, b"x" * 125))
    assert await raw.read() == (PONG, b"x" * 125)
    raw.send(frame(PONG, b"unsolicited"))  # no answer expected (5.5.3), the connection goes on
    raw.send(frame(TEXT, req("after")))
    assert await raw.message() == ["EOSE", "after"]
    raw.close()


# Named by shape alone: the frames carry random masks, and parallel workers must collect the same ids.
PROTOCOL_ERRORS = [
    ("unmasked client frame (5.1)", frame(TEXT, req("u"), mask=False)),
    ("control frame over 125 bytes (5.5)", frame(PING, b"p" * 126)),
    ("fragmented control frame (5.5)", frame(PING, b"p", fin=False)),
    ("reserved bits with no extension (5.2)", frame(TEXT, req("r"), rsv=0b100)),
    ("reserved opcode (5.2)", frame(0x3, b"x")),
    ("continuation with nothing to continue (5.4)", frame(CONT, b"x")),
    ("a new message inside a fragmented one (5.4)", frame(TEXT, b"[", fin=False) + frame(TEXT, b"[]")),
    ("close code out of range (7.4)", frame(CLOSE, close_payload(999))),
    ("close code reserved for no status (7.4.1)", frame(CLOSE, close_payload(1005))),
    ("close frame of one byte (5.5.1)", frame(CLOSE, b"\x03")),
]


@pytest.mark.parametrize("shape,data", PROTOCOL_ERRORS, ids=[shape for shape, _ in PROTOCOL_ERRORS])
async def test_protocol_errors_close_1002(server, shape, data):
    raw = await Raw.open(server.port)
    raw.send(data)
    code = await raw.closed_with()
    # (an invalid close frame may also just end the connection: it has failed either way)
    assert code == 1002 or (code is None and "close" in shape), (shape, code)
    assert await raw.ends()
    raw.close()


async def test_a_clients_close_is_echoed_and_the_connection_ends(server):
    raw = await Raw.open(server.port)
    raw.send(frame(CLOSE, close_payload(1000, "bye é".encode())))
    assert await raw.closed_with() == 1000
    assert await raw.ends()
    raw.close()


async def test_an_empty_close_is_echoed_empty(server):
    raw = await Raw.open(server.port)
    raw.send(frame(CLOSE, b""))
    opcode, payload = await raw.read()
    assert (opcode, payload) == (CLOSE, b"")
    assert await raw.ends()
    raw.close()


@pytest.mark.parametrize("fragments", [
    [b"[\"REQ\",\"\xff\"]"],  # invalid in one frame
    [b"[\"REQ\",\"\xc3", b"\x28\"]"],  # invalid across fragments
])
async def test_text_that_is_not_utf8_closes_1007_quietly(server, fragments):
    raw = await Raw.open(server.port)
    if len(fragments) == 1:
        raw.send(frame(TEXT, fragments[0]))
    else:
        raw.send(frame(TEXT, fragments[0], fin=False) + frame(CONT, fragments[1]))
    assert await raw.closed_with() == 1007
    raw.close()
    log = server.log_path.read_text()
    assert "Traceback" not in log and " ERROR " not in log


async def test_a_close_reason_that_is_not_utf8_closes_1007(server):
    raw = await Raw.open(server.port)
    raw.send(frame(CLOSE, close_payload(1000, b"\xff")))
    assert await raw.closed_with() == 1007
    raw.close()


async def test_utf8_split_across_fragments_is_one_valid_message(server, alice):
    """A character cut between two fragments is valid UTF-8 once reassembled (5.6, 8.1)."""
    raw = await Raw.open(server.port)
    data = json.dumps(["REQ", "é", {"kinds": [1], "limit": 1}], ensure_ascii=False).encode()
    cut = data.index("é".encode()) + 1
    raw.send(frame(TEXT, data[:cut], fin=False) + frame(CONT, data[cut:]))
    assert await raw.message() == ["EOSE", "é"]
    raw.close()


async def test_size_limits(make_server):
    """A message over max_message_length gets a NOTICE (the connection goes on); one over twice
    that is closed 1009 (the frame is not read), fragmented or not."""
    srv = make_server("--max-message-length", "1024")
    raw = await Raw.open(srv.port)
    raw.send(frame(TEXT, b'["NOTICE-ME","' + b"x" * 1200 + b'"]'))
    notice = await raw.message()
    assert notice[0] == "NOTICE" and notice[1].startswith("invalid: message too large"), notice
    raw.send(frame(TEXT, req("still")))
    assert await raw.message() == ["EOSE", "still"]
    raw.send(frame(TEXT, b"x" * 2100))  # over 2 x 1024
    assert await raw.closed_with() == 1009
    raw.close()
    raw = await Raw.open(srv.port)
    raw.send(frame(TEXT, b"x" * 1500, fin=False) + frame(CONT, b"x" * 1500))
    assert await raw.closed_with() == 1009
    raw.close()
    # A frame declaring a huge length is refused on its header: no gigabyte is awaited or buffered.
    raw = await Raw.open(srv.port)
    raw.send(frame(TEXT, b"", length=1 << 40)[:10])
    assert await raw.closed_with() == 1009
    raw.close()


async def test_binary_messages_get_a_notice(server):
    raw = await Raw.open(server.port)
    raw.send(frame(BINARY, b"\x00\x01"))
    assert (await raw.message())[0] == "NOTICE"
    raw.close()


async def test_permessage_deflate_is_negotiated_and_used(make_server):
    srv = make_server("--ws-compression", "true")
    raw = await Raw.open(srv.port, extensions="permessage-deflate; client_max_window_bits")
    assert b"permessage-deflate" in raw.head.lower()
    import zlib

    data = req("z")
    compressor = zlib.compressobj(wbits=-12)
    body = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
    raw.send(frame(TEXT, body[:-4], rsv=0b100))  # RSV1: compressed (RFC 7692 6.1)
    first = await raw.reader.readexactly(2)
    assert first[0] & 0x40, "the server's answer is compressed too"
    n = first[1] & 0x7F
    payload = await raw.reader.readexactly(n)
    # One decompressor for the server's messages: it keeps its context from one to the next (7.2.2)
    inflate = zlib.decompressobj(wbits=-15)
    assert json.loads(inflate.decompress(raw.first + b"\x00\x00\xff\xff"))[0] == "AUTH"
    assert json.loads(inflate.decompress(payload + b"\x00\x00\xff\xff")) == ["EOSE", "z"]
    raw.close()


async def test_handshake_errors_are_http_answers(server):
    for head, status in (
        ("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
         "Sec-WebSocket-Version: 13\r\n\r\n", b"400"),  # no key
        ("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
         f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 8\r\n\r\n", b"400"),  # not version 13
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        OPENED.append(writer)
        writer.write(head.encode())
        answer = await asyncio.wait_for(reader.read(4096), 10)
        assert answer.startswith(b"HTTP/1.1 " + status), answer
        writer.close()
