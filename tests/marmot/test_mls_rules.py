"""RFC 9420 rules the engine must enforce on what others send: proposal lists (§12.2), leaf nodes
(§7.3), parent hashes (§7.9.2), tree validation on join (§12.4.3.1), key uniqueness in Commits and
External Commits (§12.4.2), and typed errors for bad public keys. Each case is built so that it
would pass without the rule it checks (a positive control sits next to each refusal)."""

from __future__ import annotations

import pytest

from appliance.marmot.mls import (
    AppEphemeral,
    Capabilities,
    Credential,
    DecodeError,
    Extension,
    ExternalCommitPolicy,
    Group,
    MLSError,
    ProposalError,
    TreeError,
    UnknownProposal,
    ValidationError,
    create_key_package,
    crypto,
    external_join,
    join_from_welcome,
)
from appliance.marmot.mls.group import _sign_leaf, external_pub_extension
from appliance.marmot.mls.structs import (
    EXT_RATCHET_TREE,
    MLS10,
    P_APP_EPHEMERAL,
    SRC_COMMIT,
    WF_GROUP_INFO,
    GroupContext,
    LeafNode,
    MLSMessage,
    ParentNode,
)
from appliance.marmot.mls.tree import RatchetTree

EPHEMERAL_CAPS = Capabilities(proposals=(P_APP_EPHEMERAL,))


def make_group(*capabilities):
    """Alice (with capabilities[0]) and one member per further entry, all joined by Welcome."""
    alice = Group.create(b"rules", b"alice", capabilities=capabilities[0])
    kps = [create_key_package(b"m%d" % i, capabilities=c) for i, c in enumerate(capabilities[1:])]
    out = alice.commit(add=[k.key_package for k in kps])
    return [out.group] + [join_from_welcome(out.welcome, k) for k in kps]


# -- §12.2: a non-default proposal type every remaining member must support ----------------------

def test_commit_with_a_proposal_type_some_member_does_not_support_is_refused():
    alice, bob, carol = make_group(EPHEMERAL_CAPS, EPHEMERAL_CAPS, None)  # carol lists no AppEphemeral
    eph = AppEphemeral(0x800A, b"proof")
    with pytest.raises(ProposalError):
        alice.commit(proposals=[eph])
    with pytest.raises(ProposalError):
        alice.commit(proposals=[UnknownProposal(0xF00D, b"x")])
    # the same Commit made by a committer that skips the rule: every receiver refuses it
    forged = _commit_without_support_check(alice, proposals=[eph])
    for member in (bob, carol):
        before = member.to_bytes()
        with pytest.raises(ProposalError):
            member.process(forged.message)
        assert member.to_bytes() == before
    # members being removed by the Commit need not support it (RFC 9420 §12.2)
    out = alice.commit(proposals=[eph], remove=[carol.own_leaf])
    assert bob.process(out.message).group.epoch_authenticator == out.group.epoch_authenticator
    # and neither do members being added
    alice, bob = make_group(EPHEMERAL_CAPS, EPHEMERAL_CAPS)
    newcomer = create_key_package(b"newcomer")
    out = alice.commit(proposals=[eph], add=[newcomer.key_package])
    assert bob.process(out.message).group.epoch_authenticator == out.group.epoch_authenticator
    assert join_from_welcome(out.welcome, newcomer).epoch_authenticator == out.group.epoch_authenticator


def test_external_commit_with_a_proposal_type_some_member_does_not_support_is_refused():
    alice, bob = make_group(EPHEMERAL_CAPS, None)
    policy = ExternalCommitPolicy(frozenset({P_APP_EPHEMERAL}))
    eph = AppEphemeral(0x800A, b"proof")
    import appliance.marmot.mls.group as engine
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "_check_proposal_support", lambda *a, **k: None, raising=False)
        _, commit = external_join(alice.group_info(), b"device", capabilities=EPHEMERAL_CAPS, proposals=[eph])
    with pytest.raises(ProposalError):
        bob.process(commit, external_commit_policy=policy)
    with pytest.raises(ProposalError):
        external_join(alice.group_info(), b"device", capabilities=EPHEMERAL_CAPS, proposals=[eph])
    # positive control: when every member supports it, the same External Commit goes through
    alice, bob = make_group(EPHEMERAL_CAPS, EPHEMERAL_CAPS)
    joiner, commit = external_join(alice.group_info(), b"device", capabilities=EPHEMERAL_CAPS, proposals=[eph])
    assert bob.process(commit, external_commit_policy=policy).group.epoch_authenticator == joiner.epoch_authenticator


def _commit_without_support_check(group, **kwargs):
    import appliance.marmot.mls.group as engine
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "_check_proposal_support", lambda *a, **k: None, raising=False)
        return group.commit(**kwargs)


# -- §7.3 / §12.4.2: keys stay unique across the tree ----------------------------------------------

def test_external_joiner_reusing_a_members_signature_key_is_refused():
    alice, bob, carol = make_group(None, None, None)  # no blank leaf: the joiner lands at the right edge
    with pytest.raises(TreeError):
        external_join(alice.group_info(), b"alice-again", alice.signature_priv)
    commit = _unchecked_external_join(alice.group_info(), b"alice-again", alice.signature_priv)
    before = bob.to_bytes()
    with pytest.raises(TreeError):
        bob.process(commit)
    assert bob.to_bytes() == before
    bob.process(external_join(alice.group_info(), b"someone-else")[1])  # positive control
    # a resync (the joiner removes its own old leaf) keeps its signature key legitimately
    joiner, commit = external_join(alice.group_info(), b"alice", alice.signature_priv, remove_leaf=alice.own_leaf)
    assert bob.process(commit).group.epoch_authenticator == joiner.epoch_authenticator


def test_external_joiner_reusing_a_members_encryption_key_is_refused():
    alice, bob = make_group(None, None)
    victim = alice.own_leaf_node.encryption_key
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(crypto, "hpke_keypair", lambda: (bytes(31) + b"\x01", victim))
        with pytest.raises(TreeError):
            external_join(alice.group_info(), b"device")
        commit = _unchecked_external_join(alice.group_info(), b"device")
    with pytest.raises(TreeError):
        bob.process(commit)


def _unchecked_external_join(group_info, identity, signature_priv=None):
    """An External Commit made by a joiner that skips its own leaf checks (as a hostile one would)."""
    import appliance.marmot.mls.group as engine
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "_check_leaf", lambda *a, **k: None)
        return external_join(group_info, identity, signature_priv)[1]


def test_commit_whose_leaf_key_repeats_a_path_key_is_refused():
    alice, bob, carol = make_group(None, None, None)
    derived = []
    real_derive, real_keypair = crypto.derive_keypair, crypto.hpke_keypair

    def remember(ikm):
        derived.append(real_derive(ikm))
        return derived[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(crypto, "derive_keypair", remember)
        mp.setattr(crypto, "hpke_keypair", lambda: derived[0] if derived else real_keypair())
        out = bob.commit()
    path = MLSMessage.decode(out.message).body.content.content.path
    assert path.leaf_node.encryption_key == path.nodes[0].encryption_key
    for member in (alice, carol):
        with pytest.raises(TreeError):
            member.process(out.message)


# -- §7.9.2 and §12.4.3.1: parent hashes and unmerged leaves of a tree we join ---------------------

def _leaf(identity: bytes, capabilities=None, extensions=(), credential=None):
    kp = create_key_package(identity, capabilities=capabilities, leaf_extensions=extensions)
    leaf = kp.key_package.leaf_node
    if credential is not None:
        leaf = _sign_leaf(LeafNode(leaf.encryption_key, leaf.signature_key, credential, leaf.capabilities,
                                   leaf.leaf_node_source, leaf.lifetime, b"", leaf.extensions),
                          kp.signature_priv)
    return leaf


def _crafted_tree(p3_unmerged, node1=None):
    """Four leaves: leaf 0 committed (its parent hash chains to node 1 or 3), leaves 1 and 2 added
    later, leaf 3 blank. Returns (tree, leaf 0's signature key)."""
    group_id = b"crafted"
    sig_priv, sig_pub = crypto.signature_keypair()
    base = LeafNode(crypto.hpke_keypair()[1], sig_pub, Credential.basic(b"committer"), Capabilities(), SRC_COMMIT)
    nodes = [base, node1, _leaf(b"one"), ParentNode(crypto.hpke_keypair()[1], b"", p3_unmerged), _leaf(b"two")]
    tree = RatchetTree.from_nodes(nodes)
    if node1 is not None:  # node 1 chains to node 3, leaf 0 to node 1
        tree.set_node(1, ParentNode(node1.encryption_key, tree.parent_hash(3, 5), node1.unmerged_leaves))
        ph = tree.parent_hash(1, 2)
    else:
        ph = tree.parent_hash(3, 5)
    leaf0 = _sign_leaf(LeafNode(base.encryption_key, sig_pub, base.credential, base.capabilities, SRC_COMMIT, None,
                                ph), sig_priv, group_id, 0)
    tree.set_node(0, leaf0)
    return tree, sig_priv


def _group_info_for(tree: RatchetTree, signer_priv: bytes, signer: int = 0, group_id: bytes = b"crafted") -> bytes:
    from appliance.marmot.mls.structs import GroupInfo
    context = GroupContext(MLS10, 1, group_id, 7, tree.tree_hash(), crypto.random_bytes(), ())
    exts = (Extension(EXT_RATCHET_TREE, tree.encode()), external_pub_extension(crypto.hpke_keypair()[1]))
    gi = GroupInfo(context, exts, crypto.random_bytes(), signer)
    gi = GroupInfo(context, exts, gi.confirmation_tag, signer,
                   crypto.sign_with_label(signer_priv, b"GroupInfoTBS", gi.tbs()))
    return MLSMessage(WF_GROUP_INFO, gi).encode()


def test_parent_hash_valid_only_if_unmerged_leaves_match_the_resolution():
    # node 1 blank: node 3's chain comes from leaf 0, so leaf 1 (beside it) must be unmerged at node 3
    good, priv = _crafted_tree((1, 2))
    good.verify_parent_hashes()
    external_join(_group_info_for(good, priv), b"joiner")  # positive control
    bad, priv = _crafted_tree((2,))
    with pytest.raises(TreeError):
        bad.verify_parent_hashes()
    with pytest.raises(TreeError):
        external_join(_group_info_for(bad, priv), b"joiner")


def test_unmerged_leaf_must_be_listed_by_every_non_blank_node_below():
    key = crypto.hpke_keypair()[1]
    good, priv = _crafted_tree((1, 2), node1=ParentNode(key, b"", (1,)))
    good.verify_parent_hashes()
    external_join(_group_info_for(good, priv), b"joiner")  # positive control
    bad, priv = _crafted_tree((1, 2), node1=ParentNode(key, b"", ()))
    with pytest.raises(TreeError):
        external_join(_group_info_for(bad, priv), b"joiner")


@pytest.mark.parametrize("case", ["extension not in capabilities", "no MLS 1.0", "no cipher suite 1",
                                  "credential type others lack"])
def test_tree_leaves_are_validated_on_join(case):
    alice = Group.create(b"crafted", b"alice")
    if case == "extension not in capabilities":
        leaf = _leaf(b"bad", extensions=[Extension(0xF0F0, b"")])
    elif case == "no MLS 1.0":
        leaf = _leaf(b"bad", capabilities=Capabilities(versions=(2,)))
    elif case == "no cipher suite 1":
        leaf = _leaf(b"bad", capabilities=Capabilities(cipher_suites=(3,)))
    else:
        leaf = _leaf(b"bad", capabilities=Capabilities(credentials=(1, 0xF000)), credential=Credential(0xF000, b"x"))
    tree = RatchetTree.from_nodes([alice.own_leaf_node, None, leaf])
    # the joiner itself supports everything the crafted leaf uses: only tree validation can refuse
    joiner_caps = Capabilities(credentials=(1, 0xF000))
    with pytest.raises(TreeError):
        external_join(_group_info_for(tree, alice.signature_priv), b"joiner", capabilities=joiner_caps)
    # positive control: the same tree with a well-formed second leaf
    ok = RatchetTree.from_nodes([alice.own_leaf_node, None, _leaf(b"fine")])
    external_join(_group_info_for(ok, alice.signature_priv), b"joiner")


# -- typed errors for public keys an X25519 exchange refuses ----------------------------------------

@pytest.mark.parametrize("pub", [bytes(32), b"\x01" + bytes(31)], ids=["zero", "low-order"])
def test_low_order_hpke_public_keys_raise_typed_errors(pub):
    alice = Group.create(b"g", b"alice")
    exts = [Extension(EXT_RATCHET_TREE, alice.tree.encode()), external_pub_extension(pub)]
    gi = MLSMessage(WF_GROUP_INFO, alice._signed_group_info(alice.context, exts, alice.confirmation_tag)).encode()
    with pytest.raises(MLSError):
        external_join(gi, b"joiner")
    with pytest.raises(MLSError):
        crypto.encrypt_with_label(pub, b"Welcome", b"", b"secret")


# -- §13.4: no list of extensions carries one type twice --------------------------------------------

DUPLICATES = (Extension(0xF0F0, b"a"), Extension(0xF0F0, b"b"))


def _raw_extensions(exts) -> bytes:
    from appliance.marmot.mls.codec import vl_list
    return vl_list(e.encode() for e in exts)


def test_extension_lists_with_a_repeated_type_are_refused():
    from appliance.marmot.mls.codec import u16, vl
    from appliance.marmot.mls.structs import GroupInfo, KeyPackage
    caps = Capabilities(extensions=(0xF0F0,))
    # built by us: refused before anything is signed or sent
    with pytest.raises(ValidationError):
        Group.create(b"g", b"alice", capabilities=caps, extensions=DUPLICATES)
    with pytest.raises(ValidationError):
        create_key_package(b"bob", extensions=DUPLICATES)
    alice = Group.create(b"g", b"alice", capabilities=caps)
    with pytest.raises(ValidationError):
        alice.group_info(extensions=DUPLICATES)
    # received: a signed KeyPackage whose extension list repeats a type does not decode
    kp = create_key_package(b"bob")
    leaf = kp.key_package.leaf_node
    tbs = u16(1) + u16(1) + vl(kp.key_package.init_key) + leaf.encode() + _raw_extensions(DUPLICATES)
    raw = tbs + vl(crypto.sign_with_label(kp.signature_priv, b"KeyPackageTBS", tbs))
    with pytest.raises(DecodeError):
        KeyPackage.decode(raw)
    with pytest.raises(DecodeError):
        alice.commit(add=[raw])
    # a GroupInfo with two external_pub extensions (which key would a joiner use?)
    gi = GroupInfo(alice.context, (), alice.confirmation_tag, 0)
    tbs = (alice.context.encode() + _raw_extensions([Extension(EXT_RATCHET_TREE, alice.tree.encode()),
                                                     external_pub_extension(alice.external_pub()),
                                                     external_pub_extension(crypto.hpke_keypair()[1])])
           + vl(gi.confirmation_tag) + bytes(4))
    raw = MLSMessage(WF_GROUP_INFO, gi).encode()[:4] + tbs + vl(
        crypto.sign_with_label(alice.signature_priv, b"GroupInfoTBS", tbs))
    with pytest.raises(DecodeError):
        external_join(raw, b"joiner")
    # positive control: the same GroupInfo with one external_pub joins
    external_join(alice.group_info(), b"joiner")


def test_reprs_carry_no_secret_material():
    kps = create_key_package(b"bob")
    alice = Group.create(b"g", b"alice")
    out = alice.commit(add=[kps.key_package])
    bob = join_from_welcome(out.welcome, kps)
    secrets = [kps.init_priv, kps.encryption_priv, kps.signature_priv, bob.signature_priv,
               *bob.secrets.to_list(), *bob.privs.values()]
    text = " ".join(repr(x) for x in (kps, bob, bob.secrets, out))
    for secret in secrets:
        assert secret.hex() not in text and repr(secret) not in text


def test_reinit_to_an_older_protocol_version_is_refused():
    from appliance.marmot.mls.structs import ReInit
    alice, bob = make_group(None, None)
    with pytest.raises(ProposalError):
        alice.commit(proposals=[ReInit(b"next", 0, 1)])  # §12.1.5: version below the group's (1)
    bob, proposal = bob.propose(ReInit(b"next", 0, 1))
    with pytest.raises(ProposalError):
        alice.process(proposal)
    # positive control: a ReInit to the same version ends the group for everyone
    out = alice.commit(proposals=[ReInit(b"next", 1, 1)])
    assert not bob.process(out.message).group.active


# -- §12.1: a proposal that can never be valid is refused when it arrives ----------------------------

def _bad_proposals(good_kp):
    from appliance.marmot.mls.structs import Add, KeyPackage, PreSharedKey, PreSharedKeyID, Remove
    forged = KeyPackage(good_kp.version, good_kp.cipher_suite, good_kp.init_key, good_kp.leaf_node,
                        good_kp.extensions, bytes(64))
    return {"Add with a bad KeyPackage signature": Add(forged),
            "Remove of a blank leaf": Remove(7),
            "PreSharedKey with a short nonce": PreSharedKey(PreSharedKeyID.external(b"id", b"nonce"))}


@pytest.mark.parametrize("case", list(_bad_proposals(create_key_package(b"x").key_package)))
def test_invalid_proposals_are_refused_on_receipt_and_never_block_a_commit(case):
    from appliance.marmot.mls.structs import Add
    alice, bob = make_group(None, None)
    good = create_key_package(b"carol").key_package
    bob, message = bob.propose(_bad_proposals(good)[case])
    before = alice.to_bytes()
    with pytest.raises(MLSError):
        alice.process(message)
    assert alice.to_bytes() == before
    # positive control: a valid proposal is kept and committed by a default commit()
    bob, message = bob.propose(Add(good))
    out = alice.process(message).group.commit()
    assert [type(p).__name__ for p in out.proposals] == ["Add"]


def test_a_default_commit_leaves_out_pending_proposals_that_conflict():
    """§12.2: the committer builds a valid list from what several members proposed."""
    from appliance.marmot.mls.structs import Remove
    alice, bob, carol, dave, erin = make_group(None, None, None, None, None)

    def commit_after(messages, expected):
        a, b = alice, erin  # erin proposes nothing and checks the result
        for m in messages:
            a, b = a.process(m).group, b.process(m).group
        out = a.commit()
        assert [(type(p).__name__, getattr(p, "removed", None)) for p in out.proposals] == expected
        assert b.process(out.message).group.epoch_authenticator == out.group.epoch_authenticator

    commit_after([bob.propose(Remove(dave.own_leaf))[1], carol.propose(Remove(dave.own_leaf))[1]],
                 [("Remove", dave.own_leaf)])
    commit_after([bob.propose(Remove(alice.own_leaf))[1]], [])  # the committer does not remove itself
    commit_after([dave.propose_update()[1], carol.propose(Remove(dave.own_leaf))[1]], [("Remove", dave.own_leaf)])
    first, second = dave.propose_update()[1], dave.propose_update()[1]
    a = alice.process(first).group.process(second).group
    out = a.commit()
    assert len(out.proposals) == 1 and out.proposals[0] == MLSMessage.decode(second).body.content.content


# -- SelfRemove (draft-ietf-mls-extensions, 0x000a): an empty body; another member commits it ----------

def test_self_remove_is_committed_by_another_member_by_reference():
    from appliance.marmot.mls import SelfRemove
    from appliance.marmot.mls.structs import P_SELF_REMOVE, WF_PRIVATE_MESSAGE, decode_proposal, encode_proposal

    caps = Capabilities(proposals=(P_SELF_REMOVE,))
    assert encode_proposal(SelfRemove()) == b"\x00\x0a" and decode_proposal(b"\x00\x0a") == SelfRemove()
    with pytest.raises(DecodeError):
        decode_proposal(b"\x00\x0a\x00")  # no body: a trailing byte is not part of it
    alice, bob, carol = make_group(caps, caps, caps)
    with pytest.raises(ProposalError):  # a PublicMessage only
        carol.propose(SelfRemove(), wire_format=WF_PRIVATE_MESSAGE)
    carol2, message = carol.propose(SelfRemove())
    # Nobody commits its own departure: a default commit leaves it out, naming it is refused.
    assert P_SELF_REMOVE not in [p.proposal_type for p in carol2.commit().proposals]
    with pytest.raises(ProposalError):
        carol2.commit(by_reference=list(carol2.pending))
    with pytest.raises(ProposalError):  # never inline
        alice.commit(proposals=[SelfRemove()])
    alice = alice.process(message).group
    bob = bob.process(message).group
    out = alice.commit()
    assert P_SELF_REMOVE in [p.proposal_type for p in out.proposals]
    got = bob.process(out.message)
    assert len(got.group.members()) == 2 and got.group.epoch_authenticator == out.group.epoch_authenticator
    assert carol2.process(out.message).removed_self
