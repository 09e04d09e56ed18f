"""A hostile client on the open internet: bounded request heads, slow clients, per-address caps,
quiet logs for bad frames, NIP-11 content negotiation, clean first starts and clean SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time

import httpx
import pytest
import websockets

from appliance.relay.peers import PeerLimits, is_local_host, parse_networks
from appliance.front import Guard, Server, Site
from tests.conftest import Client
from tests.pg import db_rows

pytestmark = pytest.mark.anyio


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def flood(port: int, head: bytes, chunk: bytes, limit: int) -> tuple[int, bytes]:
    """Send `head`, then `chunk` until the server closes or `limit` bytes went out; (sent, answer)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(head)
            while sent < limit:
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            answer = s.recv(4096)
        except (ConnectionResetError, socket.timeout):
            answer = b""
    return sent, answer


@pytest.mark.parametrize("shape,head,chunk,status", [
    ("endless request line", b"GET /", b"a" * 4096, b"414"),
    ("endless header value", b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ", b"b" * 4096, b"431"),
    ("endless small headers", b"GET / HTTP/1.1\r\nHost: x\r\n", b"X-A: 1\r\n" * 512, b"431"),
])
def test_request_heads_are_bounded(server, shape, head, chunk, status):
    before = rss_kib(server.proc.pid)
    sent, answer = flood(server.port, head, chunk, 64 * 1024 * 1024)
    assert sent < 8 * 1024 * 1024, f"{shape}: the server kept reading ({sent} bytes)"
    assert answer.startswith(b"HTTP/1.1 " + status), (shape, answer[:80])
    assert rss_kib(server.proc.pid) - before < 32 * 1024, shape
    # Ordinary requests are untouched.
    assert httpx.get(server.http + "/", headers={"Accept": "application/nostr+json"}).status_code == 200


@pytest.mark.slow
def test_slow_heads_are_cut(server):
    """A head that trickles in (or a websocket handshake never finished) is cut after the head
    timeout (10 s); the generous bound here only proves it happens at all."""
    socks = []
    for head in (b"GET / HTTP/1.1\r\nHost: x\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n", b""):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        s.sendall(head)
        socks.append(s)
    t0 = time.monotonic()
    for s in socks[:2]:  # one more header line each, at once (not after the previous one was cut)
        s.sendall(b"X-Slow: 1\r\n")
    for s in socks:
        data = b""
        try:
            while True:
                piece = s.recv(4096)
                if not piece:
                    break
                data += piece
        except ConnectionResetError:
            pass  # cut: the server closed with bytes of ours unread (a reset instead of a FIN)
        assert data in (b"",) or data.startswith(b"HTTP/1.1 408"), data[:60]
        s.close()
    assert time.monotonic() - t0 < 45


async def test_invalid_utf8_is_closed_without_a_traceback(server):
    for _ in range(20):
        ws = await websockets.connect(server.url)
        await ws.recv()  # AUTH
        await ws.send(b"\xff\xfe[\"REQ\"]", text=True)
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1007
    log = server.log_path.read_text()
    assert "Traceback" not in log and "Invalid UTF-8" not in log and " ERROR " not in log


@pytest.mark.parametrize("accept,json_doc", [
    ("application/nostr+json", True),
    ("Application/Nostr+JSON", True),
    ("text/html, application/nostr+json;q=0.9", True),
    ("application/nostr+json; charset=utf-8", True),
    ("APPLICATION/NOSTR+JSON ; q=1.0", True),
    ("application/nostr+json;q=0", False),
    ("text/html,application/xhtml+xml,*/*;q=0.8", False),
    ("", False),
])
def test_nip11_accept(server, accept, json_doc):
    r = httpx.get(server.http + "/", headers={"Accept": accept})
    assert r.status_code == 200
    assert (r.headers["content-type"].startswith("application/nostr+json")) == json_doc
    if json_doc:
        assert r.json()["software"] == "appliance"


# -- per-address connection caps ------------------------------------------------------------------


async def test_forwarded_clients_are_capped(make_server, alice):
    srv = make_server("--max-connections-per-ip", "3")
    url = srv.url

    async def open_as(ip: str):
        return await websockets.connect(url, additional_headers={"X-Forwarded-For": f"198.51.100.1, {ip}"})

    held = [await open_as("203.0.113.7") for _ in range(3)]
    with pytest.raises(websockets.InvalidStatus) as info:
        await open_as("203.0.113.7")
    assert info.value.response.status_code == 429
    other = await open_as("203.0.113.8")  # another address has its own budget
    plain = [await websockets.connect(url) for _ in range(5)]  # loopback itself is never capped
    await held.pop().close()
    for _ in range(100):  # the slot is released when that connection has ended
        try:
            held.append(await open_as("203.0.113.7"))
            break
        except websockets.InvalidStatus:
            await asyncio.sleep(0.05)
    assert len(held) == 3
    for ws in [*held, other, *plain]:
        await ws.close()


@contextlib.asynccontextmanager
async def front_server(guard: Guard, app, websocket=None, **site):
    """The appliance's front (appliance.front) on a free loopback port serving the ASGI `app`
    (and websockets with the handler `websocket`); yields the port."""
    front = Server(lifespan_app=None)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    front.add(Site(app, guard, websocket=websocket, **site), sock)
    assert await front.start()
    try:
        yield sock.getsockname()[1]
    finally:
        front.close_listeners()
        loop = asyncio.get_running_loop()
        await front.close(loop.time() + 5)


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_tcp_peers_are_capped():
    """The cap on TCP peers, with the real front (loopback made untrusted for the test)."""
    guard = Guard(PeerLimits(2, trust_loopback=False))

    async def websocket(request):
        session = _Echo()
        await session.serve(request.accept())

    async with front_server(guard, _ok, websocket) as port:
        url = f"ws://127.0.0.1:{port}/"
        a, b = await websockets.connect(url), await websockets.connect(url)
        with pytest.raises((websockets.InvalidStatus, websockets.InvalidMessage, ConnectionError, EOFError)):
            await websockets.connect(url)
        assert guard.refused[429] == 1
        await a.close()
        for _ in range(100):
            if guard.peers.open.get("127.0.0.1") == 1:
                break
            await asyncio.sleep(0.02)
        c = await websockets.connect(url)
        await b.close()
        await c.close()
        for _ in range(100):
            if not guard.peers.open:
                break
            await asyncio.sleep(0.02)
        assert guard.peers.open == {}


class _Echo:
    """A websocket handler that takes every message (noting it, with how many more were parsed
    and waiting then) until the connection ends; `close_after` closes the connection itself (as
    the relay drops a flooder) after that many messages, its close timeout an hour."""

    def __init__(self, close_after: int | None = None):
        self.seen: list[tuple[object, int]] = []
        self.close_after = close_after
        self.unparsed_at_close: list[bool] = []
        self.ended = asyncio.Event()
        self.closed = asyncio.Event()

    async def serve(self, conn) -> None:
        self.conn = conn
        conn.attach(self)
        await self.ended.wait()

    def pump(self) -> None:
        from appliance.front import CLOSED, NOTHING

        conn = self.conn
        while True:
            message = conn.next_message()
            if message is NOTHING:
                return
            if message is CLOSED:
                self.ended.set()
                return
            if self.closed.is_set():
                continue
            self.seen.append((message, len(conn.messages)))
            if self.close_after is not None and len(self.seen) >= self.close_after:
                conn.close_timeout = 3600.0
                self.unparsed_at_close.append(bool(conn.unparsed))
                conn.close(1008, "flooding")
                self.closed.set()


def test_forwarded_client_rules():
    peers = PeerLimits(10, parse_networks("10.0.0.0/8"))
    assert peers.forwarded_client("127.0.0.1", ["203.0.113.7"]) == "203.0.113.7"
    assert peers.forwarded_client("10.1.2.3", ["1.2.3.4, 203.0.113.7, 10.9.9.9"]) == "203.0.113.7"
    assert peers.forwarded_client("198.51.100.9", ["203.0.113.7"]) is None  # an untrusted peer's claim
    assert peers.forwarded_client("127.0.0.1", []) is None
    assert peers.forwarded_client("127.0.0.1", ["10.0.0.1"]) is None


# -- NIP-42 on an unconfigured install ----------------------------------------------------------


async def test_auth_from_localhost_on_default_install(make_server, alice):
    srv = make_server()
    banner = srv.log_path.read_text()
    assert f"ws://localhost:{srv.port}" in banner
    c = await Client.connect(srv.url, host="localhost")
    assert await c.auth(alice.secret, f"ws://localhost:{srv.port}") == (True, "")
    await c.close()
    c = await Client.connect(srv.url)
    assert await c.auth(alice.secret, f"ws://127.0.0.1:{srv.port}") == (True, "")
    await c.close()
    # A Host header that is not this machine never widens the rule.
    c = await Client.connect(srv.url, host="evil.example.com")
    ok, msg = await c.auth(alice.secret, f"ws://evil.example.com:{srv.port}")
    assert not ok and msg == "invalid: relay url mismatch"
    await c.close()
    # Connected as localhost, the tag must still name what the client connected to.
    c = await Client.connect(srv.url, host="localhost")
    ok, _ = await c.auth(alice.secret, f"ws://localhost:{srv.port + 1}")
    assert not ok
    await c.close()


async def _raw_auth(port: int, host_header: str, secret: str, relay_tag: str) -> list:
    """A websocket handshake with exactly `host_header` as Host (no client library builds one like
    these), then one AUTH naming `relay_tag`; the relay's OK."""
    from appliance.nostr.event import sign_event

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((f"GET / HTTP/1.1\r\nHost: {host_header}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert b" 101 " in head.split(b"\r\n")[0], head

    async def message() -> list:
        first = await reader.readexactly(2)
        n = first[1] & 0x7F
        if n == 126:
            n = int.from_bytes(await reader.readexactly(2), "big")
        return json.loads(await reader.readexactly(n))

    challenge = (await message())[1]
    ev = sign_event(secret, 22242, [["relay", relay_tag], ["challenge", challenge]], "")
    payload = json.dumps(["AUTH", ev.to_dict()]).encode()
    mask = b"\x01\x02\x03\x04"
    writer.write(b"\x81\xfe" + len(payload).to_bytes(2, "big") + mask
                 + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    try:
        return await asyncio.wait_for(message(), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("host", ["127.0.0.1:{port}@evil.example.com", "[::1]@evil.example.com",
                                  "localhost:{port}@evil.example.com:80"])
async def test_auth_host_header_naming_another_host_is_not_trusted(make_server, alice, host):
    """A Host header that starts like this machine but names another host in a URL (userinfo
    before an @) must not widen AUTH: `ws://127.0.0.1:7777@evil.example.com` is a relay at
    evil.example.com to every URL parser. Before, its loopback-looking prefix was trusted."""
    srv = make_server()
    host = host.format(port=srv.port)
    answer = await _raw_auth(srv.port, host, alice.secret, f"ws://{host}")
    assert answer[0] == "OK" and answer[2] is False and answer[3] == "invalid: relay url mismatch", answer
    # The same handshake with a plain local Host still works.
    answer = await _raw_auth(srv.port, f"localhost:{srv.port}", alice.secret, f"ws://localhost:{srv.port}")
    assert answer[2] is True, answer


async def test_auth_with_public_url_is_exact(make_server, alice):
    srv = make_server("--public-url", "wss://relay.example.org")
    assert "also" not in srv.log_path.read_text()
    c = await Client.connect(srv.url, host="localhost")
    ok, msg = await c.auth(alice.secret, f"ws://localhost:{srv.port}")
    assert not ok and msg == "invalid: relay url mismatch"
    assert await c.auth(alice.secret, "wss://relay.example.org") == (True, "")
    await c.close()


def test_local_hosts():
    assert is_local_host("localhost") and is_local_host("127.0.0.1") and is_local_host("::1")
    assert is_local_host("[::1]".strip("[]"))
    assert not is_local_host("evil.example.com") and not is_local_host("8.8.8.8")
    assert is_local_host("192.0.2.55", also=("192.0.2.55",))


# -- first start and SIGTERM --------------------------------------------------------------------


@pytest.mark.slow
async def test_fresh_starts_under_load(make_server, alice, tmp_path):
    """20 first starts in a row, each hit by readers and writers at once: no BusyError, no
    `error:` answer."""
    for i in range(20):
        srv = make_server(data_dir=tmp_path / f"fresh{i}")

        async def client(n: int):
            c = await Client.connect(srv.url)
            for j in range(3):
                ok, msg = await c.publish(alice.sign(1, [], f"{i}.{n}.{j}"))
                assert ok, msg
                events, closed = await c.req(f"r{j}", {"kinds": [1], "limit": 5})
                assert closed is None, closed
                answer = await c.count(f"c{j}", {"kinds": [1]})
                assert answer[0] == "COUNT", answer
            await c.close()

        await asyncio.gather(*(client(n) for n in range(4)))
        srv.stop()
        log = srv.log_path.read_text()
        assert "BusyError" not in log and "failed" not in log, log[-2000:]


@pytest.mark.slow
async def test_sigterm_sends_every_ok_and_closes_1001(make_server, alice, tmp_path):
    srv = make_server("--event-rate", "0")
    ws = await websockets.connect(srv.url, max_size=None)
    await ws.recv()
    acked: set[str] = set()
    refused: set[str] = set()
    events = [alice.sign(1, [], f"n{i}") for i in range(20000)]
    closed_with = None

    async def reader():
        nonlocal closed_with
        try:
            async for text in ws:
                msg = json.loads(text)
                if msg[0] == "OK":
                    (acked if msg[2] else refused).add(msg[1])
        except websockets.ConnectionClosed as exc:
            closed_with = exc
        else:
            closed_with = ws.close_code

    task = asyncio.create_task(reader())
    sent = 0
    try:
        for ev in events:
            await ws.send(json.dumps(["EVENT", ev.to_dict()]))
            sent += 1
            if sent == 3000:
                srv.proc.send_signal(signal.SIGTERM)
    except websockets.ConnectionClosed:
        pass
    await asyncio.wait_for(task, 30)
    assert ws.close_code == 1001, (ws.close_code, closed_with)
    assert srv.proc.wait(30) == 0  # a graceful stop exits 0
    stored = {row[0] for row in db_rows(srv.data_dir, "SELECT id FROM events")}
    assert acked, "nothing was acknowledged before the stop"
    # Everything acknowledged is stored, and everything stored was acknowledged.
    assert stored == acked
    assert not (refused & stored)


@pytest.mark.slow
@pytest.mark.sqlite_only("SQLite's WAL file")
async def test_wal_stays_bounded_with_readers_present(make_server, alice, bob):
    """Writes with readers querying throughout: the WAL is restarted, not grown without bound
    (about 7 KB of WAL per event; under the previous checkpoint policy 15,000 events grew it to 122 MiB)."""
    srv = make_server("--event-rate", "0", "--req-rate", "0")
    wal = srv.data_dir / "appliance.sqlite3-wal"
    events = [alice.sign(1, [["p", bob.pubkey], ["t", f"t{i % 50}"]], f"note {i} " + "x" * 300)
              for i in range(12000)]
    peak = 0
    done = asyncio.Event()

    async def sample():
        nonlocal peak
        while not done.is_set():
            if wal.exists():
                peak = max(peak, wal.stat().st_size)
            await asyncio.sleep(0.005)

    async def reader(n: int):
        c = await Client.connect(srv.url)
        i = 0
        while not done.is_set():
            i += 1
            _events, closed = await c.req(f"r{n}.{i}", {"kinds": [1], "#p": [bob.pubkey], "limit": 50})
            assert closed is None
        await c.close()

    async def writer(share):
        ws = await websockets.connect(srv.url, max_size=None)
        await ws.recv()
        pending = 0
        for ev in share:
            await ws.send(json.dumps(["EVENT", ev.to_dict()]))
            pending += 1
            while pending >= 200:
                msg = json.loads(await ws.recv())
                if msg[0] == "OK":
                    assert msg[2], msg
                    pending -= 1
        while pending:
            msg = json.loads(await ws.recv())
            if msg[0] == "OK":
                pending -= 1
        await ws.close()

    sampler = asyncio.create_task(sample())
    readers = [asyncio.create_task(reader(n)) for n in range(2)]
    await asyncio.gather(*(writer(events[i::4]) for i in range(4)))
    done.set()
    await asyncio.gather(sampler, *readers)
    assert peak < 64 * 1024 * 1024, f"WAL peaked at {peak / 2**20:.1f} MiB"


@pytest.mark.slow
async def test_heavy_counts_do_not_starve_a_bystander(make_server, alice, bob):
    """One run slot, two connections queueing heavy COUNTs: a bystander's REQ, sent after them,
    is answered before the last of them (their queries pause in time slices; before, the REQ
    waited behind every COUNT queued ahead of it). Order only, no timing bound."""
    srv = make_server("--event-rate", "0", "--req-rate", "0", "--reader-threads", "1", "--query-timeout", "120")
    values = [f"v{i}" for i in range(10)]
    c = await Client.connect(srv.url)
    for i in range(1000):
        await c.send(["EVENT", alice.sign(1, [["t", v] for v in values] + [["p", bob.pubkey]], str(i)).to_dict()])
    for _ in range(1000):
        assert (await c.expect(lambda m: m[0] == "OK"))[2]
    heavy = [{"#t": values, "since": k} for k in range(16)]  # tag-driven: every tag row, 16 times
    hogs = [await Client.connect(srv.url) for _ in range(2)]
    answered: list[tuple[float, list]] = []
    loop = asyncio.get_running_loop()

    async def collect(h):
        for _ in range(2):
            msg = await h.expect(lambda m: m[0] in ("COUNT", "CLOSED"), timeout=120)
            answered.append((loop.time(), msg))

    for h in hogs:
        for n in range(2):
            await h.send(["COUNT", f"heavy{n}", *heavy])
    collectors = [asyncio.create_task(collect(h)) for h in hogs]
    events, closed = await c.req("bystander", {"kinds": [1], "#p": [bob.pubkey], "limit": 5})
    bystander_done = loop.time()
    assert closed is None and len(events) == 5
    await asyncio.gather(*collectors)
    assert all(msg[0] == "COUNT" and msg[2] == {"count": 1000} for _t, msg in answered), answered
    assert bystander_done < max(t for t, _msg in answered)
    for client in [c, *hogs]:
        await client.close()


@pytest.mark.slow
async def test_connections_pinning_every_reader_thread_stall_nothing(make_server, alice, bob):
    """13 connections with two heavy COUNTs each want 26 reader threads; there are at most 24.
    Before, the first reads left without a thread stopped the whole pool: every paused query
    waited for its deadline, the bystander's REQ too. Now a connection's first read takes the
    thread of a paused query (CLOSED, too long here), so the rest keep running to completion."""
    srv = make_server("--event-rate", "0", "--req-rate", "0", "--reader-threads", "1", "--query-timeout", "100")
    values = [f"v{i}" for i in range(10)]
    c = await Client.connect(srv.url)
    for i in range(1000):
        await c.send(["EVENT", alice.sign(1, [["t", v] for v in values] + [["p", bob.pubkey]], str(i)).to_dict()])
    for _ in range(1000):
        assert (await c.expect(lambda m: m[0] == "OK"))[2]
    heavy = [{"#t": values, "since": k} for k in range(16)]
    hogs = [await Client.connect(srv.url) for _ in range(13)]
    answers: list[list] = []
    loop = asyncio.get_running_loop()
    last_count = 0.0

    async def collect(h):
        nonlocal last_count
        for _ in range(2):
            msg = await h.expect(lambda m: m[0] in ("COUNT", "CLOSED"), timeout=40)
            answers.append(msg)
            if msg[0] == "COUNT":
                last_count = loop.time()

    for h in hogs:
        for n in range(2):
            await h.send(["COUNT", f"heavy{n}", *heavy])
    collectors = [asyncio.create_task(collect(h)) for h in hogs]
    events, closed = await c.req("bystander", {"kinds": [1], "#p": [bob.pubkey], "limit": 5})
    bystander_done = loop.time()
    assert closed is None and len(events) == 5
    await asyncio.gather(*collectors)
    counted = [m for m in answers if m[0] == "COUNT"]
    assert all(m[2] == {"count": 1000} for m in counted), answers
    refused = [m for m in answers if m[0] == "CLOSED"]
    assert all(m[2].startswith("error: this query takes too long here") for m in refused), refused
    assert len(counted) >= 20, answers  # only a few paused queries gave their thread up
    assert bystander_done < last_count
    for client in [c, *hogs]:
        await client.close()


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_management_api_bodies_are_bounded(server, framing):
    """A NIP-86 POST (no auth needed to send one) is refused with 413 once it passes 64 KiB,
    before the rest is read: before, the whole body was buffered first (700 MB sent: RSS 759 MB)."""
    before = rss_kib(server.proc.pid)
    total = 64 * 1024 * 1024
    head = (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/nostr+json+rpc\r\n"
            + (b"Transfer-Encoding: chunked\r\n\r\n" if framing == "chunked" else b"Content-Length: %d\r\n\r\n" % total))
    piece = b"a" * 65536
    chunk = b"10000\r\n" + piece + b"\r\n" if framing == "chunked" else piece
    sent, answer = flood(server.port, head, chunk, total)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]
    assert sent < 16 * 1024 * 1024, f"the server kept reading ({sent} bytes)"
    assert rss_kib(server.proc.pid) - before < 32 * 1024


@contextlib.asynccontextmanager
async def raw_websocket(handler, **site):
    """The appliance's front serving websockets with `handler` (an `_Echo`), and a sans-I/O
    websocket client connected to it over a plain socket, its handshake done: yields (client,
    reader, writer), so a test writes exactly the bytes it wants, when it wants."""
    from websockets.client import ClientProtocol
    from websockets.uri import parse_uri

    async def websocket(request):
        await handler.serve(request.accept())

    async with front_server(Guard(PeerLimits(0)), _ok, websocket, **site) as port:
        client = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"))
        client.send_request(client.connect())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(client.data_to_send()))
        while not client.handshake_exc and client.state.name == "CONNECTING":
            client.receive_data(await reader.read(4096))
        assert client.state.name == "OPEN"
        yield client, reader, writer
        writer.close()


async def test_a_pipelined_read_is_parsed_a_piece_at_a_time_and_every_message_arrives_in_order():
    """A client that pipelines: its ~130 KB of small frames (and one of 100 KB), written at once, reach the
    handler in order, all of them, but never more than one piece's worth waiting parsed at a time (parsed
    whole, a read is thousands of frames in one go, holding the event loop meanwhile)."""
    from appliance.front.websocket import DEFAULT_PARSE_BYTES

    echo = _Echo()
    async with raw_websocket(echo, max_message_size=1 << 20) as (client, reader, writer):
        sent = [json.dumps(["REQ", f"s{i}", {"kinds": [1], "limit": 500}]) for i in range(3000)]
        sent.insert(1500, json.dumps(["EVENT", {"content": "x" * 100_000}]))
        for text in sent:
            client.send_text(text.encode())
        client.send_close(1000)
        writer.write(b"".join(client.data_to_send()))  # all of it at once
        await writer.drain()
        await asyncio.wait_for(echo.ended.wait(), 60)
    assert [text for text, _queued in echo.seen] == sent
    smallest = 2 + 4 + len(sent[0])  # the smallest frame: header, mask, payload
    assert max(queued for _text, queued in echo.seen) < DEFAULT_PARSE_BYTES // smallest


async def test_a_pipelining_client_closed_by_the_relay_gets_its_close_handshake_completed():
    """The relay closes a client whose pipelined frames are still unparsed: the rest of them is dropped
    and the client's answer to the close frame behind them is read, so the connection ends at once (not
    when the close timeout, made an hour here, would cut it)."""
    echo = _Echo(close_after=1)
    async with raw_websocket(echo) as (client, reader, writer):
        for i in range(3000):
            client.send_text(f'["REQ","s{i}",{{"kinds":[1]}}]'.encode())
        writer.write(b"".join(client.data_to_send()))
        await asyncio.wait_for(echo.closed.wait(), 60)
        while client.close_rcvd is None:  # the server's close frame; the client answers it
            client.receive_data(await asyncio.wait_for(reader.read(65536), 60))
            writer.write(b"".join(client.data_to_send()))
        assert client.close_rcvd.code == 1008
        # The server ends the TCP connection once it has read the answer.
        while await asyncio.wait_for(reader.read(65536), 60):
            pass


async def test_a_clients_own_close_read_but_unparsed_when_the_relay_closes_ends_the_connection():
    """The client sends its frames and its own close frame in one write; the relay takes one message
    and closes (a flooder dropped): the client's close, read but not parsed yet, is parsed then, so
    the connection ends at once (not when the close timeout, an hour here, would cut it)."""
    echo = _Echo(close_after=1)
    async with raw_websocket(echo) as (client, reader, writer):
        for i in range(300):  # about 10 KB: more than one piece, in one write
            client.send_text(f'["REQ","s{i}",{{"kinds":[1]}}]'.encode())
        client.send_close(1000)
        writer.write(b"".join(client.data_to_send()))
        await asyncio.wait_for(echo.closed.wait(), 60)
        while client.close_rcvd is None:
            client.receive_data(await asyncio.wait_for(reader.read(65536), 60))
        assert client.close_rcvd.code == 1008
        assert not b"".join(client.data_to_send())  # it closed first: nothing to answer
        while await asyncio.wait_for(reader.read(65536), 60):  # the server ends the connection
            pass
    assert echo.unparsed_at_close == [True]  # the case this test is about
