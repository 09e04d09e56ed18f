"""Negentropy protocol version 1: range-based set reconciliation, the messages NIP-77 carries.

Two sides each hold records (a 64-bit timestamp and a 32-byte id: an event's created_at and id)
and learn, in a few round trips, which ids one side has and the other lacks. This follows the
reference implementation (hoytech/negentropy, which strfry embeds) to the byte: the same
messages for the same records and the same frame size limit, so either side may be the other
implementation. The wire format is docs/negentropy-protocol-v1.md of that project.

Records live in one `bytes` of 40-byte entries (the timestamp big-endian, then the id), sorted:
40 bytes a record (and about four more for partial sums), so the memory of a session is bounded by
its record count. A fingerprint takes the partial sum of whole blocks of 16 records and adds the
ids at its ends as four 64-bit columns of that buffer (a C-level `sum` per column).
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from hashlib import sha256
from itertools import islice
from typing import Iterable

PROTOCOL_VERSION = 0x61  # version 1
ID_SIZE = 32
FINGERPRINT_SIZE = 16
MAX_U64 = (1 << 64) - 1  # the "infinity" timestamp, never a record's
RECORD_SIZE = 8 + ID_SIZE
MODE_SKIP, MODE_FINGERPRINT, MODE_IDLIST = 0, 1, 2
BUCKETS = 16  # a range is split into this many fingerprints; fewer than twice as many records: the ids
MIN_FRAME_SIZE_LIMIT = 4096
MARK_EVERY = 16  # records between two stored partial sums (see Storage)
_MASK256 = (1 << 256) - 1
_ZERO_ID = bytes(ID_SIZE)
_INFINITY = (MAX_U64, b"")
# Column sums read the ids as native 64-bit words: little-endian machines only (the others add
# one integer per id).
_COLUMNS = sys.byteorder == "little"


class NegentropyError(ValueError):
    """A message that is not negentropy protocol version 1, or records that cannot be reconciled."""


def encode_varint(n: int) -> bytes:
    """Base-128 digits, most significant first, the high bit set on every byte but the last."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray((n & 0x7F,))
    n >>= 7
    while n:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.reverse()
    return bytes(out)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def more(self) -> bool:
        return self.pos < len(self.data)

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise NegentropyError("parse ends prematurely")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise NegentropyError("parse ends prematurely")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def varint(self) -> int:
        data, pos = self.data, self.pos
        res = 0
        while True:
            if pos >= len(data):
                raise NegentropyError("premature end of varint")
            b = data[pos]
            pos += 1
            res = (res << 7) | (b & 0x7F)
            if res > MAX_U64:  # the reference wraps a 64-bit integer; an honest peer never sends one
                raise NegentropyError("varint too large")
            if not b & 0x80:
                break
        self.pos = pos
        return res


class Storage:
    """The sealed records of one side: sorted by (timestamp, id), no two alike."""

    __slots__ = ("blob", "n", "_words", "_marks")

    def __init__(self, blob: bytes = b""):
        if len(blob) % RECORD_SIZE:
            raise NegentropyError("records are 40 bytes each")
        self.blob = bytes(blob)
        self.n = len(blob) // RECORD_SIZE
        self._words = memoryview(self.blob).cast("Q") if _COLUMNS and self.blob else None
        # The sum of the ids before every MARK_EVERY-th record: a fingerprint of any range then adds
        # at most 2 x MARK_EVERY ids, not a pass over every record: docs/performance.md#mark_every
        marks = [0]
        total = 0
        for start in range(0, self.n - MARK_EVERY + 1, MARK_EVERY):
            total += self._sum(start, start + MARK_EVERY)
            marks.append(total)
        self._marks = marks

    @classmethod
    def from_items(cls, items: Iterable[tuple[int, bytes]]) -> "Storage":
        """From (timestamp, 32-byte id) pairs in any order; a repeated record is refused."""
        keys = []
        for timestamp, id_ in items:
            keys.append(_record(timestamp, id_))
        keys.sort()
        for i in range(1, len(keys)):
            if keys[i] == keys[i - 1]:
                raise NegentropyError("duplicate item inserted")
        return cls(b"".join(keys))

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, str]], max_records: int | None = None,
                  chunk: int = 65536) -> "Storage":
        """From (created_at, hex id) rows in ascending created_at (within each run of `chunk` rows
        in any order; a repeated row counted once), packed a chunk at a time: no more memory than
        the result and one chunk. Past `max_records` records: TooManyRecords. (Per chunk, C-level
        list building and a sort of nearly sorted keys: 1,000,000 rows in about 0.5 s, where a
        Python step per row took 3.5.)"""
        out = bytearray()
        rows = iter(rows)
        carry: list[bytes] = []  # the last second of the previous chunk: more of it may follow
        last = b""
        count = 0
        while True:
            part = list(islice(rows, chunk))
            try:
                keys = [created_at.to_bytes(8, "big") + bytes.fromhex(hex_id) for created_at, hex_id in part]
            except (OverflowError, ValueError, TypeError):
                raise NegentropyError("a row's created_at or id is not a record's") from None
            if any(len(k) != RECORD_SIZE for k in keys):
                raise NegentropyError("a row's id is not 32 bytes")
            # Nothing may come before what was packed, nor before the second held back.
            if keys and min(keys) < (carry[0][:8] if carry else last):
                raise NegentropyError("rows out of created_at order")
            keys = carry + keys
            keys.sort()
            if part:
                cut = bisect_left(keys, keys[-1][:8])  # the first of the last second
                keys, carry = keys[:cut], keys[cut:]
            else:
                carry = []
            if keys:
                if len(set(keys)) != len(keys):
                    keys = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
                out += b"".join(keys)
                last = keys[-1]
                count += len(keys)
                if max_records is not None and count > max_records:
                    raise TooManyRecords(max_records)
            if not part:
                return cls(bytes(out))

    def size(self) -> int:
        return self.n

    def timestamp(self, i: int) -> int:
        o = i * RECORD_SIZE
        return int.from_bytes(self.blob[o:o + 8], "big")

    def id(self, i: int) -> bytes:
        o = i * RECORD_SIZE + 8
        return self.blob[o:o + ID_SIZE]

    def ids(self, begin: int, end: int) -> list[bytes]:
        blob = self.blob
        return [blob[o + 8:o + RECORD_SIZE] for o in range(begin * RECORD_SIZE, end * RECORD_SIZE, RECORD_SIZE)]

    def lower_bound(self, begin: int, end: int, key: bytes) -> int:
        """The first index in [begin, end) whose record is not below `key` (40 bytes), else end."""
        blob = self.blob
        lo, hi = begin, end
        while lo < hi:
            mid = (lo + hi) >> 1
            o = mid * RECORD_SIZE
            if blob[o:o + RECORD_SIZE] < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def fingerprint(self, begin: int, end: int) -> bytes:
        """SHA-256 of (the ids as little-endian integers added mod 2**256, then the count as a
        varint), its first 16 bytes."""
        n = end - begin
        if n <= 0:
            total = 0
        elif n <= 2 * MARK_EVERY:
            total = self._sum(begin, end)
        else:  # whole blocks from the marks, the ends added one by one
            first = -(-begin // MARK_EVERY)
            last = end // MARK_EVERY
            marks = self._marks
            total = (marks[last] - marks[first] + self._sum(begin, first * MARK_EVERY)
                     + self._sum(last * MARK_EVERY, end))
        digest = sha256((total & _MASK256).to_bytes(ID_SIZE, "little") + encode_varint(max(n, 0))).digest()
        return digest[:FINGERPRINT_SIZE]

    def _sum(self, begin: int, end: int) -> int:
        """The ids of records [begin, end) added as integers (not reduced mod 2**256)."""
        if end <= begin:
            return 0
        w = self._words
        if w is not None:
            a, b = begin * 5, end * 5
            return (sum(w[a + 1:b:5]) + (sum(w[a + 2:b:5]) << 64) + (sum(w[a + 3:b:5]) << 128)
                    + (sum(w[a + 4:b:5]) << 192))
        blob = self.blob
        return sum(int.from_bytes(blob[o + 8:o + RECORD_SIZE], "little")
                   for o in range(begin * RECORD_SIZE, end * RECORD_SIZE, RECORD_SIZE))


class TooManyRecords(NegentropyError):
    def __init__(self, limit: int):
        super().__init__(f"more than {limit} records")
        self.limit = limit


def _timestamp_bytes(timestamp: int) -> bytes:
    if not 0 <= timestamp < MAX_U64:
        raise NegentropyError("timestamp out of range")
    return timestamp.to_bytes(8, "big")


def _record(timestamp: int, id_: bytes) -> bytes:
    if len(id_) != ID_SIZE:
        raise NegentropyError("bad id size for added item")
    return _timestamp_bytes(timestamp) + bytes(id_)


def _bound_key(bound: tuple[int, bytes]) -> bytes:
    timestamp, prefix = bound
    return timestamp.to_bytes(8, "big") + prefix + _ZERO_ID[len(prefix):]


class Negentropy:
    """One side of a reconciliation over `storage`. The client (initiator) calls `initiate()` and
    then `reconcile_client(reply)` with each reply; the server answers each message with
    `reconcile(message)`. With `frame_size_limit`, no message built here is longer than that
    (in bytes, before hex encoding): the rest of the work is left to later rounds."""

    def __init__(self, storage: Storage, frame_size_limit: int = 0):
        if frame_size_limit and frame_size_limit < MIN_FRAME_SIZE_LIMIT:
            raise ValueError("frameSizeLimit too small")
        self.storage = storage
        self.frame_size_limit = frame_size_limit
        self.is_initiator = False
        self._last_in = 0
        self._last_out = 0

    def initiate(self) -> bytes:
        if self.is_initiator:
            raise NegentropyError("already initiated")
        self.is_initiator = True
        out = bytearray((PROTOCOL_VERSION,))
        out += self._split_range(0, self.storage.n, _INFINITY)
        return bytes(out)

    def set_initiator(self) -> None:
        self.is_initiator = True

    def reconcile(self, query: bytes) -> bytes:
        """The server's answer to one message."""
        if self.is_initiator:
            raise NegentropyError("initiator not asking for have/need IDs")
        return self._reconcile(query, None, None)

    def reconcile_client(self, query: bytes) -> tuple[bytes | None, list[bytes], list[bytes]]:
        """(the next message, or None when reconciliation is complete; ids only this side has;
        ids only the other side has) for one reply of the server."""
        if not self.is_initiator:
            raise NegentropyError("non-initiator asking for have/need IDs")
        have: list[bytes] = []
        need: list[bytes] = []
        out = self._reconcile(query, have, need)
        return (None if len(out) == 1 else out), have, need

    # -- the algorithm (the reference's reconcileAux) ---------------------------------------------

    def _exceeded(self, n: int) -> bool:
        return bool(self.frame_size_limit) and n > self.frame_size_limit - 200

    def _reconcile(self, query: bytes, have: list | None, need: list | None) -> bytes:
        self._last_in = self._last_out = 0
        full = bytearray((PROTOCOL_VERSION,))
        r = _Reader(bytes(query))
        version = r.byte()
        if version < 0x60 or version > 0x6F:
            raise NegentropyError("invalid negentropy protocol version byte")
        if version != PROTOCOL_VERSION:
            if self.is_initiator:
                raise NegentropyError(f"unsupported negentropy protocol version requested: {version - 0x60}")
            return bytes(full)  # our version: the client may downgrade and try again

        storage = self.storage
        size = storage.n
        initiator = self.is_initiator
        prev_bound: tuple[int, bytes] = (0, b"")
        prev_index = 0
        skip = False
        while r.more():
            o = bytearray()
            curr_bound = self._decode_bound(r)
            mode = r.varint()
            lower = prev_index
            upper = storage.lower_bound(prev_index, size, _bound_key(curr_bound))

            if mode == MODE_SKIP:
                skip = True
            elif mode == MODE_FINGERPRINT:
                theirs = r.take(FINGERPRINT_SIZE)
                if theirs != storage.fingerprint(lower, upper):
                    if skip:
                        skip = False
                        o += self._encode_bound(prev_bound)
                        o.append(MODE_SKIP)
                    o += self._split_range(lower, upper, curr_bound)
                else:
                    skip = True
            elif mode == MODE_IDLIST:
                num = r.varint()
                if num * ID_SIZE > len(r.data) - r.pos:
                    raise NegentropyError("parse ends prematurely")
                if initiator:
                    start = r.pos
                    data = r.data
                    theirs = {data[p:p + ID_SIZE] for p in range(start, start + num * ID_SIZE, ID_SIZE)}
                    r.pos = start + num * ID_SIZE
                    skip = True
                    for id_ in storage.ids(lower, upper):
                        if id_ in theirs:
                            theirs.discard(id_)
                        else:
                            have.append(id_)  # ours only
                    need.extend(theirs)  # theirs only
                else:
                    r.pos += num * ID_SIZE
                    if skip:
                        skip = False
                        o += self._encode_bound(prev_bound)
                        o.append(MODE_SKIP)
                    end_bound = curr_bound
                    count = upper - lower
                    if self.frame_size_limit:
                        # As many ids as fit; the rest of the range goes to the final fingerprint.
                        room = self.frame_size_limit - 200 - len(full)
                        fit = max(0, room // ID_SIZE + 1) if room >= 0 else 0
                        if fit < count:
                            upper = lower + fit
                            count = fit
                            end_bound = (storage.timestamp(upper), storage.id(upper))
                    o += self._encode_bound(end_bound)
                    o.append(MODE_IDLIST)
                    o += encode_varint(count)
                    o += b"".join(storage.ids(lower, upper))
                    full += o
                    o = bytearray()
            else:
                raise NegentropyError("unexpected mode")

            if self._exceeded(len(full) + len(o)):
                # Over the frame size limit: one fingerprint for everything from here on.
                full += self._encode_bound(_INFINITY)
                full.append(MODE_FINGERPRINT)
                full += storage.fingerprint(upper, size)
                break
            full += o
            prev_index = upper
            prev_bound = curr_bound
        return bytes(full)

    def _split_range(self, lower: int, upper: int, upper_bound: tuple[int, bytes]) -> bytearray:
        storage = self.storage
        o = bytearray()
        n = upper - lower
        if n < BUCKETS * 2:
            o += self._encode_bound(upper_bound)
            o.append(MODE_IDLIST)
            o += encode_varint(n)
            o += b"".join(storage.ids(lower, upper))
            return o
        per, extra = divmod(n, BUCKETS)
        curr = lower
        for i in range(BUCKETS):
            bucket = per + (1 if i < extra else 0)
            fingerprint = storage.fingerprint(curr, curr + bucket)
            curr += bucket
            if curr == upper:
                bound = upper_bound
            else:
                bound = self._minimal_bound(curr - 1, curr)
            o += self._encode_bound(bound)
            o.append(MODE_FINGERPRINT)
            o += fingerprint
        return o

    def _minimal_bound(self, prev: int, curr: int) -> tuple[int, bytes]:
        """The shortest bound above record `prev` and not above record `curr`."""
        storage = self.storage
        timestamp = storage.timestamp(curr)
        if timestamp != storage.timestamp(prev):
            return (timestamp, b"")
        a, b = storage.id(prev), storage.id(curr)
        shared = 0
        while shared < ID_SIZE and a[shared] == b[shared]:
            shared += 1
        return (timestamp, b[:shared + 1])

    # -- bounds ----------------------------------------------------------------------------------

    def _decode_bound(self, r: _Reader) -> tuple[int, bytes]:
        encoded = r.varint()
        timestamp = MAX_U64 if encoded == 0 else encoded - 1
        timestamp = min(timestamp + self._last_in, MAX_U64)  # saturates at infinity
        self._last_in = timestamp
        length = r.varint()
        if length > ID_SIZE:
            raise NegentropyError("bad id size for Bound")
        return (timestamp, r.take(length))

    def _encode_bound(self, bound: tuple[int, bytes]) -> bytes:
        timestamp, prefix = bound
        if timestamp == MAX_U64:
            self._last_out = MAX_U64
            head = b"\x00"
        else:
            delta = timestamp - self._last_out
            if delta < 0:  # only from bounds a peer sent out of order
                raise NegentropyError("bounds out of order")
            self._last_out = timestamp
            head = encode_varint(delta + 1)
        return head + encode_varint(len(prefix)) + prefix
