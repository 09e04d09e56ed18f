"""MLS against OpenMLS: the appliance's MLS core and Marmot profile against MDK 0.8.0.

MDK accepts the appliance's key package event (create_group and add_members); the appliance joins
from MDK's welcome rumor, decrypts MDK's kind 445 application messages and processes MDK's commits
(add, remove, self-update); MDK processes the appliance's application message and commit. MDK
groups carry their data in extension 0xf2ee (spec note M4): the appliance joins them anyway.
"""

from __future__ import annotations

import orjson
import pytest

from appliance.marmot.device import Device
from appliance.nostr.event import parse_event, sign_event
from appliance.nostr.keys import generate_secret, public_key

from .mdk_harness import mdk_or_skip

RELAY = "ws://127.0.0.1:7777"


class MdkPeer:
    def __init__(self, tmp_path, name):
        mdk = mdk_or_skip()
        import os

        self.secret = generate_secret()
        self.pubkey = public_key(self.secret)
        self.mdk = mdk.new_mdk_with_key(str(tmp_path / f"{name}.db"), os.urandom(32), None)

    def key_package_event(self) -> str:
        kp = self.mdk.create_key_package_for_event(self.pubkey, [RELAY])
        return sign_event(self.secret, 30443, kp.tags, kp.key_package).to_json()

    def accept(self, rumor_json: str) -> str:
        welcome = self.mdk.process_welcome("00" * 32, rumor_json)
        self.mdk.accept_welcome(welcome)
        return welcome.mls_group_id


def _ev(json_text: str):
    return parse_event(orjson.loads(json_text))


def test_appliance_in_an_mdk_group(tmp_path):
    alice, carol = MdkPeer(tmp_path, "alice"), MdkPeer(tmp_path, "carol")
    bob = Device(generate_secret())

    # MDK accepts the appliance's key package event in create_group.
    kp_event = bob.new_key_package([RELAY])
    alice.mdk.parse_key_package(kp_event.to_json())
    created = alice.mdk.create_group(alice.pubkey, [kp_event.to_json()], "mdk group", "", [RELAY], [alice.pubkey])
    gid = created.group.mls_group_id

    # The appliance joins from MDK's welcome rumor (a group with MDK's 0xf2ee data, no app components).
    rumor = orjson.loads(created.welcome_rumors_json[0])
    assert bob.join(rumor) == gid
    assert bob.groups[gid]["h"] == created.group.nostr_group_id
    assert sorted(bob.members(gid)) == sorted([alice.pubkey, bob.account])

    # MDK's application message decrypts here; ours decrypts in MDK.
    got = bob.receive(_ev(alice.mdk.create_message(gid, alice.pubkey, "hello appliance", 9, None, None)))
    assert got.type == "application" and got.rumor["content"] == "hello appliance" and got.sender == alice.pubkey
    ours = bob.send(gid, "hello MDK")
    result = alice.mdk.process_message(ours.to_json())
    assert result.is_application_message()
    assert orjson.loads(result.message.event_json)["content"] == "hello MDK"
    assert result.message.sender_pubkey == bob.account

    # MDK commits: add Carol, self-update, remove Carol; the appliance follows each.
    added = alice.mdk.add_members(gid, [carol.key_package_event()])
    alice.mdk.merge_pending_commit(gid)
    assert bob.receive(_ev(added.evolution_event_json)).type == "commit"
    carol.accept(added.welcome_rumors_json[0])
    assert sorted(bob.members(gid)) == sorted([alice.pubkey, bob.account, carol.pubkey])
    updated = alice.mdk.self_update(gid)
    alice.mdk.merge_pending_commit(gid)
    assert bob.receive(_ev(updated.evolution_event_json)).epoch == alice.mdk.get_group(gid).epoch
    removed = alice.mdk.remove_members(gid, [carol.pubkey])
    alice.mdk.merge_pending_commit(gid)
    assert bob.receive(_ev(removed.evolution_event_json)).type == "commit"
    assert sorted(bob.members(gid)) == sorted([alice.pubkey, bob.account])

    # MDK processes the appliance's commit (a self-update).
    commit, _ = bob.commit(gid)
    assert alice.mdk.process_message(commit.to_json()).is_commit()
    assert alice.mdk.get_group(gid).epoch == bob.group(gid).epoch
    got = bob.receive(_ev(alice.mdk.create_message(gid, alice.pubkey, "after your update", 9, None, None)))
    assert got.rumor["content"] == "after your update"


def test_mdk_adds_the_appliance_to_an_existing_group(tmp_path):
    alice, carol = MdkPeer(tmp_path, "alice"), MdkPeer(tmp_path, "carol")
    bob = Device(generate_secret())
    created = alice.mdk.create_group(alice.pubkey, [carol.key_package_event()], "g", "", [RELAY], [alice.pubkey])
    gid = created.group.mls_group_id
    carol.accept(created.welcome_rumors_json[0])
    added = alice.mdk.add_members(gid, [bob.new_key_package([RELAY]).to_json()])
    alice.mdk.merge_pending_commit(gid)
    carol.mdk.process_message(added.evolution_event_json)
    assert bob.join(orjson.loads(added.welcome_rumors_json[0])) == gid
    ours = bob.send(gid, "joined late")
    for peer in (alice, carol):
        r = peer.mdk.process_message(ours.to_json())
        assert orjson.loads(r.message.event_json)["content"] == "joined late"


def test_a_welcome_for_someone_else_is_refused(tmp_path):
    alice = MdkPeer(tmp_path, "alice")
    bob, mallory = Device(generate_secret()), Device(generate_secret())
    mallory.new_key_package([RELAY])
    created = alice.mdk.create_group(alice.pubkey, [bob.new_key_package([RELAY]).to_json()], "g", "", [RELAY],
                                     [alice.pubkey])
    with pytest.raises(Exception) as e:
        mallory.join(orjson.loads(created.welcome_rumors_json[0]))
    assert getattr(e.value, "code", "") == "welcome.not_ours"
