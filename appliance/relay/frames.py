"""Writing many websocket messages with one system call when the server allows it.

A REQ answered with 50 events is 51 websocket messages. Through ASGI each message is one
`transport.write`, and on a small VM the system calls dominate (measured: 51 writes took most of a
6-7 ms REQ at 1M stored events). When the server is uvicorn's sans-I/O websockets protocol, the
frames of all queued messages are built with its own connection object and written at once; any
other server gets the plain ASGI path. The coupling is to three attributes of that one class and
is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Awaitable, Callable

RAW_SEND_KEY = "appliance.raw_send"
# A peer that lets this long pass without taking any of what is buffered for it is cut off: its
# unsent messages would otherwise stay in memory for as long as it keeps the connection open.
DEFAULT_WRITE_STALL_SECONDS = 60.0


def capture_raw_send(app: Callable) -> Callable:
    """ASGI middleware: remember the server's own `send` for websocket connections."""

    async def wrapper(scope, receive, send):
        if scope["type"] == "websocket":
            scope[RAW_SEND_KEY] = send
        await app(scope, receive, send)

    return wrapper


class Frames:
    """Messages already framed for the wire (server text frames, no extension), as one bytes
    object: a REQ's whole stored answer and its EOSE, built on the reader thread in one pass."""

    __slots__ = ("data", "count")

    def __init__(self, data: bytes, count: int):
        self.data = data
        self.count = count

    def __len__(self) -> int:
        return len(self.data)


def frame_header(n: int) -> bytes:
    """The header of an unmasked server text frame of n payload bytes (RFC 6455 5.2), FIN set."""
    if n < 126:
        return _SMALL_HEADERS[n]
    if n < 65536:
        return _MEDIUM_HEADER(0x81, 126, n)
    return b"\x81\x7f" + n.to_bytes(8, "big")


def frame_events(prefix: bytes, raws: list[bytes], tail: bytes) -> Frames:
    """`prefix + raw + b"]"` for each raw, then `tail`, each as one text frame, in one bytes object."""
    parts: list[bytes] = []
    append = parts.append
    small, medium = _SMALL_HEADERS, _MEDIUM_HEADER
    extra = len(prefix) + 1
    for raw in raws:
        n = len(raw) + extra
        # (most events are 126 to 65,535 bytes: one C call for their header, no Python one)
        append(small[n] if n < 126 else medium(0x81, 126, n) if n < 65536 else frame_header(n))
        append(prefix)
        append(raw)
        append(b"]")
    append(frame_header(len(tail)))
    append(tail)
    return Frames(b"".join(parts), len(raws) + 1)


class FrameWriter:
    """Sends a list of text messages: one write when possible, one ASGI send each otherwise."""

    def __init__(self, scope: dict, asgi_send_text: Callable[[str], Awaitable[None]],
                 stall_seconds: float = DEFAULT_WRITE_STALL_SECONDS):
        self._send_text = asgi_send_text
        self.stall_seconds = stall_seconds
        self.aborted = False
        self._proto: Any = None
        raw = scope.get(RAW_SEND_KEY)
        proto = getattr(raw, "__self__", None)
        if (
            proto is not None
            and any(c.__name__ == "WebSocketsSansIOProtocol" for c in type(proto).__mro__)
            and all(hasattr(proto, a) for a in ("conn", "transport", "writable", "disconnected", "close_sent"))
        ):
            self._proto = proto

    @property
    def batched(self) -> bool:
        return self._proto is not None

    @property
    def raw_frames(self) -> bool:
        """Whether `Frames` may be queued: plain frames go straight to the socket (no
        permessage-deflate context that must see each message, no ASGI path)."""
        return self._proto is not None and not self._proto.conn.extensions

    def abort(self) -> None:
        """Cut the connection now, dropping whatever is buffered (a peer that stopped reading).
        Without the server's protocol object at hand, the caller's close frame has to do."""
        if self._proto is not None:
            self.aborted = True
            self._proto.transport.abort()

    def ready(self) -> bool:
        """Whether `write_now` may be used: the server's own protocol, writable (its flow control
        says the peer keeps up) and still open."""
        proto = self._proto
        return (proto is not None and proto.writable.is_set() and not proto.disconnected
                and not proto.close_sent and not proto.transport.is_closing())

    def write_now(self, texts: list) -> None:
        """Write `texts` (str, or `Frames` when `raw_frames`) with one `transport.write`; only
        when `ready()`."""
        conn = self._proto.conn
        if conn.extensions:  # permessage-deflate: its compression context must see every frame
            for text in texts:
                conn.send_text(text.encode())
            self._proto.transport.write(b"".join(conn.data_to_send()))
            return
        # No extension: a server's text frame is a fixed header and the payload (RFC 6455 5.2,
        # unmasked), built here in one pass instead of websockets' per-frame objects. Whatever
        # websockets queued itself (a pong) goes first.
        parts = conn.data_to_send()
        small = _SMALL_HEADERS
        for text in texts:
            if type(text) is Frames:
                parts.append(text.data)
                continue
            data = text.encode()
            n = len(data)
            parts.append(small[n] if n < 126 else frame_header(n))
            parts.append(data)
        self._proto.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    async def send_all(self, texts: list) -> bool:
        """Send `texts` (str, or `Frames` when `raw_frames`) in order, waiting while the peer is
        behind; False once the peer is gone."""
        proto = self._proto
        if proto is None:
            for text in texts:
                await asyncio.wait_for(self._send_text(text), self.stall_seconds)
            return True
        if not proto.writable.is_set():  # the server's flow control: the peer is behind
            try:
                await asyncio.wait_for(proto.writable.wait(), self.stall_seconds)
            except asyncio.TimeoutError:
                self.abort()
                return False
        if proto.disconnected or proto.close_sent or proto.transport.is_closing():
            return False
        self.write_now(texts)
        return True


# FIN + text opcode, then the 7-bit payload length.
_SMALL_HEADERS = [bytes((0x81, n)) for n in range(126)]
# FIN + text opcode, 126, then the 16-bit payload length.
_MEDIUM_HEADER = struct.Struct(">BBH").pack
