"""The appliance's error tree.

    ApplianceError                  base of everything the appliance raises on purpose
    ├── ConfigError                 a setting is invalid: names the setting, the value and a hint
    ├── StoreError                  the database refused or is unusable
    │   ├── SchemaTooNew            the data file was written by a newer appliance
    │   └── StorageFull             the disk (or quota) holding the database is full: nothing of
    │                               the write was kept; it succeeds again once space returns
    └── Rejected                    a protocol-level refusal sent to a client as OK/CLOSED/NOTICE
        │                           (`prefix: message`, prefixes from NIP-01)
        └── AlreadyStored           not a refusal: the event is stored already (NIP-01 answers
                                    `OK true` with `duplicate: ...`); nothing is written again

Lease rejections (NIP-PL) are `Rejected` with the spec's exact reason strings.
"""

from __future__ import annotations

# NIP-01 machine-readable prefixes for OK / CLOSED messages.
PREFIXES = frozenset(
    {
        "duplicate",
        "pow",
        "blocked",
        "rate-limited",
        "invalid",
        "restricted",
        "mute",
        "error",
        "auth-required",
    }
)


class ApplianceError(Exception):
    """Base class of every error the appliance raises deliberately."""


class ConfigError(ApplianceError):
    """An invalid setting: the message names the setting, the value and a hint."""

    def __init__(self, name: str, value: object, hint: str):
        self.name = name
        self.value = value
        self.hint = hint
        super().__init__(f"setting {name!r}: invalid value {value!r}: {hint}")


class StoreError(ApplianceError):
    """The store could not do what was asked."""


class SchemaTooNew(StoreError):
    """The data file's schema is newer than this program understands."""


class StorageFull(StoreError):
    """The disk holding the database is full (SQLITE_FULL): the write was rolled back whole."""

    def __init__(self, cause: BaseException | None = None):
        super().__init__("the disk holding the database is full" + (f" ({cause})" if cause else ""))


class Rejected(ApplianceError):
    """A refusal sent to a client: `prefix: message` in an OK or CLOSED frame."""

    def __init__(self, prefix: str, message: str):
        if prefix not in PREFIXES:
            raise ValueError(f"unknown NIP-01 prefix {prefix!r}")
        self.prefix = prefix
        self.message = message
        super().__init__(self.wire)

    @property
    def wire(self) -> str:
        """The text as sent to the client."""
        return f"{self.prefix}: {self.message}"

    @classmethod
    def from_wire(cls, text: str) -> "Rejected":
        """Build from a full `prefix: message` string (as the NIP-PL spec words its reasons)."""
        prefix, _, message = text.partition(": ")
        return cls(prefix, message)


class AlreadyStored(Rejected):
    """The event is stored already: accepted (`["OK", id, true, "duplicate: ..."]`), written once."""

    def __init__(self, message: str = "already have this event"):
        super().__init__("duplicate", message)


def wire(prefix: str, message: str) -> str:
    """Format an OK/CLOSED message with its NIP-01 prefix."""
    return Rejected(prefix, message).wire
