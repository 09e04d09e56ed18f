"""The HTTP/2 client (transports/http2.py) against a scripted server built on the `h2` library (an
independent implementation of RFC 9113 holding the server's side of the protocol), over real TLS:
header blocks in every shape a server may send, GOAWAY with a last stream, flow-control windows
opened late, the server's stream limit lowered mid-connection, answers, resets and GOAWAY while a
body waits for its window, a silent connection, and what a retried APNs request carries.

No test here depends on how fast the box is: waits are for events, and the timeouts that guard
against a hang are far longer than any correct run needs."""

from __future__ import annotations

import asyncio
import ssl
import time
import uuid

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest
from hyperframe.frame import ContinuationFrame, Frame, GoAwayFrame, HeadersFrame

from appliance.testing.tls import make_test_pki
from appliance.transports.apns import APNS_BODY, ApnsProfile, ApnsTransport
from appliance.transports.base import ACCEPTED, TRANSIENT, WakeRequest
from appliance.transports.credentials import ApnsKey
from appliance.transports.http2 import Http2Client, Http2Error, StreamRefused

from .conftest import KEY_ID, TEAM, TOPIC

pytestmark = pytest.mark.anyio

GUARD = 60  # seconds: only a hang (the defect under test) comes near this


def _split_headers(data: bytes, *, pad: int = 0, priority: bool = False, pieces: int = 1) -> bytes:
    """Rewrite the HEADERS frames among `data` (frames h2 wrote): padded, with a priority field,
    and split into `pieces` frames (HEADERS then CONTINUATION). Other frames pass unchanged."""
    out, pos = bytearray(), 0
    while pos < len(data):
        frame, length = Frame.parse_frame_header(memoryview(data[pos:pos + 9]))
        frame.parse_body(memoryview(data[pos + 9:pos + 9 + length]))
        raw = data[pos:pos + 9 + length]
        pos += 9 + length
        if not isinstance(frame, HeadersFrame):
            out += raw
            continue
        block = frame.data
        size = max(1, -(-len(block) // pieces))
        parts = [block[i:i + size] for i in range(0, len(block), size)] or [b""]
        first = HeadersFrame(frame.stream_id, parts[0])
        first.flags = {f for f in frame.flags if f != "END_HEADERS"}
        if len(parts) == 1:
            first.flags.add("END_HEADERS")
        if pad:
            first.flags.add("PADDED")
            first.pad_length = pad
        if priority:
            first.flags.add("PRIORITY")
            first.depends_on, first.stream_weight, first.exclusive = 0, 200, False
        out += first.serialize()
        for i, part in enumerate(parts[1:], 2):
            cont = ContinuationFrame(frame.stream_id, part)
            if i == len(parts):
                cont.flags.add("END_HEADERS")
            out += cont.serialize()
    return bytes(out)


class _H2Server(asyncio.Protocol):
    """One connection of the scripted server: h2 keeps the protocol, `handler(conn, sid, request)`
    answers each complete request (at once or later)."""

    def __init__(self, owner: "Scripted"):
        self.owner = owner
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.rewrite = None  # bytes -> bytes for what this connection writes
        self.silent = False  # read nothing, answer nothing (a dead peer)
        self.requests: dict[int, dict] = {}
        self.reset: dict[int, int] = {}  # streams the client reset: error code
        self.closed = asyncio.get_running_loop().create_future()
        self.index = len(owner.connections)

    def connection_made(self, transport):
        self.transport = transport
        self.owner.connections.append(self)
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values=self.owner.settings)
        self.h2.initiate_connection()
        self.flush()

    def connection_lost(self, exc):
        if not self.closed.done():
            self.closed.set_result(exc)

    def flush(self):
        data = self.h2.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(self.rewrite(data) if self.rewrite else data)

    def data_received(self, data):
        if self.silent:
            return
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self.requests[event.stream_id] = {"headers": event.headers, "body": b""}
                self.owner.on_headers(self, event.stream_id)
            elif isinstance(event, h2.events.DataReceived):
                self.requests[event.stream_id]["body"] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                request = self.requests[event.stream_id]
                self.owner.log.append((self.index, event.stream_id, request["headers"], request["body"]))
                self.owner.handler(self, event.stream_id, request)
            elif isinstance(event, h2.events.StreamReset):
                self.reset[event.stream_id] = event.error_code
        self.flush()

    def goaway(self, last: int, code: int = 0, debug: bytes = b"") -> None:
        """GOAWAY written by hand (h2 would refuse to finish the streams at or below `last` after it)."""
        self.flush()
        self.transport.write(GoAwayFrame(0, last_stream_id=last, error_code=code, additional_data=debug).serialize())

    def answer(self, sid: int, status: int = 200, body: bytes = b"", **extra: str) -> None:
        headers = [(":status", str(status)), *((k.replace("_", "-"), v) for k, v in extra.items())]
        self.h2.send_headers(sid, headers, end_stream=not body)
        if body:
            self.h2.send_data(sid, body, end_stream=True)
        self.flush()


class Scripted:
    def __init__(self, handler, settings: dict | None = None):
        self.handler = handler
        self.settings = settings or {}
        self.connections: list[_H2Server] = []
        self.log: list[tuple] = []  # (connection index, stream id, headers, body) of complete requests
        self.on_headers = lambda conn, sid: None


@pytest.fixture
async def h2server(tmp_path, anyio_backend):
    pki = make_test_pki(tmp_path / "pki")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.cert_file, pki.key_file)
    ctx.set_alpn_protocols(["h2"])
    servers, clients = [], []

    async def start(handler, settings: dict | None = None, **client_args):
        script = Scripted(handler, settings)
        server = await asyncio.get_running_loop().create_server(lambda: _H2Server(script), "127.0.0.1", 0, ssl=ctx)
        servers.append(server)
        script.url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        script.ca_file = str(pki.ca_file)
        client = Http2Client(script.url, ssl.create_default_context(cafile=script.ca_file), **client_args)
        clients.append(client)
        return script, client

    yield start
    for client in clients:
        await client.close()
    for server in servers:
        server.close()


async def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + GUARD
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


def _ok(conn, sid, request):
    conn.answer(sid, 200, apns_id=dict(request["headers"]).get("apns-id", "-"))


# -- header blocks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [
    {"pieces": 3},
    {"pad": 17},
    {"priority": True},
    {"pad": 5, "priority": True, "pieces": 4},
])
async def test_answer_heads_split_padded_and_prioritised(h2server, shape):
    def handler(conn, sid, request):
        conn.rewrite = lambda data: _split_headers(data, **shape)
        conn.answer(sid, 410, body=b'{"reason":"Unregistered","timestamp":1}', apns_id=f"id-{sid}",
                    x_long="v" * 300)

    _script, c = await h2server(handler)
    for path in ("/a", "/b"):
        r = await c.request("POST", path, [], b"x", GUARD)
        assert r.status == 410 and r.headers["x-long"] == "v" * 300 and r.body.startswith(b'{"reason"')
    assert c.connections_made == 1


async def test_status_and_fields_from_the_dynamic_table_and_table_size_updates(h2server):
    """h2's encoder indexes `:status: 410` and the header fields on first use: later answers name
    them by dynamic-table index. Between answers the server shrinks its table to 0 (an update at
    the start of the next block, every entry evicted), then grows it back."""
    sizes = iter([None, None, 0, 0, 4096, None, 256, None])

    def handler(conn, sid, request):
        size = next(sizes)
        if size is not None:
            conn.h2.encoder.header_table_size = size
        conn.answer(sid, 410, body=b'{"reason":"Unregistered"}', apns_id="same-id", x_repeat="r" * 100)

    _script, c = await h2server(handler)
    for _ in range(8):
        r = await c.request("POST", "/p", [], b"x", GUARD)
        assert (r.status, r.headers["apns-id"], r.headers["x-repeat"]) == (410, "same-id", "r" * 100)
    assert c.connections_made == 1


# -- GOAWAY, the server's stream limit, flow control ---------------------------------------------------


async def test_goaway_with_a_last_stream_id(h2server):
    """Streams above the last id were never processed (StreamRefused); those at or below complete;
    the retired connection closes once they have; later requests use a new connection."""
    held: list = []

    def handler(conn, sid, request):
        if conn.index == 0 and sid > 1:
            held.append(sid)
            if len(held) == 3:  # streams 3, 5, 7: only 3 and 5 will be processed
                conn.goaway(5)
                conn.answer(3, 200, apns_id="three")
                conn.answer(5, 200, apns_id="five")
            return
        _ok(conn, sid, request)

    script, c = await h2server(handler)
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200  # settings exchanged
    tasks = [asyncio.create_task(c.request("POST", "/p", [], b"x", GUARD)) for _ in range(3)]
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), GUARD)
    assert [r.headers["apns-id"] for r in results[:2]] == ["three", "five"]
    assert isinstance(results[2], StreamRefused)
    await asyncio.wait_for(script.connections[0].closed, GUARD)  # retired and closed: no leaked socket
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200
    assert c.connections_made == 2 and len(script.connections) == 2


async def test_a_retired_connection_closes_once_its_last_stream_finished(h2server):
    held: list = []

    def handler(conn, sid, request):
        if conn.index == 0 and sid == 3:
            conn.goaway(3)  # GOAWAY NO_ERROR: stream 3 may still finish
            held.append(conn)
            return
        _ok(conn, sid, request)

    script, c = await h2server(handler)
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200
    slow = asyncio.create_task(c.request("POST", "/p", [], b"x", GUARD))
    await _until(lambda: held, "the server held stream 3")
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200  # on a new connection
    old = script.connections[0]
    assert not old.closed.done()  # stream 3 still open there
    held[0].answer(3, 200, apns_id="late")
    assert (await asyncio.wait_for(slow, GUARD)).headers["apns-id"] == "late"
    await asyncio.wait_for(old.closed, GUARD)
    assert c.connections_made == 2 and c._conn is not None and c._conn.transport is not None
    assert not script.connections[1].closed.done()


@pytest.mark.parametrize("timed", ["by the connection", "by the caller"])
async def test_a_retired_connection_closes_once_its_last_stream_timed_out(h2server, timed):
    def handler(conn, sid, request):
        if conn.index == 0 and sid == 3:
            conn.goaway(3)  # stream 3 may still finish, but never does
            return
        _ok(conn, sid, request)

    script, c = await h2server(handler)
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200
    with pytest.raises(TimeoutError):
        if timed == "by the connection":  # the connection's deadline sweep
            await c.request("POST", "/p", [], b"x", 0.3)
        else:  # a caller's own timeout around the request
            await asyncio.wait_for(c._conn.request([(":method", "POST"), (":scheme", "https"),
                                                    (":authority", "x"), (":path", "/p")], b"x"), 0.3)
    await asyncio.wait_for(script.connections[0].closed, GUARD)
    assert 3 in script.connections[0].reset  # and the server was told
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200 and c.connections_made == 2


async def test_zero_initial_windows_opened_later_by_window_update(h2server):
    """The server allows no body bytes on a new stream until it sends WINDOW_UPDATE for it."""
    def on_headers(conn, sid):
        if sid > 1:
            conn.h2.increment_flow_control_window(3, stream_id=sid)  # a few bytes at a time
            asyncio.get_running_loop().call_soon(widen, conn, sid)

    def widen(conn, sid):
        if sid in conn.h2.streams and not conn.h2.streams[sid].closed:
            conn.h2.increment_flow_control_window(len(body), stream_id=sid)
            conn.flush()

    body = b'{"pad":"' + b"z" * 5000 + b'"}'
    script, c = await h2server(_ok, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    script.on_headers = on_headers
    assert (await c.request("POST", "/p", [], b"", GUARD)).status == 200  # settings exchanged
    r = await asyncio.wait_for(c.request("POST", "/p", [], body, GUARD), GUARD)
    assert r.status == 200 and script.log[-1][3] == body


async def test_the_server_lowering_its_stream_limit_mid_connection(h2server):
    """3 streams allowed, 3 open; the server lowers the limit to 1 and answers them: the queued
    requests then go one stream at a time (h2 would end the connection on a fourth)."""
    open_at_start: list[int] = []
    lowered: list = []

    def handler(conn, sid, request):
        open_now = sum(1 for s in conn.h2.streams.values() if not s.closed)
        open_at_start.append(open_now)
        if sid == 1:
            return _ok(conn, sid, request)
        if not lowered:
            if len(open_at_start) < 4:  # streams 3, 5, 7 held until all three are open
                return
            lowered.append(True)
            conn.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1})
            conn.flush()
            for s in (3, 5, 7):
                conn.answer(s, 200, apns_id=f"id-{s}")
            return
        _ok(conn, sid, request)

    script, c = await h2server(handler, {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 3})
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200  # settings exchanged
    tasks = [asyncio.create_task(c.request("POST", "/p", [], b"x", GUARD)) for _ in range(6)]
    results = await asyncio.wait_for(asyncio.gather(*tasks), GUARD)
    assert all(r.status == 200 for r in results)
    assert c.connections_made == 1 and len(script.connections) == 1
    assert open_at_start[4:] == [1, 1, 1]  # after the change: one stream at a time


# -- a body waiting for its window ----------------------------------------------------------------------


async def _blocked(h2server, action):
    """A request whose body waits for a window the server never opens; `action(conn, sid)` then
    happens on the server. Returns what the request ended with, the script and the client."""
    def on_headers(conn, sid):
        if sid == 3 and conn.index == 0:
            asyncio.get_running_loop().call_soon(action, conn, sid)

    script, c = await h2server(_ok, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    script.on_headers = on_headers
    assert (await c.request("POST", "/p", [], b"", GUARD)).status == 200
    try:
        # The request's own timeout is far away: only the server's action may end it.
        result = await asyncio.wait_for(c.request("POST", "/p", [], b"x" * 100, 3600), GUARD)
    except Exception as exc:  # noqa: BLE001 - what it ended with is the result
        result = exc
    return result, script, c


async def test_an_answer_to_a_body_waiting_for_its_window_ends_the_request(h2server):
    def action(conn, sid):
        conn.answer(sid, 413, body=b'{"reason":"PayloadTooLarge"}')

    result, script, c = await _blocked(h2server, action)
    assert result.status == 413
    await _until(lambda: 3 in script.connections[0].reset, "the client reset the stream it stopped sending on")
    assert (await c.request("POST", "/p", [], b"", GUARD)).status == 200 and c.connections_made == 1


async def test_a_reset_of_a_stream_waiting_for_its_window_ends_that_request(h2server):
    def action(conn, sid):
        conn.h2.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        conn.flush()

    result, script, c = await _blocked(h2server, action)
    assert isinstance(result, Http2Error) and not isinstance(result, StreamRefused)
    assert "INTERNAL_ERROR" in str(result)
    assert (await c.request("POST", "/p", [], b"", GUARD)).status == 200 and c.connections_made == 1


async def test_a_goaway_while_a_body_waits_for_its_window_ends_the_request(h2server):
    def action(conn, sid):
        conn.goaway(1)

    result, script, c = await _blocked(h2server, action)
    assert isinstance(result, StreamRefused)
    await asyncio.wait_for(script.connections[0].closed, GUARD)
    assert (await c.request("POST", "/p", [], b"", GUARD)).status == 200 and c.connections_made == 2


# -- a silent connection ------------------------------------------------------------------------------


def _silent_after_first_request(conn, sid, request):
    """The first connection answers its first request, then stops reading and answering (PING included)."""
    if conn.index == 0 and sid > 1:
        conn.silent = True
        return
    _ok(conn, sid, request)


async def test_a_silent_connection_is_dropped_and_later_requests_use_a_new_one(h2server):
    """The server stops reading and answering (PING included): a request times out, the client's
    PING goes unanswered, and the connection is dropped; the next request opens a new one."""
    script, c = await h2server(_silent_after_first_request, ping_timeout=0.5)
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200
    with pytest.raises(TimeoutError):
        await c.request("POST", "/p", [], b"x", 0.5)
    old = c._conn
    await _until(lambda: old.closed and old.lost.done(), "the silent connection was dropped")
    r = await asyncio.wait_for(c.request("POST", "/p", [], b"x", GUARD), GUARD)
    assert r.status == 200 and c.connections_made == 2


async def test_requests_made_while_the_ping_is_unanswered_go_on_the_new_connection(h2server):
    """A request made right after the timeout (the PING not yet answered) waits: once the silent
    connection is dropped it goes on a new one, instead of failing with the dead connection."""
    script, c = await h2server(_silent_after_first_request, ping_timeout=0.5)
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200
    with pytest.raises(TimeoutError):
        await c.request("POST", "/p", [], b"x", 0.5)
    dead = c._conn
    r = await asyncio.wait_for(c.request("POST", "/p", [], b"x", GUARD), GUARD)
    assert r.status == 200 and c.connections_made == 2
    assert dead.closed and dead.next_stream_id == 5  # streams 1 and 3 only: nothing more went to it


async def test_a_connection_whose_ping_is_answered_is_kept(h2server):
    held: list = []

    def handler(conn, sid, request):
        if sid == 3:
            held.append(conn)  # one slow answer; the connection itself is alive (h2 answers PING)
            return
        _ok(conn, sid, request)

    script, c = await h2server(handler, ping_timeout=GUARD)  # answered long before, however loaded the box
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200
    with pytest.raises(TimeoutError):
        await c.request("POST", "/p", [], b"x", 0.2)
    conn = c._conn
    await _until(lambda: conn._ping_sent is None and conn._pings_answered, "the PING was answered")
    assert not conn.closed
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200 and c.connections_made == 1


# -- what a retried APNs request carries -------------------------------------------------------------


async def test_a_retried_apns_request_is_the_same_request(h2server, p8):
    """A request refused by GOAWAY is sent again on a new connection; one answered 403
    ExpiredProviderToken is sent again with a new provider token. Every attempt carries the same
    body, the same header names, the same apns-id and apns-expiration; only the provider token
    changes, and only after ExpiredProviderToken."""
    def handler(conn, sid, request):
        if conn.index == 0 and sid > 1:  # the first wake's first attempt: never processed
            conn.goaway(1)
        elif conn.index == 1 and sid == 1:
            conn.answer(sid, 403, body=b'{"reason":"ExpiredProviderToken"}')
        else:
            _ok(conn, sid, request)

    script, _c = await h2server(handler)
    profile = ApnsProfile("com.example.app/ios", TOPIC, "production", ApnsKey.load(TEAM, KEY_ID, p8[0]),
                          apns_url=script.url, ca_file=script.ca_file)
    transport = ApnsTransport(profile, timeout=GUARD)
    try:
        warm = WakeRequest("ab" * 32, str(uuid.uuid4()), int(time.time()) + 3600)
        assert (await transport.send(warm)).kind == ACCEPTED
        wake = WakeRequest("cd" * 32, str(uuid.uuid4()), int(time.time()) + 3600)
        outcome = await asyncio.wait_for(transport.send(wake), GUARD)
        assert outcome.kind == ACCEPTED and "ExpiredProviderToken" in outcome.detail
    finally:
        await transport.close()
    attempts = [(conn, dict(headers), [n for n, _v in headers], body) for conn, _sid, headers, body in script.log
                if dict(headers)["apns-id"] == wake.request_id]
    assert [a[0] for a in attempts] == [0, 1, 1]  # refused by GOAWAY; 403 on the new connection; 200
    first = attempts[0]
    for _conn, fields, names, body in attempts:
        assert body == APNS_BODY
        assert sorted(names) == sorted(first[2]) and len(names) == len(set(names))
        assert {k: v for k, v in fields.items() if k != "authorization"} == \
               {k: v for k, v in first[1].items() if k != "authorization"}
        assert fields["apns-id"] == wake.request_id and fields["apns-expiration"] == str(wake.expires_at)
    tokens = [a[1]["authorization"] for a in attempts]
    assert tokens[0] == tokens[1] != tokens[2]


async def test_a_stream_reset_by_the_server_is_a_transient_outcome_for_that_wake_only(h2server, p8):
    def handler(conn, sid, request):
        if dict(request["headers"])[":path"].endswith("cd" * 32):
            conn.h2.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
            conn.flush()
        else:
            _ok(conn, sid, request)

    script, _c = await h2server(handler)
    profile = ApnsProfile("com.example.app/ios", TOPIC, "production", ApnsKey.load(TEAM, KEY_ID, p8[0]),
                          apns_url=script.url, ca_file=script.ca_file)
    transport = ApnsTransport(profile, timeout=GUARD)
    try:
        bad, good = (WakeRequest(t * 32, str(uuid.uuid4()), int(time.time()) + 3600) for t in ("cd", "ab"))
        outcomes = await asyncio.wait_for(asyncio.gather(transport.send(bad), transport.send(good)), GUARD)
        assert [o.kind for o in outcomes] == [TRANSIENT, ACCEPTED]
        assert "INTERNAL_ERROR" in outcomes[0].detail
        assert len(script.connections) == 1  # the connection carried on
    finally:
        await transport.close()


async def test_requests_waiting_for_a_stream_move_to_a_new_connection_after_goaway(h2server):
    """One stream allowed and held; a second request waits for it. GOAWAY (stream 3 may finish):
    the waiting request goes on a new connection at once, the held one completes on the old."""
    held: list = []

    def handler(conn, sid, request):
        if conn.index == 0 and sid == 3:
            held.append(conn)
            return
        _ok(conn, sid, request)

    script, c = await h2server(handler, {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1})
    assert (await c.request("POST", "/p", [], b"x", GUARD)).status == 200  # settings exchanged
    first = asyncio.create_task(c.request("POST", "/p", [], b"x", GUARD))
    await _until(lambda: held, "the server held stream 3")
    waiting = asyncio.create_task(c.request("POST", "/p", [], b"x", GUARD))
    await asyncio.sleep(0)
    held[0].goaway(3)
    r = await asyncio.wait_for(waiting, GUARD)
    assert r.status == 200 and c.connections_made == 2 and script.log[-1][0] == 1
    held[0].answer(3, 200, apns_id="held")
    assert (await asyncio.wait_for(first, GUARD)).headers["apns-id"] == "held"
    await asyncio.wait_for(script.connections[0].closed, GUARD)
