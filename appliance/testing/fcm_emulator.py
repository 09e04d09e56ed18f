"""A local FCM: Google's OAuth2 token endpoint and FCM HTTP v1 `messages:send`, over HTTP/2 + TLS.

The token endpoint (`POST /token`, form-encoded) checks a JWT bearer grant as Google does:

    grant_type other than urn:ietf:params:oauth:grant-type:jwt-bearer    400 unsupported_grant_type
    a JWT that is not RS256 signed by a known service account key        400 invalid_grant
      (kid = private_key_id, iss = client_email), or whose aud is not
      this endpoint, or that is not short-lived (exp - iat <= 1 hour,
      iat not in the future, exp not past)
    a scope without firebase.messaging                                   400 invalid_scope
    forced (`fail_grants`)                                               whatever the test asked
    otherwise                                                            200 {access_token, expires_in}

`POST /v1/projects/<project>/messages:send` answers with Google's error shape (`error.code`,
`status`, `message`, and an FcmError `errorCode` detail where FCM gives one):

    no `authorization: Bearer <token>`, or one this endpoint did not issue,
      or one past its lifetime (or expired by hand)                      401 UNAUTHENTICATED
    a project other than the token's account's                           403 PERMISSION_DENIED
    a body that is not one message with a token: unknown fields, data    400 INVALID_ARGUMENT
      values that are not strings, reserved data keys, a bad priority     (BadRequest naming the field)
      or ttl, over 4096 bytes
    a token that is not a registration token's characters                400 INVALID_ARGUMENT (FcmError)
    a behaviour forced for the token (`behave`)                          that errorCode's status, with
                                                                         Retry-After if asked
    a token unregistered (`unregister`)                                  404 UNREGISTERED
    otherwise                                                            200 {"name": ".../messages/<id>"}

It serves on the APNs emulator's HTTP/2 connection class (`apns_emulator._Connection`), which
asks of its emulator only `answer`, `_recorded`, `_take_disruption`, `disrupted` and
`_connections`. In process (`await emu.start()`), on a thread (`start_in_thread()`), or as
`appliance emulator fcm`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from .apns_emulator import _Answer, _Connection
from .threaded import OnItsOwnThread
from .tls import LocalPki, make_test_pki

TOKEN_PATH = "/token"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
MAX_MESSAGE = 4096
# Google status and HTTP code of each FCM ErrorCode.
ERROR_STATUS = {
    "INVALID_ARGUMENT": (400, "INVALID_ARGUMENT"),
    "UNREGISTERED": (404, "NOT_FOUND"),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED"),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED"),
    "UNAVAILABLE": (503, "UNAVAILABLE"),
    "INTERNAL": (500, "INTERNAL"),
    "THIRD_PARTY_AUTH_ERROR": (401, "UNAUTHENTICATED"),
    "UNSPECIFIED_ERROR": (500, "UNKNOWN"),
}
# What Google says with each forced ErrorCode (the token's fault is said in words only).
ERROR_MESSAGES = {
    "INVALID_ARGUMENT": "The registration token is not a valid FCM registration token",
    "UNREGISTERED": "Requested entity was not found.",
    "SENDER_ID_MISMATCH": "SenderId mismatch",
    "QUOTA_EXCEEDED": "Quota exceeded.",
    "UNAVAILABLE": "The service is currently unavailable.",
    "INTERNAL": "Internal error encountered.",
    "THIRD_PARTY_AUTH_ERROR": "Auth error from APNS or Web Push Service",
}
_SEND_PATH = re.compile(r"/v1/projects/([^/]+)/messages:send")
# What the transport sends (URL-safe base64, ":" and "."); anything else is refused as FCM would.
_TOKEN = re.compile(r"[A-Za-z0-9_:\-.]{1,4096}")
_TTL = re.compile(r"[0-9]{1,10}(\.[0-9]{1,9})?s")
_MESSAGE_FIELDS = {"token", "data", "android", "name"}
_ANDROID_FIELDS = {"priority", "ttl", "collapse_key", "restricted_package_name", "direct_boot_ok"}


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Account:
    client_email: str
    project_id: str
    public_key: rsa.RSAPublicKey


@dataclass
class Forced:
    code: str  # an FCM ErrorCode, or a Google status for an answer without one (UNAUTHENTICATED)
    status: int
    retry_after: int | None = None
    times: int | None = None
    message: str = ""
    field_violation: str | None = None  # a BadRequest detail naming this field instead of FcmError


@dataclass
class Record:
    """One request as received, and how it was answered."""

    at: float
    connection: int
    method: str
    path: str
    token: str | None  # the message's registration token (None for a grant)
    headers: list[tuple[str, str]]
    body: bytes
    status: int = 0
    reason: str | None = None
    message: dict | None = None  # the parsed message (a send) or None
    grant: bool = False

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


class FcmEmulator(OnItsOwnThread):
    """The emulated token endpoint and FCM API. Add accounts, then start it."""

    THREAD_NAME = "fcm-emulator"

    def __init__(self, *, pki_dir: str | Path | None = None, clock: Callable[[], float] = time.time,
                 token_lifetime: int = 3599, log_file: str | Path | None = None):
        self.clock = clock
        self.token_lifetime = token_lifetime
        self._accounts: dict[str, Account] = {}  # private_key_id -> account
        self._tokens: dict[str, tuple[Account, float]] = {}  # access token -> (account, valid until)
        self._unregistered: set[str] = set()
        self._forced: dict[str | None, Forced] = {}
        self._grant_failures: list[tuple[int, str]] = []
        self._disruptions: list[str] = []
        self.disrupted = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.records: list[Record] = []
        self.keep_records = True
        self.answered = 0
        self.grants = 0  # access tokens issued
        self._connections = 0
        self._pki_dir = Path(pki_dir) if pki_dir else None
        self.pki: LocalPki | None = None
        self.tls_hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_record: Callable[[Record], None] | None = None
        # Sends are logged a loop iteration at a time (as the APNs emulator's), for benchmarks.
        self._log = open(log_file, "a") if log_file else None
        self._log_flush_due = False
        self.port = 0
        self.host_shown = "127.0.0.1"

    # -- configuration -----------------------------------------------------------------------------

    def add_account(self, client_email: str, private_key_id: str, public_key, project_id: str) -> None:
        """Trust grants signed by `public_key` (an RSA key object or PEM) as this service account."""
        if isinstance(public_key, (bytes, str)):
            public_key = serialization.load_pem_public_key(public_key.encode() if isinstance(public_key, str)
                                                           else public_key)
        if isinstance(public_key, rsa.RSAPrivateKey):
            public_key = public_key.public_key()
        with self._lock:
            self._accounts[private_key_id] = Account(client_email, project_id, public_key)

    def service_account(self, project_id: str = "appliance-emulator", *, key: rsa.RSAPrivateKey | None = None,
                        client_email: str | None = None, private_key_id: str | None = None) -> dict:
        """A new service account this emulator trusts, as Google's key file JSON (its token_uri is
        this emulator's token endpoint: start the emulator first)."""
        key = key or rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private_key_id = private_key_id or secrets.token_hex(20)
        client_email = client_email or f"appliance@{project_id}.iam.gserviceaccount.com"
        self.add_account(client_email, private_key_id, key.public_key(), project_id)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        return {"type": "service_account", "project_id": project_id, "private_key_id": private_key_id,
                "private_key": pem, "client_email": client_email, "client_id": "1" * 21,
                "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": self.token_url,
                "universe_domain": "googleapis.com"}

    def unregister(self, token: str) -> None:
        """From now on the token answers 404 UNREGISTERED (the app was uninstalled)."""
        with self._lock:
            self._unregistered.add(token)

    def behave(self, token: str | None, code: str, *, status: int | None = None, retry_after: int | None = None,
               times: int | None = None, message: str = "", field_violation: str | None = None) -> None:
        """Answer sends to `token` (every token if None), after authentication, with this FCM
        ErrorCode (its HTTP status unless `status`); `field_violation` sends a BadRequest detail
        naming that field instead of the FcmError detail."""
        status = status or ERROR_STATUS.get(code, (500, code))[0]
        with self._lock:
            self._forced[token] = Forced(code, status, retry_after, times, message, field_violation)

    def clear(self, token: str | None = None) -> None:
        with self._lock:
            self._forced.pop(token, None)

    def expire_access_tokens(self) -> None:
        """Every access token issued so far now answers 401 UNAUTHENTICATED."""
        with self._lock:
            self._tokens = {t: (a, 0.0) for t, (a, _until) in self._tokens.items()}

    def fail_grants(self, status: int, error: str, times: int = 1) -> None:
        """The next `times` grants are refused with this status and OAuth error."""
        with self._lock:
            self._grant_failures.extend([(status, error)] * times)

    def disrupt(self, kind: str, times: int = 1) -> None:
        """As the APNs emulator's: `goaway`, `reset` or `silent` for the next `times` requests."""
        if kind not in ("goaway", "reset", "silent"):
            raise ValueError(f"unknown disruption {kind!r}")
        with self._lock:
            self._disruptions.extend([kind] * times)

    def _take_disruption(self) -> str | None:
        with self._lock:
            return self._disruptions.pop(0) if self._disruptions else None

    # -- observation -----------------------------------------------------------------------------

    def requests(self, token: str | None = None) -> list[Record]:
        with self._lock:
            return [r for r in self.records if not r.grant and (token is None or r.token == token)]

    def accepted(self, token: str | None = None) -> list[Record]:
        return [r for r in self.requests(token) if r.status == 200]

    def wait_for(self, predicate: Callable[[list[Record]], bool], timeout: float = 10.0) -> list[Record]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate([r for r in self.records if not r.grant]):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"emulator: condition not met in {timeout} s; got "
                                         f"{[(r.token, r.status, r.reason) for r in self.records]}")
                self._changed.wait(left)
            return [r for r in self.records if not r.grant]

    # -- the API -----------------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
               binding: dict) -> tuple[_Answer, Record]:
        now = self.clock()
        record = Record(now, binding.get("id", 0), method, path, None, headers, body)
        with self._lock:
            if path == TOKEN_PATH:
                record.grant = True
                answer = self._grant(method, dict(headers), body, now)
            else:
                answer = self._send(method, path, dict(headers), body, record, now)
        record.status, record.reason = answer.status, answer.reason
        return answer, record

    @staticmethod
    def _json(status: int, doc: dict, reason: str | None, extra: list | None = None) -> _Answer:
        body = json.dumps(doc, separators=(",", ":")).encode()
        return _Answer(status, reason, None, [("content-type", "application/json; charset=UTF-8")] + (extra or []),
                       body)

    def _oauth_error(self, status: int, error: str, description: str) -> _Answer:
        return self._json(status, {"error": error, "error_description": description}, error)

    def _grant(self, method: str, h: dict, body: bytes, now: float) -> _Answer:
        if method != "POST":
            return self._oauth_error(405, "invalid_request", "POST only")
        if self._grant_failures:
            status, error = self._grant_failures.pop(0)
            return self._oauth_error(status, error, "forced by the test")
        if not h.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            return self._oauth_error(400, "invalid_request", "expected a form-encoded body")
        form = {k: v[0] for k, v in parse_qs(body.decode("ascii", "replace")).items()}
        if form.get("grant_type") != GRANT_TYPE:
            return self._oauth_error(400, "unsupported_grant_type", "Invalid grant_type")
        claims = self._verify_grant(form.get("assertion", ""), now)
        if isinstance(claims, str):
            return self._oauth_error(400, "invalid_grant", claims)
        account, scope = claims
        if SCOPE not in scope.split():
            return self._oauth_error(400, "invalid_scope", "the scope does not allow FCM")
        token = "ya29.emu-" + secrets.token_urlsafe(32)
        self._tokens[token] = (account, now + self.token_lifetime)
        self.grants += 1
        return self._json(200, {"access_token": token, "expires_in": self.token_lifetime,
                                "token_type": "Bearer"}, None)

    def _verify_grant(self, jwt: str, now: float) -> tuple[Account, str] | str:
        try:
            head_b64, claims_b64, sig_b64 = jwt.split(".")
            header = json.loads(_b64url_decode(head_b64))
            claims = json.loads(_b64url_decode(claims_b64))
            signature = _b64url_decode(sig_b64)
        except (ValueError, TypeError):
            return "Invalid JWT: not a JWS"
        if not isinstance(header, dict) or header.get("alg") != "RS256" or not isinstance(claims, dict):
            return "Invalid JWT: not RS256"
        account = self._accounts.get(header.get("kid"))
        if account is None:
            return "Invalid JWT Signature."
        try:
            account.public_key.verify(signature, f"{head_b64}.{claims_b64}".encode(), padding.PKCS1v15(),
                                      hashes.SHA256())
        except InvalidSignature:
            return "Invalid JWT Signature."
        if claims.get("iss") != account.client_email:
            return "Invalid JWT: iss is not the key's service account"
        if claims.get("aud") != self.token_url:
            return "Invalid JWT: aud is not this token endpoint"
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or not isinstance(exp, int) or exp - iat > 3600 or exp <= iat:
            return "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe."
        if iat > now + 300 or exp < now:
            return "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe."
        scope = claims.get("scope")
        return account, scope if isinstance(scope, str) else ""

    def _error(self, status: int, google_status: str, message: str, code: str | None = None,
               field_violation: str | None = None, retry_after: int | None = None) -> _Answer:
        details = []
        if field_violation is not None:
            details.append({"@type": "type.googleapis.com/google.rpc.BadRequest",
                            "fieldViolations": [{"field": field_violation, "description": message}]})
        elif code is not None:
            details.append({"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code})
        doc = {"error": {"code": status, "message": message, "status": google_status}}
        if details:
            doc["error"]["details"] = details
        extra = [("retry-after", str(retry_after))] if retry_after is not None else []
        return self._json(status, doc, code or google_status, extra)

    def _send(self, method: str, path: str, h: dict, body: bytes, record: Record, now: float) -> _Answer:
        m = _SEND_PATH.fullmatch(path)
        if m is None:
            return self._error(404, "NOT_FOUND", "Requested entity was not found.")
        if method != "POST":
            return self._error(405, "METHOD_NOT_ALLOWED", "POST only")
        auth = h.get("authorization", "")
        bearer = auth[7:] if auth.startswith("Bearer ") else None
        held = self._tokens.get(bearer) if bearer else None
        if held is None or held[1] <= now:
            return self._error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected "
                               "OAuth 2 access token, login cookie or other valid authentication credential.")
        account = held[0]
        if m.group(1) != account.project_id:
            return self._error(403, "PERMISSION_DENIED", "Permission 'cloudmessaging.messages.create' denied on "
                               "resource (or it may not exist).")
        message, violation = self._check_message(h, body)
        if violation is not None:
            return self._error(400, "INVALID_ARGUMENT", violation[1], field_violation=violation[0])
        record.message = message
        token = message["token"]
        record.token = token
        if not _TOKEN.fullmatch(token):
            return self._error(400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration "
                               "token", code="INVALID_ARGUMENT")
        forced = self._forced.get(token) or self._forced.get(None)
        if forced is not None:
            if forced.times is not None:
                forced.times -= 1
                if forced.times <= 0:
                    self._forced = {k: v for k, v in self._forced.items() if v is not forced}
            google = ERROR_STATUS.get(forced.code, (forced.status, forced.code))[1]
            fcm_code = forced.code if forced.code in ERROR_STATUS else None
            message = forced.message or ERROR_MESSAGES.get(forced.code, f"forced {forced.code}")
            return self._error(forced.status, google, message, code=fcm_code,
                               field_violation=forced.field_violation, retry_after=forced.retry_after)
        if token in self._unregistered:
            return self._error(404, "NOT_FOUND", "Requested entity was not found.", code="UNREGISTERED")
        name = f"projects/{account.project_id}/messages/0:{int(now * 1000)}%{secrets.token_hex(8)}"
        return self._json(200, {"name": name}, None)

    @staticmethod
    def _check_message(h: dict, body: bytes) -> tuple[dict, tuple[str, str] | None]:
        """The message, and (field, why) when FCM would refuse its shape."""
        if not h.get("content-type", "").startswith("application/json"):
            return {}, ("", "expected application/json")
        if len(body) > MAX_MESSAGE + 256:
            return {}, ("message", "Message is too big")
        try:
            doc = json.loads(body)
        except ValueError:
            return {}, ("", "Invalid JSON payload received.")
        if not isinstance(doc, dict) or set(doc) != {"message"} or not isinstance(doc["message"], dict):
            return {}, ("", "Invalid JSON payload received. Expected exactly one message.")
        msg = doc["message"]
        unknown = sorted(set(msg) - _MESSAGE_FIELDS)
        if unknown:
            return msg, (f"message.{unknown[0]}", f"Invalid JSON payload received. Unknown name \"{unknown[0]}\"")
        if not isinstance(msg.get("token"), str):
            return msg, ("message.token", "a message needs a registration token")
        data = msg.get("data", {})
        if not isinstance(data, dict):
            return msg, ("message.data", "data must be a map of strings")
        for k, v in data.items():
            if not isinstance(v, str):
                return msg, (f"message.data[{k}]", f"Invalid value at 'message.data[{k}]' (TYPE_STRING)")
            if k in ("from", "message_type", "notification") or k.startswith(("google", "gcm")):
                return msg, (f"message.data[{k}]", f"Invalid data key {k!r}: reserved")
        android = msg.get("android", {})
        if not isinstance(android, dict):
            return msg, ("message.android", "android must be an object")
        unknown = sorted(set(android) - _ANDROID_FIELDS)
        if unknown:
            return msg, (f"message.android.{unknown[0]}", f"Unknown name \"{unknown[0]}\" at 'message.android'")
        if "priority" in android and str(android["priority"]).lower() not in ("high", "normal"):
            return msg, ("message.android.priority", "Invalid value at 'message.android.priority'")
        ttl = android.get("ttl")
        if ttl is not None and (not isinstance(ttl, str) or not _TTL.fullmatch(ttl)
                                or float(ttl[:-1]) > 28 * 86400):
            return msg, ("message.android.ttl", "Invalid value at 'message.android.ttl' (type.googleapis.com/"
                         "google.protobuf.Duration)")
        size = len(json.dumps(data, separators=(",", ":")))
        if size > MAX_MESSAGE:
            return msg, ("message.data", "Message is too big")
        return msg, None

    def _recorded(self, record: Record) -> None:
        with self._changed:
            self.answered += 1
            if self.keep_records:
                self.records.append(record)
            self._changed.notify_all()
        if self.on_record is not None:
            self.on_record(record)
        if self._log is not None and not record.grant:
            # The APNs emulator's line format (time status reason id token), id "-".
            self._log.write(f"{record.at:.6f} {record.status} {record.reason or '-'} - {record.token or '-'}\n")
            if not self._log_flush_due:
                self._log_flush_due = True
                asyncio.get_running_loop().call_soon(self._flush_log)

    def _flush_log(self) -> None:
        self._log_flush_due = False
        if self._log is not None:
            self._log.flush()

    # -- serving -----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://{self.host_shown}:{self.port}"

    @property
    def token_url(self) -> str:
        return self.url + TOKEN_PATH

    @property
    def ca_file(self) -> str:
        assert self.pki is not None, "start the emulator first"
        return str(self.pki.ca_file)

    def _ssl_context(self):
        import ssl

        if self.pki is None:
            import tempfile

            directory = self._pki_dir or Path(tempfile.mkdtemp(prefix="fcm-emulator-"))
            self.pki = make_test_pki(directory, self.tls_hosts)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.pki.cert_file, self.pki.key_file)
        ctx.set_alpn_protocols(["h2"])
        return ctx

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> "FcmEmulator":
        ctx = self._ssl_context()
        self._server = await asyncio.get_running_loop().create_server(lambda: _Connection(self), host, port, ssl=ctx)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            conns = list(_Connection.open_for(self))
            for conn in conns:
                conn.close()
            if conns:
                await asyncio.wait([asyncio.ensure_future(asyncio.shield(c.lost)) for c in conns], timeout=2)
            await self._server.wait_closed()
            self._server = None


def main(argv: list[str] | None = None) -> int:
    """Run an emulator process; writes a service account key file it trusts and prints one JSON
    line ({"url", "ca_file", "service_account_file", "token_uri"}) once it listens."""
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(prog="python -m appliance.testing.fcm_emulator",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", required=True, help="directory for the test CA, certificate and service account")
    parser.add_argument("--project", default="appliance-emulator")
    parser.add_argument("--log", help="append one line per answered send: time status error - token")
    args = parser.parse_args(argv)
    emu = FcmEmulator(pki_dir=args.dir, log_file=args.log)
    emu.keep_records = False  # a long benchmark would hold every request in memory

    async def serve() -> None:
        await emu.start(port=args.port)
        sa_file = Path(args.dir) / "service-account.json"
        sa_file.write_text(json.dumps(emu.service_account(args.project)))
        print(json.dumps({"url": emu.url, "ca_file": emu.ca_file, "service_account_file": str(sa_file),
                          "token_uri": emu.token_url}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await emu.stop()
        sys.stdout.flush()

    asyncio.run(serve())
    if emu._log is not None:
        emu._log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
