"""The Marmot MLS profile the appliance speaks: what its leaves advertise and carry, how it builds
groups, and how it reads group state (its own app components, or MDK's 0xf2ee group data).

- Every leaf (KeyPackage or group member) carries `marmot.member.account-identity-proof.v2`
  (component 0x8009) in its `app_data_dictionary` and lists the components it supports under
  `app_components` (0x0001); it advertises the extension and proposal types below, including
  MDK's 0xf2ee so the appliance can join MDK groups (spec note M4).
- Groups the appliance creates carry their state as app components: admin policy (0x8003) and
  Nostr routing (0x8004), required with 0x8009 through `app_components`; with the draft switch also
  the multi-device gate (0xf2f0, 0x0009, 0x800a). When an invitee's key package lacks the app
  components (an MDK 0.8.0 client), the group carries MDK's group data (0xf2ee) instead, written
  as MDK writes it (the "mdk" profile; spec note M24).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from appliance.nostr.event import Event
from appliance.nostr.keys import public_key

from . import components as comp
from . import mls, proofs, transport
from .errors import ComponentError, DraftDisabled, MarmotError, ProofError
from .extensions import EncryptedDeviceName, MultiDeviceExtension
from .mls import crypto
from .mls.codec import Reader, decode_exact, u16, vl
from .mls.structs import (
    EXT_APP_DATA_DICTIONARY,
    EXT_REQUIRED_CAPABILITIES,
    Capabilities,
    Credential,
    Extension,
    GroupContext,
    LeafNode,
    Lifetime,
    RequiredCapabilities,
)

__all__ = [
    "CIPHERSUITE",
    "SIGNATURE_SCHEME",
    "LEAF_EXTENSIONS",
    "LEAF_PROPOSALS",
    "SUPPORTED_COMPONENTS",
    "DRAFT_LEAF_EXTENSIONS",
    "DRAFT_LEAF_PROPOSALS",
    "DRAFT_COMPONENTS",
    "leaf_components",
    "encode_components_list",
    "decode_components_list",
    "leaf_capabilities",
    "leaf_extensions",
    "create_key_package",
    "key_package_event",
    "account_of_leaf",
    "group_extensions",
    "GroupState",
    "read_group_state",
    "required_components",
    "supported_components",
    "check_supports_required",
    "PROFILES",
    "lacks_components",
    "mdk_group_extensions",
]

CIPHERSUITE = crypto.CIPHER_SUITE
SIGNATURE_SCHEME = crypto.SIGNATURE_SCHEME

LEAF_EXTENSIONS = (comp.APP_DATA_DICTIONARY, comp.EXT_MDK_GROUP_DATA)
LEAF_PROPOSALS = (comp.APP_DATA_UPDATE, comp.SELF_REMOVE)
SUPPORTED_COMPONENTS = (comp.ADMIN_POLICY, comp.NOSTR_ROUTING, comp.ACCOUNT_IDENTITY_PROOF)
# What only a leaf made with the draft switch advertises (spec note M23): a device that would refuse
# the draft's External Commits must not look able to process them.
DRAFT_LEAF_EXTENSIONS = (comp.EXT_ENCRYPTED_DEVICE_NAME, comp.EXT_MULTI_DEVICE)
DRAFT_LEAF_PROPOSALS = (comp.APP_EPHEMERAL,)
DRAFT_COMPONENTS = (comp.MULTI_DEVICE_JOIN_AUTHORIZATION,)
# What a key package event's capability tags say: LastResort (0x000a) and the KeyPackage's own
# extension types. MDK 0.8.0 refuses an mls_proposals tag other than exactly 0x000a and requires
# 0x000a in mls_extensions (spec note M14); the KeyPackage's capabilities are what MLS negotiates on.
TAG_PROPOSALS = (comp.SELF_REMOVE,)
MAX_KEY_PACKAGE_LIFETIME = 7_261_200  # key-packages.md: 84 days plus a one-hour clock-skew margin


def encode_components_list(ids) -> bytes:
    """The upstream `ComponentsList` (`ComponentID component_ids<V>`, MLS encoding)."""
    return vl(b"".join(u16(i) for i in ids))


def decode_components_list(data: bytes) -> list[int]:
    return decode_exact(data, lambda r: r.vl_list(Reader.u16))


def leaf_capabilities(draft: bool = False) -> Capabilities:
    """What our leaves advertise; the draft multi-device parts only with the draft switch."""
    if draft:
        return Capabilities(extensions=LEAF_EXTENSIONS + DRAFT_LEAF_EXTENSIONS,
                            proposals=tuple(sorted(LEAF_PROPOSALS + DRAFT_LEAF_PROPOSALS)))
    return Capabilities(extensions=LEAF_EXTENSIONS, proposals=LEAF_PROPOSALS)


def leaf_components(draft: bool = False) -> tuple[int, ...]:
    return SUPPORTED_COMPONENTS + DRAFT_COMPONENTS if draft else SUPPORTED_COMPONENTS


def leaf_extensions(account_secret: str, signature_public: bytes, *, device_label: str | None = None,
                    created_at: int | None = None, draft: bool = False) -> tuple[Extension, ...]:
    """The leaf's app_data_dictionary (supported components + the 0x8009 proof), and a label if any
    (the label is part of the draft: it needs `draft`)."""
    if device_label is not None and not draft:
        raise DraftDisabled("a device label (0xf2ef) is part of the draft multi-device feature")
    proof = proofs.sign_proof(proofs.AccountIdentityBinding(CIPHERSUITE, SIGNATURE_SCHEME, signature_public),
                              account_secret, created_at)
    dictionary = mls.encode_app_data_dictionary([
        (comp.APP_COMPONENTS, encode_components_list(leaf_components(draft))),
        (comp.ACCOUNT_IDENTITY_PROOF, proof.encode()),
    ])
    exts = [Extension(EXT_APP_DATA_DICTIONARY, dictionary)]
    if device_label is not None:
        exts.append(Extension(comp.EXT_ENCRYPTED_DEVICE_NAME,
                              EncryptedDeviceName.seal(account_secret, device_label).encode()))
    return tuple(exts)


def lifetime(now: int | None = None) -> Lifetime:
    """key-packages.md: at most 84 days plus an hour of clock skew (7,261,200 s), starting an hour ago."""
    start = (int(time.time()) if now is None else now) - 3600
    return Lifetime(start, start + MAX_KEY_PACKAGE_LIFETIME)


def check_lifetime(leaf: LeafNode, now: int | None = None) -> None:
    now = int(time.time()) if now is None else now
    lt = leaf.lifetime
    if lt is None:
        raise ComponentError("the key package has no Lifetime", "key_package.lifetime")
    if not lt.not_before <= now <= lt.not_after:
        raise ComponentError("the key package is not current (outside its Lifetime)", "key_package.lifetime")
    if lt.not_after - lt.not_before > MAX_KEY_PACKAGE_LIFETIME:
        raise ComponentError("the key package's Lifetime is longer than 7,261,200 seconds", "key_package.lifetime")


def create_key_package(account_secret: str, *, device_label: str | None = None,
                       draft: bool = False) -> mls.KeyPackageSecrets:
    """A fresh KeyPackage for this account (new MLS signature key, 0x8009 proof over it); with
    `draft`, able to join draft multi-device groups."""
    sig_priv, sig_pub = crypto.signature_keypair()
    return mls.create_key_package(bytes.fromhex(public_key(account_secret)), sig_priv,
                                  capabilities=leaf_capabilities(draft), lifetime=lifetime(),
                                  leaf_extensions=leaf_extensions(account_secret, sig_pub, device_label=device_label,
                                                                  draft=draft))


def key_package_event(account_secret: str, kps: mls.KeyPackageSecrets, relays: list[str]) -> Event:
    """The signed kind 30443 event: the bare KeyPackage bytes (what MDK accepts; spec note M3)."""
    kp = kps.key_package
    extensions = [0x000A, *(e for e in kp.leaf_node.capabilities.extensions if e != 0x000A)]
    return transport.build_key_package_event(account_secret, kp.encode(), key_package_ref=mls.key_package_ref(kp),
                                             ciphersuite=CIPHERSUITE, extensions=extensions,
                                             proposals=list(TAG_PROPOSALS), relays=relays)


def app_data(extensions) -> dict[int, bytes]:
    ext = next((e for e in extensions if e.extension_type == EXT_APP_DATA_DICTIONARY), None)
    if ext is None:
        return {}
    try:
        return dict(mls.decode_app_data_dictionary(ext.extension_data))
    except mls.MLSError as exc:
        raise ComponentError(f"app_data_dictionary is malformed: {exc}", "component.dictionary") from None


def account_of_leaf(leaf: LeafNode, ciphersuite: int = CIPHERSUITE) -> bytes:
    """The account a leaf belongs to, after every 0x8009 rule (account-identity-proof-v2.md, Validation)."""
    identity = leaf.credential.identity
    if identity is None:
        raise ProofError("the leaf's credential is not a basic credential", "proof.credential_identity")
    if comp.APP_DATA_DICTIONARY not in leaf.capabilities.extensions:
        raise ProofError("the leaf does not carry an app_data_dictionary", "proof.component_absent")
    data = app_data(leaf.extensions)
    supported = decode_components_list(data[comp.APP_COMPONENTS]) if comp.APP_COMPONENTS in data else []
    if comp.ACCOUNT_IDENTITY_PROOF not in supported:
        raise ProofError("the leaf does not advertise component 0x8009", "proof.component_unsupported")
    if comp.ACCOUNT_IDENTITY_PROOF not in data:
        raise ProofError("the leaf has no account identity proof (0x8009)", "proof.component_absent")
    if ciphersuite != CIPHERSUITE:
        raise ProofError(f"ciphersuite 0x{ciphersuite:04x} is not supported", "proof.ciphersuite")
    proofs.verify_account_identity_proof(data[comp.ACCOUNT_IDENTITY_PROOF], credential_identity=identity,
                                         ciphersuite=ciphersuite, signature_scheme=SIGNATURE_SCHEME,
                                         mls_signature_key=leaf.signature_key)
    return identity


def check_group_context(context: GroupContext) -> None:
    """A component-profile group's GroupContext: requires 0x8009, and carries no data for the
    leaf-only 0x8009 or the commit-scoped 0x800a (account-identity-proof-v2 and
    multi-device-join-authorization-v1, valid locations)."""
    data = app_data(context.extensions)
    required = decode_components_list(data[comp.APP_COMPONENTS]) if comp.APP_COMPONENTS in data else []
    if comp.ACCOUNT_IDENTITY_PROOF not in required:
        raise ComponentError("the group does not require component 0x8009", "component.identity_proof_not_required")
    for cid in (comp.ACCOUNT_IDENTITY_PROOF, comp.MULTI_DEVICE_JOIN_AUTHORIZATION):
        if cid in data:
            raise ComponentError(f"component 0x{cid:04x} has data in the GroupContext, where it is invalid",
                                 "component.invalid_location")


def required_components(context: GroupContext) -> list[int]:
    """The component ids the GroupContext's `app_components` requires (none without the entry)."""
    data = app_data(context.extensions)
    if comp.APP_COMPONENTS not in data:
        return []
    try:
        return decode_components_list(data[comp.APP_COMPONENTS])
    except mls.MLSError as exc:
        raise ComponentError(f"app_components is malformed: {exc}", "component.app_components") from None


def supported_components(leaf: LeafNode) -> list[int]:
    """The component ids a LeafNode lists as supported in its `app_components` entry."""
    data = app_data(leaf.extensions)
    if comp.APP_COMPONENTS not in data:
        return []
    try:
        return decode_components_list(data[comp.APP_COMPONENTS])
    except mls.MLSError as exc:
        raise ComponentError(f"a leaf's app_components is malformed: {exc}", "component.app_components") from None


def check_supports_required(required, leaf: LeafNode, what: str = "the leaf") -> None:
    """app-components/README.md, Negotiation: a member that does not support every required
    component id MUST NOT join (and a group may not come to require one a member lacks)."""
    lacking = sorted(set(required) - set(supported_components(leaf)))
    if lacking:
        hint = ""
        if comp.MULTI_DEVICE_JOIN_AUTHORIZATION in lacking:  # a draft group: the key package lacks the draft
            hint = (" (0x800a is the draft multi-device join: make the key package with --draft-multi-device "
                    "or marmot_draft_multi_device = true)")
        raise ComponentError(f"{what} does not support required component(s) "
                             f"{', '.join(f'0x{c:04x}' for c in lacking)}{hint}", "component.unsupported")


def check_key_package_extensions(kp) -> None:
    """0x8009 lives in the LeafNode's dictionary, never in the KeyPackage-level one."""
    if comp.ACCOUNT_IDENTITY_PROOF in app_data(kp.extensions):
        raise ComponentError("component 0x8009 in the KeyPackage-level dictionary is invalid",
                             "component.invalid_location")


PROFILES = ("components", "mdk")
# What a components group requires of every member (without the draft parts).
COMPONENTS_REQUIRED = (comp.ADMIN_POLICY, comp.NOSTR_ROUTING, comp.ACCOUNT_IDENTITY_PROOF)


def lacks_components(leaf: LeafNode) -> str | None:
    """Why a key package's leaf cannot join a components group (it has no app components: an MDK
    0.8.0 client), or None when it can. A leaf that carries a 0x8009 proof is a components leaf:
    an invalid proof is refused later, never taken as a reason to fall back."""
    try:
        data = app_data(leaf.extensions)
        supported = supported_components(leaf)
    except ComponentError as exc:
        return exc.reason
    if comp.ACCOUNT_IDENTITY_PROOF in data:
        return None
    if comp.APP_DATA_DICTIONARY not in leaf.capabilities.extensions or not data:
        return "no app_data_dictionary (0x0006)"
    lacking = sorted(set(COMPONENTS_REQUIRED) - set(supported))
    if lacking:
        return f"no support for component(s) {', '.join(f'0x{c:04x}' for c in lacking)}"
    return "no account identity proof (0x8009)"


def mdk_group_extensions(group_data: comp.MdkGroupData, required_proposals=()) -> list[Extension]:
    """GroupContext extensions of an MDK-profile group, as MDK 0.8.0's create_group writes them: the
    group data (0xf2ee), then required_capabilities requiring extension 0xf2ee."""
    required = RequiredCapabilities((comp.EXT_MDK_GROUP_DATA,), tuple(required_proposals))
    return [Extension(comp.EXT_MDK_GROUP_DATA, group_data.encode()),
            Extension(EXT_REQUIRED_CAPABILITIES, required.encode())]


def group_extensions(*, admins, nostr_group_id: bytes, relays, multi_device: bool) -> list[Extension]:
    """GroupContext extensions of a group the appliance creates."""
    required = [comp.ADMIN_POLICY, comp.NOSTR_ROUTING, comp.ACCOUNT_IDENTITY_PROOF]
    req_ext, req_prop = [comp.APP_DATA_DICTIONARY], [comp.APP_DATA_UPDATE]
    if multi_device:
        required.append(comp.MULTI_DEVICE_JOIN_AUTHORIZATION)
        req_ext.append(comp.EXT_MULTI_DEVICE)
        req_prop.append(comp.APP_EPHEMERAL)
    dictionary = mls.encode_app_data_dictionary([
        (comp.APP_COMPONENTS, encode_components_list(required)),
        (comp.ADMIN_POLICY, comp.AdminPolicy.of(admins).encode()),
        (comp.NOSTR_ROUTING, comp.NostrRouting.of(nostr_group_id, relays).encode()),
    ])
    exts = [Extension(EXT_REQUIRED_CAPABILITIES, RequiredCapabilities(tuple(req_ext), tuple(req_prop)).encode()),
            Extension(EXT_APP_DATA_DICTIONARY, dictionary)]
    if multi_device:
        exts.append(Extension(comp.EXT_MULTI_DEVICE, MultiDeviceExtension().encode()))
    return exts


@dataclass(frozen=True)
class GroupState:
    """What Marmot reads from a GroupContext: routing and admins, from app components or MDK data."""

    profile: str                    # "components" or "mdk"
    nostr_group_id: bytes
    relays: list[str]
    admins: frozenset[bytes]
    required_components: tuple[int, ...]
    group_data: comp.MdkGroupData | None = None   # the 0xf2ee data of an MDK-profile group

    @property
    def h(self) -> str:
        return self.nostr_group_id.hex()


def read_group_state(context: GroupContext) -> GroupState:
    data = app_data(context.extensions)
    if comp.NOSTR_ROUTING in data:
        routing = comp.NostrRouting.decode(data[comp.NOSTR_ROUTING])
        admins = comp.AdminPolicy.decode(data[comp.ADMIN_POLICY]).admins if comp.ADMIN_POLICY in data else ()
        required = decode_components_list(data[comp.APP_COMPONENTS]) if comp.APP_COMPONENTS in data else []
        return GroupState("components", routing.nostr_group_id, routing.relay_urls(), frozenset(admins),
                          tuple(required))
    mdk = context.extension(comp.EXT_MDK_GROUP_DATA)
    if mdk is not None:
        gd = comp.MdkGroupData.decode(mdk.extension_data)
        return GroupState("mdk", gd.nostr_group_id, gd.relay_urls(), frozenset(gd.admins), (), gd)
    raise MarmotError("the group carries neither Nostr routing (0x8004) nor MDK group data (0xf2ee)",
                      "component.routing.absent")


def new_group_id() -> bytes:
    return os.urandom(32)


def credential_of(account_secret: str) -> Credential:
    return Credential.basic(bytes.fromhex(public_key(account_secret)))
