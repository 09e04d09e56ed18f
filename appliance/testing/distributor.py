"""A local UnifiedPush distributor: an HTTPS (HTTP/1.1) push server that records what it receives.

It stands in for a distributor's push server (RFC 8030's push resource) in tests and in
`appliance bench wakes --transport unifiedpush`. Every request is recorded (method, target,
headers, body, the TLS SNI name, the connection) and answered:

    a behaviour forced for the path (`behave`)     whatever status the test asked, with optional
                                                   Retry-After, Location, a delay, a long or a
                                                   never-ending body, a slow drip of its bytes
    otherwise, with `check_requests` (the default):
      method other than POST                       405
      no Content-Encoding: aes128gcm, no TTL,
        a body that is not one aes128gcm record    400
      no `Authorization: vapid t=<JWT>, k=<key>`,
        a JWT that does not verify against k, an
        aud other than this server's origin, an
        exp past 24 hours or in the past           401
      a path `unsubscribe`d                        410
      otherwise                                    201 with a Location

It does not decrypt: what a phone would read is checked by the tests, with a decryptor of
their own. `subscribe()` makes a subscription the way a phone's distributor would (a P-256 key
pair and an auth secret) and writes its lease endpoint.

Use it in process (`await d.start()`), on a thread (`d.start_in_thread()`), or as a process
(`python -m appliance.testing.distributor --help`, one JSON line with its URL and CA once ready).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import signal
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h11
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from .threaded import OnItsOwnThread
from .tls import LocalPki, make_test_pki

MAX_BODY = 8192
VAPID_MAX_LIFETIME = 24 * 3600


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Subscription:
    """A push subscription as a phone's distributor holds it: the receiving key pair and auth secret."""

    url: str  # the push URL (what the push server knows)
    private_key: ec.EllipticCurvePrivateKey = field(repr=False)
    auth: bytes = field(repr=False)

    @property
    def p256dh(self) -> bytes:
        return self.private_key.public_key().public_bytes(serialization.Encoding.X962,
                                                          serialization.PublicFormat.UncompressedPoint)

    @property
    def endpoint(self) -> str:
        """The lease endpoint of this profile: the push URL with the keys in its fragment."""
        return f"{self.url}#p256dh={_b64url(self.p256dh)}&auth={_b64url(self.auth)}"


@dataclass
class Forced:
    status: int
    retry_after: int | str | None = None  # a str goes out as is (latin-1): a hostile host's header
    location: str | None = None
    delay: float = 0.0  # seconds before the answer's head goes out
    body_size: int = 0  # bytes of body (with `endless`, sent until the client goes away)
    endless: bool = False
    drip: float = 0.0  # seconds between body bytes (a slow answer)
    times: int | None = None


@dataclass
class Record:
    """One request as received, and how it was answered."""

    at: float
    connection: int
    sni: str | None
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    status: int = 0
    problem: str = ""  # why it was refused (the checks above), for test messages

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


class Distributor(OnItsOwnThread):
    """The push server. `host` is the name its certificate and URLs use (resolved by the tests)."""

    THREAD_NAME = "distributor"

    def __init__(self, *, host: str = "localhost", pki_dir: str | Path | None = None,
                 check_requests: bool = True, log_file: str | Path | None = None,
                 clock: Callable[[], float] = time.time, tls: bool = True):
        self.host = host
        self.tls = tls  # False: plain http (what only an allowlisted host may be sent)
        self.check_requests = check_requests
        self.clock = clock
        self.records: list[Record] = []
        self.keep_records = True
        self.answered = 0
        self.body_bytes_sent = 0  # body bytes the kernel took (what a client pulled, plus its buffers)
        self._forced: dict[str, Forced] = {}
        self._gone: set[str] = set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pki_dir = Path(pki_dir) if pki_dir else None
        self.pki: LocalPki | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._sni: dict[int, str | None] = {}
        self._connections = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log = open(log_file, "a") if log_file else None
        self._verified: dict[str, str] = {}  # JWT -> key: verify each token once
        self.port = 0

    # -- configuration and observation --------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ca_file(self) -> str:
        assert self.pki is not None
        return str(self.pki.ca_file)

    def subscribe(self, path: str | None = None) -> Subscription:
        path = path or "/up/" + secrets.token_urlsafe(16)
        return Subscription(self.url + path, ec.generate_private_key(ec.SECP256R1()), os.urandom(16))

    def behave(self, path: str, status: int, *, retry_after: int | str | None = None, location: str | None = None,
               delay: float = 0.0, body_size: int = 0, endless: bool = False, drip: float = 0.0,
               times: int | None = None) -> None:
        """Answer requests for `path` (the target without query) like this."""
        with self._lock:
            self._forced[path] = Forced(status, retry_after, location, delay, body_size, endless, drip, times)

    def unsubscribe(self, path: str) -> None:
        """From now on the path answers 410 Gone (the app unregistered)."""
        with self._lock:
            self._gone.add(path)

    def requests(self, path: str | None = None) -> list[Record]:
        with self._lock:
            return [r for r in self.records if path is None or r.target.split("?")[0] == path]

    def wait_for(self, predicate: Callable[[list[Record]], bool], timeout: float = 10.0) -> list[Record]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.records):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"distributor: condition not met in {timeout} s; got "
                                         f"{[(r.target, r.status, r.problem) for r in self.records]}")
                self._changed.wait(left)
            return list(self.records)

    # -- the push resource -----------------------------------------------------------------------------

    def _check(self, method: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        if method != "POST":
            return 405, "not POST"
        if headers.get("content-encoding") != "aes128gcm":
            return 400, "Content-Encoding is not aes128gcm"
        if not headers.get("ttl", "").isdigit():
            return 400, "no TTL"
        if len(body) < 86 + 17 or int.from_bytes(body[16:20], "big") < 18 or body[20] != 65 or body[21] != 4:
            return 400, "the body is not one aes128gcm record with a P-256 key id"
        auth = headers.get("authorization", "")
        if not auth.startswith("vapid "):
            return 401, "no vapid authorization"
        params = dict(p.strip().split("=", 1) for p in auth[len("vapid "):].split(",") if "=" in p)
        token, key = params.get("t", ""), params.get("k", "")
        if self._verified.get(token) != key:
            problem = self._verify_jwt(token, key)
            if problem:
                return 401, problem
            self._verified[token] = key
        return 0, ""

    def _verify_jwt(self, token: str, key: str) -> str:
        try:
            head_b64, claims_b64, sig_b64 = token.split(".")
            head, claims = json.loads(_b64url_decode(head_b64)), json.loads(_b64url_decode(claims_b64))
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), _b64url_decode(key))
            sig = _b64url_decode(sig_b64)
            public.verify(encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big")),
                          f"{head_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
        except (ValueError, InvalidSignature, TypeError):
            return "the VAPID JWT does not verify against k"
        if head.get("alg") != "ES256":
            return "the VAPID JWT is not ES256"
        origin = self.url
        if claims.get("aud") != origin:
            return f"the VAPID aud is not {origin}"
        exp = claims.get("exp")
        now = self.clock()
        if not isinstance(exp, int) or exp <= now or exp > now + VAPID_MAX_LIFETIME:
            return "the VAPID exp is not within 24 hours"
        if not isinstance(claims.get("sub"), str):
            return "the VAPID JWT has no sub"
        return ""

    def _answer(self, record: Record) -> Forced:
        path = record.target.split("?")[0]
        headers = dict(record.headers)
        with self._lock:
            forced = self._forced.get(path)
            if forced is not None:
                if forced.times is not None:
                    forced.times -= 1
                    if forced.times <= 0:
                        del self._forced[path]
                return forced
            gone = path in self._gone
        if self.check_requests:
            status, problem = self._check(record.method, headers, record.body)
            if status:
                record.problem = problem
                return Forced(status)
        return Forced(410 if gone else 201)

    def _recorded(self, record: Record) -> None:
        with self._changed:
            self.answered += 1
            if self.keep_records:
                self.records.append(record)
            self._changed.notify_all()
        if self._log is not None:
            self._log.write(f"{record.at:.6f} {record.status} {record.target.split('?')[0]}\n")
            self._log.flush()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        conn_id = self._connections
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        ssl_object = writer.get_extra_info("ssl_object")
        sni = self._sni.pop(id(ssl_object), None) if ssl_object is not None else None
        self._writers.add(writer)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16384)
        try:
            while True:
                request: h11.Request | None = None
                body = bytearray()
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(65536)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > MAX_BODY:
                            raise h11.RemoteProtocolError("body too large")
                    elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                        break
                if request is None:
                    return
                record = Record(self.clock(), conn_id, sni, request.method.decode(), request.target.decode(),
                                [(k.decode().lower(), v.decode()) for k, v in request.headers], bytes(body))
                answer = self._answer(record)
                record.status = answer.status
                if answer.delay:
                    await asyncio.sleep(answer.delay)
                await self._respond(conn, writer, answer)
                self._recorded(record)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (h11.RemoteProtocolError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError,
                asyncio.CancelledError):
            return  # (cancelled: the distributor stops; the connection just closes)
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _respond(self, conn: h11.Connection, writer: asyncio.StreamWriter, answer: Forced) -> None:
        headers = [(b"server", b"distributor")]
        if answer.status == 201:
            headers.append((b"location", f"/m/{secrets.token_urlsafe(8)}".encode()))
        if answer.location:
            headers.append((b"location", answer.location.encode()))
        if answer.retry_after is not None:
            headers.append((b"retry-after", str(answer.retry_after).encode("latin-1")))
        if answer.endless or answer.drip:
            headers.append((b"transfer-encoding", b"chunked"))
        else:
            headers.append((b"content-length", str(answer.body_size).encode()))
        if answer.endless:
            # Small server-side buffers, so that body_bytes_sent follows what the client pulls.
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
            writer.transport.set_write_buffer_limits(high=16384)
        writer.write(conn.send(h11.Response(status_code=answer.status, headers=headers)))
        await writer.drain()
        sent = 0
        chunk = b"x" * 16384
        while (answer.endless or sent < answer.body_size) and not writer.transport.is_closing():
            piece = b"x" if answer.drip else chunk[: (len(chunk) if answer.endless else answer.body_size - sent)]
            writer.write(conn.send(h11.Data(data=piece)))
            await writer.drain()
            sent += len(piece)
            self.body_bytes_sent += len(piece)
            if answer.drip:
                await asyncio.sleep(answer.drip)
            else:
                # drain() returns without yielding while the transport is not paused, and writes to
                # a connection already lost are dropped without pausing it: without a turn of the
                # loop its loss is never seen, and this sends nowhere at full speed (seen under load).
                await asyncio.sleep(0)
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    # -- running ----------------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> "Distributor":
        if self.pki is None:
            directory = self._pki_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"distributor-{os.getpid()}"
            self.pki = make_test_pki(directory, hosts=(self.host, "localhost", "127.0.0.1"))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.pki.cert_file, self.pki.key_file)
        ctx.set_alpn_protocols(["http/1.1"])

        def remember_sni(ssl_object, name, _ctx) -> None:
            self._sni[id(ssl_object)] = name

        ctx.sni_callback = remember_sni
        self._server = await asyncio.start_server(self._serve, host, port, ssl=ctx if self.tls else None)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=2)
            await self._server.wait_closed()
            self._server = None


def main(argv: list[str] | None = None) -> int:
    """Run a distributor process; prints one JSON line ({"url", "ca_file"}) once it listens."""
    parser = argparse.ArgumentParser(prog="python -m appliance.testing.distributor",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", required=True, help="directory for the test CA and certificate")
    parser.add_argument("--host", default="localhost", help="the name its certificate and URLs use")
    parser.add_argument("--log", help="append one line per answered request: time status path")
    args = parser.parse_args(argv)
    dist = Distributor(host=args.host, pki_dir=args.dir, log_file=args.log)
    dist.keep_records = False  # a long benchmark would hold every request in memory

    async def serve() -> None:
        await dist.start(host=args.host, port=args.port)  # every address the name has
        print(json.dumps({"url": dist.url, "ca_file": dist.ca_file}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await dist.stop()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
