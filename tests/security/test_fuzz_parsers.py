"""Fuzzing the pure parsers hostile input reaches first: REQ/COUNT filters, lease plaintexts (kind
30350, acceptance step 5), App Attest CBOR attestation and assertion objects. Each either accepts or
refuses with its own typed error: no other exception, no hang.

(Websocket messages and frames, gateway request bodies over HTTP: test_fuzz_wire.py; gateway JSON
bodies as a parser: tests/gateway/test_wire.py; MLS messages: tests/marmot/test_mls_fuzz.py.)"""

from __future__ import annotations

import base64
import json
import time

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.gateway.attest import AttestationFailed, Verifier
from appliance.nostr.event import sign_event
from appliance.nostr.filters import InvalidFilter, matches, parse_filter
from appliance.nostr.keys import generate_secret
from appliance.push.descriptor import Limits
from appliance.push.errors import LeaseRejected
from appliance.push.plaintext import parse_lease_plaintext
from appliance.testing.attester import SoftwareAttester, TestCA
from tests.fuzzing import fuzz
from tests.push.helpers import active_plaintext, inactive_plaintext

pytestmark = pytest.mark.fuzz

# JSON as a hostile client writes it: huge integers, floats, deep nesting, any text.
json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=24))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=5), max_leaves=20)

# -- filters -------------------------------------------------------------------------------------------

HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
filter_keys = st.sampled_from(["ids", "authors", "kinds", "since", "until", "limit", "search", "#e", "#p", "#h",
                               "#t", "#", "#ab", "#P", "extra"])
filter_values = (json_values | st.lists(HEX, max_size=3) | st.lists(st.integers(-5, 70000), max_size=4)
                 | st.integers(-(2**64), 2**64))
EVENT = sign_event(generate_secret(), 9, [["h", "g"], ["p", "ab" * 32], ["t", "x"]], "hello world")


@fuzz(400)
@given(obj=st.dictionaries(filter_keys, filter_values, max_size=6) | json_values)
def test_filters_parse_or_refuse_and_accepted_ones_round_trip(obj):
    try:
        f = parse_filter(obj)
    except InvalidFilter as exc:
        assert str(exc)
        return
    assert isinstance(matches(f, EVENT), bool)
    assert parse_filter(f.to_dict()) == f


# -- lease plaintexts -------------------------------------------------------------------------------------

LIM = Limits()


def _lease_outcome(text: str) -> None:
    try:
        parse_lease_plaintext(text, LIM)
    except LeaseRejected as exc:
        assert exc.args
    except RecursionError:  # pragma: no cover - reported as the bug it would be
        raise AssertionError("deep nesting escaped the parser's bounds")


@fuzz(300)
@given(text=st.text(max_size=300) | json_values.map(json.dumps))
def test_any_text_is_a_lease_or_a_lease_rejection(text):
    _lease_outcome(text)


@fuzz(300)
@given(base=st.sampled_from(["active", "inactive"]), path=st.lists(st.sampled_from(
    ["v", "active", "origin", "app_profile", "transport", "endpoint", "generation", "subscriptions", 0, 1,
     "filter", "class", "ignore", "suppress", "kinds", "#h", "p_tags_max", "new"]), min_size=1, max_size=4),
    value=json_values, drop=st.booleans())
def test_one_changed_member_anywhere_is_a_lease_or_a_lease_rejection(base, path, value, drop):
    obj = active_plaintext() if base == "active" else inactive_plaintext()
    target = obj
    for key in path[:-1]:
        try:
            target = target[key]
        except (KeyError, IndexError, TypeError):
            break
    last = path[-1]
    if isinstance(target, dict) and isinstance(last, str):
        target.pop(last, None) if drop else target.__setitem__(last, value)
    elif isinstance(target, list) and isinstance(last, int) and last < len(target):
        target[last] = value
    _lease_outcome(json.dumps(obj))


def test_deeply_nested_lease_text_is_refused():
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
        with pytest.raises(LeaseRejected):
            parse_lease_plaintext(text, Limits(max_plaintext_len=1_000_000))


# -- App Attest CBOR objects -------------------------------------------------------------------------------

APP = "TEAM123456.com.example.app"
NOW = int(time.time())
cbor_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
                | st.text(max_size=16) | st.binary(max_size=40))
cbor_values = st.recursive(cbor_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=4)
                           | st.builds(cbor2.CBORTag, st.integers(6, 30), inner), max_leaves=16)


@pytest.fixture(scope="module")
def attest_world():
    ca = TestCA()
    a = SoftwareAttester(ca, APP)
    attestation = base64.b64decode(a.attest(b"transcript"))
    assertion = base64.b64decode(a.assert_(b"request"))
    return Verifier(APP, "production", (ca.root,)), a, attestation, assertion


def _verify(v: Verifier, a: SoftwareAttester, attestation: bytes) -> None:
    try:
        key = v.verify_attestation(attestation, a.key_id, b"transcript", NOW)
    except AttestationFailed:
        return
    assert key.public_key == a.point  # only a change in an unchecked part (the receipt) may still verify


def _assert(v: Verifier, a: SoftwareAttester, assertion: bytes) -> None:
    try:
        counter = v.verify_assertion(assertion, b"request", a.point)
    except AttestationFailed:
        return
    assert counter == 1


@fuzz(200)
@given(data=st.binary(max_size=400) | cbor_values.map(cbor2.dumps))
def test_arbitrary_cbor_is_refused_as_an_attestation_failure(attest_world, data):
    v, a, _, _ = attest_world
    with pytest.raises(AttestationFailed):
        v.verify_attestation(data, a.key_id, b"transcript", NOW)
    with pytest.raises(AttestationFailed):
        v.verify_assertion(data, b"request", a.point)


def _mutate(data: bytes, pos: int, op: int, value: int) -> bytes:
    pos %= len(data) + 1
    return [data[:pos] + bytes([value]) + data[pos + 1:], data[:pos], data[:pos] + bytes([value]) + data[pos:],
            data[:pos] + data[pos + 1:]][op]


@fuzz(300)
@given(pos=st.integers(0, 10_000), op=st.integers(0, 3), value=st.integers(0, 255))
def test_mutated_attestation_and_assertion_bytes(attest_world, pos, op, value):
    v, a, attestation, assertion = attest_world
    _verify(v, a, _mutate(attestation, pos, op, value))
    _assert(v, a, _mutate(assertion, pos, op, value))


@fuzz(200)
@given(path=st.sampled_from([("fmt",), ("attStmt",), ("authData",), ("attStmt", "x5c"), ("attStmt", "receipt"),
                             ("attStmt", "x5c", 0), ("attStmt", "x5c", 1), ("attStmt", "x5c", 2), ("new",)]),
       value=cbor_values)
def test_attestation_with_one_member_replaced(attest_world, path, value):
    v, a, attestation, assertion = attest_world
    obj = cbor2.loads(attestation)
    target = obj
    for key in path[:-1]:
        target = target[key]
    if isinstance(target, list):
        target.append(value) if path[-1] >= len(target) else target.__setitem__(path[-1], value)
    else:
        target[path[-1]] = value
    _verify(v, a, cbor2.dumps(obj))
    other = cbor2.loads(assertion)
    other[path[0] if path[0] in other else "signature"] = value
    _assert(v, a, cbor2.dumps(other))
