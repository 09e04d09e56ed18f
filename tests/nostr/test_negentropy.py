"""Negentropy protocol version 1 (appliance.nostr.negentropy) against the reference implementation.

negentropy_vectors.json holds what hoytech/negentropy's C++ implementation sent, message by message,
reconciling the record sets of negentropy_vectors.py (client and server both the reference). Here
both sides are ours and every message must be the same bytes; the ids learnt must be the same.
"""

from __future__ import annotations

import json

import pytest

from appliance.nostr.negentropy import (
    MAX_U64,
    Negentropy,
    NegentropyError,
    Storage,
    TooManyRecords,
    encode_varint,
)
from tests.nostr.negentropy_vectors import SCENARIOS, VECTORS, digest, id_set_digest, records

EXPECTED = json.loads(VECTORS.read_text())


def _storage(items):
    return Storage.from_items((ts, bytes.fromhex(i)) for ts, i in items)


def reconcile(client_items, server_items, limit1=0, limit2=0):
    """Our client against our server: (trace of message digests, have, need)."""
    client = Negentropy(_storage(client_items), limit1)
    server = Negentropy(_storage(server_items), limit2)
    trace, have, need = [], set(), set()
    msg = client.initiate()
    while True:
        assert not limit1 or len(msg) <= limit1
        trace.append(digest(msg.hex()))
        reply = server.reconcile(msg)
        assert not limit2 or len(reply) <= limit2
        trace.append(digest(reply.hex()))
        msg, h, n = client.reconcile_client(reply)
        have.update(x.hex() for x in h)
        need.update(x.hex() for x in n)
        if msg is None:
            return trace, have, need


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_messages_as_the_reference(name):
    _n, _p1, _p2, _spread, limit1, limit2 = SCENARIOS[name]
    client_items, server_items = records(name)
    trace, have, need = reconcile(client_items, server_items, limit1, limit2)
    expected = EXPECTED[name]
    assert trace == expected["trace"]
    assert [len(have), id_set_digest(have)] == expected["have"]
    assert [len(need), id_set_digest(need)] == expected["need"]
    # and the ids learnt are the true differences
    client_ids = {i for _t, i in client_items}
    server_ids = {i for _t, i in server_items}
    assert have == client_ids - server_ids and need == server_ids - client_ids


def test_protocol_version_negotiation():
    # The reference suite's protoversion.pl: a server sent a version it does not speak answers
    # with the one it does (0x61), then serves version 1 as usual.
    server = Negentropy(Storage.from_items([(12345, bytes.fromhex("ee" * 32))]))
    assert server.reconcile(bytes.fromhex("62aabbccddeeff")) == b"\x61"
    first = server.reconcile(bytes.fromhex("6100000200"))
    # full range, empty IdList in; our one id back: bound infinity, IdList of 1
    assert first == bytes.fromhex("61" + "00" + "00" + "02" + "01" + "ee" * 32)
    with pytest.raises(NegentropyError):
        server.reconcile(bytes.fromhex("50"))  # not a negentropy version byte
    client = Negentropy(Storage())
    client.initiate()
    with pytest.raises(NegentropyError):
        client.reconcile_client(b"\x62")


@pytest.mark.parametrize("hex_msg", [
    "",  # no version byte
    "61ff",  # varint cut short
    "610003",  # unknown mode
    "610021" + "00" * 33,  # bound id prefix of 33 bytes
    "61000001" + "00" * 15,  # fingerprint cut short
    "6100000205" + "00" * 64,  # IdList announcing 5 ids, carrying 2
    "61" + "ff" * 10 + "00",  # a varint past 64 bits
])
def test_malformed_messages_are_refused(hex_msg):
    server = Negentropy(Storage.from_items([(1, bytes(32))]))
    with pytest.raises(NegentropyError):
        server.reconcile(bytes.fromhex(hex_msg))


def test_varint_encoding():
    assert encode_varint(0) == b"\x00"
    assert encode_varint(127) == b"\x7f"
    assert encode_varint(128) == b"\x81\x00"
    assert encode_varint(16384) == b"\x81\x80\x00"
    assert encode_varint(MAX_U64) == bytes([0x81] + [0xff] * 8 + [0x7f])


def test_storage_from_rows_sorts_each_second_and_bounds_the_count():
    items = [(5, "bb" * 32), (5, "aa" * 32), (5, "bb" * 32), (7, "cc" * 32), (9, "01" * 32)]
    storage = Storage.from_rows(items)
    assert storage.n == 4  # the repeated row once
    assert storage.blob == _storage(dict.fromkeys(items)).blob
    assert Storage.from_rows(items, max_records=4).n == 4
    with pytest.raises(TooManyRecords) as exc:
        Storage.from_rows(items, max_records=3)
    assert exc.value.limit == 3
    with pytest.raises(NegentropyError):
        Storage.from_rows([(9, "aa" * 32), (9, "cc" * 32), (8, "bb" * 32)], chunk=2)  # not in created_at order
    with pytest.raises(NegentropyError):
        Storage.from_rows([(9, "aa" * 31)])  # not a 32-byte id
    # Chunks: a second's records split across chunks, rows of a chunk in any order.
    import random

    rng = random.Random(3)
    rows = sorted((rng.randrange(50), rng.randbytes(32).hex()) for _ in range(500))
    for size in (1, 2, 7, 64, 1000):
        shuffled = []
        for i in range(0, len(rows), size):
            part = rows[i:i + size]
            rng.shuffle(part)
            shuffled += part
        assert Storage.from_rows(shuffled + shuffled[-3:][::-1] if size == 1000 else shuffled, chunk=size).blob \
            == _storage(rows).blob
    with pytest.raises(NegentropyError):
        Storage.from_items([(1, bytes(32)), (1, bytes(32))])
    with pytest.raises(NegentropyError):
        Storage.from_items([(MAX_U64, bytes(32))])  # the infinity timestamp is no record's


def test_fingerprint_of_column_sums_equals_integer_sum():
    # The fingerprint adds ids as four 64-bit columns; the definition adds 256-bit integers.
    import hashlib
    import random

    rng = random.Random(7)
    ids = [bytes([0xff] * 32)] * 1 + [rng.randbytes(32) for _ in range(999)]
    storage = Storage.from_items((i, id_) for i, id_ in enumerate(ids))
    # (across the partial sums kept every 16 records: on a mark, between, whole blocks, short ranges)
    for begin, end in ((0, 1000), (0, 1), (17, 530), (999, 1000), (3, 3), (64, 960), (63, 193), (0, 128),
                       (15, 49), (16, 48), (1, 129), (128, 999), (100, 260), (17, 47)):
        total = sum(int.from_bytes(storage.id(i), "little") for i in range(begin, end)) % (1 << 256)
        expected = hashlib.sha256(total.to_bytes(32, "little") + encode_varint(end - begin)).digest()[:16]
        assert storage.fingerprint(begin, end) == expected


def test_frame_size_limit_too_small():
    with pytest.raises(ValueError):
        Negentropy(Storage(), 4095)
