"""The group engine: create, add and remove, process, join by Welcome, External Commit (RFC 9420 §10-12).

A `Group` is one member's view of one epoch. Every operation returns a *new* `Group` (plus its
outputs) and leaves the one it was called on untouched, so a failure half way changes nothing:
the caller keeps the state bytes it had. `Group.to_bytes()` / `Group.from_bytes()` carry the state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import cbor2

from . import crypto, keyschedule as ks
from .codec import Reader, decode_exact, vl, vl_list
from .errors import (
    ConfirmationTagError,
    DecodeError,
    EpochError,
    MLSError,
    ProposalError,
    StateError,
    TreeError,
    UnsupportedError,
    ValidationError,
)
from .framing import (
    authenticated_content,
    check_membership_tag,
    protect_private,
    protect_public,
    sign_content,
    unprotect_private,
    verify_content,
)
from .secrettree import SecretTree
from .structs import (
    CT_APPLICATION,
    CT_COMMIT,
    CT_PROPOSAL,
    DEFAULT_EXTENSIONS,
    DEFAULT_PROPOSALS,
    EXT_APP_DATA_DICTIONARY,
    EXT_EXTERNAL_PUB,
    EXT_EXTERNAL_SENDERS,
    EXT_RATCHET_TREE,
    EXT_REQUIRED_CAPABILITIES,
    MLS10,
    P_APP_DATA_UPDATE,
    P_EXTERNAL_INIT,
    P_GROUP_CONTEXT_EXTENSIONS,
    P_PSK,
    P_REINIT,
    P_REMOVE,
    P_SELF_REMOVE,
    P_UPDATE,
    PSK_EXTERNAL,
    RESUMPTION_APPLICATION,
    SENDER_EXTERNAL,
    SENDER_MEMBER,
    SENDER_NEW_MEMBER_COMMIT,
    SENDER_NEW_MEMBER_PROPOSAL,
    SRC_COMMIT,
    SRC_KEY_PACKAGE,
    SRC_UPDATE,
    WF_GROUP_INFO,
    WF_PRIVATE_MESSAGE,
    WF_PUBLIC_MESSAGE,
    WF_WELCOME,
    APP_DATA_OP_REMOVE,
    Add,
    Capabilities,
    Commit,
    Credential,
    EncryptedGroupSecrets,
    Extension,
    ExternalInit,
    FramedContent,
    FramedContentAuthData,
    GroupContext,
    GroupContextExtensions,
    GroupInfo,
    GroupSecrets,
    HPKECiphertext,
    KeyPackage,
    LeafNode,
    Lifetime,
    MLSMessage,
    PreSharedKey,
    PreSharedKeyID,
    PrivateMessage,
    ProposalRef,
    PublicMessage,
    Remove,
    SelfRemove,
    RequiredCapabilities,
    Sender,
    Update,
    UpdatePath,
    Welcome,
    decode_proposal,
    encode_proposal,
    find_extension,
)
from .tree import RatchetTree, decrypt_path, derive_path, encrypt_path
from .treemath import common_ancestor, leaves_under

STATE_VERSION = 1
DEFAULT_LIFETIME = 90 * 24 * 3600  # seconds a fresh KeyPackage is valid for (Marmot caps it near 84 days)
RESUMPTION_HISTORY = 64  # past epochs whose resumption PSK we keep (for PSK proposals that name them)
PATH_REQUIRED = frozenset({P_UPDATE, P_REMOVE, P_EXTERNAL_INIT, P_GROUP_CONTEXT_EXTENSIONS, P_SELF_REMOVE})


def _now() -> int:
    return int(time.time())


# -- key packages ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyPackageSecrets:
    """The private half of a KeyPackage (init, leaf encryption and signature keys)."""

    key_package: KeyPackage
    init_priv: bytes = field(repr=False)  # private keys stay out of reprs (logs, tracebacks)
    encryption_priv: bytes = field(repr=False)
    signature_priv: bytes = field(repr=False)

    def to_bytes(self) -> bytes:
        return cbor2.dumps({"v": 1, "kp": self.key_package.encode(), "init": self.init_priv,
                            "enc": self.encryption_priv, "sig": self.signature_priv})

    @classmethod
    def from_bytes(cls, data: bytes) -> "KeyPackageSecrets":
        try:
            obj = cbor2.loads(data)
            return cls(KeyPackage.decode(obj["kp"]), obj["init"], obj["enc"], obj["sig"])
        except MLSError:
            raise
        except Exception as exc:
            raise StateError(f"invalid key package secrets: {exc}") from None


def create_key_package(credential: Credential | bytes, signature_priv: bytes | None = None, *,
                       capabilities: Capabilities | None = None, leaf_extensions: Iterable[Extension] = (),
                       extensions: Iterable[Extension] = (), lifetime: Lifetime | None = None,
                       now: int | None = None) -> KeyPackageSecrets:
    """A fresh KeyPackage (and its private keys). `credential` may be a basic identity's bytes."""
    if isinstance(credential, (bytes, bytearray)):
        credential = Credential.basic(bytes(credential))
    if signature_priv is None:
        signature_priv, _ = crypto.signature_keypair()
    if lifetime is None:
        t = _now() if now is None else now
        lifetime = Lifetime(t - 3600, t + DEFAULT_LIFETIME)
    init_priv, init_pub = crypto.hpke_keypair()
    enc_priv, enc_pub = crypto.hpke_keypair()
    leaf = _sign_leaf(LeafNode(enc_pub, crypto.signature_public(signature_priv), credential,
                               capabilities or Capabilities(), SRC_KEY_PACKAGE, lifetime, b"",
                               tuple(leaf_extensions)), signature_priv)
    kp = KeyPackage(MLS10, crypto.CIPHER_SUITE, init_pub, leaf, tuple(extensions))
    kp = KeyPackage(kp.version, kp.cipher_suite, kp.init_key, leaf, kp.extensions,
                    crypto.sign_with_label(signature_priv, b"KeyPackageTBS", kp.tbs()))
    return KeyPackageSecrets(kp, init_priv, enc_priv, signature_priv)


def _sign_leaf(leaf: LeafNode, priv: bytes, group_id: bytes = b"", leaf_index: int = 0) -> LeafNode:
    sig = crypto.sign_with_label(priv, b"LeafNodeTBS", leaf.tbs(group_id, leaf_index))
    return LeafNode(leaf.encryption_key, leaf.signature_key, leaf.credential, leaf.capabilities,
                    leaf.leaf_node_source, leaf.lifetime, leaf.parent_hash, leaf.extensions, sig)


def key_package_ref(kp: KeyPackage) -> bytes:
    return crypto.make_key_package_ref(kp.encode())


def parse_key_package(data: bytes) -> KeyPackage:
    """A KeyPackage from its bytes, bare or framed as an MLSMessage; the signatures are checked."""
    if len(data) >= 4 and data[:4] == b"\x00\x01\x00\x05":
        msg = MLSMessage.decode(data)
        kp = msg.body
    else:
        kp = KeyPackage.decode(data)
    verify_key_package(kp)
    return kp


def verify_key_package(kp: KeyPackage) -> None:
    crypto.require_suite(kp.cipher_suite)
    if kp.version != MLS10:
        raise UnsupportedError(f"protocol version {kp.version}")
    if kp.leaf_node.leaf_node_source != SRC_KEY_PACKAGE:
        raise ValidationError("key package leaf node source is not key_package")
    crypto.require_signature(kp.leaf_node.signature_key, b"KeyPackageTBS", kp.tbs(), kp.signature, "key package")
    crypto.require_signature(kp.leaf_node.signature_key, b"LeafNodeTBS", kp.leaf_node.tbs(), kp.leaf_node.signature,
                             "key package leaf node")
    if kp.init_key == kp.leaf_node.encryption_key:
        raise ValidationError("key package init_key equals its leaf encryption_key")


def capabilities_for(context: GroupContext, base: Capabilities | None = None) -> Capabilities:
    """`base` (default capabilities if None) plus everything the group's context requires of a leaf:
    every non-default GroupContext extension type and the required_capabilities lists."""
    base = base or Capabilities()
    exts, props, creds = list(base.extensions), list(base.proposals), list(base.credentials)
    req = _required(context.extensions) or RequiredCapabilities()
    for t in [e.extension_type for e in context.extensions] + list(req.extension_types):
        if t not in DEFAULT_EXTENSIONS and t not in exts:
            exts.append(t)
    for t in req.proposal_types:
        if t not in DEFAULT_PROPOSALS and t not in props:
            props.append(t)
    for t in req.credential_types:
        if t not in creds:
            creds.append(t)
    return Capabilities(base.versions, base.cipher_suites, tuple(exts), tuple(props), tuple(creds))


# -- app data dictionary (draft-ietf-mls-extensions) ------------------------------------------------

def decode_app_data_dictionary(data: bytes) -> list[tuple[int, bytes]]:
    """ComponentData entries of an app_data_dictionary extension, in order (strictly increasing ids)."""
    def entry(r: Reader):
        return r.u16(), r.vl()
    entries = decode_exact(data, lambda r: r.vl_list(entry))
    ids = [cid for cid, _ in entries]
    if ids != sorted(set(ids)):
        raise DecodeError("app_data_dictionary entries are not sorted and unique")
    return entries


def encode_app_data_dictionary(entries: Iterable[tuple[int, bytes]]) -> bytes:
    from .codec import u16
    return vl_list(u16(cid) + vl(data) for cid, data in sorted(entries))


def external_pub_extension(pub: bytes) -> Extension:
    return Extension(EXT_EXTERNAL_PUB, vl(pub))


# -- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Member:
    leaf_index: int
    credential: Credential
    signature_key: bytes
    leaf_node: LeafNode

    @property
    def identity(self) -> bytes | None:
        return self.credential.identity


@dataclass(frozen=True)
class CommitOutcome:
    group: "Group"  # the committer's state in the new epoch (adopt it once the commit is accepted)
    message: bytes  # MLSMessage (PublicMessage or PrivateMessage) carrying the Commit
    welcome: bytes | None  # MLSMessage(Welcome) for added members, if any
    proposals: tuple = ()


@dataclass(frozen=True)
class Processed:
    group: "Group"  # the state after processing (for an application message: ratchet advanced)
    kind: str  # "application" | "proposal" | "commit"
    sender: Sender
    sender_leaf: LeafNode | None
    authenticated_data: bytes
    application_data: bytes | None = None
    proposal: object | None = None
    proposals: tuple = ()  # commit: the proposals it applied, in order
    removed_self: bool = False
    epoch: int = 0


@dataclass(frozen=True)
class ExternalCommitView:
    """What an External Commit asks of the group, for a policy check before anything is applied."""

    parent_context: GroupContext  # the epoch the commit applies to
    tree: RatchetTree  # that epoch's tree (do not modify)
    joiner_leaf: LeafNode
    joiner_leaf_index: int
    proposals: tuple  # every proposal, in commit order (ExternalInit included)
    authenticated_data: bytes


@dataclass(frozen=True)
class ExternalCommitPolicy:
    """Which proposals an External Commit may carry besides its ExternalInit, and an extra check.

    The default follows RFC 9420 §12.4.3.2: at most one Remove (a resync of the joiner's own old
    leaf) and any PreSharedKey proposals. `check` runs before anything is applied; it raises to
    refuse (its exception propagates unchanged).
    """

    allowed_proposal_types: frozenset = frozenset({P_REMOVE, P_PSK})
    check: Callable[[ExternalCommitView], None] | None = None


RFC_EXTERNAL_COMMIT_POLICY = ExternalCommitPolicy()


@dataclass
class _Staged:
    tree: RatchetTree
    extensions: tuple
    proposals: list  # proposal objects in commit order
    added: list  # (leaf_index, KeyPackage)
    removed: list  # leaf indices
    psk_ids: list
    external_init: ExternalInit | None
    path_required: bool
    reinit: object | None
    own_update_priv: bytes | None


# -- the group ------------------------------------------------------------------------------------

class Group:
    """One member's state in one epoch. Treat as immutable: operations return new groups."""

    __slots__ = ("context", "tree", "own_leaf", "signature_priv", "privs", "secrets", "secret_tree", "interim",
                 "confirmation_tag", "pending", "resumption", "own_updates", "active", "reinit")

    def __repr__(self) -> str:  # no secrets: group id, epoch and our leaf only
        return f"<Group {self.group_id.hex()} epoch={self.epoch} leaf={self.own_leaf}>"

    def __init__(self, context, tree, own_leaf, signature_priv, privs, secrets, secret_tree, interim,
                 confirmation_tag, pending=None, resumption=None, own_updates=None, active=True, reinit=None):
        self.context: GroupContext = context
        self.tree: RatchetTree = tree
        self.own_leaf: int = own_leaf
        self.signature_priv: bytes = signature_priv
        self.privs: dict[int, bytes] = privs
        self.secrets: ks.EpochSecrets = secrets
        self.secret_tree: SecretTree = secret_tree
        self.interim: bytes = interim
        self.confirmation_tag: bytes = confirmation_tag
        self.pending: dict[bytes, tuple] = pending if pending is not None else {}  # ref -> (proposal, Sender)
        self.resumption: dict[int, bytes] = resumption if resumption is not None else {}
        self.own_updates: dict[bytes, bytes] = own_updates if own_updates is not None else {}  # ref -> leaf priv
        self.active = active
        self.reinit = reinit  # the ReInit proposal that ended this group, if any

    # -- state bytes --------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return cbor2.dumps({
            "v": STATE_VERSION,
            "context": self.context.encode(),
            "tree": self.tree.encode(),
            "own": self.own_leaf,
            "sig": self.signature_priv,
            "privs": self.privs,
            "secrets": self.secrets.to_list(),
            "secret_tree": self.secret_tree.to_obj(),
            "interim": self.interim,
            "tag": self.confirmation_tag,
            "pending": [[ref, encode_proposal(p), s.encode()] for ref, (p, s) in self.pending.items()],
            "resumption": self.resumption,
            "own_updates": self.own_updates,
            "active": self.active,
            "reinit": encode_proposal(self.reinit) if self.reinit is not None else None,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> "Group":
        try:
            obj = cbor2.loads(data)
            if not isinstance(obj, dict) or obj.get("v") != STATE_VERSION:
                raise StateError("not group state bytes of a known version")
            pending = {}
            for ref, p, s in obj["pending"]:
                pending[ref] = (decode_proposal(p), decode_exact(s, Sender.read))
            return cls(
                GroupContext.decode(obj["context"]), RatchetTree.decode(obj["tree"]), obj["own"], obj["sig"],
                {int(k): v for k, v in obj["privs"].items()}, ks.EpochSecrets.from_list(obj["secrets"]),
                SecretTree.from_obj(obj["secret_tree"]), obj["interim"], obj["tag"], pending,
                {int(k): v for k, v in obj["resumption"].items()}, dict(obj["own_updates"]), obj["active"],
                decode_proposal(obj["reinit"]) if obj["reinit"] is not None else None)
        except MLSError:
            raise
        except Exception as exc:
            raise StateError(f"invalid group state bytes: {type(exc).__name__}: {exc}") from None

    def copy(self) -> "Group":
        return Group(self.context, self.tree.copy(), self.own_leaf, self.signature_priv, dict(self.privs),
                     self.secrets, self.secret_tree.copy(), self.interim, self.confirmation_tag, dict(self.pending),
                     dict(self.resumption), dict(self.own_updates), self.active, self.reinit)

    # -- views --------------------------------------------------------------------------------

    @property
    def group_id(self) -> bytes:
        return self.context.group_id

    @property
    def epoch(self) -> int:
        return self.context.epoch

    @property
    def epoch_authenticator(self) -> bytes:
        return self.secrets.epoch_authenticator

    @property
    def own_leaf_node(self) -> LeafNode:
        return self.tree.leaf(self.own_leaf)

    def group_context_bytes(self) -> bytes:
        return self.context.encode()

    def members(self) -> list[Member]:
        return [Member(i, leaf.credential, leaf.signature_key, leaf) for i, leaf in self.tree.leaves()]

    def export_secret(self, label: bytes, context: bytes, length: int) -> bytes:
        """MLS-Exporter(label, context, length) of the current epoch."""
        return ks.exporter(self.secrets.exporter_secret, label, context, length)

    def external_pub(self) -> bytes:
        return self.secrets.external_keypair()[1]

    def _require_active(self) -> None:
        if not self.active:
            raise StateError("this member is no longer in the group" if self.reinit is None
                             else "the group was ended by a ReInit")

    # -- group info ---------------------------------------------------------------------------

    def group_info(self, *, ratchet_tree: bool = True, external_pub: bool = True,
                   extensions: Iterable[Extension] = ()) -> bytes:
        """A signed GroupInfo (framed as an MLSMessage) for this epoch, e.g. for External Commits."""
        self._require_active()
        exts = list(extensions)
        if ratchet_tree:
            exts.append(Extension(EXT_RATCHET_TREE, self.tree.encode()))
        if external_pub:
            exts.append(external_pub_extension(self.external_pub()))
        return MLSMessage(WF_GROUP_INFO, self._signed_group_info(self.context, exts, self.confirmation_tag)).encode()

    def _signed_group_info(self, context: GroupContext, exts, tag: bytes) -> GroupInfo:
        gi = GroupInfo(context, tuple(exts), tag, self.own_leaf)
        return GroupInfo(gi.group_context, gi.extensions, gi.confirmation_tag, gi.signer,
                         crypto.sign_with_label(self.signature_priv, b"GroupInfoTBS", gi.tbs()))

    # -- creation -----------------------------------------------------------------------------

    @classmethod
    def create(cls, group_id: bytes, credential: Credential | bytes, signature_priv: bytes | None = None, *,
               capabilities: Capabilities | None = None, leaf_extensions: Iterable[Extension] = (),
               extensions: Iterable[Extension] = (), lifetime: Lifetime | None = None) -> "Group":
        """A new one-member group in epoch 0 (§11)."""
        if isinstance(credential, (bytes, bytearray)):
            credential = Credential.basic(bytes(credential))
        if signature_priv is None:
            signature_priv, _ = crypto.signature_keypair()
        enc_priv, enc_pub = crypto.hpke_keypair()
        t = _now()
        leaf = _sign_leaf(LeafNode(enc_pub, crypto.signature_public(signature_priv), credential,
                                   capabilities or Capabilities(), SRC_KEY_PACKAGE,
                                   lifetime or Lifetime(t - 3600, t + DEFAULT_LIFETIME), b"",
                                   tuple(leaf_extensions)), signature_priv)
        tree = RatchetTree.one_member(leaf)
        exts = tuple(extensions)
        _check_leaf(leaf, tree, exts, source=SRC_KEY_PACKAGE, group_id=group_id, leaf_index=0, replacing=0,
                    skip_node=0)
        context = GroupContext(MLS10, crypto.CIPHER_SUITE, group_id, 0, tree.tree_hash(), b"", exts)
        secrets = ks.from_joiner(ks.joiner_secret(crypto.random_bytes(), ks.ZERO, context.encode()), ks.ZERO,
                                 context.encode())
        tag = crypto.mac(secrets.confirmation_key, b"")
        return cls(context, tree, 0, signature_priv, {0: enc_priv}, secrets,
                   SecretTree(secrets.encryption_secret, 1), ks.interim_transcript_hash(b"", tag), tag)

    # -- application messages -------------------------------------------------------------------

    def encrypt(self, data: bytes, authenticated_data: bytes = b"", padding: int = 0) -> tuple["Group", bytes]:
        """An application message (always a PrivateMessage)."""
        self._require_active()
        g = self.copy()
        content = FramedContent(g.group_id, g.epoch, Sender(SENDER_MEMBER, g.own_leaf), authenticated_data,
                                CT_APPLICATION, bytes(data))
        auth = FramedContentAuthData(sign_content(WF_PRIVATE_MESSAGE, content, g.context, g.signature_priv))
        msg = protect_private(content, auth, g.secret_tree, g.secrets.sender_data_secret, padding)
        return g, MLSMessage(WF_PRIVATE_MESSAGE, msg).encode()

    # -- proposals ----------------------------------------------------------------------------

    def propose(self, proposal, *, wire_format: int = WF_PUBLIC_MESSAGE,
                authenticated_data: bytes = b"") -> tuple["Group", bytes]:
        """A standalone proposal message; it is also kept so our own commit can include it."""
        self._require_active()
        g = self.copy()
        if proposal.proposal_type == P_EXTERNAL_INIT:
            raise ProposalError("ExternalInit is only valid inline in an External Commit")
        if proposal.proposal_type == P_SELF_REMOVE and wire_format != WF_PUBLIC_MESSAGE:
            raise ProposalError("a SelfRemove must be sent as a PublicMessage")
        content = FramedContent(g.group_id, g.epoch, Sender(SENDER_MEMBER, g.own_leaf), authenticated_data,
                                CT_PROPOSAL, proposal)
        auth = FramedContentAuthData(sign_content(wire_format, content, g.context, g.signature_priv))
        msg = g._protect(wire_format, content, auth)
        ref = crypto.make_proposal_ref(authenticated_content(wire_format, content, auth))
        g.pending[ref] = (proposal, content.sender)
        return g, msg

    def propose_update(self, *, leaf_extensions: Iterable[Extension] | None = None,
                       capabilities: Capabilities | None = None,
                       wire_format: int = WF_PUBLIC_MESSAGE) -> tuple["Group", bytes]:
        """An Update proposal with a fresh leaf encryption key."""
        self._require_active()
        old = self.own_leaf_node
        priv, pub = crypto.hpke_keypair()
        leaf = _sign_leaf(LeafNode(pub, old.signature_key, old.credential, capabilities or old.capabilities,
                                   SRC_UPDATE, None, b"",
                                   tuple(leaf_extensions) if leaf_extensions is not None else old.extensions),
                          self.signature_priv, self.group_id, self.own_leaf)
        g, msg = self.propose(Update(leaf), wire_format=wire_format)
        ref = list(g.pending)[-1]
        g.own_updates[ref] = priv
        return g, msg

    def _protect(self, wire_format: int, content: FramedContent, auth: FramedContentAuthData) -> bytes:
        if wire_format == WF_PUBLIC_MESSAGE:
            return MLSMessage(WF_PUBLIC_MESSAGE,
                              protect_public(content, auth, self.context, self.secrets.membership_key)).encode()
        if wire_format == WF_PRIVATE_MESSAGE:
            return MLSMessage(WF_PRIVATE_MESSAGE, protect_private(content, auth, self.secret_tree,
                                                                  self.secrets.sender_data_secret)).encode()
        raise UnsupportedError(f"wire format {wire_format} cannot carry handshake messages")

    # -- commit -------------------------------------------------------------------------------

    def commit(self, *, add: Iterable[bytes | KeyPackage] = (), remove: Iterable[int] = (),
               psks: Iterable[PreSharedKeyID] = (), group_context_extensions: Iterable[Extension] | None = None,
               proposals: Iterable = (), by_reference: Iterable[bytes] | None = None,
               psk_values: dict[bytes, bytes] | None = None, force_path: bool = True,
               wire_format: int = WF_PUBLIC_MESSAGE, authenticated_data: bytes = b"",
               ratchet_tree_in_welcome: bool = True, group_info_extensions: Iterable[Extension] = (),
               now: int | None = None, app_data_updater=None) -> CommitOutcome:
        """Commit pending proposals plus the given inline ones; returns the new epoch.

        By default the pending proposals are all carried except those the RFC 9420 §12.2 preferences
        leave out (see `_pending_for_commit`); `by_reference` names exactly which ones instead."""
        self._require_active()
        g = self.copy()
        now = _now() if now is None else now
        inline = []
        for kp in add:
            inline.append(Add(parse_key_package(kp) if isinstance(kp, (bytes, bytearray)) else kp))
        inline += [Remove(i) for i in remove]
        inline += [PreSharedKey(p) for p in psks]
        if group_context_extensions is not None:
            inline.append(GroupContextExtensions(tuple(group_context_extensions)))
        inline += list(proposals)
        me = Sender(SENDER_MEMBER, g.own_leaf)
        if by_reference is None:
            refs = g._pending_for_commit(inline)
        else:
            refs = list(by_reference)
        items = []
        for ref in refs:
            if ref not in g.pending:
                raise ProposalError(f"unknown proposal reference {ref.hex()}")
            p, s = g.pending[ref]
            if s == me and isinstance(p, Update):
                continue  # a committer never commits its own Update (§12.2)
            items.append((p, s, ref))
        items += [(p, me, None) for p in inline]
        staged = g._stage(items, me, psk_values or {}, now, app_data_updater)
        path = None
        commit_secret = ks.ZERO
        path_secrets: list = []
        fdp: list = []
        if staged.path_required or force_path:
            old = g.own_leaf_node
            leaf = LeafNode(b"", old.signature_key, old.credential, old.capabilities, SRC_COMMIT, None, b"",
                            old.extensions)
            path, g.privs, fdp, path_secrets, commit_secret = _encap(
                staged.tree, g.own_leaf, leaf, g.signature_priv, g.context, staged.extensions,
                {i for i, _ in staged.added})
        commit = Commit(tuple(ProposalRef(ref) if ref is not None else p for p, _, ref in items), path)
        content = FramedContent(g.group_id, g.epoch, me, authenticated_data, CT_COMMIT, commit)
        signature = sign_content(wire_format, content, g.context, g.signature_priv)
        new = g._advance(staged, content, wire_format, signature, commit_secret, None, psk_values or {})
        auth = FramedContentAuthData(signature, new.confirmation_tag)
        message = g._protect(wire_format, content, auth)  # old epoch's keys
        welcome = None
        if staged.added:
            welcome = new._welcome(staged, fdp, path_secrets, ratchet_tree_in_welcome, group_info_extensions)
        return CommitOutcome(new, message, welcome, tuple(p for p, _, _ in items))

    def _pending_for_commit(self, inline: list) -> list[bytes]:
        """The pending proposals a default commit() carries, in arrival order: the committer's choice
        §12.2 leaves to it, so that proposals from several members never make the list invalid. A
        Remove of the committer is left out; one Remove per leaf; a Remove wins over Updates of that
        leaf, else the latest Update wins; one proposal per PSK id; the latest GroupContextExtensions
        (none if the commit carries its own); a ReInit only when nothing else is proposed (latest)."""
        removed_inline = {p.removed for p in inline if isinstance(p, Remove)}
        gce_inline = any(isinstance(p, GroupContextExtensions) for p in inline)
        items = list(self.pending.items())
        removed = set(removed_inline)
        for _, (p, s) in items:
            if isinstance(p, Remove) and p.removed != self.own_leaf:
                removed.add(p.removed)
            elif isinstance(p, SelfRemove) and s.index != self.own_leaf:
                removed.add(s.index)
        latest_update = {s.index: ref for ref, (p, s) in items if isinstance(p, Update)}
        gces = [ref for ref, (p, _) in items if p.proposal_type == P_GROUP_CONTEXT_EXTENSIONS]
        chosen, seen_removes, seen_psks = [], set(removed_inline), []
        for ref, (p, s) in items:
            if isinstance(p, Update):
                if s.index == self.own_leaf or s.index in removed or latest_update[s.index] != ref:
                    continue
            elif isinstance(p, Remove):
                if p.removed == self.own_leaf or p.removed in seen_removes:
                    continue
                seen_removes.add(p.removed)
            elif isinstance(p, SelfRemove):  # its sender leaves; we cannot commit our own
                if s.index == self.own_leaf or s.index in seen_removes:
                    continue
                seen_removes.add(s.index)
            elif isinstance(p, PreSharedKey):
                if p.psk in seen_psks:
                    continue
                seen_psks.append(p.psk)
            elif p.proposal_type == P_GROUP_CONTEXT_EXTENSIONS:
                if gce_inline or ref != gces[-1]:
                    continue
            chosen.append(ref)
        reinits = [ref for ref in chosen if self.pending[ref][0].proposal_type == P_REINIT]
        if reinits:
            others = [ref for ref in chosen if ref not in reinits]
            chosen = others if others or inline else reinits[-1:]
        return chosen

    def _welcome(self, staged: _Staged, fdp, path_secrets, with_tree: bool, gi_exts) -> bytes:
        exts = list(gi_exts)
        if with_tree:
            exts.append(Extension(EXT_RATCHET_TREE, self.tree.encode()))
        gi = self._signed_group_info(self.context, exts, self.confirmation_tag)
        key, nonce = ks.welcome_key_nonce(self.secrets.welcome_secret)
        encrypted_group_info = crypto.aead_seal(key, nonce, b"", gi.encode())
        secrets = []
        for leaf_index, kp in staged.added:
            path_secret = None
            for k, (node, copath_child) in enumerate(fdp):
                if leaf_index in leaves_under(copath_child):
                    path_secret = path_secrets[k]
                    break
            gs = GroupSecrets(self.secrets.joiner_secret, path_secret, tuple(staged.psk_ids))
            kem_output, ct = crypto.encrypt_with_label(kp.init_key, b"Welcome", encrypted_group_info, gs.encode())
            secrets.append(EncryptedGroupSecrets(key_package_ref(kp), HPKECiphertext(kem_output, ct)))
        return MLSMessage(WF_WELCOME, Welcome(crypto.CIPHER_SUITE, tuple(secrets), encrypted_group_info)).encode()

    # -- staging: validate and apply a proposal list ----------------------------------------------

    def _stage(self, items, committer: Sender, psk_values, now, app_data_updater,
               external_policy: ExternalCommitPolicy | None = None, joiner_leaf: LeafNode | None = None,
               authenticated_data: bytes = b"") -> _Staged:
        """Validate the proposal list (§12.2) and apply it to a copy of the tree (§12.3)."""
        external = committer.sender_type == SENDER_NEW_MEMBER_COMMIT
        tree = self.tree.copy()
        proposals = [p for p, _, _ in items]
        types = [p.proposal_type for p in proposals]
        if external:
            if any(ref is not None for _, _, ref in items):
                raise ProposalError("an External Commit may not include proposals by reference")
            if types.count(P_EXTERNAL_INIT) != 1:
                raise ProposalError("an External Commit needs exactly one ExternalInit proposal")
            policy = external_policy or RFC_EXTERNAL_COMMIT_POLICY
            extra = [t for t in types if t != P_EXTERNAL_INIT and t not in policy.allowed_proposal_types]
            if extra:
                raise ProposalError(f"proposal type(s) {sorted(set(extra))} not allowed in this External Commit")
            if types.count(P_REMOVE) > 1:
                raise ProposalError("an External Commit may remove at most one (its own old) leaf")
        elif P_EXTERNAL_INIT in types:
            raise ProposalError("ExternalInit outside an External Commit")
        if P_REINIT in types and len(types) != 1:
            raise ProposalError("a ReInit must be the only proposal of its Commit")
        for p in proposals:
            if p.proposal_type == P_REINIT:
                _check_reinit(p, self.context)
        if types.count(P_GROUP_CONTEXT_EXTENSIONS) > 1:
            raise ProposalError("more than one GroupContextExtensions proposal")
        for p, s, ref in items:
            if ref is None and s != committer:
                raise ProposalError("inline proposal not from the committer")
            if isinstance(p, Update) and ref is None:
                raise ProposalError("a Commit may not carry an inline Update (the committer's own)")
        # 1. GroupContextExtensions, then AppDataUpdates on the app_data_dictionary
        extensions = self.context.extensions
        gce = next((p for p in proposals if p.proposal_type == P_GROUP_CONTEXT_EXTENSIONS), None)
        if gce is not None:
            _check_unique_extensions(gce.extensions, "group context")
            extensions = gce.extensions
        updates = [p for p in proposals if p.proposal_type == P_APP_DATA_UPDATE]
        if updates:
            extensions = _apply_app_data_updates(extensions, updates, app_data_updater)
        # 2. Updates
        updated, removed, own_update_priv = set(), [], None
        for p, s, ref in items:
            if isinstance(p, Update):
                if s.sender_type != SENDER_MEMBER:
                    raise ProposalError("an Update must come from a member")
                if s.index == committer.index and committer.sender_type == SENDER_MEMBER:
                    raise ProposalError("the committer may not commit its own Update")
                if s.index in updated:
                    raise ProposalError(f"two Updates for leaf {s.index}")
                if tree.leaf(s.index) is None:
                    raise ProposalError(f"Update from blank leaf {s.index}")
                _check_leaf(p.leaf_node, tree, extensions, source=SRC_UPDATE, group_id=self.group_id,
                            leaf_index=s.index, replacing=s.index)
                updated.add(s.index)
                tree.update_leaf(s.index, p.leaf_node)
                if s.index == self.own_leaf and ref in self.own_updates:
                    own_update_priv = self.own_updates[ref]
        # 3. Removes (a SelfRemove removes its sender's leaf)
        for p, s, ref in items:
            if isinstance(p, SelfRemove):
                if s.sender_type != SENDER_MEMBER:
                    raise ProposalError("a SelfRemove must come from a member")
                if ref is None:
                    raise ProposalError("a SelfRemove is committed by reference, by another member")
                p = Remove(s.index)
            if isinstance(p, Remove):
                if p.removed in removed:
                    raise ProposalError(f"leaf {p.removed} removed twice")
                if p.removed in updated:
                    raise ProposalError(f"leaf {p.removed} both updated and removed")
                if tree.leaf(p.removed) is None:
                    raise ProposalError(f"Remove of blank or unknown leaf {p.removed}")
                if committer.sender_type == SENDER_MEMBER and p.removed == committer.index:
                    raise ProposalError("the committer may not remove itself")
                if external and joiner_leaf is not None:
                    old = tree.leaf(p.removed)
                    if old.credential != joiner_leaf.credential:
                        raise ProposalError("an External Commit may only remove a leaf with the joiner's credential")
                removed.append(p.removed)
                tree.remove_leaf(p.removed)
        # 4. Adds
        added = []
        index = None
        for p in proposals:
            if isinstance(p, Add):
                kp = p.key_package
                verify_key_package(kp)
                if kp.cipher_suite != self.context.cipher_suite:
                    raise ProposalError("Add with another cipher suite")
                if index is None:
                    index = _KeyIndex(tree)
                _check_leaf(kp.leaf_node, tree, extensions, source=SRC_KEY_PACKAGE, group_id=self.group_id,
                            leaf_index=None, replacing=None, now=now, index=index)
                leaf_index = tree.add_leaf(kp.leaf_node)
                index.add(kp.leaf_node, 2 * leaf_index)
                added.append((leaf_index, kp))
        if gce is not None or updates:
            for i, leaf in tree.leaves():
                _check_leaf_supports(leaf, extensions, f"leaf {i}")
        _check_proposal_support(types, tree, {i for i, _ in added})
        # 5. PSKs
        psk_ids = []
        for p in proposals:
            if isinstance(p, PreSharedKey):
                pid = p.psk
                if pid in psk_ids:
                    raise ProposalError("the same PSK twice")
                _check_psk_id(pid)
                psk_ids.append(pid)
        self._resolve_psks(psk_ids, psk_values)  # fail early on an unknown PSK
        reinit = next((p for p in proposals if p.proposal_type == P_REINIT), None)
        path_required = not proposals or any(t in PATH_REQUIRED for t in types)
        ext_init = next((p for p in proposals if isinstance(p, ExternalInit)), None)
        return _Staged(tree, extensions, proposals, added, removed, psk_ids, ext_init, path_required, reinit,
                       own_update_priv)

    def _resolve_psks(self, psk_ids, psk_values) -> list[tuple[PreSharedKeyID, bytes]]:
        out = []
        for pid in psk_ids:
            if pid.psktype == PSK_EXTERNAL:
                value = psk_values.get(pid.psk_id)
                if value is None:
                    raise ProposalError(f"unknown external PSK {pid.psk_id.hex()}")
            else:
                value = None
                if pid.psk_group_id == self.group_id:
                    value = self.secrets.resumption_psk if pid.psk_epoch == self.epoch else \
                        self.resumption.get(pid.psk_epoch)
                if value is None:
                    raise ProposalError(f"unknown resumption PSK (epoch {pid.psk_epoch})")
            out.append((pid, value))
        return out

    def _advance(self, staged: _Staged, content: FramedContent, wire_format: int, signature: bytes,
                 commit_secret: bytes, init_secret: bytes | None, psk_values: dict) -> "Group":
        """Move this (already copied) group to the next epoch; returns it with the new confirmation tag."""
        confirmed = ks.confirmed_transcript_hash(self.interim, wire_format, content.encode(), signature)
        tree = staged.tree
        context = GroupContext(MLS10, self.context.cipher_suite, self.group_id, self.epoch + 1, tree.tree_hash(),
                               confirmed, staged.extensions)
        psk_secret = ks.psk_secret(self._resolve_psks(staged.psk_ids, psk_values))
        secrets = ks.advance(self.secrets.init_secret if init_secret is None else init_secret, commit_secret,
                             psk_secret, context.encode())
        tag = crypto.mac(secrets.confirmation_key, confirmed)
        resumption = dict(self.resumption)
        if self.secrets is not None:  # None for an external joiner: it has no past epoch
            resumption[self.epoch] = self.secrets.resumption_psk
        for e in sorted(resumption)[:-RESUMPTION_HISTORY]:
            del resumption[e]
        new = Group(context, tree, self.own_leaf, self.signature_priv, self.privs, secrets,
                    SecretTree(secrets.encryption_secret, tree.n_leaves), ks.interim_transcript_hash(confirmed, tag),
                    tag, {}, resumption, {}, True, None)
        if self.own_leaf in staged.removed:
            new.active = False
        if staged.reinit is not None:
            new.active, new.reinit = False, staged.reinit
        new._prune_privs()
        return new

    def _prune_privs(self) -> None:
        """Forget private keys for nodes that were blanked or replaced."""
        for node_index in list(self.privs):
            node = self.tree.nodes[node_index] if node_index < len(self.tree.nodes) else None
            if node is None or crypto.hpke_public(self.privs[node_index]) != node.encryption_key:
                del self.privs[node_index]

    # -- processing -----------------------------------------------------------------------------

    def process(self, message: bytes, *, psks: dict[bytes, bytes] | None = None,
                external_commit_policy: ExternalCommitPolicy | None = None,
                validate: Callable[["CommitView"], None] | None = None, app_data_updater=None,
                now: int | None = None) -> Processed:
        """Process one MLSMessage from another member (or an external joiner).

        `psks` maps external PSK ids to their values. `validate`, if given, sees every Commit (its
        proposals, sender and authenticated data) before it is applied and raises to refuse it.
        Leaf lifetimes in received Commits are checked only when `now` is given (see spec note).
        """
        self._require_active()
        msg = MLSMessage.decode(message)
        if msg.wire_format == WF_PUBLIC_MESSAGE:
            pm: PublicMessage = msg.body
            content, auth = pm.content, pm.auth
            self._check_epoch(content.group_id, content.epoch)
            if content.content_type == CT_APPLICATION:
                raise ValidationError("application data must be sent as a PrivateMessage")
            if content.sender.sender_type == SENDER_MEMBER:
                check_membership_tag(pm, self.context, self.secrets.membership_key)
            g = self.copy()
        elif msg.wire_format == WF_PRIVATE_MESSAGE:
            prm: PrivateMessage = msg.body
            self._check_epoch(prm.group_id, prm.epoch)
            g = self.copy()
            content, auth = unprotect_private(prm, g.secret_tree, g.secrets.sender_data_secret)
        else:
            raise UnsupportedError(f"wire format {msg.wire_format} is not a group message")
        wf = msg.wire_format
        sender = content.sender
        sender_leaf = None
        if sender.sender_type == SENDER_MEMBER:
            sender_leaf = g.tree.leaf(sender.index)
            if sender_leaf is None:
                raise ValidationError(f"sender leaf {sender.index} is blank or outside the tree")
            verify_content(wf, content, auth, g.context, sender_leaf.signature_key)
        elif wf != WF_PUBLIC_MESSAGE:
            raise ValidationError("non-member senders must use PublicMessage")
        elif sender.sender_type == SENDER_EXTERNAL:
            ext = g.context.extension(EXT_EXTERNAL_SENDERS)
            keys = _external_senders(ext.extension_data) if ext else []
            if sender.index >= len(keys):
                raise ValidationError(f"unknown external sender {sender.index}")
            verify_content(wf, content, auth, None, keys[sender.index])
        elif sender.sender_type == SENDER_NEW_MEMBER_PROPOSAL:
            if content.content_type != CT_PROPOSAL or not isinstance(content.content, Add):
                raise ValidationError("a new_member_proposal must be an Add")
            verify_content(wf, content, auth, None, content.content.key_package.leaf_node.signature_key)
        elif sender.sender_type == SENDER_NEW_MEMBER_COMMIT:
            if content.content_type != CT_COMMIT or content.content.path is None:
                raise ValidationError("a new_member_commit must be a Commit with a path")
            verify_content(wf, content, auth, g.context, content.content.path.leaf_node.signature_key)
        if content.content_type == CT_APPLICATION:
            return Processed(g, "application", sender, sender_leaf, content.authenticated_data,
                             application_data=content.content, epoch=g.epoch)
        if content.content_type == CT_PROPOSAL:
            p = content.content
            if p.proposal_type == P_EXTERNAL_INIT:
                raise ProposalError("ExternalInit is only valid inline in an External Commit")
            _check_proposal_alone(p, g)
            if isinstance(p, SelfRemove) and (sender.sender_type != SENDER_MEMBER or wf != WF_PUBLIC_MESSAGE):
                raise ProposalError("a SelfRemove must be a member's PublicMessage")
            if isinstance(p, Update):
                if sender.sender_type != SENDER_MEMBER:
                    raise ProposalError("Update from a non-member")
                _check_leaf(p.leaf_node, g.tree, g.context.extensions, source=SRC_UPDATE, group_id=g.group_id,
                            leaf_index=sender.index, replacing=sender.index)
            ref = crypto.make_proposal_ref(authenticated_content(wf, content, auth))
            g.pending[ref] = (p, sender)
            return Processed(g, "proposal", sender, sender_leaf, content.authenticated_data, proposal=p,
                             epoch=g.epoch)
        return g._process_commit(content, auth, wf, sender_leaf, psks or {}, external_commit_policy, validate,
                                 app_data_updater, now)

    def _check_epoch(self, group_id: bytes, epoch: int) -> None:
        if group_id != self.group_id:
            raise EpochError("message for another group")
        if epoch != self.epoch:
            raise EpochError(f"message for epoch {epoch}, the group is at epoch {self.epoch}")

    def _process_commit(self, content: FramedContent, auth: FramedContentAuthData, wf: int, sender_leaf,
                        psks, policy, validate, app_data_updater, now) -> Processed:
        sender = content.sender
        commit: Commit = content.content
        if sender.sender_type == SENDER_MEMBER and sender.index == self.own_leaf:
            raise StateError("this is our own Commit: adopt the group state commit() returned instead")
        if sender.sender_type not in (SENDER_MEMBER, SENDER_NEW_MEMBER_COMMIT):
            raise ValidationError("only members and external joiners can commit")
        if auth.confirmation_tag is None:
            raise ValidationError("commit without confirmation tag")
        items = []
        for p in commit.proposals:
            if isinstance(p, ProposalRef):
                if p.ref not in self.pending:
                    raise ProposalError(f"commit references an unknown proposal {p.ref.hex()}")
                prop, s = self.pending[p.ref]
                items.append((prop, s, p.ref))
            else:
                items.append((p, sender, None))
        external = sender.sender_type == SENDER_NEW_MEMBER_COMMIT
        joiner_leaf = commit.path.leaf_node if commit.path else None
        if external:
            policy = policy or RFC_EXTERNAL_COMMIT_POLICY
            if policy.check is not None:
                view_tree = self.tree.copy()
                # where the joiner lands: the leftmost blank leaf after the Removes
                for p, _, _ in items:
                    if isinstance(p, Remove) and view_tree.leaf(p.removed) is not None:
                        view_tree.remove_leaf(p.removed)
                landing = next((i // 2 for i in range(0, len(view_tree.nodes), 2) if view_tree.nodes[i] is None),
                               view_tree.n_leaves)
                policy.check(ExternalCommitView(self.context, self.tree, joiner_leaf, landing,
                                                tuple(p for p, _, _ in items), content.authenticated_data))
        if validate is not None:
            validate(CommitView(self.context, self.tree, sender, joiner_leaf, tuple(p for p, _, _ in items),
                                content.authenticated_data, tuple(s for _, s, _ in items)))
        staged = self._stage(items, sender, psks, now, app_data_updater, policy, joiner_leaf,
                             content.authenticated_data)
        if staged.path_required and commit.path is None:
            raise ValidationError("this Commit needs a path")
        tree = staged.tree
        commit_secret = ks.ZERO
        init_secret = None
        if external:
            ext_priv, _ = self.secrets.external_keypair()
            init_secret = crypto.export_receiver(ext_priv, staged.external_init.kem_output,
                                                 ks.EXTERNAL_INIT_LABEL, crypto.NH)
            committer_index = tree.add_leaf(joiner_leaf)
        else:
            committer_index = sender.index
        if own_priv := staged.own_update_priv:
            self.privs = {2 * self.own_leaf: own_priv}
        if commit.path is not None:
            path = commit.path
            _check_leaf(path.leaf_node, tree, staged.extensions, source=SRC_COMMIT, group_id=self.group_id,
                        leaf_index=committer_index, replacing=committer_index,
                        skip_node=2 * committer_index if external else None)
            fdp = tree.filtered_direct_path(committer_index)
            if len(path.nodes) != len(fdp):
                raise ValidationError(f"update path has {len(path.nodes)} nodes, the filtered direct path {len(fdp)}")
            keys = [n.encryption_key for n in path.nodes]
            if len(set(keys)) != len(keys) or path.leaf_node.encryption_key in keys or any(
                    node is not None and node.encryption_key in keys for node in tree.nodes):
                raise TreeError("update path reuses an encryption key")
            parent_hash = tree.set_path(committer_index, [(fdp[i][0], keys[i]) for i in range(len(fdp))])
            if path.leaf_node.parent_hash != parent_hash:
                raise TreeError("committer leaf parent_hash does not match the update path")
            tree.set_node(2 * committer_index, path.leaf_node)
            if self.own_leaf not in staged.removed:
                provisional = GroupContext(MLS10, self.context.cipher_suite, self.group_id, self.epoch + 1,
                                           tree.tree_hash(), self.context.confirmed_transcript_hash,
                                           staged.extensions)
                held, commit_secret, _ = decrypt_path(tree, fdp, path.nodes, self.own_leaf, self.privs,
                                                   provisional.encode(), {i for i, _ in staged.added})
                self.privs.update(held)
        if self.own_leaf in staged.removed:
            # We cannot derive the new epoch (the path is not encrypted to us); the commit is signed
            # (and membership-tagged) by a member of our epoch, which is all a removed member can check.
            gone = self.copy()
            gone.active = False
            return Processed(gone, "commit", sender, sender_leaf, content.authenticated_data,
                             proposals=tuple(staged.proposals), removed_self=True, epoch=self.epoch)
        new = self._advance(staged, content, wf, auth.signature, commit_secret, init_secret, psks)
        if not crypto.hmac.compare_digest(new.confirmation_tag, auth.confirmation_tag):
            raise ConfirmationTagError("commit confirmation tag does not verify")
        return Processed(new, "commit", sender, sender_leaf or joiner_leaf, content.authenticated_data,
                         proposals=tuple(staged.proposals), removed_self=not new.active and new.reinit is None,
                         epoch=new.epoch)


@dataclass(frozen=True)
class CommitView:
    """A Commit as received, before anything is applied (for `Group.process(validate=...)`)."""

    parent_context: GroupContext
    tree: RatchetTree
    sender: Sender
    path_leaf: LeafNode | None
    proposals: tuple
    authenticated_data: bytes
    proposal_senders: tuple = ()  # the Sender of each proposal (the committer for inline ones)


# -- joining --------------------------------------------------------------------------------------

def _verified_group_info(group_info: bytes | GroupInfo, ratchet_tree: bytes | None) -> tuple[GroupInfo, RatchetTree]:
    if isinstance(group_info, GroupInfo):
        gi = group_info
    else:
        msg = MLSMessage.decode(group_info)
        if msg.wire_format != WF_GROUP_INFO:
            raise ValidationError("not a GroupInfo message")
        gi = msg.body
    crypto.require_suite(gi.group_context.cipher_suite)
    if gi.group_context.version != MLS10:
        raise UnsupportedError(f"protocol version {gi.group_context.version}")
    ext = gi.extension(EXT_RATCHET_TREE)
    if ext is not None:
        tree = RatchetTree.decode(ext.extension_data)
    elif ratchet_tree is not None:
        tree = RatchetTree.decode(ratchet_tree)
    else:
        raise ValidationError("no ratchet tree: neither in the GroupInfo nor given")
    if tree.tree_hash() != gi.group_context.tree_hash:
        raise TreeError("ratchet tree does not match the GroupContext tree hash")
    tree.verify_parent_hashes()
    tree.verify_leaves(gi.group_context.group_id)
    _check_tree_leaves(tree, gi.group_context.extensions)
    signer = tree.leaf(gi.signer)
    if signer is None:
        raise ValidationError("GroupInfo signer is not a member")
    crypto.require_signature(signer.signature_key, b"GroupInfoTBS", gi.tbs(), gi.signature, "GroupInfo")
    return gi, tree


def join_from_welcome(welcome: bytes, key_package: KeyPackageSecrets | bytes, *,
                      ratchet_tree: bytes | None = None, psks: dict[bytes, bytes] | None = None) -> Group:
    """Join a group from a Welcome addressed to one of our KeyPackages (§12.4.3.1)."""
    if isinstance(key_package, (bytes, bytearray)):
        key_package = KeyPackageSecrets.from_bytes(key_package)
    msg = MLSMessage.decode(welcome)
    if msg.wire_format != WF_WELCOME:
        raise ValidationError("not a Welcome message")
    w: Welcome = msg.body
    crypto.require_suite(w.cipher_suite)
    ref = key_package_ref(key_package.key_package)
    entry = next((s for s in w.secrets if s.new_member == ref), None)
    if entry is None:
        raise StateError("the Welcome is not addressed to this KeyPackage")
    ct = entry.encrypted_group_secrets
    gs = decode_exact(crypto.decrypt_with_label(key_package.init_priv, b"Welcome", w.encrypted_group_info,
                                                ct.kem_output, ct.ciphertext), GroupSecrets.read)
    values = []
    for pid in gs.psks:
        if pid.psktype != PSK_EXTERNAL or (psks or {}).get(pid.psk_id) is None:
            raise ProposalError("the Welcome needs a PSK we do not have")
        values.append((pid, psks[pid.psk_id]))
    psk_secret = ks.psk_secret(values)
    member_prk = crypto.extract(gs.joiner_secret, psk_secret)
    key, nonce = ks.welcome_key_nonce(crypto.derive_secret(member_prk, b"welcome"))
    gi = decode_exact(crypto.aead_open(key, nonce, b"", w.encrypted_group_info), GroupInfo.read)
    gi, tree = _verified_group_info(gi, ratchet_tree)
    context = gi.group_context
    own = next((i for i, leaf in tree.leaves() if leaf.encode() == key_package.key_package.leaf_node.encode()), None)
    if own is None:
        raise StateError("our leaf is not in the group's tree")
    privs = {2 * own: key_package.encryption_priv}
    if gs.path_secret is not None:
        fdp = tree.filtered_direct_path(gi.signer)
        lca = common_ancestor(2 * own, 2 * gi.signer)
        k = next((j for j, (node, _) in enumerate(fdp) if node == lca), None)
        if k is None:
            raise ValidationError("path secret given but the common ancestor is not on the signer's path")
        _, keys, _ = derive_path(len(fdp) - k, gs.path_secret)
        for j, (priv, pub) in enumerate(keys):
            node = tree.nodes[fdp[k + j][0]]
            if node is None or node.encryption_key != pub:
                raise TreeError("path secret does not match the tree")
            privs[fdp[k + j][0]] = priv
    secrets = ks.from_joiner(gs.joiner_secret, psk_secret, context.encode())
    if not crypto.hmac.compare_digest(crypto.mac(secrets.confirmation_key, context.confirmed_transcript_hash),
                                      gi.confirmation_tag):
        raise ConfirmationTagError("GroupInfo confirmation tag does not verify")
    return Group(context, tree, own, key_package.signature_priv, privs, secrets,
                 SecretTree(secrets.encryption_secret, tree.n_leaves),
                 ks.interim_transcript_hash(context.confirmed_transcript_hash, gi.confirmation_tag),
                 gi.confirmation_tag)


def _group_info_context(group_info: bytes) -> GroupContext:
    """The GroupContext of a GroupInfo message, decoded only (its signature was verified before)."""
    msg = MLSMessage.decode(group_info)
    if msg.wire_format != WF_GROUP_INFO:
        raise ValidationError("not a GroupInfo message")
    return msg.body.group_context


@dataclass(frozen=True)
class PendingExternalJoin:
    """An External Commit (§12.4.3.2) whose joining leaf is already fixed, built in two steps.

    `prepare_external_join` fixes every input of the joiner's LeafNode (signature and encryption
    keys, path secret, ExternalInit, and the Remove and PreSharedKey proposals it was given), so
    `leaf_node` is byte for byte the leaf the Commit will carry, parent hash and signature included:
    something else (an authorization bound to that exact leaf, say) can be made over it before the
    Commit exists. `finish` then appends proposals that leave the tree as it is (an AppEphemeral, a
    PreSharedKey) and builds the Commit. Holds private keys: keep `to_bytes()` private.
    """

    group_info: bytes
    ratchet_tree: bytes | None
    signature_priv: bytes
    encryption_priv: bytes
    path_secret: bytes
    init_secret: bytes
    leaf_node: LeafNode  # the exact joining leaf (what an authorization over "the joining leaf" binds)
    proposals: tuple  # ExternalInit first, then the Remove and PreSharedKeys fixed by prepare
    psk_values: dict  # external PSK id -> value, for the PreSharedKey proposals
    _verified: list = field(default_factory=list, repr=False, compare=False)  # (GroupInfo, tree) once checked

    def __repr__(self) -> str:  # no private keys or PSK values
        return f"<PendingExternalJoin group={self.group_context.group_id.hex()} epoch={self.group_context.epoch}>"

    @property
    def group_context(self) -> GroupContext:
        """The GroupContext the Commit applies to (the candidate parent state)."""
        return _group_info_context(self.group_info)

    def to_bytes(self) -> bytes:
        return cbor2.dumps({
            "v": STATE_VERSION, "group_info": self.group_info, "ratchet_tree": self.ratchet_tree,
            "sig": self.signature_priv, "enc": self.encryption_priv, "path_secret": self.path_secret,
            "init_secret": self.init_secret, "leaf": self.leaf_node.encode(),
            "proposals": [encode_proposal(p) for p in self.proposals], "psks": self.psk_values,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> "PendingExternalJoin":
        try:
            obj = cbor2.loads(data)
            if not isinstance(obj, dict) or obj.get("v") != STATE_VERSION:
                raise StateError("not pending External Commit bytes of a known version")
            return cls(obj["group_info"], obj["ratchet_tree"], obj["sig"], obj["enc"], obj["path_secret"],
                       obj["init_secret"], LeafNode.decode(obj["leaf"]),
                       tuple(decode_proposal(p) for p in obj["proposals"]), dict(obj["psks"]))
        except MLSError:
            raise
        except Exception as exc:
            raise StateError(f"invalid pending External Commit bytes: {type(exc).__name__}: {exc}") from None

    def _group_info_and_tree(self) -> tuple[GroupInfo, RatchetTree]:
        if not self._verified:
            self._verified.append(_verified_group_info(self.group_info, self.ratchet_tree))
        gi, tree = self._verified[0]
        return gi, tree.copy()

    def _build(self, extra: Iterable, authenticated_data: bytes, encrypt: bool):
        gi, tree = self._group_info_and_tree()
        context = gi.group_context
        props = [*self.proposals, *extra]
        leaf = self.leaf_node
        g = Group(context, tree, -1, self.signature_priv, {}, None, SecretTree(None, 1),
                  ks.interim_transcript_hash(context.confirmed_transcript_hash, gi.confirmation_tag),
                  gi.confirmation_tag)
        me = Sender(SENDER_NEW_MEMBER_COMMIT)
        draft_leaf = LeafNode(leaf.encryption_key, leaf.signature_key, leaf.credential, leaf.capabilities,
                              SRC_COMMIT, None, b"", leaf.extensions)
        policy = ExternalCommitPolicy(frozenset(p.proposal_type for p in props))
        staged = g._stage([(p, me, None) for p in props], me, self.psk_values, None, None, policy, draft_leaf,
                          authenticated_data)
        own = staged.tree.add_leaf(draft_leaf)
        path, privs, _, _, commit_secret = _encap(staged.tree, own, draft_leaf, self.signature_priv, context,
                                                  staged.extensions, set(), check=True,
                                                  leaf_key=(self.encryption_priv, leaf.encryption_key),
                                                  path_secret=self.path_secret, encrypt=encrypt)
        return g, staged, props, path, privs, own, commit_secret

    def finish(self, proposals: Iterable = (), *, authenticated_data: bytes = b"") -> tuple[Group, bytes]:
        """The External Commit (ExternalInit, the prepared proposals, then `proposals`) and our state in
        the new epoch. Proposals that would change the joining leaf (a Remove, say) belong to
        prepare: they are refused here (ValidationError), as is anything that fails an MLS rule."""
        g, staged, props, path, privs, own, commit_secret = self._build(proposals, authenticated_data, True)
        if path.leaf_node.encode() != self.leaf_node.encode():
            raise ValidationError("these proposals change the joining leaf: give them to prepare_external_join")
        context = g.context
        content = FramedContent(context.group_id, context.epoch, Sender(SENDER_NEW_MEMBER_COMMIT),
                                authenticated_data, CT_COMMIT, Commit(tuple(props), path))
        signature = sign_content(WF_PUBLIC_MESSAGE, content, context, self.signature_priv)
        g.own_leaf, g.privs = own, privs
        new = g._advance(staged, content, WF_PUBLIC_MESSAGE, signature, commit_secret, self.init_secret,
                         self.psk_values)
        auth = FramedContentAuthData(signature, new.confirmation_tag)
        return new, MLSMessage(WF_PUBLIC_MESSAGE, PublicMessage(content, auth, None)).encode()


def prepare_external_join(group_info: bytes, credential: Credential | bytes, signature_priv: bytes | None = None, *,
                          capabilities: Capabilities | None = None, leaf_extensions: Iterable[Extension] = (),
                          external_psks: dict[bytes, bytes] | None = None, remove_leaf: int | None = None,
                          ratchet_tree: bytes | None = None) -> PendingExternalJoin:
    """Step one of an External Commit: verify the GroupInfo and tree, fix the joining leaf.

    `external_psks` maps PSK ids to values; each becomes one PreSharedKey proposal (fresh nonce),
    in the given order; `remove_leaf` adds the resync Remove. Without `capabilities`, the leaf
    advertises what the group requires (`capabilities_for`). The returned `leaf_node` is exactly
    the leaf `finish` puts in the Commit.
    """
    if isinstance(credential, (bytes, bytearray)):
        credential = Credential.basic(bytes(credential))
    if signature_priv is None:
        signature_priv, _ = crypto.signature_keypair()
    verified = _verified_group_info(group_info, ratchet_tree)
    gi = verified[0]
    context = gi.group_context
    if capabilities is None:
        capabilities = capabilities_for(context)
    ext = gi.extension(EXT_EXTERNAL_PUB)
    if ext is None:
        raise ValidationError("GroupInfo has no external_pub extension")
    external_pub = decode_exact(ext.extension_data, Reader.vl)
    kem_output, init_secret = crypto.export_sender(external_pub, ks.EXTERNAL_INIT_LABEL, crypto.NH)
    psk_values = dict(external_psks or {})
    props: list = [ExternalInit(kem_output)]
    if remove_leaf is not None:
        props.append(Remove(remove_leaf))
    props += [PreSharedKey(PreSharedKeyID.external(pid, crypto.random_bytes())) for pid in psk_values]
    enc_priv, enc_pub = crypto.hpke_keypair()
    # A placeholder leaf: everything but the parent hash and signature, which the staged tree decides.
    leaf = LeafNode(enc_pub, crypto.signature_public(signature_priv), credential, capabilities, SRC_COMMIT, None,
                    b"", tuple(leaf_extensions))
    pending = PendingExternalJoin(bytes(group_info), ratchet_tree, signature_priv, enc_priv, crypto.random_bytes(),
                                  init_secret, leaf, tuple(props), psk_values, [verified])
    path = pending._build((), b"", False)[3]
    return PendingExternalJoin(pending.group_info, ratchet_tree, signature_priv, enc_priv, pending.path_secret,
                               init_secret, path.leaf_node, tuple(props), psk_values, [verified])


def external_join(group_info: bytes, credential: Credential | bytes, signature_priv: bytes | None = None, *,
                  capabilities: Capabilities | None = None, leaf_extensions: Iterable[Extension] = (),
                  external_psks: dict[bytes, bytes] | None = None, proposals: Iterable = (),
                  remove_leaf: int | None = None, ratchet_tree: bytes | None = None,
                  authenticated_data: bytes = b"") -> tuple[Group, bytes]:
    """Join by External Commit (§12.4.3.2) in one step: returns our state in the new epoch and the Commit.

    The same as `prepare_external_join(...).finish(proposals, authenticated_data=...)`: `proposals`
    are appended inline as given (e.g. an AppEphemeral).
    """
    pending = prepare_external_join(group_info, credential, signature_priv, capabilities=capabilities,
                                    leaf_extensions=leaf_extensions, external_psks=external_psks,
                                    remove_leaf=remove_leaf, ratchet_tree=ratchet_tree)
    return pending.finish(proposals, authenticated_data=authenticated_data)


def _encap(tree: RatchetTree, leaf_index: int, leaf: LeafNode, signature_priv: bytes, context: GroupContext,
           extensions, exclude, check: bool = False, *, leaf_key: tuple[bytes, bytes] | None = None,
           path_secret: bytes | None = None, encrypt: bool = True):
    """TreeKEM for a committer at `leaf_index` of the staged `tree` (changed in place): leaf key,
    path secrets and keys on the filtered direct path, parent hashes, signed leaf, path secrets
    encrypted under the provisional GroupContext. Returns (UpdatePath, {node: priv}, filtered direct
    path, path secrets, commit secret). `leaf` supplies everything but the keys and parent hash;
    `leaf_key` (priv, pub) and `path_secret` are fresh unless given (a prepared External Commit
    fixes them); `encrypt=False` leaves the path nodes out (only the leaf is wanted)."""
    fdp = tree.filtered_direct_path(leaf_index)
    path_secrets, keys, commit_secret = derive_path(len(fdp), path_secret or crypto.random_bytes())
    leaf_priv, leaf_pub = leaf_key or crypto.hpke_keypair()
    parent_hash = tree.set_path(leaf_index, [(fdp[i][0], keys[i][1]) for i in range(len(fdp))])
    leaf = _sign_leaf(LeafNode(leaf_pub, leaf.signature_key, leaf.credential, leaf.capabilities, SRC_COMMIT, None,
                               parent_hash, leaf.extensions), signature_priv, context.group_id, leaf_index)
    if check:
        _check_leaf(leaf, tree, extensions, source=SRC_COMMIT, group_id=context.group_id, leaf_index=leaf_index,
                    replacing=leaf_index, skip_node=2 * leaf_index)
    tree.set_node(2 * leaf_index, leaf)
    nodes: tuple = ()
    if encrypt:
        provisional = GroupContext(MLS10, context.cipher_suite, context.group_id, context.epoch + 1,
                                   tree.tree_hash(), context.confirmed_transcript_hash, tuple(extensions))
        nodes = encrypt_path(tree, fdp, path_secrets, [k[1] for k in keys], provisional.encode(), exclude)
    privs = {2 * leaf_index: leaf_priv, **{fdp[i][0]: keys[i][0] for i in range(len(fdp))}}
    return UpdatePath(leaf, nodes), privs, fdp, path_secrets, commit_secret


# -- leaf validation (§7.3) -----------------------------------------------------------------------------

def _check_unique_extensions(exts, where: str) -> None:
    types = [e.extension_type for e in exts]
    if len(types) != len(set(types)):
        raise ValidationError(f"duplicate extension type in {where}")


def _required(exts) -> RequiredCapabilities | None:
    ext = find_extension(exts, EXT_REQUIRED_CAPABILITIES)
    return RequiredCapabilities.decode(ext.extension_data) if ext else None


def check_leaf_supports(leaf: LeafNode, group_extensions, what: str = "the leaf") -> None:
    """Raise TreeError unless the leaf supports the group's extensions and required capabilities."""
    _check_leaf_supports(leaf, tuple(group_extensions), what)


def external_join_landing(tree: RatchetTree) -> int:
    """The leaf index an External Commit without Removes gives its joiner: the leftmost blank leaf."""
    return next((i // 2 for i in range(0, len(tree.nodes), 2) if tree.nodes[i] is None), tree.n_leaves)


def verify_leaf_signature(leaf: LeafNode, group_id: bytes, leaf_index: int) -> None:
    """Raise SignatureError unless the leaf's signature verifies (for update/commit leaves, at that
    place in that group)."""
    crypto.require_signature(leaf.signature_key, b"LeafNodeTBS", leaf.tbs(group_id, leaf_index), leaf.signature,
                             "the leaf node")


def _check_leaf_supports(leaf: LeafNode, group_exts, what: str) -> None:
    caps = leaf.capabilities
    for e in group_exts:
        if e.extension_type not in DEFAULT_EXTENSIONS and e.extension_type not in caps.extensions:
            raise TreeError(f"{what} does not support group extension 0x{e.extension_type:04x}")
    req = _required(group_exts)
    if req is not None:
        for t in req.extension_types:
            if t not in DEFAULT_EXTENSIONS and t not in caps.extensions:
                raise TreeError(f"{what} lacks required extension 0x{t:04x}")
        for t in req.proposal_types:
            if t not in DEFAULT_PROPOSALS and t not in caps.proposals:
                raise TreeError(f"{what} lacks required proposal 0x{t:04x}")
        for t in req.credential_types:
            if t not in caps.credentials:
                raise TreeError(f"{what} lacks required credential type 0x{t:04x}")


class _KeyIndex:
    """What leaf validation needs to know about a tree, gathered once (adds update it as they go)."""

    def __init__(self, tree: RatchetTree):
        # key -> every leaf (signature) or node (encryption) holding it: a leaf being checked may
        # already sit in the tree (an External Commit's joiner), so "another holder" means any other
        self.signature_keys: dict[bytes, list[int]] = {}
        self.encryption_keys: dict[bytes, list[int]] = {}
        for i, leaf in tree.leaves():
            self.signature_keys.setdefault(leaf.signature_key, []).append(i)
        for i, node in enumerate(tree.nodes):
            if node is not None:
                self.encryption_keys.setdefault(node.encryption_key, []).append(i)
        self.cred_types: dict[int, int] = {}  # credential type -> how many leaves use it
        self.supported: dict[int, int] = {}  # credential type -> how many leaves support it
        self.n = 0
        for _, leaf in tree.leaves():
            self.add(leaf, None)

    def add(self, leaf: LeafNode, node_index: int | None) -> None:
        self.n += 1
        t = leaf.credential.credential_type
        self.cred_types[t] = self.cred_types.get(t, 0) + 1
        for c in set(leaf.capabilities.credentials):
            self.supported[c] = self.supported.get(c, 0) + 1
        if node_index is not None:
            self.signature_keys.setdefault(leaf.signature_key, []).append(node_index // 2)
            self.encryption_keys.setdefault(leaf.encryption_key, []).append(node_index)


def _check_leaf_alone(leaf: LeafNode, group_exts, what: str) -> None:
    """The §7.3 rules one leaf meets on its own: version and suite, its extensions listed in its
    capabilities, its own credential type supported, and the group's requirements."""
    caps = leaf.capabilities
    if MLS10 not in caps.versions or crypto.CIPHER_SUITE not in caps.cipher_suites:
        raise TreeError(f"{what} does not support this protocol version and cipher suite")
    _check_unique_extensions(leaf.extensions, f"{what} node")
    for e in leaf.extensions:
        if e.extension_type not in DEFAULT_EXTENSIONS and e.extension_type not in caps.extensions:
            raise TreeError(f"{what} carries extension 0x{e.extension_type:04x} it does not list in its capabilities")
    _check_leaf_supports(leaf, group_exts, what)
    if leaf.credential.credential_type not in caps.credentials:
        raise TreeError(f"{what} does not support its own credential type")


def _check_tree_leaves(tree: RatchetTree, group_exts) -> None:
    """§12.4.3.1: every leaf of a tree we join is valid by §7.3 (signatures and key uniqueness are
    RatchetTree.verify_leaves'), and every member supports every credential type in use."""
    used: set[int] = set()
    supported: set[int] | None = None
    for i, leaf in tree.leaves():
        _check_leaf_alone(leaf, group_exts, f"leaf {i}")
        used.add(leaf.credential.credential_type)
        caps = set(leaf.capabilities.credentials)
        supported = caps if supported is None else supported & caps
    missing = used - (supported or set())
    if missing:
        raise TreeError(f"credential type(s) {sorted(missing)} in use are not supported by every member")


def _check_psk_id(pid: PreSharedKeyID) -> None:
    """§12.1.4: external or application-resumption PSKs only, with a KDF.Nh nonce."""
    if pid.psktype != PSK_EXTERNAL and pid.usage != RESUMPTION_APPLICATION:
        raise ProposalError("a PreSharedKey proposal may only use external or application resumption PSKs")
    if len(pid.psk_nonce) != crypto.NH:
        raise ProposalError("psk_nonce must be KDF.Nh bytes")


def _check_proposal_alone(p, group: "Group") -> None:
    """The §12.1 rules a proposal received on its own must meet in this epoch whatever Commit later
    carries it, so that one that can never be valid is refused at once instead of waiting in the
    pending list and failing every default commit(). List rules (§12.2) wait for the Commit."""
    if isinstance(p, Add):
        verify_key_package(p.key_package)
        if p.key_package.cipher_suite != group.context.cipher_suite:
            raise ProposalError("Add with another cipher suite")
    elif isinstance(p, Remove):
        if group.tree.leaf(p.removed) is None:
            raise ProposalError(f"Remove of blank or unknown leaf {p.removed}")
    elif isinstance(p, PreSharedKey):
        _check_psk_id(p.psk)
    elif p.proposal_type == P_REINIT:
        _check_reinit(p, group.context)


def _check_reinit(p, context: GroupContext) -> None:
    """§12.1.5: a ReInit may not move the group to an older protocol version."""
    if p.version < context.version:
        raise ProposalError(f"ReInit to protocol version {p.version}, older than the group's {context.version}")


def _check_proposal_support(types, tree: RatchetTree, added: set[int]) -> None:
    """§12.2: a proposal of a non-default type must be supported by every member that will process
    the Commit (members it adds or removes need not support it; removed ones are blank already)."""
    custom = {t for t in types if t not in DEFAULT_PROPOSALS}
    if not custom:
        return
    for i, leaf in tree.leaves():
        if i in added:
            continue
        lacking = custom - set(leaf.capabilities.proposals)
        if lacking:
            raise ProposalError(f"leaf {i} does not support proposal type(s) "
                                f"{', '.join(f'0x{t:04x}' for t in sorted(lacking))}")


def _check_leaf(leaf: LeafNode, tree: RatchetTree, group_exts, *, source: int, group_id: bytes,
                leaf_index: int | None, replacing: int | None, now: int | None = None,
                skip_node: int | None = None, index: _KeyIndex | None = None) -> None:
    """Leaf node validation against the tree it joins (signature, capabilities, uniqueness, lifetime)."""
    if leaf.leaf_node_source != source:
        raise TreeError(f"leaf node source {leaf.leaf_node_source}, expected {source}")
    if source != SRC_KEY_PACKAGE:
        crypto.require_signature(leaf.signature_key, b"LeafNodeTBS", leaf.tbs(group_id, leaf_index), leaf.signature,
                                 "leaf node")
    _check_leaf_alone(leaf, group_exts, "leaf")
    caps = leaf.capabilities
    if source == SRC_KEY_PACKAGE and now is not None and leaf.lifetime is not None:
        if not leaf.lifetime.not_before <= now <= leaf.lifetime.not_after:
            raise TreeError("leaf lifetime is not current")
    if index is None:
        index = _KeyIndex(tree)
    holder = next((i for i in index.signature_keys.get(leaf.signature_key, ()) if i != replacing), None)
    if holder is not None:
        raise TreeError(f"signature key already used by leaf {holder}")
    if any(i != skip_node for i in index.encryption_keys.get(leaf.encryption_key, ())):
        raise TreeError("encryption key already used in the tree")
    # every other member must support this credential type, and this leaf every type in use
    others = index.n - (1 if replacing is not None and tree.leaf(replacing) is not None else 0)
    t = leaf.credential.credential_type
    own = tree.leaf(replacing) if replacing is not None else None
    supporting = index.supported.get(t, 0) - (1 if own is not None and t in own.capabilities.credentials else 0)
    if supporting < others:
        raise TreeError(f"not every member supports credential type {t}")
    for used, count in index.cred_types.items():
        if own is not None and own.credential.credential_type == used:
            count -= 1
        if count > 0 and used not in caps.credentials:
            raise TreeError(f"leaf does not support credential type {used} used in the group")


def _external_senders(data: bytes) -> list[bytes]:
    def item(r: Reader):
        key = r.vl()
        Credential.read(r)
        return key
    return decode_exact(data, lambda r: r.vl_list(item))


def _apply_app_data_updates(extensions, updates, updater) -> tuple:
    ext = find_extension(extensions, EXT_APP_DATA_DICTIONARY)
    entries = dict(decode_app_data_dictionary(ext.extension_data)) if ext else {}
    by_component: dict[int, list] = {}
    for u in updates:
        by_component.setdefault(u.component_id, []).append(u)
    for cid, ups in by_component.items():
        if all(u.op == APP_DATA_OP_REMOVE for u in ups) and len(ups) == 1:
            entries.pop(cid, None)
            continue
        if updater is None:
            raise UnsupportedError(f"AppDataUpdate for component 0x{cid:04x} needs an app_data_updater")
        new = updater(cid, entries.get(cid), [(u.op, u.update) for u in ups])
        if new is None:
            entries.pop(cid, None)
        else:
            entries[cid] = bytes(new)
    new_ext = Extension(EXT_APP_DATA_DICTIONARY, encode_app_data_dictionary(entries.items()))
    out = [e for e in extensions if e.extension_type != EXT_APP_DATA_DICTIONARY]
    if ext is not None:
        out.insert(list(extensions).index(ext), new_ext)
    else:
        out.append(new_ext)
    return tuple(out)


__all__ = ["Group", "KeyPackageSecrets", "create_key_package", "parse_key_package", "verify_key_package",
           "key_package_ref", "join_from_welcome", "external_join", "prepare_external_join", "PendingExternalJoin",
           "ExternalCommitPolicy", "ExternalCommitView",
           "RFC_EXTERNAL_COMMIT_POLICY", "CommitOutcome", "Processed", "Member", "CommitView",
           "decode_app_data_dictionary", "encode_app_data_dictionary", "external_pub_extension", "capabilities_for"]
