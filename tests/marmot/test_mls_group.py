"""The MLS group engine end to end: Welcome joins, commits, External Commit with an external PSK,
unknown extensions kept byte-exact, and invalid inputs refused with typed errors and no state change."""

from __future__ import annotations

import pytest

from appliance.marmot.mls import (
    AppEphemeral,
    Capabilities,
    ConfirmationTagError,
    DecodeError,
    DecryptError,
    EpochError,
    Extension,
    ExternalCommitPolicy,
    Group,
    MembershipTagError,
    MLSError,
    ProposalError,
    RequiredCapabilities,
    SignatureError,
    StateError,
    TreeError,
    UnknownProposal,
    create_key_package,
    ValidationError,
    external_join,
    join_from_welcome,
    prepare_external_join,
    PendingExternalJoin,
)
from appliance.marmot.mls.structs import (
    EXT_APP_DATA_DICTIONARY,
    EXT_REQUIRED_CAPABILITIES,
    P_APP_EPHEMERAL,
    P_PSK,
    WF_PRIVATE_MESSAGE,
    AppDataUpdate,
    MLSMessage,
    PreSharedKey,
    Remove,
)
from appliance.marmot.mls.group import encode_app_data_dictionary, decode_app_data_dictionary

MARMOT_EXT = 0xF2EE  # MDK 0.8's group data extension: unknown to this core, must survive byte for byte
CAPS = Capabilities(extensions=(MARMOT_EXT, EXT_APP_DATA_DICTIONARY), proposals=(P_APP_EPHEMERAL, 0x0008))


def _group_exts():
    return (Extension(MARMOT_EXT, bytes(range(40))),
            Extension(EXT_REQUIRED_CAPABILITIES, RequiredCapabilities((MARMOT_EXT,), (P_APP_EPHEMERAL,)).encode()))


def make_group(n_members: int = 3):
    """Alice's group with n_members invitees (all joined by Welcome); returns [alice, m1, ...]."""
    alice = Group.create(b"group-1", b"alice", capabilities=CAPS, extensions=_group_exts())
    kps = [create_key_package(b"member-%d" % i, capabilities=CAPS) for i in range(n_members)]
    out = alice.commit(add=[k.key_package for k in kps])
    members = [out.group] + [join_from_welcome(out.welcome, k) for k in kps]
    assert len({m.epoch_authenticator for m in members}) == 1
    return members


def same_epoch(groups):
    assert len({g.epoch for g in groups}) == 1
    assert len({g.epoch_authenticator for g in groups}) == 1
    assert len({g.export_secret(b"check", b"ctx", 32) for g in groups}) == 1
    assert len({g.group_context_bytes() for g in groups}) == 1
    assert len({g.tree.encode() for g in groups}) == 1


def join_psk(group: Group) -> tuple[bytes, bytes]:
    """A PSK id bound to the current GroupContext and its value from the exporter (the Marmot draft's shape)."""
    import hashlib
    psk_id = b"\x1f" + b"marmot.multi-device.join-psk.v1" + hashlib.sha256(group.group_context_bytes()).digest()
    return psk_id, group.export_secret(b"marmot", psk_id, 32)


def test_welcome_join_commit_remove_update_and_messages():
    members = make_group(3)
    same_epoch(members)
    alice, m1, m2, m3 = members
    # a member removes another with a PrivateMessage commit
    out = m1.commit(remove=[m3.own_leaf], wire_format=WF_PRIVATE_MESSAGE)
    alice = alice.process(out.message).group
    m2 = m2.process(out.message).group
    removed = m3.process(out.message)
    assert removed.removed_self and not removed.group.active
    m1 = out.group
    same_epoch([alice, m1, m2])
    # an Update proposal by reference, committed by someone else
    m2, update_msg = m2.propose_update()
    alice = alice.process(update_msg).group
    m1 = m1.process(update_msg).group
    out = alice.commit()
    assert len(out.proposals) == 1
    m1 = m1.process(out.message).group
    m2 = m2.process(out.message).group
    alice = out.group
    same_epoch([alice, m1, m2])
    # application messages
    alice, ct = alice.encrypt(b"hello", authenticated_data=b"aad")
    got = m2.process(ct)
    assert (got.kind, got.application_data, got.authenticated_data) == ("application", b"hello", b"aad")
    with pytest.raises(DecryptError):
        got.group.process(ct)  # the key was used: a replay does not decrypt


def test_state_bytes_roundtrip_and_invalid_state():
    alice, m1, *_ = make_group(2)
    restored = Group.from_bytes(alice.to_bytes())
    assert restored.to_bytes() == alice.to_bytes()
    out = Group.from_bytes(m1.to_bytes()).commit()
    assert Group.from_bytes(restored.to_bytes()).process(out.message).group.epoch_authenticator == \
        out.group.epoch_authenticator
    for bad in (b"", b"\xa0", alice.to_bytes()[:-3]):
        with pytest.raises(StateError):
            Group.from_bytes(bad)


def test_external_commit_with_external_psk_round_trip():
    members = make_group(4)
    group_info = members[1].group_info()
    psk_id, psk = join_psk(members[2])
    joiner, commit = external_join(group_info, b"new-device", capabilities=CAPS, external_psks={psk_id: psk})
    results = [m.process(commit, psks={psk_id: join_psk(m)[1]}) for m in members]
    assert all(r.kind == "commit" for r in results)
    assert {type(p).__name__ for p in results[0].proposals} == {"ExternalInit", "PreSharedKey"}
    groups = [r.group for r in results] + [joiner]
    same_epoch(groups)
    assert joiner.epoch == members[0].epoch + 1
    # everyone can talk to everyone afterwards
    joiner, ct = joiner.encrypt(b"hi from the new device")
    assert {g.process(ct).application_data for g in groups[:-1]} == {b"hi from the new device"}


def test_external_commit_wrong_or_missing_psk_changes_nothing():
    members = make_group(2)
    psk_id, psk = join_psk(members[0])
    _, commit = external_join(members[0].group_info(), b"dev", capabilities=CAPS, external_psks={psk_id: psk})
    before = members[1].to_bytes()
    with pytest.raises(ConfirmationTagError):
        members[1].process(commit, psks={psk_id: b"\x00" * 32})
    with pytest.raises(ProposalError):
        members[1].process(commit)
    assert members[1].to_bytes() == before
    members[1].process(commit, psks={psk_id: psk})  # still processable


def test_external_commit_stale_group_info_fails():
    members = make_group(2)
    stale_info = members[0].group_info()
    out = members[0].commit()
    current = out.group
    _, commit = external_join(stale_info, b"dev", capabilities=CAPS)
    with pytest.raises(EpochError):
        current.process(commit)


MARMOT_COMPONENT = 0x800A


def marmot_policy(psk_id: bytes):
    def check(view):
        kinds = [p.proposal_type for p in view.proposals]
        psks = [p for p in view.proposals if p.proposal_type == P_PSK]
        eph = [p for p in view.proposals if p.proposal_type == P_APP_EPHEMERAL]
        if len(psks) != 1 or psks[0].psk.psk_id != psk_id:
            raise ProposalError("need exactly one join PSK")
        if len(eph) != 1 or eph[0].component_id != MARMOT_COMPONENT:
            raise ProposalError("need exactly one AppEphemeral for 0x800a")
        if view.authenticated_data:
            raise ProposalError("authenticated_data must be empty")
        assert kinds.count(6) == 1
    return ExternalCommitPolicy(frozenset({P_PSK, P_APP_EPHEMERAL}), check)


def test_external_commit_policy_for_app_ephemeral():
    members = make_group(2)
    psk_id, psk = join_psk(members[0])
    proof = AppEphemeral(MARMOT_COMPONENT, b"\x07" * 104)
    joiner, commit = external_join(members[0].group_info(), b"dev", capabilities=CAPS,
                                   external_psks={psk_id: psk}, proposals=[proof])
    # RFC 9420's own rule set refuses the AppEphemeral
    with pytest.raises(ProposalError):
        members[1].process(commit, psks={psk_id: psk})
    seen = []
    policy = marmot_policy(psk_id)

    def recording(view):
        seen.append(view)
        policy.check(view)

    res = members[1].process(commit, psks={psk_id: psk},
                             external_commit_policy=ExternalCommitPolicy(policy.allowed_proposal_types, recording))
    assert seen[0].joiner_leaf.credential.identity == b"dev"
    assert seen[0].joiner_leaf_index == joiner.own_leaf
    assert seen[0].parent_context.epoch == members[1].epoch
    assert any(p == proof for p in res.proposals)
    same_epoch([res.group, joiner])
    # the same shape without the AppEphemeral is refused by the Marmot-shaped check
    _, bare = external_join(members[0].group_info(), b"dev2", capabilities=CAPS, external_psks={psk_id: psk})
    with pytest.raises(ProposalError):
        members[1].process(bare, psks={psk_id: psk}, external_commit_policy=marmot_policy(psk_id))


def test_external_commit_in_two_steps_binds_the_prepared_leaf():
    """prepare_external_join fixes the joining leaf; something bound to that exact leaf (here an
    AppEphemeral carrying its hash) is made afterwards, and finish puts that very leaf in the Commit."""
    import hashlib

    members = make_group(2)
    psk_id, psk = join_psk(members[0])
    pending = prepare_external_join(members[0].group_info(), b"dev", capabilities=CAPS, external_psks={psk_id: psk})
    leaf = pending.leaf_node
    assert pending.group_context.encode() == members[0].group_context_bytes()
    assert leaf.parent_hash and leaf.signature  # the complete, signed leaf, not a placeholder
    # The state survives bytes (a new device waits for its authorization), and finish is repeatable.
    again = PendingExternalJoin.from_bytes(pending.to_bytes())
    assert again.leaf_node.encode() == leaf.encode()
    binding = AppEphemeral(MARMOT_COMPONENT, hashlib.sha256(leaf.encode()).digest() * 3 + bytes(8))
    joiner, commit = again.finish([binding])
    carried = MLSMessage.decode(commit).body.content.content
    assert carried.path.leaf_node.encode() == leaf.encode()
    assert [p.proposal_type for p in carried.proposals] == [6, P_PSK, P_APP_EPHEMERAL]
    res = members[1].process(commit, psks={psk_id: psk}, external_commit_policy=marmot_policy(psk_id))
    same_epoch([res.group, joiner])
    assert "priv" not in repr(pending) and pending.signature_priv.hex() not in repr(pending)
    # A proposal that would move the joining leaf (a resync Remove) is refused by finish: it belongs
    # to prepare, which then fixes the leaf where it will really land.
    resync = prepare_external_join(members[0].group_info(), b"member-0", capabilities=CAPS)
    with pytest.raises(ValidationError, match="change the joining leaf"):
        resync.finish([Remove(1)])
    resync = prepare_external_join(members[0].group_info(), b"member-0", capabilities=CAPS, remove_leaf=1)
    joiner, commit = resync.finish()
    assert joiner.own_leaf == 1 and joiner.own_leaf_node.encode() == resync.leaf_node.encode()
    assert members[0].process(commit).removed_self is False
    with pytest.raises(StateError):
        PendingExternalJoin.from_bytes(b"not state")


def test_unknown_extensions_and_proposals_survive_byte_exact():
    members = make_group(1)
    alice = members[0]
    ext = alice.context.extension(MARMOT_EXT)
    assert ext.extension_data == bytes(range(40))
    joiner, commit = external_join(alice.group_info(), b"dev", capabilities=CAPS)
    assert joiner.context.extension(MARMOT_EXT) == ext
    assert joiner.group_context_bytes() == alice.process(commit).group.group_context_bytes()
    # an unknown proposal type round-trips through a commit by reference
    alice2 = alice.process(commit).group
    alice2, msg = alice2.propose(UnknownProposal(0xF00D, b"opaque body"))
    parsed = MLSMessage.decode(msg).body.content.content
    assert parsed == UnknownProposal(0xF00D, b"opaque body")


def test_capabilities_required_by_the_group_are_enforced():
    alice = make_group(0)[0]
    lacking = create_key_package(b"old-client")  # advertises neither 0xf2ee nor AppEphemeral
    with pytest.raises(TreeError):
        alice.commit(add=[lacking.key_package])
    with pytest.raises(TreeError):
        external_join(alice.group_info(), b"old-client", capabilities=Capabilities())
    # left to itself, an external joiner advertises what the group requires
    joiner, _ = external_join(alice.group_info(), b"new-client")
    caps = joiner.own_leaf_node.capabilities
    assert MARMOT_EXT in caps.extensions and P_APP_EPHEMERAL in caps.proposals


def test_app_data_update_remove_and_updater():
    dictionary = encode_app_data_dictionary([(0x8001, b"one"), (0x8003, b"three")])
    alice = Group.create(b"g", b"alice", capabilities=CAPS,
                         extensions=(Extension(EXT_APP_DATA_DICTIONARY, dictionary),))
    kp = create_key_package(b"bob", capabilities=CAPS)
    out = alice.commit(add=[kp.key_package])
    alice, bob = out.group, join_from_welcome(out.welcome, kp)
    out = alice.commit(proposals=[AppDataUpdate(0x8001, 2)])
    bob = bob.process(out.message).group
    entries = decode_app_data_dictionary(bob.context.extension(EXT_APP_DATA_DICTIONARY).extension_data)
    assert entries == [(0x8003, b"three")]
    # an update op needs the application's rule; without it the commit is refused, with it applied
    out = out.group.commit(proposals=[AppDataUpdate(0x8003, 1, b"+x")],
                           app_data_updater=lambda cid, old, ups: old + b"".join(u for _, u in ups))
    with pytest.raises(MLSError):
        bob.process(out.message)
    bob = bob.process(out.message, app_data_updater=lambda cid, old, ups: old + b"".join(u for _, u in ups)).group
    assert bob.epoch_authenticator == out.group.epoch_authenticator


def test_invalid_messages_raise_typed_errors_and_change_nothing():
    alice, m1, m2 = make_group(2)
    out = m1.commit(remove=[m2.own_leaf])
    msg = out.message
    before = alice.to_bytes()
    with pytest.raises(DecodeError):
        alice.process(msg[:-1])  # truncated
    with pytest.raises(DecodeError):
        alice.process(msg + b"\x00")  # trailing byte
    with pytest.raises(DecodeError):
        # non-minimal length: group_id's 1-byte prefix rewritten as a 2-byte one
        alice.process(msg[:4] + b"\x40" + msg[4:])
    tampered = bytearray(msg)
    tampered[-40] ^= 1  # inside the signature or tags
    with pytest.raises((SignatureError, MembershipTagError, ConfirmationTagError, DecodeError)):
        alice.process(bytes(tampered))
    # a commit whose confirmation tag is wrong: re-sign nothing, flip the tag before the membership tag
    pm = MLSMessage.decode(msg).body
    from appliance.marmot.mls.framing import protect_public
    from appliance.marmot.mls.structs import FramedContentAuthData
    bad_auth = FramedContentAuthData(pm.auth.signature, bytes(32))
    forged = MLSMessage(1, protect_public(pm.content, bad_auth, m1.context, m1.secrets.membership_key)).encode()
    with pytest.raises(ConfirmationTagError):
        alice.process(forged)
    # wrong signature with a valid membership tag
    bad_sig = FramedContentAuthData(bytes(64), pm.auth.confirmation_tag)
    forged = MLSMessage(1, protect_public(pm.content, bad_sig, m1.context, m1.secrets.membership_key)).encode()
    with pytest.raises(SignatureError):
        alice.process(forged)
    assert alice.to_bytes() == before
    alice = alice.process(msg).group  # the genuine commit still applies
    with pytest.raises(EpochError):
        alice.process(msg)  # stale epoch now
    with pytest.raises(StateError):
        m1.process(msg)  # our own commit, seen by the state that made it


def test_proposal_rules():
    alice, m1, m2 = make_group(2)
    with pytest.raises(ProposalError):
        alice.commit(remove=[alice.own_leaf])
    with pytest.raises(ProposalError):
        alice.commit(remove=[m1.own_leaf, m1.own_leaf])
    with pytest.raises(ProposalError):
        alice.commit(remove=[9])
    with pytest.raises(ProposalError):
        alice.commit(proposals=[PreSharedKey(__import__("appliance.marmot.mls.structs", fromlist=["x"])
                                             .PreSharedKeyID.external(b"nope", bytes(32)))])
    # a Welcome for someone else
    kp = create_key_package(b"x", capabilities=CAPS)
    other = create_key_package(b"y", capabilities=CAPS)
    out = alice.commit(add=[kp.key_package])
    with pytest.raises(StateError):
        join_from_welcome(out.welcome, other)
    assert isinstance(Remove(1), Remove)
