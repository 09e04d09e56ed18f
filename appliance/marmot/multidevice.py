"""The draft multi-device join (marmot-multi-device.md): a new device of an existing account joins a
group by External Commit, authorized by an active admin's kind 452 proof and bound to the current
epoch by the join PSK. DRAFT: the bytes are not final; callers gate it behind the draft switch.

    join_psk_id = QUIC-vector("marmot.multi-device.join-psk.v1") || SHA-256(TLS(GroupContext))
    join_psk    = MLS-Exporter("marmot", join_psk_id, KDF.Nh)

Building an External Commit is two-phase, because the admin's proof binds the exact joining
LeafNode and travels inside the same Commit: `prepare_external_join` fixes every input of the
joining leaf (keys, path secret, ExternalInit, PSK nonce) and returns the leaf to be authorized;
`finish_external_join` rebuilds the identical leaf and completes the Commit with the proof.
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
from .mls import crypto
from .mls import keyschedule as ks
from .mls.codec import Reader, decode_exact
from .mls.framing import sign_content
from .mls.group import ExternalCommitPolicy, ExternalCommitView, Group, _check_leaf, _sign_leaf, _verified_group_info
from .mls.secrettree import SecretTree
from .mls.structs import (
    CT_COMMIT,
    EXT_EXTERNAL_PUB,
    EXT_REQUIRED_CAPABILITIES,
    MLS10,
    P_APP_EPHEMERAL,
    P_EXTERNAL_INIT,
    P_PSK,
    PSK_EXTERNAL,
    SENDER_NEW_MEMBER_COMMIT,
    SRC_COMMIT,
    WF_PUBLIC_MESSAGE,
    AppEphemeral,
    Commit,
    ExternalInit,
    FramedContent,
    FramedContentAuthData,
    GroupContext,
    LeafNode,
    MLSMessage,
    PreSharedKey,
    PreSharedKeyID,
    PublicMessage,
    RequiredCapabilities,
    Sender,
    UpdatePath,
)
from .mls.tree import derive_path, encrypt_path
from .wire import quic_vector

__all__ = [
    "JOIN_PSK_LABEL",
    "join_psk_id",
    "join_psk",
    "group_event_key",
    "check_signaling_gate",
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


def authorize_join(admin_secret: str, candidate_context: bytes | GroupContext, joining_leaf: bytes | LeafNode, *,
                   created_at: int | None = None) -> proofs.MarmotAuthorizationProof:
    """An admin's kind 452 proof for one exact leaf joining from one exact parent GroupContext."""
    context = candidate_context if isinstance(candidate_context, GroupContext) else GroupContext.decode(candidate_context)
    leaf = joining_leaf if isinstance(joining_leaf, LeafNode) else LeafNode.decode(joining_leaf)
    state = profile.read_group_state(context)
    if bytes.fromhex(public_key(admin_secret)) not in state.admins:
        raise SignerNotAdmin("this account is not an active admin of that group state")
    return proofs.sign_proof(join_binding(context, leaf), admin_secret, created_at)


# -- building the External Commit (the new device) -------------------------------------------------

@dataclass(frozen=True)
class PendingJoin:
    """Every input of a joining leaf, kept between `prepare` and `finish` (secret: store privately)."""

    group_info: bytes
    signature_priv: bytes
    encryption_priv: bytes
    path_secret: bytes
    kem_output: bytes
    init_secret: bytes
    psk_nonce: bytes
    join_psk: bytes
    leaf_extensions: bytes  # the encoded extension list (the 0x8009 proof signature is not repeatable)
    group_event_key: bytes = b""  # the parent epoch's kind 445 key (from the pairing payload), to publish

    def to_bytes(self) -> bytes:
        return cbor2.dumps({"v": 1, **self.__dict__})

    @classmethod
    def from_bytes(cls, data: bytes) -> "PendingJoin":
        try:
            obj = cbor2.loads(data)
            if obj.pop("v") != 1:
                raise ValueError("version")
            return cls(**obj)
        except Exception as exc:
            raise MarmotError(f"pending join state is unreadable: {exc}", "state.pending") from None

    def candidate_context(self) -> GroupContext:
        gi, _ = _verified_group_info(self.group_info, None)
        return gi.group_context


def _group_info(data: bytes):
    try:
        return _verified_group_info(data, None)
    except mls.MLSError as exc:
        raise ExternalCommitMlsInvalid(f"GroupInfo does not verify: {exc}") from None


def prepare_external_join(account_secret: str, group_info: bytes, join_psk_value: bytes, *,
                          group_event_key: bytes = b"", device_label: str | None = None
                          ) -> tuple[PendingJoin, LeafNode]:
    """Fix the joining leaf's inputs; returns them and the exact LeafNode an admin must authorize."""
    gi, _ = _group_info(group_info)
    ext = gi.extension(EXT_EXTERNAL_PUB)
    if ext is None:
        raise ExternalCommitMlsInvalid("GroupInfo has no external_pub extension")
    external_pub = decode_exact(ext.extension_data, Reader.vl)
    kem_output, init_secret = crypto.export_sender(external_pub, ks.EXTERNAL_INIT_LABEL, crypto.NH)
    sig_priv, sig_pub = crypto.signature_keypair()
    enc_priv, _ = crypto.hpke_keypair()
    exts = profile.leaf_extensions(account_secret, sig_pub, device_label=device_label)
    pending = PendingJoin(bytes(group_info), sig_priv, enc_priv, crypto.random_bytes(), kem_output, init_secret,
                          crypto.random_bytes(), bytes(join_psk_value),
                          b"".join(e.encode() for e in exts), bytes(group_event_key))
    _, leaf, _ = _assemble(pending, None, account_secret)
    return pending, leaf


def finish_external_join(pending: PendingJoin, account_secret: str,
                         proof: proofs.MarmotAuthorizationProof | bytes) -> tuple[Group, bytes]:
    """The External Commit (ExternalInit, one join PSK, one AppEphemeral 0x800a) and our new state."""
    data = proof.encode() if isinstance(proof, proofs.MarmotAuthorizationProof) else bytes(proof)
    group, _, message = _assemble(pending, AppEphemeral(comp.MULTI_DEVICE_JOIN_AUTHORIZATION, data),
                                  account_secret)
    return group, message


def _assemble(p: PendingJoin, authorization: AppEphemeral | None, account_secret: str, *,
              proposals: list | None = None, authenticated_data: bytes = b"", psk_id: bytes | None = None):
    """RFC 9420 §12.4.3.2 with fixed inputs: the same PendingJoin always yields the same leaf.

    `proposals` replaces the standard list after ExternalInit (tests build malformed Commits with
    it); `authorization` None stops once the leaf is known.
    """
    gi, tree = _group_info(p.group_info)
    context = gi.group_context
    psk_id = join_psk_id(context.encode()) if psk_id is None else psk_id
    credential = profile.credential_of(account_secret)
    leaf_exts = tuple(decode_exact(p.leaf_extensions, lambda r: _read_all_extensions(r)))
    props = [ExternalInit(p.kem_output)]
    if proposals is not None:
        props += proposals
    else:
        props.append(PreSharedKey(PreSharedKeyID.external(psk_id, p.psk_nonce)))
        if authorization is not None:
            props.append(authorization)
    psk_values = {x.psk.psk_id: p.join_psk for x in props if isinstance(x, PreSharedKey)}
    sig_pub = crypto.signature_public(p.signature_priv)
    enc_pub = crypto.hpke_public(p.encryption_priv)
    g = Group(context, tree, -1, p.signature_priv, {}, None, SecretTree(None, 1),
              ks.interim_transcript_hash(context.confirmed_transcript_hash, gi.confirmation_tag), gi.confirmation_tag)
    me = Sender(SENDER_NEW_MEMBER_COMMIT)
    draft_leaf = LeafNode(enc_pub, sig_pub, credential, profile.leaf_capabilities(), SRC_COMMIT, None, b"", leaf_exts)
    policy = ExternalCommitPolicy(frozenset(x.proposal_type for x in props))
    try:
        staged = g._stage([(x, me, None) for x in props], me, psk_values, None, None, policy, draft_leaf,
                          authenticated_data)
        t = staged.tree
        own = t.add_leaf(draft_leaf)
        fdp = t.filtered_direct_path(own)
        path_secrets, keys, commit_secret = derive_path(len(fdp), p.path_secret)
        parent_hash = t.set_path(own, [(fdp[i][0], keys[i][1]) for i in range(len(fdp))])
        leaf = _sign_leaf(LeafNode(enc_pub, sig_pub, credential, draft_leaf.capabilities, SRC_COMMIT, None,
                                   parent_hash, leaf_exts), p.signature_priv, context.group_id, own)
        _check_leaf(leaf, t, staged.extensions, source=SRC_COMMIT, group_id=context.group_id, leaf_index=own,
                    replacing=own, skip_node=2 * own)
        if authorization is None and proposals is None:
            return None, leaf, None
        t.set_node(2 * own, leaf)
        provisional = GroupContext(MLS10, context.cipher_suite, context.group_id, context.epoch + 1, t.tree_hash(),
                                   context.confirmed_transcript_hash, staged.extensions)
        nodes = encrypt_path(t, fdp, path_secrets, [k[1] for k in keys], provisional.encode(), set())
        content = FramedContent(context.group_id, context.epoch, me, authenticated_data, CT_COMMIT,
                                Commit(tuple(props), UpdatePath(leaf, nodes)))
        signature = sign_content(WF_PUBLIC_MESSAGE, content, context, p.signature_priv)
        g.own_leaf = own
        g.privs = {2 * own: p.encryption_priv, **{fdp[i][0]: keys[i][0] for i in range(len(fdp))}}
        new = g._advance(staged, content, WF_PUBLIC_MESSAGE, signature, commit_secret, p.init_secret, psk_values)
    except mls.MLSError as exc:
        raise ExternalCommitMlsInvalid(f"cannot build the External Commit: {exc}") from None
    auth = FramedContentAuthData(signature, new.confirmation_tag)
    return new, leaf, MLSMessage(WF_PUBLIC_MESSAGE, PublicMessage(content, auth, None)).encode()


def _read_all_extensions(r: Reader):
    from .mls.structs import Extension

    out = []
    while not r.done():
        out.append(Extension.read(r))
    return out


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
    try:
        proofs.verify_proof(data, join_binding(context, leaf))
    except ProofError as exc:
        if exc.code == "proof.bad_signature":
            raise AuthorizationBindingMismatch(
                "the authorization does not verify over this GroupContext and joining LeafNode") from None
        raise AuthorizationInvalid(f"the authorization proof is invalid: {exc}") from None
    if view.authenticated_data:
        raise AuthenticatedDataMisuse("this flow contributes nothing to authenticated_data; it must be empty")


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
