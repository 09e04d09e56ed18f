"""Our HPACK decoder (transports/hpack_decode.py) against the `hpack` library's encoder and decoder."""

from __future__ import annotations

import random
import uuid

import hpack
import pytest
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from appliance.transports.hpack_decode import DecodeError, Decoder, huffman_decode

_huffman = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)


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
    from hpack.huffman_table import decode_huffman

    rng = random.Random(3)
    for _trial in range(20_000):
        data = rng.randbytes(rng.randrange(0, 12))
        try:
            want = decode_huffman(data)
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
