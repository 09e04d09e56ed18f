"""Through the relay: three MDK clients run a Marmot group with every event going through the
appliance's relay over websockets (published, then fetched by #h, #p or author), and the relay accepts
every event MDK produces; then groups of MDK clients and the appliance's CLI, made by either side."""

from __future__ import annotations

import contextlib
import io
import itertools
import json

import orjson
import pytest

from appliance.cli import main
from appliance.marmot import transport as tp
from appliance.marmot.device import Device
from appliance.nostr.event import parse_event
from appliance.nostr.keys import generate_secret, public_key

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


# -- the appliance and MDK in one group, through the relay ------------------------------------------------

class Node:
    """One participant on its own websocket: an MDK client or the appliance's CLI (a state directory
    and an identity file). Every event goes through the relay: published, then fetched by #h or #p."""

    def __init__(self, name: str, tmp_path, url: str, client, *, mdk: bool):
        self.name, self.tmp, self.url, self.client = name, tmp_path, url, client
        self.mdk_client = MdkClient(name, tmp_path, url, client) if mdk else None
        self.secret = self.mdk_client.secret if mdk else generate_secret()
        self.pubkey = public_key(self.secret)
        self.identity = tmp_path / f"{name}.key"
        self.identity.write_text(self.secret)
        self.state = tmp_path / f"state-{name}"
        self.subs = itertools.count()
        self.wraps_seen: set[str] = set()
        self.authed = False

    @property
    def mdk(self):
        return self.mdk_client.mdk

    def cli(self, command: str, *args: str, ok: bool = True) -> dict:
        out = io.StringIO()
        argv = ["marmot", command, "--identity", str(self.identity), *args]
        if command != "gift-wrap":
            argv[2:2] = ["--state", str(self.state)]
        with contextlib.redirect_stdout(out):
            rc = main(argv)
        doc = json.loads(out.getvalue())
        assert (rc == 0) == ok, (self.name, command, doc)
        return doc

    def file(self, what: str, doc) -> str:
        path = self.tmp / f"{self.name}-{what}-{next(self.subs)}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    async def publish(self, doc: dict) -> dict:
        ok, msg = await self.client.publish(doc)
        assert ok, f"{self.name}: relay refused kind {doc['kind']}: {msg}"
        return doc

    async def fetch(self, flt: dict) -> list[dict]:
        sub = f"{self.name}-{next(self.subs)}"
        events, closed = await self.client.req(sub, flt)
        assert closed is None, closed
        await self.client.send(["CLOSE", sub])
        return events

    async def publish_key_package(self) -> None:
        if self.mdk_client:
            await self.mdk_client.publish_key_package()
            return
        await self.publish(self.cli("key-package", "--relay", self.url))
        await self.publish(tp.build_key_package_relays(self.secret, [self.url]).to_dict())

    async def key_package_of(self, other: "Node") -> dict:
        """The newest kind 30443 key package of another account, fetched by author."""
        [ev] = await self.fetch({"kinds": [tp.KEY_PACKAGE_KIND], "authors": [other.pubkey], "limit": 1})
        return ev

    async def send_welcome(self, rumor: dict, to: "Node") -> None:
        await self.publish(self.cli("gift-wrap", "--rumor", self.file("rumor", rumor), "--to", to.pubkey))

    async def accept_welcome(self, gid: str) -> None:
        """Fetch our new gift wraps by #p (after AUTH: they are recipient-gated) and join the group."""
        if not self.authed:
            assert (await self.client.auth(self.secret, self.url))[0]
            self.authed = True
        wraps = [w for w in await self.fetch({"kinds": [1059], "#p": [self.pubkey]}) if w["id"] not in self.wraps_seen]
        assert len(wraps) == 1, f"{self.name}: {len(wraps)} new gift wraps"
        self.wraps_seen.add(wraps[0]["id"])
        if self.mdk_client:
            rumor = tp.unwrap_welcome(parse_event(wraps[0]), self.secret).rumor
            welcome = self.mdk.process_welcome(wraps[0]["id"], orjson.dumps(rumor).decode())
            assert welcome.mls_group_id == gid
            self.mdk.accept_welcome(welcome)
        else:
            assert self.cli("join", "--welcome", self.file("wrap", wraps[0]))["group_id"] == gid

    async def deliver(self, h: str, event_id: str):
        """Fetch the group's kind 445 events by #h and process the one with this id."""
        [raw] = [e for e in await self.fetch({"kinds": [tp.GROUP_MESSAGE_KIND], "#h": [h]}) if e["id"] == event_id]
        if self.mdk_client:
            result = self.mdk.process_message(orjson.dumps(raw).decode())
            assert not result.is_unprocessable() and not result.is_previously_failed(), (self.name, result)
            if result.is_application_message():
                return orjson.loads(result.message.event_json)["content"]
            assert result.is_commit(), (self.name, result)
            return "commit"
        got = self.cli("receive", "--event", self.file("event", raw))
        return got["rumor"]["content"] if got["type"] == "application" else got["type"]

    async def say(self, gid: str, text: str) -> str:
        if self.mdk_client:
            return (await self.mdk_client.send(gid, text))["id"]
        return (await self.publish(self.cli("send", "--group", gid, "--content", text)))["id"]

    async def mdk_commit(self, gid: str, result) -> str:
        """An MDK commit: published, then merged (publish-before-apply)."""
        return (await self.mdk_client.publish_commit(gid, result))["id"]

    async def commit(self, gid: str, *args: str) -> tuple[str, list[dict]]:
        out = self.cli("commit", "--group", gid, *args)
        await self.publish(out["commit"])
        return out["commit"]["id"], out["welcomes"]

    def members(self, gid: str) -> list[str]:
        if self.mdk_client:
            return sorted(self.mdk.get_members(gid))
        device = Device.from_json(self.secret, json.loads((self.state / "device" / "state.json").read_text()))
        return sorted(device.members(gid))


async def _nodes(server, connect, tmp_path, **kinds) -> list[Node]:
    mdk_or_skip()
    return [Node(name, tmp_path, server.url, await connect(server.url), mdk=is_mdk) for name, is_mdk in kinds.items()]


async def test_the_appliance_creates_a_group_with_mdk_through_the_relay(server, connect, tmp_path):
    """The appliance's CLI makes a group for an MDK invitee (MDK's group data), and each side adds,
    removes and messages the other: every event published to the relay, fetched by #h or #p."""
    alice, bob, carol, dave = await _nodes(server, connect, tmp_path, alice=False, bob=True, carol=True, dave=False)
    for node in (bob, carol, dave):
        await node.publish_key_package()
    created = alice.cli("create-group", "--name", "ops", "--description", "appliance and MDK", "--relay", server.url,
                        "--member-key-package", alice.file("kp", await alice.key_package_of(bob)))
    assert created["profile"] == "mdk"
    gid, h = created["group_id"], created["nostr_group_id"]
    await alice.send_welcome(created["welcomes"][0], bob)
    await bob.accept_welcome(gid)
    group = bob.mdk.get_group(gid)
    assert (group.name, group.description, group.admin_pubkeys, group.nostr_group_id) == \
        ("ops", "appliance and MDK", [alice.pubkey], h)

    # Messages both ways.
    assert await bob.deliver(h, await alice.say(gid, "hello bob")) == "hello bob"
    assert await alice.deliver(h, await bob.say(gid, "hello alice")) == "hello alice"

    # The appliance adds an MDK member (commit first, then the gift-wrapped welcome) and makes Bob an admin.
    commit, welcomes = await alice.commit(gid, "--add", alice.file("kp", await alice.key_package_of(carol)))
    assert await bob.deliver(h, commit) == "commit"
    await alice.send_welcome(welcomes[0], carol)
    await carol.accept_welcome(gid)
    commit, _ = await alice.commit(gid, "--add-admin", bob.pubkey)
    for node in (bob, carol):
        assert await node.deliver(h, commit) == "commit"
    assert sorted(bob.mdk.get_group(gid).admin_pubkeys) == sorted([alice.pubkey, bob.pubkey])

    # MDK (Bob, now an admin) adds an appliance member, who joins from the gift wrap and talks.
    added = bob.mdk.add_members(gid, [orjson.dumps(await bob.key_package_of(dave)).decode()])
    commit = await bob.mdk_commit(gid, added)
    for node in (alice, carol):
        assert await node.deliver(h, commit) == "commit"
    await bob.publish(tp.wrap_welcome(orjson.loads(added.welcome_rumors_json[0]), bob.secret, dave.pubkey).to_dict())
    await dave.accept_welcome(gid)
    assert dave.members(gid) == sorted([alice.pubkey, bob.pubkey, carol.pubkey, dave.pubkey])
    message = await dave.say(gid, "hi from the appliance")
    for node in (alice, bob, carol):
        assert await node.deliver(h, message) == "hi from the appliance"

    # Each side removes a member of the other side; a self-update each; the last removes the creator.
    commit = await bob.mdk_commit(gid, bob.mdk.remove_members(gid, [dave.pubkey]))
    for node in (alice, carol, dave):
        assert await node.deliver(h, commit) == "commit"
    commit, _ = await alice.commit(gid, "--remove", carol.pubkey)
    assert await bob.deliver(h, commit) == "commit"
    assert alice.members(gid) == bob.members(gid) == sorted([alice.pubkey, bob.pubkey])
    commit = await bob.mdk_commit(gid, bob.mdk.self_update(gid))
    assert await alice.deliver(h, commit) == "commit"
    commit, _ = await alice.commit(gid)
    assert await bob.deliver(h, commit) == "commit"
    assert await bob.deliver(h, await alice.say(gid, "after both updates")) == "after both updates"
    commit = await bob.mdk_commit(gid, bob.mdk.remove_members(gid, [alice.pubkey]))
    assert await alice.deliver(h, commit) == "commit"
    assert alice.cli("send", "--group", gid, "--content", "gone", ok=False)["error"] == "state.unknown_group"


async def test_mdk_creates_a_group_with_the_appliance_through_the_relay(server, connect, tmp_path):
    """MDK makes a group with the appliance as a second admin; the appliance adds and removes an MDK
    member, both talk and update, and MDK removes the appliance, all through the relay."""
    bob, alice, carol = await _nodes(server, connect, tmp_path, bob=True, alice=False, carol=True)
    for node in (alice, carol):
        await node.publish_key_package()
    kp = await bob.key_package_of(alice)
    bob.mdk.parse_key_package(orjson.dumps(kp).decode())
    created = bob.mdk.create_group(bob.pubkey, [orjson.dumps(kp).decode()], "mdk group", "", [server.url],
                                   [bob.pubkey, alice.pubkey])
    gid, h = created.group.mls_group_id, created.group.nostr_group_id
    await bob.publish(tp.wrap_welcome(orjson.loads(created.welcome_rumors_json[0]), bob.secret, alice.pubkey).to_dict())
    await alice.accept_welcome(gid)
    assert alice.members(gid) == sorted([alice.pubkey, bob.pubkey])

    assert await alice.deliver(h, await bob.say(gid, "welcome")) == "welcome"
    assert await bob.deliver(h, await alice.say(gid, "thanks")) == "thanks"

    commit, welcomes = await alice.commit(gid, "--add", alice.file("kp", await alice.key_package_of(carol)))
    assert await bob.deliver(h, commit) == "commit"
    await alice.send_welcome(welcomes[0], carol)
    await carol.accept_welcome(gid)
    message = await carol.say(gid, "hi both")
    assert await alice.deliver(h, message) == await bob.deliver(h, message) == "hi both"
    commit, _ = await alice.commit(gid, "--remove", carol.pubkey)
    assert await bob.deliver(h, commit) == "commit"
    commit = await bob.mdk_commit(gid, bob.mdk.self_update(gid))
    assert await alice.deliver(h, commit) == "commit"
    commit, _ = await alice.commit(gid)
    assert await bob.deliver(h, commit) == "commit"
    assert bob.members(gid) == alice.members(gid) == sorted([alice.pubkey, bob.pubkey])
    commit = await bob.mdk_commit(gid, bob.mdk.remove_members(gid, [alice.pubkey]))
    assert await alice.deliver(h, commit) == "commit"
    assert bob.members(gid) == [bob.pubkey]
