"""FCM HTTP v1 delivery (a DRAFT transport beyond NIP-PL v1), over HTTP/2 with a service account.

Every attempt is one request carrying this profile's one constant data-only message, the lease's
endpoint (the FCM registration token) and a bounded TTL being the only parts that vary:

    POST /v1/projects/<project_id>/messages:send
    authorization: Bearer <OAuth2 access token>    (AccessToken, shared per service account)
    content-type: application/json

    {"message":{"token":<endpoint>,"data":{"nip_pl":"reconnect"},"android":{"priority":"high","ttl":"<n>s"}}}

`n` is the seconds left of the job's useful age (never past its lease), at most MAX_TTL. Nothing
from a lease, an event or the relay enters the request but the token, which goes only into the
JSON string `message.token` after a character check. The access token comes from a signed RS256
JWT grant (RFC 7523, `urn:ietf:params:oauth:grant-type:jwt-bearer`) posted to the account's
token endpoint; it is reused until REFRESH_MARGIN before it expires, and made again early only
when FCM answers 401 to the one in use (once per stale token). Where requests go (`fcm_url`,
`token_uri`) is the operator's configuration only, each checked like `apns_url`.

FCM's answer is classified by `classify` (`FCM_ERRORS` lists every ErrorCode of the v1 API).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import re
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlencode, urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from .apns import check_ca_file, load_ca_file, parse_retry_after
from .base import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    PERMANENT,
    REFRESH_RETRY,
    TRANSIENT,
    Outcome,
    ProfileError,
    WakeRequest,
)
from .credentials import CredentialError, _b64url
from .http2 import ConnectFailed, Http2Client, Http2Error, Response, StreamRefused

log = logging.getLogger("appliance.transports")

__all__ = [
    "FCM_DATA",
    "FCM_ERRORS",
    "FCM_FIELDS",
    "FCM_URL",
    "MAX_TTL",
    "TOKEN_URI",
    "AccessToken",
    "FcmProfile",
    "FcmTransport",
    "ServiceAccount",
    "classify",
    "load_profile",
    "message_body",
]

#: Google's hosts (a profile's `fcm_url` and `token_uri` override them, e.g. for the emulator).
FCM_URL = "https://fcm.googleapis.com"
TOKEN_URI = "https://oauth2.googleapis.com/token"
#: The OAuth scope FCM HTTP v1 needs.
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"

#: The constant part of every message: one data key, nothing a notification could show.
FCM_DATA = {"nip_pl": "reconnect"}
#: Longest `android.ttl`: a wake is worth nothing after the job's useful age (an hour by default).
MAX_TTL = 3600
# The message is made by concatenation around the token and the TTL (both checked first).
_BODY_HEAD = b'{"message":{"token":"'
_BODY_MID = (b'","data":' + json.dumps(FCM_DATA, separators=(",", ":")).encode()
             + b',"android":{"priority":"high","ttl":"')
_BODY_TAIL = b's"}}}'

# Seconds one request may take, connection included, before it counts as a transient failure.
REQUEST_TIMEOUT = 30.0
# Seconds one grant request may take in all: a hung token endpoint holds the waiting wakes (and
# so the delivery workers, which serve APNs too) for this long at most, once per backoff.
TOKEN_TIMEOUT = 10.0
# Seconds a failed grant is answered from memory (its Retry-After when longer), doubling with each
# failure in a row up to MAX_FAILURE_BACKOFF, so queued wakes share one failure instead of one
# request each and an endpoint that stays hung holds the workers ever more rarely.
FAILURE_BACKOFF = 5.0
MAX_FAILURE_BACKOFF = 60.0
# Seconds before an access token's expiry at which a new one is made (clock skew, slow requests).
REFRESH_MARGIN = 300
# An access token is reused at least this long even if the endpoint says it lives less (seconds).
MIN_TOKEN_LIFETIME = 60
# A service account file is a few KiB; anything much bigger is not one.
_MAX_ACCOUNT_BYTES = 64 * 1024
# An FCM registration token: URL-safe base64 and ':' (`<instance id>:APA91b...`), a few hundred
# characters. Anything else is refused here, before a byte reaches FCM.
_FCM_TOKEN = re.compile(r"[A-Za-z0-9_:\-.]{1,4096}")
# Google project ids (6-30 lowercase letters, digits, hyphens) and project numbers: path-safe.
_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{1,20}")

#: Profile keys of an fcm app profile (besides id and transport).
FCM_FIELDS = ("service_account_file", "service_account_stored", "project_id", "fcm_url", "token_uri", "ca_file")

#: Every ErrorCode of FCM HTTP v1 (firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode), and
#: what the executor does about it. INVALID_ARGUMENT is the token's fault only when the answer
#: says so (see `classify`); our message is otherwise constant.
FCM_ERRORS: dict[str, str] = {
    # 404: the app was uninstalled or the token expired: that endpoint generation is dead.
    "UNREGISTERED": INVALID_ENDPOINT,
    # 400: about the token (its format) kills the endpoint; about anything else, a request fault.
    "INVALID_ARGUMENT": INVALID_ENDPOINT,
    # 403: the token belongs to another sender (Firebase project) than our credentials: the
    # operator's profile and the app disagree. An alert, no endpoint touched.
    "SENDER_ID_MISMATCH": CONFIGURATION,
    # 401: the APNs certificate or web push key FCM holds for the app was refused (operator's).
    "THIRD_PARTY_AUTH_ERROR": CONFIGURATION,
    # 429: the project's or the device's message rate: later, honouring Retry-After.
    "QUOTA_EXCEEDED": TRANSIENT,
    # 503 / 500: FCM's own trouble: later, honouring Retry-After.
    "UNAVAILABLE": TRANSIENT,
    "INTERNAL": TRANSIENT,
    # No more information: decided by the HTTP status below.
    "UNSPECIFIED_ERROR": "",
}

# An answer without an FCM ErrorCode: Google's canonical status by HTTP status.
_STATUS_DEFAULT = {
    200: ACCEPTED,
    400: PERMANENT,  # INVALID_ARGUMENT about our request (never the token without saying so)
    401: REFRESH_RETRY,  # UNAUTHENTICATED: the access token went stale; one refresh, one retry
    403: CONFIGURATION,  # PERMISSION_DENIED: the account may not send for this project
    404: CONFIGURATION,  # NOT_FOUND without UNREGISTERED: the project path is wrong
    408: TRANSIENT,
    429: TRANSIENT,
    500: TRANSIENT,
    502: TRANSIENT,
    503: TRANSIENT,
    504: TRANSIENT,
}


def _error_parts(body: bytes) -> tuple[str | None, str | None, bool | None, str]:
    """(FCM errorCode, Google status, whether the answer blames the token, message) of an error body.
    The token is blamed when a BadRequest field violation names `message.token`, or when no
    violation names another field and the message speaks of the registration token."""
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        doc = {}
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return None, None, None, ""
    status = err.get("status") if isinstance(err.get("status"), str) else None
    message = err.get("message") if isinstance(err.get("message"), str) else ""
    code = None
    fields: list[str] = []
    details = err.get("details")
    # A malformed answer (details or fieldViolations not lists) is classified by its status alone.
    for d in details if isinstance(details, list) else []:
        if not isinstance(d, dict):
            continue
        kind = d.get("@type", "")
        if isinstance(kind, str) and kind.endswith("google.firebase.fcm.v1.FcmError"):
            c = d.get("errorCode")
            code = c if isinstance(c, str) and len(c) <= 64 else code
        elif isinstance(kind, str) and kind.endswith("google.rpc.BadRequest"):
            violations = d.get("fieldViolations")
            for v in violations if isinstance(violations, list) else []:
                if isinstance(v, dict) and isinstance(v.get("field"), str):
                    fields.append(v["field"])
    if fields:
        blames_token = all(f == "message.token" for f in fields)
    else:
        blames_token = "registration token" in message.lower()
    return code, status, blames_token, message[:200]


def classify(status: int, code: str | None, blames_token: bool | None = None) -> str:
    """The outcome kind of an FCM answer: its HTTP status, its FcmError errorCode (if any) and
    whether it blames the token (INVALID_ARGUMENT only)."""
    if status == 200:
        return ACCEPTED
    kind = FCM_ERRORS.get(code or "")
    if code == "INVALID_ARGUMENT" or (kind is None and status == 400):
        # Fail closed: an endpoint generation is disabled only when the answer blames the token.
        return INVALID_ENDPOINT if blames_token else PERMANENT
    if kind:
        return kind
    if status in _STATUS_DEFAULT:
        return _STATUS_DEFAULT[status]
    return TRANSIENT if status >= 500 else PERMANENT


def message_body(endpoint: str, ttl: int) -> bytes:
    """The exact bytes of one message (`endpoint` already checked against _FCM_TOKEN)."""
    return _BODY_HEAD + endpoint.encode("ascii") + _BODY_MID + str(int(ttl)).encode("ascii") + _BODY_TAIL


def ttl_of(expires_at: int, now: float) -> int:
    """Seconds FCM may hold the wake: what is left of its useful age, 0..MAX_TTL."""
    return max(0, min(MAX_TTL, int(expires_at - now)))


# -- the service account ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceAccount:
    """A Google service account key (the JSON file the Cloud console gives), enough to sign grants."""

    client_email: str
    private_key_id: str
    project_id: str
    token_uri: str
    private_key: rsa.RSAPrivateKey = field(repr=False, compare=False)

    @classmethod
    def parse(cls, data: bytes) -> "ServiceAccount":
        """CredentialError (never quoting the key) when the bytes are not a usable service account."""
        if len(data) > _MAX_ACCOUNT_BYTES:
            raise CredentialError("not a service account key file: too large")
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise CredentialError("not a service account key file: not JSON (use the .json file Google "
                                  "Cloud gives for a service account key)") from None
        if not isinstance(doc, dict) or doc.get("type") != "service_account":
            raise CredentialError('not a service account key file: "type" is not "service_account"')
        for name in ("client_email", "private_key_id", "private_key", "project_id"):
            if not isinstance(doc.get(name), str) or not doc[name]:
                raise CredentialError(f"the service account key file has no {name}")
        token_uri = doc.get("token_uri", TOKEN_URI)
        try:
            check_url(token_uri, "token_uri", path=True)
        except CredentialError as exc:
            raise CredentialError(f"the service account key file's {exc}") from None
        try:
            key = serialization.load_pem_private_key(doc["private_key"].encode(), password=None)
        except (ValueError, TypeError):
            raise CredentialError("the service account key file's private_key is not a PEM private key") from None
        except Exception:
            raise CredentialError("the service account key file's private_key cannot be used") from None
        if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < 2048:
            raise CredentialError("the service account key file's private_key is not an RSA key of 2048 bits "
                                  "or more (Google signs grants with RS256)")
        return cls(doc["client_email"], doc["private_key_id"], doc["project_id"], token_uri, key)

    @classmethod
    def load(cls, path: str | Path) -> "ServiceAccount":
        p = Path(path)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise CredentialError(f"service account file {str(p)!r} does not exist") from None
        except IsADirectoryError:
            raise CredentialError(f"service account file {str(p)!r} is a directory") from None
        except OSError as exc:
            raise CredentialError(f"cannot read service account file {str(p)!r}: {exc.strerror or exc}") from None
        return cls.parse(data)

    @property
    def fingerprint(self) -> str:
        """`sa:` and 16 hex of SHA-256 of the public key: names the key without revealing it."""
        der = self.private_key.public_key().public_bytes(serialization.Encoding.DER,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo)
        return "sa:" + hashlib.sha256(der).hexdigest()[:16]

    def sign_grant(self, issued_at: int, audience: str) -> str:
        """A JWT bearer grant (RFC 7523, RS256) for the FCM scope, valid one hour, for `audience`
        (the token endpoint it is posted to)."""
        header = {"alg": "RS256", "typ": "JWT", "kid": self.private_key_id}
        claims = {"iss": self.client_email, "scope": SCOPE, "aud": audience, "iat": issued_at,
                  "exp": issued_at + 3600}
        head = _b64url(json.dumps(header, separators=(",", ":")).encode())
        body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
        signing_input = f"{head}.{body}".encode("ascii")
        signature = self.private_key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        return f"{head}.{body}.{_b64url(signature)}"


def check_url(url: object, name: str, *, path: bool = False) -> str:
    """An https:// URL an operator configured: a host (and port), and a path only where `path`;
    never a user, query or fragment."""
    if not isinstance(url, str):
        raise CredentialError(f"{name} must be an https:// URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise CredentialError(f"{name} is not a valid URL") from None
    if parts.scheme != "https" or not parts.hostname:
        raise CredentialError(f"{name} must be an https:// URL (FCM and Google's token endpoint speak TLS only)")
    if parts.username or parts.password or parts.query or parts.fragment or "?" in url or "#" in url:
        raise CredentialError(f"{name} takes no user, query or fragment part")
    if not path and parts.path not in ("", "/"):
        raise CredentialError(f"{name} names a host (and port) only: no path")
    if any(c.isspace() or ord(c) < 0x21 for c in url):
        raise CredentialError(f"{name} contains whitespace or control characters")
    return url


def ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """The system/certifi trust store, plus `ca_file` when given; TLS 1.2 or later."""
    import certifi

    ctx = ssl.create_default_context(cafile=certifi.where())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file:
        load_ca_file(ctx, ca_file)
    return ctx


# -- the access token ------------------------------------------------------------------------------


class TokenUnavailable(Exception):
    """No access token could be had; `outcome` says how the wake ends (transient, configuration)."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.detail)
        self.outcome = outcome


class AccessToken:
    """The OAuth2 access token of one service account at one token endpoint: fetched with a signed
    grant, reused until REFRESH_MARGIN before it expires, shared by every profile of the account.

    `current()` is what every request sends (one fetch however many ask at once); `refresh(stale)`
    fetches a new one only if `stale` is still the one in use, so many requests answered 401 at
    once cause one new token, not one each. A failed fetch is shared the same way: every caller
    waiting on it, and every caller for `backoff` seconds after, gets its failure without a new
    grant request.
    """

    def __init__(self, account: ServiceAccount, token_uri: str, ca_file: str | None = None, *,
                 clock: Callable[[], float] = time.time, timeout: float = TOKEN_TIMEOUT,
                 backoff: float = FAILURE_BACKOFF):
        self.account = account
        self.token_uri = check_url(token_uri, "token_uri", path=True)
        self.clock = clock
        self.timeout = timeout
        self.backoff = backoff
        parts = urlsplit(token_uri)
        self._path = parts.path or "/"
        self._client = Http2Client(f"https://{parts.netloc}", ssl_context(ca_file))
        self._token: str | None = None
        self._until = 0.0
        self._lock: asyncio.Lock | None = None
        self._failure: Outcome | None = None
        self._failed_until = 0.0
        self._failures = 0  # failed grant requests in a row
        self.fetched = 0  # how many tokens were fetched (tests and the benchmark read it)

    async def close(self) -> None:
        await self._client.close()

    async def current(self) -> str:
        if self._token is not None and self.clock() < self._until:
            return self._token
        return await self._fetch(stale=None)

    async def refresh(self, stale: str) -> str:
        """A token other than `stale`: a new one unless another caller already replaced it."""
        return await self._fetch(stale=stale)

    async def _fetch(self, stale: str | None) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            fresh = self._token is not None and self.clock() < self._until
            if fresh and (stale is None or self._token != stale):
                return self._token  # another request fetched it meanwhile
            now = self.clock()
            if self._failure is not None and now < self._failed_until:
                raise TokenUnavailable(self._failure)  # the fetch just failed: share its failure
            try:
                token, lifetime = await self._request(now)
            except TokenUnavailable as exc:
                self._failures += 1
                wait = min(max(self.backoff * 2 ** min(self._failures - 1, 16), exc.outcome.retry_after or 0),
                           MAX_FAILURE_BACKOFF)
                self._failure, self._failed_until = exc.outcome, self.clock() + wait
                raise
            self._failure, self._failures = None, 0
            self._token = token
            self._until = now + max(MIN_TOKEN_LIFETIME, lifetime - REFRESH_MARGIN)
            self.fetched += 1
            return token

    async def _request(self, now: float) -> tuple[str, int]:
        """(access token, lifetime) from one grant request; TokenUnavailable saying why not."""
        grant = self.account.sign_grant(int(now), self.token_uri)
        body = urlencode({"grant_type": GRANT_TYPE, "assertion": grant}).encode()
        headers = [("content-type", "application/x-www-form-urlencoded"), ("content-length", str(len(body)))]
        where = f"the token endpoint {self.token_uri}"
        try:
            response = await self._client.request("POST", self._path, headers, body, self.timeout)
        except ConnectFailed as exc:
            if exc.tls is not None:
                raise TokenUnavailable(Outcome(CONFIGURATION, reason="token endpoint TLS", detail=(
                    f"the TLS certificate of {where} is not trusted ({exc.tls.verify_message}): check "
                    "token_uri/ca_file"))) from None
            raise TokenUnavailable(Outcome(TRANSIENT, detail=f"{where}: {exc}", refused=exc.refused)) from None
        except (TimeoutError, asyncio.TimeoutError):
            raise TokenUnavailable(Outcome(TRANSIENT, detail=f"no answer from {where} in "
                                                             f"{self.timeout:g} s")) from None
        except Http2Error as exc:
            raise TokenUnavailable(Outcome(TRANSIENT, detail=f"{where}: {exc}")) from None
        token, lifetime, problem = _token_answer(response)
        if token is None:
            status = response.status
            kind = TRANSIENT if status >= 500 or status in (408, 429) else CONFIGURATION
            retry = parse_retry_after(response.headers.get("retry-after")) if kind == TRANSIENT else None
            raise TokenUnavailable(Outcome(kind, status, problem or None, retry_after=retry, detail=(
                f"{where} refused the service account's grant ({status} {problem or 'no reason'}): check "
                "the service account key and this host's clock" if kind == CONFIGURATION else
                f"{where} answered {status}")))
        return token, lifetime


def _token_answer(response: Response) -> tuple[str | None, int, str]:
    """(access token, lifetime seconds, error) of a token endpoint's answer."""
    try:
        doc = json.loads(response.body) if response.body else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    error = doc.get("error") if isinstance(doc.get("error"), str) else ""
    if response.status != 200:
        return None, 0, error[:64]
    token, lifetime = doc.get("access_token"), doc.get("expires_in")
    if not isinstance(token, str) or not token or len(token) > 8192 or any(c.isspace() for c in token):
        return None, 0, "no access_token in the answer"
    if not isinstance(lifetime, int) or isinstance(lifetime, bool) or lifetime <= 0:
        lifetime = 3600  # Google's tokens last an hour
    return token, lifetime, ""


# -- the profile and the transport -----------------------------------------------------------------


@dataclass(frozen=True)
class FcmProfile:
    """What one fcm app profile needs to reach FCM (from its `app_profiles` entry)."""

    account: ServiceAccount
    project_id: str
    fcm_url: str = FCM_URL
    token_uri: str = TOKEN_URI
    ca_file: str | None = None
    source: str = ""  # the file path or stored fingerprint it came from (never the key)

    @property
    def path(self) -> str:
        return f"/v1/projects/{self.project_id}/messages:send"

    @property
    def token_key(self) -> tuple:
        """Profiles with equal keys share one AccessToken."""
        return ("fcm-token", self.account.client_email, self.account.fingerprint, self.token_uri, self.ca_file)


def load_profile(entry: dict, stored: dict[str, bytes] | None) -> FcmProfile | None:
    """The FcmProfile of an fcm `app_profiles` entry; ProfileError naming the field. A
    `service_account_stored` account is read from `stored` (fingerprint -> JSON bytes); without
    it (a check with no database) its shape is checked and None returned."""
    import os

    for name in FCM_FIELDS:
        if name in entry and (not isinstance(entry[name], str) or not entry[name]):
            raise ProfileError(name, "expected non-empty text")
    has_file, has_stored = "service_account_file" in entry, "service_account_stored" in entry
    if has_file and has_stored:
        raise ProfileError("service_account_stored", "give service_account_file or service_account_stored, not both")
    if not has_file and not has_stored:
        raise ProfileError("service_account_file", "an fcm profile needs its service account key: "
                           "service_account_file (an absolute path) or one uploaded in the dashboard")
    for name in ("service_account_file", "ca_file"):
        if name in entry and not os.path.isabs(entry[name]):
            raise ProfileError(name, "use an absolute path (the file is read again at every start and reload)")
    name = "fcm_url"
    try:
        fcm_url = check_url(entry.get("fcm_url", FCM_URL), "fcm_url")
        name = "token_uri"
        token_uri = check_url(entry.get("token_uri", TOKEN_URI), "token_uri", path=True)
        if "ca_file" in entry:
            name = "ca_file"
            check_ca_file(entry["ca_file"])
        if "project_id" in entry and not _PROJECT.fullmatch(entry["project_id"]):
            raise ProfileError("project_id", "not a Google Cloud project id (6-30 lowercase letters, digits and "
                               "hyphens) or project number")
        if has_stored:
            name = "service_account_stored"
            data = None if stored is None else stored.get(entry["service_account_stored"])
            if data is None:
                if stored is None:
                    return None  # shape checked; the account itself is in the database
                raise CredentialError(f"no uploaded service account {entry['service_account_stored']} in this "
                                      "database")
            account, source = ServiceAccount.parse(data), entry["service_account_stored"] + " (stored)"
        else:
            name = "service_account_file"
            account, source = ServiceAccount.load(entry["service_account_file"]), entry["service_account_file"]
    except CredentialError as exc:
        raise ProfileError(name, str(exc)) from None
    if account.token_uri.rstrip("/") != token_uri.rstrip("/"):
        # The grant's audience is the endpoint it goes to: a key file naming another endpoint is
        # followed only when the operator says so in the profile (never by the file alone).
        raise ProfileError("token_uri", f"the service account names the token endpoint {account.token_uri}; "
                           f"this profile uses {token_uri}: set token_uri = {json.dumps(account.token_uri)} in the "
                           "profile to use it")
    project = entry.get("project_id", account.project_id)
    if not _PROJECT.fullmatch(project):
        raise ProfileError("project_id", "the service account's project_id is not a Google Cloud project id: "
                           "set project_id in the profile")
    return FcmProfile(account, project, fcm_url.rstrip("/"), token_uri, entry.get("ca_file"), source)


class FcmTransport:
    """Sends wakes for the fcm profiles of one account and project over one HTTP/2 connection."""

    def __init__(self, profile: FcmProfile, *, token: AccessToken | None = None,
                 timeout: float = REQUEST_TIMEOUT, clock: Callable[[], float] = time.time):
        self.profile = profile
        self.token = token or AccessToken(profile.account, profile.token_uri, profile.ca_file)
        self._owns_token = token is None
        self.timeout = timeout
        self.clock = clock
        self._path = profile.path
        # The body (token, ttl) and the bearer token vary; headers other than authorization do not.
        self._client = Http2Client(profile.fcm_url, ssl_context(profile.ca_file),
                                   volatile=frozenset({"authorization", "content-length"}))

    async def close(self) -> None:
        await self._client.close()
        if self._owns_token:
            await self.token.close()

    def body(self, request: WakeRequest) -> bytes:
        """The exact message bytes of one attempt (the endpoint checked first by `send`)."""
        return message_body(request.endpoint, ttl_of(request.expires_at, self.clock()))

    async def send(self, request: WakeRequest) -> Outcome:
        if not _FCM_TOKEN.fullmatch(request.endpoint):
            return Outcome(INVALID_ENDPOINT, reason="INVALID_ARGUMENT",
                           detail="the endpoint is not an FCM registration token; not sent")
        try:
            stale = await self.token.current()
        except TokenUnavailable as exc:
            return exc.outcome
        outcome = await self._attempt(request, stale)
        if outcome.kind == REFRESH_RETRY:
            # One new access token and one retry (FCM: 401 means the token is no longer valid).
            try:
                fresh = await self.token.refresh(stale)
            except TokenUnavailable as exc:
                return exc.outcome
            outcome = await self._attempt(request, fresh)
            if outcome.kind == REFRESH_RETRY:
                return Outcome(CONFIGURATION, outcome.status, outcome.reason,
                               detail="FCM refuses a freshly made access token: check the service account's "
                                      "permissions (Firebase Cloud Messaging API enabled?) and this host's clock")
            note = "retried once with a new access token after 401"
            outcome = dataclasses.replace(outcome, detail=f"{note}; {outcome.detail}" if outcome.detail else note)
        return outcome

    async def _attempt(self, request: WakeRequest, access_token: str) -> Outcome:
        body = self.body(request)
        headers = [("authorization", f"Bearer {access_token}"), ("content-type", "application/json"),
                   ("content-length", str(len(body)))]
        for retry in (True, False):
            try:
                response = await self._client.request("POST", self._path, headers, body, self.timeout)
            except StreamRefused as exc:
                if retry:  # never processed (GOAWAY, REFUSED_STREAM): once more on a fresh connection
                    continue
                return Outcome(TRANSIENT, detail=f"FCM refused the stream: {exc}")
            except ConnectFailed as exc:
                if exc.tls is not None:
                    return Outcome(CONFIGURATION, detail=f"the TLS certificate of {self.profile.fcm_url} is not "
                                                         f"trusted ({exc.tls.verify_message}): check fcm_url/ca_file")
                return Outcome(TRANSIENT, detail=str(exc), refused=exc.refused)
            except (TimeoutError, asyncio.TimeoutError):
                return Outcome(TRANSIENT, detail=f"no answer from {self.profile.fcm_url} in {self.timeout:g} s")
            except Http2Error as exc:
                return Outcome(TRANSIENT, detail=str(exc))
            return outcome_of(response)
        raise AssertionError("unreachable")


def outcome_of(response: Response) -> Outcome:
    """The Outcome of one FCM HTTP v1 response."""
    status = response.status
    if status == 200:
        return Outcome(ACCEPTED, status)
    code, google_status, blames_token, _message = _error_parts(response.body)
    kind = classify(status, code, blames_token)
    reason = code if code and code != "UNSPECIFIED_ERROR" else google_status
    retry_after = parse_retry_after(response.headers.get("retry-after")) if kind == TRANSIENT else None
    detail = ""
    if kind == PERMANENT and (code == "INVALID_ARGUMENT" or status == 400):
        detail = "FCM called the request invalid without blaming the token: the endpoint is kept"
    elif code == "SENDER_ID_MISMATCH":
        detail = "the token belongs to another Firebase project than this profile's service account"
    elif code == "THIRD_PARTY_AUTH_ERROR":
        detail = "FCM's credentials for the app's platform (APNs certificate, web push key) were refused"
    elif kind == CONFIGURATION and status in (403, 404):
        detail = "the service account may not send for this project (check project_id and its roles)"
    return Outcome(kind, status, reason, retry_after=retry_after, detail=detail)
