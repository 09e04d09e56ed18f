"""NIP-01 filter parsing and matching."""

from __future__ import annotations

import pytest

from appliance.nostr.event import Event
from appliance.nostr.filters import Filter, InvalidFilter, matches, matches_any, parse_filter

A = "a" * 64
B = "b" * 64
ID1 = "1" * 64
ID2 = "2" * 64


def ev(id=ID1, pubkey=A, created_at=100, kind=1, tags=None, content=""):
    return Event(id, pubkey, created_at, kind, tags or [], content, "0" * 128)


def test_empty_filter_matches_everything():
    f = parse_filter({})
    assert f == Filter()
    assert matches(f, ev()) and matches(f, ev(kind=30000, tags=[["d", "x"]]))


def test_ids_authors_kinds():
    assert matches(parse_filter({"ids": [ID1, ID2]}), ev())
    assert not matches(parse_filter({"ids": [ID2]}), ev())
    assert matches(parse_filter({"authors": [B, A]}), ev())
    assert not matches(parse_filter({"authors": [B]}), ev())
    assert matches(parse_filter({"kinds": [0, 1]}), ev())
    assert not matches(parse_filter({"kinds": [0]}), ev())


def test_empty_lists_match_nothing():
    for key in ("ids", "authors", "kinds", "#e"):
        f = parse_filter({key: []})
        assert not matches(f, ev(tags=[["e", "x"]])), key


def test_since_until_inclusive():
    assert matches(parse_filter({"since": 100}), ev(created_at=100))
    assert not matches(parse_filter({"since": 101}), ev(created_at=100))
    assert matches(parse_filter({"until": 100}), ev(created_at=100))
    assert not matches(parse_filter({"until": 99}), ev(created_at=100))
    assert matches(parse_filter({"since": 100, "until": 100}), ev(created_at=100))
    assert not matches(parse_filter({"since": 101, "until": 99}), ev(created_at=100))


def test_tag_filters():
    e = ev(tags=[["p", B, "wss://r"], ["e", ID2], ["t", "Nostr"], ["h"], ["P", "upper"]])
    assert matches(parse_filter({"#p": [B]}), e)
    assert matches(parse_filter({"#p": ["x", B]}), e)
    assert not matches(parse_filter({"#p": [A]}), e)
    assert matches(parse_filter({"#p": [B], "#e": [ID2]}), e)  # AND across tags
    assert not matches(parse_filter({"#p": [B], "#e": [ID1]}), e)
    assert not matches(parse_filter({"#t": ["nostr"]}), e)  # exact, case-sensitive
    assert not matches(parse_filter({"#h": [""]}), e)  # a tag without a value matches nothing
    assert matches(parse_filter({"#P": ["upper"]}), e)  # tag letters are case-sensitive
    assert not matches(parse_filter({"#p": ["upper"]}), e)
    assert not matches(parse_filter({"#x": ["1"]}), e)
    # only the tag's first value (index 1) is indexed
    assert not matches(parse_filter({"#p": ["wss://r"]}), e)


def test_all_conditions_and():
    f = parse_filter({"authors": [A], "kinds": [1], "#t": ["x"], "since": 50, "until": 150, "ids": [ID1]})
    assert matches(f, ev(tags=[["t", "x"]]))
    assert not matches(f, ev(tags=[["t", "y"]]))
    assert not matches(f, ev(tags=[["t", "x"]], kind=2))
    assert not matches(f, ev(tags=[["t", "x"]], created_at=151))


def test_matches_any():
    fs = [parse_filter({"kinds": [2]}), parse_filter({"authors": [A]})]
    assert matches_any(fs, ev())
    assert not matches_any(fs, ev(pubkey=B))
    assert not matches_any([], ev())


def test_limit_clamped_not_rejected():
    assert parse_filter({"limit": 10}, max_limit=500).limit == 10
    assert parse_filter({"limit": 10_000}, max_limit=500).limit == 500
    assert parse_filter({"limit": 0}).limit == 0
    assert matches(parse_filter({"limit": 1}), ev())  # limit does not affect matching


def test_unknown_keys_ignored():
    f = parse_filter({"foo": 1, "&t": ["x"], "kinds": [1]})
    assert f == Filter(kinds=frozenset({1}))


def test_search():
    f = parse_filter({"search": "Hello  world include:spam"})
    assert f.search == "Hello  world include:spam"
    assert matches(f, ev(content="hello there, WORLD"))
    assert not matches(f, ev(content="hello there"))


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ([], "filter must be a JSON object"),
        ("x", "filter must be a JSON object"),
        ({"ids": "x"}, "ids must be an array"),
        ({"ids": ["abc"]}, "ids must contain 64-character lowercase hex strings"),
        ({"ids": [ID1.upper().replace("1", "A")]}, "ids must contain 64-character lowercase hex strings"),
        ({"ids": [A[:63]]}, "ids must contain 64-character lowercase hex strings"),
        ({"ids": [1]}, "ids must contain 64-character lowercase hex strings"),
        ({"authors": ["A" * 64]}, "authors must contain 64-character lowercase hex strings"),
        ({"authors": {}}, "authors must be an array"),
        ({"kinds": [True]}, "kinds must contain integers between 0 and 65535"),
        ({"kinds": [65536]}, "kinds must contain integers between 0 and 65535"),
        ({"kinds": [-1]}, "kinds must contain integers between 0 and 65535"),
        ({"kinds": ["1"]}, "kinds must contain integers between 0 and 65535"),
        ({"kinds": [1.0]}, "kinds must contain integers between 0 and 65535"),
        ({"since": -1}, "since must be a non-negative integer"),
        ({"since": True}, "since must be a non-negative integer"),
        ({"until": 2**53}, "until must be a non-negative integer"),
        ({"until": "5"}, "until must be a non-negative integer"),
        ({"limit": -1}, "limit must be a non-negative integer"),
        ({"limit": 1.5}, "limit must be a non-negative integer"),
        ({"limit": None}, "limit must be a non-negative integer"),
        ({"#pp": ["x"]}, "unsupported tag filter"),
        ({"#": ["x"]}, "unsupported tag filter"),
        ({"#1": ["x"]}, "unsupported tag filter"),
        ({"#é": ["x"]}, "unsupported tag filter"),
        ({"#p": "x"}, "#p must be an array"),
        ({"#p": [1]}, "#p must contain strings"),
        ({"search": 1}, "search must be a string"),
    ],
)
def test_parse_filter_rejections(obj, reason):
    with pytest.raises(InvalidFilter) as info:
        parse_filter(obj)
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)


def test_max_values_per_list():
    ids = [f"{i:064x}" for i in range(11)]
    assert parse_filter({"ids": ids[:10]}, max_values=10).ids == frozenset(ids[:10])
    for key, values in [("ids", ids), ("authors", ids), ("kinds", list(range(11))), ("#e", ids)]:
        with pytest.raises(InvalidFilter, match="too many values in filter"):
            parse_filter({key: values}, max_values=10)


def test_parsed_shape_and_to_dict():
    obj = {"ids": [ID1], "authors": [A], "kinds": [1, 7], "#e": [ID2], "#p": [B], "since": 1, "until": 2, "limit": 3}
    f = parse_filter(obj)
    assert f.ids == frozenset({ID1}) and isinstance(f.ids, frozenset)
    assert f.kinds == frozenset({1, 7})
    assert f.tags == {"e": frozenset({ID2}), "p": frozenset({B})}
    assert (f.since, f.until, f.limit, f.search) == (1, 2, 3, None)
    assert parse_filter(f.to_dict()) == f
    assert "Filter(" in repr(f)
