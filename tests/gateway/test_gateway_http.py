"""The gateway routes over real HTTP against `appliance serve`: enrollment, delegation, rotation and both
revocations driven by the software attester, every closed error body, routing and configuration."""

from __future__ import annotations

import base64
import secrets
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from appliance.gateway import transcript as tr
from appliance.testing.gateway_client import AppInstallation
from appliance.store.statement import SQL
from tests.conftest import ROOT, Server, free_port
from tests.gateway.helpers import PROFILE, SANDBOX, GatewaySetup, token

pytestmark = pytest.mark.anyio

RELAY = "ab" * 32
ERR = {code: {"error": code} for code in ("invalid_request", "invalid_attestation", "not_authorized",
                                          "invalid_auth", "invalid_grant", "temporarily_unavailable")}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    """One appliance with the gateway on the main listener, public URL = its loopback address."""
    tmp = tmp_path_factory.mktemp("gw")
    setup = GatewaySetup(tmp)
    server = Server(tmp / "data")
    server.config = setup.config(f"http://127.0.0.1:{server.port}",
                                 profiles=setup.profile_toml() + setup.profile_toml(SANDBOX),
                                 extra="endpoint_quota_max = 3")
    server.start()
    yield server, setup
    server.stop()


@pytest.fixture
async def http(gw):
    server, _ = gw
    async with httpx.AsyncClient(base_url=server.http, timeout=10) as client:
        yield client


def app(gw, http, profile=PROFILE, env="production") -> AppInstallation:
    server, setup = gw
    return AppInstallation(http, f"http://127.0.0.1:{server.port}", setup.attester(env), profile, token())


async def enrolled(gw, http, **kw) -> AppInstallation:
    inst = app(gw, http, **kw)
    r = await inst.enroll()
    assert r.status_code == 201, r.text
    return inst


def test_startup_line_names_the_gateway(gw):
    server, _ = gw
    banner = server.log_path.read_text().splitlines()
    assert f"  gateway  http://127.0.0.1:{server.port}" in banner


async def test_challenge(http):
    r = await http.post("/v1/installations/challenges", content=b'{"v":1}', headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"challenge_id", "challenge", "expires_at"}
    assert len(base64.urlsafe_b64decode(body["challenge"] + "=")) == 32 and "=" not in body["challenge"]
    assert 295 <= body["expires_at"] - time.time() <= 301
    r2 = await http.post("/v1/installations/challenges", content=b'{"v":1}', headers={"content-type": "application/json"})
    assert r2.json()["challenge"] != body["challenge"]
    for bad in (b'{"v":2}', b'{"v":1,"x":1}', b'{"v":1}x', b"{}"):
        r = await http.post("/v1/installations/challenges", content=bad, headers={"content-type": "application/json"})
        assert (r.status_code, r.json()) == (400, ERR["invalid_request"])


async def test_enroll_delegate_rotate_revoke(gw, http):
    inst = await enrolled(gw, http)
    assert inst.handle and inst.epoch == 1
    r = await inst.delegate(RELAY, 1)
    assert r.status_code == 201 and set(r.json()) == {"endpoint_grant"}
    grant = r.json()["endpoint_grant"]
    assert inst.endpoint not in grant and len(grant) <= 4096
    r = await inst.rotate(token())
    assert (r.status_code, r.json()) == (200, {"status": "rotated"})
    # The old epoch is gone: a delegation must name the new one.
    r = await inst.delegate(RELAY, 2, epoch=1)
    assert (r.status_code, r.json()) == (404, ERR["not_authorized"])
    assert (await inst.delegate(RELAY, 3)).status_code == 201
    r = await inst.revoke_delegation(RELAY, 3)
    assert (r.status_code, r.json()) == (200, {"status": "revoked"})
    assert (await inst.revoke_delegation(RELAY, 3)).json() == {"status": "revoked"}  # repeat: same answer
    assert (await inst.revoke_delegation(RELAY, 2)).status_code == 404  # not the current generation
    assert (await inst.delegate(RELAY, 4)).status_code == 201  # a higher generation delegates again
    r = await inst.revoke()
    assert (r.status_code, r.json()) == (200, {"status": "revoked"})
    assert (await inst.revoke(epoch=inst.epoch - 1)).json() == {"status": "revoked"}  # lost answer: retry
    # Revoked: nothing else works, and it looks like an unknown installation.
    r = await inst.delegate(RELAY, 5)
    assert (r.status_code, r.json()) == (401, ERR["invalid_attestation"])
    r = await inst.rotate(token())
    assert (r.status_code, r.json()) == (401, ERR["invalid_attestation"])


async def test_generation_strictly_increases_per_relay(gw, http):
    inst = await enrolled(gw, http)
    assert (await inst.delegate(RELAY, 5)).status_code == 201
    for g in (5, 4, 1):
        r = await inst.delegate(RELAY, g)
        assert (r.status_code, r.json()) == (404, ERR["not_authorized"])
    assert (await inst.delegate("cd" * 32, 1)).status_code == 201  # another relay has its own sequence
    assert (await inst.delegate(RELAY, 6)).status_code == 201


async def test_delegation_time_rules(gw, http):
    inst = await enrolled(gw, http)
    now = int(time.time())
    for kw in (dict(not_before=now + 400, expires_at=now + 1000),     # not_before beyond now + 300
               dict(not_before=now + 100, expires_at=now + 100),      # not_before == expires_at
               dict(not_before=now - 100, expires_at=now - 10),       # already expired
               dict(not_before=now, expires_at=now + 40 * 86400)):    # beyond max_grant_lifetime
        r = await inst.delegate(RELAY, 1, **kw)
        assert (r.status_code, r.json()) == (400, ERR["invalid_request"]), kw
    r = await inst.delegate(RELAY, 1, not_before=now, expires_at=inst.expires_at + 60)  # beyond the installation
    assert (r.status_code, r.json()) == (404, ERR["not_authorized"])
    assert (await inst.delegate(RELAY, 1, not_before=now + 300, expires_at=inst.expires_at)).status_code == 201


async def test_enrollment_refusals(gw, http):
    server, setup = gw
    # Duplicate token (same profile) and duplicate key.
    first = await enrolled(gw, http)
    dup = app(gw, http)
    dup.endpoint = first.endpoint
    assert ((await dup.enroll()).status_code, (await dup.enroll()).json()) == (404, ERR["not_authorized"])
    again = AppInstallation(http, first.public_url, first.attester, PROFILE, token())
    assert (await again.enroll()).status_code == 404
    # The same token under the other profile is another endpoint.
    other = app(gw, http, SANDBOX, "development")
    other.endpoint = first.endpoint
    assert (await other.enroll()).status_code == 201
    # Environment, app id, root.
    wrong_env = app(gw, http, PROFILE, "development")
    assert ((r := await wrong_env.enroll()).status_code, r.json()) == (401, ERR["invalid_attestation"])
    wrong_app = AppInstallation(http, first.public_url, setup.attester(app_id="TEAM123456.com.other"), PROFILE, token())
    assert (await wrong_app.enroll()).status_code == 401
    from appliance.testing.attester import SoftwareAttester, TestCA

    stranger = AppInstallation(http, first.public_url, SoftwareAttester(TestCA(), "TEAM123456.com.example.app"),
                               PROFILE, token())
    assert (await stranger.enroll()).status_code == 401
    # A transcript for another audience (another gateway) does not verify here.
    elsewhere = app(gw, http)
    elsewhere.public_url = "https://push.buzz.xyz"
    elsewhere.http = http
    r = await http.post("/v1/installations/challenges", content=b'{"v":1}', headers={"content-type": "application/json"})
    c = r.json()
    req = {"v": 1, "challenge_id": c["challenge_id"], "challenge": c["challenge"], "key_id": elsewhere.attester.key_id_b64,
           "app_profile": PROFILE, "endpoint": token(), "endpoint_epoch": 1, "expires_at": int(time.time()) + 3600}
    req["attestation"] = elsewhere.attester.attest(tr.transcript(tr.ENROLL, "https://push.buzz.xyz", req))
    r = await http.post("/v1/installations", json=req)
    assert (r.status_code, r.json()) == (401, ERR["invalid_attestation"])
    # Value rules: epoch 1 only, expiry window.
    inst = app(gw, http)
    assert (await inst.enroll(tamper={"endpoint_epoch": 2})).status_code == 400
    assert (await inst.enroll(expires_at=int(time.time()))).status_code == 400
    assert (await inst.enroll(lifetime=91 * 86400)).status_code == 400
    assert (await inst.enroll()).status_code == 201


async def test_malformed_certificates_are_invalid_attestations(gw, http):
    # An intermediate nobody vouched for yet is parsed before its issuer is checked: a broken
    # extension or an unknown curve in it is a bad attestation (401), never a 503.
    import cbor2

    from appliance.testing.attester import SoftwareAttester, TestCA
    from tests.gateway.helpers import APP_ID, corrupt_intermediate

    server, _ = gw
    for how in ("basic constraints", "curve"):
        stranger = SoftwareAttester(TestCA(name="Rogue"), APP_ID)
        inst = AppInstallation(http, f"http://127.0.0.1:{server.port}", stranger, PROFILE, token())
        att = cbor2.loads(base64.b64decode(stranger.attest(b"any")))
        att["attStmt"]["x5c"][1] = corrupt_intermediate(att["attStmt"]["x5c"][1], how)
        r = await inst.enroll(tamper={"attestation": base64.b64encode(cbor2.dumps(att)).decode()})
        assert (r.status_code, r.json()) == (401, ERR["invalid_attestation"]), how


async def test_challenges_are_single_use_and_consumed_only_after_verification(gw, http):
    inst = app(gw, http)
    c = await inst.challenge()
    req = {"v": 1, "challenge_id": c["challenge_id"], "challenge": c["challenge"], "key_id": inst.attester.key_id_b64,
           "app_profile": PROFILE, "endpoint": inst.endpoint, "endpoint_epoch": 1, "expires_at": int(time.time()) + 3600}
    good = inst.attester.attest(tr.transcript(tr.ENROLL, inst.public_url, req))
    # A failed verification leaves the challenge usable.
    bad = app(gw, http).attester.attest(tr.transcript(tr.ENROLL, inst.public_url, req))
    assert (await http.post("/v1/installations", json={**req, "attestation": bad})).status_code == 401
    assert (await http.post("/v1/installations", json={**req, "attestation": good})).status_code == 201
    # Used once: gone. Another value under the same id: refused.
    twin = app(gw, http)
    req2 = {**req, "key_id": twin.attester.key_id_b64, "endpoint": twin.endpoint}
    att2 = twin.attester.attest(tr.transcript(tr.ENROLL, inst.public_url, req2))
    r = await http.post("/v1/installations", json={**req2, "attestation": att2})
    assert (r.status_code, r.json()) == (404, ERR["not_authorized"])
    c3 = await inst.challenge()
    forged = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    req3 = {**req2, "challenge_id": c3["challenge_id"], "challenge": forged}
    att3 = twin.attester.attest(tr.transcript(tr.ENROLL, inst.public_url, req3))
    assert (await http.post("/v1/installations", json={**req3, "attestation": att3})).status_code == 404


async def test_assertion_counter_must_increase(gw, http):
    inst = await enrolled(gw, http)
    assert (await inst.delegate(RELAY, 1, counter=10)).status_code == 201
    for c in (10, 9):
        r = await inst.delegate(RELAY, 2, counter=c)
        assert (r.status_code, r.json()) == (401, ERR["invalid_attestation"])
    assert (await inst.delegate(RELAY, 2, counter=11)).status_code == 201


async def test_unknown_installation_looks_like_a_bad_assertion(gw, http):
    inst = await enrolled(gw, http)
    ghost = app(gw, http)
    ghost.handle = "33333333-3333-4333-8333-333333333333"
    r_unknown = await ghost.delegate(RELAY, 1)
    r_bad = await inst.delegate(RELAY, 1, tamper={"assertion": ghost.attester.assert_(b"x")})
    r_wrong_transcript = await inst.delegate(RELAY, 1, tamper={"generation": 2})
    for r in (r_unknown, r_bad, r_wrong_transcript):
        assert (r.status_code, r.content) == (401, b'{"error":"invalid_attestation"}')
    for call in (ghost.rotate(token()), ghost.revoke_delegation(RELAY, 1), ghost.revoke()):
        r = await call
        assert (r.status_code, r.content) == (401, b'{"error":"invalid_attestation"}')


async def test_endpoint_rotation_uniqueness(gw, http):
    a = await enrolled(gw, http)
    b = await enrolled(gw, http)
    r = await a.rotate(b.endpoint)
    assert (r.status_code, r.json()) == (404, ERR["not_authorized"])
    assert (await a.rotate(a.endpoint)).status_code == 200  # the same token, a new epoch
    freed = a.endpoint
    assert (await a.rotate(token())).status_code == 200
    assert (await b.rotate(freed)).status_code == 200  # a's old token is free now
    r = await a.rotate(token(), tamper={"endpoint_epoch": a.epoch + 5, "new_endpoint_epoch": a.epoch + 6})
    assert r.status_code == 401  # the transcript was signed for other epochs


async def test_stale_epoch_rotation_and_revocation(gw, http):
    inst = await enrolled(gw, http)
    assert (await inst.rotate(token())).status_code == 200
    inst.epoch = 1  # pretend the client missed its own rotation
    r = await inst.rotate(token())
    assert (r.status_code, r.json()) == (404, ERR["not_authorized"])
    assert (await inst.revoke()).status_code == 404
    inst.epoch = 2
    assert (await inst.revoke()).status_code == 200


async def test_http_surface(http):
    ct = {"content-type": "application/json"}
    for method in ("GET", "PUT", "DELETE"):
        r = await http.request(method, "/v1/delegations", headers=ct)
        assert (r.status_code, r.json(), r.headers["allow"]) == (405, ERR["invalid_request"], "POST")
    r = await http.post("/v1/unknown", content=b'{"v":1}', headers=ct)
    assert (r.status_code, r.json()) == (404, ERR["invalid_request"])
    for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/jsonx"}):
        r = await http.post("/v1/installations/challenges", content=b'{"v":1}', headers=headers)
        assert (r.status_code, r.json()) == (400, ERR["invalid_request"])
    big = b'{"v":1' + b" " * 8200 + b"}"
    r = await http.post("/v1/installations/challenges", content=big, headers=ct)
    assert (r.status_code, r.json()) == (400, ERR["invalid_request"])

    async def chunks():
        for _ in range(10):
            yield b" " * 1000

    r = await http.post("/v1/installations/challenges", content=chunks(), headers=ct)  # no length: streamed
    assert (r.status_code, r.json()) == (400, ERR["invalid_request"])
    # The relay still answers its own paths.
    r = await http.get("/", headers={"accept": "application/nostr+json"})
    assert r.status_code == 200 and "supported_nips" in r.json()


def test_token_custody_is_encrypted_at_rest(gw):
    server, setup = gw
    import asyncio

    async def run():
        async with httpx.AsyncClient(base_url=server.http) as client:
            inst = AppInstallation(client, f"http://127.0.0.1:{server.port}", setup.attester(), PROFILE, token())
            assert (await inst.enroll()).status_code == 201
            return inst

    inst = asyncio.run(run())
    from tests.pg import db_rows, on_postgres

    if not on_postgres():
        db = sqlite3.connect(server.data_dir / "appliance.sqlite3")
        db.execute("PRAGMA wal_checkpoint(FULL)")
        db.close()
    raw = bytes.fromhex(inst.endpoint)
    (wrapped, digest), = db_rows(server.data_dir, SQL("SELECT token, token_sha256 FROM gateway_installations "
                                                      "WHERE handle = ?",
                                                      "SELECT token, token_sha256 FROM gateway_installations "
                                                      "WHERE handle = %s"), (inst.handle,))
    wrapped, digest = bytes(wrapped), bytes(digest)
    import hashlib

    assert digest == hashlib.sha256(raw).digest() and raw not in wrapped
    for name in ("appliance.sqlite3", "appliance.sqlite3-wal"):
        path = server.data_dir / name
        if path.exists():
            data = path.read_bytes()
            assert raw not in data and inst.endpoint.encode() not in data


def test_routing_by_host_and_path(tmp_path):
    setup = GatewaySetup(tmp_path)
    server = Server(tmp_path / "data", config=setup.config("https://push.example.org/gw")).start()
    try:
        ct = {"content-type": "application/json"}
        banner = server.log_path.read_text()
        assert "  gateway  https://push.example.org/gw\n" in banner
        r = httpx.post(server.http + "/gw/v1/installations/challenges", content=b'{"v":1}',
                       headers={**ct, "host": "push.example.org"})
        assert r.status_code == 200 and "challenge" in r.json()
        # Another host, or the path without the prefix: not the gateway (the relay answers).
        for host, path in (("127.0.0.1", "/gw/v1/installations/challenges"),
                           ("push.example.org", "/v1/installations/challenges")):
            r = httpx.post(server.http + path, content=b'{"v":1}', headers={**ct, "host": host})
            assert r.status_code != 200 and r.headers.get("content-type") != "application/json"
    finally:
        server.stop()


def test_gateway_listen_serves_the_routes_on_their_own_address(tmp_path):
    setup = GatewaySetup(tmp_path)
    port = free_port()
    server = Server(tmp_path / "data", "--gateway-listen", f"127.0.0.1:{port}", config=setup.config()).start()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/installations/challenges", content=b'{"v":1}',
                               headers={"content-type": "application/json", "host": "anything"})
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert r.status_code == 200
        assert f"  gateway  http://127.0.0.1:{port}" in server.log_path.read_text()
        r = httpx.post(server.http + "/v1/installations/challenges", content=b'{"v":1}',
                       headers={"content-type": "application/json"})
        assert r.status_code != 200  # not on the main listener
    finally:
        server.stop()
    assert server.proc.returncode == 0


@pytest.mark.parametrize("mutate,field", [
    (lambda s, t: t.replace('environment = "production"', 'environment = "sandbox"'), "environment"),
    (lambda s, t: t.replace('topic = "com.example.app"', 'topic = "com.example.other"'), "topic"),
    (lambda s, t: t.replace('id = "buzz-ios-production"', 'id = "buzz-ios-dogfood"'), "id"),
    (lambda s, t: t.replace('app_id = "TEAM123456.com.example.app"', 'app_id = "com.example.app"'), "topic"),
    (lambda s, t: t.replace(str(s.p8), "/nonexistent.p8"), "key_file"),
    (lambda s, t: t.replace(str(s.root_path), "/nonexistent.pem"), "app_attest_root_ca"),
    (lambda s, t: t.replace(str(s.root_path), str(s.p8)), "app_attest_root_ca"),  # a file, but no certificate
    (lambda s, t: t + "\nbogus = 1\n", "bogus"),
    (lambda s, t: t.replace("enabled = true", 'enabled = true\npublic_url = "ftp://x"'), "public_url"),
])
@pytest.mark.slow
def test_inconsistent_profiles_stop_the_start(tmp_path, mutate, field):
    setup = GatewaySetup(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text(mutate(setup, setup.config()))
    from tests.pg import process_env

    args = ["serve", "--config", str(cfg), "--data-dir", str(tmp_path / "d"), "--port", "0"]
    p = subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=60, env=process_env(args))
    assert p.returncode == 2 and field in p.stderr and "gateway" in p.stderr, p.stderr
