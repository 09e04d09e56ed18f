"""`appliance marmot` flows without a relay: proposals on receive, a stale join request, pairing
material that expires, and single use of a pairing envelope."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from appliance.cli import main
from appliance.marmot import pairing
from appliance.marmot import transport as tp
from appliance.marmot.device import Device
from appliance.marmot.multidevice import group_event_key
from appliance.nostr.event import parse_event
from appliance.nostr.keys import generate_secret, public_key

RELAY = "ws://127.0.0.1:7777"


class Cli:
    def __init__(self, tmp_path, name, secret=None):
        self.tmp, self.name = tmp_path, name
        self.secret = secret or generate_secret()
        self.identity = tmp_path / f"{name}.key"
        self.identity.write_text(self.secret)
        self.state = tmp_path / f"state-{name}"

    def __call__(self, command, *args, ok=True, identity=True):
        out = io.StringIO()
        argv = ["marmot", command, "--state", str(self.state)]
        if identity:
            argv += ["--identity", str(self.identity)]
        with contextlib.redirect_stdout(out):
            rc = main([*argv, *args])
        doc = json.loads(out.getvalue())
        assert (rc == 0) == ok, (command, doc)
        return doc

    def file(self, what, doc):
        path = self.tmp / f"{self.name}-{what}.json"
        path.write_text(json.dumps(doc))
        return str(path)


@pytest.fixture
def group(tmp_path):
    alice, bob = Cli(tmp_path, "alice"), Cli(tmp_path, "bob")
    kp = bob("key-package", "--relay", RELAY, "--draft-multi-device")
    created = alice("create-group", "--name", "g", "--relay", RELAY, "--draft-multi-device",
                    "--member-key-package", alice.file("kp", kp))
    bob("join", "--welcome", bob.file("welcome", created["welcomes"][0]))
    return alice, bob, created["group_id"]


def test_receive_reports_a_proposal(group, tmp_path):
    alice, bob, gid = group
    device = Device.from_json(bob.secret, json.loads((bob.state / "device" / "state.json").read_text()))
    g = device.group(gid)
    _, message = g.propose_update()
    ev = tp.encrypt_group_message(group_event_key(g), bytes.fromhex(device.groups[gid]["h"]), message)
    got = alice("receive", "--event", alice.file("proposal", ev.to_dict()))
    assert got == {"draft": got["draft"], "type": "proposal", "group_id": gid, "epoch": 1, "sender": device.account}


def test_a_join_request_for_an_old_epoch_is_not_authorized(group, tmp_path):
    alice, bob, gid = group
    alice2 = Cli(tmp_path, "alice2", alice.secret)
    key = alice2("pairing-key", "--draft-multi-device", identity=False)["pairing_key"]
    sealed = alice("pairing-seal", "--recipient", key, "--group", gid, "--draft-multi-device")
    alice2("pairing-open", "--envelope", alice2.file("env", sealed), "--draft-multi-device", identity=False)
    request = alice2("join-request", "--group", gid, "--draft-multi-device")
    # The group moves on (Bob updates his leaf; Alice processes it) before the admin is asked.
    commit = bob("commit", "--group", gid)["commit"]
    alice("receive", "--event", alice.file("c", commit))
    refused = alice("authorize-join", "--request", alice.file("req", request), "--draft-multi-device", ok=False)
    assert refused["error"] == "multi_device.stale_request"


def test_pairing_material_expires_and_is_purged(group, tmp_path, monkeypatch):
    alice, bob, gid = group
    alice2 = Cli(tmp_path, "alice2", alice.secret)
    key = alice2("pairing-key", "--draft-multi-device", identity=False)["pairing_key"]
    sealed = alice("pairing-seal", "--recipient", key, "--group", gid, "--validity", "60", "--draft-multi-device")
    assert sealed["not_after"] - pairing.DEFAULT_PAIRING_VALIDITY < sealed["not_after"]
    too_long = alice("pairing-seal", "--recipient", key, "--group", gid, "--validity", "601",
                     "--draft-multi-device", ok=False)
    assert too_long["error"] == "pairing.validity"
    opened = alice2("pairing-open", "--envelope", alice2.file("env", sealed), "--draft-multi-device",
                    identity=False)
    assert (alice2.state / "pairing" / "groups" / f"{gid}.json").exists()
    # Past the window, the next run deletes the opened entry; the group cannot be joined from it.
    import time as _time

    later = opened["expires_at"] + 1
    monkeypatch.setattr(_time, "time", lambda: later)
    refused = alice2("join-request", "--group", gid, "--draft-multi-device", ok=False)
    assert refused["error"] == "pairing.no_entry"
    assert not (alice2.state / "pairing" / "groups" / f"{gid}.json").exists()


def test_pairing_key_without_draft_and_bad_inputs(group, tmp_path):
    alice, bob, gid = group
    refused = alice("group-info", "--group", gid, ok=False)
    assert refused["error"] == "draft.disabled"
    psk = alice("join-psk", "--group", gid, "--draft-multi-device")
    assert "join_psk" not in psk and psk["join_psk_id"].startswith("1f")
    assert len(alice("join-psk", "--group", gid, "--draft-multi-device", "--show-secrets")["join_psk"]) == 64
    bad = alice("send", "--group", "00" * 32, "--content", "x", ok=False)
    assert bad["error"] == "state.unknown_group"


def _stateless(command, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["marmot", command, *args]) == 0
    return json.loads(out.getvalue())


def test_draft_objects_and_draft_groups_are_labelled(group, tmp_path):
    """Every output about the draft feature carries the draft label: inspect of draft objects (pairing
    envelope, 0xf2f0/0xf2ef bodies, join PSK ids, a draft group's context) and commits or messages
    received in a group created with the draft switch; ordinary objects are not labelled."""
    from appliance.commands.marmot import DRAFT_LABEL

    alice, bob, gid = group
    alice2 = Cli(tmp_path, "alice2", alice.secret)
    key = alice2("pairing-key", "--draft-multi-device", identity=False)["pairing_key"]
    sealed = alice("pairing-seal", "--recipient", key, "--group", gid, "--draft-multi-device")
    psk = alice("join-psk", "--group", gid, "--draft-multi-device")
    info = alice("group-info", "--group", gid, "--draft-multi-device")
    label = _stateless("encrypt-device-label", "--identity", str(alice.identity), "--label", "phone",
                       "--draft-multi-device")
    objects = {"pairing-envelope": sealed, "join-psk-id": psk, "group-info": info, "device-label": label,
               "multi-device-extension": {"extension_data": "0001"}}
    for as_type, doc in objects.items():
        shown = _stateless("inspect", "--input", alice.file(as_type, doc), "--as", as_type)
        assert shown.get("draft") == DRAFT_LABEL, as_type
    # A group made without the switch: its context is not draft, and shows no join PSK id.
    carol = Cli(tmp_path, "carol")
    plain = carol("create-group", "--relay", RELAY)["group_id"]
    device = Device.from_json(carol.secret, json.loads((carol.state / "device" / "state.json").read_text()))
    import base64

    doc = {"group_info": base64.b64encode(device.group(plain).group_info()).decode()}
    shown = _stateless("inspect", "--input", carol.file("gi", doc), "--as", "group-info")
    assert "draft" not in shown and "join_psk_id" not in shown["context"]
    # Commits and messages of the draft group are labelled; the event itself stays publishable.
    commit = bob("commit", "--group", gid)
    assert commit["draft"] == DRAFT_LABEL and "draft" not in commit["commit"]
    got = alice("receive", "--event", alice.file("c", commit["commit"]))
    assert got["draft"] == DRAFT_LABEL and got["type"] == "commit"
    sent = alice("send", "--group", gid, "--content", "hi")
    assert sent["draft"] == DRAFT_LABEL  # beside the kind 445 event's fields; receive drops it
    got = bob("receive", "--event", bob.file("m", sent))
    assert got["draft"] == DRAFT_LABEL and got["rumor"]["content"] == "hi"


def _request(gid, context, leaf) -> dict:
    import base64

    return {"group_id": gid, "group_context": base64.b64encode(context.encode()).decode(),
            "leaf_node": base64.b64encode(leaf.encode()).decode()}


def test_authorize_join_reviews_the_leaf_before_signing(group, tmp_path):
    """The admin checks the joining leaf as every member will (its 0x8009 proof, its account, the
    components and capabilities the group requires, its signature) and signs nothing otherwise."""
    import dataclasses

    from appliance.marmot import components as comp
    from appliance.marmot import mls, multidevice, profile
    from appliance.marmot.mls.structs import Extension

    alice, bob, gid = group
    device = Device.from_json(alice.secret, json.loads((alice.state / "device" / "state.json").read_text()))
    g = device.group(gid)
    _, psk = multidevice.join_psk(g)
    context = g.context

    def refused(request, code):
        doc = alice("authorize-join", "--request", alice.file("req", request), "--draft-multi-device", ok=False)
        assert doc["error"] == code, doc
        assert "proof" not in doc and "event" not in doc and "nothing signed" in doc["message"]
        return doc

    # A second device of Alice: its leaf is fine, and is authorized.
    _, leaf = multidevice.prepare_external_join(alice.secret, g.group_info(), psk)
    ok = alice("authorize-join", "--request", alice.file("req", _request(gid, context, leaf)), "--draft-multi-device")
    assert ok["event"]["kind"] == 452 and len(ok["proof"]) == 208
    # Its kind 450 proof tampered with (one bit of the signature): refused, with the reason.
    data = dict(profile.app_data(leaf.extensions))
    proof = bytearray(data[comp.ACCOUNT_IDENTITY_PROOF])
    proof[-1] ^= 1
    data[comp.ACCOUNT_IDENTITY_PROOF] = bytes(proof)
    bad = dataclasses.replace(leaf, extensions=(Extension(0x0006, mls.encode_app_data_dictionary(sorted(data.items()))),
                                                *leaf.extensions[1:]))
    doc = refused(_request(gid, context, bad), "multi_device.account_proof")
    assert "0x8009" in doc["message"]
    # The leaf's own signature broken (another encryption key after signing).
    refused(_request(gid, context, dataclasses.replace(leaf, encryption_key=bytes(32))), "multi_device.mls")
    # A device of an account with no leaf in the group.
    stranger = generate_secret()
    _, leaf = multidevice.prepare_external_join(stranger, g.group_info(), psk)
    refused(_request(gid, context, leaf), "multi_device.unknown_account")
    # A leaf that does not list the draft's component 0x800a among its app components.
    sig_priv, sig_pub = mls.crypto.signature_keypair()
    pending = mls.prepare_external_join(g.group_info(), profile.credential_of(alice.secret), sig_priv,
                                        capabilities=profile.leaf_capabilities(draft=True),
                                        leaf_extensions=profile.leaf_extensions(alice.secret, sig_pub),
                                        external_psks={multidevice.join_psk_id(context.encode()): psk})
    doc = refused(_request(gid, context, pending.leaf_node), "component.unsupported")
    assert "0x800a" in doc["message"] and "--draft-multi-device" in doc["message"]


def test_inspect_recognises_every_output_without_as(group, tmp_path):
    """`inspect --input FILE` with no --as names each of the commands' own outputs (pairing envelopes,
    join requests, authorizations, events, rumors, command documents) and raw MLS messages; what
    belongs to the draft, or came labelled from a draft group, is labelled."""
    import base64

    from appliance.commands.marmot import DRAFT_LABEL
    from appliance.marmot import multidevice

    alice, bob, gid = group
    alice2 = Cli(tmp_path, "alice2", alice.secret)

    def seen(doc, name="doc"):
        path = tmp_path / f"inspect-{name}.json"
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        return _stateless("inspect", "--input", str(path))

    key = alice2("pairing-key", "--draft-multi-device", identity=False)
    sealed = alice("pairing-seal", "--recipient", key["pairing_key"], "--group", gid, "--draft-multi-device")
    opened = alice2("pairing-open", "--envelope", alice2.file("env", sealed), "--draft-multi-device", identity=False)
    request = alice2("join-request", "--group", gid, "--draft-multi-device")
    auth = alice("authorize-join", "--request", alice.file("req", request), "--draft-multi-device")
    external = alice2("external-commit", "--group", gid, "--authorization", alice2.file("auth", auth),
                      "--draft-multi-device")
    bob("receive", "--event", bob.file("ext", external["commit"]), "--draft-multi-device")
    sent = alice2("send", "--group", gid, "--content", "from the new device")
    received = bob("receive", "--event", bob.file("msg", sent))
    kp = Cli(tmp_path, "carol")("key-package", "--relay", RELAY)
    created = alice("create-group", "--relay", RELAY, "--member-key-package", alice.file("kp", kp))
    wrap = _stateless("gift-wrap", "--identity", str(alice.identity), "--rumor",
                      alice.file("rumor", created["welcomes"][0]), "--to", kp["pubkey"])
    cases = [(key, "pairing-key", True), (sealed, "MarmotPairingEnvelopeV1", True),
             (opened, "pairing-opened", True), (request, "join-request", True),
             (auth, "join-authorization", True), (auth["event"], "proof-signing-event", True),
             (external, "output", True), (sent, "group-message", True), (received, "received", True),
             (received["rumor"], "rumor", False), (kp, "key-package-event", False), (created, "output", False),
             (created["welcomes"][0], "welcome-rumor", False), (wrap, "gift-wrap", False)]
    for doc, expected, draft in cases:
        shown = seen(doc, expected)
        assert shown["type"] == expected, (expected, shown)
        assert (shown.get("draft") == DRAFT_LABEL) == draft, (expected, shown)
    shown = seen(auth)
    assert shown["matches_event"] is True and shown["signer"] == public_key(alice.secret)
    assert shown["account"] == public_key(alice.secret) and shown["kind"] == 452
    assert seen(request)["leaf"]["account_identity_proof"] == "valid"
    assert seen(received)["rumor"]["content"] == "from the new device"
    # Raw MLS messages and Marmot bytes, hex or base64.
    device = Device.from_json(alice.secret, json.loads((alice.state / "device" / "state.json").read_text()))
    g = device.group(gid)
    welcome = tp.parse_welcome_rumor(created["welcomes"][0]).welcome
    commit = g.commit().message
    key_package = tp.parse_key_package_event(parse_event(kp)).key_package
    raw = [(base64.b64encode(welcome).decode(), "MLSMessage", "Welcome"), (commit.hex(), "MLSMessage", "PublicMessage"),
           (base64.b64encode(g.group_info()).decode(), "GroupInfo", None), (key_package.hex(), "KeyPackage", None),
           (g.own_leaf_node.encode().hex(), "LeafNode", None), (g.group_context_bytes().hex(), "GroupContext", None),
           (multidevice.join_psk_id(g.group_context_bytes()).hex(), "MarmotMultiDeviceJoinPskId", None),
           (sealed["envelope"], "MarmotPairingEnvelopeV1", None), (auth["proof"], "MarmotAuthorizationProof", None)]
    for text, expected, wire in raw:
        shown = seen(text, expected)
        assert shown["type"] == expected, (expected, shown)
        if wire:
            assert shown["wire_format"] == wire


def test_inspect_recognises_every_receive_output_and_the_rest(group, tmp_path):
    """`receive` prints a document for a commit, a proposal and an External Commit as well as for an
    application message; `decrypt-device-label` and a refusal print documents too. inspect names each
    without --as (before, all but the application message were 'cannot tell what this JSON document
    is'); those of the draft group keep the draft label."""
    from appliance.commands.marmot import DRAFT_LABEL

    alice, bob, gid = group

    def seen(doc, name):
        path = tmp_path / f"inspect-{name}.json"
        path.write_text(json.dumps(doc))
        return _stateless("inspect", "--input", str(path))

    got_commit = alice("receive", "--event", alice.file("c", bob("commit", "--group", gid)["commit"]))
    device = Device.from_json(bob.secret, json.loads((bob.state / "device" / "state.json").read_text()))
    g = device.group(gid)
    _, message = g.propose_update()
    ev = tp.encrypt_group_message(group_event_key(g), bytes.fromhex(device.groups[gid]["h"]), message)
    got_proposal = alice("receive", "--event", alice.file("proposal", ev.to_dict()))
    alice2 = Cli(tmp_path, "alice2", alice.secret)
    key = alice2("pairing-key", "--draft-multi-device", identity=False)["pairing_key"]
    sealed = alice("pairing-seal", "--recipient", key, "--group", gid, "--draft-multi-device")
    alice2("pairing-open", "--envelope", alice2.file("env", sealed), "--draft-multi-device", identity=False)
    request = alice2("join-request", "--group", gid, "--draft-multi-device")
    auth = alice("authorize-join", "--request", alice.file("req", request), "--draft-multi-device")
    external = alice2("external-commit", "--group", gid, "--authorization", alice2.file("auth", auth),
                      "--draft-multi-device")
    got_external = bob("receive", "--event", bob.file("ext", external["commit"]), "--draft-multi-device")
    for got, message_type in ((got_commit, "commit"), (got_proposal, "proposal"), (got_external, "commit")):
        assert got["type"] == message_type and got["draft"] == DRAFT_LABEL
        shown = seen(got, message_type)
        assert shown["type"] == "received" and shown["message_type"] == message_type, shown
        assert shown["group_id"] == gid and shown["epoch"] == got["epoch"] and shown["sender"] == got["sender"]
        assert shown["draft"] == DRAFT_LABEL
    assert seen(got_external, "external")["external_join"] is True
    # Received in an ordinary group: not labelled.
    carol, dave = Cli(tmp_path, "carol"), Cli(tmp_path, "dave")
    created = carol("create-group", "--relay", RELAY, "--member-key-package",
                    carol.file("kp", dave("key-package", "--relay", RELAY)))
    dave("join", "--welcome", dave.file("w", created["welcomes"][0]))
    got = carol("receive", "--event", carol.file("c", dave("commit", "--group", created["group_id"])["commit"]))
    shown = seen(got, "plain")
    assert shown["message_type"] == "commit" and "draft" not in shown
    # decrypt-device-label's document, and a refusal's.
    sealed_label = _stateless("encrypt-device-label", "--identity", str(alice.identity), "--label", "phone",
                              "--draft-multi-device")
    opened = _stateless("decrypt-device-label", "--identity", str(alice.identity), "--input",
                        alice.file("label", sealed_label), "--draft-multi-device")
    shown = seen(opened, "opened-label")
    assert shown["type"] == "device-label-opened" and shown["label"] == "phone" and shown["draft"] == DRAFT_LABEL
    refusal = alice("send", "--group", "00" * 32, "--content", "x", ok=False)
    shown = seen(refusal, "refusal")
    assert shown == {"type": "refusal", "error": "state.unknown_group", "message": refusal["message"]}


def test_a_draft_groups_welcomes_and_their_gift_wraps_are_labelled(tmp_path):
    """A welcome into a draft group carries the draft's bytes (its GroupInfo has 0xf2f0): each welcome
    rumor create-group and commit print for a draft group carries the label beside its fields, and so
    does the gift wrap made of it (drop the label before publishing, as for send); join and gift-wrap
    read labelled rumors. Welcomes of ordinary groups are not labelled."""
    from appliance.commands.marmot import DRAFT_LABEL

    alice, bob, carol = Cli(tmp_path, "alice"), Cli(tmp_path, "bob"), Cli(tmp_path, "carol")
    kp = bob("key-package", "--relay", RELAY, "--draft-multi-device")
    created = alice("create-group", "--relay", RELAY, "--draft-multi-device", "--member-key-package",
                    alice.file("kp", kp))
    [rumor] = created["welcomes"]
    assert rumor["draft"] == DRAFT_LABEL and rumor["kind"] == 444
    wrap = _stateless("gift-wrap", "--identity", str(alice.identity), "--rumor", alice.file("rumor", rumor),
                      "--to", kp["pubkey"])
    assert wrap.pop("draft") == DRAFT_LABEL and wrap["kind"] == 1059
    parse_event(wrap)  # what is left is the publishable event
    gid = created["group_id"]
    assert bob("join", "--welcome", bob.file("wrap", wrap))["group_id"] == gid
    kp = carol("key-package", "--relay", RELAY, "--draft-multi-device")
    added = alice("commit", "--group", gid, "--add", alice.file("kp-carol", kp))
    assert added["draft"] == DRAFT_LABEL and "draft" not in added["commit"]
    [rumor] = added["welcomes"]
    assert rumor["draft"] == DRAFT_LABEL
    assert carol("join", "--welcome", carol.file("rumor", rumor))["group_id"] == gid  # the rumor itself, labelled
    # An ordinary group's welcome and its gift wrap: no label.
    dave = Cli(tmp_path, "dave")
    kp = dave("key-package", "--relay", RELAY)
    plain = alice("create-group", "--relay", RELAY, "--member-key-package", alice.file("kp-dave", kp))
    assert "draft" not in plain["welcomes"][0]
    wrap = _stateless("gift-wrap", "--identity", str(alice.identity), "--rumor",
                      alice.file("rumor-plain", plain["welcomes"][0]), "--to", kp["pubkey"])
    assert "draft" not in wrap
