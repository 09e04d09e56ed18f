"""The Marmot binary profile as the tooling uses it: fixed-width integers, fixed arrays, and
variable-length vectors with QUIC variable-length integer prefixes (foundation/canonical-encoding.md).

This is the tooling's only entry point to that codec: `quic_vector` to write a vector, `Reader` to
read a structure exactly. The codec itself belongs to the MLS core (issue 12); until it lands this
module carries the few lines needed, and then becomes a re-export of it (one codec, never two).
"""

from __future__ import annotations

from .errors import EncodingError

__all__ = ["MAX_VARINT", "quic_varint", "quic_vector", "uint16", "uint64", "Reader"]

MAX_VARINT = (1 << 62) - 1
_BOUNDS = ((63, 1, 0x00), (16383, 2, 0x40), (1073741823, 4, 0x80), (MAX_VARINT, 8, 0xC0))


def quic_varint(n: int) -> bytes:
    """Shortest QUIC variable-length integer encoding of n (RFC 9000, section 16)."""
    if type(n) is not int or not 0 <= n <= MAX_VARINT:
        raise EncodingError(f"length {n!r} cannot be a QUIC variable-length integer", "encoding.varint_range")
    for limit, size, marker in _BOUNDS:
        if n <= limit:
            raw = bytearray(n.to_bytes(size, "big"))
            raw[0] |= marker
            return bytes(raw)
    raise AssertionError("unreachable")


def quic_vector(data: bytes) -> bytes:
    """`opaque name<V>`: shortest QUIC length prefix, then the bytes."""
    return quic_varint(len(data)) + bytes(data)


def uint16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def uint64(n: int) -> bytes:
    return n.to_bytes(8, "big")


class Reader:
    """Reads one Marmot binary profile structure; every shortfall or excess is an EncodingError."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise EncodingError(f"{what}: expected bytes", "encoding.type")
        self.data = bytes(data)
        self.pos = 0
        self.what = what

    def fixed(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise EncodingError(f"{self.what}: truncated (needs {end} bytes, has {len(self.data)})",
                                "encoding.truncated")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def uint16(self) -> int:
        return int.from_bytes(self.fixed(2), "big")

    def uint64(self) -> int:
        return int.from_bytes(self.fixed(8), "big")

    def varint(self) -> int:
        first = self.fixed(1)[0]
        size = 1 << (first >> 6)
        value = first & 0x3F
        for b in self.fixed(size - 1):
            value = (value << 8) | b
        # Canonical decoders reject a longer prefix than the value needs.
        if size > 1 and len(quic_varint(value)) != size:
            raise EncodingError(f"{self.what}: length prefix is not in its shortest form",
                                "encoding.non_minimal_length")
        return value

    def vector(self, minimum: int = 0, maximum: int | None = None, field: str = "vector") -> bytes:
        n = self.varint()
        if n < minimum or (maximum is not None and n > maximum):
            bound = f"{minimum}..{maximum if maximum is not None else 'V'}"
            raise EncodingError(f"{self.what}: {field} length {n} outside {bound}", "encoding.vector_bounds")
        return self.fixed(n)

    def at_end(self) -> bool:
        return self.pos == len(self.data)

    def done(self) -> None:
        """A structure decoded exactly consumes every byte."""
        if self.pos != len(self.data):
            raise EncodingError(f"{self.what}: {len(self.data) - self.pos} trailing bytes", "encoding.trailing")
