"""Through the relay: three MDK clients run a Marmot group with every event going through the
appliance's relay over websockets (published, then fetched by #h, #p or author), and the relay accepts
every event MDK produces."""

from __future__ import annotations

import orjson
import pytest

from .mdk_harness import MdkClient, mdk_or_skip

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _texts(results) -> list[str]:
    out = []
    for r in results:
        assert not r.is_unprocessable() and not r.is_previously_failed(), r
        if r.is_application_message():
            out.append(orjson.loads(r.message.event_json)["content"])
    return out


def _commits(results) -> int:
    return sum(1 for r in results if r.is_commit())


async def test_mdk_group_through_the_relay(server, connect, tmp_path):
    mdk_or_skip()
    url = server.url
    alice = MdkClient("alice", tmp_path, url, await connect(url))
    bob = MdkClient("bob", tmp_path, url, await connect(url))
    carol = MdkClient("carol", tmp_path, url, await connect(url))
    seen = {c.name: set() for c in (alice, bob, carol)}

    # Key packages (kind 30443 and legacy 443) and key package relay lists (10051), fetched by author.
    for c in (bob, carol):
        await c.publish_key_package()
    bob_kp = await alice.fetch_key_package(bob.pubkey)

    # Alice creates the group with Bob and invites him by gift-wrapped welcome.
    created = alice.mdk.create_group(alice.pubkey, [bob_kp], "interop", "through the relay", [url], [alice.pubkey])
    gid, h = created.group.mls_group_id, created.group.nostr_group_id
    await alice.send_welcomes(created.welcome_rumors_json, [bob.pubkey])
    await bob.accept_welcome(gid)
    assert sorted(bob.mdk.get_members(gid)) == sorted([alice.pubkey, bob.pubkey])

    # Messages both ways, fetched by #h.
    await alice.send(gid, "hello bob")
    assert _texts(await bob.receive(h, seen["bob"])) == ["hello bob"]
    await bob.send(gid, "hello alice")
    seen["alice"].update(e["id"] for e in alice.published)
    assert _texts(await alice.receive(h, seen["alice"])) == ["hello alice"]

    # Alice adds Carol: commit first (to the group), then Carol's welcome.
    carol_kp = await alice.fetch_key_package(carol.pubkey)
    added = alice.mdk.add_members(gid, [carol_kp])
    commit = await alice.publish_commit(gid, added)
    seen["alice"].add(commit["id"])
    assert _commits(await bob.receive(h, seen["bob"])) == 1
    await alice.send_welcomes(added.welcome_rumors_json, [carol.pubkey])
    await carol.accept_welcome(gid)
    # Carol joined at the current epoch: nothing before it is hers to process.
    seen["carol"].update(e["id"] for c in (alice, bob) for e in c.published if e["kind"] == 445)
    assert sorted(carol.mdk.get_members(gid)) == sorted([alice.pubkey, bob.pubkey, carol.pubkey])

    await carol.send(gid, "hi all")
    assert _texts(await alice.receive(h, seen["alice"])) == ["hi all"]
    assert _texts(await bob.receive(h, seen["bob"])) == ["hi all"]

    # Bob updates his own leaf.
    update = bob.mdk.self_update(gid)
    commit = await bob.publish_commit(gid, update)
    seen["bob"].add(commit["id"])
    assert _commits(await alice.receive(h, seen["alice"])) == 1
    assert _commits(await carol.receive(h, seen["carol"])) == 1
    await bob.send(gid, "after my update")
    assert _texts(await alice.receive(h, seen["alice"])) == ["after my update"]
    assert _texts(await carol.receive(h, seen["carol"])) == ["after my update"]

    # Alice removes Carol.
    removed = alice.mdk.remove_members(gid, [carol.pubkey])
    commit = await alice.publish_commit(gid, removed)
    seen["alice"].add(commit["id"])
    assert _commits(await bob.receive(h, seen["bob"])) == 1
    assert sorted(bob.mdk.get_members(gid)) == sorted([alice.pubkey, bob.pubkey])
    await alice.send(gid, "carol is gone")
    assert _texts(await bob.receive(h, seen["bob"])) == ["carol is gone"]
    epochs = {alice.mdk.get_group(gid).epoch, bob.mdk.get_group(gid).epoch}
    assert len(epochs) == 1

    # Every event MDK produced went through: count by kind what the relay stored.
    kinds = sorted({e["kind"] for c in (alice, bob, carol) for e in c.published})
    assert kinds == [443, 445, 1059, 10051, 30443]
    group_events = await bob.fetch("all", {"kinds": [445], "#h": [h]})
    assert len(group_events) == sum(1 for c in (alice, bob, carol) for e in c.published if e["kind"] == 445)
