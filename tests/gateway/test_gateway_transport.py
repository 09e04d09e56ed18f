"""The executor's gateway transport (appliance/transports/gateway.py) against the real gateway and the
APNs emulator: request shape, NIP-98 with the relay key, and every answer mapped to an outcome."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest

from appliance.nostr.nip98 import verify_http_auth
from appliance.transports.base import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    PERMANENT,
    TRANSIENT,
    WakeRequest,
)
from appliance.transports.gateway import GatewayTransport, check_gateway_url, outcome_of
from tests.conftest import free_port
from tests.gateway.conftest import Relay

pytestmark = pytest.mark.anyio


def wake(grant: str, request_id: str | None = None, expires_in: int = 300) -> WakeRequest:
    return WakeRequest(grant, request_id or str(uuid.uuid4()), int(time.time()) + expires_in)


@pytest.fixture
async def relay_transport(ctx):
    relay = Relay()
    t = GatewayTransport(ctx.base, relay.secret)
    yield relay, t
    await t.close()


async def test_request_shape_and_signature(ctx, relay_transport):
    relay, t = relay_transport
    req = wake("g.x", "11111111-1111-4111-8111-111111111111")
    body, headers = t.request(req)
    assert body == (b'{"v":1,"endpoint_grant":"g.x","request_id":"11111111-1111-4111-8111-111111111111",'
                    b'"expires_at":' + str(req.expires_at).encode() + b"}")
    ev = verify_http_auth(headers["authorization"], url=ctx.url, method="POST", body=body, now=int(time.time()))
    assert ev.pubkey == relay.pubkey
    # A second attempt of the same job is a different event, even within the same second.
    _, again = t.request(req)
    assert json.loads(base64.b64decode(again["authorization"][6:]))["id"] != ev.id


async def test_accepted_and_retried_job(ctx, relay_transport):
    relay, t = relay_transport
    inst = await ctx.installation(relay)
    grant = inst.grants[relay.pubkey]
    rid = str(uuid.uuid4())
    ctx.emu.behave(inst.endpoint, 503, "ServiceUnavailable", retry_after=9, times=1)
    out = await t.send(wake(grant, rid))
    assert (out.kind, out.status, out.retry_after) == (TRANSIENT, 503, 9.0)
    out = await t.send(wake(grant, rid))  # at once, same job: a fresh NIP-98 event
    assert (out.kind, out.status) == (ACCEPTED, 200)
    assert [dict(r.headers)["apns-id"] for r in ctx.recs(inst.endpoint, 2)] == [rid, rid]
    out = await t.send(wake(grant, rid))  # done: the gateway keeps the reservation
    assert (out.kind, out.status) == (PERMANENT, 404)


async def test_invalid_endpoint_carries_generation(ctx, relay_transport):
    relay, t = relay_transport
    inst = await ctx.installation(relay, generation=4)
    ctx.emu.unregister(inst.endpoint, at=1_750_000_000)
    out = await t.send(wake(inst.grants[relay.pubkey]))
    assert (out.kind, out.generation, out.invalid_at) == (INVALID_ENDPOINT, 4, 1_750_000_000)


async def test_configuration_and_refusals(ctx, relay_transport):
    relay, t = relay_transport
    inst = await ctx.installation(relay)
    grant = inst.grants[relay.pubkey]
    ctx.emu.behave(inst.endpoint, 403, "InvalidProviderToken", times=1)
    assert (await t.send(wake(grant))).kind == CONFIGURATION
    # Another relay's key, a grant the gateway never issued.
    other = GatewayTransport(ctx.base, Relay().secret)
    try:
        out = await other.send(wake(grant))
        assert (out.kind, out.status) == (PERMANENT, 404)
    finally:
        await other.close()
    assert (await t.send(wake("g0.AAAA"))).kind == PERMANENT
    # Our clock is off by two minutes: NIP-98 refused, an operator problem.
    skewed = GatewayTransport(ctx.base, relay.secret, clock=lambda: time.time() - 120)
    # A gateway_url that does not reach the gateway's routes (another host name: the relay answers).
    wrong = GatewayTransport(f"http://localhost:{ctx.server.port}", relay.secret)
    try:
        out = await skewed.send(wake(grant))
        assert (out.kind, out.status) == (CONFIGURATION, 401)
        out = await wrong.send(wake(grant))
        assert out.kind == CONFIGURATION and 400 <= out.status < 500 and out.status not in (400, 401, 404, 410)
    finally:
        await wrong.close()
        await skewed.close()
    # Revoked: permanent, nothing reaches APNs.
    assert (await inst.revoke_delegation(relay.pubkey, 1)).status_code == 200
    assert (await t.send(wake(grant))).kind == PERMANENT
    ctx.recs(inst.endpoint, 1)


async def test_unreachable_gateway_is_transient():
    t = GatewayTransport(f"http://127.0.0.1:{free_port()}", Relay().secret, timeout=2)
    try:
        out = await t.send(wake("g.x"))
        assert out.kind == TRANSIENT
    finally:
        await t.close()


@pytest.mark.parametrize("status,body,kind,extra", [
    (200, b'{"status":"accepted"}', ACCEPTED, {}),
    (410, b'{"status":"invalid_endpoint","generation":3,"invalid_at":null}', INVALID_ENDPOINT,
     {"generation": 3, "invalid_at": None}),
    (410, b'{"status":"invalid_endpoint","generation":"3","invalid_at":12}', PERMANENT, {"generation": None}),
    (410, b"", PERMANENT, {}),
    (503, b'{"status":"retry","retry_after_seconds":5}', TRANSIENT, {"retry_after": 5.0}),
    (503, b'{"status":"retry","retry_after_seconds":null}', TRANSIENT, {"retry_after": None}),
    (503, b'{"status":"retry","retry_after_seconds":99999}', TRANSIENT, {"retry_after": 3600.0}),
    (503, b'{"error":"temporarily_unavailable"}', TRANSIENT, {}),
    (503, b'{"error":"configuration_fault"}', CONFIGURATION, {}),
    (401, b'{"error":"invalid_auth"}', CONFIGURATION, {}),
    (400, b'{"error":"invalid_request"}', PERMANENT, {}),
    (404, b'{"error":"invalid_grant"}', PERMANENT, {}),
    (502, b"<html>", TRANSIENT, {}),
    (429, b"", TRANSIENT, {}),
    (418, b"", CONFIGURATION, {}),
    (405, b"", CONFIGURATION, {}),
])
def test_answer_table(status, body, kind, extra):
    out = outcome_of(status, body)
    assert out.kind == kind and out.status == status
    for k, v in extra.items():
        assert getattr(out, k) == v


def test_gateway_url_checks():
    assert check_gateway_url("https://push.example.org/base") == "https://push.example.org/base"
    for bad in ("ftp://x", "https://", "https://u:p@x", "https://x/?q=1", "https://x#f", "https://x:99999", 7):
        with pytest.raises(ValueError):
            check_gateway_url(bad)
