"""The APNs emulator answers like Apple's documented API (it stands in for Apple in every test)."""

from __future__ import annotations

import asyncio
import ssl
import time
import uuid

import pytest

from appliance.testing.apns_emulator import ApnsEmulator
from appliance.testing.tls import make_p8
from appliance.transports.apns import APNS_BODY
from appliance.transports.credentials import ApnsKey
from appliance.transports.http2 import Http2Client

from .conftest import KEY_ID, TEAM, TOKEN, TOPIC

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(emulator):
    ctx = ssl.create_default_context(cafile=emulator.ca_file)
    c = Http2Client(emulator.url, ctx)
    yield c
    await c.close()


@pytest.fixture
def jwt(p8):
    return ApnsKey.load(TEAM, KEY_ID, p8[0]).sign_token(int(time.time()))


def good_headers(jwt: str, **over) -> list[tuple[str, str]]:
    h = {"authorization": f"bearer {jwt}", "apns-topic": TOPIC, "apns-push-type": "alert", "apns-priority": "10",
         "apns-id": str(uuid.uuid4()), "apns-expiration": str(int(time.time()) + 60)}
    h.update(over)
    return [(k, v) for k, v in h.items() if v is not None]


async def post(client, headers, path=f"/3/device/{TOKEN}", body=APNS_BODY, method="POST"):
    r = await client.request(method, path, headers, body, 5)
    import json

    return r.status, (json.loads(r.body).get("reason") if r.body else None), r.headers


async def test_success_echoes_the_apns_id(client, jwt, emulator):
    headers = good_headers(jwt)
    status, reason, h = await post(client, headers)
    assert (status, reason) == (200, None)
    assert h["apns-id"] == dict(headers)["apns-id"]
    assert "apns-unique-id" not in h  # production
    (rec,) = emulator.accepted(TOKEN)
    assert rec.body == APNS_BODY and rec.key_id == KEY_ID


async def test_a_missing_apns_id_is_made_up(client, jwt):
    status, _r, h = await post(client, good_headers(jwt, **{"apns-id": None}))
    assert status == 200 and uuid.UUID(h["apns-id"])


@pytest.mark.parametrize("change,status,reason", [
    ({"method": "GET"}, 405, "MethodNotAllowed"),
    ({"path": "/3/devices/" + TOKEN}, 404, "BadPath"),
    ({"headers": {"authorization": None}}, 403, "MissingProviderToken"),
    ({"headers": {"authorization": "bearer not.a.jwt"}}, 403, "InvalidProviderToken"),
    ({"headers": {"apns-topic": None}}, 400, "MissingTopic"),
    ({"headers": {"apns-topic": "com.other.app"}}, 400, "TopicDisallowed"),
    ({"path": "/3/device/"}, 400, "MissingDeviceToken"),
    ({"path": "/3/device/xyz"}, 400, "BadDeviceToken"),
    ({"path": "/3/device/abcd"}, 400, "BadDeviceToken"),  # too short for a device token
    ({"headers": {"apns-push-type": "shout"}}, 400, "InvalidPushType"),
    ({"headers": {"apns-priority": "7"}}, 400, "BadPriority"),
    ({"headers": {"apns-id": "not-a-uuid"}}, 400, "BadMessageId"),
    ({"headers": {"apns-expiration": "soon"}}, 400, "BadExpirationDate"),
    ({"headers": {"apns-collapse-id": "x" * 65}}, 400, "BadCollapseId"),
    ({"body": b""}, 400, "PayloadEmpty"),
    ({"body": b"{" + b" " * 4096 + b"}"}, 413, "PayloadTooLarge"),
])
async def test_documented_refusals(client, jwt, change, status, reason):
    headers = good_headers(jwt, **change.get("headers", {}))
    got = await post(client, headers, path=change.get("path", f"/3/device/{TOKEN}"),
                     body=change.get("body", APNS_BODY), method=change.get("method", "POST"))
    assert got[:2] == (status, reason)
    # Apple echoes the request's apns-id on errors too (a malformed one is replaced by its own).
    sent = dict(headers)["apns-id"]
    assert got[2]["apns-id"] == sent if reason != "BadMessageId" else uuid.UUID(got[2]["apns-id"])


async def test_an_error_without_apns_id_gets_one_made_up(client, jwt):
    status, reason, h = await post(client, good_headers(jwt, **{"apns-id": None}), path="/3/device/xyz")
    assert (status, reason) == (400, "BadDeviceToken") and uuid.UUID(h["apns-id"])


async def test_duplicate_headers(client, jwt):
    headers = good_headers(jwt) + [("apns-topic", TOPIC)]
    assert (await post(client, headers))[:2] == (400, "DuplicateHeaders")


async def test_provider_token_checks(client, p8, tmp_path, emulator):
    key = ApnsKey.load(TEAM, KEY_ID, p8[0])
    old = key.sign_token(int(time.time()) - 3601)
    assert (await post(client, good_headers(old)))[:2] == (403, "ExpiredProviderToken")
    # Signed by another key under our key id: does not verify.
    make_p8(tmp_path / "other.p8")
    forged = ApnsKey.load(TEAM, KEY_ID, tmp_path / "other.p8").sign_token(int(time.time()))
    assert (await post(client, good_headers(forged)))[:2] == (403, "InvalidProviderToken")
    # Right key, wrong team.
    wrong_team = ApnsKey.load("OTHERTEAM1", KEY_ID, p8[0]).sign_token(int(time.time()))
    assert (await post(client, good_headers(wrong_team)))[:2] == (403, "InvalidProviderToken")
    # Expired by hand: every token seen so far.
    fresh = key.sign_token(int(time.time()))
    assert (await post(client, good_headers(fresh)))[0] == 200
    emulator.expire_provider_tokens()
    assert (await post(client, good_headers(fresh)))[:2] == (403, "ExpiredProviderToken")


async def test_a_connection_is_bound_to_its_first_key(client, jwt, emulator, tmp_path):
    other = make_p8(tmp_path / "k2.p8")
    emulator.add_key(TEAM, "KEY2KEY2KE", other)
    assert (await post(client, good_headers(jwt)))[0] == 200
    second = ApnsKey.load(TEAM, "KEY2KEY2KE", tmp_path / "k2.p8").sign_token(int(time.time()))
    assert (await post(client, good_headers(second)))[:2] == (403, "UnrelatedKeyIdInToken")


async def test_environment_scoped_keys(client, emulator, tmp_path):
    k = make_p8(tmp_path / "k3.p8")
    emulator.add_key(TEAM, "SANDBOXKEY", k, environment="sandbox")
    t = ApnsKey.load(TEAM, "SANDBOXKEY", tmp_path / "k3.p8").sign_token(int(time.time()))
    assert (await post(client, good_headers(t)))[:2] == (403, "BadEnvironmentKeyIdInToken")


async def test_token_updates_too_often(client, p8, emulator):
    emulator.token_update_interval = 1200
    key = ApnsKey.load(TEAM, KEY_ID, p8[0])
    assert (await post(client, good_headers(key.sign_token(int(time.time())))))[0] == 200
    assert (await post(client, good_headers(key.sign_token(int(time.time()) - 1))))[:2] == \
        (429, "TooManyProviderTokenUpdates")


async def test_device_tokens_and_topics(client, jwt, emulator):
    emulator.register_token(TOKEN, "com.example.other")
    emulator.add_topic("com.example.other")
    assert (await post(client, good_headers(jwt)))[:2] == (400, "DeviceTokenNotForTopic")
    token2 = "ab" * 32
    emulator.unregister(token2, at=1_700_000_000)
    r = await client.request("POST", f"/3/device/{token2}", good_headers(jwt), APNS_BODY, 5)
    import json

    assert r.status == 410 and json.loads(r.body) == {"reason": "Unregistered", "timestamp": 1_700_000_000_000}


async def test_forced_behaviour_retry_after_times_and_delay(client, jwt, emulator):
    emulator.behave(TOKEN, 503, "ServiceUnavailable", times=2)
    for _ in range(2):
        status, reason, h = await post(client, good_headers(jwt))
        assert (status, reason) == (503, "ServiceUnavailable") and "retry-after" not in h  # Apple sends none
    assert (await post(client, good_headers(jwt)))[0] == 200
    emulator.behave(None, 429, "TooManyRequests", retry_after=5)
    status, reason, h = await post(client, good_headers(jwt))
    assert (status, reason, h["retry-after"]) == (429, "TooManyRequests", "5")
    emulator.clear()
    emulator.behave(TOKEN, delay=0.3)
    t0 = time.monotonic()
    assert (await post(client, good_headers(jwt)))[0] == 200
    assert time.monotonic() - t0 >= 0.25


async def test_many_concurrent_streams_on_one_connection(client, jwt, emulator):
    results = await asyncio.gather(*[post(client, good_headers(jwt), path=f"/3/device/{i + 1:064x}")
                                     for i in range(300)])
    assert {r[0] for r in results} == {200}
    assert client.connections_made == 1
    assert len({r.connection for r in emulator.requests()}) == 1


async def test_a_long_lived_connection_keeps_nothing_of_its_finished_streams(client, jwt, emulator):
    """h2's state machine kept how each closed stream ended, 65,536 per connection: on a provider
    connection that lives for hours, memory that grew with every wake (the soak's slow RSS rise,
    issue #14). The client keeps a stream only while it is open."""
    for start in range(0, 1200, 100):
        results = await asyncio.gather(*[post(client, good_headers(jwt), path=f"/3/device/{i + 1:064x}")
                                         for i in range(start, start + 100)])
        assert {r[0] for r in results} == {200}
    conn = client._conn
    assert client.connections_made == 1 and conn is not None
    assert conn.streams == {}
    assert not [name for name, value in vars(conn).items()
                if isinstance(value, (dict, list, set)) and len(value) >= 1000], "per-stream state kept"


async def test_sandbox_adds_apns_unique_id(tmp_path, p8, jwt):
    emu = ApnsEmulator(environment="sandbox", pki_dir=tmp_path / "pki2")
    emu.add_key(TEAM, KEY_ID, p8[1])
    await emu.start()
    c = Http2Client(emu.url, ssl.create_default_context(cafile=emu.ca_file))
    try:
        status, _r, h = await post(c, good_headers(jwt))
        assert status == 200 and uuid.UUID(h["apns-unique-id"])
    finally:
        await c.close()
        await emu.stop()


async def test_http2_only(emulator):
    """A client that cannot negotiate h2 (ALPN) is not served."""
    ctx = ssl.create_default_context(cafile=emulator.ca_file)
    ctx.set_alpn_protocols(["http/1.1"])
    reader, writer = await asyncio.open_connection("127.0.0.1", emulator.port, ssl=ctx)
    try:
        writer.write(b"POST /3/device/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader.read(100), 5) == b""
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass


def test_runs_on_a_thread_for_out_of_process_clients(tmp_path, p8, jwt):
    emu = ApnsEmulator(pki_dir=tmp_path / "pki3")
    emu.add_key(TEAM, KEY_ID, p8[1])
    emu.start_in_thread()
    try:
        async def one():
            c = Http2Client(emu.url, ssl.create_default_context(cafile=emu.ca_file))
            try:
                return await post(c, good_headers(jwt))
            finally:
                await c.close()

        assert asyncio.run(one())[0] == 200
        emu.wait_for(lambda recs: len(recs) == 1, timeout=5)
    finally:
        emu.stop_thread()
