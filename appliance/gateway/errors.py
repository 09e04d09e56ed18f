"""The gateway's closed error bodies (NIP-PL, Public APNs Gateway Profile, "Common HTTP and value rules").

    GatewayError                    an HTTP answer with one of the spec's closed bodies
    ├── InvalidRequest          400 {"error":"invalid_request"}
    ├── InvalidAttestation      401 {"error":"invalid_attestation"}
    ├── InvalidAuth             401 {"error":"invalid_auth"}
    ├── NotAuthorized           404 {"error":"not_authorized"}
    ├── InvalidGrant            404 {"error":"invalid_grant"}
    ├── TemporarilyUnavailable  503 {"error":"temporarily_unavailable"}
    ├── ConfigurationFault      503 {"error":"configuration_fault"}
    └── NotReady                503 {"error":"not_ready"}

Authority, custody and quota rejections never say which check failed: each is one of these
bodies and nothing else (`reason` is for DEBUG logs only and never reaches the client).
"""

from __future__ import annotations

from appliance.errors import ApplianceError


class GatewayError(ApplianceError):
    """An HTTP answer with a closed JSON body."""

    status: int = 500
    code: str = "temporarily_unavailable"

    def __init__(self, reason: str = ""):
        self.reason = reason or self.code
        super().__init__(f"{self.status} {self.code}: {self.reason}")

    @property
    def body(self) -> bytes:
        return b'{"error":"' + self.code.encode() + b'"}'


class InvalidRequest(GatewayError):
    status, code = 400, "invalid_request"


class InvalidAttestation(GatewayError):
    status, code = 401, "invalid_attestation"


class InvalidAuth(GatewayError):
    status, code = 401, "invalid_auth"


class NotAuthorized(GatewayError):
    status, code = 404, "not_authorized"


class InvalidGrant(GatewayError):
    status, code = 404, "invalid_grant"


class TemporarilyUnavailable(GatewayError):
    status, code = 503, "temporarily_unavailable"


class ConfigurationFault(GatewayError):
    status, code = 503, "configuration_fault"


class NotReady(GatewayError):
    status, code = 503, "not_ready"
