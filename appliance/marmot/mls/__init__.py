"""An RFC 9420 MLS core for cipher suite 0x0001, pure: state in and out as bytes.

    Group                       one member's state in one epoch; operations return new Groups
      .create / .from_bytes / .to_bytes
      .commit(add=, remove=, psks=, proposals=, ...) -> CommitOutcome(group, message, welcome)
      .propose(proposal) / .propose_update()
      .process(message, psks=, external_commit_policy=, validate=) -> Processed
      .encrypt(data) -> (group, message)
      .group_info() / .export_secret(label, context, length) / .members()
    check_leaf_supports / verify_leaf_signature / external_join_landing   review a joining leaf
    create_key_package(...)     -> KeyPackageSecrets (public KeyPackage + private keys)
    join_from_welcome(...)      -> Group
    external_join(group_info, ..., external_psks=, proposals=) -> (Group, commit message)
    prepare_external_join(group_info, ...) -> PendingExternalJoin   the same in two steps: its
        .leaf_node is the exact joining leaf; .finish(proposals) -> (Group, commit message)
    ExternalCommitPolicy        which extra proposals an External Commit may carry, plus a check

Modules: codec (TLS/MLS and QUIC-varint codecs), treemath, crypto (suite 1 over `cryptography`
and `pyhpke`), structs (wire structures), tree (ratchet tree, TreeKEM), keyschedule, secrettree,
framing, group (the engine). Errors: see `errors` (MLSError and its tree).
"""

from .errors import (
    ConfirmationTagError,
    DecodeError,
    DecryptError,
    EpochError,
    MembershipTagError,
    MLSError,
    ProposalError,
    SignatureError,
    StateError,
    TreeError,
    UnsupportedError,
    ValidationError,
)
from .group import (
    CommitOutcome,
    CommitView,
    ExternalCommitPolicy,
    ExternalCommitView,
    Group,
    KeyPackageSecrets,
    Member,
    PendingExternalJoin,
    Processed,
    RFC_EXTERNAL_COMMIT_POLICY,
    capabilities_for,
    check_leaf_supports,
    create_key_package,
    decode_app_data_dictionary,
    encode_app_data_dictionary,
    external_join,
    external_join_landing,
    join_from_welcome,
    key_package_ref,
    parse_key_package,
    prepare_external_join,
    verify_leaf_signature,
)
from .structs import (
    AppDataUpdate,
    AppEphemeral,
    Capabilities,
    Credential,
    Extension,
    GroupContext,
    GroupInfo,
    KeyPackage,
    LeafNode,
    Lifetime,
    MLSMessage,
    PreSharedKeyID,
    RequiredCapabilities,
    SelfRemove,
    UnknownProposal,
)

__all__ = [
    "AppDataUpdate", "AppEphemeral", "Capabilities", "CommitOutcome", "CommitView", "ConfirmationTagError",
    "Credential", "DecodeError", "DecryptError", "EpochError", "Extension", "ExternalCommitPolicy",
    "ExternalCommitView", "Group", "GroupContext", "GroupInfo", "KeyPackage", "KeyPackageSecrets", "LeafNode",
    "Lifetime", "MLSError", "MLSMessage", "MembershipTagError", "Member", "PendingExternalJoin", "PreSharedKeyID",
    "Processed",
    "ProposalError", "RFC_EXTERNAL_COMMIT_POLICY", "RequiredCapabilities", "SelfRemove", "SignatureError",
    "StateError",
    "TreeError", "UnknownProposal", "UnsupportedError", "ValidationError", "capabilities_for", "check_leaf_supports",
    "create_key_package", "decode_app_data_dictionary", "encode_app_data_dictionary", "external_join",
    "external_join_landing", "join_from_welcome", "key_package_ref", "parse_key_package", "prepare_external_join",
    "verify_leaf_signature",
]
