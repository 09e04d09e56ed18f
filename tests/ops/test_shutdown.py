"""Graceful shutdown: SIGTERM finishes in-flight work, closes websockets with a close frame and
releases claimed wakes; a second signal exits at once."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from appliance.store.statement import SQL


def _silent_websocket(port: int) -> socket.socket:
    """A websocket client that completes the handshake, then never reads or answers a close frame."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


@pytest.mark.slow
def test_a_second_signal_exits_at_once(server):
    sock = _silent_websocket(server.port)
    try:
        server.proc.send_signal(signal.SIGTERM)
        # The graceful stop waits (up to its grace period) for this client's close reply...
        with pytest.raises(Exception):
            server.proc.wait(timeout=1.5)
        # ...and a second signal ends it without waiting for anything.
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        sock.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_graceful_stop_exits_0(make_server, sig):
    """SIGTERM (or SIGINT) with clients connected: the graceful stop runs to its end and the
    process exits 0, as a service manager expects of a clean stop (before: killed by the signal it
    re-raised, -15). The log says the application shut down."""
    server = make_server()
    import websockets.sync.client

    with websockets.sync.client.connect(server.url) as ws:
        ws.recv()
        server.proc.send_signal(sig)
        assert server.proc.wait(timeout=30) == 0
    assert "Application shutdown complete" in server.log_path.read_text()


@pytest.mark.slow
async def test_sigterm_answers_every_event_it_took_and_closes_with_1001(server, connect, alice):
    import asyncio
    import json

    client = await connect(server.url)
    events = [alice.sign(1, content=f"in flight {i}") for i in range(200)]
    for ev in events:
        await client.send(["EVENT", ev.to_dict()])
    server.proc.send_signal(signal.SIGTERM)
    oks = {}
    close_code = None
    while True:
        try:
            msg = json.loads(await asyncio.wait_for(client.ws.recv(), 10))
        except Exception as exc:  # the close frame ends the stream
            close_code = getattr(getattr(exc, "rcvd", None), "code", None)
            break
        if msg[0] == "OK":
            oks[msg[1]] = msg[2]
    assert close_code == 1001
    assert server.proc.wait(timeout=15) == 0  # a graceful stop exits 0
    # Every event was answered, and every one answered true is stored (a restart shows them).
    accepted = {i for i, ok in oks.items() if ok}
    assert len(oks) == len(events)
    server.stop()  # (already stopped: closes its log)
    server.start()
    again = await connect(server.url)
    got, _ = await again.req("r", {"authors": [alice.pubkey], "limit": 500})
    assert {e["id"] for e in got} == accepted


@pytest.mark.slow
async def test_sigterm_releases_claimed_wakes_for_the_next_start(tmp_path, anyio_backend):
    """A wake being sent when SIGTERM comes is given back, due at once: the next start sends it
    first, with the same apns-id, instead of after its claim lapses (here ten minutes)."""
    from tests.conftest import Server
    from tests.push.delivery_helpers import Apns, Pusher, delivery_config, jobs, token, wait_until

    (tmp_path / "apns").mkdir()
    apns = Apns(tmp_path / "apns").start()
    try:
        server = Server(tmp_path / "data", config=delivery_config(apns, settings={"wake_visibility_timeout": 600})
                        ).start()
        tok = token()
        apns.emulator.behave(tok, delay=60)  # the send hangs: the wake stays claimed
        alice, bob = await Pusher.connect(server), await Pusher.connect(server)
        await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]}, "class": "default"}])
        ev = await alice.publish(9, [["p", bob.pubkey]])
        await wait_until(lambda: [j["state"] for j in jobs(server, event_id=ev.id)] == ["claimed"], timeout=20)
        await alice.client.close()
        await bob.client.close()
        stopped_at = time.time()
        server.stop()
        (job,) = jobs(server, event_id=ev.id)
        assert job["state"] == "pending"
        from tests.push.e2e_helpers import db_rows

        ((due,),) = db_rows(server.data_dir, SQL("SELECT due_at FROM wake_jobs WHERE id = ?",
                                                 "SELECT due_at FROM wake_jobs WHERE id = %s"), (job["id"],))
        assert due <= stopped_at + 15  # due at the stop, not when the ten-minute claim would lapse

        apns.emulator.clear(tok)
        server.start()
        try:
            await wait_until(lambda: jobs(server, event_id=ev.id)[0]["state"] == "delivered", timeout=30)
            assert [r.header("apns-id") for r in apns.emulator.requests(tok)][-1] == job["id"]
        finally:
            server.stop()
    finally:
        apns.stop()
