import pytest

from appliance.push.descriptor import Limits
from appliance.push.errors import LeaseRejected
from appliance.push.tags import PublicTags, check_public_tags
from tests.push.helpers import D_VALUE, NOW, std_tags

LIM = Limits()
TTL = LIM.max_lease_ttl
SKEW = LIM.allowed_skew


def code(tags, now=NOW, limits=LIM):
    with pytest.raises(LeaseRejected) as ei:
        check_public_tags(tags, now=now, limits=limits)
    return ei.value.code


def test_valid_tags():
    t = check_public_tags(std_tags(), now=NOW, limits=LIM)
    assert t == PublicTags(d=D_VALUE, expiration=NOW + 86400, exec_key_id="2026-06", alt="Push lease")
    t = check_public_tags(std_tags(alt=None), now=NOW, limits=LIM)
    assert t.alt is None
    # order of tags is irrelevant
    assert check_public_tags(list(reversed(std_tags())), now=NOW, limits=LIM).d == D_VALUE


CASES = [
    ([["d", D_VALUE], "x"], "malformed_tag"),
    (std_tags() + [[]], "malformed_tag"),
    (std_tags() + [["t", 1]], "malformed_tag"),
    ("nope", "malformed_tag"),
    (std_tags() + [["t", "x"]], "unexpected_tag"),
    (std_tags() + [["p", "a" * 64]], "unexpected_tag"),  # author data in public tags
    (std_tags() + [["k", "9"]], "unexpected_tag"),  # kind data
    (std_tags() + [["endpoint", "x"]], "unexpected_tag"),
    (std_tags() + [["filter", "{}"]], "unexpected_tag"),
    (std_tags() + [["D", "x"]], "unexpected_tag"),
    (std_tags() + [["d", D_VALUE]], "duplicate_tag"),
    (std_tags() + [["expiration", str(NOW + 10)]], "duplicate_tag"),
    (std_tags() + [["exec", "2026-06"]], "duplicate_tag"),
    (std_tags() + [["alt", "x"]], "duplicate_tag"),
    ([["d", D_VALUE, "extra"]] + std_tags(d=None), "extra_tag_value"),
    ([["alt", "a", "b"]] + std_tags(alt=None), "extra_tag_value"),
    ([["exec"]] + std_tags(exec=None), "missing_tag_value"),
    (std_tags(d=None), "missing_d_tag"),
    (std_tags(expiration=None), "missing_expiration_tag"),
    (std_tags(exec=None), "missing_exec_tag"),
    ([], "missing_d_tag"),
    (std_tags(d=""), "d_too_short"),
    (std_tags(d="x" * 15), "d_too_short"),
    (std_tags(d="x" * 65), "d_too_long"),
    (std_tags(d="é" * 33), "d_too_long"),  # 66 bytes
    (std_tags(exec=""), "empty_exec_tag"),
    (std_tags(alt="x" * 513), "alt_too_long"),
    (std_tags(expiration=""), "malformed_expiration"),
    (std_tags(expiration="0" + str(NOW + 10)), "malformed_expiration"),
    (std_tags(expiration="+" + str(NOW + 10)), "malformed_expiration"),
    (std_tags(expiration=str(NOW + 10) + ".0"), "malformed_expiration"),
    (std_tags(expiration=" " + str(NOW + 10)), "malformed_expiration"),
    (std_tags(expiration=str(NOW + 10) + "\n"), "malformed_expiration"),
    (std_tags(expiration="1e9"), "malformed_expiration"),
    (std_tags(expiration="-5"), "malformed_expiration"),
    (std_tags(expiration="１７７０００００００"), "malformed_expiration"),  # fullwidth digits
    (std_tags(expiration="9" * 17), "malformed_expiration"),
    (std_tags(expiration=str(2**53)), "malformed_expiration"),
    # expiration bound
    (std_tags(expiration=str(NOW + TTL + 1)), "ttl_too_long"),
    (std_tags(expiration=str(NOW - SKEW)), "already_expired"),
    (std_tags(expiration="0"), "already_expired"),
    # first failure wins: shape before expiration
    (std_tags(expiration="0") + [["x", "y"]], "unexpected_tag"),
    (std_tags(expiration="0", d="short"), "d_too_short"),
]


@pytest.mark.parametrize("tags,expected", CASES, ids=[f"{c}-{i}" for i, (_, c) in enumerate(CASES)])
def test_tag_rejections(tags, expected):
    assert code(tags) == expected


def test_expiration_bounds_inclusive_exclusive():
    assert check_public_tags(std_tags(expiration=str(NOW + TTL)), now=NOW, limits=LIM).expiration == NOW + TTL
    assert check_public_tags(std_tags(expiration=str(NOW - SKEW + 1)), now=NOW, limits=LIM).expiration == NOW - SKEW + 1
    assert check_public_tags(std_tags(expiration=str(NOW)), now=NOW, limits=LIM)


def test_d_bounds():
    check_public_tags(std_tags(d="x" * 16), now=NOW, limits=LIM)
    check_public_tags(std_tags(d="x" * 64), now=NOW, limits=LIM)


def test_custom_limits():
    lim = Limits(max_lease_ttl=60, allowed_skew=5)
    check_public_tags(std_tags(expiration=str(NOW + 60)), now=NOW, limits=lim)
    assert code(std_tags(expiration=str(NOW + 61)), limits=lim) == "ttl_too_long"
    assert code(std_tags(expiration=str(NOW - 5)), limits=lim) == "already_expired"
