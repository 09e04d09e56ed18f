"""Outbound transports: how a wake leaves the appliance (APNs directly or through an APNs gateway;
FCM as a draft beyond NIP-PL v1).

`base` is the interface the push executor uses (`WakeRequest` in, `Outcome` out); `credentials`
holds the APNs .p8 key and provider-token (JWT) cache on its own, for any part that talks to APNs;
`apns` is the direct APNs transport and Apple's response table, over `http2` (a small HTTP/2
client, with `hpack_decode` and `hpack_tables`); `gateway` delivers through an APNs gateway,
NIP-98 signed; `fcm` is FCM HTTP v1 with a service account (a draft transport).
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
