"""Direct APNs delivery with the app's own token-based credentials (HTTP/2 over TLS).

Every attempt sends exactly the NIP-PL APNs constant body and a fixed header set:

    POST /3/device/<endpoint>
    authorization: bearer <provider token>      (credentials.ProviderToken, reused ~50 minutes)
    apns-push-type: alert
    apns-priority: 10
    apns-topic: <the profile's topic>
    apns-id: <the job's UUID>                   (the same on every attempt of a job)
    apns-expiration: <the job's useful-age end>

Nothing from a lease, an event or the relay enters the body or the headers. Apple's answer is
classified by `classify` (the table `APNS_RESPONSES` lists every documented status and reason).
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import logging
import re
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from .base import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    PERMANENT,
    REFRESH_RETRY,
    TRANSIENT,
    Outcome,
    WakeRequest,
)
from .credentials import ApnsKey, CredentialError, ProviderToken
from .http2 import ConnectFailed, Http2Client, Http2Error, Response, StreamRefused

log = logging.getLogger("appliance.transports")

__all__ = [
    "APNS_BODY",
    "APNS_HOSTS",
    "APNS_RESPONSES",
    "ENVIRONMENTS",
    "ApnsProfile",
    "ApnsTransport",
    "classify",
    "parse_retry_after",
]

#: NIP-PL, Transport Profiles (APNs): the exact application body of every attempt.
APNS_BODY = b'{"aps":{"alert":{"body":"Reconnect to your relay now"},"mutable-content":1}}'

#: Apple's hosts per environment (a profile's `apns_url` overrides them, e.g. for an emulator).
APNS_HOSTS = {
    "production": "https://api.push.apple.com",
    "sandbox": "https://api.sandbox.push.apple.com",
}
ENVIRONMENTS = tuple(APNS_HOSTS)

# Seconds one request may take, connection included, before it counts as a transient failure.
REQUEST_TIMEOUT = 30.0
# Longest pause a Retry-After header can impose on one job (the job's useful age bounds it anyway).
MAX_RETRY_AFTER = 3600.0

#: Every status and reason Apple documents ("Handling notification responses from APNs"), and
#: what the executor does about it. Reasons we do not know fall back to `_STATUS_DEFAULT`.
APNS_RESPONSES: dict[tuple[int, str | None], str] = {
    (200, None): ACCEPTED,
    # 400: the request is wrong. Only the device token can change, so a bad token kills the
    # endpoint; topic problems are the operator's configuration; the rest are request faults.
    (400, "BadCollapseId"): PERMANENT,
    (400, "BadDeviceToken"): INVALID_ENDPOINT,
    (400, "BadExpirationDate"): PERMANENT,
    (400, "BadMessageId"): PERMANENT,
    (400, "BadPriority"): PERMANENT,
    (400, "BadTopic"): CONFIGURATION,
    (400, "DeviceTokenNotForTopic"): INVALID_ENDPOINT,
    (400, "DuplicateHeaders"): PERMANENT,
    (400, "IdleTimeout"): TRANSIENT,
    (400, "InvalidPushType"): PERMANENT,
    (400, "MissingDeviceToken"): PERMANENT,
    (400, "MissingTopic"): CONFIGURATION,
    (400, "PayloadEmpty"): PERMANENT,
    (400, "TopicDisallowed"): CONFIGURATION,
    # 403: credentials. An expired provider token is refreshed once; everything else is the
    # operator's to fix.
    (403, "BadCertificate"): CONFIGURATION,
    (403, "BadCertificateEnvironment"): CONFIGURATION,
    (403, "ExpiredProviderToken"): REFRESH_RETRY,
    (403, "Forbidden"): CONFIGURATION,
    (403, "InvalidProviderToken"): CONFIGURATION,
    (403, "MissingProviderToken"): CONFIGURATION,
    (403, "UnrelatedKeyIdInToken"): CONFIGURATION,
    (403, "BadEnvironmentKeyIdInToken"): CONFIGURATION,
    (404, "BadPath"): PERMANENT,
    (405, "MethodNotAllowed"): PERMANENT,
    (410, "ExpiredToken"): INVALID_ENDPOINT,
    (410, "Unregistered"): INVALID_ENDPOINT,
    (413, "PayloadTooLarge"): PERMANENT,
    (429, "TooManyProviderTokenUpdates"): CONFIGURATION,
    (429, "TooManyRequests"): TRANSIENT,
    (500, "InternalServerError"): TRANSIENT,
    (503, "ServiceUnavailable"): TRANSIENT,
    (503, "Shutdown"): TRANSIENT,
}

# A documented status with a reason Apple added later than this table.
_STATUS_DEFAULT = {
    200: ACCEPTED,
    400: PERMANENT,
    403: CONFIGURATION,
    404: PERMANENT,
    405: PERMANENT,
    410: INVALID_ENDPOINT,
    413: PERMANENT,
    429: TRANSIENT,
    500: TRANSIENT,
    503: TRANSIENT,
}


def classify(status: int, reason: str | None) -> str:
    """The outcome kind of an APNs answer (status, reason)."""
    kind = APNS_RESPONSES.get((status, reason))
    if kind is not None:
        return kind
    if status in _STATUS_DEFAULT:
        return _STATUS_DEFAULT[status]
    # An undocumented status: server-side trouble is worth another try, a client error is not.
    return TRANSIENT if status >= 500 else PERMANENT


_DELTA_SECONDS = re.compile(r"[0-9]+")
_MAX_RETRY_AFTER_LEN = 64


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if absent/bad.
    Never raises: the header comes from a server (a UnifiedPush one is chosen by a lease)."""
    if value is None:
        return None
    value = value.strip(" \t")
    # RFC 9110 delta-seconds is 1*DIGIT, ASCII only (str.isdigit() also takes '²', which float()
    # refuses); a header longer than any date or sane delay is refused unread.
    if len(value) > _MAX_RETRY_AFTER_LEN or not value.isascii():
        return None
    if _DELTA_SECONDS.fullmatch(value):
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
        delay = when.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, OverflowError, IndexError, AttributeError):
        return None
    return min(max(delay, 0.0), MAX_RETRY_AFTER)


# An APNs device token is hex (32 bytes today; Apple says lengths may change). The endpoint goes
# into the request path, so anything else is refused here, before any byte reaches Apple.
_HEX = re.compile(r"[0-9a-fA-F]+")


def valid_device_token(endpoint: str) -> bool:
    """1 to 512 bytes in hex (the length tested apart: a repeated pair in the pattern cost a few
    microseconds per wake)."""
    return len(endpoint) % 2 == 0 and len(endpoint) <= 1024 and _HEX.fullmatch(endpoint) is not None


@dataclass(frozen=True)
class ApnsProfile:
    """What one app profile needs to reach APNs (from its `app_profiles` entry)."""

    profile_id: str
    topic: str
    environment: str  # "production" | "sandbox"
    key: ApnsKey
    apns_url: str | None = None  # override of the environment's host (an emulator, a proxy)
    ca_file: str | None = None  # extra CA bundle trusted for that URL

    @property
    def base_url(self) -> str:
        return (self.apns_url or APNS_HOSTS[self.environment]).rstrip("/")

    def ssl_context(self) -> ssl.SSLContext:
        """The system/certifi trust store, plus `ca_file` when given; TLS 1.2 or later (Apple's floor)."""
        import certifi

        ctx = ssl.create_default_context(cafile=certifi.where())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca_file:
            load_ca_file(ctx, self.ca_file)
        return ctx


def load_ca_file(ctx: ssl.SSLContext, path: str) -> None:
    """Trust the CA bundle at `path` in `ctx`; CredentialError in plain words when it cannot."""
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError:
        raise CredentialError(f"ca_file {path!r} holds no PEM CA certificate") from None
    except OSError as exc:
        reason = (exc.strerror or "cannot be read").lower()
        raise CredentialError(f"ca_file {path!r} cannot be read: {reason}") from None


def check_ca_file(path: str) -> None:
    """`load_ca_file` into a context of its own: a setting checked before it is saved."""
    load_ca_file(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), path)


def check_apns_url(url: object) -> str:
    """An `apns_url` override: https://host[:port] with no user, path, query or fragment."""
    if not isinstance(url, str):
        raise CredentialError("apns_url must be an https:// URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise CredentialError("apns_url is not a valid URL") from None
    if parts.scheme != "https" or not parts.hostname:
        raise CredentialError("apns_url must be an https:// URL (APNs speaks HTTP/2 over TLS only)")
    if parts.username or parts.password or parts.query or parts.fragment or parts.path not in ("", "/"):
        raise CredentialError("apns_url names a host (and port) only: no user, path, query or fragment")
    return url


class ApnsTransport:
    """Sends wakes for one app profile over one long-lived, multiplexed HTTP/2 connection."""

    def __init__(self, profile: ApnsProfile, *, token: ProviderToken | None = None,
                 timeout: float = REQUEST_TIMEOUT):
        self.profile = profile
        self.token = token or ProviderToken(profile.key)
        self.timeout = timeout
        # The path (device token), apns-id and expiry change on every request: never indexed.
        self._client = Http2Client(profile.base_url, profile.ssl_context(),
                                   volatile=frozenset({":path", "apns-id", "apns-expiration"}))
        self._static = [
            ("apns-push-type", "alert"),
            ("apns-priority", "10"),
            ("apns-topic", profile.topic),
        ]

    async def close(self) -> None:
        await self._client.close()

    def headers(self, request: WakeRequest, provider_token: str) -> list[tuple[str, str]]:
        """The complete header set of one attempt (the body is always APNS_BODY)."""
        return [
            ("authorization", f"bearer {provider_token}"),
            *self._static,
            ("apns-id", request.request_id),
            ("apns-expiration", str(int(request.expires_at))),
            ("content-length", str(len(APNS_BODY))),
        ]

    async def send(self, request: WakeRequest) -> Outcome:
        if not valid_device_token(request.endpoint):
            return Outcome(INVALID_ENDPOINT, reason="BadDeviceToken",
                           detail="the endpoint is not an APNs device token (hex); not sent")
        stale = self.token.current()
        outcome = await self._attempt(request, stale)
        if outcome.kind == REFRESH_RETRY:
            # Exactly one refresh and one retry (Apple: ExpiredProviderToken means make a new one).
            outcome = await self._attempt(request, self.token.refresh(stale))
            if outcome.kind == REFRESH_RETRY:
                return Outcome(CONFIGURATION, outcome.status, outcome.reason,
                               detail="APNs calls a freshly made provider token expired: check this host's clock")
            # The delivery log shows both requests of this attempt: the refused one, then this answer.
            note = "retried once with a new provider token after 403 ExpiredProviderToken"
            outcome = dataclasses.replace(outcome, detail=f"{note}; {outcome.detail}" if outcome.detail else note)
        return outcome

    async def _attempt(self, request: WakeRequest, provider_token: str) -> Outcome:
        path = "/3/device/" + request.endpoint  # hex (send checked it): nothing to quote
        headers = self.headers(request, provider_token)
        for retry in (True, False):
            try:
                response = await self._client.request("POST", path, headers, APNS_BODY, self.timeout)
            except StreamRefused as exc:
                if retry:  # never processed (GOAWAY, REFUSED_STREAM): once more on a fresh connection
                    continue
                return Outcome(TRANSIENT, detail=f"APNs refused the stream: {exc}")
            except ConnectFailed as exc:
                if exc.tls is not None:
                    return Outcome(CONFIGURATION, detail=f"the TLS certificate of {self.profile.base_url} is "
                                                         f"not trusted ({exc.tls.verify_message}): check "
                                                         "apns_url/ca_file")
                return Outcome(TRANSIENT, detail=str(exc), refused=exc.refused)
            except TimeoutError:
                return Outcome(TRANSIENT, detail=f"no answer from {self.profile.base_url} in {self.timeout:g} s")
            except Http2Error as exc:
                return Outcome(TRANSIENT, detail=str(exc))
            return outcome_of(response)
        raise AssertionError("unreachable")


def outcome_of(response: Response) -> Outcome:
    """The Outcome of one APNs HTTP/2 response."""
    status = response.status
    reason = None
    invalid_at = None
    if status != 200 and response.body:
        try:
            body = json.loads(response.body)
        except ValueError:
            body = {}
        if isinstance(body, dict):
            r = body.get("reason")
            reason = r if isinstance(r, str) and len(r) <= 64 else None
            ts = body.get("timestamp")
            if isinstance(ts, int) and not isinstance(ts, bool) and ts > 0:
                invalid_at = ts // 1000  # APNs reports milliseconds
    kind = classify(status, reason)
    retry_after = parse_retry_after(response.headers.get("retry-after")) if kind == TRANSIENT else None
    return Outcome(kind, status, reason, retry_after=retry_after,
                   invalid_at=invalid_at if kind == INVALID_ENDPOINT else None)
