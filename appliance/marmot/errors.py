"""The Marmot tooling's error tree (everything outside the MLS core raises one of these).

    MarmotError                     base; `.code` is a stable machine-readable name, str() the reason
    ├── EncodingError               bytes that are not canonical Marmot binary profile (truncated, trailing,
    │                               non-shortest length prefix, out-of-bounds vector)
    ├── ProofError                  a MarmotAuthorizationProof envelope or its signing event is invalid
    ├── ComponentError              app component or Marmot extension state that fails its validation rules
    ├── DeviceLabelError            a marmot.encrypted-device-name.v1 label that cannot be built or opened
    ├── TransportError              a Nostr transport envelope (kinds 445, 444, 1059, 30443/443, 10051) is invalid
    ├── PairingError                a pairing payload cannot be sealed or opened
    │   ├── PairingExpired          outside its validity window
    │   └── PairingReused           its single use is already spent
    ├── DraftDisabled               a draft-only operation was asked for without the draft switch
    └── MultiDeviceError            a draft multi-device External Commit breaks a rule (one class per rule):
        ├── SignalingGateInactive           the group has not negotiated the multi-device gate
        ├── JoiningLeafProofInvalid         the joining leaf's 0x8009 account identity proof is missing/invalid
        ├── UnknownJoiningAccount           no existing member has the joining leaf's account identity
        ├── ExternalInitMissing             the Commit has no ExternalInit
        ├── JoinPskInvalid                  not exactly one PreSharedKey, or not the join PSK id
        ├── AuthorizationMissing            no AppEphemeral for 0x800a
        ├── AuthorizationDuplicated         more than one AppEphemeral for 0x800a
        ├── AuthorizationWrongComponent     an AppEphemeral for another component id
        ├── ExtraProposal                   a proposal beyond ExternalInit, the PSK and the AppEphemeral
        ├── AuthorizationInvalid            the AppEphemeral data is not one valid proof
        ├── SignerNotAdmin                  the proof signer is not an active admin of the parent state
        ├── AuthorizationBindingMismatch    the proof does not verify over this GroupContext and leaf
        ├── AuthenticatedDataMisuse         FramedContent.authenticated_data is not empty
        ├── StaleEpoch                      the Commit was built for another epoch
        └── ExternalCommitMlsInvalid        ordinary MLS validation failed (e.g. confirmation tag)

Every error carries a `code` (for example `proof.bad_signature`) so the CLI can print a pinned JSON
shape and tests can tell one failure from another without matching prose.
"""

from __future__ import annotations

from appliance.errors import ApplianceError

__all__ = [
    "MarmotError",
    "EncodingError",
    "ProofError",
    "ComponentError",
    "DeviceLabelError",
    "TransportError",
    "PairingError",
    "PairingExpired",
    "PairingReused",
    "DraftDisabled",
    "DRAFT_SWITCH_HINT",
    "MultiDeviceError",
    "SignalingGateInactive",
    "JoiningLeafProofInvalid",
    "UnknownJoiningAccount",
    "ExternalInitMissing",
    "JoinPskInvalid",
    "AuthorizationMissing",
    "AuthorizationDuplicated",
    "AuthorizationWrongComponent",
    "ExtraProposal",
    "AuthorizationInvalid",
    "SignerNotAdmin",
    "AuthorizationBindingMismatch",
    "AuthenticatedDataMisuse",
    "StaleEpoch",
    "ExternalCommitMlsInvalid",
]


class MarmotError(ApplianceError, ValueError):
    """Base of the Marmot tooling's deliberate failures: `code` names it, str() explains it."""

    default_code = "marmot.error"

    def __init__(self, reason: str, code: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.code = code or self.default_code


class EncodingError(MarmotError):
    default_code = "encoding.invalid"


class ProofError(MarmotError):
    default_code = "proof.invalid"


class ComponentError(MarmotError):
    default_code = "component.invalid"


class DeviceLabelError(MarmotError):
    default_code = "device_label.invalid"


class TransportError(MarmotError):
    default_code = "transport.invalid"


class PairingError(MarmotError):
    default_code = "pairing.invalid"


class PairingExpired(PairingError):
    default_code = "pairing.expired"


class PairingReused(PairingError):
    default_code = "pairing.reused"


# How to turn the draft on: every refusal of a draft feature names both the flag and the setting.
DRAFT_SWITCH_HINT = "pass --draft-multi-device or set marmot_draft_multi_device = true"


class DraftDisabled(MarmotError):
    default_code = "draft.disabled"

    def __init__(self, reason: str, code: str | None = None):
        if "--draft-multi-device" not in reason or "marmot_draft_multi_device" not in reason:
            reason = f"{reason}: {DRAFT_SWITCH_HINT}"
        super().__init__(reason, code)


class MultiDeviceError(MarmotError):
    default_code = "multi_device.invalid"


def _rule(name: str, code: str) -> type:
    return type(name, (MultiDeviceError,), {"default_code": code, "__doc__": f"Rule failure `{code}`."})


SignalingGateInactive = _rule("SignalingGateInactive", "multi_device.gate_inactive")
JoiningLeafProofInvalid = _rule("JoiningLeafProofInvalid", "multi_device.account_proof")
UnknownJoiningAccount = _rule("UnknownJoiningAccount", "multi_device.unknown_account")
ExternalInitMissing = _rule("ExternalInitMissing", "multi_device.external_init")
JoinPskInvalid = _rule("JoinPskInvalid", "multi_device.join_psk")
AuthorizationMissing = _rule("AuthorizationMissing", "multi_device.authorization_missing")
AuthorizationDuplicated = _rule("AuthorizationDuplicated", "multi_device.authorization_duplicated")
AuthorizationWrongComponent = _rule("AuthorizationWrongComponent", "multi_device.authorization_component")
ExtraProposal = _rule("ExtraProposal", "multi_device.extra_proposal")
AuthorizationInvalid = _rule("AuthorizationInvalid", "multi_device.authorization_invalid")
SignerNotAdmin = _rule("SignerNotAdmin", "multi_device.signer_not_admin")
AuthorizationBindingMismatch = _rule("AuthorizationBindingMismatch", "multi_device.authorization_binding")
AuthenticatedDataMisuse = _rule("AuthenticatedDataMisuse", "multi_device.authenticated_data")
StaleEpoch = _rule("StaleEpoch", "multi_device.stale_epoch")
ExternalCommitMlsInvalid = _rule("ExternalCommitMlsInvalid", "multi_device.mls")
