"""The MLS core against OpenMLS through MDK 0.8.0 (mdk-python), in process (no relay here: the
through-the-relay flows are in test_mdk_relay.py). Skips with the reason when MDK cannot load.

MDK groups carry their data in GroupContext extension 0xf2ee (unknown to the core, kept byte for
byte) and require it in required_capabilities; our leaf advertises what MDK's key packages do.
"""

from __future__ import annotations

import json
import os

from appliance.marmot import transport as tp
from appliance.marmot.mls import Capabilities, Extension, create_key_package, join_from_welcome, key_package_ref
from appliance.marmot.mls.structs import WF_PRIVATE_MESSAGE
from appliance.nostr.event import parse_event, sign_event
from appliance.nostr.keys import generate_secret, public_key

from .mdk_harness import mdk_or_skip

RELAY = "wss://relay.example"
MDK_CAPS = Capabilities(extensions=(0x000A, 0xF2EE), proposals=(0x000A,))


def event_key(group) -> bytes:
    return group.export_secret(b"marmot", b"group-event", 32)


def unwrap(group, event_json: str) -> bytes:
    return tp.decrypt_group_message(event_key(group), parse_event(json.loads(event_json)))


def test_core_joins_and_follows_an_mdk_group_and_mdk_follows_us(tmp_path):
    mdk = mdk_or_skip()
    alice_sk = generate_secret()
    alice_pk = public_key(alice_sk)
    alice = mdk.new_mdk_with_key(str(tmp_path / "alice.db"), os.urandom(32), None)
    carol = mdk.new_mdk_with_key(str(tmp_path / "carol.db"), os.urandom(32), None)
    bob_sk = generate_secret()
    bob_pk = public_key(bob_sk)
    secrets = create_key_package(bytes.fromhex(bob_pk), capabilities=MDK_CAPS, extensions=[Extension(0x000A, b"")])
    kp_event = tp.build_key_package_event(bob_sk, secrets.key_package.encode(),
                                          key_package_ref=key_package_ref(secrets.key_package), ciphersuite=1,
                                          extensions=[0x000A, 0xF2EE], proposals=[0x000A], relays=[RELAY])
    created = alice.create_group(alice_pk, [kp_event.to_json()], "interop", "core", [RELAY], [alice_pk])
    gid, nostr_group_id = created.group.mls_group_id, bytes.fromhex(created.group.nostr_group_id)
    alice.merge_pending_commit(gid)
    welcome = tp.parse_welcome_rumor(json.loads(created.welcome_rumors_json[0])).welcome
    bob = join_from_welcome(welcome, secrets)
    assert bob.epoch == alice.get_group(gid).epoch
    assert bob.context.extension(0xF2EE) is not None  # MDK's group data, kept as is

    # MDK -> core: an application message
    sent = alice.create_message(gid, alice_pk, "hello from MDK", 9, None, None)
    got = bob.process(unwrap(bob, sent))
    bob = got.group
    assert json.loads(got.application_data)["content"] == "hello from MDK"

    # MDK commits: self-update, add (a second MDK client), remove
    update = alice.self_update(gid)
    alice.merge_pending_commit(gid)
    bob = bob.process(unwrap(bob, update.evolution_event_json)).group
    carol_sk = generate_secret()
    carol_pk = public_key(carol_sk)
    carol_kp = carol.create_key_package_for_event(carol_pk, [RELAY])
    carol_event = sign_event(carol_sk, 30443, carol_kp.tags, carol_kp.key_package)
    added = alice.add_members(gid, [carol_event.to_json()])
    alice.merge_pending_commit(gid)
    bob = bob.process(unwrap(bob, added.evolution_event_json)).group
    assert len(bob.members()) == 3
    removed = alice.remove_members(gid, [carol_pk])
    alice.merge_pending_commit(gid)
    bob = bob.process(unwrap(bob, removed.evolution_event_json)).group
    assert len(bob.members()) == 2
    assert bob.epoch == alice.get_group(gid).epoch

    # core -> MDK: a commit (PrivateMessage) and an application message
    out = bob.commit(wire_format=WF_PRIVATE_MESSAGE)
    alice.process_message(tp.encrypt_group_message(event_key(bob), nostr_group_id, out.message).to_json())
    bob = out.group
    assert alice.get_group(gid).epoch == bob.epoch
    rumor = {"id": "00" * 32, "pubkey": bob_pk, "created_at": 1, "kind": 9, "tags": [], "content": "hi MDK"}
    bob, ct = bob.encrypt(json.dumps(rumor).encode())
    result = alice.process_message(tp.encrypt_group_message(event_key(bob), nostr_group_id, ct).to_json())
    assert "hi MDK" in str(result)
