"""Closed request objects: size cap, members, duplicates at any depth, trailing data, types, value rules."""

from __future__ import annotations

import base64
import json

import pytest

from appliance.gateway import wire
from appliance.gateway.errors import InvalidRequest

UUID = "11111111-1111-4111-8111-111111111111"
CHALLENGE = base64.urlsafe_b64encode(bytes(range(32))).rstrip(b"=").decode()
KEY_ID = base64.b64encode(b"\xaa" * 32).decode()

VALID = {
    "challenge": (wire.CHALLENGE, {"v": 1}),
    "enroll": (wire.ENROLL, {"v": 1, "challenge_id": UUID, "challenge": CHALLENGE, "key_id": KEY_ID,
                             "attestation": "AAEC", "app_profile": "buzz-ios-production", "endpoint": "0a" * 32,
                             "endpoint_epoch": 1, "expires_at": 1752624000}),
    "delegate": (wire.DELEGATE, {"v": 1, "challenge_id": UUID, "challenge": CHALLENGE, "installation_handle": UUID,
                                 "endpoint_epoch": 1, "generation": 1, "relay_pubkey": "ab" * 32,
                                 "not_before": 1, "expires_at": 2, "assertion": "AAEC"}),
    "rotate": (wire.ROTATE_ENDPOINT, {"v": 1, "challenge_id": UUID, "challenge": CHALLENGE, "installation_handle": UUID,
                                      "endpoint_epoch": 1, "new_endpoint_epoch": 2, "endpoint": "ff" * 8,
                                      "assertion": "AAEC"}),
    "revoke_delegation": (wire.REVOKE_DELEGATION, {"v": 1, "challenge_id": UUID, "challenge": CHALLENGE,
                                                   "installation_handle": UUID, "relay_pubkey": "ab" * 32,
                                                   "generation": 3, "assertion": "AAEC"}),
    "revoke_installation": (wire.REVOKE_INSTALLATION, {"v": 1, "challenge_id": UUID, "challenge": CHALLENGE,
                                                       "installation_handle": UUID, "endpoint_epoch": 4,
                                                       "new_endpoint_epoch": 5, "assertion": "AAEC"}),
    "delivery": (wire.DELIVERY, {"v": 1, "endpoint_grant": "k.AAAA", "request_id": UUID, "expires_at": 9}),
}


def raw(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def refused(body: bytes, schema) -> None:
    with pytest.raises(InvalidRequest) as exc:
        wire.parse_request(body, schema)
    assert exc.value.status == 400 and exc.value.body == b'{"error":"invalid_request"}'


@pytest.mark.parametrize("name", VALID)
def test_valid_objects_parse_in_any_member_order(name):
    schema, obj = VALID[name]
    assert wire.parse_request(raw(obj), schema) == obj
    assert wire.parse_request(raw(dict(reversed(obj.items()))), schema) == obj
    assert wire.parse_request(b" \n\t" + raw(obj) + b"\r\n ", schema) == obj  # JSON whitespace only


@pytest.mark.parametrize("name", VALID)
def test_each_member_missing_unknown_or_mistyped_is_refused(name):
    schema, obj = VALID[name]
    for member in obj:
        refused(raw({k: v for k, v in obj.items() if k != member}), schema)
        for wrong in (None, True, 1.0, [], {}, "1" if isinstance(obj[member], int) else 1):
            refused(raw({**obj, member: wrong}), schema)
    refused(raw({**obj, "extra": 1}), schema)
    refused(raw({**obj, "V": 1}), schema)


@pytest.mark.parametrize("name", VALID)
def test_v_must_be_the_integer_one(name):
    schema, obj = VALID[name]
    for v in (0, 2, -1, "1", 1.0, True):
        refused(raw({**obj, "v": v}), schema)
    refused(raw(obj).replace(b'"v":1', b'"v":1.0'), schema)
    refused(raw(obj).replace(b'"v":1', b'"v":1e0'), schema)


@pytest.mark.parametrize("name", VALID)
def test_duplicates_trailing_data_and_non_objects(name):
    schema, obj = VALID[name]
    body = raw(obj)
    refused(body[:-1] + b',"v":1}', schema)  # duplicate top-level member, same value
    refused(body + b"x", schema)
    refused(body + b"{}", schema)
    refused(body + b" 1", schema)
    refused(b"\xef\xbb\xbf" + body, schema)  # a BOM is not JSON whitespace
    refused(b"[" + body + b"]", schema)
    refused(b"", schema)
    refused(b"null", schema)
    refused(body[:-3], schema)


def test_duplicates_at_any_depth():
    # A nested object is an unknown member anyway; its duplicate is refused while parsing.
    with pytest.raises(InvalidRequest, match="duplicate"):
        wire.parse_json_object(b'{"v":1,"x":{"a":1,"a":1}}')
    with pytest.raises(InvalidRequest, match="duplicate"):
        wire.parse_json_object(b'{"v":1,"x":[{"b":{"a":1,"a":2}}]}')
    with pytest.raises(InvalidRequest, match="duplicate"):
        wire.parse_json_object(b'{"v":1,"\\u0076":1}')  # the same member spelled with an escape


def test_body_size_cap_is_8192_bytes():
    schema, obj = VALID["delivery"]
    body = raw(obj)
    padded = body[:-1] + b" " * (8192 - len(body)) + b"}"
    assert len(padded) == 8192
    assert wire.parse_request(padded, schema) == obj
    refused(body[:-1] + b" " * (8193 - len(body)) + b"}", schema)


def test_invalid_utf8_nan_huge_and_deep():
    refused(b'{"v":1,"endpoint_grant":"\xff","request_id":"' + UUID.encode() + b'","expires_at":1}', wire.DELIVERY)
    for bad in (b'{"v":NaN}', b'{"v":Infinity}', b'{"v":1' + b"0" * 30 + b"}", b'{"v":9223372036854775808}'):
        refused(bad, wire.CHALLENGE)
    refused(b'{"v":1,"x":' + b"[" * 5000 + b"]" * 5000 + b"}", wire.CHALLENGE)
    refused(b'{"v":01}', wire.CHALLENGE)
    refused(b"{'v':1}", wire.CHALLENGE)


@pytest.mark.parametrize("value", [
    "11111111-1111-4111-8111-11111111111", "11111111-1111-4111-8111-1111111111111",
    "11111111-1111-4111-8111-11111111111A", "{11111111-1111-4111-8111-111111111111}",
    "11111111111141118111111111111111", "11111111-1111-4111-8111_111111111111", " " + UUID, UUID + "\n",
])
def test_uuids_are_canonical_lowercase(value):
    for name in ("delivery", "revoke_delegation"):
        schema, obj = VALID[name]
        field = "request_id" if name == "delivery" else "installation_handle"
        refused(raw({**obj, field: value}), schema)


def test_relay_pubkeys_are_64_lowercase_hex():
    schema, obj = VALID["delegate"]
    for bad in ("AB" * 32, "ab" * 31, "ab" * 33, "ag" + "ab" * 31, "", "0x" + "ab" * 31):
        refused(raw({**obj, "relay_pubkey": bad}), schema)


def test_endpoints_are_even_lowercase_hex_up_to_512_bytes():
    schema, obj = VALID["rotate"]
    assert wire.parse_request(raw({**obj, "endpoint": "0f" * 512}), schema)["endpoint"] == "0f" * 512
    for bad in ("", "0", "abc", "0F" * 4, "0f" * 513, "zz", "0f 0f", "0x0f"):
        refused(raw({**obj, "endpoint": bad}), schema)


def test_challenges_are_32_bytes_of_unpadded_urlsafe_base64():
    schema, obj = VALID["revoke_delegation"]
    std = base64.b64encode(b"\xfb\xff" * 16).decode()  # has + and /: standard, not URL-safe
    for bad in (CHALLENGE + "=", CHALLENGE[:-1], CHALLENGE + "A", std.rstrip("="),
                base64.urlsafe_b64encode(b"\x00" * 31).rstrip(b"=").decode(),
                CHALLENGE[:-1] + "B"):  # 'B' sets bits beyond the 32 bytes: not canonical
        refused(raw({**obj, "challenge": bad}), schema)


def test_key_ids_are_32_bytes_padded_or_not_and_sizes_bounded():
    schema, obj = VALID["enroll"]
    unpadded = KEY_ID.rstrip("=")
    assert wire.parse_request(raw({**obj, "key_id": unpadded}), schema)["key_id"] == unpadded
    for bad in (base64.b64encode(b"\xaa" * 31).decode(), base64.b64encode(b"\xaa" * 33).decode(),
                KEY_ID.replace("q", "-"), KEY_ID + "=", unpadded[:-1] + "r", "", "===="):
        refused(raw({**obj, "key_id": bad}), schema)
    assert wire.parse_request(raw({**obj, "attestation": base64.b64encode(b"x" * 5000).decode()}), schema)
    refused(raw({**obj, "attestation": ""}), schema)
    s = VALID["delegate"]
    ok = base64.b64encode(b"x" * 1024).decode()
    assert wire.parse_request(raw({**s[1], "assertion": ok}), s[0])["assertion"] == ok
    refused(raw({**s[1], "assertion": base64.b64encode(b"x" * 1025).decode()}), s[0])
    refused(raw({**s[1], "assertion": "AAEC\n"}), s[0])


def test_attestations_up_to_16384_bytes():
    s = VALID["enroll"]
    # The largest attestation does not fit in an 8192-byte body; the value rule still holds alone.
    assert len(wire.decode_std_b64(base64.b64encode(b"x" * 16384).decode(), 1, 16384)) == 16384
    with pytest.raises(InvalidRequest):
        wire.decode_std_b64(base64.b64encode(b"x" * 16385).decode(), 1, 16384)
    refused(raw({**s[1], "attestation": "A"}), s[0])


def test_app_profile_must_be_registered():
    schema, obj = VALID["enroll"]
    assert wire.parse_request(raw({**obj, "app_profile": "buzz-ios-sandbox"}), schema)
    for bad in ("buzz-ios-dogfood", "BUZZ-IOS-PRODUCTION", "", "com.example.app/ios"):
        refused(raw({**obj, "app_profile": bad}), schema)


def test_positive_integers_and_epoch_succession():
    schema, obj = VALID["delegate"]
    for member in ("endpoint_epoch", "generation"):
        refused(raw({**obj, member: 0}), schema)
        refused(raw({**obj, member: -1}), schema)
    for name in ("rotate", "revoke_installation"):
        schema, obj = VALID[name]
        refused(raw({**obj, "new_endpoint_epoch": obj["endpoint_epoch"]}), schema)
        refused(raw({**obj, "new_endpoint_epoch": obj["endpoint_epoch"] + 2}), schema)
        top = 2**63 - 1
        refused(raw({**obj, "endpoint_epoch": top, "new_endpoint_epoch": top}), schema)
        refused(raw({**obj, "endpoint_epoch": top}).replace(b'"new_endpoint_epoch":' + str(obj["new_endpoint_epoch"]).encode(),
                                                            b'"new_endpoint_epoch":9223372036854775808'), schema)


def test_grants_up_to_4096_bytes():
    schema, obj = VALID["delivery"]
    assert wire.parse_request(raw({**obj, "endpoint_grant": "k." + "A" * 4094}), schema)
    refused(raw({**obj, "endpoint_grant": "k." + "A" * 4095}), schema)
    refused(raw({**obj, "endpoint_grant": ""}), schema)



@pytest.mark.parametrize("name", VALID)
def test_lone_surrogates_are_no_text_in_any_string_member(name):
    # json.loads turns "\\ud800" into a str no encoder can write: every string member refuses it (400),
    # the grant included, whose only other rule is its size in bytes.
    schema, obj = VALID[name]
    for member, value in obj.items():
        if isinstance(value, str):
            refused(raw({**obj, member: value[:-1]}).replace(b'"' + value[:-1].encode() + b'"',
                                                           b'"' + value[:-1].encode() + b'\\udc80"'), schema)
    assert wire.parse_request(raw({**VALID["delivery"][1], "endpoint_grant": "k.\u00e9"}), wire.DELIVERY)

@pytest.mark.parametrize("value,ok", [
    ("application/json", True), ("Application/JSON", True), ("application/json; charset=utf-8", True),
    ("application/json;charset=UTF-8", True), (None, False), ("text/plain", False),
    ("application/json; charset=latin-1", False), ("application/json+x", False), ("application/x-www-form-urlencoded", False),
])
def test_content_type(value, ok):
    assert wire.ContentType.acceptable(value) is ok


from hypothesis import given, strategies as st  # noqa: E402

from tests.fuzzing import fuzz  # noqa: E402

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@pytest.mark.fuzz
@fuzz(300)
@given(name=st.sampled_from(sorted(VALID)), member=st.text(max_size=12), value=_json_values)
def test_any_single_change_is_accepted_exactly_or_refused_cleanly(name, member, value):
    schema, obj = VALID[name]
    changed = {**obj, member: value}
    try:
        out = wire.parse_request(raw(changed), schema)
    except InvalidRequest:
        return
    # Accepted only if it is still the closed object with every value in its rules.
    assert out == changed and set(out) == set(schema)


@pytest.mark.fuzz
@fuzz(300)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_never_escape_as_another_error(data):
    for schema, _ in VALID.values():
        try:
            wire.parse_request(data, schema)
        except InvalidRequest:
            pass
