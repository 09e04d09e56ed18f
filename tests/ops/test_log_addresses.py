"""Logs keep the README's promise: no client address in any line at INFO or above (uvicorn's
websocket lines included, a failed dashboard sign-in too); `log_client_addresses = true` is the
opt-in."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import websockets

from tests.conftest import Server

pytestmark = pytest.mark.slow

FORWARDED = "203.0.113.77"  # what a local proxy says the client is


async def _visit(server: Server) -> str:
    """A websocket (through a 'proxy' naming FORWARDED) and a failed sign-in; the client's own
    address and port as the server saw them."""
    async with websockets.connect(server.url, additional_headers={"X-Forwarded-For": FORWARDED}) as ws:
        await asyncio.wait_for(ws.recv(), 10)  # the AUTH challenge
        host, port = ws.local_address[:2]
    async with websockets.connect(server.url) as ws:
        await asyncio.wait_for(ws.recv(), 10)
    async with httpx.AsyncClient(base_url=server.http) as c:
        page = await c.get("/admin/login")
        from tests.admin.helpers import csrf_of

        await c.post("/admin/login", data={"csrf": csrf_of(page.text), "password": "wrong password"},
                     headers={"X-Forwarded-For": FORWARDED})
    return f"{host}:{port}"


def _log_after(server: Server, marker: str) -> str:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = server.log_path.read_text()
        if marker in text:
            return text
        time.sleep(0.05)
    return server.log_path.read_text()


def test_no_client_address_at_info(tmp_path):
    server = Server(tmp_path / "data", "--log-level", "info").start()
    try:
        client = asyncio.run(_visit(server))
        text = _log_after(server, "admin sign-in failed")
    finally:
        server.stop()
    # (uvicorn's websocket line, where the server logs one, is there without the address)
    assert all(line.startswith('INFO:     client - "WebSocket /"') for line in text.splitlines() if '"WebSocket /' in line)
    assert "admin sign-in failed" in text
    assert client not in text and FORWARDED not in text, text


def test_log_client_addresses_is_the_opt_in(tmp_path):
    server = Server(tmp_path / "data", "--log-level", "info", "--log-client-addresses", "true").start()
    try:
        client = asyncio.run(_visit(server))
        text = _log_after(server, "admin sign-in failed")
    finally:
        server.stop()
    ws_lines = [line for line in text.splitlines() if '"WebSocket /' in line]
    assert not ws_lines or any(f'{client} - "WebSocket /"' in line for line in ws_lines), text
    assert f"admin sign-in failed from {FORWARDED}" in text, text


def test_the_delivery_log_names_leases_as_the_dashboard_does(tmp_path):
    """The delivery log's lease reference is the dashboard's fingerprint (`lease:1a2b3c4d5e`), not a
    prefix of the author's pubkey."""
    from appliance.admin.redact import Redactor
    from appliance.store.fingerprints import KEY_PURPOSE
    from appliance.store.keyfile import KeyFile
    from tests.push.delivery_helpers import Apns, Pusher, delivery_config, log_rows, token, wait_until

    (tmp_path / "apns").mkdir()
    apns = Apns(tmp_path / "apns").start()
    server = Server(tmp_path / "data", config=delivery_config(apns)).start()
    try:
        async def wake():
            alice, bob = await Pusher.connect(server), await Pusher.connect(server)
            tok = token()
            lease = await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]},
                                                         "class": "default"}])
            await alice.publish(9, [["p", bob.pubkey]])
            await wait_until(lambda: log_rows(server), timeout=30)
            await alice.client.close()
            await bob.client.close()
            return bob.pubkey, next(t[1] for t in lease["tags"] if t[0] == "d")

        pubkey, d = asyncio.run(wake())
        (row,) = log_rows(server)
        red = Redactor(KeyFile.read(server.data_dir / "appliance.key").derive(KEY_PURPOSE))
        assert row["lease"] == red.lease(pubkey, d) and row["lease"].startswith("lease:")
        assert pubkey[:12] not in row["lease"]
    finally:
        server.stop()
        apns.stop()
