"""Our HPACK decoder (transports/hpack_decode.py) against the `hpack` library's public encoder and
decoder; our copy of RFC 7541's tables (transports/hpack_tables.py) checked through them."""

from __future__ import annotations

import random
import uuid

import hpack
import pytest

from appliance.transports.hpack_decode import DecodeError, Decoder, huffman_decode
from appliance.transports.hpack_tables import HUFFMAN_CODE, STATIC_TABLE


class _Huffman:
    """RFC 7541 5.2's Huffman coding with our table (the encoder side, for the tests)."""

    @staticmethod
    def encode(data: bytes) -> bytes:
        bits, n = 0, 0
        for b in data:
            code, length = HUFFMAN_CODE[b]
            bits, n = (bits << length) | code, n + length
        pad = -n % 8
        bits, n = (bits << pad) | ((1 << pad) - 1), n + pad  # padded with the most significant bits of EOS
        return bits.to_bytes(n // 8, "big")


_huffman = _Huffman()


def _int(value: int, prefix: int, first: int) -> bytes:
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes([first | value])
    out, value = bytearray([first | mask]), value - mask
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _huffman_field(coded: bytes) -> bytes:
    """A header block of one literal field (name "x", not indexed) whose value is `coded`, a
    Huffman-coded string."""
    return b"\x00\x01x" + _int(len(coded), 7, 0x80) + coded


def test_our_tables_are_the_ones_hpack_decodes_with():
    """Every symbol's code, and every static entry, as the `hpack` library's decoder reads them."""
    for sym in range(256):
        assert hpack.Decoder().decode(_huffman_field(_huffman.encode(bytes([sym]))), raw=True) == [(b"x", bytes([sym]))]
    assert HUFFMAN_CODE[256] == (0x3FFFFFFF, 30)  # EOS
    for index, field in enumerate(STATIC_TABLE, start=1):
        assert hpack.Decoder().decode(_int(index, 7, 0x80)) == [field]


def test_answers_as_hpack_encodes_them_decode_as_hpack_decodes_them():
    rng = random.Random(2)
    for _trial in range(150):
        enc, ours, ref = hpack.Encoder(), Decoder(), hpack.Decoder()
        for _step in range(30):
            if rng.random() < 0.1:
                enc.header_table_size = rng.choice([0, 64, 300, 1000, 4096])
            fields = [(":status", rng.choice(["200", "400", "410", "503"])), ("apns-id", str(uuid.uuid4()))]
            if rng.random() < 0.5:
                fields.append(("content-type", "application/json"))
            if rng.random() < 0.3:
                fields.append(("x-" + "".join(rng.choice("abcdefé") for _ in range(rng.randrange(1, 40))),
                               "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(0, 200)))))
            block = enc.encode(fields, huffman=rng.random() < 0.8)
            assert ours.decode(block) == ref.decode(block) == fields


@pytest.mark.parametrize("text", [b"", b"a", b"www.example.com", b"no-cache", "é∂ƒ©".encode(), bytes(range(256))])
def test_huffman_strings(text):
    assert huffman_decode(_huffman.encode(text)) == text


def test_random_bytes_decode_as_hpack_decodes_them_or_fail_as_it_does():
    """Every short byte string: the same text as `hpack`, or refused where `hpack` refuses it."""
    rng = random.Random(3)
    for _trial in range(20_000):
        data = rng.randbytes(rng.randrange(0, 12))
        try:
            want = hpack.Decoder().decode(_huffman_field(data), raw=True)[0][1]
        except hpack.HPACKDecodingError:
            want = None
        try:
            got = huffman_decode(data)
        except DecodeError:
            got = None
        assert got == want, data


@pytest.mark.parametrize("bad,why", [
    (b"\x00", "padding"),  # eight zero bits: not a prefix of EOS
    (b"\xff\xff\xff\xff", "EOS"),  # the EOS symbol inside a string
    (_huffman.encode(b"a") + b"\xff", "padding"),  # padding longer than 7 bits
])
def test_invalid_huffman_strings(bad, why):
    with pytest.raises(DecodeError, match=why):
        huffman_decode(bad)


@pytest.mark.parametrize("block,why", [
    (b"\x80", "index 0"),
    (b"\xbe", "past the tables"),  # index 62 with an empty dynamic table
    (b"\x3f\xe2\x1f", "above"),  # table size update to 4097 > 4096 allowed
    (b"\x88\x20", "after a field"),  # a size update after a field
    (b"\x40\x05ab", "past the end"),
    (b"\x00\x01a\x02\xc3\x28", "UTF-8"),
    (b"\xff\xff\xff\xff\xff\xff", "too large"),
])
def test_malformed_blocks(block, why):
    with pytest.raises(DecodeError, match=why):
        Decoder().decode(block)


def test_the_header_list_size_is_bounded():
    block = hpack.Encoder().encode([("x-big", "v" * 2000)] * 3, huffman=False)
    assert len(Decoder(max_header_list_size=10_000).decode(block)) == 3
    with pytest.raises(DecodeError, match="too large"):
        Decoder(max_header_list_size=5_000).decode(block)
