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

import re

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


# What a secret key looks like when it is pasted where something else goes: an nsec (NIP-19; NIP-49's
# ncryptsec) or 64 hex characters, the form of a pubkey and of a secret key alike (an error cannot
# tell them apart, so it repeats neither). Error messages reach the terminal and the service's journal.
_SECRET_LIKE = re.compile(r"n(?:crypt)?sec1[0-9a-z]*|(?<![0-9a-z])[0-9a-f]{64}(?![0-9a-z])", re.I)
REDACTED = "(not shown: it looks like a secret key)"


def redact_secret_like(text: str) -> str:
    """`text` with every nsec and every run of 64 hex characters replaced by a note."""
    return _SECRET_LIKE.sub(lambda m: "nsec1... " + REDACTED if m.group()[0] in "nN" else REDACTED, text)


def at(where: str, name: str) -> str:
    """A setting's name as the operator wrote it, under `where`: `[push] app_profiles[0]` under a
    config file's table header, `origins[0].push.app_profiles[0]` under a dotted path, the name
    alone at the top."""
    if not where:
        return name
    if re.fullmatch(r"\[[^\[\]]+\]", where):
        return f"{where} {name}"
    return f"{where}.{name}"


class ConfigError(ApplianceError):
    """An invalid setting: the message names the setting, the value and a hint. A value (or a part
    of the hint) that looks like a secret key is not repeated."""

    def __init__(self, name: str, value: object, hint: str):
        self.name = name
        self.value = REDACTED if _SECRET_LIKE.search(repr(value)) else value
        self.hint = redact_secret_like(hint)
        if value is None:  # not given at all: said so, not as Python's None
            super().__init__(redact_secret_like(f"setting {name!r}: missing: {self.hint}"))
            return
        shown = REDACTED if self.value is REDACTED else repr(value)
        super().__init__(redact_secret_like(f"setting {name!r}: invalid value {shown}: {self.hint}"))


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
