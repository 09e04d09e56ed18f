import json

import pytest

from appliance.push.descriptor import Limits
from appliance.push.errors import LeaseRejected
from appliance.push.plaintext import (
    MAX_SAFE_INT,
    JsonFloat,
    LeaseFilter,
    is_json_int,
    parse_lease_plaintext,
    parse_strict_json,
)
from tests.push.helpers import active_plaintext, inactive_plaintext

LIM = Limits()
SMALL = Limits(max_plaintext_len=64, max_string_len=8, max_endpoint_len=12)


def reject(text, limits=LIM, fn=parse_strict_json):
    with pytest.raises(LeaseRejected) as ei:
        fn(text, limits)
    return ei.value.code


# ---------------------------------------------------------------- strict JSON


@pytest.mark.parametrize(
    "text,code",
    [
        ('{"a":1,"a":2}', "duplicate_key"),
        ('{"a":{"b":1,"b":1}}', "duplicate_key"),
        ('{"a":[{"x":1},{"y":1,"y":2}]}', "duplicate_key"),
        ('{"a":NaN}', "non_finite_number"),
        ('{"a":Infinity}', "non_finite_number"),
        ('{"a":-Infinity}', "non_finite_number"),
        ('{"a":1e999}', "non_finite_number"),
        ('{"a":9007199254740992}', "integer_out_of_range"),
        ('{"a":-9007199254740992}', "integer_out_of_range"),
        ('{"a":' + "9" * 5000 + "}", "integer_out_of_range"),
        ('{"a":1} x', "trailing_data"),
        ('{"a":1}{}', "trailing_data"),
        ('{"a":1}\x0b', "trailing_data"),  # \v is not JSON whitespace
        ('\x0b{"a":1}', "malformed_json"),
        ("{'a':1}", "malformed_json"),
        ('{"a":1,}', "malformed_json"),
        ('{"a":"\x01"}', "malformed_json"),  # raw control char
        ('{"a":"\\ud800"}', "malformed_json"),  # lone surrogate
        ("", "malformed_json"),
        ("[" * 5000 + "]" * 5000, "nesting_too_deep"),
        ('{"a":' * 20 + "1" + "}" * 20, "nesting_too_deep"),
    ],
)
def test_strict_json_rejects(text, code):
    assert reject(text) == code


def test_strict_json_accepts_and_types():
    v = parse_strict_json(' \n\t{"i":1,"f":1.0,"e":1e2,"b":true,"n":null,"s":"\\u00e9"}\r\n ', LIM)
    assert is_json_int(v["i"]) and not is_json_int(v["f"]) and not is_json_int(v["b"])
    assert isinstance(v["f"], JsonFloat) and v["f"].text == "1.0" and isinstance(v["e"], JsonFloat)
    assert v["s"] == "é"
    assert parse_strict_json(f'{{"a":{MAX_SAFE_INT},"b":-{MAX_SAFE_INT}}}', LIM) == {"a": MAX_SAFE_INT, "b": -MAX_SAFE_INT}


def test_size_bound_in_utf8_bytes_before_parsing():
    lim = Limits(max_plaintext_len=20)
    ok = '{"a":"' + "x" * 12 + '"}'  # 20 bytes
    assert len(ok.encode()) == 20
    parse_strict_json(ok, lim)
    assert reject('{"a":"' + "x" * 13 + '"}', lim) == "plaintext_too_long"
    # 7 two-byte chars: 13 code points of text but 20 bytes -> ok; 8 -> too long
    assert reject('{"a":"' + "é" * 7 + '"}', lim) == "plaintext_too_long"
    # checked before parsing: oversize garbage is "too long", not "malformed"
    assert reject("{" * 21, lim) == "plaintext_too_long"


def test_string_bounds_in_utf8_bytes():
    parse_strict_json('{"k":"' + "x" * 8 + '"}', SMALL)
    assert reject('{"k":"' + "x" * 9 + '"}', SMALL) == "string_too_long"
    assert reject('{"k":"' + "é" * 5 + '"}', SMALL) == "string_too_long"  # 10 bytes
    assert reject('{"k":["' + "x" * 9 + '"]}', SMALL) == "string_too_long"
    assert reject('{"' + "k" * 9 + '":1}', SMALL) == "string_too_long"  # member names too
    # top-level endpoint is bounded by max_endpoint_len instead
    parse_strict_json('{"endpoint":"' + "x" * 12 + '"}', SMALL)
    assert reject('{"endpoint":"' + "x" * 13 + '"}', SMALL) == "endpoint_too_long"
    # a nested "endpoint" member gets no special treatment
    assert reject('{"a":{"endpoint":"' + "x" * 9 + '"}}', SMALL) == "string_too_long"


# ---------------------------------------------------------------- schema


def P(obj):
    return parse_lease_plaintext(json.dumps(obj), LIM)


def code_of(obj_or_text):
    text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
    return reject(text, LIM, parse_lease_plaintext)


def test_active_schema_ok():
    pt = P(active_plaintext())
    assert pt.active is True and pt.v == 1 and pt.generation == 3 and pt.transport == "apns"
    assert len(pt.raw_subscriptions) == 2 and pt.subscriptions == ()
    assert pt.raw_subscriptions[1].p_tags_max == 20 and len(pt.raw_subscriptions[1].ignore) == 1
    assert pt.endpoint not in repr(pt)


def test_inactive_schema_ok():
    pt = P(inactive_plaintext())
    assert pt.active is False and pt.generation == 4
    assert pt.app_profile is pt.transport is pt.endpoint is None and pt.raw_subscriptions == ()


def without(d, key):
    d = dict(d)
    del d[key]
    return d


def sub(**kw):
    s = {"filter": {"kinds": [9], "#h": ["x"]}, "class": "default"}
    s.update(kw)
    return s


SCHEMA_CASES = [
    # top level
    ("[1]", "not_an_object"),
    ('"x"', "not_an_object"),
    (without(active_plaintext(), "v"), "missing_field"),
    (active_plaintext(v="1"), "wrong_type"),
    (active_plaintext(v=1.0), "wrong_type"),
    (active_plaintext(v=True), "wrong_type"),
    (active_plaintext(v=2), "unsupported_version"),
    (active_plaintext(v=0), "unsupported_version"),
    (active_plaintext(v=-1), "unsupported_version"),
    (active_plaintext(extra=1), "unknown_field"),
    (inactive_plaintext(extra=1), "unknown_field"),
    (without(active_plaintext(), "active"), "missing_field"),
    (active_plaintext(active=1), "wrong_type"),
    (active_plaintext(active="true"), "wrong_type"),
    (active_plaintext(active=None), "wrong_type"),
    # active: exactly the 8 members
    *[(without(active_plaintext(), k), "missing_field")
      for k in ("origin", "app_profile", "transport", "endpoint", "generation", "subscriptions")],
    # inactive: the 4 members, active-only members are unexpected
    *[(inactive_plaintext(**{k: active_plaintext()[k]}), "unexpected_field")
      for k in ("app_profile", "transport", "endpoint", "subscriptions")],
    *[(without(inactive_plaintext(), k), "missing_field") for k in ("origin", "generation")],
    # types
    (active_plaintext(origin=1), "wrong_type"),
    (inactive_plaintext(origin=None), "wrong_type"),
    (active_plaintext(app_profile=["x"]), "wrong_type"),
    (active_plaintext(transport=1), "wrong_type"),
    (active_plaintext(endpoint={}), "wrong_type"),
    (active_plaintext(generation="3"), "wrong_type"),
    (active_plaintext(generation=3.0), "wrong_type"),
    (active_plaintext(generation=True), "wrong_type"),
    (active_plaintext(generation=0), "generation_out_of_range"),
    (active_plaintext(generation=-5), "generation_out_of_range"),
    (inactive_plaintext(generation=0), "generation_out_of_range"),
    (inactive_plaintext(generation=1.5), "wrong_type"),
    (active_plaintext(generation=2**53), "integer_out_of_range"),
    (active_plaintext(subscriptions={}), "wrong_type"),
    (active_plaintext(subscriptions=[]), "empty_subscriptions"),
    (active_plaintext(subscriptions=[1]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(extra=1)]), "unknown_field"),
    (active_plaintext(subscriptions=[without(sub(), "filter")]), "missing_field"),
    (active_plaintext(subscriptions=[without(sub(), "class")]), "missing_field"),
    (active_plaintext(subscriptions=[sub(filter=[])]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(**{"class": 2})]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(**{"class": "critical"})]), "unknown_class"),
    (active_plaintext(subscriptions=[sub(**{"class": "Default"})]), "unknown_class"),
    (active_plaintext(subscriptions=[sub(ignore={})]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(ignore=[1])]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(ignore=[])]), "empty_ignore"),
    (active_plaintext(subscriptions=[sub(suppress=[])]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(suppress={})]), "missing_field"),
    (active_plaintext(subscriptions=[sub(suppress={"p_tags_max": 1, "x": 1})]), "unknown_field"),
    (active_plaintext(subscriptions=[sub(suppress={"p_tags_max": 0})]), "p_tags_max_out_of_range"),
    (active_plaintext(subscriptions=[sub(suppress={"p_tags_max": -1})]), "p_tags_max_out_of_range"),
    (active_plaintext(subscriptions=[sub(suppress={"p_tags_max": 2.0})]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(suppress={"p_tags_max": True})]), "wrong_type"),
    (active_plaintext(subscriptions=[sub(suppress={"p_tags_max": "3"})]), "wrong_type"),
    # values
    (active_plaintext(transport="webpush"), "unknown_transport"),
    (active_plaintext(transport="APNS"), "unknown_transport"),
    (active_plaintext(endpoint=""), "empty_string"),
    (active_plaintext(app_profile=""), "empty_string"),
    (active_plaintext(endpoint="x" * 4097), "endpoint_too_long"),
    (active_plaintext(app_profile="x" * 513), "string_too_long"),
    (active_plaintext(origin="x" * 513), "string_too_long"),
    ('{"v":1,"v":1,"origin":"o","generation":1,"active":false}', "duplicate_key"),
]


@pytest.mark.parametrize("obj,code", SCHEMA_CASES, ids=[f"{c}-{i}" for i, (_, c) in enumerate(SCHEMA_CASES)])
def test_schema_rejections(obj, code):
    assert code_of(obj) == code


def test_endpoint_at_bound_ok():
    assert P(active_plaintext(endpoint="x" * 4096)).endpoint == "x" * 4096
    assert P(active_plaintext(app_profile="x" * 512)).app_profile == "x" * 512


def test_lease_filter_to_nip01():
    f = LeaseFilter(kinds=frozenset({9, 7}), authors=frozenset({"b" * 64, "a" * 64}), h=frozenset({"c"}))
    assert f.to_nip01() == {"kinds": [7, 9], "authors": ["a" * 64, "b" * 64], "#h": ["c"]}
    assert LeaseFilter(kinds=frozenset({9}), p=frozenset({"a" * 64}), e=frozenset({"e" * 64})).to_nip01() == {
        "kinds": [9], "#p": ["a" * 64], "#e": ["e" * 64],
    }
