"""Mutated messages and states never raise anything but MLSError, and never change the state.

Byte-level mutations mostly stop at a signature or tag; the re-signed ones below reach the
proposal-list, tree and key-schedule checks behind them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.marmot.mls import (
    AppEphemeral,
    Capabilities,
    Extension,
    Group,
    MLSError,
    UnknownProposal,
    create_key_package,
    external_join,
    join_from_welcome,
)
from appliance.marmot.mls.framing import protect_public, sign_content
from appliance.marmot.mls.structs import (
    CT_COMMIT,
    P_APP_EPHEMERAL,
    WF_PRIVATE_MESSAGE,
    WF_PUBLIC_MESSAGE,
    Commit,
    FramedContent,
    FramedContentAuthData,
    MLSMessage,
)
from tests.fuzzing import fuzz

pytestmark = pytest.mark.fuzz


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


@fuzz(300)
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


@fuzz(100)
@given(pos=st.integers(0, 100_000), op=st.integers(0, 3), value=st.integers(0, 255))
def test_mutated_welcomes_raise_typed_errors(world, pos, op, value):
    _, _, welcome, bob_kp = world
    data = mutate(welcome, pos, op, value)
    if data == welcome:
        return
    with pytest.raises(MLSError):
        join_from_welcome(data, bob_kp)


@fuzz(100)
@given(pos=st.integers(0, 100_000), op=st.integers(0, 3), value=st.integers(0, 255))
def test_mutated_group_infos_and_key_packages_raise_typed_errors(world, pos, op, value):
    alice, _, _, _ = world
    before = alice.to_bytes()
    group_info = alice.group_info()
    key_package = create_key_package(b"carol").key_package.encode()
    cases = ((lambda d: external_join(d, b"dev"), group_info), (lambda d: alice.commit(add=[d]), key_package))
    for call, original in cases:
        data = mutate(original, pos, op, value)
        if data == original:
            continue
        try:
            call(data)
        except MLSError:
            pass
    assert alice.to_bytes() == before


@pytest.fixture(scope="module")
def resigned():
    """A four-member group and commits from bob, to be mutated and then re-signed and re-tagged by bob."""
    caps = Capabilities(proposals=(P_APP_EPHEMERAL, 0xF00D), extensions=(0xF0,))
    alice = Group.create(b"fuzz-2", b"alice", capabilities=caps)
    kps = [create_key_package(b"m%d" % i, capabilities=caps) for i in range(3)]
    out = alice.commit(add=[k.key_package for k in kps])
    alice, bob, carol, _ = [out.group] + [join_from_welcome(out.welcome, k) for k in kps]
    bob, update = bob.propose_update()
    alice = alice.process(update).group
    newcomer = create_key_package(b"new", capabilities=caps).key_package
    commits = [bob.commit(add=[newcomer], remove=[carol.own_leaf]).message, bob.commit().message,
               bob.commit(proposals=[AppEphemeral(1, b"x"), UnknownProposal(0xF00D, b"y")]).message,
               bob.commit(group_context_extensions=[Extension(0xF0, b"")]).message]
    return alice, bob, commits


@fuzz(150)
@given(which=st.integers(0, 3), pos=st.integers(0, 100_000), op=st.integers(0, 3), value=st.integers(0, 255))
def test_mutated_commits_resigned_by_a_member_raise_typed_errors(resigned, which, pos, op, value):
    alice, bob, commits = resigned
    pm = MLSMessage.decode(commits[which]).body
    body = pm.content.content.encode()
    data = mutate(body, pos, op, value)
    if data == body:
        return
    try:
        commit = Commit.decode(data)
    except MLSError:
        return
    content = FramedContent(pm.content.group_id, pm.content.epoch, pm.content.sender, b"", CT_COMMIT, commit)
    auth = FramedContentAuthData(sign_content(WF_PUBLIC_MESSAGE, content, bob.context, bob.signature_priv),
                                 pm.auth.confirmation_tag)
    message = MLSMessage(WF_PUBLIC_MESSAGE, protect_public(content, auth, bob.context, bob.secrets.membership_key))
    before = alice.to_bytes()
    with pytest.raises(MLSError):  # the confirmation tag was made for the unmutated commit
        alice.process(message.encode())
    assert alice.to_bytes() == before
