"""The full draft multi-device scenario with `appliance marmot` commands, every event through the
appliance's own relay over websockets.

Alice (one device) creates a group with Bob and with Carol as a second admin. Alice's second device
pairs (sealed payload), prepares its joining leaf, Carol authorizes it (kind 452), the new device
publishes the External Commit, every existing member validates and processes it, and then all four
devices exchange application messages through kind 445 events published to and read from the relay.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from appliance.cli import main
from appliance.nostr.keys import generate_secret, public_key

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


class Cli:
    """One device: a state directory and the account's identity file."""

    def __init__(self, tmp_path, name: str, secret: str):
        self.name = name
        self.state = tmp_path / f"state-{name}"
        self.identity = tmp_path / f"{name}.key"
        self.identity.write_text(secret)
        self.pubkey = public_key(secret)
        self.secret = secret
        self.tmp = tmp_path

    def __call__(self, command: str, *args: str, ok: bool = True) -> dict:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["marmot", command, "--state", str(self.state), *args]
                      if command not in ("gift-wrap",) else ["marmot", command, *args])
        doc = json.loads(out.getvalue())
        assert (rc == 0) == ok, (command, doc)
        return doc

    def id(self) -> list[str]:
        return ["--identity", str(self.identity)]

    def file(self, name: str, doc) -> str:
        path = self.tmp / f"{self.name}-{name}.json"
        path.write_text(json.dumps(doc))
        return str(path)


async def test_second_device_joins_through_the_relay(server, connect, tmp_path):
    url = server.url
    alice_secret = generate_secret()
    a1, a2 = Cli(tmp_path, "alice1", alice_secret), Cli(tmp_path, "alice2", alice_secret)
    bob, carol = Cli(tmp_path, "bob", generate_secret()), Cli(tmp_path, "carol", generate_secret())
    relay = await connect(url)

    async def publish(doc):
        ok, msg = await relay.publish(doc)
        assert ok, msg

    subs = iter(range(10**6))

    async def fetch(flt):
        sub = f"q{next(subs)}"
        events, closed = await relay.req(sub, flt)
        assert closed is None, closed
        await relay.send(["CLOSE", sub])
        return events

    # Key packages, published and fetched by author.
    for c in (bob, carol):
        published = c("key-package", *c.id(), "--relay", url, "--draft-multi-device")
        assert published.pop("draft")  # it advertises the draft feature: labelled
        await publish(published)
    kp_files = []
    for c in (bob, carol):
        [ev] = await fetch({"kinds": [30443], "authors": [c.pubkey]})
        kp_files.append(a1.file(f"kp-{c.name}", ev))

    # Alice creates the draft multi-device group; Carol is the other admin.
    created = a1("create-group", *a1.id(), "--name", "family", "--relay", url, "--draft-multi-device",
                 "--admin", carol.pubkey, *sum((["--member-key-package", f] for f in kp_files), []))
    assert created["draft"] and created["epoch"] == 1 and len(created["welcomes"]) == 2
    gid, h = created["group_id"], created["nostr_group_id"]
    for rumor, c in zip(created["welcomes"], (bob, carol)):
        assert rumor["draft"]  # a draft group's welcome: labelled beside the rumor's fields, as is its wrap
        wrap = a1("gift-wrap", *a1.id(), "--rumor", a1.file(f"rumor-{c.name}", rumor), "--to", c.pubkey)
        assert wrap.pop("draft")
        await publish(wrap)
    for c in (bob, carol):
        inbox = await connect(url)
        assert (await inbox.auth(c.secret, url))[0]
        wraps, closed = await inbox.req("inbox", {"kinds": [1059], "#p": [c.pubkey]})
        assert closed is None and len(wraps) == 1
        joined = c("join", *c.id(), "--welcome", c.file("wrap", wraps[0]))
        assert joined["group_id"] == gid and sorted(joined["members"]) == sorted([a1.pubkey, bob.pubkey, carol.pubkey])

    # Pairing: the new device's key, a sealed payload from device 1, opened once.
    key = a2("pairing-key", "--draft-multi-device")["pairing_key"]
    sealed = a1("pairing-seal", *a1.id(), "--recipient", key, "--group", gid, "--draft-multi-device")
    envelope = a2.file("envelope", sealed)
    opened = a2("pairing-open", "--envelope", envelope, "--draft-multi-device")
    assert opened["groups"] == [{"group_id": gid, "epoch": 1}]
    again = a2("pairing-open", "--envelope", envelope, "--draft-multi-device", ok=False)
    assert again["error"] == "pairing.unknown_key"  # single use: the pairing key is gone

    # The joining leaf, authorized by Carol (an admin of another account), then the External Commit.
    request = a2("join-request", *a2.id(), "--group", gid, "--draft-multi-device")
    refused = bob("authorize-join", *bob.id(), "--request", a2.file("request", request), "--draft-multi-device",
                  ok=False)
    assert refused["error"] == "multi_device.signer_not_admin"
    auth = carol("authorize-join", *carol.id(), "--request", a2.file("request", request), "--draft-multi-device")
    assert auth["event"]["kind"] == 452 and auth["event"]["pubkey"] == carol.pubkey
    commit = a2("external-commit", *a2.id(), "--group", gid, "--authorization", a2.file("auth", auth),
                "--draft-multi-device")
    assert commit["epoch"] == 2
    await publish(commit["commit"])

    # Every existing member fetches it by #h, validates and processes it.
    [ev] = [e for e in await fetch({"kinds": [445], "#h": [h]}) if e["id"] == commit["commit"]["id"]]
    for c in (a1, bob, carol):
        without = c("receive", *c.id(), "--event", c.file("ext", ev), ok=False)
        assert without["error"] == "draft.disabled"
        got = c("receive", *c.id(), "--event", c.file("ext", ev), "--draft-multi-device")
        assert got == {"draft": got["draft"], "type": "commit", "group_id": gid, "epoch": 2,
                       "sender": a1.pubkey, "external_join": True}

    # All four devices talk; each message is published, fetched by #h and read by the other three.
    devices = (a1, a2, bob, carol)
    for speaker in devices:
        sent = speaker("send", *speaker.id(), "--group", gid, "--content", f"hi from {speaker.name}")
        assert sent.pop("draft")  # sent in a draft group: labelled beside the event's fields
        await publish(sent)
        [stored] = [e for e in await fetch({"kinds": [445], "#h": [h]}) if e["id"] == sent["id"]]
        for listener in devices:
            if listener is speaker:
                continue
            got = listener("receive", *listener.id(), "--event", listener.file("msg", stored))
            assert got["type"] == "application" and got["epoch"] == 2
            assert got["rumor"]["content"] == f"hi from {speaker.name}"
            assert got["rumor"]["pubkey"] == speaker.pubkey and got["rumor"]["kind"] == 9
