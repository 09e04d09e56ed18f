"""A local APNs: an HTTP/2 server over TLS that answers like Apple's documented provider API.

What it checks, in Apple's order of concern (status and reason as Apple documents them):

    method other than POST                         405 MethodNotAllowed
    path other than /3/device/<token>              404 BadPath
    a header sent twice                            400 DuplicateHeaders
    no `authorization: bearer <jwt>`               403 MissingProviderToken
    a JWT that does not verify (ES256, kid, iss)   403 InvalidProviderToken
    a key scoped to the other environment          403 BadEnvironmentKeyIdInToken
    a second key on one connection                 403 UnrelatedKeyIdInToken
    a JWT older than an hour (or expired by hand)  403 ExpiredProviderToken
    a new JWT sooner than `token_update_interval`  429 TooManyProviderTokenUpdates (off unless set)
    no apns-topic / a topic not configured         400 MissingTopic / 400 TopicDisallowed
    token not hex of 16..100 bytes                 400 BadDeviceToken
    token registered for another topic             400 DeviceTokenNotForTopic
    apns-push-type, apns-priority, apns-id,
      apns-expiration, apns-collapse-id malformed  400 InvalidPushType / BadPriority / BadMessageId /
                                                   BadExpirationDate / BadCollapseId
    empty body / body over 4096 bytes              400 PayloadEmpty / 413 PayloadTooLarge
    behaviour forced for the token (`behave`,      whatever the test asked, optionally with
      or a sequence of answers: `script`)          Retry-After and a delay
    a connection fault forced (`disrupt`)          no answer: GOAWAY (the request unprocessed),
                                                   the TCP connection reset, or silence
    token unregistered (`unregister`)              410 Unregistered with its timestamp (ms)
    otherwise                                      200; apns-unique-id too in the sandbox

Every answer carries `apns-id`: the request's (a well-formed one), else one made up, as Apple's.

Apple documents no Retry-After header for APNs, so the emulator sends one only when a test
forces it (`behave(..., retry_after=N)`); the appliance honours it whenever it is present.

Use it in process (`await emu.start()`), on its own thread (`emu.start_in_thread()`, for tests
that drive a separate appliance process), or as a process of its own (`python -m
appliance.testing.apns_emulator --help`, for benchmarks: it then logs one line per request).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import signal
import ssl
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import h2.config
import h2.errors
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from hpack import NeverIndexedHeaderTuple
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from .threaded import OnItsOwnThread
from .tls import LocalPki, make_test_pki

# Apple's limits and formats.
MAX_PAYLOAD = 4096
TOKEN_MAX_AGE = 3600  # seconds: older provider tokens are ExpiredProviderToken
TOKEN_FUTURE_SKEW = 300  # seconds a provider token's iat may lie ahead of our clock
PUSH_TYPES = frozenset({"alert", "background", "location", "voip", "complication", "fileprovider", "mdm",
                        "liveactivity", "pushtotalk", "controls", "widgets"})
PRIORITIES = frozenset({"1", "5", "10"})
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DEVICE_TOKEN = re.compile(r"(?:[0-9a-fA-F]{2}){16,100}")
_PATH = re.compile(r"/3/device/([^/?#]*)")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Forced:
    """A behaviour forced for one device token (or for every token when `token` is None)."""

    status: int | None = None  # None: answer normally (after `delay`)
    reason: str | None = None
    retry_after: int | None = None
    times: int | None = None  # how many requests it applies to; None: all
    delay: float = 0.0  # seconds before the answer goes out
    timestamp: int | None = None  # 410's timestamp (ms); now when absent


@dataclass
class Record:
    """One request as received, and how it was answered."""

    at: float  # time.time() when the request was complete
    connection: int
    method: str
    path: str
    token: str | None
    headers: list[tuple[str, str]]
    body: bytes
    status: int = 0
    reason: str | None = None
    apns_id: str | None = None  # as answered (the request's, or one made up)
    key_id: str | None = None
    issued_at: int | None = None
    jwt: str | None = None

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass
class _Key:
    team_id: str
    public_key: ec.EllipticCurvePublicKey
    environment: str | None = None  # a key scoped to one environment; None: team-wide


@dataclass
class _Answer:
    status: int
    reason: str | None = None
    apns_id: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    delay: float = 0.0


class ApnsEmulator(OnItsOwnThread):
    """The emulated provider API. Configure keys and topics, then start it."""

    THREAD_NAME = "apns-emulator"

    def __init__(self, *, environment: str = "production", topics: Iterable[str] = (),
                 token_update_interval: float | None = None, pki_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.time, log_file: str | Path | None = None):
        self.environment = environment
        self.topics: set[str] = set(topics)
        self.token_update_interval = token_update_interval
        self.clock = clock
        self._keys: dict[str, _Key] = {}
        self._token_topics: dict[str, str] = {}
        self._unregistered: dict[str, int] = {}
        self._forced: dict[str | None, Forced] = {}
        self._scripts: dict[str, list[tuple[int, str | None]]] = {}
        self._disruptions: list[str] = []
        self.disrupted = 0  # requests left unanswered by `disrupt`
        self._expired_jwts: set[str] = set()
        self._last_jwt: dict[str, tuple[str, float]] = {}  # key id -> (jwt, first seen)
        self._verified: dict[str, tuple[str, int]] = {}  # jwt -> (key id, iat): verify each JWT once
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.records: list[Record] = []
        self.keep_records = True
        self.answered = 0
        self._pki_dir = Path(pki_dir) if pki_dir else None
        self.pki: LocalPki | None = None  # set before start() to serve an existing certificate
        #: names and addresses the certificate made at start() is valid for
        self.tls_hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
        self._server: asyncio.AbstractServer | None = None
        self._connections = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The log is written a loop iteration at a time (`_recorded`), not a write(2) per line.
        self._log = open(log_file, "a") if log_file else None
        self._log_flush_due = False
        #: called with each answered Record, on the emulator's loop (`appliance emulator apns` prints it)
        self.on_record: Callable[[Record], None] | None = None
        self.port = 0

    # -- configuration -----------------------------------------------------------------------------

    def add_key(self, team_id: str, key_id: str, public_key, *, environment: str | None = None) -> None:
        """Trust provider tokens signed by `public_key` (an EC key object or PEM bytes) as `key_id`."""
        if isinstance(public_key, (bytes, str)):
            public_key = serialization.load_pem_public_key(public_key.encode() if isinstance(public_key, str)
                                                           else public_key)
        if isinstance(public_key, ec.EllipticCurvePrivateKey):
            public_key = public_key.public_key()
        with self._lock:
            self._keys[key_id] = _Key(team_id, public_key, environment)

    def add_topic(self, topic: str) -> None:
        with self._lock:
            self.topics.add(topic)

    def register_token(self, token: str, topic: str) -> None:
        """Bind a device token to one topic: other topics get DeviceTokenNotForTopic."""
        with self._lock:
            self._token_topics[token] = topic

    def unregister(self, token: str, at: float | None = None) -> None:
        """From now on the token answers 410 Unregistered (as when the app was removed)."""
        with self._lock:
            self._unregistered[token] = int((self.clock() if at is None else at) * 1000)

    def reregister(self, token: str) -> None:
        with self._lock:
            self._unregistered.pop(token, None)

    def behave(self, token: str | None, status: int | None = None, reason: str | None = None, *,
               retry_after: int | None = None, times: int | None = None, delay: float = 0.0,
               timestamp: int | None = None) -> None:
        """Force how requests for `token` (every token if None) are answered after authentication."""
        with self._lock:
            self._forced[token] = Forced(status, reason, retry_after, times, delay, timestamp)

    def script(self, token: str, answers: Iterable[tuple[int, str | None]]) -> None:
        """Answer the next requests for `token` with these (status, reason) in turn, then normally."""
        with self._lock:
            self._scripts[token] = list(answers)

    def disrupt(self, kind: str, times: int = 1) -> None:
        """The next `times` requests get no answer: `goaway` sends GOAWAY (NO_ERROR, Apple's
        `{"reason": "Shutdown"}`, the request's stream past the last one processed) and closes the
        connection; `reset` aborts the TCP connection (RST) mid-request; `silent` leaves the
        connection open but reads and answers nothing more on it, PING included (a dead peer
        behind a path that never resets)."""
        if kind not in ("goaway", "reset", "silent"):
            raise ValueError(f"unknown disruption {kind!r}")
        with self._lock:
            self._disruptions.extend([kind] * times)

    def _take_disruption(self) -> str | None:
        with self._lock:
            return self._disruptions.pop(0) if self._disruptions else None

    def clear(self, token: str | None = None) -> None:
        with self._lock:
            self._forced.pop(token, None)
            self._scripts.pop(token, None)

    def expire_provider_tokens(self) -> None:
        """Every provider token seen so far now answers 403 ExpiredProviderToken."""
        with self._lock:
            self._expired_jwts.update(self._verified)
            self._last_jwt.clear()

    # -- observation -----------------------------------------------------------------------------

    def requests(self, token: str | None = None) -> list[Record]:
        with self._lock:
            return [r for r in self.records if token is None or r.token == token]

    def accepted(self, token: str | None = None) -> list[Record]:
        return [r for r in self.requests(token) if r.status == 200]

    def wait_for(self, predicate: Callable[[list[Record]], bool], timeout: float = 10.0) -> list[Record]:
        """Block until `predicate(records)` holds; AssertionError with the records after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.records):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"emulator: condition not met in {timeout} s; got "
                                         f"{[(r.token, r.status, r.reason) for r in self.records]}")
                self._changed.wait(left)
            return list(self.records)

    def reset_records(self) -> None:
        with self._lock:
            self.records.clear()

    # -- the API -----------------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
               binding: dict) -> tuple[_Answer, Record]:
        """Apple's answer to one complete request; `binding` is per-connection state."""
        now = self.clock()
        m = _PATH.fullmatch(path)
        record = Record(now, binding.get("id", 0), method, path, m.group(1) if m else None, headers, body)
        with self._lock:
            answer = self._answer(method, m, headers, body, binding, record, now)
        if answer.apns_id is None:  # Apple answers every request with an apns-id (its own if none came)
            answer.apns_id = str(uuid.uuid4())
        record.status, record.reason, record.apns_id = answer.status, answer.reason, answer.apns_id
        return answer, record

    def _error(self, status: int, reason: str, apns_id: str | None, **extra) -> _Answer:
        body = json.dumps({"reason": reason, **extra}, separators=(",", ":")).encode()
        return _Answer(status, reason, apns_id, [("content-type", "application/json")], body)

    def _answer(self, method, m, headers, body, binding, record: Record, now: float) -> _Answer:
        names = [k for k, _v in headers]
        h = dict(headers)
        apns_id = h.get("apns-id")
        # A malformed apns-id is never echoed (it is answered BadMessageId below).
        apns_id_echo = apns_id if apns_id is None or _UUID.fullmatch(apns_id) else None
        if method != "POST":
            return self._error(405, "MethodNotAllowed", apns_id_echo)
        if m is None:
            return self._error(404, "BadPath", apns_id_echo)
        if len(names) != len(set(names)):
            return self._error(400, "DuplicateHeaders", apns_id_echo)
        # -- the provider token
        auth = h.get("authorization")
        if not auth:
            return self._error(403, "MissingProviderToken", apns_id_echo)
        scheme, _, jwt = auth.partition(" ")
        jwt = jwt.strip()
        if scheme.lower() != "bearer" or not jwt:
            return self._error(403, "InvalidProviderToken", apns_id_echo)
        verified = self._verify_jwt(jwt)
        if verified is None:
            return self._error(403, "InvalidProviderToken", apns_id_echo)
        key_id, iat = verified
        record.key_id, record.issued_at, record.jwt = key_id, iat, jwt
        key = self._keys[key_id]
        if key.environment is not None and key.environment != self.environment:
            return self._error(403, "BadEnvironmentKeyIdInToken", apns_id_echo)
        bound = binding.setdefault("key_id", key_id)
        if bound != key_id:
            return self._error(403, "UnrelatedKeyIdInToken", apns_id_echo)
        if jwt in self._expired_jwts or now - iat > TOKEN_MAX_AGE:
            return self._error(403, "ExpiredProviderToken", apns_id_echo)
        if self.token_update_interval is not None:
            last = self._last_jwt.get(key_id)
            if last is not None and last[0] != jwt and now - last[1] < self.token_update_interval:
                return self._error(429, "TooManyProviderTokenUpdates", apns_id_echo)
            if last is None or last[0] != jwt:
                self._last_jwt[key_id] = (jwt, now)
        # -- the request
        topic = h.get("apns-topic")
        if not topic:
            return self._error(400, "MissingTopic", apns_id_echo)
        if self.topics and topic not in self.topics:
            return self._error(400, "TopicDisallowed", apns_id_echo)
        token = m.group(1)
        if not token:
            return self._error(400, "MissingDeviceToken", apns_id_echo)
        if not _DEVICE_TOKEN.fullmatch(token):
            return self._error(400, "BadDeviceToken", apns_id_echo)
        bound_topic = self._token_topics.get(token)
        if bound_topic is not None and bound_topic != topic:
            return self._error(400, "DeviceTokenNotForTopic", apns_id_echo)
        push_type = h.get("apns-push-type")
        if push_type is not None and push_type not in PUSH_TYPES:
            return self._error(400, "InvalidPushType", apns_id_echo)
        if "apns-priority" in h and h["apns-priority"] not in PRIORITIES:
            return self._error(400, "BadPriority", apns_id_echo)
        if apns_id is not None and apns_id_echo is None:
            return self._error(400, "BadMessageId", None)
        if "apns-expiration" in h and not h["apns-expiration"].isdigit():
            return self._error(400, "BadExpirationDate", apns_id_echo)
        if len(h.get("apns-collapse-id", "").encode()) > 64:
            return self._error(400, "BadCollapseId", apns_id_echo)
        if not body:
            return self._error(400, "PayloadEmpty", apns_id_echo)
        if len(body) > MAX_PAYLOAD:
            return self._error(413, "PayloadTooLarge", apns_id_echo)
        # -- what a test asked for
        script = self._scripts.get(token)
        if script:
            status, reason = script.pop(0)
            if status != 200:
                if status == 410:
                    return self._error(410, reason, apns_id_echo, timestamp=int(now * 1000))
                return self._error(status, reason, apns_id_echo) if reason else _Answer(status, None, apns_id_echo)
            return _Answer(200, None, apns_id_echo)
        forced = self._forced.get(token) or self._forced.get(None)
        delay = 0.0
        if forced is not None:
            if forced.times is not None:
                forced.times -= 1
                if forced.times <= 0:
                    self._forced = {k: v for k, v in self._forced.items() if v is not forced}
            delay = forced.delay
            if forced.status is not None and forced.status != 200:
                if forced.reason is None:
                    answer = _Answer(forced.status, None, apns_id_echo)
                elif forced.status == 410:
                    answer = self._error(410, forced.reason, apns_id_echo, timestamp=forced.timestamp
                                         if forced.timestamp is not None else int(now * 1000))
                else:
                    answer = self._error(forced.status, forced.reason, apns_id_echo)
                if forced.retry_after is not None:
                    answer.headers.append(("retry-after", str(forced.retry_after)))
                answer.delay = delay
                return answer
        if token in self._unregistered:
            answer = self._error(410, "Unregistered", apns_id_echo, timestamp=self._unregistered[token])
            answer.delay = delay
            return answer
        headers_out = []
        if self.environment == "sandbox":
            headers_out.append(("apns-unique-id", str(uuid.uuid4())))
        return _Answer(200, None, apns_id_echo, headers_out, b"", delay)

    def _verify_jwt(self, jwt: str) -> tuple[str, int] | None:
        """(key id, iat) of a provider token that verifies against a configured key, else None."""
        cached = self._verified.get(jwt)
        if cached is not None:
            return cached
        try:
            head_b64, claims_b64, sig_b64 = jwt.split(".")
            header = json.loads(_b64url_decode(head_b64))
            claims = json.loads(_b64url_decode(claims_b64))
            sig = _b64url_decode(sig_b64)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            return None
        if header.get("alg") != "ES256" or not isinstance(header.get("kid"), str):
            return None
        key = self._keys.get(header["kid"])
        iat = claims.get("iat")
        if key is None or claims.get("iss") != key.team_id or not isinstance(iat, int) or isinstance(iat, bool):
            return None
        if iat > self.clock() + TOKEN_FUTURE_SKEW or len(sig) != 64:
            return None
        der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
        try:
            key.public_key.verify(der, f"{head_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return None
        result = (header["kid"], iat)
        self._verified[jwt] = result
        return result

    def _recorded(self, record: Record) -> None:
        with self._changed:
            self.answered += 1
            if self.keep_records:
                self.records.append(record)
            self._changed.notify_all()
        if self.on_record is not None:
            self.on_record(record)
        if self._log is not None:
            self._log.write(f"{record.at:.6f} {record.status} {record.reason or '-'} {record.apns_id or '-'} "
                            f"{record.token or '-'}\n")
            if not self._log_flush_due:
                self._log_flush_due = True
                asyncio.get_running_loop().call_soon(self._flush_log)

    def _flush_log(self) -> None:
        self._log_flush_due = False
        if self._log is not None:
            self._log.flush()

    # -- serving -----------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        if self.pki is None:
            import tempfile

            directory = self._pki_dir or Path(tempfile.mkdtemp(prefix="apns-emulator-"))
            self.pki = make_test_pki(directory, self.tls_hosts)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.pki.cert_file, self.pki.key_file)
        ctx.set_alpn_protocols(["h2"])
        return ctx

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        assert self.pki is not None, "start the emulator first"
        return str(self.pki.ca_file)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> "ApnsEmulator":
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
            if conns:  # the TLS closes finish while the loop still runs
                await asyncio.wait([asyncio.ensure_future(asyncio.shield(c.lost)) for c in conns], timeout=2)
            await self._server.wait_closed()
            self._server = None


class _Connection(asyncio.Protocol):
    """One client connection: h2 in server mode, one request per stream."""

    _open: dict[int, set["_Connection"]] = {}

    @classmethod
    def open_for(cls, emulator: ApnsEmulator) -> set["_Connection"]:
        return cls._open.setdefault(id(emulator), set())

    def __init__(self, emulator: ApnsEmulator):
        self.emulator = emulator
        # Requests are validated as Apple's front end would (inbound checks on); our own answers are
        # a fixed, well-formed set, so h2 need not check them again on the way out.
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8", validate_outbound_headers=False,
            normalize_outbound_headers=False))
        self._flush_scheduled = False
        self.streams: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        emulator._connections += 1
        self.binding: dict = {"id": emulator._connections}
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self.silent = False  # `disrupt("silent")`: nothing more is read or answered

    def connection_made(self, transport) -> None:
        self.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            transport.close()  # APNs speaks HTTP/2 only
            return
        _Connection.open_for(self.emulator).add(self)
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
        transport.write(self.h2.data_to_send())

    def connection_lost(self, exc) -> None:
        _Connection.open_for(self.emulator).discard(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.silent:
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.transport.write(self.h2.data_to_send())
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.streams[event.stream_id] = (list(event.headers), bytearray())
                if event.stream_ended:
                    self._complete(event.stream_id)
            elif isinstance(event, h2.events.DataReceived):
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream[1].extend(event.data)
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._complete(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.streams.pop(event.stream_id, None)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.transport.close()
            if self.silent:
                return
        data = self.h2.data_to_send()
        if data:
            self.transport.write(data)

    def _complete(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        raw_headers, body = stream
        fault = self.emulator._take_disruption()
        if fault is not None:
            self.emulator.disrupted += 1
            if fault == "silent":
                self.silent = True
            elif fault == "goaway":
                self.h2.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR,
                                         additional_data=b'{"reason":"Shutdown"}',
                                         last_stream_id=max(0, stream_id - 2))
                self.transport.write(self.h2.data_to_send())
                self.transport.close()
            else:
                self.transport.abort()
            return
        pseudo = {k: v for k, v in raw_headers if k.startswith(":")}
        headers = [(k.lower(), v) for k, v in raw_headers if not k.startswith(":")]
        answer, record = self.emulator.answer(pseudo.get(":method", ""), pseudo.get(":path", ""), headers,
                                              bytes(body), self.binding)
        if answer.delay > 0:
            asyncio.get_running_loop().call_later(answer.delay, self._respond, stream_id, answer, record)
        else:
            self._respond(stream_id, answer, record)

    def _respond(self, stream_id: int, answer: _Answer, record: Record) -> None:
        if self.silent or self.transport is None or self.transport.is_closing():
            return
        headers = [(":status", str(answer.status))]
        if answer.apns_id is not None:
            # Never indexed: a fresh id per answer would only churn the HPACK table.
            headers.append(NeverIndexedHeaderTuple("apns-id", answer.apns_id))
        headers += answer.headers
        try:
            self.h2.send_headers(stream_id, headers, end_stream=not answer.body)
            if answer.body:
                self.h2.send_data(stream_id, answer.body, end_stream=True)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            return  # the client gave up on the stream; it was never answered
        # Answers made in one loop iteration go out in one write (after data_received, or soon).
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        self.emulator._recorded(record)

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


def main(argv: list[str] | None = None) -> int:
    """Run an emulator process; prints one JSON line ({"url", "ca_file"}) once it listens."""
    parser = argparse.ArgumentParser(prog="python -m appliance.testing.apns_emulator", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", required=True, help="directory for the test CA and certificate")
    parser.add_argument("--key", action="append", default=[], metavar="TEAM:KEYID:PUBLIC_PEM_FILE",
                        help="trust provider tokens of this key (repeatable)")
    parser.add_argument("--topic", action="append", default=[], help="allowed apns-topic (repeatable; none: any)")
    parser.add_argument("--environment", default="production", choices=("production", "sandbox"))
    parser.add_argument("--log", help="append one line per answered request: time status reason apns-id token")
    args = parser.parse_args(argv)
    emu = ApnsEmulator(environment=args.environment, topics=args.topic, pki_dir=args.dir, log_file=args.log)
    emu.keep_records = False  # a long benchmark would hold every request in memory
    for spec in args.key:
        team, key_id, pem = spec.split(":", 2)
        emu.add_key(team, key_id, Path(pem).read_bytes())

    async def serve() -> None:
        await emu.start(port=args.port)
        print(json.dumps({"url": emu.url, "ca_file": emu.ca_file}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await emu.stop()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
