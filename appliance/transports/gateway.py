"""Delivery through an APNs gateway (NIP-PL, Public APNs Gateway Profile), local or remote.

For an app profile `{ id = "buzz-ios-production", transport = "apns", gateway_url = "https://..." }`
the lease endpoint is the opaque `endpoint_grant` the gateway issued to the client; the relay never
parses it. Each attempt is one POST to `<gateway_url>/v1/deliveries/apns`:

    {"v":1,"endpoint_grant":<the lease endpoint>,"request_id":<the job's UUID>,"expires_at":<job end>}
    Authorization: Nostr <NIP-98 event: kind 27235, u = that exact URL, method POST,
                          payload = SHA-256 of these body bytes, signed with the relay key>

and the gateway's answer becomes the executor's outcome:

    200 {"status":"accepted"}                       accepted
    410 {"status":"invalid_endpoint",...}           invalid_endpoint, with the grant's `generation`
                                                    (the executor applies it only if that generation
                                                    is still the lease's current one)
    503 {"status":"retry","retry_after_seconds":n}  transient, honouring n
    503 {"error":"temporarily_unavailable"}         transient
    503 {"error":"configuration_fault"}             configuration (the gateway's APNs setup)
    401 {"error":"invalid_auth"}                    configuration (our key, clock or URL is refused)
    400 {"error":"invalid_request"}                 permanent
    404 {"error":"invalid_grant"}                   permanent: revoked, expired, replayed or over
                                                    quota, which the gateway never tells apart; the
                                                    endpoint is not disabled for it
    no answer, 5xx, 408, 429                        transient
    any other status                                configuration (gateway_url is probably wrong)

A retry of the same job reuses its request id with a fresh NIP-98 event: `created_at` moves forward
for the same request id so two attempts within one second are never the same (burned) event.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import Callable
from urllib.parse import urlsplit

import httpx

from appliance.nostr.nip98 import make_http_auth

from .base import ACCEPTED, CONFIGURATION, INVALID_ENDPOINT, PERMANENT, TRANSIENT, Outcome, WakeRequest

log = logging.getLogger("appliance.transports")

# Seconds one delivery may take at the gateway (it makes one APNs request, maybe one retry).
REQUEST_TIMEOUT = 30.0
# Request ids whose last NIP-98 created_at is remembered (a job's retries come within its hour).
_REMEMBERED = 10_000
# The largest Retry-After honoured from a gateway answer, seconds.
MAX_RETRY_AFTER = 3600


def check_gateway_url(url: object) -> str:
    """A gateway base URL: http(s)://host[:port][/path], no query, fragment or user part."""
    if not isinstance(url, str):
        raise ValueError("gateway_url must be an http:// or https:// URL")
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError("gateway_url has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("gateway_url must be an http:// or https:// URL, e.g. https://push.example.org")
    if parts.username or parts.password or parts.query or parts.fragment or url.endswith("?"):
        raise ValueError("gateway_url takes no user, query or fragment part")
    return url


class GatewayTransport:
    """Sends wakes for one app profile through one gateway, signing with one relay key."""

    def __init__(self, gateway_url: str, relay_secret: str | Callable[[], str], *,
                 timeout: float = REQUEST_TIMEOUT, clock: Callable[[], float] = time.time,
                 client: httpx.AsyncClient | None = None):
        self.url = check_gateway_url(gateway_url).rstrip("/") + "/v1/deliveries/apns"
        self._secret = relay_secret if callable(relay_secret) else (lambda: relay_secret)
        self.clock = clock
        self._client = client or httpx.AsyncClient(timeout=timeout, follow_redirects=False)
        self._last: OrderedDict[str, int] = OrderedDict()

    async def close(self) -> None:
        await self._client.aclose()

    def _created_at(self, request_id: str) -> int:
        now = int(self.clock())
        created = max(now, self._last.get(request_id, now - 1) + 1)
        self._last[request_id] = created
        self._last.move_to_end(request_id)
        while len(self._last) > _REMEMBERED:
            self._last.popitem(last=False)
        return created

    def request(self, request: WakeRequest) -> tuple[bytes, dict[str, str]]:
        """The exact body bytes and headers of one attempt."""
        body = json.dumps({"v": 1, "endpoint_grant": request.endpoint, "request_id": request.request_id,
                           "expires_at": int(request.expires_at)}, separators=(",", ":")).encode()
        auth = make_http_auth(self._secret(), self.url, "POST", body, created_at=self._created_at(request.request_id))
        return body, {"content-type": "application/json", "authorization": auth}

    async def send(self, request: WakeRequest) -> Outcome:
        body, headers = self.request(request)
        try:
            response = await self._client.post(self.url, content=body, headers=headers)
        except httpx.TimeoutException:
            return Outcome(TRANSIENT, detail=f"no answer from the gateway {self.url} in time")
        except httpx.ConnectError as exc:
            refused = isinstance(exc.__cause__ or exc.__context__, ConnectionRefusedError) or "refused" in str(exc)
            return Outcome(TRANSIENT, detail="gateway unreachable: " + ("connection refused" if refused else
                                                                         "cannot connect"), refused=refused)
        except httpx.HTTPError:
            return Outcome(TRANSIENT, detail="gateway unreachable: the connection failed")
        return outcome_of(response.status_code, response.content)


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def outcome_of(status: int, content: bytes) -> Outcome:
    """The executor's outcome of one gateway answer."""
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    error = body.get("error") if isinstance(body.get("error"), str) else None
    if status == 200:
        return Outcome(ACCEPTED, status)
    if status == 410:
        generation = _positive_int(body.get("generation"))
        invalid_at = body.get("invalid_at")
        if generation is None:  # cannot tell which generation died: disable nothing
            return Outcome(PERMANENT, status, "invalid_endpoint", detail="410 without a generation")
        return Outcome(INVALID_ENDPOINT, status, "invalid_endpoint",
                       invalid_at=invalid_at if _positive_int(invalid_at) else None, generation=generation)
    if status == 503:
        if error == "configuration_fault":
            return Outcome(CONFIGURATION, status, error, detail="the gateway's APNs configuration is faulty")
        after = _positive_int(body.get("retry_after_seconds"))
        reason = error or (body["status"] if isinstance(body.get("status"), str) else None)
        return Outcome(TRANSIENT, status, reason, retry_after=float(min(after, MAX_RETRY_AFTER)) if after else None)
    if status == 401:
        return Outcome(CONFIGURATION, status, error,
                       detail="the gateway refused our NIP-98 authorization (relay key, clock or gateway_url)")
    if status == 404:
        return Outcome(PERMANENT, status, error,
                       detail="the gateway refused the grant (revoked, expired, replayed or over quota)")
    if status == 400:
        return Outcome(PERMANENT, status, error, detail="the gateway called the request invalid")
    if status >= 500 or status in (408, 429):
        return Outcome(TRANSIENT, status, error, detail=f"gateway answered {status}")
    # Not an answer the profile defines: most likely gateway_url does not point at a gateway.
    return Outcome(CONFIGURATION, status, error, detail=f"unexpected gateway answer {status}: check gateway_url")
