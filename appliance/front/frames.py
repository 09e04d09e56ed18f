"""Server text frames (RFC 6455 5.2) built directly, many messages in one bytes object.

A REQ answered with 50 events is 51 websocket messages; written one `transport.write` each, the
system calls dominate (docs/performance.md#frames-built-in-one-pass). A connection without an
extension writes the frames of everything queued at once, and a REQ's whole stored answer is
framed on the reader thread in one pass (`frame_events`).
"""

from __future__ import annotations

import struct


class Frames:
    """Messages already framed for the wire (server text frames, no extension), as one bytes
    object: a REQ's whole stored answer and its EOSE, built on the reader thread in one pass."""

    __slots__ = ("data", "count")

    def __init__(self, data: bytes | memoryview, count: int):
        self.data = data
        self.count = count

    def __len__(self) -> int:
        return len(self.data)

    def split(self, limit: int) -> tuple[bytes | memoryview, "Frames | None"]:
        """The whole frames of the first `limit` bytes or so (at least one frame), and the rest
        (None when nothing is left): a large answer is written a piece at a time, and nothing
        else (a pong) can land inside one of its frames."""
        data = self.data
        end, size, count = 0, len(data), 0
        while end < size and (end < limit or count == 0):
            n = data[end + 1] & 0x7F
            if n < 126:
                end += 2 + n
            elif n == 126:
                end += 4 + (data[end + 2] << 8 | data[end + 3])
            else:
                end += 10 + int.from_bytes(data[end + 2:end + 10], "big")
            count += 1
        if end >= size:
            return data, None
        view = memoryview(data)
        return bytes(view[:end]), Frames(view[end:], self.count - count)


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


# Bytes per `Frames` of a large answer (`frame_chunks`): the size of a write piece
# (appliance.relay.output.DEFAULT_WRITE_PIECE).
DEFAULT_CHUNK_BYTES = 256 * 1024


def frame_chunks(prefix: bytes, raws: list[bytes], tail: bytes, chunk: int = DEFAULT_CHUNK_BYTES) -> list[Frames]:
    """`frame_events` as `Frames` of about `chunk` bytes each (whole frames; one when the answer
    is no larger). A large answer written to a peer that reads slowly is let go a chunk at a time
    as it is written: a single buffer stays whole in memory until its last byte is written, what
    the socket took already included (docs/performance.md#default_chunk_bytes)."""
    out: list[Frames] = []
    parts: list[bytes] = []
    append = parts.append
    small, medium = _SMALL_HEADERS, _MEDIUM_HEADER
    extra = len(prefix) + 1
    size = count = 0
    for raw in raws:
        n = len(raw) + extra
        append(small[n] if n < 126 else medium(0x81, 126, n) if n < 65536 else frame_header(n))
        append(prefix)
        append(raw)
        append(b"]")
        size += n + 4
        count += 1
        if size >= chunk:
            out.append(Frames(b"".join(parts), count))
            parts.clear()
            size = count = 0
    append(frame_header(len(tail)))
    append(tail)
    out.append(Frames(b"".join(parts), count + 1))
    return out


# FIN + text opcode, then the 7-bit payload length.
_SMALL_HEADERS = [bytes((0x81, n)) for n in range(126)]
# FIN + text opcode, 126, then the 16-bit payload length.
_MEDIUM_HEADER = struct.Struct(">BBH").pack
