import pathlib
import re

import pytest

from appliance.push.errors import REASONS, SPEC_WORDED, DescriptorError, LeaseRejected, reason_message

SPEC = pathlib.Path("/work/shared/spec/NIP-PL.md")


def test_catalogue_messages_unique_and_prefixed():
    assert len(set(REASONS.values())) == len(REASONS)
    for code, msg in REASONS.items():
        assert re.fullmatch(r"(invalid|auth-required|restricted): [^\s].*", msg), (code, msg)
        assert msg == msg.strip()


@pytest.mark.parametrize("code", sorted(REASONS))
def test_lease_rejected_carries_full_message(code):
    e = LeaseRejected(code)
    assert e.code == code
    assert e.message == REASONS[code] == reason_message(code) == str(e)
    assert e.prefix in ("invalid", "auth-required", "restricted")


def test_unknown_code_refused():
    with pytest.raises(KeyError):
        LeaseRejected("no such reason")


def test_catalogue_is_read_only():
    with pytest.raises(TypeError):
        REASONS["x"] = "invalid: x"  # type: ignore[index]


@pytest.mark.skipif(not SPEC.exists(), reason="spec text not available")
@pytest.mark.parametrize("code", sorted(SPEC_WORDED))
def test_spec_worded_messages_match_spec_text(code):
    text = SPEC.read_text()
    msg = REASONS[code]
    if code == "pubkey_mismatch":
        assert "restricted: pubkey does not match authenticated user" in text
    else:
        assert msg in text, msg


def test_spec_reasons_all_catalogued():
    """Every literal `invalid: ...` reason the spec names for leases is in the catalogue."""
    if not SPEC.exists():
        pytest.skip("spec text not available")
    text = SPEC.read_text()
    wanted = set(re.findall(r"invalid: ([a-z][a-z0-9 \-]+[a-z])", text))
    wanted -= {"<tag reason>", "<schema reason>"}
    have = {m.split(": ", 1)[1] for m in REASONS.values()}
    # spec-internal phrases that are not lease OK reasons
    ignore = {"reason", "request", "endpoint", "grant"}
    missing = {w for w in wanted if w not in have and w.split()[0] not in ignore}
    assert not missing, missing


def test_descriptor_error_names_rule():
    e = DescriptorError("one-current-key", "detail")
    assert isinstance(e, ValueError) and e.rule == "one-current-key"
