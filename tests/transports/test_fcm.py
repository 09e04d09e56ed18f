"""The FCM HTTP v1 transport (a draft) against the FCM emulator over real HTTP/2 + TLS: the one
constant message, every FCM error code in the outcome the executor acts on, the OAuth2 access
token (signed grant, cached, shared per account, refreshed once on a 401) and the profile checks."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from appliance.origins import Origin
from appliance.push.config import check_push_config
from appliance.push.profiles import ProfileTransports
from appliance.errors import ConfigError
from appliance.testing.fcm_emulator import FcmEmulator
from appliance.transports import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    PERMANENT,
    REFRESH_RETRY,
    TRANSIENT,
    ProfileError,
    WakeRequest,
)
from appliance.transports.fcm import (
    FAILURE_BACKOFF,
    FCM_ERRORS,
    MAX_TTL,
    AccessToken,
    FcmTransport,
    ServiceAccount,
    classify,
    load_profile,
)

pytestmark = pytest.mark.anyio

TOKEN = "cXa1b2:APA91b" + "Q" * 140


@pytest.fixture
async def fcm(tmp_path, anyio_backend):
    emu = FcmEmulator(pki_dir=tmp_path / "pki")
    await emu.start()
    yield emu
    await emu.stop()


def write_account(emu: FcmEmulator, path, project="appliance-emulator", **kw) -> str:
    path.write_text(json.dumps(emu.service_account(project, **kw)))
    return str(path)


def entry(emu: FcmEmulator, sa_file: str, **over) -> dict:
    return {"id": "com.example.app/android", "transport": "fcm", "service_account_file": sa_file,
            "fcm_url": emu.url, "token_uri": emu.token_url, "ca_file": emu.ca_file, **over}


@pytest.fixture
async def transport(fcm, tmp_path):
    profile = load_profile(entry(fcm, write_account(fcm, tmp_path / "sa.json")), {})
    t = FcmTransport(profile, timeout=5)
    yield t
    await t.close()


def wake(endpoint: str = TOKEN, ttl: int = 600) -> WakeRequest:
    return WakeRequest(endpoint, str(uuid.uuid4()), int(time.time()) + ttl)


async def test_the_constant_message_reaches_fcm(fcm, transport):
    outcome = await transport.send(wake())
    assert outcome.kind == ACCEPTED and outcome.status == 200
    (rec,) = fcm.accepted(TOKEN)
    assert rec.path == "/v1/projects/appliance-emulator/messages:send"
    assert rec.header("authorization").startswith("Bearer ya29.emu-")
    assert rec.message == {"token": TOKEN, "data": {"nip_pl": "reconnect"},
                           "android": {"priority": "high", "ttl": rec.message["android"]["ttl"]}}
    assert 595 <= int(rec.message["android"]["ttl"][:-1]) <= 600


async def test_the_body_is_byte_identical_but_for_token_and_ttl(fcm, transport):
    tokens = [TOKEN, "other-device:APA91b" + "z" * 100, "x" * 20]
    for i, tok in enumerate(tokens):
        await transport.send(WakeRequest(tok, str(uuid.uuid4()), int(time.time()) + 100 + 5000 * i))
    bodies = [r.body for r in fcm.accepted()]
    assert len(bodies) == 3
    ttls = [r.message["android"]["ttl"] for r in fcm.accepted()]
    assert int(ttls[-1][:-1]) == MAX_TTL  # 10100 s of useful age left, capped
    # Take out the token and the ttl: every byte left is the same, whatever the lease and job.
    skeletons = {r.body.replace(r.token.encode(), b"T").replace(r.message["android"]["ttl"].encode(), b"N")
                 for r in fcm.accepted()}
    assert skeletons == {b'{"message":{"token":"T","data":{"nip_pl":"reconnect"},"android":{"priority":"high",'
                         b'"ttl":"N"}}}'}
    # Headers do not vary either, but for the access token and the length.
    assert len({tuple((k, v) for k, v in r.headers if k not in ("authorization", "content-length"))
                for r in fcm.accepted()}) == 1


async def test_every_token_the_transport_sends_the_emulator_takes(fcm, transport):
    dotted = "cXa1b2.d-e_f:APA91b" + "Q" * 40 + ".x"
    assert (await transport.send(wake(dotted))).kind == ACCEPTED and fcm.accepted(dotted)


async def test_an_endpoint_that_is_no_registration_token_is_never_sent(fcm, transport):
    for bad in ('a"b', "tok en", "", "t" * 5000, "a/b"):
        outcome = await transport.send(wake(bad))
        assert outcome.kind == INVALID_ENDPOINT and "not sent" in outcome.detail
    assert fcm.requests() == []


# FCM's ErrorCode enum (firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode), and what we do:
# written out here, not read from the module, so the test states the decision independently.
EXPECTED = [
    ("UNREGISTERED", {}, INVALID_ENDPOINT),
    ("INVALID_ARGUMENT", {}, INVALID_ENDPOINT),  # an FcmError detail: the token's fault
    ("INVALID_ARGUMENT", {"field_violation": "message.token"}, INVALID_ENDPOINT),
    ("INVALID_ARGUMENT", {"field_violation": "message.android.ttl"}, PERMANENT),  # not the token
    ("INVALID_ARGUMENT", {"message": "Request contains an invalid argument."}, PERMANENT),  # not said
    ("SENDER_ID_MISMATCH", {}, CONFIGURATION),
    ("THIRD_PARTY_AUTH_ERROR", {}, CONFIGURATION),
    ("QUOTA_EXCEEDED", {"retry_after": 7}, TRANSIENT),
    ("UNAVAILABLE", {"retry_after": 3}, TRANSIENT),
    ("INTERNAL", {}, TRANSIENT),
    ("UNSPECIFIED_ERROR", {}, TRANSIENT),  # 500 without more: FCM's trouble
    ("PERMISSION_DENIED", {"status": 403}, CONFIGURATION),  # no FcmError: an auth failure
    ("NOT_FOUND", {"status": 404}, CONFIGURATION),  # no UNREGISTERED: the project path is wrong
]


@pytest.mark.parametrize("code,opts,kind", EXPECTED, ids=[f"{c}-{k}-{i}" for i, (c, _o, k) in enumerate(EXPECTED)])
async def test_every_fcm_error_lands_in_its_outcome(fcm, transport, code, opts, kind):
    fcm.behave(TOKEN, code, **opts)
    outcome = await transport.send(wake())
    assert outcome.kind == kind, outcome
    if "retry_after" in opts:
        assert outcome.retry_after == opts["retry_after"]
    if kind == INVALID_ENDPOINT:
        assert outcome.reason == "UNREGISTERED" if code == "UNREGISTERED" else True


_BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
MALFORMED_DETAILS = [5, "details", {"@type": _BAD_REQUEST}, [5, "x", None],
                     [{"@type": _BAD_REQUEST, "fieldViolations": 5}],
                     [{"@type": _BAD_REQUEST, "fieldViolations": {"field": "message.token"}}],
                     [{"@type": _BAD_REQUEST, "fieldViolations": [5, "message.token", None]}],
                     [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": 5}]]


@pytest.mark.parametrize("details", MALFORMED_DETAILS, ids=range(len(MALFORMED_DETAILS)))
@pytest.mark.parametrize("status,kind", [(400, PERMANENT), (403, CONFIGURATION), (404, CONFIGURATION),
                                         (429, TRANSIENT), (503, TRANSIENT)])
def test_a_malformed_error_body_is_classified_by_its_status(details, status, kind):
    from appliance.transports.fcm import outcome_of
    from appliance.transports.http2 import Response

    body = json.dumps({"error": {"code": status, "status": "X", "message": "m", "details": details}}).encode()
    assert outcome_of(Response(status, {}, body)).kind == kind


def test_the_table_names_every_error_code():
    assert set(FCM_ERRORS) == {"UNSPECIFIED_ERROR", "INVALID_ARGUMENT", "UNREGISTERED", "SENDER_ID_MISMATCH",
                               "QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL", "THIRD_PARTY_AUTH_ERROR"}
    assert classify(401, None) == REFRESH_RETRY
    assert classify(401, "THIRD_PARTY_AUTH_ERROR") == CONFIGURATION
    assert classify(400, None, blames_token=False) == PERMANENT
    assert classify(418, None) == PERMANENT and classify(599, None) == TRANSIENT


async def test_an_unregistered_token_disables_the_endpoint(fcm, transport):
    fcm.unregister(TOKEN)
    outcome = await transport.send(wake())
    assert (outcome.kind, outcome.status, outcome.reason) == (INVALID_ENDPOINT, 404, "UNREGISTERED")


async def test_the_access_token_is_fetched_once_and_reused(fcm, transport):
    for _ in range(5):
        assert (await transport.send(wake())).kind == ACCEPTED
    assert fcm.grants == 1 and transport.token.fetched == 1
    assert len({r.header("authorization") for r in fcm.requests()}) == 1


async def test_a_stale_access_token_is_refreshed_and_the_send_retried_once(fcm, transport):
    assert (await transport.send(wake())).kind == ACCEPTED
    fcm.expire_access_tokens()
    outcome = await transport.send(wake())
    assert outcome.kind == ACCEPTED and "retried once with a new access token" in outcome.detail
    assert fcm.grants == 2
    statuses = [r.status for r in fcm.requests()]
    assert statuses == [200, 401, 200]


async def test_a_401_to_a_fresh_token_is_a_configuration_fault(fcm, transport):
    fcm.behave(TOKEN, "UNAUTHENTICATED", status=401)
    outcome = await transport.send(wake())
    assert outcome.kind == CONFIGURATION and "freshly made access token" in outcome.detail
    assert fcm.grants == 2 and len(fcm.requests()) == 2  # one refresh, one retry, no more


async def test_the_token_expires_by_its_lifetime(fcm, tmp_path):
    now = [time.time()]
    profile = load_profile(entry(fcm, write_account(fcm, tmp_path / "sa.json")), {})
    token = AccessToken(profile.account, profile.token_uri, profile.ca_file, clock=lambda: now[0])
    fcm.clock = lambda: now[0]  # Google's clock agrees with ours
    t = FcmTransport(profile, token=token, timeout=5)
    try:
        await t.send(wake())
        now[0] += 3599 - 300 - 1  # still inside its lifetime less the margin
        await t.send(wake())
        assert fcm.grants == 1
        now[0] += 2
        await t.send(wake())
        assert fcm.grants == 2
    finally:
        await t.close()
        await token.close()


async def test_a_refused_grant_is_a_configuration_fault_and_an_unreachable_endpoint_transient(fcm, tmp_path):
    now = [time.time()]
    profile = load_profile(entry(fcm, write_account(fcm, tmp_path / "sa.json")), {})
    token = AccessToken(profile.account, profile.token_uri, profile.ca_file, clock=lambda: now[0])
    fcm.clock = lambda: now[0]  # Google's clock agrees with ours
    t = FcmTransport(profile, token=token, timeout=5)
    try:
        fcm.fail_grants(400, "invalid_grant")
        outcome = await t.send(wake())
        assert outcome.kind == CONFIGURATION and outcome.status == 400 and outcome.reason == "invalid_grant"
        assert "check the service account key" in outcome.detail
        now[0] += FAILURE_BACKOFF
        fcm.fail_grants(503, "backendError")
        assert (await t.send(wake())).kind == TRANSIENT
        assert (await t.send(wake())).kind == TRANSIENT  # inside the backoff: no new grant request
        assert sum(r.grant for r in fcm.records) == 2
        now[0] += FAILURE_BACKOFF  # the second failure in a row waits twice as long
        assert (await t.send(wake())).kind == TRANSIENT
        assert sum(r.grant for r in fcm.records) == 2
        now[0] += FAILURE_BACKOFF
        assert (await t.send(wake())).kind == ACCEPTED
        assert sum(r.grant for r in fcm.records) == 3
        fcm.fail_grants(503, "backendError")  # a success starts the doubling over
        now[0] += 3600  # the access token expired
        assert (await t.send(wake())).kind == TRANSIENT
        now[0] += FAILURE_BACKOFF
        assert (await t.send(wake())).kind == ACCEPTED
    finally:
        await t.close()
        await token.close()


def wakes(n: int) -> list[WakeRequest]:
    return [wake(f"c{i}:APA91b" + "Q" * 40) for i in range(n)]


async def test_a_refused_grant_is_shared_by_concurrent_wakes(fcm, transport):
    fcm.fail_grants(400, "invalid_grant", times=1000)
    outcomes = await asyncio.gather(*(transport.send(w) for w in wakes(50)))
    assert {(o.kind, o.reason) for o in outcomes} == {(CONFIGURATION, "invalid_grant")}
    assert sum(r.grant for r in fcm.records) == 1 and not fcm.requests()


async def test_a_hung_token_endpoint_holds_concurrent_wakes_once_and_briefly(fcm, tmp_path):
    # A token endpoint that accepts connections and never answers (not even the TLS handshake).
    connections = []

    async def hang(reader, writer):
        connections.append(writer)
        await reader.read()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    profile = load_profile(entry(fcm, write_account(fcm, tmp_path / "sa.json")), {})
    token = AccessToken(profile.account, f"https://127.0.0.1:{port}/token", profile.ca_file, timeout=1.0)
    t = FcmTransport(profile, token=token, timeout=5)
    try:
        started = time.monotonic()
        outcomes = await asyncio.gather(*(t.send(w) for w in wakes(20)))
        took = time.monotonic() - started
        assert {o.kind for o in outcomes} == {TRANSIENT}
        assert all("no answer from the token endpoint" in o.detail for o in outcomes), outcomes[0]
        assert took < 2.5, f"20 waiting wakes took {took:.1f} s with a 1 s grant timeout"
        assert len(connections) == 1
        # Inside the backoff a new wake fails at once, without a new grant request.
        started = time.monotonic()
        assert (await t.send(wake())).kind == TRANSIENT
        assert time.monotonic() - started < 0.5 and len(connections) == 1
    finally:
        await t.close()
        await token.close()
        for w in connections:
            w.close()
        server.close()


def test_a_grant_request_is_bounded_well_below_a_send():
    assert AccessToken.__init__.__kwdefaults__["timeout"] <= 10


async def test_a_grant_signed_by_an_unknown_key_is_refused(fcm, tmp_path):
    from cryptography.hazmat.primitives.asymmetric import rsa

    sa = fcm.service_account("appliance-emulator")
    sa["private_key_id"] = "not-a-known-key"  # the emulator trusts the key under its own id only
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(sa))
    t = FcmTransport(load_profile(entry(fcm, str(path)), {}), timeout=5)
    try:
        outcome = await t.send(wake())
        assert outcome.kind == CONFIGURATION and outcome.reason == "invalid_grant"
    finally:
        await t.close()
    assert rsa  # (imported to show the key type the emulator checks)


async def test_profiles_of_one_account_share_one_access_token_and_connection(fcm, tmp_path):
    sa = write_account(fcm, tmp_path / "sa.json")
    push = {"app_profiles": [entry(fcm, sa), entry(fcm, sa, id="com.example.other/android")]}
    origins = [Origin(id=1, origin="wss://a.example", push=push), Origin(id=2, origin="wss://b.example", push=push)]
    transports = ProfileTransports()
    transports.configure(origins, {}, drafts=True)
    ts = [transports.get(o, p) for o in (1, 2) for p in ("com.example.app/android", "com.example.other/android")]
    assert len({id(t) for t in ts}) == 1
    try:
        for t in ts:
            assert (await t.send(wake())).kind == ACCEPTED
        assert fcm.grants == 1
        # A second project of the same account: its own transport, the same access token.
        other = {"app_profiles": [entry(fcm, sa, id="p3", project_id="another-project")]}
        transports.configure(origins + [Origin(id=3, origin="wss://c.example", push=other)], {}, drafts=True)
        assert transports.get(3, "p3") is not ts[0] and transports.get(3, "p3").token is ts[0].token
    finally:
        for t in transports.all():
            await t.close()


def test_profile_settings_are_checked_naming_the_field(fcm_files):
    emu_url, sa = fcm_files
    base = {"id": "a", "transport": "fcm", "service_account_file": sa, "token_uri": emu_url + "/token"}
    cases = [
        ({"service_account_file": "relative.json"}, "service_account_file", "absolute path"),
        ({"service_account_file": "/nonexistent/sa.json"}, "service_account_file", "does not exist"),
        ({"fcm_url": "http://fcm.example"}, "fcm_url", "https://"),
        ({"fcm_url": "https://fcm.example/v1"}, "fcm_url", "no path"),
        ({"token_uri": "https://user@oauth.example/token"}, "token_uri", "no user"),
        ({"token_uri": "https://oauth.example/token?x=1"}, "token_uri", "no user, query"),
        ({"token_uri": "https://oauth2.googleapis.com/token"}, "token_uri", "names the token endpoint"),
        ({"project_id": "Bad/Project"}, "project_id", "not a Google Cloud project id"),
        ({"ca_file": "/nonexistent/ca.pem"}, "ca_file", "cannot be read"),
        ({"service_account_stored": "sa:0123456789abcdef"}, "service_account_stored", "not both"),
    ]
    for change, field, words in cases:
        with pytest.raises(ProfileError) as err:
            load_profile({**base, **change}, {})
        assert err.value.field == field and words in str(err.value), (change, str(err.value))
    with pytest.raises(ProfileError) as err:
        load_profile({"id": "a", "transport": "fcm", "project_id": "abcdef"}, {})
    assert err.value.field == "service_account_file"
    # Through the push table: a ConfigError naming the profile and the field.
    with pytest.raises(ConfigError) as err:
        check_push_config({"app_profiles": [{**base, "fcm_url": "http://x"}]}, "push")
    assert "push.app_profiles[0].fcm_url" in str(err.value) and "'a'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_push_config({"app_profiles": [{**base, "topic": "com.example"}]}, "push")
    assert "topic is an APNs setting; a fcm profile takes service_account_file" in str(err.value)


@pytest.fixture
def fcm_files(tmp_path):
    emu = FcmEmulator()
    emu.port = 4430  # not started: only its token URL is named
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(emu.service_account("appliance-emulator")))
    return emu.url, str(path)


def test_a_service_account_file_that_is_none_is_refused_plainly(tmp_path):
    from appliance.transports.credentials import CredentialError

    for data, words in ((b"hello", "not JSON"), (b'{"type": "user"}', '"type" is not "service_account"'),
                        (json.dumps({"type": "service_account", "client_email": "a@b", "private_key_id": "k",
                                     "project_id": "pppppp", "private_key": "-----BEGIN PRIVATE KEY-----\nAA\n"
                                     "-----END PRIVATE KEY-----\n"}).encode(), "not a PEM private key")):
        with pytest.raises(CredentialError) as err:
            ServiceAccount.parse(data)
        assert words in str(err.value)
        assert "BEGIN" not in str(err.value)
