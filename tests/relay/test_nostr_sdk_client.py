"""The real server driven by rust-nostr's client (nostr_sdk 0.45 Python bindings): publish, query, NIP-42.

nostr_sdk's async methods run on its own (tokio) runtime and return awaitables for the running asyncio
loop, so the tests are plain anyio tests on the asyncio backend. Automatic NIP-42 needs an authenticator
(`ClientBuilder().authenticator(SignerAuthenticator(keys))`) in 0.45: rust-nostr answers the relay's
challenge when the relay refuses with `auth-required:` and retries the EVENT/REQ.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

ns = pytest.importorskip("nostr_sdk", reason="nostr_sdk (rust-nostr bindings) is not installed")

pytestmark = pytest.mark.anyio

TIMEOUT = timedelta(seconds=10)


async def _client(url: str, keys=None):
    builder = ns.ClientBuilder()
    if keys is not None:
        # The authenticator is a Python async callback that rust-nostr calls from its own threads:
        # the bindings need to be told which asyncio loop runs it.
        ns.uniffi_set_event_loop(asyncio.get_running_loop())
        builder = builder.authenticator(ns.SignerAuthenticator(keys))
    client = builder.build()
    relay_url = ns.RelayUrl.parse(url)
    await client.add_relay(relay_url)
    await client.connect()
    return client, relay_url


async def _publish(client, keys, builder):
    event = await builder.finalize_async(keys)
    out = await asyncio.wait_for(client.send_event(event), 20)
    return event, out


async def _fetch(client, flt):
    events = await asyncio.wait_for(client.fetch_events(ns.ReqTarget.auto([flt]), TIMEOUT), 20)
    return sorted(e.id().to_hex() for e in events)


async def test_publish_and_fetch(server):
    keys = ns.Keys.generate()
    other = ns.Keys.generate()
    client, relay_url = await _client(server.url)
    try:
        note, out = await _publish(
            client, keys, ns.EventBuilder(ns.Kind(1), "hello from rust-nostr").tags([ns.Tag.public_key(other.public_key())])
        )
        assert [u.__str__() for u in out.success] == [str(relay_url)], out.failed
        assert not out.failed
        assert out.id.to_hex() == note.id().to_hex()
        second, out2 = await _publish(client, keys, ns.EventBuilder(ns.Kind(1), "second"))
        assert out2.success and not out2.failed

        mine = await _fetch(client, ns.Filter().author(keys.public_key()).kind(ns.Kind(1)))
        assert mine == sorted([note.id().to_hex(), second.id().to_hex()])
        tagged = await _fetch(client, ns.Filter().pubkey(other.public_key()).limit(10))
        assert tagged == [note.id().to_hex()]
        by_id = await _fetch(client, ns.Filter().id(second.id()))
        assert by_id == [second.id().to_hex()]

        # Publishing the same event again: accepted as already stored (OK true, `duplicate:`), stored once.
        again = await asyncio.wait_for(client.send_event(note), 20)
        assert str(relay_url) in {str(u) for u in again.success} and not again.failed
        assert len(await _fetch(client, ns.Filter().author(keys.public_key()))) == 2
    finally:
        await client.shutdown()


async def test_automatic_auth_when_required(make_server):
    server = make_server("--auth-required", "true")
    keys = ns.Keys.generate()
    client, relay_url = await _client(server.url, keys)
    try:
        note, out = await _publish(client, keys, ns.EventBuilder(ns.Kind(1), "authenticated note"))
        assert out.success and not out.failed, out.failed
        got = await _fetch(client, ns.Filter().author(keys.public_key()))
        assert got == [note.id().to_hex()]
    finally:
        await client.shutdown()
        ns.uniffi_set_event_loop(None)

    # Without an authenticator the same relay refuses: the OK carries the auth-required prefix.
    anon, relay_url = await _client(server.url)
    try:
        stranger = ns.Keys.generate()
        _, out = await _publish(anon, stranger, ns.EventBuilder(ns.Kind(1), "anonymous"))
        assert not out.success
        assert next(iter(out.failed.values())).startswith("auth-required:")
    finally:
        await anon.shutdown()
