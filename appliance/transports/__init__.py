"""Outbound transports: how a wake leaves the appliance (APNs directly now; a gateway later).

`base` is the interface the push executor uses (`WakeRequest` in, `Outcome` out); `credentials`
holds the APNs .p8 key and provider-token (JWT) cache on its own, for any part that talks to APNs;
`apns` is the direct APNs transport and Apple's response table.
"""

from .base import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    OUTCOME_KINDS,
    PERMANENT,
    REFRESH_RETRY,
    TRANSIENT,
    Outcome,
    ProfileError,
    Transport,
    WakeRequest,
)

__all__ = [
    "ACCEPTED",
    "CONFIGURATION",
    "INVALID_ENDPOINT",
    "OUTCOME_KINDS",
    "PERMANENT",
    "REFRESH_RETRY",
    "TRANSIENT",
    "Outcome",
    "ProfileError",
    "Transport",
    "WakeRequest",
]
