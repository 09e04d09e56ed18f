"""The whole chain in one appliance process: an app enrolls with the gateway (software attester) and
delegates the relay; its lease carries the grant as endpoint; an event matches; the relay's delivery
worker POSTs to the gateway over NIP-98 signed with the relay key; the gateway sends the constant body
to the APNs emulator for the installation's token. Then rotation, both revocations, a 410 applied only
to its own generation, an expired grant and a grant delegated to another relay."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from appliance.testing.apns_emulator import ApnsEmulator
from appliance.testing.gateway_client import AppInstallation
from appliance.transports.apns import APNS_BODY
from tests.conftest import Server
from tests.gateway.helpers import PROFILE, TOPIC, GatewaySetup, token
from tests.push.delivery_helpers import Pusher, jobs, log_rows, wait_until

pytestmark = pytest.mark.anyio

ORIGIN = "ws://push.test"
QUOTA = 5  # the gateway's endpoint quota here: 5 admitted attempts per endpoint per 10 minutes


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chain")
    setup = GatewaySetup(tmp)
    emu = ApnsEmulator(topics=[TOPIC], pki_dir=tmp / "pki")
    from cryptography.hazmat.primitives import serialization

    emu.add_key("TEAM123456", "ABC123DEFG", serialization.load_pem_private_key(setup.p8.read_bytes(), None))
    emu.start_in_thread()
    server = Server(tmp / "data")
    gateway_url = f"http://127.0.0.1:{server.port}"
    top = "\n".join([
        f'public_url = "{ORIGIN}"', "wake_min_interval = 0", "wake_retry_delay = 0.2", "purge_interval = 3600",
        "[push]",
        f'app_profiles = [{{ id = "{PROFILE}", transport = "apns", gateway_url = "{gateway_url}" }}]',
        "push_kinds = [9, 1059, 7]",
    ])
    server.config = setup.config(gateway_url, top=top, extra=f"endpoint_quota_max = {QUOTA}\nendpoint_quota_window = 600",
                                 profiles=setup.profile_toml(apns_url=emu.url, ca_file=emu.ca_file))
    server.start()
    yield server, setup, emu, gateway_url
    server.stop()
    emu.stop_thread()


@pytest.fixture
async def ctx(chain):
    server, setup, emu, gateway_url = chain
    async with httpx.AsyncClient(base_url=server.http, timeout=20) as http:
        opened: list[Pusher] = []

        class Ctx:
            relay_pubkey = server.nip11()["self"]

            @staticmethod
            def app() -> AppInstallation:
                return AppInstallation(http, gateway_url, setup.attester(), PROFILE, token())

            @staticmethod
            async def user() -> Pusher:
                p = await Pusher.connect(server)
                opened.append(p)
                return p

        Ctx.server, Ctx.emu = server, emu
        yield Ctx
        for p in opened:
            await p.client.close()


def p_sub(user):
    return [{"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": "time_sensitive"}]


async def wake(ctx, sender: Pusher, bob: Pusher) -> dict:
    """Publish an event for bob; return bob's wake job once it reached a final state."""
    ev = await sender.publish(9, [["p", bob.pubkey]])
    final = ("delivered", "dead", "dropped", "invalidated")

    def done():
        rows = [j for j in jobs(ctx.server, event_id=ev.id) if j["lease_pubkey"] == bob.pubkey]
        return rows if rows and rows[0]["state"] in final else None

    return (await wait_until(done, timeout=20))[0]


async def test_lease_with_grant_delivers_through_the_gateway(ctx):
    app = ctx.app()
    assert (await app.enroll()).status_code == 201
    assert (await app.delegate(ctx.relay_pubkey, 1)).status_code == 201
    alice, bob = await ctx.user(), await ctx.user()
    await bob.lease(app.grants[ctx.relay_pubkey], generation=1, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    job = await wake(ctx, alice, bob)
    assert job["state"] == "delivered", (job["last_error"], log_rows(ctx.server))
    ctx.emu.wait_for(lambda rs: any(r.token == app.endpoint for r in rs))
    [rec] = ctx.emu.requests(app.endpoint)
    assert rec.body == APNS_BODY and rec.status == 200
    assert dict(rec.headers)["apns-id"] == job["id"] and dict(rec.headers)["apns-topic"] == TOPIC
    row = [r for r in log_rows(ctx.server) if r["job_id"] == job["id"]][-1]
    assert (row["outcome"], row["status"]) == ("accepted", 200)


async def test_rotation_and_both_revocations(ctx):
    app = ctx.app()
    assert (await app.enroll()).status_code == 201
    assert (await app.delegate(ctx.relay_pubkey, 1)).status_code == 201
    alice, bob = await ctx.user(), await ctx.user()
    await bob.lease(app.grants[ctx.relay_pubkey], generation=1, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    assert (await wake(ctx, alice, bob))["state"] == "delivered"
    first = app.endpoint

    # The platform rotated the token: the old grant dies with its epoch.
    assert (await app.rotate(token())).status_code == 200
    job = await wake(ctx, alice, bob)
    assert job["state"] == "dead" and "404" in job["last_error"], job
    assert (await app.delegate(ctx.relay_pubkey, 2)).status_code == 201
    await bob.lease(app.grants[ctx.relay_pubkey], generation=2, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    assert (await wake(ctx, alice, bob))["state"] == "delivered"
    assert len(ctx.emu.requests(first)) == 1
    await wait_until(lambda: len(ctx.emu.requests(app.endpoint)) == 1)

    # Delegation revocation: nothing more reaches APNs until a new delegation.
    assert (await app.revoke_delegation(ctx.relay_pubkey, 2)).status_code == 200
    assert (await wake(ctx, alice, bob))["state"] == "dead"
    assert (await app.delegate(ctx.relay_pubkey, 3)).status_code == 201
    await bob.lease(app.grants[ctx.relay_pubkey], generation=3, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    assert (await wake(ctx, alice, bob))["state"] == "delivered"

    # Installation revocation ends it all.
    assert (await app.revoke()).status_code == 200
    assert (await wake(ctx, alice, bob))["state"] == "dead"
    assert len(ctx.emu.requests(app.endpoint)) == 2


async def test_invalid_endpoint_applies_only_to_its_generation(ctx):
    app = ctx.app()
    assert (await app.enroll()).status_code == 201
    assert (await app.delegate(ctx.relay_pubkey, 5)).status_code == 201
    alice, bob = await ctx.user(), await ctx.user()
    ctx.emu.unregister(app.endpoint)
    # A lease whose generation (6) is not the grant's (5): the gateway's 410 names generation 5,
    # which is not this lease's current generation, so the endpoint stays enabled.
    await bob.lease(app.grants[ctx.relay_pubkey], generation=6, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    job = await wake(ctx, alice, bob)
    assert job["state"] == "dropped" and "not the current one" in job["last_error"], job
    # The lease generation matching the grant's: the 410 disables that endpoint generation.
    assert (await app.delegate(ctx.relay_pubkey, 7)).status_code == 201
    await bob.lease(app.grants[ctx.relay_pubkey], generation=7, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    assert (await wake(ctx, alice, bob))["state"] == "invalidated"
    ev = await alice.publish(9, [["p", bob.pubkey]])
    await asyncio.sleep(1.0)  # the matcher runs in the event's transaction: no job may appear
    assert [j for j in jobs(ctx.server, event_id=ev.id) if j["lease_pubkey"] == bob.pubkey] == []
    assert len(ctx.emu.requests(app.endpoint)) == 2


async def test_expired_grant_and_another_relays_grant(ctx):
    app = ctx.app()
    assert (await app.enroll()).status_code == 201
    now = int(time.time())
    assert (await app.delegate(ctx.relay_pubkey, 1, not_before=now - 10, expires_at=now + 2)).status_code == 201
    alice, bob = await ctx.user(), await ctx.user()
    await bob.lease(app.grants[ctx.relay_pubkey], generation=1, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    await wait_until(lambda: int(time.time()) > now + 2, timeout=10)
    assert (await wake(ctx, alice, bob))["state"] == "dead"
    # A grant delegated to another relay's key: this relay's signature does not match it.
    other = "ee" * 32
    assert (await app.delegate(other, 1)).status_code == 201
    carol = await ctx.user()
    await carol.lease(app.grants[other], generation=1, app_profile=PROFILE, subscriptions=p_sub(carol), d="carol", ttl=1800)
    assert (await wake(ctx, alice, carol))["state"] == "dead"
    assert ctx.emu.requests(app.endpoint) == []


async def test_endpoint_quota_seen_from_the_relay(ctx):
    app = ctx.app()
    assert (await app.enroll()).status_code == 201
    assert (await app.delegate(ctx.relay_pubkey, 1)).status_code == 201
    alice, bob = await ctx.user(), await ctx.user()
    await bob.lease(app.grants[ctx.relay_pubkey], generation=1, app_profile=PROFILE, subscriptions=p_sub(bob), ttl=1800)
    states = [(await wake(ctx, alice, bob))["state"] for _ in range(QUOTA + 1)]
    assert states == ["delivered"] * QUOTA + ["dead"]
    assert len(ctx.emu.requests(app.endpoint)) == QUOTA
