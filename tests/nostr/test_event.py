"""NIP-01 event parsing, canonical serialization, ids, signatures and kind helpers."""

from __future__ import annotations

import hashlib
import time
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.nostr.event import (
    MAX_SAFE_INT,
    Event,
    InvalidEvent,
    canonical_json,
    compute_id,
    d_tag,
    expiration,
    is_addressable,
    is_ephemeral,
    is_regular,
    is_replaceable,
    parse_event,
    sign_event,
    verify_event,
    verify_id,
    verify_signature,
)
from appliance.nostr.keys import public_key

from .helpers import SK1, SK3


def _reference(pubkey, created_at, kind, tags, content) -> bytes:
    # json.dumps with these options escapes exactly as JSON.stringify.
    return json.dumps(
        [0, pubkey, created_at, kind, tags, content], ensure_ascii=False, separators=(",", ":")
    ).encode("utf-8")


TRICKY = [
    "",
    "plain",
    'quote " and backslash \\ and slash /',
    "".join(chr(i) for i in range(0x20)),  # every C0 control
    "\x7f DEL stays raw",
    "\u2028\u2029 line/paragraph separators stay raw",
    "é ü ñ 中文 日本語 한국어",
    "emoji 😀🦄👩‍👩‍👧 and astral \U0010ffff",
    "\ufeff BOM and \ufffd replacement",
    "tabs\tnew\nlines\rreturn\bback\fform",
    "<script>&amp;</script>",
]


@pytest.mark.parametrize("s", TRICKY)
def test_canonical_json_matches_reference(s):
    pk = "a" * 64
    tags = [["t", s], ["p", pk, s, ""]]
    assert canonical_json(pk, 1700000000, 1, tags, s) == _reference(pk, 1700000000, 1, tags, s)


def test_canonical_json_exact_bytes():
    out = canonical_json("ab" * 32, 1, 7, [["e", "x"]], 'a"b\\c\n\x01é')
    assert out == b'[0,"' + b"ab" * 32 + b'",1,7,[["e","x"]],"a\\"b\\\\c\\n\\u0001\xc3\xa9"]'


@settings(max_examples=300, deadline=None, database=None)
@given(
    content=st.text(st.characters(blacklist_categories=("Cs",))),
    tagval=st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
    created_at=st.integers(0, MAX_SAFE_INT),
    kind=st.integers(0, 65535),
)
def test_canonical_json_property(content, tagval, created_at, kind):
    tags = [["x", tagval]]
    assert canonical_json("f" * 64, created_at, kind, tags, content) == _reference(
        "f" * 64, created_at, kind, tags, content
    )


def test_lone_surrogate_cannot_be_serialized():
    with pytest.raises(InvalidEvent):
        canonical_json("a" * 64, 1, 1, [], "\ud800")
    ev = Event("0" * 64, "a" * 64, 1, 1, [], "\ud800", "0" * 128)
    assert verify_id(ev) is False
    assert verify_event(ev) is False


def _good():
    return sign_event(SK3, 1, [["p", "b" * 64], ["t", "nostr"]], "hello", created_at=1700000000).to_dict()


def test_sign_parse_verify_roundtrip():
    d = _good()
    ev = parse_event(d)
    assert ev.to_dict() == d
    assert ev.pubkey == public_key(SK3)
    assert verify_id(ev) and verify_signature(ev) and verify_event(ev)
    assert ev.id == hashlib.sha256(canonical_json(ev.pubkey, ev.created_at, ev.kind, ev.tags, ev.content)).hexdigest()
    assert ev.id == compute_id(ev.pubkey, ev.created_at, ev.kind, ev.tags, ev.content)
    assert orjson.loads(ev.to_json()) == d
    assert ev.to_json() == json.dumps(d, ensure_ascii=False, separators=(",", ":"))
    assert parse_event(orjson.loads(ev.to_json_bytes())) == ev
    # strfry's serialization (keys in alphabetical order): exports round-trip byte for byte
    assert list(orjson.loads(ev.to_json())) == ["content", "created_at", "id", "kind", "pubkey", "sig", "tags"]


def test_sign_event_default_created_at_and_copies_tags():
    tags = [("t", "x")]
    ev = sign_event(SK1, 1, tags, "")
    assert abs(ev.created_at - time.time()) < 5
    assert ev.tags == [["t", "x"]] and type(ev.tags[0]) is list
    assert verify_event(ev)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: "not a dict", "event must be a JSON object"),
        (lambda d: [d], "event must be a JSON object"),
        (lambda d: d.pop("sig") and d, "missing field: sig"),
        (lambda d: d.update(extra=1) or d, "unexpected field: extra"),
        (lambda d: d.update(id=d["id"].upper()) or d, "id must be 64 lowercase hex characters"),
        (lambda d: d.update(id=d["id"][:-1]) or d, "id must be 64 lowercase hex characters"),
        (lambda d: d.update(id=d["id"] + "0") or d, "id must be 64 lowercase hex characters"),
        (lambda d: d.update(id=d["id"][:-1] + "\n") or d, "id must be 64 lowercase hex characters"),
        (lambda d: d.update(pubkey=1) or d, "pubkey must be 64 lowercase hex characters"),
        (lambda d: d.update(pubkey="g" * 64) or d, "pubkey must be 64 lowercase hex characters"),
        (lambda d: d.update(sig=d["sig"][:64]) or d, "sig must be 128 lowercase hex characters"),
        (lambda d: d.update(created_at=True) or d, "created_at must be an integer between 0 and 2^53-1"),
        (lambda d: d.update(created_at=-1) or d, "created_at must be an integer between 0 and 2^53-1"),
        (lambda d: d.update(created_at=2**53) or d, "created_at must be an integer between 0 and 2^53-1"),
        (lambda d: d.update(created_at=1.0) or d, "created_at must be an integer between 0 and 2^53-1"),
        (lambda d: d.update(created_at="1") or d, "created_at must be an integer between 0 and 2^53-1"),
        (lambda d: d.update(kind=False) or d, "kind must be an integer between 0 and 65535"),
        (lambda d: d.update(kind=65536) or d, "kind must be an integer between 0 and 65535"),
        (lambda d: d.update(kind=-1) or d, "kind must be an integer between 0 and 65535"),
        (lambda d: d.update(tags={}) or d, "tags must be an array"),
        (lambda d: d.update(tags=["p"]) or d, "each tag must be an array"),
        (lambda d: d.update(tags=[[]]) or d, "tags must not be empty arrays"),
        (lambda d: d.update(tags=[["p", 1]]) or d, "tag elements must be strings"),
        (lambda d: d.update(tags=[["p", None]]) or d, "tag elements must be strings"),
        (lambda d: d.update(content=None) or d, "content must be a string"),
        (lambda d: d.update(content=["x"]) or d, "content must be a string"),
    ],
)
def test_parse_event_rejections(mutate, reason):
    with pytest.raises(InvalidEvent) as info:
        parse_event(mutate(_good()))
    assert info.value.reason == reason
    assert str(info.value) == reason
    assert isinstance(info.value, ValueError)


def test_parse_event_bounds_accepted():
    d = _good()
    d.update(created_at=MAX_SAFE_INT, kind=65535, tags=[], content="")
    assert parse_event(d).created_at == MAX_SAFE_INT
    d.update(created_at=0, kind=0)
    assert parse_event(d).kind == 0


def test_verify_detects_tampering():
    d = _good()
    for field, value in [
        ("content", "hellO"),
        ("created_at", 1700000001),
        ("kind", 2),
        ("tags", [["p", "b" * 64]]),
    ]:
        t = dict(d, **{field: value})
        ev = parse_event(t)
        assert not verify_id(ev) and not verify_event(ev), field
    # valid id but someone else's signature
    other = sign_event(SK1, 1, [], "x", created_at=1)
    ev = parse_event(dict(d, sig=other.sig))
    assert verify_id(ev) and not verify_signature(ev) and not verify_event(ev)
    # id recomputed for a different pubkey without a matching signature
    pk = public_key(SK1)
    new_id = compute_id(pk, d["created_at"], d["kind"], d["tags"], d["content"])
    ev = parse_event(dict(d, pubkey=pk, id=new_id))
    assert verify_id(ev) and not verify_event(ev)


def test_verify_never_raises_on_bad_hex():
    for ev in [
        Event("zz" * 32, "a" * 64, 1, 1, [], "", "0" * 128),
        Event("0" * 64, "zz" * 32, 1, 1, [], "", "0" * 128),
        Event("0" * 64, "0" * 64, 1, 1, [], "", "0" * 128),  # x=0 is not on the curve
        Event("0" * 64, "a" * 64, 1, 1, [], "", "zz" * 64),
        Event("0" * 64, "a" * 64, 1, 1, [], "", "00"),
        Event("0" * 64, "f" * 64, 1, 1, [], "", "0" * 128),  # x >= p
    ]:
        assert verify_signature(ev) is False
        assert verify_event(ev) is False


def test_tag_helpers():
    ev = Event("0" * 64, "a" * 64, 1, 1, [["p", "x"], ["e", "y"], ["p"], ["p", "z", "relay"], ["d", "id1"], ["d", "id2"]], "", "0" * 128)
    assert ev.tag_values("p") == ["x", "z"]
    assert ev.tag_values("q") == []
    assert ev.first_tag("p") == "x"
    assert ev.first_tag("q") is None
    assert d_tag(ev) == "id1"
    assert d_tag(Event("0" * 64, "a" * 64, 1, 1, [["d"]], "", "0" * 128)) == ""
    assert d_tag(Event("0" * 64, "a" * 64, 1, 1, [], "", "0" * 128)) == ""


def test_kind_classes():
    assert is_replaceable(0) and is_replaceable(3) and is_replaceable(10000) and is_replaceable(19999)
    assert not is_replaceable(1) and not is_replaceable(20000) and not is_replaceable(9999)
    assert is_ephemeral(20000) and is_ephemeral(29999) and not is_ephemeral(30000) and not is_ephemeral(19999)
    assert is_addressable(30000) and is_addressable(39999) and not is_addressable(40000) and not is_addressable(29999)
    assert is_regular(1) and is_regular(4) and is_regular(40000) and is_regular(1059)
    assert not is_regular(0) and not is_regular(22242) and not is_regular(30023)


def _exp(tags):
    return expiration(Event("0" * 64, "a" * 64, 1, 1, tags, "", "0" * 128))


def test_expiration():
    assert _exp([]) is None
    assert _exp([["expiration", "1700000000"]]) == 1700000000
    assert _exp([["expiration", "0"]]) == 0
    assert _exp([["t", "x"], ["expiration", "5"], ["expiration", "junk"]]) == 5  # first one wins
    for bad in (["expiration"], ["expiration", ""], ["expiration", "-5"], ["expiration", "1.5"],
                ["expiration", " 5"], ["expiration", "+5"], ["expiration", "1e9"], ["expiration", "٣"],
                ["expiration", "9" * 17], ["expiration", str(2**53)]):
        with pytest.raises(InvalidEvent, match="malformed expiration tag"):
            _exp([bad])


def test_event_equality_and_hash():
    d = _good()
    a = parse_event(d)
    b = parse_event(orjson.loads(orjson.dumps(d)))
    assert a == b and hash(a) == hash(b)
    assert a != parse_event(dict(d, content="other"))
    assert a != parse_event(_good())  # fresh aux randomness: same id, different sig
    assert "Event(" in repr(a)
