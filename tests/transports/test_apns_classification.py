"""Every documented APNs status and reason, sent by the emulator over real HTTP/2 + TLS, lands in the
outcome kind the executor acts on (issue #8: accepted / invalidate endpoint / refresh token and
retry once / configuration fault / transient retry / permanent request fault)."""

from __future__ import annotations

import time
import uuid

import pytest

from appliance.transports import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    PERMANENT,
    REFRESH_RETRY,
    TRANSIENT,
    WakeRequest,
)
from appliance.transports.apns import APNS_BODY, APNS_RESPONSES, classify, parse_retry_after

from .conftest import TOKEN

pytestmark = pytest.mark.anyio

# Apple, "Handling notification responses from APNs": every status, every reason, and what we do.
# Written out here, not read from the module, so the test states the decision independently.
EXPECTED = [
    (200, None, ACCEPTED),
    (400, "BadCollapseId", PERMANENT),
    (400, "BadDeviceToken", INVALID_ENDPOINT),
    (400, "BadExpirationDate", PERMANENT),
    (400, "BadMessageId", PERMANENT),
    (400, "BadPriority", PERMANENT),
    (400, "BadTopic", CONFIGURATION),
    (400, "DeviceTokenNotForTopic", INVALID_ENDPOINT),
    (400, "DuplicateHeaders", PERMANENT),
    (400, "IdleTimeout", TRANSIENT),
    (400, "InvalidPushType", PERMANENT),
    (400, "MissingDeviceToken", PERMANENT),
    (400, "MissingTopic", CONFIGURATION),
    (400, "PayloadEmpty", PERMANENT),
    (400, "TopicDisallowed", CONFIGURATION),
    (403, "BadCertificate", CONFIGURATION),
    (403, "BadCertificateEnvironment", CONFIGURATION),
    (403, "ExpiredProviderToken", REFRESH_RETRY),
    (403, "Forbidden", CONFIGURATION),
    (403, "InvalidProviderToken", CONFIGURATION),
    (403, "MissingProviderToken", CONFIGURATION),
    (403, "UnrelatedKeyIdInToken", CONFIGURATION),
    (403, "BadEnvironmentKeyIdInToken", CONFIGURATION),
    (404, "BadPath", PERMANENT),
    (405, "MethodNotAllowed", PERMANENT),
    (410, "ExpiredToken", INVALID_ENDPOINT),
    (410, "Unregistered", INVALID_ENDPOINT),
    (413, "PayloadTooLarge", PERMANENT),
    (429, "TooManyProviderTokenUpdates", CONFIGURATION),
    (429, "TooManyRequests", TRANSIENT),
    (500, "InternalServerError", TRANSIENT),
    (503, "ServiceUnavailable", TRANSIENT),
    (503, "Shutdown", TRANSIENT),
]


def test_the_table_is_the_documented_one():
    assert {(s, r) for s, r, _k in EXPECTED} == set(APNS_RESPONSES)
    assert {s for s, _r, _k in EXPECTED} == {200, 400, 403, 404, 405, 410, 413, 429, 500, 503}


@pytest.mark.parametrize("status,reason,kind", EXPECTED, ids=lambda v: str(v))
def test_classify(status, reason, kind):
    assert classify(status, reason) == kind


@pytest.mark.parametrize("status,reason,kind", [
    (400, "SomethingNew", PERMANENT), (403, "SomethingNew", CONFIGURATION), (410, "SomethingNew", INVALID_ENDPOINT),
    (429, None, TRANSIENT), (502, None, TRANSIENT), (418, None, PERMANENT),
])
def test_unknown_reasons_fall_back_on_the_status(status, reason, kind):
    assert classify(status, reason) == kind


def request(token: str = TOKEN) -> WakeRequest:
    return WakeRequest(token, str(uuid.uuid4()), int(time.time()) + 3600)


@pytest.mark.parametrize("status,reason,kind", [row for row in EXPECTED if row[2] != REFRESH_RETRY],
                         ids=lambda v: str(v))
async def test_each_answer_over_the_wire(emulator, transport, status, reason, kind):
    if status != 200:
        emulator.behave(TOKEN, status, reason, retry_after=30 if kind == TRANSIENT else None)
    req = request()
    outcome = await transport.send(req)
    assert (outcome.kind, outcome.status, outcome.reason) == (kind, status, reason)
    # One request per send (only an expired provider token is retried), the same apns-id.
    (rec,) = emulator.requests(TOKEN)
    assert rec.header("apns-id") == req.request_id
    assert rec.body == APNS_BODY
    assert outcome.retry_after == (30.0 if kind == TRANSIENT else None)
    if kind == INVALID_ENDPOINT and status == 410:
        assert outcome.invalid_at is not None and abs(outcome.invalid_at - time.time()) < 60


async def test_expired_provider_token_is_refreshed_and_retried_once(emulator, transport):
    emulator.behave(TOKEN, 403, "ExpiredProviderToken", times=1)
    req = request()
    outcome = await transport.send(req)
    assert outcome.kind == ACCEPTED and "after 403 ExpiredProviderToken" in outcome.detail  # logged
    first, second = emulator.requests(TOKEN)
    assert (first.status, first.reason, second.status) == (403, "ExpiredProviderToken", 200)
    assert first.jwt != second.jwt and transport.token.issued == 2
    assert first.header("apns-id") == second.header("apns-id") == req.request_id
    # The new token is reused from then on, not remade per request.
    await transport.send(request())
    assert emulator.requests(TOKEN)[-1].jwt == second.jwt and transport.token.issued == 2


async def test_a_token_still_expired_after_the_refresh_is_a_configuration_fault(emulator, transport):
    emulator.behave(TOKEN, 403, "ExpiredProviderToken")
    outcome = await transport.send(request())
    assert (outcome.kind, outcome.reason) == (CONFIGURATION, "ExpiredProviderToken")
    assert len(emulator.requests(TOKEN)) == 2  # exactly one retry


async def test_tokens_the_emulator_expired_are_replaced_once_for_many_requests(emulator, transport):
    await transport.send(request())
    emulator.expire_provider_tokens()
    import asyncio

    outcomes = await asyncio.gather(*[transport.send(request("%064x" % (i + 1))) for i in range(20)])
    assert {o.kind for o in outcomes} == {ACCEPTED}
    assert transport.token.issued == 2  # one refresh, however many requests saw the stale token


async def test_a_non_hex_endpoint_never_reaches_apple(emulator, transport):
    outcome = await transport.send(request("../../3/device/" + "ab" * 32))
    assert (outcome.kind, outcome.reason, outcome.status) == (INVALID_ENDPOINT, "BadDeviceToken", None)
    assert emulator.requests() == []


async def test_unreachable_apns_is_transient(transport, emulator):
    await emulator.stop()
    outcome = await transport.send(request())
    assert outcome.kind == TRANSIENT and "connect" in outcome.detail


async def test_an_untrusted_certificate_is_a_configuration_fault(emulator, p8, tmp_path):
    from appliance.transports.apns import ApnsProfile, ApnsTransport
    from appliance.transports.credentials import ApnsKey

    from .conftest import KEY_ID, TEAM, TOPIC

    profile = ApnsProfile("p", TOPIC, "production", ApnsKey.load(TEAM, KEY_ID, p8[0]), apns_url=emulator.url)
    t = ApnsTransport(profile, timeout=5)  # no ca_file: the emulator's CA is not trusted
    try:
        outcome = await t.send(request())
    finally:
        await t.close()
    assert outcome.kind == CONFIGURATION and "not trusted" in outcome.detail
    assert emulator.requests() == []


def test_retry_after_forms():
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("99999999") == 3600.0  # bounded
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    # From a server, so never an exception: ASCII digits only ('²' and '١' are str.isdigit()),
    # bounded length, and dates that do not parse are simply absent.
    for bad in ("\xb2", "1\xb2", "\u0661\u0662", "\uff11", "1" * 65, "-5", "1.5", "1e3", "",
                "Wed, 32 Foo 99999 25:61:00 GMT", "\x00"):
        assert parse_retry_after(bad) is None, repr(bad)
    assert parse_retry_after(" 7 ") == 7.0


async def test_one_provider_token_for_many_requests_and_connections(emulator, transport):
    """Never a token per request or per connection: APNs dropping the connection changes nothing."""
    import asyncio

    from appliance.testing.apns_emulator import _Connection

    emulator.token_update_interval = 20 * 60  # Apple refuses a key's new token sooner than that
    for round_ in range(3):
        outcomes = await asyncio.gather(*[transport.send(request("%064x" % (round_ * 10 + i + 1)))
                                          for i in range(5)])
        assert {o.kind for o in outcomes} == {ACCEPTED}
        for conn in list(_Connection.open_for(emulator)):  # APNs closes the connection
            conn.close()
        await asyncio.sleep(0.1)
    recs = emulator.requests()
    assert len(recs) == 15 and len({r.connection for r in recs}) == 3
    assert len({r.jwt for r in recs}) == 1 and transport.token.issued == 1
