"""The draft multi-device join (marmot-multi-device.md): a new device of an existing account joins a
group by External Commit, authorized by an active admin's kind 452 proof and bound to the current
epoch by the join PSK. DRAFT: the bytes are not final; callers gate it behind the draft switch.

    join_psk_id = QUIC-vector("marmot.multi-device.join-psk.v1") || SHA-256(TLS(GroupContext))
    join_psk    = MLS-Exporter("marmot", join_psk_id, KDF.Nh)

Building an External Commit is two-phase, because the admin's proof binds the exact joining
LeafNode and travels inside the same Commit: `prepare_external_join` fixes the joining leaf with
the MLS core's `prepare_external_join` and returns it to be authorized; `finish_external_join`
adds the proof-carrying AppEphemeral and completes the Commit (`PendingExternalJoin.finish`).
Existing members validate with `external_commit_policy` (every rule of the draft's "External
Commit authorization" and "Validation" lists, each failure its own error class) and
`process_external_commit`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import cbor2

from appliance.nostr.keys import public_key

from . import components as comp
from . import mls, profile, proofs
from .errors import (
    AuthenticatedDataMisuse,
    AuthorizationBindingMismatch,
    AuthorizationDuplicated,
    AuthorizationInvalid,
    AuthorizationMissing,
    AuthorizationWrongComponent,
    ComponentError,
    ExternalCommitMlsInvalid,
    ExternalInitMissing,
    ExtraProposal,
    JoiningLeafProofInvalid,
    JoinPskInvalid,
    MarmotError,
    ProofError,
    SignalingGateInactive,
    SignerNotAdmin,
    StaleEpoch,
    UnknownJoiningAccount,
)
from .extensions import MultiDeviceExtension
from .mls import (
    AppEphemeral,
    ExternalCommitPolicy,
    ExternalCommitView,
    Group,
    GroupContext,
    LeafNode,
    MLSMessage,
    PendingExternalJoin,
    RequiredCapabilities,
    crypto,
    prepare_external_join as mls_prepare_external_join,
)
from .mls.structs import (
    EXT_REQUIRED_CAPABILITIES,
    P_APP_EPHEMERAL,
    P_EXTERNAL_INIT,
    P_PSK,
    PSK_EXTERNAL,
    WF_GROUP_INFO,
)
from .wire import quic_vector

__all__ = [
    "JOIN_PSK_LABEL",
    "join_psk_id",
    "join_psk",
    "group_event_key",
    "check_signaling_gate",
    "review_joining_leaf",
    "authorize_join",
    "PendingJoin",
    "prepare_external_join",
    "finish_external_join",
    "external_commit_policy",
    "process_external_commit",
]

JOIN_PSK_LABEL = b"marmot.multi-device.join-psk.v1"
assert len(JOIN_PSK_LABEL) == 31  # so its QUIC length prefix is the single byte 0x1f
EXPORTER_LABEL = b"marmot"


def join_psk_id(group_context: bytes) -> bytes:
    """`MarmotMultiDeviceJoinPskId` in the Marmot binary profile (label<V>, group_context_hash[32])."""
    return quic_vector(JOIN_PSK_LABEL) + hashlib.sha256(group_context).digest()


def join_psk(group: Group) -> tuple[bytes, bytes]:
    """(join_psk_id, join_psk) of the group's current epoch."""
    psk_id = join_psk_id(group.group_context_bytes())
    return psk_id, group.export_secret(EXPORTER_LABEL, psk_id, crypto.NH)


def group_event_key(group: Group) -> bytes:
    """MLS-Exporter("marmot", "group-event", 32): the epoch's kind 445 outer key."""
    return group.export_secret(EXPORTER_LABEL, b"group-event", 32)


# -- the signaling gate ---------------------------------------------------------------------------

def check_signaling_gate(context: GroupContext, leaves) -> None:
    """Raise SignalingGateInactive naming the first unmet requirement (marmot-multi-device.md, Signaling gate)."""
    ext = context.extension(comp.EXT_MULTI_DEVICE)
    if ext is None:
        raise SignalingGateInactive("GroupContext has no marmot.multi-device.v1 (0xf2f0) extension")
    try:
        MultiDeviceExtension.decode(ext.extension_data)
    except MarmotError as exc:
        raise SignalingGateInactive(f"marmot.multi-device.v1 is invalid: {exc}") from None
    req_ext = context.extension(EXT_REQUIRED_CAPABILITIES)
    try:
        req = RequiredCapabilities.decode(req_ext.extension_data) if req_ext else RequiredCapabilities()
    except mls.MLSError as exc:
        raise SignalingGateInactive(f"required_capabilities is malformed: {exc}") from None
    if comp.EXT_MULTI_DEVICE not in req.extension_types:
        raise SignalingGateInactive("required_capabilities does not require extension 0xf2f0")
    if comp.APP_EPHEMERAL not in req.proposal_types:
        raise SignalingGateInactive("required_capabilities does not require proposal type app_ephemeral (0x0009)")
    try:
        data = profile.app_data(context.extensions)
        required = profile.decode_components_list(data[comp.APP_COMPONENTS]) if comp.APP_COMPONENTS in data else []
    except (MarmotError, mls.MLSError) as exc:
        raise SignalingGateInactive(f"app_components is malformed: {exc}") from None
    if comp.MULTI_DEVICE_JOIN_AUTHORIZATION not in required:
        raise SignalingGateInactive("app_components does not require component 0x800a")
    for index, leaf in leaves:
        caps = leaf.capabilities
        if comp.EXT_MULTI_DEVICE not in caps.extensions:
            raise SignalingGateInactive(f"leaf {index} does not advertise extension 0xf2f0")
        if comp.APP_EPHEMERAL not in caps.proposals:
            raise SignalingGateInactive(f"leaf {index} does not advertise proposal type 0x0009")
        try:
            leaf_data = profile.app_data(leaf.extensions)
            supported = (profile.decode_components_list(leaf_data[comp.APP_COMPONENTS])
                         if comp.APP_COMPONENTS in leaf_data else [])
        except (MarmotError, mls.MLSError):
            supported = []
        if comp.MULTI_DEVICE_JOIN_AUTHORIZATION not in supported:
            raise SignalingGateInactive(f"leaf {index} does not advertise component 0x800a")


# -- admin authorization (kind 452) ---------------------------------------------------------------

def join_binding(candidate_context: GroupContext, joining_leaf: LeafNode) -> proofs.JoinAuthorizationBinding:
    account = joining_leaf.credential.identity
    if account is None or len(account) != 32:
        raise JoiningLeafProofInvalid("the joining leaf has no 32-byte basic credential identity")
    return proofs.JoinAuthorizationBinding.from_mls(
        group_context=candidate_context.encode(), group_id=candidate_context.group_id,
        epoch=candidate_context.epoch, ciphersuite=candidate_context.cipher_suite,
        signature_scheme=profile.SIGNATURE_SCHEME, joining_leaf=joining_leaf.encode(),
        joining_account=account, mls_signature_key=joining_leaf.signature_key)


def review_joining_leaf(admin: bytes, context: GroupContext, tree, leaf: LeafNode) -> bytes:
    """What an admin checks before signing a join authorization, in the order members check the
    External Commit (M16): the group's signaling gate; the joining leaf's 0x8009 proof; its account
    is a member's; the signer is an active admin (M22); the leaf supports every component, extension
    and proposal type the group requires; its signature verifies where it will land. Returns the
    joining account; raises the rule's error class, so nothing is signed."""
    check_signaling_gate(context, list(tree.leaves()))
    if leaf.leaf_node_source != 3:  # LeafNodeSource commit: an External Commit's UpdatePath leaf
        raise ExternalCommitMlsInvalid("the joining leaf is not a commit leaf (an UpdatePath LeafNode)")
    try:
        account = profile.account_of_leaf(leaf, context.cipher_suite)
    except (ProofError, MarmotError, mls.MLSError) as exc:
        raise JoiningLeafProofInvalid(f"the joining leaf's account identity proof (0x8009): {exc}") from None
    if not any(m.credential.identity == account for _, m in tree.leaves()):
        raise UnknownJoiningAccount("no existing member has the joining leaf's account identity "
                                    f"{account.hex()}: only a new device of a member's account may join this way")
    state = profile.read_group_state(context)
    if admin not in state.admins:
        raise SignerNotAdmin("this account is not an active admin of that group state")
    if not any(m.credential.identity == admin for _, m in tree.leaves()):
        raise SignerNotAdmin("this admin key has no member leaf in the group state, so it is not an active admin")
    profile.check_supports_required(profile.required_components(context), leaf, "the joining leaf")
    try:
        mls.check_leaf_supports(leaf, context.extensions, "the joining leaf")
        mls.verify_leaf_signature(leaf, context.group_id, mls.external_join_landing(tree))
    except mls.MLSError as exc:
        raise ExternalCommitMlsInvalid(f"the joining leaf is invalid: {exc}") from None
    return account


def authorize_join(admin_secret: str, candidate_context: bytes | GroupContext, joining_leaf: bytes | LeafNode, *,
                   created_at: int | None = None, tree=None) -> proofs.MarmotAuthorizationProof:
    """An admin's kind 452 proof for one exact leaf joining from one exact parent GroupContext. With
    the group's ratchet `tree`, the leaf is reviewed first (`review_joining_leaf`)."""
    context = candidate_context if isinstance(candidate_context, GroupContext) else GroupContext.decode(candidate_context)
    leaf = joining_leaf if isinstance(joining_leaf, LeafNode) else LeafNode.decode(joining_leaf)
    admin = bytes.fromhex(public_key(admin_secret))
    if tree is not None:
        review_joining_leaf(admin, context, tree, leaf)
    state = profile.read_group_state(context)
    if admin not in state.admins:
        raise SignerNotAdmin("this account is not an active admin of that group state")
    return proofs.sign_proof(join_binding(context, leaf), admin_secret, created_at)


# -- building the External Commit (the new device) -------------------------------------------------

@dataclass(frozen=True)
class PendingJoin:
    """A new device's External Commit with its joining leaf fixed (the MLS core's first step), plus
    the parent epoch's kind 445 key to publish it under. Secret: store `to_bytes()` privately."""

    join: PendingExternalJoin
    group_event_key: bytes = b""  # the parent epoch's kind 445 key (from the pairing payload), to publish

    def to_bytes(self) -> bytes:
        return cbor2.dumps({"v": 2, "join": self.join.to_bytes(), "group_event_key": self.group_event_key})

    @classmethod
    def from_bytes(cls, data: bytes) -> "PendingJoin":
        try:
            obj = cbor2.loads(data)
            if not isinstance(obj, dict) or obj.get("v") != 2:
                raise ValueError("not a pending join of version 2")
            return cls(PendingExternalJoin.from_bytes(obj["join"]), bytes(obj["group_event_key"]))
        except Exception as exc:
            raise MarmotError(f"pending join state is unreadable: {exc}", "state.pending") from None

    @property
    def leaf(self) -> LeafNode:
        """The exact joining LeafNode an admin authorizes."""
        return self.join.leaf_node

    def candidate_context(self) -> GroupContext:
        return self.join.group_context


def _group_info_context(group_info: bytes) -> GroupContext:
    try:
        msg = MLSMessage.decode(group_info)
    except mls.MLSError as exc:
        raise ExternalCommitMlsInvalid(f"GroupInfo does not decode: {exc}") from None
    if msg.wire_format != WF_GROUP_INFO:
        raise ExternalCommitMlsInvalid("not a GroupInfo message")
    return msg.body.group_context


def prepare_external_join(account_secret: str, group_info: bytes, join_psk_value: bytes, *,
                          group_event_key: bytes = b"", device_label: str | None = None
                          ) -> tuple[PendingJoin, LeafNode]:
    """Fix the joining leaf (fresh MLS keys, its 0x8009 proof, the join PSK of the GroupInfo's epoch);
    returns it and the exact LeafNode an admin must authorize."""
    psk_id = join_psk_id(_group_info_context(group_info).encode())
    sig_priv, sig_pub = crypto.signature_keypair()
    try:
        join = mls_prepare_external_join(
            group_info, profile.credential_of(account_secret), sig_priv,
            capabilities=profile.leaf_capabilities(draft=True),
            leaf_extensions=profile.leaf_extensions(account_secret, sig_pub, device_label=device_label, draft=True),
            external_psks={psk_id: bytes(join_psk_value)})
    except mls.MLSError as exc:
        raise ExternalCommitMlsInvalid(f"cannot build the External Commit: {exc}") from None
    return PendingJoin(join, bytes(group_event_key)), join.leaf_node


def finish_external_join(pending: PendingJoin, account_secret: str,
                         proof: proofs.MarmotAuthorizationProof | bytes) -> tuple[Group, bytes]:
    """The External Commit (ExternalInit, one join PSK, one AppEphemeral 0x800a) and our new state."""
    if pending.leaf.credential.identity != bytes.fromhex(public_key(account_secret)):
        raise MarmotError("this pending join is for another account", "state.pending")
    data = proof.encode() if isinstance(proof, proofs.MarmotAuthorizationProof) else bytes(proof)
    try:
        return pending.join.finish([AppEphemeral(comp.MULTI_DEVICE_JOIN_AUTHORIZATION, data)])
    except mls.MLSError as exc:
        raise ExternalCommitMlsInvalid(f"cannot build the External Commit: {exc}") from None


# -- validating it (every existing member) -------------------------------------------------------------

def _check_external_commit(view: ExternalCommitView) -> None:
    """The draft's rules, in the draft's order; the first failure raises its own error class."""
    context, tree = view.parent_context, view.tree
    check_signaling_gate(context, list(tree.leaves()))
    leaf = view.joiner_leaf
    if leaf is None:
        raise ExternalCommitMlsInvalid("the External Commit has no UpdatePath leaf")
    try:
        account = profile.account_of_leaf(leaf, context.cipher_suite)
    except (ProofError, MarmotError, mls.MLSError) as exc:
        raise JoiningLeafProofInvalid(f"joining leaf: {exc}") from None
    if not any(m.credential.identity == account for _, m in tree.leaves()):
        raise UnknownJoiningAccount("no existing member has the joining leaf's account identity")
    types = [p.proposal_type for p in view.proposals]
    if P_EXTERNAL_INIT not in types:
        raise ExternalInitMissing("the Commit has no ExternalInit proposal")
    psks = [p for p in view.proposals if p.proposal_type == P_PSK]
    if len(psks) != 1:
        raise JoinPskInvalid(f"the Commit carries {len(psks)} PreSharedKey proposals, not exactly one")
    expected = join_psk_id(context.encode())
    if psks[0].psk.psktype != PSK_EXTERNAL or psks[0].psk.psk_id != expected:
        raise JoinPskInvalid("the PreSharedKey is not the join PSK of this GroupContext")
    ephemerals = [p for p in view.proposals if p.proposal_type == P_APP_EPHEMERAL]
    if any(p.component_id != comp.MULTI_DEVICE_JOIN_AUTHORIZATION for p in ephemerals):
        raise AuthorizationWrongComponent("an AppEphemeral names a component other than 0x800a")
    if not ephemerals:
        raise AuthorizationMissing("the Commit has no AppEphemeral for component 0x800a")
    if len(ephemerals) > 1:
        raise AuthorizationDuplicated("the Commit has more than one AppEphemeral for component 0x800a")
    extra = [t for t in types if t not in (P_EXTERNAL_INIT, P_PSK, P_APP_EPHEMERAL)]
    if extra or types.count(P_EXTERNAL_INIT) != 1:
        raise ExtraProposal(f"the Commit carries proposals beyond ExternalInit, the join PSK and the "
                            f"AppEphemeral: {[f'0x{t:04x}' for t in extra] or ['a second ExternalInit']}")
    data = ephemerals[0].data
    try:
        proof = proofs.MarmotAuthorizationProof.decode(data)
    except ProofError as exc:
        raise AuthorizationInvalid(f"the AppEphemeral data is not one proof: {exc}") from None
    try:
        state = profile.read_group_state(context)
    except MarmotError as exc:
        raise SignerNotAdmin(f"the group has no admin policy: {exc}") from None
    if proof.signer_pubkey not in state.admins:
        raise SignerNotAdmin("the authorization signer is not an active admin of the parent state")
    # "active administrator account in the candidate parent state": listed by the admin policy and
    # holding a member leaf there; an admin key whose account has no leaf left is not active (M22).
    if not any(m.credential.identity == proof.signer_pubkey for _, m in tree.leaves()):
        raise SignerNotAdmin("the authorization signer is an admin key with no member leaf in the parent "
                             "state, not an active admin")
    try:
        proofs.verify_proof(data, join_binding(context, leaf))
    except ProofError as exc:
        if exc.code == "proof.bad_signature":
            raise AuthorizationBindingMismatch(
                "the authorization does not verify over this GroupContext and joining LeafNode") from None
        raise AuthorizationInvalid(f"the authorization proof is invalid: {exc}") from None
    if view.authenticated_data:
        raise AuthenticatedDataMisuse("this flow contributes nothing to authenticated_data; it must be empty")
    # Ordinary validation of the MLS extensions draft's app_components: the new member supports every
    # component the group requires (or it could not process the group's state, and a new device
    # lacking 0x800a would switch the signaling gate off for every later one).
    try:
        profile.check_supports_required(profile.required_components(context), leaf, "the joining leaf")
    except ComponentError as exc:
        raise ExternalCommitMlsInvalid(str(exc)) from None


def external_commit_policy() -> ExternalCommitPolicy:
    return ExternalCommitPolicy(frozenset({P_PSK, P_APP_EPHEMERAL}), _check_external_commit)


def process_external_commit(group: Group, message: bytes):
    """Validate and apply a multi-device External Commit as an existing member (typed errors)."""
    psk_id, psk = join_psk(group)
    try:
        return group.process(message, psks={psk_id: psk}, external_commit_policy=external_commit_policy())
    except MarmotError:
        raise
    except mls.EpochError as exc:
        raise StaleEpoch(f"the External Commit is not for this epoch: {exc}") from None
    except mls.ConfirmationTagError as exc:
        raise ExternalCommitMlsInvalid(f"confirmation tag does not verify (stale state or wrong join PSK): "
                                       f"{exc}") from None
    except mls.MLSError as exc:
        raise ExternalCommitMlsInvalid(f"MLS validation failed: {exc}") from None
