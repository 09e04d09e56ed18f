"""The transport interface: how the push executor hands one wake to a provider, and what came back.

A transport sends the fixed reconnect wake for one job to one endpoint and answers with an
`Outcome`. It knows nothing of leases, events or origins; the executor knows nothing of the
provider behind it (APNs directly, an APNs gateway, FCM). The interface is deliberately small:

    class Transport(Protocol):
        async def send(self, request: WakeRequest) -> Outcome: ...
        async def close(self) -> None: ...

`send` never raises for a provider or network failure: every way a send can end is an `Outcome`
whose `kind` tells the executor what to do with the job:

    accepted           the provider took the wake: the job is done
    invalid_endpoint   the endpoint is permanently dead: disable that endpoint generation only
    refresh_retry      the credential went stale; the transport refreshes it and retries once
                       itself, so the executor sees this only if the retry went stale too
    configuration      the operator's configuration or credentials are wrong: alert, touch no
                       endpoint, keep the job for later
    transient          try again later (after `retry_after` seconds when the provider said so)
    permanent          this request can never succeed (a request fault): dead-letter the job
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

ACCEPTED = "accepted"
INVALID_ENDPOINT = "invalid_endpoint"
REFRESH_RETRY = "refresh_retry"
CONFIGURATION = "configuration"
TRANSIENT = "transient"
PERMANENT = "permanent"

OUTCOME_KINDS = (ACCEPTED, INVALID_ENDPOINT, REFRESH_RETRY, CONFIGURATION, TRANSIENT, PERMANENT)


@dataclass(frozen=True)
class WakeRequest:
    """One delivery attempt of one job.

    `request_id` is the job's canonical UUID: the provider request id (APNs `apns-id`) on every
    attempt of that job. `expires_at` (Unix seconds) bounds how long the provider may hold the
    wake (the job's useful age). Nothing else about the job, its lease or its event is given to
    a transport, so nothing else can reach the provider.
    """

    endpoint: str
    request_id: str
    expires_at: int


@dataclass(frozen=True)
class Outcome:
    """How one send ended. `status`/`reason` are the provider's own (None when it never answered)."""

    kind: str
    status: int | None = None
    reason: str | None = None
    retry_after: float | None = None  # seconds, when the provider asked for a pause
    invalid_at: int | None = None  # Unix seconds the provider says the endpoint died (APNs 410)
    #: with invalid_endpoint from a gateway: the endpoint generation it refers to; the executor
    #: disables the endpoint only while that generation is still the lease's current one
    generation: int | None = None
    detail: str = ""  # a short operator-facing explanation (never a token or a secret)
    #: no connection: the provider's host refused it (nothing listens there); its profile is failing
    refused: bool = False
    #: the failure is the endpoint's own host's (a UnifiedPush push service a lease chose), not the
    #: profile's: it counts neither toward the profile's health nor toward an operator alert
    endpoint_fault: bool = False

    def __post_init__(self) -> None:
        if self.kind not in OUTCOME_KINDS:
            raise ValueError(f"unknown outcome kind {self.kind!r}")


class ProfileError(ValueError):
    """An app profile's delivery settings that cannot be used: `field` names the setting, the
    message says why (never key material). The push configuration reports it as a ConfigError."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class Transport(Protocol):
    """What the delivery workers call; one instance per configured app profile."""

    async def send(self, request: WakeRequest) -> Outcome: ...

    async def close(self) -> None: ...
