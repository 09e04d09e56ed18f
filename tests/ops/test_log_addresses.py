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
    assert 'client - "WebSocket /" [accepted]' in text, text  # the line is there, without the address
    assert "admin sign-in failed" in text
    assert client not in text and FORWARDED not in text, text


def test_log_client_addresses_is_the_opt_in(tmp_path):
    server = Server(tmp_path / "data", "--log-level", "info", "--log-client-addresses", "true").start()
    try:
        client = asyncio.run(_visit(server))
        text = _log_after(server, "admin sign-in failed")
    finally:
        server.stop()
    assert f'{client} - "WebSocket /" [accepted]' in text, text
    assert f"admin sign-in failed from {FORWARDED}" in text, text
