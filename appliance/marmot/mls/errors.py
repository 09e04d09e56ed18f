"""The MLS core's error tree (every error it raises on purpose is one of these).

    MLSError                    base: bad input or an impossible operation; state bytes are never changed
    ├── DecodeError             bytes are truncated, trailing, non-minimal or of an unknown fixed shape
    ├── UnsupportedError        a cipher suite, version, credential or wire format outside this core
    ├── DecryptError            HPKE/AEAD setup or open failed (e.g. an unusable public key), or no key
    │                           for that generation/epoch
    ├── StateError              state bytes unusable, or the operation does not fit the state
    └── ValidationError         an object breaks an RFC 9420 rule
        ├── SignatureError      a signature does not verify
        ├── MembershipTagError  a PublicMessage membership tag does not verify
        ├── ConfirmationTagError a Commit or GroupInfo confirmation tag does not verify
        ├── EpochError          wrong group, or a stale or future epoch
        ├── TreeError           invalid ratchet tree: parent/tree hash, leaf rules, capabilities
        └── ProposalError       an invalid proposal list, or a proposal the policy refuses
"""

from __future__ import annotations


class MLSError(ValueError):
    """Base of every error the MLS core raises deliberately."""


class DecodeError(MLSError):
    """Malformed bytes: truncated, trailing data, non-minimal length, unknown enum value."""


class UnsupportedError(MLSError):
    """Something outside this core: another cipher suite, protocol version or wire format."""


class DecryptError(MLSError):
    """A ciphertext did not open, or the key it needs is not (or no longer) available."""


class StateError(MLSError):
    """State bytes are unusable, or the requested operation does not fit the group state."""


class ValidationError(MLSError):
    """An object breaks a rule of RFC 9420 (or of the caller's policy)."""


class SignatureError(ValidationError):
    """A signature does not verify."""


class MembershipTagError(ValidationError):
    """A PublicMessage membership tag does not verify."""


class ConfirmationTagError(ValidationError):
    """A confirmation tag does not verify (wrong epoch secrets, e.g. a stale PSK or state)."""


class EpochError(ValidationError):
    """A message for another group, or for a stale or future epoch."""


class TreeError(ValidationError):
    """An invalid ratchet tree or leaf node."""


class ProposalError(ValidationError):
    """An invalid proposal list, or a proposal the caller's policy does not allow."""
