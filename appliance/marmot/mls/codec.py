"""TLS presentation language codecs.

Two flavours, kept apart on purpose:

- MLS (RFC 9420 §2.1.2): variable-length vectors carry a 1, 2 or 4 byte length prefix whose two
  top bits give its size (``00``/``01``/``10``; ``11`` is invalid) and which MUST be minimal.
- The Marmot binary profile (``foundation/canonical-encoding.md``): QUIC variable-length integer
  prefixes (1, 2, 4 or 8 bytes), also minimal. See ``quic_*`` below.

`Reader` decodes strictly: every read past the end, non-minimal prefix or trailing byte raises
`DecodeError`.
"""

from __future__ import annotations

import struct
from typing import Callable, TypeVar

from .errors import DecodeError

T = TypeVar("T")

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

MAX_VARINT = (1 << 30) - 1


def varint(n: int) -> bytes:
    """MLS variable-length integer (minimal)."""
    if n < 0x40:
        return bytes((n,))
    if n < 0x4000:
        return _U16.pack(0x4000 | n)
    if n <= MAX_VARINT:
        return _U32.pack(0x80000000 | n)
    raise DecodeError(f"length {n} does not fit an MLS varint")


def u8(n: int) -> bytes:
    return bytes((n,))


def u16(n: int) -> bytes:
    return _U16.pack(n)


def u32(n: int) -> bytes:
    return _U32.pack(n)


def u64(n: int) -> bytes:
    return _U64.pack(n)


def vl(data: bytes) -> bytes:
    """opaque data<V>."""
    return varint(len(data)) + data


def vl_list(items) -> bytes:
    """T items<V> from already-encoded items."""
    body = b"".join(items)
    return varint(len(body)) + body


def optional(encoded: bytes | None) -> bytes:
    return b"\x00" if encoded is None else b"\x01" + encoded


class Reader:
    """A strict cursor over bytes."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None):
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def _take(self, n: int) -> bytes:
        p = self.pos
        if p + n > self.end:
            raise DecodeError(f"truncated: need {n} bytes at offset {p}, have {self.end - p}")
        self.pos = p + n
        return self.data[p:p + n]

    def u8(self) -> int:
        return self._take(1)[0]

    def u16(self) -> int:
        return _U16.unpack(self._take(2))[0]

    def u32(self) -> int:
        return _U32.unpack(self._take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self._take(8))[0]

    def fixed(self, n: int) -> bytes:
        return self._take(n)

    def varint(self) -> int:
        first = self._take(1)[0]
        prefix = first >> 6
        if prefix == 0:
            return first
        if prefix == 1:
            n = ((first & 0x3F) << 8) | self._take(1)[0]
            if n < 0x40:
                raise DecodeError("non-minimal variable-length integer")
            return n
        if prefix == 2:
            rest = self._take(3)
            n = ((first & 0x3F) << 24) | (rest[0] << 16) | (rest[1] << 8) | rest[2]
            if n < 0x4000:
                raise DecodeError("non-minimal variable-length integer")
            return n
        raise DecodeError("invalid variable-length integer prefix 0b11")

    def vl(self) -> bytes:
        return self._take(self.varint())

    def sub(self) -> "Reader":
        """A reader bounded to the next <V> vector's body (advances past it)."""
        n = self.varint()
        start = self.pos
        if start + n > self.end:
            raise DecodeError(f"truncated: vector of {n} bytes at offset {start}")
        self.pos = start + n
        return Reader(self.data, start, start + n)

    def vl_list(self, item: Callable[["Reader"], T]) -> list[T]:
        r = self.sub()
        out = []
        while r.pos < r.end:
            out.append(item(r))
        return out

    def optional(self, item: Callable[["Reader"], T]) -> T | None:
        flag = self.u8()
        if flag == 0:
            return None
        if flag == 1:
            return item(self)
        raise DecodeError(f"invalid optional<> presence byte {flag}")

    def boolean(self) -> bool:
        flag = self.u8()
        if flag > 1:
            raise DecodeError(f"invalid boolean {flag}")
        return flag == 1

    def done(self) -> bool:
        return self.pos >= self.end

    def finish(self) -> None:
        if self.pos != self.end:
            raise DecodeError(f"{self.end - self.pos} trailing bytes")

    def slice_since(self, start: int) -> bytes:
        return self.data[start:self.pos]


def decode_exact(data: bytes, item: Callable[[Reader], T]) -> T:
    """Decode one value that must use all of `data`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    r = Reader(bytes(data))
    value = item(r)
    r.finish()
    return value


# ---------------------------------------------------------------------------------------------
# Marmot binary profile: QUIC variable-length integers (RFC 9000 §16), minimal.

def quic_varint(n: int) -> bytes:
    if n < 0:
        raise ValueError("negative length")
    if n < 0x40:
        return bytes((n,))
    if n < 0x4000:
        return _U16.pack(0x4000 | n)
    if n < 0x40000000:
        return _U32.pack(0x80000000 | n)
    if n < 0x4000000000000000:
        return _U64.pack(0xC000000000000000 | n)
    raise ValueError(f"{n} does not fit a QUIC varint")


def quic_vl(data: bytes) -> bytes:
    return quic_varint(len(data)) + data


def read_quic_varint(r: Reader) -> int:
    first = r.u8()
    size = 1 << (first >> 6)
    n = first & 0x3F
    for b in r.fixed(size - 1):
        n = (n << 8) | b
    minimum = {1: 0, 2: 0x40, 4: 0x4000, 8: 0x40000000}[size]
    if n < minimum:
        raise DecodeError("non-minimal QUIC variable-length integer")
    return n


def read_quic_vl(r: Reader) -> bytes:
    return r.fixed(read_quic_varint(r))
