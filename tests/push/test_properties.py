"""Property tests: generated valid leases are accepted; any single rule-breaking
mutation is rejected with that rule's reason."""

import copy
import json

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.push.acceptance import check_lease_stateless
from appliance.push.errors import LeaseRejected
from appliance.push.plaintext import parse_strict_json
from appliance.push.descriptor import Limits
from tests.push.helpers import AUTHOR_HEX, DESCRIPTOR, NOW, OTHER_PK, always, identity_decrypt, plain_event

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
uuid4 = st.builds(
    lambda a, b, c, d, e, v: f"{a}-{b}-4{c}-{v}{d}-{e}",
    st.text("0123456789abcdef", min_size=8, max_size=8),
    st.text("0123456789abcdef", min_size=4, max_size=4),
    st.text("0123456789abcdef", min_size=3, max_size=3),
    st.text("0123456789abcdef", min_size=3, max_size=3),
    st.text("0123456789abcdef", min_size=12, max_size=12),
    st.sampled_from("89ab"),
)
PUSH_KINDS = list(DESCRIPTOR.push_kinds)
URGENT_KINDS = list(DESCRIPTOR.urgent_kinds)


def uniq(s, max_size=3):
    return st.lists(s, min_size=1, max_size=max_size, unique=True)


@st.composite
def lease_filter(draw, narrowing=True, kinds_from=PUSH_KINDS):
    f = {"kinds": draw(uniq(st.sampled_from(kinds_from), max_size=len(kinds_from)))}
    selectors = draw(st.sets(st.sampled_from(["authors", "#p", "#h"]), min_size=1 if narrowing else 0))
    if "authors" in selectors:
        f["authors"] = draw(uniq(hex64))
    if "#p" in selectors:
        f["#p"] = [AUTHOR_HEX]
    if "#h" in selectors:
        f["#h"] = draw(uniq(uuid4))
    if draw(st.booleans()):
        f["#e"] = draw(uniq(hex64))
    keys = draw(st.permutations(list(f)))
    return {k: f[k] for k in keys}


@st.composite
def subscription(draw):
    cls = draw(st.sampled_from(["silent", "default", "time_sensitive", "urgent"]))
    flt = draw(lease_filter(kinds_from=URGENT_KINDS if cls == "urgent" else PUSH_KINDS))
    s = {"filter": flt, "class": cls}
    if draw(st.booleans()):
        s["ignore"] = draw(st.lists(lease_filter(narrowing=False), min_size=1, max_size=3))
    if draw(st.booleans()):
        s["suppress"] = {"p_tags_max": draw(st.integers(1, 2**53 - 1))}
    return s


@st.composite
def active_lease(draw):
    return {
        "v": 1,
        "origin": DESCRIPTOR.origin,
        "app_profile": "com.example.app/ios",
        "transport": "apns",
        "endpoint": draw(st.text(min_size=1, max_size=64).filter(lambda s: len(s.encode("utf-8", "surrogatepass")) <= 256 and not any(0xD800 <= ord(c) <= 0xDFFF for c in s))),
        "generation": draw(st.integers(1, 2**53 - 1)),
        "active": True,
        "subscriptions": draw(st.lists(subscription(), min_size=1, max_size=4)),
    }


@st.composite
def inactive_lease(draw):
    return {"v": 1, "origin": DESCRIPTOR.origin, "generation": draw(st.integers(1, 2**53 - 1)), "active": False}


def run(pt):
    text = pt if isinstance(pt, str) else json.dumps(pt)
    ev = plain_event(text)
    return check_lease_stateless(
        ev, authed_pubkey=AUTHOR_HEX, descriptor=DESCRIPTOR, decrypt=identity_decrypt, now=NOW, verify=always
    )


@SETTINGS
@given(pt=st.one_of(active_lease(), inactive_lease()))
def test_valid_leases_accepted(pt):
    a = run(pt)
    assert a.generation == pt["generation"] and a.active is pt["active"]
    if pt["active"]:
        got = [s.filter.to_nip01() for s in a.plaintext.subscriptions]
        want = [{k: sorted(v) for k, v in s["filter"].items()} for s in pt["subscriptions"]]
        assert [dict(sorted(g.items())) for g in got] == [dict(sorted(w.items())) for w in want]
        assert [s.cls for s in a.plaintext.subscriptions] == [s["class"] for s in pt["subscriptions"]]


# ---------------------------------------------------------------- mutations
# Each mutation takes (plaintext, draw) and returns (new plaintext or text, expected code).


def m_top_unknown(pt, draw):
    pt["x_" + draw(st.text("abcxyz", min_size=1, max_size=5))] = 1
    return pt, "unknown_field"


def m_top_missing(pt, draw):
    del pt[draw(st.sampled_from(sorted(pt)))]
    return pt, "missing_field"


def m_generation_zero(pt, draw):
    pt["generation"] = draw(st.integers(-(2**53) + 1, 0))
    return pt, "generation_out_of_range"


def m_generation_float(pt, draw):
    return json.dumps(pt).replace(f'"generation": {pt["generation"]}', f'"generation": {pt["generation"]}.0'), "wrong_type"


def m_version(pt, draw):
    pt["v"] = draw(st.integers(2, 2**53 - 1) | st.just(0))
    return pt, "unsupported_version"


def m_origin(pt, draw):
    pt["origin"] = draw(st.sampled_from([pt["origin"] + "/", pt["origin"].upper(), " " + pt["origin"], ""]))
    return pt, "origin_mismatch"


def m_duplicate_key(pt, draw):
    return '{"v": 1, ' + json.dumps(pt)[1:], "duplicate_key"


def m_active_type(pt, draw):
    pt["active"] = draw(st.sampled_from(["true", 1, 0, None]))
    return pt, "wrong_type"


ANY = [m_top_unknown, m_top_missing, m_generation_zero, m_generation_float, m_version, m_origin,
       m_duplicate_key, m_active_type]


def pick_sub(pt, draw):
    return pt["subscriptions"][draw(st.integers(0, len(pt["subscriptions"]) - 1))]


def m_since(pt, draw):
    pick_sub(pt, draw)["filter"][draw(st.sampled_from(["since", "until"]))] = NOW
    return pt, "time_travel_field"


def m_forbidden(pt, draw):
    pick_sub(pt, draw)["filter"][draw(st.sampled_from(["ids", "limit", "search"]))] = 1
    return pt, "forbidden_filter_field"


def m_other_tag(pt, draw):
    pick_sub(pt, draw)["filter"]["#" + draw(st.sampled_from("tdkaPHE"))] = ["x"]
    return pt, "tag_not_permitted"


def m_multi_letter(pt, draw):
    pick_sub(pt, draw)["filter"][draw(st.sampled_from(["#pp", "#hh", "#ee", "#alt"]))] = ["x"]
    return pt, "multi_letter_tag"


def m_unknown_filter_member(pt, draw):
    pick_sub(pt, draw)["filter"][draw(st.sampled_from(["foo", "p", "endpoint", "kind"]))] = ["x"]
    return pt, "unknown_filter_field"


def m_no_kinds(pt, draw):
    del pick_sub(pt, draw)["filter"]["kinds"]
    return pt, "missing_kinds"


def m_bad_kind(pt, draw):
    pick_sub(pt, draw)["filter"]["kinds"].append(draw(st.sampled_from([1, 0, 20000, 25000, 30350, 39000, 65535])))
    return pt, "kind_not_push_eligible"


def m_not_narrowed(pt, draw):
    f = pick_sub(pt, draw)["filter"]
    for k in ("authors", "#p", "#h"):
        f.pop(k, None)
    return pt, "not_narrowed"


def m_p_other(pt, draw):
    pick_sub(pt, draw)["filter"]["#p"] = [AUTHOR_HEX, OTHER_PK]
    return pt, "p_not_self"


def m_non_exact(pt, draw):
    key = draw(st.sampled_from(["authors", "#p", "#e"]))
    bad = draw(st.sampled_from([AUTHOR_HEX.upper(), AUTHOR_HEX[:-1], AUTHOR_HEX + "0", "ab", "g" * 64]))
    pick_sub(pt, draw)["filter"][key] = [bad]
    return pt, "non_exact_value"


def m_bad_h(pt, draw):
    pick_sub(pt, draw)["filter"]["#h"] = [draw(st.sampled_from(["", "general", "3F2B8C1E-9D4A-4B6E-8F01-23456789ABCD",
                                                               "3f2b8c1e-9d4a-1b6e-8f01-23456789abcd"]))]
    return pt, "invalid_h_value"


def m_empty_selector(pt, draw):
    pick_sub(pt, draw)["filter"][draw(st.sampled_from(["authors", "#p", "#h", "#e", "kinds"]))] = []
    return pt, "empty_array"


def m_dup_value(pt, draw):
    f = pick_sub(pt, draw)["filter"]
    f["kinds"] = f["kinds"] + f["kinds"][:1]
    return pt, "duplicate_value"


def m_unknown_class(pt, draw):
    pick_sub(pt, draw)["class"] = draw(st.sampled_from(["critical", "Default", "", "passive"]))
    return pt, "unknown_class"


def m_sub_unknown(pt, draw):
    pick_sub(pt, draw)["priority"] = 1
    return pt, "unknown_field"


def m_p_tags_max(pt, draw):
    pick_sub(pt, draw)["suppress"] = {"p_tags_max": draw(st.integers(-5, 0))}
    return pt, "p_tags_max_out_of_range"


def m_empty_ignore(pt, draw):
    pick_sub(pt, draw)["ignore"] = []
    return pt, "empty_ignore"


def m_many_ignore(pt, draw):
    pick_sub(pt, draw)["ignore"] = [{"kinds": [9]}] * 9
    return pt, "too_many_ignore"


def m_ignore_grammar(pt, draw):
    pick_sub(pt, draw)["ignore"] = [{"kinds": [9], "since": 1}]
    return pt, "time_travel_field"


def m_urgent_kind(pt, draw):
    s = pick_sub(pt, draw)
    s["class"] = "urgent"
    s["filter"]["kinds"] = [draw(st.sampled_from([k for k in PUSH_KINDS if k not in URGENT_KINDS]))]
    return pt, "class_not_permitted"


def m_class_unsupported(pt, draw):
    pt["app_profile"], pt["transport"] = "com.example.app/android", "fcm"
    s = pick_sub(pt, draw)
    s["class"] = "urgent"
    s["filter"]["kinds"] = URGENT_KINDS[:]
    return pt, "class_not_supported"


def m_transport(pt, draw):
    pt["transport"] = draw(st.sampled_from(["fcm", "unifiedpush"]))
    return pt, "transport_mismatch"


def m_unknown_transport(pt, draw):
    pt["transport"] = draw(st.sampled_from(["webpush", "APNS", ""]))
    return pt, "unknown_transport"


def m_app_profile(pt, draw):
    pt["app_profile"] = "com.example.app/" + draw(st.sampled_from(["web", "IOS", "ios "]))
    return pt, "unknown_app_profile"


def m_quota(pt, draw):
    small = {"filter": {"kinds": [9], "#p": [AUTHOR_HEX]}, "class": "default"}
    pt["subscriptions"] = [small] * draw(st.integers(17, 20))
    return pt, "quota_exceeded"


def m_empty_subs(pt, draw):
    pt["subscriptions"] = []
    return pt, "empty_subscriptions"


def m_endpoint_long(pt, draw):
    pt["endpoint"] = "x" * draw(st.integers(4097, 5000))
    return pt, "endpoint_too_long"


def m_string_long(pt, draw):
    pt[draw(st.sampled_from(["app_profile", "origin"]))] = "é" * 257
    return pt, "string_too_long"


def m_inactive_extra(pt, draw):
    k = draw(st.sampled_from(["app_profile", "transport", "endpoint", "subscriptions"]))
    val = pt[k]
    pt = {"v": 1, "origin": pt["origin"], "generation": pt["generation"], "active": False, k: val}
    return pt, "unexpected_field"


ACTIVE_ONLY = [m_since, m_forbidden, m_other_tag, m_multi_letter, m_unknown_filter_member, m_no_kinds, m_bad_kind,
               m_not_narrowed, m_p_other, m_non_exact, m_bad_h, m_empty_selector, m_dup_value, m_unknown_class,
               m_sub_unknown, m_p_tags_max, m_empty_ignore, m_many_ignore, m_ignore_grammar, m_urgent_kind,
               m_class_unsupported, m_transport, m_unknown_transport, m_app_profile, m_quota, m_empty_subs,
               m_endpoint_long, m_string_long, m_inactive_extra]


def test_every_mutation_listed_once():
    assert len(set(ANY + ACTIVE_ONLY)) == len(ANY + ACTIVE_ONLY)


@pytest.mark.parametrize("mutation", ANY + ACTIVE_ONLY, ids=lambda m: m.__name__)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_single_mutation_rejected_with_expected_reason(mutation, data):
    active = mutation in ACTIVE_ONLY or data.draw(st.booleans())
    pt = data.draw(active_lease() if active else inactive_lease())
    mutated, expected = mutation(copy.deepcopy(pt), data.draw)
    try:
        run(mutated)
    except LeaseRejected as e:
        assert e.code == expected, (mutation.__name__, e.code, expected)
    else:
        raise AssertionError(f"{mutation.__name__} accepted")


# ---------------------------------------------------------------- strict JSON roundtrip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)


@SETTINGS
@given(v=json_values, indent=st.sampled_from([None, 0, 2]))
def test_strict_json_roundtrip(v, indent):
    assert parse_strict_json(json.dumps(v, indent=indent), Limits()) == v


@SETTINGS
@given(v=st.dictionaries(st.text(min_size=1, max_size=5), st.integers(-1000, 1000), min_size=1, max_size=5), data=st.data())
def test_strict_json_any_duplicate_rejected(v, data):
    k = data.draw(st.sampled_from(sorted(v)))
    text = json.dumps(v)[:-1] + ", " + json.dumps(k) + ": 0}"
    try:
        parse_strict_json(text, Limits())
    except LeaseRejected as e:
        assert e.code == "duplicate_key"
    else:
        raise AssertionError("duplicate accepted")
