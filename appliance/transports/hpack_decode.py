"""HPACK decoding (RFC 7541) for the HTTP/2 client's answers, faster than `hpack.Decoder` on them.

An APNs answer is a status, an `apns-id` (Huffman-coded, new each time, so it is added to the
dynamic table every time) and sometimes a content type: `hpack` decodes Huffman strings four
bits at a time in Python (docs/performance.md#hpack-decoding). This decoder walks Huffman strings a
byte at a time through a 256-state table composed once from the code (RFC 7541 Appendix B) as
`hpack` ships it (a row per state, invalid strings caught once at their end), and keeps its
dynamic table as a plain list. The static table
and the Huffman code are the RFC's data (`hpack_tables`), checked against the `hpack` library's
public encoder and decoder in the tests.
"""

from __future__ import annotations

from .hpack_tables import HUFFMAN_CODE, STATIC_TABLE

__all__ = ["DecodeError", "Decoder"]

_STATIC = list(STATIC_TABLE)
_STATIC_SIZE = [len(n.encode()) + len(v.encode()) + 32 for n, v in STATIC_TABLE]
_EOS = 256


class DecodeError(Exception):
    """The header block breaks RFC 7541 (a COMPRESSION_ERROR for the connection)."""


def _build_tables() -> tuple[list, list[bool]]:
    """The byte-at-a-time Huffman decoder: for each state, for each byte, (next state, the bytes
    that completes), the last state being the sink of invalid strings (EOS inside them); and
    whether ending a string in a state is valid padding (RFC 7541 5.2: fewer than 8 bits, all ones)."""
    # The code tree: node 0 is the root; children[node] = [child for bit 0, child for bit 1];
    # a child >= 0 is a node, a child < 0 is the leaf of symbol -child - 1.
    children: list[list[int | None]] = [[None, None]]
    for sym, (code, length) in enumerate(HUFFMAN_CODE):
        node = 0
        for i in range(length - 1, -1, -1):
            bit = (code >> i) & 1
            if i == 0:
                children[node][bit] = -sym - 1
            else:
                nxt = children[node][bit]
                if nxt is None:
                    nxt = len(children)
                    children.append([None, None])
                    children[node][bit] = nxt
                node = nxt
    # Padding: the states reached from the root by at most 7 one-bits.
    accept = [False] * len(children)
    node, depth = 0, 0
    while node is not None and node >= 0 and depth <= 7:
        accept[node] = True
        node, depth = children[node][1], depth + 1
    # Four bits at a time first, then bytes as two nibbles.
    nibble: list = []
    for state in range(len(children)):
        for n in range(16):
            node, out, ok = state, bytearray(), True
            for i in (3, 2, 1, 0):
                child = children[node][(n >> i) & 1]
                if child is None or child == -_EOS - 1:
                    ok = False
                    break
                if child < 0:
                    out.append(-child - 1)
                    node = 0
                else:
                    node = child
            nibble.append((node, bytes(out)) if ok else None)
    # One row of 256 (next state, bytes completed) per state; an invalid byte leads to the extra
    # state `sink`, which every byte leaves as it is and where no string may end (checked once, at
    # the end of the string, instead of at every byte).
    sink = len(children)
    rows: list[list[tuple[int, bytes]]] = []
    for state in range(len(children)):
        row = []
        for b in range(256):
            first = nibble[state << 4 | b >> 4]
            second = None if first is None else nibble[first[0] << 4 | (b & 15)]
            row.append((sink, b"") if second is None else (second[0], first[1] + second[1]))
        rows.append(row)
    rows.append([(sink, b"")] * 256)
    return rows, accept + [False]


_tables: tuple[list, list[bool]] | None = None


def huffman_decode(data: bytes) -> bytes:
    global _tables
    if _tables is None:
        _tables = _build_tables()
    rows, accept = _tables
    state, out = 0, bytearray()
    for b in data:
        state, done = rows[state][b]
        out += done
    if not accept[state]:
        if state == len(rows) - 1:
            raise DecodeError("an invalid Huffman string (EOS inside it)")
        raise DecodeError("invalid Huffman padding")
    return bytes(out)


class Decoder:
    """One connection's HPACK decoder (its dynamic table), limited to `max_table_size` (what we
    advertised as SETTINGS_HEADER_TABLE_SIZE) and `max_header_list_size` per block."""

    def __init__(self, max_table_size: int = 4096, max_header_list_size: int = 65536):
        self.max_allowed = max_table_size
        self.max_size = max_table_size
        self.max_header_list_size = max_header_list_size
        self._dynamic: list[tuple[str, str, int]] = []  # newest first: (name, value, size)
        self._size = 0

    def _int(self, data: bytes, pos: int, prefix: int) -> tuple[int, int]:
        mask = (1 << prefix) - 1
        value = data[pos] & mask
        pos += 1
        if value < mask:
            return value, pos
        shift = 0
        while True:
            if pos >= len(data):
                raise DecodeError("an integer cut short")
            b = data[pos]
            pos += 1
            value += (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value, pos
            if shift > 28:
                raise DecodeError("an integer too large")

    def _string(self, data: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(data):
            raise DecodeError("a string cut short")
        huffman = data[pos] & 0x80
        length, pos = self._int(data, pos, 7)
        end = pos + length
        if end > len(data):
            raise DecodeError("a string past the end of the block")
        raw = data[pos:end]
        return (huffman_decode(raw) if huffman else raw), end

    def _field(self, index: int) -> tuple[str, str, int]:
        if index <= 0:
            raise DecodeError("index 0")
        if index <= 61:
            n, v = _STATIC[index - 1]
            return n, v, _STATIC_SIZE[index - 1]
        try:
            return self._dynamic[index - 62]
        except IndexError:
            raise DecodeError(f"index {index} past the tables") from None

    def _add(self, name: str, value: str, size: int) -> None:
        if size > self.max_size:
            self._dynamic.clear()
            self._size = 0
            return
        while self._size + size > self.max_size:
            self._size -= self._dynamic.pop()[2]
        self._dynamic.insert(0, (name, value, size))
        self._size += size

    def decode(self, data: bytes) -> list[tuple[str, str]]:
        """The fields of one complete header block, in order."""
        out: list[tuple[str, str]] = []
        pos, end, total, fields_seen = 0, len(data), 0, False
        try:
            while pos < end:
                b = data[pos]
                if b & 0x80:  # indexed field (6.1)
                    index, pos = self._int(data, pos, 7)
                    name, value, size = self._field(index)
                elif b & 0xE0 == 0x20:  # dynamic table size update (6.3): only before any field
                    if fields_seen:
                        raise DecodeError("a table size update after a field")
                    size, pos = self._int(data, pos, 5)
                    if size > self.max_allowed:
                        raise DecodeError(f"a table size of {size} above the {self.max_allowed} allowed")
                    self.max_size = size
                    while self._size > size:
                        self._size -= self._dynamic.pop()[2]
                    continue
                else:  # literals (6.2): with incremental indexing (01), without (0000), never (0001)
                    indexing = b & 0xC0 == 0x40
                    index, pos = self._int(data, pos, 6 if indexing else 4)
                    if index:
                        name, _v, _s = self._field(index)
                        name_len = len(name.encode())
                    else:
                        raw_name, pos = self._string(data, pos)
                        name, name_len = raw_name.decode(), len(raw_name)
                    raw_value, pos = self._string(data, pos)
                    value = raw_value.decode()
                    size = name_len + len(raw_value) + 32
                    if indexing:
                        self._add(name, value, size)
                fields_seen = True
                total += size
                if total > self.max_header_list_size:
                    raise DecodeError("the header list is too large")
                out.append((name, value))
        except UnicodeDecodeError:
            raise DecodeError("a field that is not UTF-8") from None
        return out
