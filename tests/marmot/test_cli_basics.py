"""`appliance marmot ...` commands that need no MLS group: the draft switch, JSON output and errors,
device labels, pairing keys, inspect."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from appliance.cli import main
from appliance.commands.marmot import DRAFT_LABEL
from appliance.marmot import proofs
from appliance.nostr.keys import generate_secret
from appliance.nostr.nip19 import encode_key


def run(capsys, *argv) -> tuple[int, dict]:
    rc = main(["marmot", *argv])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # exactly one JSON document
    return rc, json.loads(lines[0])


@pytest.fixture
def identity(tmp_path):
    secret = generate_secret()
    path = tmp_path / "id.nsec"
    path.write_text(encode_key(bytes.fromhex(secret), "nsec") + "\n")
    return secret, str(path)


def test_draft_commands_need_the_switch(capsys, tmp_path, identity, monkeypatch):
    monkeypatch.delenv("APPLIANCE_MARMOT_DRAFT_MULTI_DEVICE", raising=False)
    rc, doc = run(capsys, "pairing-key", "--state", str(tmp_path / "s"))
    assert rc == 2 and doc["error"] == "draft.disabled"
    rc, doc = run(capsys, "pairing-key", "--state", str(tmp_path / "s"), "--draft-multi-device")
    assert rc == 0 and doc["draft"] == DRAFT_LABEL and len(doc["pairing_key"]) == 64
    # The setting works as well (environment here; a config file key or flag the same way).
    monkeypatch.setenv("APPLIANCE_MARMOT_DRAFT_MULTI_DEVICE", "true")
    rc, doc = run(capsys, "pairing-key", "--state", str(tmp_path / "s"))
    assert rc == 0 and doc["draft"] == DRAFT_LABEL
    keys = os.listdir(tmp_path / "s" / "pairing" / "keys")
    assert len(keys) == 2
    assert all(oct(os.stat(tmp_path / "s" / "pairing" / "keys" / k).st_mode)[-3:] == "600" for k in keys)
    # The private half never reaches stdout.
    record = json.loads((tmp_path / "s" / "pairing" / "keys" / keys[0]).read_text())
    assert record["private"] not in capsys.readouterr().out


def test_device_label_round_trip(capsys, tmp_path, identity):
    secret, path = identity
    rc, doc = run(capsys, "encrypt-device-label", "--identity", path, "--label", "work laptop",
                  "--draft-multi-device")
    assert rc == 0 and doc["extension_type"] == "0xf2ef" and doc["draft"] == DRAFT_LABEL
    out = tmp_path / "label.json"
    out.write_text(json.dumps(doc))
    rc, doc = run(capsys, "decrypt-device-label", "--identity", path, "--input", str(out), "--draft-multi-device")
    assert rc == 0 and doc["label"] == "work laptop"
    other = tmp_path / "other"
    other.write_text(generate_secret())
    rc, doc = run(capsys, "decrypt-device-label", "--identity", str(other), "--input", str(out),
                  "--draft-multi-device")
    assert rc == 2 and doc["error"] == "device_label.decrypt"
    rc, doc = run(capsys, "inspect", "--input", str(out), "--as", "device-label")
    assert rc == 0 and doc["name"] == "marmot.encrypted-device-name.v1" and "work laptop" not in json.dumps(doc)


def test_bad_identity(capsys, tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("npub1notasecret")
    rc, doc = run(capsys, "encrypt-device-label", "--identity", str(bad), "--label", "x", "--draft-multi-device")
    assert rc == 2 and doc["error"] == "identity.invalid"
    rc, doc = run(capsys, "encrypt-device-label", "--label", "x", "--draft-multi-device")
    assert rc == 2 and doc["error"] == "identity.missing"


def test_inspect_proof_and_events(capsys, tmp_path):
    data = tmp_path / "proof"
    data.write_text("f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9000000006553f100c5315d3c85b9"
                    "d4907cb03395a2a97b3ba2eab393f8e45b13a5d5233acedac60a51d2a295e1b1b5ee372d18a49bdb8041a7dba9"
                    "dedce722c7c6f712f78bbdfb5d")
    rc, doc = run(capsys, "inspect", "--input", str(data))
    assert rc == 0 and doc["type"] == "MarmotAuthorizationProof" and doc["created_at"] == 1700000000
    from appliance.marmot import transport as tp

    ev = tp.encrypt_group_message(bytes(32), bytes(range(32)), b"mls")
    path = tmp_path / "ev.json"
    path.write_text(ev.to_json())
    rc, doc = run(capsys, "inspect", "--input", str(path))
    assert rc == 0 and doc == {"type": "group-message", "kind": 445, "h": bytes(range(32)).hex(),
                               "one_time_pubkey": ev.pubkey, "ciphertext_bytes": 3 + 16}
    garbage = tmp_path / "g"
    garbage.write_text("00ff")
    rc, doc = run(capsys, "inspect", "--input", str(garbage))
    assert rc == 2 and doc["error"] == "usage"
    assert proofs.PROOF_LEN == 104


def test_the_installed_command(tmp_path):
    """The real entry point: one JSON line on stdout, the reason on stderr, exit status 2."""
    proc = subprocess.run([sys.executable, "-m", "appliance", "marmot", "pairing-key", "--state", str(tmp_path)],
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                               if not k.startswith("APPLIANCE_")})
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"] == "draft.disabled"
    assert "draft" in proc.stderr


def test_inspect_mls_objects(capsys, tmp_path, identity):
    from appliance.marmot.device import Device
    from appliance.marmot import multidevice as md

    secret, path = identity
    dev = Device(secret)
    kp = dev.new_key_package(["ws://127.0.0.1:7777"])
    kp_file = tmp_path / "kp.json"
    kp_file.write_text(kp.to_json())
    rc, doc = run(capsys, "inspect", "--input", str(kp_file))
    assert rc == 0 and doc["key_package"]["leaf"]["account"] == dev.account
    assert doc["key_package"]["leaf"]["account_identity_proof"] == "valid"
    gid, _ = dev.create_group("g", ["ws://127.0.0.1:7777"], [], multi_device=True)
    group = dev.group(gid)
    gi = tmp_path / "gi.json"
    gi.write_text(json.dumps({"group_info": __import__("base64").b64encode(group.group_info()).decode()}))
    rc, doc = run(capsys, "inspect", "--input", str(gi), "--as", "group-info")
    assert rc == 0 and doc["context"]["group_id"] == gid and doc["context"]["admins"] == [dev.account]
    assert doc["context"]["join_psk_id"] == md.join_psk_id(group.group_context_bytes()).hex()
    psk = tmp_path / "psk"
    psk.write_text(md.join_psk_id(group.group_context_bytes()).hex())
    rc, doc = run(capsys, "inspect", "--input", str(psk), "--as", "join-psk-id")
    assert rc == 0 and doc["label"] == "marmot.multi-device.join-psk.v1"


def test_only_the_draft_switch_advertises_the_draft_feature(capsys, tmp_path, identity, monkeypatch):
    """Without the switch a key package claims no part of the draft multi-device feature (no 0xf2f0,
    0xf2ef, AppEphemeral 0x0009, component 0x800a): a device that would refuse the draft's External
    Commits must not look able to process them (the signaling gate trusts what leaves advertise)."""
    monkeypatch.delenv("APPLIANCE_MARMOT_DRAFT_MULTI_DEVICE", raising=False)
    secret, path = identity
    draft_bits = {"0xf2ef", "0xf2f0"}

    def key_package(*flags):
        rc, ev = run(capsys, "key-package", "--state", str(tmp_path / "s"), "--identity", path,
                     "--relay", "ws://127.0.0.1:7777", *flags)
        assert rc == 0
        out = tmp_path / "kp.json"
        out.write_text(json.dumps({k: v for k, v in ev.items() if k != "draft"}))
        rc, seen = run(capsys, "inspect", "--input", str(out))
        assert rc == 0
        tags = {t[0]: t[1:] for t in ev["tags"]}
        return ev, tags, seen["key_package"]["leaf"]["capabilities"]

    ev, tags, caps = key_package()
    assert "draft" not in ev
    assert not draft_bits & set(tags["mls_extensions"]) and not draft_bits & set(caps["extensions"])
    assert "0x0009" not in caps["proposals"]
    from appliance.marmot import profile, transport
    from appliance.marmot.mls import parse_key_package
    from appliance.nostr.event import parse_event

    kp = parse_key_package(transport.parse_key_package_event(parse_event(
        {k: v for k, v in ev.items() if k != "draft"})).key_package)
    assert 0x800A not in profile.supported_components(kp.leaf_node)
    ev, tags, caps = key_package("--draft-multi-device")
    assert ev["draft"] == DRAFT_LABEL
    assert draft_bits <= set(tags["mls_extensions"]) and draft_bits <= set(caps["extensions"])
    assert "0x0009" in caps["proposals"]


def test_every_draft_refusal_names_the_flag_and_the_setting(capsys, tmp_path, identity, monkeypatch):
    """Each draft command without the switch, a draft option, an External Commit received without
    it, and a key package without the draft invited into a draft group: the refusal says how to turn
    the draft on, by flag and by setting."""
    from appliance.commands.marmot import COMMANDS
    from appliance.marmot.device import Device

    monkeypatch.delenv("APPLIANCE_MARMOT_DRAFT_MULTI_DEVICE", raising=False)
    secret, path = identity

    def names_both(doc):
        assert "--draft-multi-device" in doc["message"] and "marmot_draft_multi_device" in doc["message"], doc

    drafts = sorted(name for name, (_, draft) in COMMANDS.items() if draft)
    assert {"pairing-key", "pairing-seal", "join-request", "authorize-join", "external-commit"} <= set(drafts)
    for name in drafts:
        argv = ([] if name in ("encrypt-device-label", "decrypt-device-label") else ["--state", str(tmp_path / "s")]) \
            + ([] if name in ("pairing-key", "pairing-open") else ["--identity", path])
        rc, doc = run(capsys, name, *argv)
        assert rc == 2 and doc["error"] == "draft.disabled", name
        names_both(doc)
    rc, doc = run(capsys, "key-package", "--state", str(tmp_path / "s"), "--identity", path,
                  "--relay", "ws://127.0.0.1:7777", "--device-label", "phone")
    assert rc == 2 and doc["error"] == "draft.disabled"
    names_both(doc)
    # A key package made without the switch, invited into a draft group.
    plain = Device(generate_secret()).new_key_package(["ws://127.0.0.1:7777"])
    kp = tmp_path / "kp.json"
    kp.write_text(plain.to_json())
    rc, doc = run(capsys, "create-group", "--state", str(tmp_path / "s"), "--identity", path, "--relay",
                  "ws://127.0.0.1:7777", "--member-key-package", str(kp), "--draft-multi-device")
    assert rc == 2 and doc["error"] == "component.unsupported"
    names_both(doc)
    # An External Commit reaching a member without the switch.
    from appliance.marmot import multidevice as md
    from appliance.marmot import transport as tp

    alice, bob = Device(generate_secret()), Device(generate_secret())
    gid, rumors = alice.create_group("g", ["ws://127.0.0.1:7777"],
                                     [bob.new_key_package(["ws://127.0.0.1:7777"], draft=True)], multi_device=True)
    bob.join(rumors[0])
    g = alice.group(gid)
    _, psk = md.join_psk(g)
    pending, leaf = md.prepare_external_join(alice.secret, g.group_info(), psk, group_event_key=md.group_event_key(g))
    ev = alice.finish_external_join(pending, md.authorize_join(alice.secret, g.context, leaf))
    bob_state = tmp_path / "bob"
    (bob_state / "device").mkdir(parents=True)
    (bob_state / "device" / "state.json").write_text(json.dumps(bob.to_json()))
    bob_key = tmp_path / "bob.key"
    bob_key.write_text(bob.secret)
    event = tmp_path / "ext.json"
    event.write_text(ev.to_json())
    rc, doc = run(capsys, "receive", "--state", str(bob_state), "--identity", str(bob_key), "--event", str(event))
    assert rc == 2 and doc["error"] == "draft.disabled"
    names_both(doc)
