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
    └── DraftDisabled               a draft-only operation was asked for without the draft switch

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


class DraftDisabled(MarmotError):
    default_code = "draft.disabled"
