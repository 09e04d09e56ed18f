"""Mutated messages and states never raise anything but MLSError, and never change the state."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.marmot.mls import Group, MLSError, create_key_package, external_join, join_from_welcome
from appliance.marmot.mls.structs import WF_PRIVATE_MESSAGE


@pytest.fixture(scope="module")
def world():
    alice = Group.create(b"fuzz", b"alice")
    kp = create_key_package(b"bob")
    out = alice.commit(add=[kp.key_package])
    alice, bob = out.group, join_from_welcome(out.welcome, kp)
    kp2 = create_key_package(b"carol")
    messages = {
        "public commit": bob.commit(add=[kp2.key_package]).message,
        "private commit": bob.commit(remove=[0], wire_format=WF_PRIVATE_MESSAGE).message,
        "application": bob.encrypt(b"hello")[1],
        "external commit": external_join(alice.group_info(), b"dev")[1],
        "proposal": bob.propose_update()[1],
    }
    return alice, messages, out.welcome, kp


def mutate(data: bytes, draw_pos: int, op: int, value: int) -> bytes:
    pos = draw_pos % (len(data) + 1)
    if op == 0:
        return data[:pos] + bytes([value]) + data[pos + 1:]
    if op == 1:
        return data[:pos]
    if op == 2:
        return data[:pos] + bytes([value]) + data[pos:]
    return data[:pos] + data[pos + 1:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["public commit", "private commit", "application", "external commit", "proposal"]),
       pos=st.integers(0, 10_000), op=st.integers(0, 3), value=st.integers(0, 255))
def test_mutated_messages_raise_typed_errors_and_change_nothing(world, which, pos, op, value):
    alice, messages, _, _ = world
    before = alice.to_bytes()
    data = mutate(messages[which], pos, op, value)
    if data == messages[which]:
        return
    try:
        alice.process(data)
    except MLSError:
        pass
    assert alice.to_bytes() == before


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 100_000), op=st.integers(0, 3), value=st.integers(0, 255))
def test_mutated_welcomes_raise_typed_errors(world, pos, op, value):
    _, _, welcome, bob_kp = world
    data = mutate(welcome, pos, op, value)
    if data == welcome:
        return
    with pytest.raises(MLSError):
        join_from_welcome(data, bob_kp)
