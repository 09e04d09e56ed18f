"""RFC 9420 structures with strict TLS encode/decode (plus the MLS extensions draft proposals).

Every class has `encode() -> bytes` and `read(r: Reader)`; `decode(data)` reads exactly `data`.
Objects are treated as immutable once built: code that "changes" a node builds a new one, so
trees and states can be copied cheaply. Unknown extension, proposal and credential types are
kept as their exact bytes (`opaque<V>` bodies, as OpenMLS and mls-rs frame them), so they
re-encode byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codec import Reader, decode_exact, optional, u8, u16, u32, u64, vl, vl_list
from .errors import DecodeError, ValidationError

# -- registries (RFC 9420 §17, draft-ietf-mls-extensions) ---------------------------------------
MLS10 = 1

WF_PUBLIC_MESSAGE = 1
WF_PRIVATE_MESSAGE = 2
WF_WELCOME = 3
WF_GROUP_INFO = 4
WF_KEY_PACKAGE = 5

CT_APPLICATION = 1
CT_PROPOSAL = 2
CT_COMMIT = 3

SENDER_MEMBER = 1
SENDER_EXTERNAL = 2
SENDER_NEW_MEMBER_PROPOSAL = 3
SENDER_NEW_MEMBER_COMMIT = 4

NODE_LEAF = 1
NODE_PARENT = 2

SRC_KEY_PACKAGE = 1
SRC_UPDATE = 2
SRC_COMMIT = 3

CRED_BASIC = 1
CRED_X509 = 2

EXT_APPLICATION_ID = 0x0001
EXT_RATCHET_TREE = 0x0002
EXT_REQUIRED_CAPABILITIES = 0x0003
EXT_EXTERNAL_PUB = 0x0004
EXT_EXTERNAL_SENDERS = 0x0005
EXT_APP_DATA_DICTIONARY = 0x0006  # draft-ietf-mls-extensions
DEFAULT_EXTENSIONS = frozenset({1, 2, 3, 4, 5})

P_ADD = 1
P_UPDATE = 2
P_REMOVE = 3
P_PSK = 4
P_REINIT = 5
P_EXTERNAL_INIT = 6
P_GROUP_CONTEXT_EXTENSIONS = 7
P_APP_DATA_UPDATE = 0x0008  # draft-ietf-mls-extensions
P_APP_EPHEMERAL = 0x0009  # draft-ietf-mls-extensions
P_SELF_REMOVE = 0x000A  # draft-ietf-mls-extensions: a member removes itself (empty body)
DEFAULT_PROPOSALS = frozenset({1, 2, 3, 4, 5, 6, 7})

PSK_EXTERNAL = 1
PSK_RESUMPTION = 2
RESUMPTION_APPLICATION = 1
RESUMPTION_REINIT = 2
RESUMPTION_BRANCH = 3


def _check_enum(value: int, allowed, what: str) -> int:
    if value not in allowed:
        raise DecodeError(f"invalid {what} {value}")
    return value


def _u16_list(r: Reader) -> list[int]:
    return r.vl_list(Reader.u16)


def _enc_u16_list(values) -> bytes:
    return vl(b"".join(u16(v) for v in values))


# -- extensions -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Extension:
    extension_type: int
    extension_data: bytes

    def encode(self) -> bytes:
        return u16(self.extension_type) + vl(self.extension_data)

    @classmethod
    def read(cls, r: Reader) -> "Extension":
        return cls(r.u16(), r.vl())


def _repeated_type(exts) -> int | None:
    seen = set()
    for e in exts:
        if e.extension_type in seen:
            return e.extension_type
        seen.add(e.extension_type)
    return None


def enc_extensions(exts) -> bytes:
    """Extension extensions<V>; a list never carries one type twice (RFC 9420 §13.4)."""
    if (t := _repeated_type(exts)) is not None:
        raise ValidationError(f"extension type 0x{t:04x} appears twice in one extension list")
    return vl_list(e.encode() for e in exts)


def read_extensions(r: Reader) -> list[Extension]:
    exts = r.vl_list(Extension.read)
    if (t := _repeated_type(exts)) is not None:
        raise DecodeError(f"extension type 0x{t:04x} appears twice in one extension list")
    return exts


def find_extension(exts, extension_type: int) -> Extension | None:
    for e in exts:
        if e.extension_type == extension_type:
            return e
    return None


@dataclass(frozen=True)
class RequiredCapabilities:
    extension_types: tuple[int, ...] = ()
    proposal_types: tuple[int, ...] = ()
    credential_types: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return (_enc_u16_list(self.extension_types) + _enc_u16_list(self.proposal_types)
                + _enc_u16_list(self.credential_types))

    @classmethod
    def read(cls, r: Reader) -> "RequiredCapabilities":
        return cls(tuple(_u16_list(r)), tuple(_u16_list(r)), tuple(_u16_list(r)))

    @classmethod
    def decode(cls, data: bytes) -> "RequiredCapabilities":
        return decode_exact(data, cls.read)


# -- credentials, capabilities, lifetime ----------------------------------------------------------

@dataclass(frozen=True)
class Credential:
    """A credential: `credential_type` plus its body. Basic credentials expose `identity`."""

    credential_type: int
    body: bytes  # basic: identity; x509: the encoded certificates<V> body; other: opaque<V> body

    @classmethod
    def basic(cls, identity: bytes) -> "Credential":
        return cls(CRED_BASIC, identity)

    @property
    def identity(self) -> bytes | None:
        return self.body if self.credential_type == CRED_BASIC else None

    def encode(self) -> bytes:
        return u16(self.credential_type) + vl(self.body)

    @classmethod
    def read(cls, r: Reader) -> "Credential":
        ctype = r.u16()
        if ctype == CRED_X509:
            sub = r.sub()
            body = sub.data[sub.pos:sub.end]
            while not sub.done():  # certificates<V>: each opaque cert_data<V>
                sub.vl()
            return cls(ctype, body)
        return cls(ctype, r.vl())


@dataclass(frozen=True)
class Capabilities:
    versions: tuple[int, ...] = (MLS10,)
    cipher_suites: tuple[int, ...] = (1,)
    extensions: tuple[int, ...] = ()
    proposals: tuple[int, ...] = ()
    credentials: tuple[int, ...] = (CRED_BASIC,)

    def encode(self) -> bytes:
        return (_enc_u16_list(self.versions) + _enc_u16_list(self.cipher_suites) + _enc_u16_list(self.extensions)
                + _enc_u16_list(self.proposals) + _enc_u16_list(self.credentials))

    @classmethod
    def read(cls, r: Reader) -> "Capabilities":
        return cls(tuple(_u16_list(r)), tuple(_u16_list(r)), tuple(_u16_list(r)), tuple(_u16_list(r)),
                   tuple(_u16_list(r)))


@dataclass(frozen=True)
class Lifetime:
    not_before: int
    not_after: int

    def encode(self) -> bytes:
        return u64(self.not_before) + u64(self.not_after)

    @classmethod
    def read(cls, r: Reader) -> "Lifetime":
        return cls(r.u64(), r.u64())


# -- leaf and parent nodes ------------------------------------------------------------------------

@dataclass(frozen=True)
class LeafNode:
    encryption_key: bytes
    signature_key: bytes
    credential: Credential
    capabilities: Capabilities
    leaf_node_source: int
    lifetime: Lifetime | None = None
    parent_hash: bytes = b""
    extensions: tuple[Extension, ...] = ()
    signature: bytes = b""

    def _content(self) -> bytes:
        out = [vl(self.encryption_key), vl(self.signature_key), self.credential.encode(),
               self.capabilities.encode(), u8(self.leaf_node_source)]
        if self.leaf_node_source == SRC_KEY_PACKAGE:
            out.append(self.lifetime.encode())
        elif self.leaf_node_source == SRC_COMMIT:
            out.append(vl(self.parent_hash))
        out.append(enc_extensions(self.extensions))
        return b"".join(out)

    def tbs(self, group_id: bytes = b"", leaf_index: int = 0) -> bytes:
        """LeafNodeTBS (group_id and leaf_index only count for update/commit sources)."""
        content = self._content()
        if self.leaf_node_source in (SRC_UPDATE, SRC_COMMIT):
            content += vl(group_id) + u32(leaf_index)
        return content

    def encode(self) -> bytes:
        enc = self.__dict__.get("_enc")
        if enc is None:
            enc = self._content() + vl(self.signature)
            object.__setattr__(self, "_enc", enc)
        return enc

    @classmethod
    def read(cls, r: Reader) -> "LeafNode":
        start = r.pos
        enc_key = r.vl()
        sig_key = r.vl()
        cred = Credential.read(r)
        caps = Capabilities.read(r)
        source = _check_enum(r.u8(), (1, 2, 3), "leaf_node_source")
        lifetime = Lifetime.read(r) if source == SRC_KEY_PACKAGE else None
        parent_hash = r.vl() if source == SRC_COMMIT else b""
        exts = tuple(read_extensions(r))
        sig = r.vl()
        node = cls(enc_key, sig_key, cred, caps, source, lifetime, parent_hash, exts, sig)
        object.__setattr__(node, "_enc", r.slice_since(start))
        return node

    @classmethod
    def decode(cls, data: bytes) -> "LeafNode":
        return decode_exact(data, cls.read)

    def extension(self, extension_type: int) -> Extension | None:
        return find_extension(self.extensions, extension_type)


@dataclass(frozen=True)
class ParentNode:
    encryption_key: bytes
    parent_hash: bytes = b""
    unmerged_leaves: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return vl(self.encryption_key) + vl(self.parent_hash) + vl(b"".join(u32(x) for x in self.unmerged_leaves))

    @classmethod
    def read(cls, r: Reader) -> "ParentNode":
        return cls(r.vl(), r.vl(), tuple(r.vl_list(Reader.u32)))


def encode_node(node) -> bytes:
    if isinstance(node, LeafNode):
        return u8(NODE_LEAF) + node.encode()
    return u8(NODE_PARENT) + node.encode()


def read_node(r: Reader):
    t = r.u8()
    if t == NODE_LEAF:
        return LeafNode.read(r)
    if t == NODE_PARENT:
        return ParentNode.read(r)
    raise DecodeError(f"invalid node type {t}")


# -- key packages -----------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyPackage:
    version: int
    cipher_suite: int
    init_key: bytes
    leaf_node: LeafNode
    extensions: tuple[Extension, ...] = ()
    signature: bytes = b""

    def tbs(self) -> bytes:
        return (u16(self.version) + u16(self.cipher_suite) + vl(self.init_key) + self.leaf_node.encode()
                + enc_extensions(self.extensions))

    def encode(self) -> bytes:
        enc = self.__dict__.get("_enc")
        if enc is None:
            enc = self.tbs() + vl(self.signature)
            object.__setattr__(self, "_enc", enc)
        return enc

    @classmethod
    def read(cls, r: Reader) -> "KeyPackage":
        start = r.pos
        kp = cls(r.u16(), r.u16(), r.vl(), LeafNode.read(r), tuple(read_extensions(r)), r.vl())
        object.__setattr__(kp, "_enc", r.slice_since(start))
        return kp

    @classmethod
    def decode(cls, data: bytes) -> "KeyPackage":
        return decode_exact(data, cls.read)


# -- pre-shared keys ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PreSharedKeyID:
    psktype: int
    psk_id: bytes = b""  # external
    usage: int = 0  # resumption
    psk_group_id: bytes = b""
    psk_epoch: int = 0
    psk_nonce: bytes = b""

    @classmethod
    def external(cls, psk_id: bytes, nonce: bytes) -> "PreSharedKeyID":
        return cls(PSK_EXTERNAL, psk_id=psk_id, psk_nonce=nonce)

    @classmethod
    def resumption(cls, usage: int, group_id: bytes, epoch: int, nonce: bytes) -> "PreSharedKeyID":
        return cls(PSK_RESUMPTION, usage=usage, psk_group_id=group_id, psk_epoch=epoch, psk_nonce=nonce)

    def encode(self) -> bytes:
        if self.psktype == PSK_EXTERNAL:
            body = vl(self.psk_id)
        else:
            body = u8(self.usage) + vl(self.psk_group_id) + u64(self.psk_epoch)
        return u8(self.psktype) + body + vl(self.psk_nonce)

    @classmethod
    def read(cls, r: Reader) -> "PreSharedKeyID":
        t = _check_enum(r.u8(), (PSK_EXTERNAL, PSK_RESUMPTION), "psktype")
        if t == PSK_EXTERNAL:
            return cls(t, psk_id=r.vl(), psk_nonce=r.vl())
        usage = _check_enum(r.u8(), (1, 2, 3), "resumption usage")
        return cls(t, usage=usage, psk_group_id=r.vl(), psk_epoch=r.u64(), psk_nonce=r.vl())


# -- proposals --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Add:
    key_package: KeyPackage
    proposal_type = P_ADD

    def encode_body(self) -> bytes:
        return self.key_package.encode()


@dataclass(frozen=True)
class Update:
    leaf_node: LeafNode
    proposal_type = P_UPDATE

    def encode_body(self) -> bytes:
        return self.leaf_node.encode()


@dataclass(frozen=True)
class Remove:
    removed: int
    proposal_type = P_REMOVE

    def encode_body(self) -> bytes:
        return u32(self.removed)


@dataclass(frozen=True)
class PreSharedKey:
    psk: PreSharedKeyID
    proposal_type = P_PSK

    def encode_body(self) -> bytes:
        return self.psk.encode()


@dataclass(frozen=True)
class ReInit:
    group_id: bytes
    version: int
    cipher_suite: int
    extensions: tuple[Extension, ...] = ()
    proposal_type = P_REINIT

    def encode_body(self) -> bytes:
        return vl(self.group_id) + u16(self.version) + u16(self.cipher_suite) + enc_extensions(self.extensions)


@dataclass(frozen=True)
class ExternalInit:
    kem_output: bytes
    proposal_type = P_EXTERNAL_INIT

    def encode_body(self) -> bytes:
        return vl(self.kem_output)


@dataclass(frozen=True)
class GroupContextExtensions:
    extensions: tuple[Extension, ...]
    proposal_type = P_GROUP_CONTEXT_EXTENSIONS

    def encode_body(self) -> bytes:
        return enc_extensions(self.extensions)


APP_DATA_OP_UPDATE = 1
APP_DATA_OP_REMOVE = 2


@dataclass(frozen=True)
class AppDataUpdate:
    """draft-ietf-mls-extensions AppDataUpdate: update (with bytes) or remove one component."""

    component_id: int
    op: int
    update: bytes = b""
    proposal_type = P_APP_DATA_UPDATE

    def encode_body(self) -> bytes:
        body = u16(self.component_id) + u8(self.op)
        return body + vl(self.update) if self.op == APP_DATA_OP_UPDATE else body


@dataclass(frozen=True)
class AppEphemeral:
    """draft-ietf-mls-extensions AppEphemeral: component data that lives for one Commit."""

    component_id: int
    data: bytes
    proposal_type = P_APP_EPHEMERAL

    def encode_body(self) -> bytes:
        return u16(self.component_id) + vl(self.data)


@dataclass(frozen=True)
class SelfRemove:
    """draft-ietf-mls-extensions SelfRemove (`struct {}`): its sender's leaf is removed when another
    member commits it (by reference; path required, like a Remove)."""

    proposal_type = P_SELF_REMOVE

    def encode_body(self) -> bytes:
        return b""


@dataclass(frozen=True)
class UnknownProposal:
    """A proposal type this core does not interpret: body kept as its exact opaque<V> bytes."""

    proposal_type: int
    body: bytes

    def encode_body(self) -> bytes:
        return vl(self.body)


def encode_proposal(p) -> bytes:
    return u16(p.proposal_type) + p.encode_body()


def read_proposal(r: Reader):
    t = r.u16()
    if t == P_ADD:
        return Add(KeyPackage.read(r))
    if t == P_UPDATE:
        return Update(LeafNode.read(r))
    if t == P_REMOVE:
        return Remove(r.u32())
    if t == P_PSK:
        return PreSharedKey(PreSharedKeyID.read(r))
    if t == P_REINIT:
        return ReInit(r.vl(), r.u16(), r.u16(), tuple(read_extensions(r)))
    if t == P_EXTERNAL_INIT:
        return ExternalInit(r.vl())
    if t == P_GROUP_CONTEXT_EXTENSIONS:
        return GroupContextExtensions(tuple(read_extensions(r)))
    if t == P_APP_DATA_UPDATE:
        cid = r.u16()
        op = _check_enum(r.u8(), (APP_DATA_OP_UPDATE, APP_DATA_OP_REMOVE), "AppDataUpdate operation")
        return AppDataUpdate(cid, op, r.vl() if op == APP_DATA_OP_UPDATE else b"")
    if t == P_APP_EPHEMERAL:
        return AppEphemeral(r.u16(), r.vl())
    if t == P_SELF_REMOVE:
        return SelfRemove()
    if t == 0:
        raise DecodeError("reserved proposal type 0")
    return UnknownProposal(t, r.vl())


def decode_proposal(data: bytes):
    return decode_exact(data, read_proposal)


@dataclass(frozen=True)
class ProposalRef:
    ref: bytes


def encode_proposal_or_ref(p) -> bytes:
    if isinstance(p, ProposalRef):
        return u8(2) + vl(p.ref)
    return u8(1) + encode_proposal(p)


def read_proposal_or_ref(r: Reader):
    t = r.u8()
    if t == 1:
        return read_proposal(r)
    if t == 2:
        return ProposalRef(r.vl())
    raise DecodeError(f"invalid ProposalOrRefType {t}")


# -- update path and commit -------------------------------------------------------------------

@dataclass(frozen=True)
class HPKECiphertext:
    kem_output: bytes
    ciphertext: bytes

    def encode(self) -> bytes:
        return vl(self.kem_output) + vl(self.ciphertext)

    @classmethod
    def read(cls, r: Reader) -> "HPKECiphertext":
        return cls(r.vl(), r.vl())


@dataclass(frozen=True)
class UpdatePathNode:
    encryption_key: bytes
    encrypted_path_secret: tuple[HPKECiphertext, ...]

    def encode(self) -> bytes:
        return vl(self.encryption_key) + vl_list(c.encode() for c in self.encrypted_path_secret)

    @classmethod
    def read(cls, r: Reader) -> "UpdatePathNode":
        return cls(r.vl(), tuple(r.vl_list(HPKECiphertext.read)))


@dataclass(frozen=True)
class UpdatePath:
    leaf_node: LeafNode
    nodes: tuple[UpdatePathNode, ...]

    def encode(self) -> bytes:
        return self.leaf_node.encode() + vl_list(n.encode() for n in self.nodes)

    @classmethod
    def read(cls, r: Reader) -> "UpdatePath":
        return cls(LeafNode.read(r), tuple(r.vl_list(UpdatePathNode.read)))


@dataclass(frozen=True)
class Commit:
    proposals: tuple = ()
    path: UpdatePath | None = None

    def encode(self) -> bytes:
        return (vl_list(encode_proposal_or_ref(p) for p in self.proposals)
                + optional(self.path.encode() if self.path else None))

    @classmethod
    def read(cls, r: Reader) -> "Commit":
        return cls(tuple(r.vl_list(read_proposal_or_ref)), r.optional(UpdatePath.read))

    @classmethod
    def decode(cls, data: bytes) -> "Commit":
        return decode_exact(data, cls.read)


# -- group context, framing -------------------------------------------------------------------

@dataclass(frozen=True)
class GroupContext:
    version: int
    cipher_suite: int
    group_id: bytes
    epoch: int
    tree_hash: bytes
    confirmed_transcript_hash: bytes
    extensions: tuple[Extension, ...] = ()

    def encode(self) -> bytes:
        return (u16(self.version) + u16(self.cipher_suite) + vl(self.group_id) + u64(self.epoch)
                + vl(self.tree_hash) + vl(self.confirmed_transcript_hash) + enc_extensions(self.extensions))

    @classmethod
    def read(cls, r: Reader) -> "GroupContext":
        return cls(r.u16(), r.u16(), r.vl(), r.u64(), r.vl(), r.vl(), tuple(read_extensions(r)))

    @classmethod
    def decode(cls, data: bytes) -> "GroupContext":
        return decode_exact(data, cls.read)

    def extension(self, extension_type: int) -> Extension | None:
        return find_extension(self.extensions, extension_type)


@dataclass(frozen=True)
class Sender:
    sender_type: int
    index: int = 0  # leaf_index (member) or sender_index (external)

    def encode(self) -> bytes:
        if self.sender_type in (SENDER_MEMBER, SENDER_EXTERNAL):
            return u8(self.sender_type) + u32(self.index)
        return u8(self.sender_type)

    @classmethod
    def read(cls, r: Reader) -> "Sender":
        t = _check_enum(r.u8(), (1, 2, 3, 4), "sender type")
        return cls(t, r.u32() if t in (SENDER_MEMBER, SENDER_EXTERNAL) else 0)


def encode_content_body(content_type: int, content) -> bytes:
    if content_type == CT_APPLICATION:
        return vl(content)
    if content_type == CT_PROPOSAL:
        return encode_proposal(content)
    return content.encode()


def read_content_body(r: Reader, content_type: int):
    if content_type == CT_APPLICATION:
        return r.vl()
    if content_type == CT_PROPOSAL:
        return read_proposal(r)
    if content_type == CT_COMMIT:
        return Commit.read(r)
    raise DecodeError(f"invalid content type {content_type}")


@dataclass(frozen=True)
class FramedContent:
    group_id: bytes
    epoch: int
    sender: Sender
    authenticated_data: bytes
    content_type: int
    content: object  # bytes (application), a proposal, or a Commit

    def encode(self) -> bytes:
        return (vl(self.group_id) + u64(self.epoch) + self.sender.encode() + vl(self.authenticated_data)
                + u8(self.content_type) + encode_content_body(self.content_type, self.content))

    @classmethod
    def read(cls, r: Reader) -> "FramedContent":
        gid, epoch, sender, aad = r.vl(), r.u64(), Sender.read(r), r.vl()
        ct = _check_enum(r.u8(), (1, 2, 3), "content type")
        return cls(gid, epoch, sender, aad, ct, read_content_body(r, ct))


@dataclass(frozen=True)
class FramedContentAuthData:
    signature: bytes
    confirmation_tag: bytes | None = None  # commits only

    def encode(self) -> bytes:
        out = vl(self.signature)
        return out + vl(self.confirmation_tag) if self.confirmation_tag is not None else out

    @classmethod
    def read(cls, r: Reader, content_type: int) -> "FramedContentAuthData":
        sig = r.vl()
        return cls(sig, r.vl() if content_type == CT_COMMIT else None)


@dataclass(frozen=True)
class AuthenticatedContent:
    wire_format: int
    content: FramedContent
    auth: FramedContentAuthData

    def encode(self) -> bytes:
        return u16(self.wire_format) + self.content.encode() + self.auth.encode()

    @classmethod
    def read(cls, r: Reader) -> "AuthenticatedContent":
        wf = r.u16()
        content = FramedContent.read(r)
        return cls(wf, content, FramedContentAuthData.read(r, content.content_type))

    @classmethod
    def decode(cls, data: bytes) -> "AuthenticatedContent":
        return decode_exact(data, cls.read)


def framed_content_tbs(wire_format: int, content: FramedContent, context: GroupContext | None) -> bytes:
    out = u16(MLS10) + u16(wire_format) + content.encode()
    if content.sender.sender_type in (SENDER_MEMBER, SENDER_NEW_MEMBER_COMMIT):
        out += context.encode()
    return out


@dataclass(frozen=True)
class PublicMessage:
    content: FramedContent
    auth: FramedContentAuthData
    membership_tag: bytes | None = None

    def encode(self) -> bytes:
        out = self.content.encode() + self.auth.encode()
        if self.content.sender.sender_type == SENDER_MEMBER:
            out += vl(self.membership_tag)
        return out

    @classmethod
    def read(cls, r: Reader) -> "PublicMessage":
        content = FramedContent.read(r)
        auth = FramedContentAuthData.read(r, content.content_type)
        tag = r.vl() if content.sender.sender_type == SENDER_MEMBER else None
        return cls(content, auth, tag)


@dataclass(frozen=True)
class PrivateMessage:
    group_id: bytes
    epoch: int
    content_type: int
    authenticated_data: bytes
    encrypted_sender_data: bytes
    ciphertext: bytes

    def encode(self) -> bytes:
        return (vl(self.group_id) + u64(self.epoch) + u8(self.content_type) + vl(self.authenticated_data)
                + vl(self.encrypted_sender_data) + vl(self.ciphertext))

    @classmethod
    def read(cls, r: Reader) -> "PrivateMessage":
        gid, epoch = r.vl(), r.u64()
        ct = _check_enum(r.u8(), (1, 2, 3), "content type")
        return cls(gid, epoch, ct, r.vl(), r.vl(), r.vl())


# -- group info and welcome -------------------------------------------------------------------

@dataclass(frozen=True)
class GroupInfo:
    group_context: GroupContext
    extensions: tuple[Extension, ...]
    confirmation_tag: bytes
    signer: int
    signature: bytes = b""

    def tbs(self) -> bytes:
        return (self.group_context.encode() + enc_extensions(self.extensions) + vl(self.confirmation_tag)
                + u32(self.signer))

    def encode(self) -> bytes:
        return self.tbs() + vl(self.signature)

    @classmethod
    def read(cls, r: Reader) -> "GroupInfo":
        return cls(GroupContext.read(r), tuple(read_extensions(r)), r.vl(), r.u32(), r.vl())

    def extension(self, extension_type: int) -> Extension | None:
        return find_extension(self.extensions, extension_type)


@dataclass(frozen=True)
class GroupSecrets:
    joiner_secret: bytes
    path_secret: bytes | None
    psks: tuple[PreSharedKeyID, ...] = ()

    def encode(self) -> bytes:
        return (vl(self.joiner_secret) + optional(vl(self.path_secret) if self.path_secret is not None else None)
                + vl_list(p.encode() for p in self.psks))

    @classmethod
    def read(cls, r: Reader) -> "GroupSecrets":
        return cls(r.vl(), r.optional(Reader.vl), tuple(r.vl_list(PreSharedKeyID.read)))


@dataclass(frozen=True)
class EncryptedGroupSecrets:
    new_member: bytes
    encrypted_group_secrets: HPKECiphertext

    def encode(self) -> bytes:
        return vl(self.new_member) + self.encrypted_group_secrets.encode()

    @classmethod
    def read(cls, r: Reader) -> "EncryptedGroupSecrets":
        return cls(r.vl(), HPKECiphertext.read(r))


@dataclass(frozen=True)
class Welcome:
    cipher_suite: int
    secrets: tuple[EncryptedGroupSecrets, ...]
    encrypted_group_info: bytes

    def encode(self) -> bytes:
        return u16(self.cipher_suite) + vl_list(s.encode() for s in self.secrets) + vl(self.encrypted_group_info)

    @classmethod
    def read(cls, r: Reader) -> "Welcome":
        return cls(r.u16(), tuple(r.vl_list(EncryptedGroupSecrets.read)), r.vl())


# -- MLSMessage -------------------------------------------------------------------------------

_BODY = {
    WF_PUBLIC_MESSAGE: PublicMessage,
    WF_PRIVATE_MESSAGE: PrivateMessage,
    WF_WELCOME: Welcome,
    WF_GROUP_INFO: GroupInfo,
    WF_KEY_PACKAGE: KeyPackage,
}


@dataclass(frozen=True)
class MLSMessage:
    wire_format: int
    body: object
    version: int = MLS10

    def encode(self) -> bytes:
        return u16(self.version) + u16(self.wire_format) + self.body.encode()

    @classmethod
    def read(cls, r: Reader) -> "MLSMessage":
        version = r.u16()
        if version != MLS10:
            raise DecodeError(f"unsupported protocol version {version}")
        wf = r.u16()
        body_cls = _BODY.get(wf)
        if body_cls is None:
            raise DecodeError(f"unsupported wire format {wf}")
        return cls(wf, body_cls.read(r), version)

    @classmethod
    def decode(cls, data: bytes) -> "MLSMessage":
        return decode_exact(data, cls.read)


def encode_ratchet_tree(nodes) -> bytes:
    """optional<Node> ratchet_tree<V>, trailing blank nodes omitted."""
    end = len(nodes)
    while end > 0 and nodes[end - 1] is None:
        end -= 1
    return vl_list(optional(encode_node(n) if n is not None else None) for n in nodes[:end])


def read_ratchet_tree_nodes(r: Reader) -> list:
    return r.vl_list(lambda rr: rr.optional(read_node))



