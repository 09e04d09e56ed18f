"""Groups the appliance creates for MDK members (the "mdk" profile, spec note M24), against MDK 0.8.0
in process: MDK's group data (0xf2ee) written byte for byte as MDK writes it, the profile chosen from
the invitees' key packages, and every commit kind both ways (add, remove, self-update, admin changes
through the group data), with the appliance refusing what MDK refuses. Through the relay:
test_mdk_relay.py."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os

import orjson
import pytest

from appliance.cli import main
from appliance.marmot import components as comp
from appliance.marmot import mls, multidevice, profile, transport
from appliance.marmot.device import Device
from appliance.marmot.errors import MarmotError
from appliance.marmot.mls.structs import EXT_REQUIRED_CAPABILITIES, Extension
from appliance.nostr.event import parse_event, sign_event
from appliance.nostr.keys import generate_secret, public_key

from .mdk_harness import mdk_or_skip

RELAY = "ws://127.0.0.1:7777"
# Relay URLs MDK rewrites (case, default ports, IPv6, trailing slashes) and orders by their full
# serialization, so "wss://a.b.c" comes before "wss://a.b".
TRICKY_RELAYS = ["wss://b.example", "wss://a.b.c", "wss://a.b", "WSS://Upper.Example:443", "ws://127.0.0.1:7777",
                 "wss://x.example/path/", "wss://x.example/path", "wss://x.example/", "ws://x.example:80/",
                 "wss://x.example:0443", "wss://x.example?q=1", "wss://[0:0:0:0:0:0:0:1]", "wss://[::1]:7777",
                 "wss://x.example/a//", "wss://x-y_z.example", "ws://10.0.0.1", "wss://x.example/p?a/b/"]


class MdkPeer:
    def __init__(self, tmp_path, name):
        mdk = mdk_or_skip()
        self.secret = generate_secret()
        self.pubkey = public_key(self.secret)
        self.mdk = mdk.new_mdk_with_key(str(tmp_path / f"{name}.db"), os.urandom(32), None)

    def key_package(self):
        kp = self.mdk.create_key_package_for_event(self.pubkey, [RELAY])
        return sign_event(self.secret, 30443, kp.tags, kp.key_package)

    def accept(self, rumor: dict) -> str:
        welcome = self.mdk.process_welcome("00" * 32, orjson.dumps(rumor).decode())
        self.mdk.accept_welcome(welcome)
        return welcome.mls_group_id

    def commit(self, gid, result):
        """MDK applies its own commit (publish-before-apply is the caller's) and hands it over."""
        self.mdk.merge_pending_commit(gid)
        return parse_event(orjson.loads(result.evolution_event_json))

    def process(self, ev) -> bool:
        return self.mdk.process_message(ev.to_json()).is_commit()

    def text(self, ev) -> str:
        return orjson.loads(self.mdk.process_message(ev.to_json()).message.event_json)["content"]


def _ev(text: str):
    return parse_event(orjson.loads(text))


def test_group_data_is_written_byte_for_byte_as_mdk_writes_it(tmp_path):
    """MDK makes a group (unicode name and description, three admins, relays it rewrites); the appliance
    joins, and its encoder, given the same inputs, writes exactly MDK's 0xf2ee bytes and the same
    GroupContext extensions in the same order."""
    alice = MdkPeer(tmp_path, "alice")
    bob, carol = Device(generate_secret()), Device(generate_secret())
    kps = [bob.new_key_package([RELAY]), carol.new_key_package([RELAY])]
    admins = [carol.account, alice.pubkey, bob.account]
    created = alice.mdk.create_group(alice.pubkey, [kp.to_json() for kp in kps], "Fête ✓", "a description\nwith lines",
                                     TRICKY_RELAYS, admins)
    gid = created.group.mls_group_id
    assert bob.join(orjson.loads(created.welcome_rumors_json[0])) == gid
    context = bob.group(gid).context
    theirs = context.extension(comp.EXT_MDK_GROUP_DATA).extension_data
    ours = comp.MdkGroupData.of(nostr_group_id=bytes.fromhex(created.group.nostr_group_id), name="Fête ✓",
                                description="a description\nwith lines", admins=admins, relays=TRICKY_RELAYS)
    assert ours.encode() == theirs
    assert comp.MdkGroupData.decode(theirs) == ours and comp.MdkGroupData.decode(theirs).encode() == theirs
    # Both invitees advertise SelfRemove, so MDK requires it; our layout with it is MDK's, in MDK's order.
    ours_exts = profile.mdk_group_extensions(ours, required_proposals=[comp.SELF_REMOVE])
    assert [(e.extension_type, e.extension_data) for e in ours_exts] == \
        [(e.extension_type, e.extension_data) for e in context.extensions]
    assert [e.extension_type for e in context.extensions] == [comp.EXT_MDK_GROUP_DATA, EXT_REQUIRED_CAPABILITIES]


def test_relay_urls_are_rewritten_and_ordered_as_mdk_does(tmp_path):
    alice = MdkPeer(tmp_path, "alice")
    for url in TRICKY_RELAYS:
        made = alice.mdk.create_group(alice.pubkey, [], "g", "", [url], [alice.pubkey])
        assert [comp.mdk_relay_url(url)[1]] == alice.mdk.get_relays(made.group.mls_group_id), url
    made = alice.mdk.create_group(alice.pubkey, [], "g", "", TRICKY_RELAYS, [alice.pubkey])
    assert [r.decode() for r in comp.mdk_relay_list(TRICKY_RELAYS)] == alice.mdk.get_relays(made.group.mls_group_id)
    # Two URLs with one serialization: MDK keeps the last one given.
    for pair in (["wss://d.example/", "wss://d.example:443"], ["wss://d.example:443", "wss://d.example/"]):
        made = alice.mdk.create_group(alice.pubkey, [], "g", "", pair, [alice.pubkey])
        assert [r.decode() for r in comp.mdk_relay_list(pair)] == alice.mdk.get_relays(made.group.mls_group_id)
    # Forms a URL parser would rewrite in ways not rebuilt here are refused, never written differently.
    for url in ("wss://127.1", "wss://xn--bcher-kva.example", "wss://a.example/x/../y", "wss://a..b",
                "wss://a.example:", "wss://a.example/<x>", "https://a.example", "wss://u@a.example"):
        with pytest.raises(MarmotError) as e:
            comp.mdk_relay_url(url)
        assert e.value.code.startswith("component."), url


def test_the_profile_follows_the_invitees_key_packages(tmp_path):
    alice, bob = Device(generate_secret()), Device(generate_secret())
    mdk_peer = MdkPeer(tmp_path, "carol")
    assert alice.choose_profile([bob.new_key_package([RELAY])]) == ("components", [])
    chosen, reasons = alice.choose_profile([bob.new_key_package([RELAY]), mdk_peer.key_package()])
    assert chosen == "mdk" and len(reasons) == 1 and mdk_peer.pubkey in reasons[0]
    assert "app_data_dictionary" in reasons[0]
    # A components group refuses the MDK key package, as before.
    with pytest.raises(MarmotError) as e:
        alice.create_group("g", [RELAY], [mdk_peer.key_package()])
    assert e.value.code == "proof.component_absent"
    # A key package whose 0x8009 proof is there but invalid is refused, never taken for an MDK one.
    kps = profile.create_key_package(bob.secret)
    leaf = kps.key_package.leaf_node
    data = dict(profile.app_data(leaf.extensions))
    proof = bytearray(data[comp.ACCOUNT_IDENTITY_PROOF])
    proof[-1] ^= 1
    data[comp.ACCOUNT_IDENTITY_PROOF] = bytes(proof)
    assert profile.lacks_components(leaf) is None
    bad = dataclasses.replace(leaf, extensions=(Extension(
        profile.EXT_APP_DATA_DICTIONARY, mls.encode_app_data_dictionary(sorted(data.items()))),))
    assert profile.lacks_components(bad) is None
    with pytest.raises(MarmotError):
        profile.account_of_leaf(bad)


def test_the_appliance_creates_a_group_mdk_joins_and_every_commit_goes_both_ways(tmp_path):
    alice = Device(generate_secret())
    bob, carol = MdkPeer(tmp_path, "bob"), MdkPeer(tmp_path, "carol")
    dave = Device(generate_secret())
    kp = bob.key_package()
    chosen, _ = alice.choose_profile([kp])
    gid, rumors = alice.create_group("Team", [RELAY, "WSS://Relay.Example:443/"], [kp], group_profile=chosen,
                                     description="for MDK")
    assert chosen == "mdk" and alice.groups[gid]["relays"] == [RELAY, "wss://relay.example/"]
    assert bob.accept(rumors[0]) == gid
    group = bob.mdk.get_group(gid)
    assert (group.name, group.description, group.admin_pubkeys) == ("Team", "for MDK", [alice.account])
    assert group.nostr_group_id == alice.groups[gid]["h"]
    assert sorted(bob.mdk.get_relays(gid)) == sorted(alice.groups[gid]["relays"])

    # Messages both ways.
    assert bob.text(alice.send(gid, "hello bob")) == "hello bob"
    got = alice.receive(_ev(bob.mdk.create_message(gid, bob.pubkey, "hello alice", 9, None, None)))
    assert (got.rumor["content"], got.sender) == ("hello alice", bob.pubkey)

    # The appliance's commits, processed by MDK: add (MDK and appliance key packages), self-update,
    # admin change through the group data, remove.
    ev, welcomes = alice.commit(gid, add=[carol.key_package(), dave.new_key_package([RELAY])])
    assert bob.process(ev)
    assert carol.accept(welcomes[0]) == gid and dave.join(welcomes[1]) == gid
    ev, _ = alice.commit(gid)
    assert bob.process(ev) and carol.process(ev) and dave.receive(ev).type == "commit"
    ev, _ = alice.commit(gid, add_admins=[bob.pubkey])
    assert bob.process(ev) and carol.process(ev) and dave.receive(ev).type == "commit"
    assert sorted(bob.mdk.get_group(gid).admin_pubkeys) == sorted([alice.account, bob.pubkey])
    ev, _ = alice.commit(gid, remove=[carol.pubkey])
    assert bob.process(ev) and dave.receive(ev).type == "commit"
    assert sorted(bob.mdk.get_members(gid)) == sorted([alice.account, bob.pubkey, dave.account])

    # MDK's commits, processed by the appliance: self-update, add, remove, group data (rename, admins).
    ev = bob.commit(gid, bob.mdk.self_update(gid))
    assert alice.receive(ev).epoch == dave.receive(ev).epoch == bob.mdk.get_group(gid).epoch
    carol2 = MdkPeer(tmp_path, "carol2")
    ev = bob.commit(gid, bob.mdk.add_members(gid, [carol2.key_package().to_json()]))
    assert alice.receive(ev).type == dave.receive(ev).type == "commit"
    ev = bob.commit(gid, bob.mdk.remove_members(gid, [dave.account]))
    assert alice.receive(ev).type == "commit" and dave.receive(ev).type == "commit" and gid not in dave.groups
    mdk = mdk_or_skip()
    update = mdk.GroupDataUpdate(name="Renamed", description=None, image_hash=None, image_key=None,
                                 image_nonce=None, relays=None, admins=[bob.pubkey])
    ev = bob.commit(gid, bob.mdk.update_group_data(gid, update))
    assert alice.receive(ev).type == "commit"
    state = profile.read_group_state(alice.group(gid).context)
    assert state.group_data.name == b"Renamed" and state.admins == {bytes.fromhex(bob.pubkey)}

    # No longer an admin: the appliance refuses to add, remove or change admins (MDK would refuse it),
    # yet may still update its own leaf and talk.
    for kwargs in ({"add": [Device(generate_secret()).new_key_package([RELAY])]}, {"remove": [bob.pubkey]},
                   {"add_admins": [alice.account]}):
        with pytest.raises(MarmotError) as e:
            alice.commit(gid, **kwargs)
        assert e.value.code == "commit.not_admin"
    ev, _ = alice.commit(gid)
    assert bob.process(ev)
    assert bob.text(alice.send(gid, "still here")) == "still here"
    ev = bob.commit(gid, bob.mdk.remove_members(gid, [alice.account]))
    got = alice.receive(ev)
    assert got.type == "commit" and gid not in alice.groups


def _raw_commit(device: Device, gid: str, **kwargs):
    """A commit made with the MLS core alone (none of Device.commit's own checks), as a kind 445 event."""
    group = device.group(gid)
    out = group.commit(**kwargs)
    return transport.encrypt_group_message(multidevice.group_event_key(group),
                                           bytes.fromhex(device.groups[gid]["h"]), out.message)


def test_members_refuse_what_mdk_refuses(tmp_path):
    """In an MDK-profile group, a member's commit is refused as MDK refuses it: a non-admin adding,
    removing or changing the group data; an admin leaving no admin among the members; dropping 0xf2ee."""
    alice, bob, carol = (Device(generate_secret()) for _ in range(3))
    gid, rumors = alice.create_group("g", [RELAY], [bob.new_key_package([RELAY]), carol.new_key_package([RELAY])],
                                     group_profile="mdk")
    bob.join(rumors[0])
    carol.join(rumors[1])
    assert profile.read_group_state(bob.group(gid).context).profile == "mdk"
    state = profile.read_group_state(alice.group(gid).context)
    others = state.group_data.with_admins([bytes.fromhex(carol.account), bytes.fromhex(alice.account)])

    def gce(data):
        return [Extension(e.extension_type, data.encode()) if e.extension_type == comp.EXT_MDK_GROUP_DATA else e
                for e in alice.group(gid).context.extensions]

    carol_leaf = next(i for i, leaf in bob.group(gid).tree.leaves() if leaf.credential.identity.hex() == carol.account)
    dave_kp = transport.parse_key_package_event(Device(generate_secret()).new_key_package([RELAY])).key_package
    for kwargs in ({"add": [dave_kp]}, {"remove": [carol_leaf]}, {"group_context_extensions": gce(others)}):
        ev = _raw_commit(bob, gid, **kwargs)  # Bob is no admin
        with pytest.raises(MarmotError) as e:
            alice.receive(ev)
        assert e.value.code == "commit.not_admin", kwargs
    # An admin (Alice) naming only a non-member admin: nobody could add or remove any more.
    stranger = state.group_data.with_admins([bytes.fromhex(public_key(generate_secret()))])
    ev = _raw_commit(alice, gid, group_context_extensions=gce(stranger))
    with pytest.raises(MarmotError) as e:
        bob.receive(ev)
    assert e.value.code == "commit.no_admin"
    ev = _raw_commit(alice, gid, group_context_extensions=[e for e in alice.group(gid).context.extensions
                                                           if e.extension_type != comp.EXT_MDK_GROUP_DATA])
    with pytest.raises(MarmotError) as e:
        bob.receive(ev)
    assert e.value.code == "commit.group_data"
    # required_capabilities no longer requiring 0xf2ee (dropped, or requiring SelfRemove alone): MDK
    # refuses it (checked below), so members do too.
    req = profile.RequiredCapabilities.decode(alice.group(gid).context.extension(EXT_REQUIRED_CAPABILITIES)
                                              .extension_data)
    for replacement in (None, profile.RequiredCapabilities((), req.proposal_types)):
        exts = [e for e in alice.group(gid).context.extensions if e.extension_type != EXT_REQUIRED_CAPABILITIES]
        if replacement is not None:
            exts.append(Extension(EXT_REQUIRED_CAPABILITIES, replacement.encode()))
        ev = _raw_commit(alice, gid, group_context_extensions=exts)
        with pytest.raises(MarmotError) as e:
            bob.receive(ev)
        assert e.value.code == "commit.group_data"
    # Nothing was applied: the group goes on at the same epoch, and a self-update by Bob is fine.
    ev, _ = bob.commit(gid)
    assert alice.receive(ev).type == carol.receive(ev).type == "commit"
    # The appliance's own checks: admins must be members, and at least one must remain.
    with pytest.raises(MarmotError) as e:
        alice.commit(gid, add_admins=[public_key(generate_secret())])
    assert e.value.code == "commit.admin_not_member"
    with pytest.raises(MarmotError) as e:
        alice.commit(gid, remove_admins=[alice.account])
    assert e.value.code == "commit.no_admin"
    with pytest.raises(MarmotError) as e:
        alice.commit(gid, remove=[public_key(generate_secret())])
    assert e.value.code == "commit.unknown_member"


def test_mdk_profile_creation_rules(tmp_path):
    alice, bob = Device(generate_secret()), Device(generate_secret())
    kp = bob.new_key_package([RELAY])
    with pytest.raises(MarmotError) as e:  # MDK: every admin is the creator or an invitee
        alice.create_group("g", [RELAY], [kp], group_profile="mdk", admins=[public_key(generate_secret())])
    assert e.value.code == "component.group_data.admin"
    with pytest.raises(MarmotError) as e:
        alice.create_group("g", [RELAY], [kp], group_profile="mdk", multi_device=True)
    assert e.value.code == "profile.draft_needs_components"
    gid, _ = alice.create_group("g", [RELAY], [kp], group_profile="mdk", admins=[bob.account])
    assert profile.read_group_state(alice.group(gid).context).admins == {bytes.fromhex(alice.account),
                                                                         bytes.fromhex(bob.account)}


class Cli:
    def __init__(self, tmp_path, name, secret=None):
        self.tmp, self.name = tmp_path, name
        self.secret = secret or generate_secret()
        self.pubkey = public_key(self.secret)
        self.identity = tmp_path / f"{name}.key"
        self.identity.write_text(self.secret)
        self.state = tmp_path / f"state-{name}"

    def __call__(self, command, *args, ok=True):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["marmot", command, "--state", str(self.state), "--identity", str(self.identity), *args])
        doc = json.loads(out.getvalue())
        assert (rc == 0) == ok, (command, doc)
        return doc

    def file(self, what, doc):
        path = self.tmp / f"{self.name}-{what}.json"
        path.write_text(json.dumps(doc if isinstance(doc, dict) else doc.to_dict()))
        return str(path)


def test_cli_create_group_with_an_mdk_invitee(tmp_path, capsys):
    """`create-group` picks the MDK profile for an MDK key package and says so on stderr; --profile forces
    either; admin changes go through `commit --add-admin/--remove-admin`; the draft commands refuse an
    MDK-compatible group, saying they need a components group."""
    alice, bob = Cli(tmp_path, "alice"), MdkPeer(tmp_path, "bob")
    kp = alice.file("bob-kp", bob.key_package())
    refused = alice("create-group", "--relay", RELAY, "--member-key-package", kp, "--profile", "components", ok=False)
    assert refused["error"] == "proof.component_absent"
    capsys.readouterr()
    created = alice("create-group", "--name", "Team", "--description", "mixed", "--relay", RELAY,
                    "--member-key-package", kp)
    err = capsys.readouterr().err
    assert created["profile"] == "mdk" and "draft" not in created
    assert bob.pubkey in err and "MDK-compatible" in err and "0xf2ee" in err and "--profile components" in err
    gid = created["group_id"]
    assert bob.accept(created["welcomes"][0]) == gid
    assert (bob.mdk.get_group(gid).name, bob.mdk.get_group(gid).description) == ("Team", "mixed")
    # Admin changes through the group data, processed by MDK.
    done = alice("commit", "--group", gid, "--add-admin", bob.pubkey)
    assert bob.process(parse_event(done["commit"]))
    assert sorted(bob.mdk.get_group(gid).admin_pubkeys) == sorted([alice.pubkey, bob.pubkey])
    done = alice("commit", "--group", gid, "--remove-admin", bob.pubkey)
    assert bob.process(parse_event(done["commit"])) and bob.mdk.get_group(gid).admin_pubkeys == [alice.pubkey]
    # The draft multi-device commands need a components group, and say so.
    for command, args in (("group-info", ["--group", gid]), ("join-psk", ["--group", gid]),
                          ("pairing-seal", ["--group", gid, "--recipient", "11" * 32])):
        refused = alice(command, *args, "--draft-multi-device", ok=False)
        assert refused["error"] == "multi_device.needs_components", command
        assert "components group" in refused["message"] and "MDK" in refused["message"]
        # A refusal of a draft feature names both ways to turn the draft on.
        assert "--draft-multi-device" in refused["message"] and "marmot_draft_multi_device" in refused["message"]
    # With the draft switch on, an MDK invitee still gets an MDK-compatible group (no draft parts).
    capsys.readouterr()
    created = alice("create-group", "--relay", RELAY, "--member-key-package", kp, "--draft-multi-device")
    assert created["profile"] == "mdk" and "draft" not in created
    assert "needs a components group" in capsys.readouterr().err
    # --profile mdk with appliance members: another appliance joins it and reads it as MDK's group data.
    carol = Cli(tmp_path, "carol")
    carol_kp = carol("key-package", "--relay", RELAY)
    created = alice("create-group", "--relay", RELAY, "--profile", "mdk",
                    "--member-key-package", alice.file("carol-kp", carol_kp))
    joined = carol("join", "--welcome", carol.file("welcome", created["welcomes"][0]))
    assert joined["profile"] == "mdk" and joined["group_id"] == created["group_id"]
    # A components group has no admin changes here (0x8003 would need an AppDataUpdate).
    plain = alice("create-group", "--relay", RELAY)
    refused = alice("commit", "--group", plain["group_id"], "--add-admin", carol.pubkey, ok=False)
    assert refused["error"] == "commit.unsupported"


def test_leaving_by_self_remove_both_ways(tmp_path):
    """SelfRemove (0x000a): the appliance's groups require it as MDK's do when every invitee supports
    it; an MDK member leaves an appliance-made group and the appliance (admin) commits it; the
    appliance leaves an MDK-made group and MDK's admin commits it; an admin must give its rights away
    first (MDK refuses an admin's SelfRemove)."""
    alice = Device(generate_secret())
    bob, carol = MdkPeer(tmp_path, "bob"), MdkPeer(tmp_path, "carol")
    gid, rumors = alice.create_group("g", [RELAY], [bob.key_package(), carol.key_package()], group_profile="mdk")
    req = profile.RequiredCapabilities.decode(alice.group(gid).context.extension(EXT_REQUIRED_CAPABILITIES)
                                              .extension_data)
    assert req.proposal_types == (comp.SELF_REMOVE,)
    bob.accept(rumors[0])
    carol.accept(rumors[1])
    assert bob.mdk.group_required_proposals(gid)  # MDK sees SelfRemove required: it leaves by SelfRemove
    left = parse_event(orjson.loads(carol.mdk.leave_group(gid).evolution_event_json))
    got = alice.receive(left)
    assert got.type == "proposal" and got.sender == carol.pubkey
    # Bob (MDK) keeps the proposal too (MDK may also offer its own commit of it: not published here).
    assert not bob.mdk.process_message(left.to_json()).is_unprocessable()
    ev, _ = alice.commit(gid)  # the pending SelfRemove, committed by the admin
    assert bob.process(ev) and carol.process(ev)
    assert sorted(bob.mdk.get_members(gid)) == sorted(alice.members(gid)) == sorted([alice.account, bob.pubkey])
    with pytest.raises(MarmotError) as e:
        alice.leave(gid)  # the only admin
    assert e.value.code == "leave.admin"

    # An MDK group: the appliance (no admin) leaves; MDK's admin commits its SelfRemove.
    dave = Device(generate_secret())
    made = bob.mdk.create_group(bob.pubkey, [dave.new_key_package([RELAY]).to_json()], "m", "", [RELAY], [bob.pubkey])
    mgid = made.group.mls_group_id
    dave.join(orjson.loads(made.welcome_rumors_json[0]))
    result = bob.mdk.process_message(dave.leave(mgid).to_json())
    commit = parse_event(orjson.loads(result.result.evolution_event_json))
    bob.mdk.merge_pending_commit(mgid)
    got = dave.receive(commit)
    assert got.type == "commit" and mgid not in dave.groups and bob.mdk.get_members(mgid) == [bob.pubkey]


def test_cli_leave(tmp_path):
    alice, bob = Cli(tmp_path, "alice"), Cli(tmp_path, "bob")
    kp = bob("key-package", "--relay", RELAY)
    created = alice("create-group", "--relay", RELAY, "--profile", "mdk", "--member-key-package", alice.file("kp", kp))
    gid = created["group_id"]
    bob("join", "--welcome", bob.file("welcome", created["welcomes"][0]))
    assert alice("leave", "--group", gid, ok=False)["error"] == "leave.admin"
    left = bob("leave", "--group", gid)
    assert left["kind"] == 445
    assert alice("receive", "--event", alice.file("left", left))["type"] == "proposal"
    commit = alice("commit", "--group", gid)["commit"]
    assert bob("receive", "--event", bob.file("commit", commit))["type"] == "commit"
    assert bob("send", "--group", gid, "--content", "x", ok=False)["error"] == "state.unknown_group"


def test_a_commit_that_stops_requiring_the_group_data_is_refused_as_mdk_refuses_it(tmp_path):
    """An admin's GroupContextExtensions whose required_capabilities no longer requires 0xf2ee: MDK
    0.8.0 refuses it (unprocessable), so the appliance's members refuse it too and both stay on one
    branch (before, the appliance applied it and forked from its MDK members)."""
    alice, dave = Device(generate_secret()), Device(generate_secret())
    bob = MdkPeer(tmp_path, "bob")
    gid, rumors = alice.create_group("g", [RELAY], [bob.key_package(), dave.new_key_package([RELAY])],
                                     group_profile="mdk")
    bob.accept(rumors[0])
    dave.join(rumors[1])
    exts = [e for e in alice.group(gid).context.extensions if e.extension_type != EXT_REQUIRED_CAPABILITIES]
    exts.append(Extension(EXT_REQUIRED_CAPABILITIES, profile.RequiredCapabilities((), (comp.SELF_REMOVE,)).encode()))
    ev = _raw_commit(alice, gid, group_context_extensions=exts)
    assert bob.mdk.process_message(ev.to_json()).is_unprocessable()
    with pytest.raises(MarmotError) as e:
        dave.receive(ev)
    assert e.value.code == "commit.group_data"
    # Both go on together: the admin's next (ordinary) commit is processed by each.
    ev, _ = alice.commit(gid)
    assert bob.process(ev) and dave.receive(ev).type == "commit"


def test_received_relay_urls_are_read_as_mdk_reads_them(tmp_path):
    """Group data whose relay URL MDK 0.8.0 cannot parse (nostr's RelayUrl) is refused as MDK refuses
    it; what MDK takes, the appliance takes (MDK's create_group is the witness for each URL)."""
    alice = MdkPeer(tmp_path, "alice")
    urls = ["wss://a.example", "https://a.example", "wss://", "wss://a b", "wss://a.example:99999", "",
            "wss://u@a.example", "WSS://A.EXAMPLE:443/", "wss://127.1", "wss://256.1.1.1", "ws://[::1]",
            "wss://[fe80::1%25eth0]", "wss://a%zzb", "wss://_7%85", "wss://xn--bcher-kva.example", "ws:/a.example"]
    for url in urls:
        try:
            alice.mdk.create_group(alice.pubkey, [], "g", "", [url], [alice.pubkey])
            mdk_reads = True
        except Exception:
            mdk_reads = False
        assert (comp.mdk_relay_refusal(url) is None) == mdk_reads, url
    good = comp.MdkGroupData.of(nostr_group_id=bytes(32), name="g", description="", admins=[alice.pubkey],
                                relays=["wss://a.example"])
    bad = dataclasses.replace(good, relays=(b"https://a.example",))
    with pytest.raises(MarmotError) as e:
        comp.MdkGroupData.decode(bad.encode())
    assert e.value.code == "component.group_data.relay"
