"""The draft multi-device join: join PSK bytes, the signaling gate, the admin's kind 452 authorization,
the External Commit built in two phases, and one negative test per validation rule (each its own
error class, checked on every existing member, with nothing applied)."""

from __future__ import annotations

import hashlib

import pytest

from appliance.marmot import components as comp
from appliance.marmot import errors as E
from appliance.marmot import mls, multidevice as md, profile, proofs
from appliance.marmot.device import Device
from appliance.marmot.mls.structs import AppEphemeral, MLSMessage
from appliance.nostr.keys import generate_secret, public_key

RELAYS = ["ws://127.0.0.1:7777"]


def test_join_psk_id_bytes():
    gc = b"any GroupContext bytes"
    psk_id = md.join_psk_id(gc)
    assert psk_id[0] == 0x1F and psk_id[1:32] == b"marmot.multi-device.join-psk.v1"
    assert psk_id[32:] == hashlib.sha256(gc).digest() and len(psk_id) == 64


class World:
    """Alice (admin, device 1), Bob (member), and Alice's second device, in one multi-device group."""

    def __init__(self, multi_device=True, admins_extra=()):
        self.alice, self.bob = Device(generate_secret()), Device(generate_secret())
        self.alice2_secret = self.alice.secret
        kp = self.bob.new_key_package(RELAYS, draft=multi_device)
        self.gid, rumors = self.alice.create_group("g", RELAYS, [kp], multi_device=multi_device,
                                                   admins=list(admins_extra))
        self.bob.join(rumors[0])

    def parent(self) -> mls.Group:
        return self.alice.group(self.gid)

    def pending(self):
        g = self.parent()
        _, psk = md.join_psk(g)
        return md.prepare_external_join(self.alice.secret, g.group_info(), psk, group_event_key=md.group_event_key(g))

    def members(self):
        return [self.alice.group(self.gid), self.bob.group(self.gid)]


def test_full_join_every_member_agrees():
    w = World()
    pending, leaf = w.pending()
    # The admin authorizes this exact leaf over this exact parent context (kind 452).
    proof = md.authorize_join(w.alice.secret, pending.candidate_context(), leaf.encode())
    new, message = md.finish_external_join(pending, w.alice.secret, proof)
    results = [md.process_external_commit(g, message) for g in w.members()]
    assert {r.group.epoch_authenticator for r in results} == {new.epoch_authenticator}
    assert all(r.kind == "commit" and r.epoch == 2 for r in results)
    accounts = sorted(m.identity.hex() for m in results[0].group.members())
    assert accounts == sorted([w.alice.account, w.alice.account, w.bob.account])
    assert md.group_event_key(new) == md.group_event_key(results[1].group)
    # The new leaf carries a valid 0x8009 proof for the same account.
    assert profile.account_of_leaf(new.own_leaf_node).hex() == w.alice.account


def test_the_same_pending_join_rebuilds_the_same_leaf():
    """The prepared leaf is the one the Commit carries, also after a trip through the state bytes."""
    w = World()
    pending, leaf = w.pending()
    again = md.PendingJoin.from_bytes(pending.to_bytes())
    assert again.leaf.encode() == leaf.encode()
    proof = md.authorize_join(w.alice.secret, again.candidate_context(), again.leaf)
    _, message = md.finish_external_join(again, w.alice.secret, proof)
    assert MLSMessage.decode(message).body.content.content.path.leaf_node.encode() == leaf.encode()
    assert all(md.process_external_commit(g, message).epoch == 2 for g in w.members())


def test_only_an_admin_may_authorize():
    w = World()
    pending, leaf = w.pending()
    with pytest.raises(E.SignerNotAdmin):
        md.authorize_join(w.bob.secret, pending.candidate_context(), leaf)


def _expect(w: World, message: bytes, error: type) -> None:
    for g in w.members():
        before = g.to_bytes()
        with pytest.raises(error):
            md.process_external_commit(g, message)
        assert g.to_bytes() == before  # nothing applied


def _prepare(w: World, *, secret=None, psks=None, remove_leaf=None, extensions=None) -> md.PendingJoin:
    """A new device's pending join through the MLS core's public two-step API, with knobs a hostile
    or buggy device could turn: its PSKs (`psks(join_psk_id, join_psk)`), a resync Remove, its leaf
    extensions (`extensions(signature_public_key)`)."""
    g = w.parent()
    secret = secret or w.alice.secret
    psk_id, psk = md.join_psk(g)
    sig_priv, sig_pub = mls.crypto.signature_keypair()
    exts = extensions(sig_pub) if extensions else profile.leaf_extensions(secret, sig_pub, draft=True)
    join = mls.prepare_external_join(g.group_info(), profile.credential_of(secret), sig_priv,
                                     capabilities=profile.leaf_capabilities(draft=True), leaf_extensions=exts,
                                     external_psks=psks(psk_id, psk) if psks else {psk_id: psk},
                                     remove_leaf=remove_leaf)
    return md.PendingJoin(join, md.group_event_key(g))


def _build(w: World, *, proof_by=None, proof_for=None, proposals=None, authenticated_data=b"", leaf_ctx=None,
           **prepare):
    pending = _prepare(w, **prepare)
    signer = proof_by or w.alice.secret
    ctx = leaf_ctx or pending.candidate_context()
    binding = md.join_binding(ctx, proof_for or pending.leaf)
    proof = proofs.sign_proof(binding, signer).encode()
    extra = proposals(proof) if proposals is not None else [AppEphemeral(comp.MULTI_DEVICE_JOIN_AUTHORIZATION, proof)]
    _, message = pending.join.finish(extra, authenticated_data=authenticated_data)
    return message


def test_rule_missing_gate():
    """A group without the multi-device gate (whose leaves do not even support AppEphemeral, so the
    MLS core will not build the Commit for us: a hostile device skips that check)."""
    import appliance.marmot.mls.group as engine

    w = World(multi_device=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "_check_proposal_support", lambda *a: None)
        message = _build(w)
    _expect(w, message, E.SignalingGateInactive)


def test_rule_wrong_psk_id():
    w = World()
    message = _build(w, psks=lambda psk_id, psk: {b"\x1f" + b"x" * 63: psk})
    _expect(w, message, E.JoinPskInvalid)


def test_rule_two_psks():
    w = World()
    message = _build(w, psks=lambda psk_id, psk: {psk_id: psk, b"another external psk": psk})
    _expect(w, message, E.JoinPskInvalid)


def test_rule_missing_psk():
    w = World()
    _expect(w, _build(w, psks=lambda psk_id, psk: {}), E.JoinPskInvalid)


def test_rule_wrong_psk_value():
    w = World()
    message = _build(w, psks=lambda psk_id, psk: {psk_id: b"\x00" * 32})
    _expect(w, message, E.ExternalCommitMlsInvalid)


def test_rule_stale_epoch():
    w = World()
    pending, leaf = w.pending()
    proof = md.authorize_join(w.alice.secret, pending.candidate_context(), leaf)
    _, message = md.finish_external_join(pending, w.alice.secret, proof)
    # The group moves on (Bob updates his leaf) before the External Commit arrives.
    ev, _ = w.bob.commit(w.gid)
    w.alice.receive(ev)
    _expect(w, message, E.StaleEpoch)


def test_rule_extra_proposal():
    w = World()
    message = _build(w, remove_leaf=0)  # an RFC resync of Alice's first device
    _expect(w, message, E.ExtraProposal)


def test_rule_non_admin_signer():
    w = World()
    _expect(w, _build(w, proof_by=w.bob.secret), E.SignerNotAdmin)


def test_rule_same_account_non_admin_device_cannot_authorize():
    """Bob's second device: Bob is a member but not an admin, so his own proof cannot authorize it."""
    w = World()
    g = w.parent()
    _, psk = md.join_psk(g)
    pending, leaf = md.prepare_external_join(w.bob.secret, g.group_info(), psk)
    proof = proofs.sign_proof(md.join_binding(pending.candidate_context(), leaf), w.bob.secret)
    _, message = md.finish_external_join(pending, w.bob.secret, proof)
    _expect(w, message, E.SignerNotAdmin)


def test_rule_proof_bound_to_another_leaf():
    w = World()
    other_pending, other_leaf = w.pending()
    _expect(w, _build(w, proof_for=other_leaf), E.AuthorizationBindingMismatch)


def test_rule_proof_bound_to_another_group_context():
    w = World()
    old_ctx = w.parent().context
    ev, _ = w.bob.commit(w.gid)
    w.alice.receive(ev)
    _expect(w, _build(w, leaf_ctx=old_ctx), E.AuthorizationBindingMismatch)


def test_rule_duplicated_app_ephemeral():
    w = World()
    message = _build(w, proposals=lambda proof: [AppEphemeral(0x800A, proof), AppEphemeral(0x800A, proof)])
    _expect(w, message, E.AuthorizationDuplicated)


def test_rule_missing_app_ephemeral():
    w = World()
    _expect(w, _build(w, proposals=lambda proof: []), E.AuthorizationMissing)


def test_rule_wrong_component_id():
    w = World()
    _expect(w, _build(w, proposals=lambda proof: [AppEphemeral(0x8009, proof)]),
            E.AuthorizationWrongComponent)


def test_rule_invalid_proof_data():
    w = World()
    _expect(w, _build(w, proposals=lambda proof: [AppEphemeral(0x800A, proof[:-1])]),
            E.AuthorizationInvalid)


def test_rule_authenticated_data_misuse():
    w = World()
    pending = _prepare(w)
    proof = md.authorize_join(w.alice.secret, pending.candidate_context(), pending.leaf).encode()
    _, message = pending.join.finish([AppEphemeral(0x800A, proof)], authenticated_data=proof)
    _expect(w, message, E.AuthenticatedDataMisuse)


def test_rule_unknown_account():
    w = World()
    stranger = generate_secret()
    g = w.parent()
    _, psk = md.join_psk(g)
    pending, leaf = md.prepare_external_join(stranger, g.group_info(), psk)
    proof = md.authorize_join(w.alice.secret, pending.candidate_context(), leaf)
    _, message = md.finish_external_join(pending, stranger, proof)
    _expect(w, message, E.UnknownJoiningAccount)


def test_rule_joining_leaf_without_valid_account_proof():
    w = World()
    # A leaf whose 0x8009 proof was made by another account than its credential's.
    pending = _prepare(w, extensions=lambda sig_pub: profile.leaf_extensions(generate_secret(), sig_pub, draft=True))
    proof = md.authorize_join(w.alice.secret, pending.candidate_context(), pending.leaf)
    _, message = md.finish_external_join(pending, w.alice.secret, proof)
    _expect(w, message, E.JoiningLeafProofInvalid)


def test_external_commits_refused_without_the_draft_switch():
    w = World()
    pending, leaf = w.pending()
    proof = md.authorize_join(w.alice.secret, pending.candidate_context(), leaf)
    ev = Device(w.alice.secret).finish_external_join(pending, proof.encode())
    with pytest.raises(E.MarmotError) as e:
        w.bob.receive(ev)
    assert e.value.code == "draft.disabled"
    assert w.bob.receive(ev, draft=True).external_join


def test_gate_names_the_missing_piece():
    w = World()
    g = w.parent()
    md.check_signaling_gate(g.context, list(g.tree.leaves()))
    from appliance.marmot.mls.structs import Capabilities, LeafNode

    _, leaf = next(iter(g.tree.leaves()))
    weak = LeafNode(leaf.encryption_key, leaf.signature_key, leaf.credential,
                    Capabilities(extensions=(comp.APP_DATA_DICTIONARY,), proposals=(comp.APP_EPHEMERAL,)),
                    leaf.leaf_node_source, leaf.lifetime, leaf.parent_hash, leaf.extensions, leaf.signature)
    with pytest.raises(E.SignalingGateInactive, match="0xf2f0"):
        md.check_signaling_gate(g.context, [(0, weak)])
    assert public_key(w.alice.secret) == w.alice.account


def test_bench_marmot_join_runs(capsys):
    from appliance.cli import main

    assert main(["bench", "marmot-join", "--members", "3", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "build External Commit" in out and "process External Commit" in out


def test_only_admins_add_members_and_only_admins_welcome():
    """admin-policy-v1: a non-admin's Add is refused by the other members, and the welcome it sends is
    refused by the invitee (joining.md step 8)."""
    w = World()
    dave = Device(generate_secret())
    ev, rumors = w.bob.commit(w.gid, add=[dave.new_key_package(RELAYS, draft=True)])
    with pytest.raises(E.MarmotError) as e:
        w.alice.receive(ev)
    assert e.value.code == "commit.not_admin"
    with pytest.raises(E.MarmotError) as e:
        dave.join(rumors[0])
    assert e.value.code == "welcome.not_admin"
    # The admin's own Add goes through for everyone (Bob applied his refused commit: a fresh group).
    w = World()
    ev, rumors = w.alice.commit(w.gid, add=[dave.new_key_package(RELAYS, draft=True)])
    assert w.bob.receive(ev).type == "commit"
    assert dave.join(rumors[0]) == w.gid


def test_key_package_lifetime_rules():
    """key-packages.md: a Lifetime, current, at most 7,261,200 s; ours are exactly that long."""
    from appliance.marmot.mls.structs import Lifetime

    kps = profile.create_key_package(generate_secret())
    lt = kps.key_package.leaf_node.lifetime
    assert lt.not_after - lt.not_before == 7_261_200
    profile.check_lifetime(kps.key_package.leaf_node)
    leaf = kps.key_package.leaf_node
    for bad in (Lifetime(lt.not_before, lt.not_before + 7_261_201), Lifetime(0, 1)):
        odd = type(leaf)(leaf.encryption_key, leaf.signature_key, leaf.credential, leaf.capabilities,
                         leaf.leaf_node_source, bad, leaf.parent_hash, leaf.extensions, leaf.signature)
        with pytest.raises(E.ComponentError):
            profile.check_lifetime(odd)


def test_join_authorization_outside_an_external_commit_is_refused():
    """multi-device-join-authorization-v1: standalone, or in a member's Commit, 0x800a is invalid."""
    from appliance.marmot import transport as tp

    w = World()
    g = w.bob.group(w.gid)
    proof = b"\x00" * 104
    g2, message = g.propose(AppEphemeral(0x800A, proof))
    ev = tp.encrypt_group_message(md.group_event_key(g), bytes.fromhex(w.bob.groups[w.gid]["h"]), message)
    before = w.alice.groups[w.gid]["state"]
    with pytest.raises(E.MarmotError) as e:
        w.alice.receive(ev)
    assert e.value.code == "multi_device.authorization_misplaced" and w.alice.groups[w.gid]["state"] == before
    out = g.commit(proposals=[AppEphemeral(0x800A, proof)])
    ev = tp.encrypt_group_message(md.group_event_key(g), bytes.fromhex(w.bob.groups[w.gid]["h"]), out.message)
    with pytest.raises(E.MarmotError) as e:
        w.alice.receive(ev)
    assert e.value.code == "multi_device.authorization_misplaced"


def test_members_refuse_leaves_without_a_valid_identity_proof():
    """account-identity-proof-v2: a Commit that adds a leaf without a 0x8009 proof is refused."""
    from appliance.marmot import transport as tp

    w = World()
    bare = mls.create_key_package(bytes.fromhex(public_key(generate_secret())),
                                  capabilities=profile.leaf_capabilities(draft=True), lifetime=profile.lifetime())
    g = w.alice.group(w.gid)
    out = g.commit(add=[bare.key_package])
    ev = tp.encrypt_group_message(md.group_event_key(g), bytes.fromhex(w.alice.groups[w.gid]["h"]), out.message)
    with pytest.raises(E.MarmotError) as e:
        w.bob.receive(ev)
    assert e.value.code.startswith("proof.")
    # And our own tooling never builds such a Commit.
    with pytest.raises(E.MarmotError):
        w.alice._member_key_package(profile.key_package_event(generate_secret(), bare, RELAYS))


def test_group_context_locations():
    w = World()
    ctx = w.parent().context
    profile.check_group_context(ctx)
    from appliance.marmot.mls.structs import Extension, GroupContext

    data = profile.app_data(ctx.extensions)
    bad = dict(data)
    bad[comp.MULTI_DEVICE_JOIN_AUTHORIZATION] = b"\x00" * 104
    exts = tuple(e if e.extension_type != comp.APP_DATA_DICTIONARY else
                 Extension(comp.APP_DATA_DICTIONARY, mls.encode_app_data_dictionary(bad.items()))
                 for e in ctx.extensions)
    with pytest.raises(E.ComponentError) as e:
        profile.check_group_context(GroupContext(ctx.version, ctx.cipher_suite, ctx.group_id, ctx.epoch,
                                                 ctx.tree_hash, ctx.confirmed_transcript_hash, exts))
    assert e.value.code == "component.invalid_location"


def test_multidevice_uses_only_the_mls_cores_public_api():
    """The External Commit comes from the core's public two-step API (prepare, then finish), never
    from the core's private building blocks."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(md))
    private = [f"{node.module}.{a.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("mls") for a in node.names if a.name.startswith("_")]
    private += [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert private == []


def _reframe(w: World, message: bytes, pending: md.PendingJoin, proposals) -> bytes:
    """The same External Commit with another proposal list, re-signed by the joiner (what a hostile
    device can send: the signature verifies, the confirmation tag no longer matters to the rules)."""
    from appliance.marmot.mls.framing import sign_content
    from appliance.marmot.mls.structs import (WF_PUBLIC_MESSAGE, Commit, FramedContent, FramedContentAuthData,
                                              PublicMessage)

    pm = MLSMessage.decode(message).body
    c = pm.content
    content = FramedContent(c.group_id, c.epoch, c.sender, c.authenticated_data, c.content_type,
                            Commit(tuple(proposals(list(c.content.proposals))), c.content.path))
    signature = sign_content(WF_PUBLIC_MESSAGE, content, pending.candidate_context(), pending.join.signature_priv)
    auth = FramedContentAuthData(signature, pm.auth.confirmation_tag)
    return MLSMessage(WF_PUBLIC_MESSAGE, PublicMessage(content, auth, None)).encode()


def _authorized(w: World, pending: md.PendingJoin) -> bytes:
    proof = md.authorize_join(w.alice.secret, pending.candidate_context(), pending.leaf)
    return md.finish_external_join(pending, w.alice.secret, proof)[1]


def test_rule_external_init_missing():
    w = World()
    pending = _prepare(w)
    message = _reframe(w, _authorized(w, pending), pending, lambda ps: [p for p in ps if p.proposal_type != 6])
    _expect(w, message, E.ExternalInitMissing)


def test_rule_second_external_init_is_an_extra_proposal():
    w = World()
    pending = _prepare(w)
    message = _reframe(w, _authorized(w, pending), pending, lambda ps: [ps[0], *ps])
    _expect(w, message, E.ExtraProposal)


@pytest.mark.parametrize("missing", ["extension", "extension_version", "required_extension", "required_proposal",
                                     "required_component", "leaf_extension", "leaf_proposal", "leaf_component"])
def test_signaling_gate_every_condition(missing):
    """marmot-multi-device.md, Signaling gate: each of its conditions alone turns the gate off."""
    from appliance.marmot.mls.structs import Capabilities, Extension, GroupContext, LeafNode

    w = World()
    ctx = w.parent().context
    leaves = list(w.parent().tree.leaves())
    md.check_signaling_gate(ctx, leaves)
    exts = list(ctx.extensions)

    def replace(ext_type, data):
        return [Extension(ext_type, data) if e.extension_type == ext_type else e for e in exts]

    req = mls.RequiredCapabilities.decode(ctx.extension(0x0003).extension_data)
    data = profile.app_data(ctx.extensions)
    required = profile.decode_components_list(data[comp.APP_COMPONENTS])
    if missing == "extension":
        exts = [e for e in exts if e.extension_type != 0xF2F0]
    elif missing == "extension_version":
        exts = replace(0xF2F0, b"\x00\x02")
    elif missing == "required_extension":
        exts = replace(0x0003, mls.RequiredCapabilities(tuple(t for t in req.extension_types if t != 0xF2F0),
                                                        req.proposal_types).encode())
    elif missing == "required_proposal":
        exts = replace(0x0003, mls.RequiredCapabilities(req.extension_types,
                                                        tuple(t for t in req.proposal_types if t != 9)).encode())
    elif missing == "required_component":
        data[comp.APP_COMPONENTS] = profile.encode_components_list([c for c in required if c != 0x800A])
        exts = replace(comp.APP_DATA_DICTIONARY, mls.encode_app_data_dictionary(data.items()))
    index, leaf = leaves[1]
    caps, leaf_exts = leaf.capabilities, leaf.extensions
    if missing == "leaf_extension":
        caps = Capabilities(extensions=tuple(t for t in caps.extensions if t != 0xF2F0), proposals=caps.proposals)
    elif missing == "leaf_proposal":
        caps = Capabilities(extensions=caps.extensions, proposals=tuple(t for t in caps.proposals if t != 9))
    elif missing == "leaf_component":
        ld = profile.app_data(leaf.extensions)
        ld[comp.APP_COMPONENTS] = profile.encode_components_list(
            [c for c in profile.decode_components_list(ld[comp.APP_COMPONENTS]) if c != 0x800A])
        leaf_exts = tuple(Extension(e.extension_type, mls.encode_app_data_dictionary(ld.items()))
                          if e.extension_type == comp.APP_DATA_DICTIONARY else e for e in leaf.extensions)
    leaves[1] = (index, LeafNode(leaf.encryption_key, leaf.signature_key, leaf.credential, caps,
                                 leaf.leaf_node_source, leaf.lifetime, leaf.parent_hash, leaf_exts, leaf.signature))
    context = GroupContext(ctx.version, ctx.cipher_suite, ctx.group_id, ctx.epoch, ctx.tree_hash,
                           ctx.confirmed_transcript_hash, tuple(exts))
    with pytest.raises(E.SignalingGateInactive):
        md.check_signaling_gate(context, leaves)


def _leaf_extensions_supporting(secret: str, components):
    """A leaf dictionary with a valid 0x8009 proof but only `components` in its app_components."""
    from appliance.marmot.mls.structs import Extension

    def build(sig_pub):
        proof = proofs.sign_proof(proofs.AccountIdentityBinding(1, 0x0807, sig_pub), secret)
        return (Extension(comp.APP_DATA_DICTIONARY, mls.encode_app_data_dictionary([
            (comp.APP_COMPONENTS, profile.encode_components_list(components)),
            (comp.ACCOUNT_IDENTITY_PROOF, proof.encode())])),)
    return build


@pytest.mark.parametrize("lacking", [0x800A, 0x8003])
def test_joining_leaf_must_support_every_required_component(lacking):
    """app-components/README.md: a member that does not support every required component id MUST NOT
    join. A new device lacking 0x800a would also switch the gate off for every later device."""
    w = World()
    supported = [c for c in profile.leaf_components(draft=True) if c != lacking]
    pending = _prepare(w, extensions=_leaf_extensions_supporting(w.alice.secret, supported))
    _expect(w, _authorized(w, pending), E.ExternalCommitMlsInvalid)


def test_an_admin_without_a_leaf_is_not_an_active_admin():
    """Carol stays in the admin policy after her only leaf was removed: she is no active admin of that
    state, so her kind 452 proof authorizes nothing (fail-closed reading of "active administrator
    account in the candidate parent state", spec note M22)."""
    carol = Device(generate_secret())
    w = World(admins_extra=[carol.account])
    ev, rumors = w.alice.commit(w.gid, add=[carol.new_key_package(RELAYS, draft=True)])
    w.bob.receive(ev)
    carol.join(rumors[0])
    # Carol, still a member, may authorize a join (positive control)...
    pending = _prepare(w)
    proof = md.authorize_join(carol.secret, pending.candidate_context(), pending.leaf)
    message = md.finish_external_join(pending, w.alice.secret, proof)[1]
    assert md.process_external_commit(w.bob.group(w.gid), message).epoch == w.parent().epoch + 1
    # ...until Alice removes her leaf (the admin policy still lists her).
    ev, _ = w.alice.commit(w.gid, remove=[carol.account])
    w.bob.receive(ev)
    assert bytes.fromhex(carol.account) in profile.read_group_state(w.parent().context).admins
    pending = _prepare(w)
    proof = proofs.sign_proof(md.join_binding(pending.candidate_context(), pending.leaf), carol.secret)
    _expect(w, md.finish_external_join(pending, w.alice.secret, proof)[1], E.SignerNotAdmin)


def test_members_refuse_an_added_leaf_that_lacks_a_required_component():
    """app-components/README.md, Negotiation: an invitee whose key package does not support every
    component the group requires may not be added; members refuse the Commit, nothing applied."""
    from appliance.marmot import transport as tp

    w = World()
    dave = generate_secret()
    sig_priv, sig_pub = mls.crypto.signature_keypair()
    exts = _leaf_extensions_supporting(dave, [comp.NOSTR_ROUTING, comp.ACCOUNT_IDENTITY_PROOF])(sig_pub)
    kps = mls.create_key_package(bytes.fromhex(public_key(dave)), sig_priv,
                                 capabilities=profile.leaf_capabilities(draft=True),
                                 lifetime=profile.lifetime(), leaf_extensions=exts)
    g = w.alice.group(w.gid)
    out = g.commit(add=[kps.key_package])
    ev = tp.encrypt_group_message(md.group_event_key(g), bytes.fromhex(w.alice.groups[w.gid]["h"]), out.message)
    before = w.bob.groups[w.gid]["state"]
    with pytest.raises(E.MarmotError) as e:
        w.bob.receive(ev)
    assert e.value.code == "component.unsupported" and w.bob.groups[w.gid]["state"] == before
    # Our own tooling never builds such a Commit either.
    with pytest.raises(E.MarmotError) as e:
        w.alice.commit(w.gid, add=[profile.key_package_event(dave, kps, RELAYS)])
    assert e.value.code == "component.unsupported"


def test_members_refuse_a_new_requirement_some_member_lacks():
    """A GroupContextExtensions that makes the group require a component a current member does not
    support is refused (identity.md: group state cannot be mutated into a state not all members support)."""
    from appliance.marmot import transport as tp
    from appliance.marmot.mls.structs import Extension

    w = World()
    g = w.alice.group(w.gid)
    data = profile.app_data(g.context.extensions)
    data[comp.APP_COMPONENTS] = profile.encode_components_list(profile.required_components(g.context) + [0x8001])
    exts = [Extension(e.extension_type, mls.encode_app_data_dictionary(data.items()))
            if e.extension_type == comp.APP_DATA_DICTIONARY else e for e in g.context.extensions]
    out = g.commit(group_context_extensions=exts)
    ev = tp.encrypt_group_message(md.group_event_key(g), bytes.fromhex(w.alice.groups[w.gid]["h"]), out.message)
    with pytest.raises(E.MarmotError) as e:
        w.bob.receive(ev)
    assert e.value.code == "component.unsupported"


def test_a_welcome_into_a_group_requiring_an_unsupported_component_is_refused():
    """joining.md, Failure behavior: the receiver rejects a Welcome when the group requires a capability
    this client does not support (here component 0x8001, which the appliance does not implement)."""
    import os

    from appliance.marmot import transport as tp
    from appliance.marmot.mls.structs import Extension

    alice, bob = Device(generate_secret()), Device(generate_secret())
    kp = bob.new_key_package(RELAYS)
    exts = profile.group_extensions(admins=[bytes.fromhex(alice.account)], nostr_group_id=os.urandom(32),
                                    relays=RELAYS, multi_device=False)
    data = profile.app_data(exts)
    data[comp.APP_COMPONENTS] = profile.encode_components_list([0x8001, *profile.decode_components_list(
        data[comp.APP_COMPONENTS])])
    exts = [Extension(e.extension_type, mls.encode_app_data_dictionary(data.items()))
            if e.extension_type == comp.APP_DATA_DICTIONARY else e for e in exts]
    sig_priv, sig_pub = mls.crypto.signature_keypair()
    creator = _leaf_extensions_supporting(alice.secret, [0x8001, *profile.SUPPORTED_COMPONENTS])(sig_pub)
    g = mls.Group.create(profile.new_group_id(), profile.credential_of(alice.secret), sig_priv,
                         capabilities=profile.leaf_capabilities(), lifetime=profile.lifetime(),
                         leaf_extensions=creator, extensions=exts)
    out = g.commit(add=[mls.parse_key_package(tp.parse_key_package_event(kp).key_package)])
    rumor = tp.build_welcome_rumor(alice.account, out.welcome, kp.id, RELAYS)
    with pytest.raises(E.MarmotError) as e:
        bob.join(rumor)
    assert e.value.code == "component.unsupported"
    assert bob.groups == {} and len(bob.key_packages) == 1  # nothing joined, the key package kept
