"""The Marmot binary profile as the tooling uses it: fixed-width integers, fixed arrays, and
variable-length vectors with QUIC variable-length integer prefixes (foundation/canonical-encoding.md).

The codec is the MLS core's (`appliance.marmot.mls.codec`, its `quic_*` half); this module only
adapts it to the tooling: bounds named in errors, and Marmot's own error tree (EncodingError).
"""

from __future__ import annotations

from .errors import EncodingError
from .mls import codec
from .mls.errors import DecodeError

__all__ = ["MAX_VARINT", "quic_varint", "quic_vector", "uint16", "uint64", "Reader"]

MAX_VARINT = (1 << 62) - 1


def quic_varint(n: int) -> bytes:
    """Shortest QUIC variable-length integer encoding of n (RFC 9000, section 16)."""
    if type(n) is not int or not 0 <= n <= MAX_VARINT:
        raise EncodingError(f"length {n!r} cannot be a QUIC variable-length integer", "encoding.varint_range")
    return codec.quic_varint(n)


def quic_vector(data: bytes) -> bytes:
    """`opaque name<V>`: shortest QUIC length prefix, then the bytes."""
    return codec.quic_vl(bytes(data))


uint16 = codec.u16
uint64 = codec.u64


class Reader:
    """Reads one Marmot binary profile structure; every shortfall or excess is an EncodingError."""

    __slots__ = ("_r", "what")

    def __init__(self, data: bytes, what: str):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise EncodingError(f"{what}: expected bytes", "encoding.type")
        self._r = codec.Reader(bytes(data))
        self.what = what

    def _do(self, fn, *args):
        try:
            return fn(*args)
        except DecodeError as exc:
            text = str(exc)
            code = "encoding.non_minimal_length" if "non-minimal" in text else "encoding.truncated"
            raise EncodingError(f"{self.what}: {text}", code) from None

    def fixed(self, n: int) -> bytes:
        return self._do(self._r.fixed, n)

    def uint16(self) -> int:
        return self._do(self._r.u16)

    def uint64(self) -> int:
        return self._do(self._r.u64)

    def varint(self) -> int:
        return self._do(codec.read_quic_varint, self._r)

    def vector(self, minimum: int = 0, maximum: int | None = None, field: str = "vector") -> bytes:
        n = self.varint()
        if n < minimum or (maximum is not None and n > maximum):
            bound = f"{minimum}..{maximum if maximum is not None else 'V'}"
            raise EncodingError(f"{self.what}: {field} length {n} outside {bound}", "encoding.vector_bounds")
        return self.fixed(n)

    def at_end(self) -> bool:
        return self._r.done()

    def done(self) -> None:
        """A structure decoded exactly consumes every byte."""
        if not self._r.done():
            raise EncodingError(f"{self.what}: {self._r.end - self._r.pos} trailing bytes", "encoding.trailing")
