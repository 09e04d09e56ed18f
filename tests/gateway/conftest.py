"""Fixtures: the gateway in `appliance serve` with the APNs emulator behind it, and relays."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from appliance.nostr.keys import generate_secret, public_key
from appliance.nostr.nip98 import make_http_auth
from appliance.testing.apns_emulator import ApnsEmulator
from appliance.testing.gateway_client import AppInstallation
from tests.conftest import Server
from tests.leaks import sensitive
from tests.gateway.helpers import PROFILE, TOPIC, GatewaySetup, token

QUOTA = 6  # endpoint_quota_max of the delivery fixture's gateway

class Relay:
    def __init__(self):
        self.secret = generate_secret()
        self.pubkey = public_key(self.secret)
        sensitive(self.secret, self.pubkey)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deliveries")
    setup = GatewaySetup(tmp)
    emu = ApnsEmulator(topics=[TOPIC], pki_dir=tmp / "pki")
    from cryptography.hazmat.primitives import serialization

    emu.add_key("TEAM123456", "ABC123DEFG", serialization.load_pem_private_key(setup.p8.read_bytes(), None))
    emu.start_in_thread()
    server = Server(tmp / "data")
    server.config = setup.config(f"http://127.0.0.1:{server.port}",
                                 profiles=setup.profile_toml(apns_url=emu.url, ca_file=emu.ca_file),
                                 extra=f"endpoint_quota_max = {QUOTA}\nendpoint_quota_window = 600")
    server.start()
    yield server, setup, emu
    server.stop()
    emu.stop_thread()


@pytest.fixture
async def http(env):
    async with httpx.AsyncClient(base_url=env[0].http, timeout=20) as client:
        yield client


class Ctx:
    def __init__(self, env, http):
        self.server, self.setup, self.emu = env
        self.http = http
        self.base = f"http://127.0.0.1:{self.server.port}"
        self.url = self.base + "/v1/deliveries/apns"
        self.sent: dict[bytes, int] = {}

    async def installation(self, relay: Relay, generation: int = 1, **kw) -> AppInstallation:
        inst = AppInstallation(self.http, self.base, self.setup.attester(), PROFILE, token())
        assert (await inst.enroll()).status_code == 201
        r = await inst.delegate(relay.pubkey, generation, **kw)
        assert r.status_code == 201, r.text
        return inst

    def recs(self, token: str, n: int) -> list:
        """The emulator's records for `token` once it holds `n` (it records just after answering)."""
        self.emu.wait_for(lambda recs: sum(r.token == token for r in recs) >= n, 10)
        out = self.emu.requests(token)
        assert len(out) == n, [(r.status, r.reason) for r in out]
        return out

    def body(self, grant: str, request_id: str | None = None, expires_at: int | None = None) -> bytes:
        return json.dumps({"v": 1, "endpoint_grant": grant, "request_id": request_id or str(uuid.uuid4()),
                           "expires_at": int(time.time()) + 300 if expires_at is None else expires_at},
                          separators=(",", ":")).encode()

    async def post(self, body: bytes, auth: str | None, **headers) -> httpx.Response:
        h = {"content-type": "application/json", **headers}
        if auth is not None:
            h["authorization"] = auth
        return await self.http.post("/v1/deliveries/apns", content=body, headers=h)

    async def deliver(self, relay: Relay, grant: str, **kw) -> httpx.Response:
        body = self.body(grant, **kw)
        # A retry of the same job within one second would otherwise be the very same NIP-98 event
        # (same created_at, tags and content: same id), which the gateway refuses as a replay.
        created_at = max(int(time.time()), self.sent.get(body, 0) + 1)
        self.sent[body] = created_at
        return await self.post(body, make_http_auth(relay.secret, self.url, "POST", body, created_at=created_at))


@pytest.fixture
def ctx(env, http):
    return Ctx(env, http)


