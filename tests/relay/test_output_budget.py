"""Clients that never read what they asked for: their unread output is bounded process-wide
(max_output_buffer_total), the connections with the most unread go first, a connection over its
own budget is served no new answers meanwhile, and everyone else is still served. No timing:
the bound is read from the relay's own peak of unread output."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import httpx
import pytest

from tests.conftest import Client

pytestmark = pytest.mark.anyio

TOKEN = "output-budget-test-token"
MIB = 1024 * 1024


class Unread:
    """A connection's output, as far as the relay's room goes."""

    def __init__(self, queued_bytes: int):
        self.queued_bytes = queued_bytes


async def never_reading(port: int, requests: list[str]) -> socket.socket:
    """A websocket client with a small receive buffer that sends `requests` and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # the head only: what follows stays unread
    assert head.startswith(b"HTTP/1.1 101"), head
    out = b""
    for text in requests:
        data = text.encode()
        mask = b"\x01\x02\x03\x04"
        n = len(data)
        header = b"\x81" + (bytes([0x80 | n]) if n < 126 else b"\xfe" + n.to_bytes(2, "big"))
        out += header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    sock.sendall(out)
    return sock


async def store_big_notes(server, author, n: int, *, width: int) -> Client:
    """`n` kind-1 notes of ~2 KB tagged `t: big` (numbered, `width` digits), each acknowledged; the
    publishing client, still open."""
    writer = await Client.connect(server.url)
    for i in range(n):
        await writer.send(["EVENT", author.sign(1, [["t", "big"]], f"{i:0{width}} " + "x" * 2000).to_dict()])
    for _ in range(n):
        assert (await writer.expect(lambda m: m[0] == "OK"))[2]
    return writer


async def until_queue_settles(server, *, above: int, tries: int) -> None:
    """Wait (0.2 s a try) until the queued output is over `above` and stopped changing."""
    for _ in range(tries):
        before = metric(server, "appliance_output_queued_bytes")
        await asyncio.sleep(0.2)
        if before > above and metric(server, "appliance_output_queued_bytes") == before:
            return


def metric(server, name: str) -> float:
    text = httpx.get(f"{server.http}/admin/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


@pytest.mark.slow
async def test_never_reading_clients_are_bounded_process_wide(make_server, alice):
    budget = 3 * MIB
    answer = 256 * 1024  # max_query_bytes: the largest answer, and each connection's own budget
    srv = make_server("--max-query-bytes", str(answer), "--max-output-buffer-total", str(budget),
                      "--metrics-token", TOKEN, "--event-rate", "0", "--req-rate", "0")
    writer = await Client.connect(srv.url)
    for i in range(300):
        await writer.send(["EVENT", alice.sign(1, [["t", "big"]], f"{i} " + "x" * 2000).to_dict()])
    for _ in range(300):
        assert (await writer.expect(lambda m: m[0] == "OK"))[2]
    big = [json.dumps(["REQ", f"s{i}", {"kinds": [1], "#t": ["big"], "limit": 500}]) for i in range(24)]
    hogs = [await never_reading(srv.port, big) for _ in range(30)]
    try:
        # The relay sheds: connections are dropped (the largest unread first) until the rest fits.
        for _ in range(600):
            log = srv.log_path.read_text()
            if log.count("dropping slow connection") >= 5:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no slow connection was dropped")
        # Someone who reads is still served, and the process is alive.
        bystander = await Client.connect(srv.url)
        events, closed = await bystander.req("b", {"kinds": [1], "#t": ["big"], "limit": 5})
        assert closed is None and len(events) == 5
        await bystander.close()
        assert srv.proc.poll() is None
        peak = metric(srv, "appliance_output_queued_bytes_peak")
        # Never more than the budget, plus the one message that found it full.
        assert 0 < peak <= budget + answer + 64 * 1024, peak
        assert metric(srv, "appliance_output_queued_bytes") <= budget
    finally:
        for sock in hogs:
            sock.close()
        await writer.close()
    # Once they are gone, nothing of theirs is counted.
    for _ in range(300):
        if metric(srv, "appliance_output_queued_bytes") == 0:
            break
        await asyncio.sleep(0.1)
    assert metric(srv, "appliance_output_queued_bytes") == 0


@pytest.mark.slow
async def test_a_connection_over_its_own_budget_is_served_no_new_answers(make_server, alice):
    """One client asks for 24 answers and reads none: at most a few answers past its own budget
    (max_query_bytes) are ever queued for it; the rest wait unread, not built (before, each one
    was read and queued until the connection was dropped at 32 MiB)."""
    answer = 256 * 1024
    srv = make_server("--max-query-bytes", str(answer), "--metrics-token", TOKEN, "--event-rate", "0",
                      "--req-rate", "0")
    writer = await store_big_notes(srv, alice, 300, width=1)
    big = [json.dumps(["REQ", f"s{i}", {"kinds": [1], "#t": ["big"], "limit": 500}]) for i in range(24)]
    hog = await never_reading(srv.port, big)
    try:
        await until_queue_settles(srv, above=answer, tries=100)  # what it asked for stopped being produced
        queued = metric(srv, "appliance_output_queued_bytes")
        # Its own budget, and the answers that were being read when it was reached (two at most).
        assert answer < queued <= answer + 2 * answer + 64 * 1024, queued
        assert "dropping slow connection" not in srv.log_path.read_text()
        # It is still connected: reading now, it gets every answer it asked for.
        hog.setblocking(True)
        hog.settimeout(60)
        got = b""
        while got.count(b'["EOSE"') < 24:
            piece = hog.recv(1 << 20)
            assert piece, "the connection ended"
            got += piece
    finally:
        hog.close()
        await writer.close()



@pytest.mark.slow
async def test_the_connection_with_the_most_unread_output_goes_first(make_server, alice):
    """Over max_output_buffer_total, the connections with the most unread output are dropped, not the
    one whose answer found the budget full: a client that reads asks for an answer larger than what
    is left, and the never-reading one holding more unread output than that answer is dropped
    ("dropping slow connection"), while the reader gets its whole answer.

    The sizes make it certain whatever the timing: the hog stops being served once it holds more
    than its own budget (1 MiB) unread, with at most two answers of ~300 KB being built then, so it
    holds 1-1.6 MiB and never passes the process-wide 1.75 MiB by itself (its reads reserve at most
    136 x 4 KiB, max_message_length); the reader's answer (~900 KB) is smaller than what the hog
    holds, and with it the sum passes 1.75 MiB. (The hog asks for 64 answers, ~18 MB: the kernel's
    loopback buffers, autotuned up to several MB on a busy box, take part of it before any of it
    stays unread here; with 30 answers they once took all but 0.6 MB.)"""
    own = 1024 * 1024  # max_query_bytes: each connection's own budget
    budget = 1792 * 1024
    srv = make_server("--max-query-bytes", str(own), "--max-output-buffer-total", str(budget),
                      "--max-message-length", "4096", "--metrics-token", TOKEN, "--event-rate", "0",
                      "--req-rate", "0", "--max-subscriptions", "100")
    writer = await store_big_notes(srv, alice, 450, width=3)
    small = [json.dumps(["REQ", f"s{i}", {"kinds": [1], "#t": ["big"], "limit": 136}]) for i in range(64)]
    hog = await never_reading(srv.port, small)
    try:
        await until_queue_settles(srv, above=own, tries=300)  # it is served no more
        held = metric(srv, "appliance_output_queued_bytes")
        assert own < held < budget, held
        assert "dropping slow connection" not in srv.log_path.read_text()
        reader = await Client.connect(srv.url)
        events, closed = await reader.req("r", {"kinds": [1], "#t": ["big"], "limit": 400})
        assert closed is None and len(events) == 400  # (~900 KB: less than the hog holds)
        log = srv.log_path.read_text()
        assert log.count("dropping slow connection") == 1, log
        assert f"queued_bytes={int(held)}" in log  # the hog
        events, closed = await reader.req("r2", {"kinds": [1], "#t": ["big"], "limit": 5})
        assert closed is None and len(events) == 5
        await reader.close()
    finally:
        hog.close()
        await writer.close()


def test_an_answer_counts_toward_the_budget_until_queued_or_dropped(built_app):
    """A REQ's answer built on a reader thread keeps its size under max_output_buffer_total until
    the loop has queued it (`done` returned), or until it is dropped unsent (its read cancelled):
    answers waiting for the loop are never memory the budget does not see."""
    import threading

    from appliance.front.frames import Frames
    from appliance.nostr.filters import parse_filter

    relay = built_app.relay
    origin = relay.origins.origins[0]
    filters = [parse_filter({"kinds": [1], "limit": 500})]  # (too many events to be read on the loop)
    answer = Frames(b"\x81\x02[]" * 1000, 1000)

    async def run():
        loop = asyncio.get_running_loop()
        seen = loop.create_future()

        def done(result, exc):
            seen.set_result((result, exc, relay.reserved_bytes))

        relay.start_query(origin, None, filters, owner=object(), render=lambda rows: (answer, []), done=done)
        result, exc, reserved = await asyncio.wait_for(seen, 30)
        assert exc is None and result[0] is answer
        assert reserved == len(answer)  # rows freed: the answer's own size, held while it is queued
        assert relay.reserved_bytes == 0

        rendered, go_on = threading.Event(), threading.Event()

        def render(rows):  # on the reader thread: the answer is ready when its read is cancelled
            rendered.set()
            go_on.wait(30)
            return Frames(b"\x81\x02[]" * 1000, 1000), []

        handle = relay.start_query(origin, None, filters, owner=object(), render=render,
                                   done=lambda result, exc: pytest.fail("a cancelled read was delivered"))
        assert await asyncio.to_thread(rendered.wait, 30)
        assert relay.reserved_bytes == relay.read_reserve(filters)  # twice what it may send, while built
        handle.cancel()
        go_on.set()
        for _ in range(300):
            if relay.reserved_bytes == 0:
                break
            await asyncio.sleep(0.01)
        assert relay.reserved_bytes == 0

    asyncio.run(run())


def test_answers_being_built_are_counted_while_the_loop_weighs_them(built_app):
    """Reader threads note the answers they build for a connection (`Output.building`) while the
    loop drops those no longer wanted and weighs the rest: neither sees the other's change half
    made. (Before, the loop's pass over them now and then raised "dictionary changed size during
    iteration" in the middle of starting held reads, and those REQs never got their EOSE.)"""
    import threading
    from collections import deque

    from appliance.relay.output import Output
    from tests.races import thread_switches_often

    class Sub:
        def __init__(self, n):
            self.n = n

    async def run():
        output = Output(built_app.relay, None, lambda: None, high_water=10 ** 12)
        stop = threading.Event()

        def reader_thread():  # answers finish, and the loop queues the oldest
            built, n = deque(), 0
            while not stop.is_set():
                n += 1
                built.append(Sub(n))
                output.building(built[-1], 1)
                if len(built) > 30:
                    output.built(built.popleft())

        thread = threading.Thread(target=reader_thread)
        with thread_switches_often():
            thread.start()
            try:
                for _ in range(60_000):
                    output.forget_unwanted(lambda sub: sub.n % 7 != 0)
                    assert not output.over_budget()
            finally:
                stop.set()
                thread.join()

    asyncio.run(run())


def test_an_answer_closed_as_it_is_built_counts_for_nothing(tmp_path):
    """A reader thread that finds its REQ still open, then notes its answer (`Output.building`),
    may do so just after the loop closed the REQ and forgot its answer: that answer must not count
    then, or a REQ sent meanwhile is held for it with no write ever coming to start it (it never
    got its EOSE). The reader is paused between the two steps here (a trace hook in its thread)
    while the client's CLOSE and next REQ are handled."""
    import json
    import threading
    from types import SimpleNamespace

    from websockets.protocol import State
    from websockets.server import ServerProtocol

    from appliance.app import build
    from appliance.front.websocket import Counters, WebSocketConnection
    from appliance.relay.output import Output
    from appliance.relay.session import Session
    from appliance.settings import load
    from tests.conftest import Identity
    from tests.pg import storage_env
    from tests.relay.test_keepalive import Transport

    closed, built, go = threading.Event(), threading.Event(), threading.Event()
    building, over_budget = Output.building.__code__, Output.over_budget.__code__

    def trace(frame, event, arg):  # in the reader threads
        if frame.f_code is building and getattr(frame.f_locals["answer"], "sub_id", None) == "a":
            closed.set()  # "a" was open when its reader looked: the loop closes it now
            go.wait(30)
            return lambda frame, event, arg: built.set() if event == "return" else None
        if frame.f_code is over_budget and closed.is_set():
            built.wait(30)  # "b" weighs its output only once "a"'s answer was noted
        return None

    def text(message) -> bytes:  # a client's frame, masked with zeros
        data = json.dumps(message).encode()
        return b"\x81" + (bytes([0x80 | len(data)]) if len(data) < 126 else b"\xfe" + len(data).to_bytes(2, "big")) \
            + b"\0\0\0\0" + data

    data_dir = tmp_path / "data"
    # Answers of 150 notes of ~850 bytes fill max_query_bytes, and their frames take it past.
    settings = load(flags={"data_dir": str(data_dir), "max_query_bytes": 64 * 1024, "event_rate": 0,
                           "req_rate": 0}, environ=storage_env(data_dir), config_path=None)
    threading.settrace(trace)
    app = build(settings)
    relay = app.relay

    async def run():
        origin = relay.origins.origins[0]
        alice = Identity()
        for i in range(150):
            await relay.publish(origin, None, alice.sign(1, [], f"{i:03} " + "x" * 500))
        transport = Transport()
        ws = WebSocketConnection(ServerProtocol(state=State.OPEN), transport, counters=Counters(),
                                 connections=set(), ping_interval=None)
        session = Session(relay, SimpleNamespace(client=SimpleNamespace(host="127.0.0.1", port=1)), origin)
        serving = asyncio.ensure_future(session.serve(ws))
        await asyncio.sleep(0)
        ws.data_received(text(["REQ", "a", {"kinds": [1], "limit": 150}]))
        assert await asyncio.to_thread(closed.wait, 30)
        ws.data_received(text(["CLOSE", "a"]) + text(["REQ", "b", {"kinds": [1], "limit": 150}]))
        go.set()
        for _ in range(3000):
            if b'["EOSE","b"]' in transport.out:
                break
            await asyncio.sleep(0.01)
        assert b'["EOSE","b"]' in transport.out
        ws.connection_lost(None)
        await asyncio.wait_for(serving, 30)

    try:
        asyncio.run(run())
    finally:
        threading.settrace(None)
        go.set()
        relay.close()
        app.store.close()


def test_a_read_held_for_room_starts_first_for_a_connection_that_reads(built_app):
    """Reads held for room (max_output_buffer_total) start again the connections with the least
    unread output first, in turns among equals: a client that reads is not kept waiting behind
    every read of the clients that do not."""
    relay = built_app.relay
    try:
        hog1, hog2, reader = Unread(5 * MIB), Unread(5 * MIB), Unread(0)
        started: list[str] = []
        for i in range(3):
            relay.wait_for_room(4, lambda i=i: started.append(f"hog1.{i}"), hog1)
            relay.wait_for_room(4, lambda i=i: started.append(f"hog2.{i}"), hog2)
        relay.wait_for_room(4, lambda: started.append("reader"), reader)
        relay.max_output_total = 9  # room for one read of 4 beside the 2 reserved
        relay.reserved_bytes, relay.queued_bytes = 2, 0
        relay._wake_reads()
        assert started == ["reader"]
        for _ in range(3):
            relay._wake_reads()
        assert started == ["reader", "hog1.0", "hog2.0", "hog1.1"]
        relay.forget_waiters(hog1)  # its connection is cut: its held reads never start
        relay._wake_reads()
        relay._wake_reads()
        assert started[4:] == ["hog2.1", "hog2.2"] and not relay.read_waiters
    finally:
        relay.reserved_bytes = 0


def test_a_held_read_that_fails_to_start_holds_up_no_other(built_app):
    """A read held for room whose start raises (a bug) is logged; the reads held behind it still
    start in the same pass, with the room it would have taken."""
    relay = built_app.relay
    try:
        started: list[str] = []

        def broken():
            raise RuntimeError("a bug in starting a read")

        relay.wait_for_room(4, broken, Unread(0))
        relay.wait_for_room(4, lambda: started.append("next"), Unread(1))
        relay.max_output_total = 6  # room for one read of 4 beside the 2 reserved
        relay.reserved_bytes, relay.queued_bytes = 2, 0
        relay._wake_reads()
        assert started == ["next"] and not relay.read_waiters
    finally:
        relay.reserved_bytes = 0


async def every_eose(client: Client, n: int, limit_of) -> None:
    """Send `n` REQs (`s0`...) at once, `limit_of(i)` big notes each, and read everything as it
    comes until each has its EOSE (a REQ that never gets one fails after 60 s of silence)."""
    for i in range(n):
        await client.send(["REQ", f"s{i}", {"kinds": [1], "#t": ["big"], "limit": limit_of(i)}])
    ended: set[str] = set()
    while len(ended) < n:
        try:
            msg = await client.recv(timeout=60)
        except asyncio.TimeoutError:
            raise AssertionError(f"{n - len(ended)} of {n} REQs never got their EOSE") from None
        assert msg[0] in ("EVENT", "EOSE"), msg
        if msg[0] == "EOSE":
            ended.add(msg[1])


async def test_a_client_that_reads_gets_every_answer_while_others_are_built(make_server, alice):
    """A REQ held because the answers being built for its connection would put it over its own
    budget (max_query_bytes), not because it is `full`, starts once they are written: a client
    that reads at once never makes its output full, so the drain of a full output never comes.
    (Answers of ~0.6 x max_query_bytes: two of them being built, or one written and one being
    built, hold the next REQs; before, most of 40 REQs then never got their EOSE.)"""
    srv = make_server("--max-query-bytes", str(256 * 1024), "--event-rate", "0", "--req-rate", "0",
                      "--max-subscriptions", "100")
    writer = await store_big_notes(srv, alice, 300, width=3)
    try:
        for _ in range(3):
            reader = await Client.connect(srv.url)
            await every_eose(reader, 40, lambda i: 75)
            await reader.close()
    finally:
        await writer.close()


@pytest.mark.slow
async def test_a_client_that_reads_gets_every_answer_beside_never_reading_ones(make_server, alice):
    """The same under max_output_buffer_total, filled by never-reading connections: a client that
    reads gets every answer it asks for, small and large (its reads held for room, or held for its
    own answers being built, all start again)."""
    srv = make_server("--max-query-bytes", str(256 * 1024), "--max-output-buffer-total", str(3 * MIB),
                      "--event-rate", "0", "--req-rate", "0", "--max-subscriptions", "100")
    writer = await store_big_notes(srv, alice, 300, width=3)
    big = [json.dumps(["REQ", f"h{i}", {"kinds": [1], "#t": ["big"], "limit": 500}]) for i in range(24)]
    hogs = [await never_reading(srv.port, big) for _ in range(10)]
    try:
        for _ in range(3):
            reader = await Client.connect(srv.url)
            await every_eose(reader, 40, lambda i: 75 if i % 2 else 3)
            await reader.close()
        assert srv.proc.poll() is None
    finally:
        for sock in hogs:
            sock.close()
        await writer.close()



async def test_a_read_held_for_answers_that_are_dropped_starts(make_server, alice):
    """A REQ held for the answers being built for its connection starts when those are dropped
    unsent (their subscriptions closed): no write follows then to start it. (Answers of ~0.7 x
    max_query_bytes, read on the loop as the messages come in one piece: the third REQ is held
    for the first two, which the CLOSEs then drop.)"""
    srv = make_server("--max-query-bytes", str(64 * 1024), "--event-rate", "0", "--req-rate", "0")
    writer = await store_big_notes(srv, alice, 30, width=2)
    want = {"kinds": [1], "#t": ["big"], "limit": 19}
    messages = [["REQ", "s0", {"kinds": [1], "limit": 1}], ["REQ", "s1", want], ["REQ", "s2", want],
                ["REQ", "s3", want], ["CLOSE", "s1"], ["CLOSE", "s2"]]
    sock = await never_reading(srv.port, [json.dumps(m) for m in messages[:1]])
    try:
        sock.settimeout(20)

        async def until(eose: bytes) -> None:
            got = b""
            while eose not in got:
                piece = await asyncio.to_thread(sock.recv, 1 << 20)
                assert piece, "the connection ended"
                got += piece

        await until(b'["EOSE","s0"]')  # (the loop's own connection opened: the next reads are quick)
        frames = b""
        for m in messages[1:]:
            data = json.dumps(m).encode()
            frames += b"\x81" + bytes([0x80 | len(data)]) + b"\0\0\0\0" + data  # (masked with zeros)
        sock.sendall(frames)
        await until(b'["EOSE","s3"]')
    finally:
        sock.close()
        await writer.close()
