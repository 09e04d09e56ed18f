import pytest

from appliance.push.descriptor import Limits
from appliance.push.errors import LeaseRejected
from appliance.push.grammar import check_classes, check_filter, check_ignore, check_p_tags_max
from appliance.push.plaintext import LeaseFilter, Subscription
from tests.push.helpers import AUTHOR_HEX, CHANNEL, CHANNEL2, DESCRIPTOR, OTHER_PK, make_descriptor

ME = AUTHOR_HEX
E = "e" * 64


def cf(obj, narrowing=True, descriptor=DESCRIPTOR):
    return check_filter(obj, author=ME, descriptor=descriptor, narrowing=narrowing)


def code(obj, narrowing=True, descriptor=DESCRIPTOR):
    with pytest.raises(LeaseRejected) as ei:
        cf(obj, narrowing, descriptor)
    return ei.value.code


OK = [
    {"kinds": [9], "#p": [ME]},
    {"kinds": [9], "#h": [CHANNEL]},
    {"kinds": [9], "authors": [OTHER_PK]},
    {"kinds": [9, 7, 1059], "#p": [ME], "#e": [E], "#h": [CHANNEL, CHANNEL2], "authors": [OTHER_PK, ME]},
    {"kinds": [9], "#h": [CHANNEL], "#e": [E]},
]


@pytest.mark.parametrize("obj", OK)
def test_valid_filters(obj):
    f = cf(obj)
    assert isinstance(f, LeaseFilter)
    assert f.kinds == frozenset(obj["kinds"])
    back = f.to_nip01()
    assert {k: sorted(v) for k, v in obj.items()} == back


CASES = [
    # 1. narrowing selector
    ({"kinds": [9]}, "not_narrowed"),
    ({"kinds": [9], "#e": [E]}, "not_narrowed"),  # #e alone is not narrowing
    ({}, "not_narrowed"),  # empty filter
    ({"since": 1}, "not_narrowed"),  # since-only (spec wording beats rule 5)
    ({"kinds": [9], "since": 1}, "not_narrowed"),
    ({"kinds": [1]}, "not_narrowed"),
    # 2. exact values
    ({"kinds": [9], "authors": ["b" * 63]}, "non_exact_value"),
    ({"kinds": [9], "authors": ["b" * 65]}, "non_exact_value"),
    ({"kinds": [9], "authors": ["B" * 64]}, "non_exact_value"),
    ({"kinds": [9], "authors": ["g" * 64]}, "non_exact_value"),
    ({"kinds": [9], "authors": ["ab"]}, "non_exact_value"),  # prefix
    ({"kinds": [9], "#p": [ME.upper()]}, "non_exact_value"),
    ({"kinds": [9], "#p": [ME[:-1]]}, "non_exact_value"),
    ({"kinds": [9], "#h": [CHANNEL], "#e": ["E" * 64]}, "non_exact_value"),
    ({"kinds": [9], "#h": [CHANNEL], "#e": ["e" * 63]}, "non_exact_value"),
    ({"kinds": [9], "#h": [CHANNEL.upper()]}, "invalid_h_value"),
    ({"kinds": [9], "#h": [""]}, "invalid_h_value"),
    ({"kinds": [9], "#h": ["general"]}, "invalid_h_value"),
    ({"kinds": [9], "#h": ["x" * 513]}, "string_too_long"),
    # 3. self-scoped p
    ({"kinds": [9], "#p": [OTHER_PK]}, "p_not_self"),
    ({"kinds": [9], "#p": [ME, OTHER_PK]}, "p_not_self"),
    # 4. kinds
    ({"#p": [ME]}, "missing_kinds"),
    ({"#h": [CHANNEL], "since": 5}, "time_travel_field"),
    ({"kinds": [], "#p": [ME]}, "empty_array"),
    ({"kinds": [1], "#p": [ME]}, "kind_not_push_eligible"),
    ({"kinds": [9, 20001], "#p": [ME]}, "kind_not_push_eligible"),
    ({"kinds": [30350], "#p": [ME]}, "kind_not_push_eligible"),
    ({"kinds": [39000], "#p": [ME]}, "kind_not_push_eligible"),
    ({"kinds": [9.0], "#p": [ME]}, "wrong_type"),
    ({"kinds": [True], "#p": [ME]}, "wrong_type"),
    ({"kinds": ["9"], "#p": [ME]}, "wrong_type"),
    ({"kinds": 9, "#p": [ME]}, "wrong_type"),
    ({"kinds": [9, 9], "#p": [ME]}, "duplicate_value"),
    # 5. no time travel / ids / limit / search
    ({"kinds": [9], "#p": [ME], "since": 1}, "time_travel_field"),
    ({"kinds": [9], "#p": [ME], "until": 1}, "time_travel_field"),
    ({"kinds": [9], "#p": [ME], "ids": [E]}, "forbidden_filter_field"),
    ({"kinds": [9], "#p": [ME], "limit": 1}, "forbidden_filter_field"),
    ({"kinds": [9], "#p": [ME], "search": "x"}, "forbidden_filter_field"),
    # 6. tag hygiene
    ({"kinds": [9], "#p": [ME], "#t": ["x"]}, "tag_not_permitted"),
    ({"kinds": [9], "#p": [ME], "#P": [ME]}, "tag_not_permitted"),
    ({"kinds": [9], "#p": [ME], "#d": ["x"]}, "tag_not_permitted"),
    ({"kinds": [9], "#p": [ME], "#pp": [ME]}, "multi_letter_tag"),
    ({"kinds": [9], "#p": [ME], "#expiration": ["1"]}, "multi_letter_tag"),
    ({"kinds": [9], "#p": [ME], "#": ["x"]}, "unknown_filter_field"),
    ({"kinds": [9], "#p": [ME], "p": [ME]}, "unknown_filter_field"),
    ({"kinds": [9], "#p": [ME], "endpoint": "x"}, "unknown_filter_field"),
    ({"kinds": [9], "#p": []}, "empty_array"),
    ({"kinds": [9], "#h": []}, "empty_array"),
    ({"kinds": [9], "#p": [ME], "#e": []}, "empty_array"),
    ({"kinds": [9], "authors": []}, "empty_array"),
    ({"kinds": [9], "#p": ME}, "wrong_type"),
    ({"kinds": [9], "#p": [1]}, "wrong_type"),
    ({"kinds": [9], "#p": [ME, ME]}, "duplicate_value"),
    ({"kinds": [9], "#h": [CHANNEL, CHANNEL]}, "duplicate_value"),
    # category order beats member order
    ({"#zz": [1], "since": 1, "kinds": [9], "#p": [ME]}, "time_travel_field"),
    ({"foo": 1, "#t": ["x"], "limit": 1, "#p": [ME]}, "forbidden_filter_field"),
    ({"foo": 1, "#t": ["x"], "#pp": [1], "#p": [ME]}, "multi_letter_tag"),
    ({"foo": 1, "#t": ["x"], "#p": [ME]}, "tag_not_permitted"),
    # fixed order: narrowing presence, names, shapes, kinds, values
    ({"kinds": [1], "#p": []}, "empty_array"),
    ({"kinds": [1], "#p": ["short"]}, "kind_not_push_eligible"),
    ({"kinds": [9], "#e": ["short"]}, "not_narrowed"),
    ({"kinds": [9], "#p": ["short"]}, "non_exact_value"),
]


@pytest.mark.parametrize("obj,expected", CASES, ids=[f"{c}-{i}" for i, (_, c) in enumerate(CASES)])
def test_filter_rejections(obj, expected):
    assert code(obj) == expected


def make_vals(n, kind):
    if kind == "hex":
        return [f"{i:064x}" for i in range(n)]
    return [f"{i:08x}-0000-4000-8000-000000000000" for i in range(n)]


@pytest.mark.parametrize(
    "key,limit_name,reason,kind",
    [
        ("authors", "max_authors", "too_many_authors", "hex"),
        ("#h", "max_h", "too_many_h_values", "uuid"),
        ("#e", "max_tag_values", "too_many_tag_values", "hex"),
    ],
)
def test_value_count_bounds(key, limit_name, reason, kind):
    n = getattr(Limits(), limit_name)
    base = {"kinds": [9], "#p": [ME]}
    cf({**base, key: make_vals(n, kind)})
    assert code({**base, key: make_vals(n + 1, kind)}) == reason


def test_p_count_bound():
    d = make_descriptor(limits=Limits(max_tag_values=1))
    assert code({"kinds": [9], "#p": [ME, "a" * 64]}, descriptor=d) == "too_many_tag_values"


def test_kinds_count_bound():
    d = make_descriptor(limits=Limits(max_kinds=2))
    cf({"kinds": [9, 7], "#p": [ME]}, descriptor=d)
    assert code({"kinds": [9, 7, 1059], "#p": [ME]}, descriptor=d) == "too_many_kinds"


def test_ignore_filters_skip_narrowing_only():
    assert cf({"kinds": [9]}, narrowing=False).kinds == {9}
    assert cf({"kinds": [9], "#e": [E]}, narrowing=False).e == {E}
    for bad, reason in [
        ({"kinds": [9], "since": 1}, "time_travel_field"),
        ({"kinds": [9], "#p": [OTHER_PK]}, "p_not_self"),
        ({"kinds": [1]}, "kind_not_push_eligible"),
        ({"kinds": [9], "authors": ["ab"]}, "non_exact_value"),
        ({"#p": [ME]}, "missing_kinds"),
    ]:
        assert code(bad, narrowing=False) == reason


def test_max_ignore():
    f = {"kinds": [9], "authors": [OTHER_PK]}
    assert len(check_ignore([f] * 8, author=ME, descriptor=DESCRIPTOR)) == 8
    assert check_ignore(None, author=ME, descriptor=DESCRIPTOR) == ()
    with pytest.raises(LeaseRejected) as ei:
        check_ignore([f] * 9, author=ME, descriptor=DESCRIPTOR)
    assert ei.value.code == "too_many_ignore"


@pytest.mark.parametrize("v,reason", [(0, "p_tags_max_out_of_range"), (-3, "p_tags_max_out_of_range"),
                                      (1.0, "wrong_type"), (True, "wrong_type"), (None, "wrong_type")])
def test_p_tags_max(v, reason):
    assert check_p_tags_max(1) == 1
    with pytest.raises(LeaseRejected) as ei:
        check_p_tags_max(v)
    assert ei.value.code == reason


def S(cls, kinds=(9,)):
    return Subscription(filter=LeaseFilter(kinds=frozenset(kinds), p=frozenset({ME})), cls=cls)


def cc(subs, transport="apns", descriptor=DESCRIPTOR):
    with pytest.raises(LeaseRejected) as ei:
        check_classes(subs, descriptor, transport)
    return ei.value.code


def test_classes():
    check_classes([S(c) for c in ("silent", "default", "time_sensitive")], DESCRIPTOR, "fcm")
    check_classes([S("urgent", (46010,))], DESCRIPTOR, "apns")
    assert cc([S("urgent", (46010,))], "fcm") == "class_not_supported"  # fcm lacks urgent
    assert cc([S("default")], "unifiedpush") == "class_not_supported"  # no class_support entry
    assert cc([S("urgent", (9,))]) == "class_not_permitted"
    assert cc([S("urgent", (46010, 9))]) == "class_not_permitted"  # every kind must be urgent-eligible
    # all "supported" checks run before any "urgent" check
    assert cc([S("urgent", (9,)), S("urgent", (46010,))], "fcm") == "class_not_supported"
    assert cc([S("urgent", (9,)), S("silent")], descriptor=make_descriptor(
        class_support={"apns": ("urgent",)})) == "class_not_supported"
    assert cc([S("urgent", (46010,))], descriptor=make_descriptor(urgent_kinds=())) == "class_not_permitted"
