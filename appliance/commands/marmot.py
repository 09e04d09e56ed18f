"""`appliance marmot ...`: Marmot groups and the draft multi-device join, from files and pipes.

Every command prints exactly one JSON document on stdout. Failures print
`{"error": CODE, "message": TEXT}` (and the message on stderr) and exit with status 2. Secrets
(private keys, exporter outputs, PSKs) are never printed unless a command is asked to with
`--show-secrets`. State lives in the directory named by `--state DIR` (see marmot_state.py).

The multi-device commands are a draft (shared/spec/marmot-multi-device.md): they run only with
`--draft-multi-device` or the `marmot_draft_multi_device` setting, and every output they produce
carries a `"draft"` label.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from appliance.errors import ApplianceError, ConfigError
from appliance.marmot import components as comp
from appliance.marmot import pairing as pair
from appliance.marmot import multidevice, profile, proofs, transport
from appliance.marmot.device import Device
from appliance.marmot.mls import MLSError
from appliance.marmot.mls import structs as st
from appliance.marmot.mls.structs import LeafNode as MlsLeafNode
from appliance.marmot.errors import DraftDisabled, MarmotError
from appliance.marmot.extensions import EncryptedDeviceName, MultiDeviceExtension
from appliance.nostr import nip59
from appliance.nostr.event import InvalidEvent, compute_id, parse_event, verify_event
from appliance.nostr.keys import public_key, schnorr_verify
from appliance.nostr.nip19 import Nip19Error, parse_secret
from appliance.settings import load

from .marmot_state import StateDir

DRAFT_LABEL = "marmot-multi-device draft: bytes are not final and must not be used for interop"

_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
# The fields in which commands print binary objects (inspect finds the object in any of them).
BLOB_FIELDS = ("extension_data", "proof", "envelope", "group_info", "leaf_node", "group_context", "join_psk_id",
               "component_data", "data")


class Failed(ApplianceError):
    """A command failure with a machine-readable code (printed as the JSON error document)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- input helpers ---------------------------------------------------------------------------------

def read_text(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise Failed("input.unreadable", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise Failed("input.unreadable", f"{path} is not UTF-8 text") from None


def load_identity(path: str | None) -> str:
    """The account's secret key (64 hex or nsec) from FILE, as 64 lowercase hex."""
    if not path:
        raise Failed("identity.missing", "this command needs --identity FILE (the account's secret key)")
    try:
        return parse_secret(read_text(path))
    except Nip19Error as exc:
        raise Failed("identity.invalid", f"{path}: {exc}") from None


def decode_blob(text: str, what: str) -> bytes:
    """Bytes written as hex or as standard base64 (whitespace around them ignored)."""
    text = text.strip()
    if _HEX.fullmatch(text):
        return bytes.fromhex(text)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Failed("input.encoding", f"{what} is neither hex nor base64") from None


def read_blob(path: str, what: str, field: str | None = None) -> bytes:
    """An object's bytes from FILE: hex, base64, or the JSON document a command printed (`field`)."""
    text = read_text(path)
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except ValueError:
            raise Failed("input.json", f"{path} is not valid JSON") from None
        fields = [field] if field else [f for f in BLOB_FIELDS if isinstance(doc, dict) and f in doc]
        if not fields or not isinstance(doc, dict) or not isinstance(doc.get(fields[0]), str):
            raise Failed("input.json", f"{path}: expected a JSON document with a {field or BLOB_FIELDS[0]!r} field")
        return decode_blob(doc[fields[0]], what)
    return decode_blob(stripped, what)


def read_json(path: str, what: str) -> Any:
    try:
        return json.loads(read_text(path))
    except ValueError:
        raise Failed("input.json", f"{path}: {what} is not valid JSON") from None


def read_unlabelled(path: str, what: str) -> tuple[Any, bool]:
    """A JSON object from FILE without the draft label a command printed beside an event's or a
    rumor's fields, and whether it carried one."""
    obj = read_json(path, what)
    if isinstance(obj, dict) and obj.get("draft") == DRAFT_LABEL:
        return {k: v for k, v in obj.items() if k != "draft"}, True
    return obj, False


def labelled(obj: dict[str, Any]) -> dict[str, Any]:
    """An event or rumor of a draft group with the draft label beside its fields (drop it to publish)."""
    return {"draft": DRAFT_LABEL, **obj}


def read_event(path: str, what: str = "event"):
    """A Nostr event from FILE; the draft label a command printed beside its fields is dropped."""
    obj, _ = read_unlabelled(path, what)
    try:
        return parse_event(obj)
    except InvalidEvent as exc:
        raise Failed("input.event", f"{path}: {what}: {exc.reason}") from None


# -- output --------------------------------------------------------------------------------------

def emit(doc: dict[str, Any], draft: bool = False) -> int:
    if draft:
        doc = {"draft": DRAFT_LABEL, **doc}
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return 0


# -- the commands ----------------------------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable, bool]] = {}  # name -> (handler, is a draft command)


def command(name: str, draft: bool = False):
    def register(fn):
        COMMANDS[name] = (fn, draft)
        return fn
    return register


@command("pairing-key", draft=True)
def cmd_pairing_key(args, state: StateDir) -> int:
    """New device: a fresh X25519 pairing key; its public half goes to the existing device."""
    key = pair.PairingKey.generate()
    expires = key.created_at + pair.MAX_PAIRING_VALIDITY + pair.CLOCK_SKEW
    state.write("pairing/keys", key.public.hex(),
                {"private": key.private.hex(), "created_at": key.created_at, "expires_at": expires})
    return emit({"pairing_key": key.public.hex(), "expires_at": expires}, draft=True)


@command("encrypt-device-label", draft=True)
def cmd_encrypt_label(args, state) -> int:
    secret = load_identity(args.identity)
    if args.label is None:
        raise Failed("usage", "encrypt-device-label needs --label TEXT")
    ext = EncryptedDeviceName.seal(secret, args.label)
    return emit({"extension_type": "0xf2ef", "name": "marmot.encrypted-device-name.v1",
                 "extension_data": ext.encode().hex()}, draft=True)


@command("decrypt-device-label", draft=True)
def cmd_decrypt_label(args, state) -> int:
    secret = load_identity(args.identity)
    if not args.input:
        raise Failed("usage", "decrypt-device-label needs --input FILE (the extension data)")
    ext = EncryptedDeviceName.decode(read_blob(args.input, "device label", "extension_data"))
    return emit({"label": ext.open(secret)}, draft=True)


# -- groups and messages -----------------------------------------------------------------------------

def load_device(args, state: StateDir) -> Device:
    return Device.from_json(load_identity(args.identity), state.read("device", "state"))


def save_device(state: StateDir, device: Device) -> None:
    state.write("device", "state", device.to_json())


def _draft_group(device: Device, gid: str) -> bool:
    """Was the group made with the draft switch (its GroupContext carries draft bytes)?"""
    return bool(device.groups.get(gid, {}).get("draft"))


def _group_summary(device: Device, gid: str) -> dict[str, Any]:
    group = device.group(gid)
    return {"group_id": gid, "nostr_group_id": device.groups[gid]["h"], "epoch": group.epoch,
            "profile": profile.read_group_state(group.context).profile}


def note(text: str) -> None:
    """A line for the person at the terminal (stderr); stdout keeps its one JSON document."""
    print(f"appliance marmot: {text}", file=sys.stderr)


def _multi_device_group(device: Device, gid: str):
    """The group, if the draft multi-device join can run in it (a components group made with the
    draft switch); otherwise a refusal that says what it needs."""
    group = device.group(gid)
    _need_components_context(group.context, f"group {gid}")
    return group


def _need_components_context(context, what: str) -> None:
    if profile.read_group_state(context).profile != "components":
        raise Failed("multi_device.needs_components",
                     f"{what} is an MDK-compatible group (MDK's group data, extension 0xf2ee): the draft "
                     "multi-device join needs a components group (create-group --profile components with "
                     "--draft-multi-device or marmot_draft_multi_device = true)")
    if context.extension(comp.EXT_MULTI_DEVICE) is None:
        raise Failed("multi_device.gate_inactive",
                     f"{what} is a components group made without the draft switch (no marmot.multi-device.v1, "
                     "0xf2f0): the draft multi-device join needs a components group created with "
                     "--draft-multi-device or marmot_draft_multi_device = true")


@command("key-package")
def cmd_key_package(args, state) -> int:
    """A signed kind 30443 key package event; its private part stays in the state directory."""
    device = load_device(args, state)
    if not args.relay:
        raise Failed("usage", "key-package needs at least one --relay URL")
    if args.device_label is not None and not args.draft_enabled:
        raise DraftDisabled("--device-label is part of the draft multi-device feature")
    ev = device.new_key_package(args.relay, device_label=args.device_label, draft=args.draft_enabled)
    save_device(state, device)
    # With the draft switch the key package advertises the draft multi-device feature (spec note M23).
    return emit(ev.to_dict(), draft=args.draft_enabled)


@command("create-group")
def cmd_create_group(args, state) -> int:
    device = load_device(args, state)
    if not args.relay:
        raise Failed("usage", "create-group needs at least one --relay URL")
    members = [read_event(path, "member key package") for path in args.member_key_package]
    chosen = args.profile
    if chosen is None:  # MDK clients can join only a group carrying MDK's group data (spec note M24)
        chosen, reasons = device.choose_profile(members)
        if chosen == "mdk":
            note(f"create-group: {'; '.join(reasons)} (an MDK client): making an MDK-compatible group, its "
                 "name, description, admins and relays in MDK's group data (extension 0xf2ee); "
                 "--profile components forces an app-components group")
    multi = args.draft_enabled and chosen == "components"
    if args.draft_enabled and chosen == "mdk":
        note("create-group: the draft multi-device join needs a components group; this MDK-compatible group "
             "does not offer it")
    gid, rumors = device.create_group(args.name or "", args.relay, members, admins=args.admin,
                                      multi_device=multi, group_profile=chosen, description=args.description or "")
    save_device(state, device)
    # A draft group's welcomes carry the draft's bytes: each is labelled, and so is its gift wrap.
    return emit({**_group_summary(device, gid), "welcomes": [labelled(r) for r in rumors] if multi else rumors},
                draft=multi)


@command("join")
def cmd_join(args, state) -> int:
    """Join from a kind 444 rumor (as unwrapped), or from its kind 1059 gift wrap addressed to us."""
    device = load_device(args, state)
    if not args.welcome:
        raise Failed("usage", "join needs --welcome FILE")
    obj, _ = read_unlabelled(args.welcome, "welcome")
    if isinstance(obj, dict) and obj.get("kind") == 1059:
        obj = transport.unwrap_welcome(parse_event(obj), device.secret).rumor
    gid = device.join(obj)
    save_device(state, device)
    return emit({**_group_summary(device, gid), "members": device.members(gid)},
                draft=bool(device.groups[gid].get("draft")))


@command("send")
def cmd_send(args, state) -> int:
    device = load_device(args, state)
    if args.group is None or args.content is None:
        raise Failed("usage", "send needs --group ID and --content TEXT")
    ev = device.send(args.group, args.content, args.kind)
    save_device(state, device)
    # In a draft group the label sits beside the event's fields, as for key-package (spec note M23):
    # read_event drops it, and it must be dropped before publishing.
    return emit(ev.to_dict(), draft=_draft_group(device, args.group))


@command("receive")
def cmd_receive(args, state) -> int:
    device = load_device(args, state)
    if not args.event:
        raise Failed("usage", "receive needs --event FILE")
    ev = read_event(args.event, "kind 445 event")
    draft_group = any(r.get("draft") and r.get("h") == ev.first_tag("h") for r in device.groups.values())
    got = device.receive(ev, draft=args.draft_enabled)
    save_device(state, device)
    return emit(got.to_json(), draft=got.external_join or draft_group)


@command("commit")
def cmd_commit(args, state) -> int:
    """Add members (--add FILE with their key package events), remove accounts (--remove PUBKEY), or
    with neither update our own leaf. Publish `commit` first, then the welcomes (gift-wrapped)."""
    device = load_device(args, state)
    if args.group is None:
        raise Failed("usage", "commit needs --group ID")
    adds = [read_event(path, "member key package") for path in args.add]
    ev, rumors = device.commit(args.group, add=adds, remove=args.remove, add_admins=args.add_admin,
                               remove_admins=args.remove_admin)
    save_device(state, device)
    draft = _draft_group(device, args.group)
    return emit({**_group_summary(device, args.group), "commit": ev.to_dict(),
                 "welcomes": [labelled(r) for r in rumors] if draft else rumors}, draft=draft)


@command("leave")
def cmd_leave(args, state) -> int:
    """A SelfRemove proposal (kind 445): the next commit by another member removes our leaf."""
    device = load_device(args, state)
    if args.group is None:
        raise Failed("usage", "leave needs --group ID")
    ev = device.leave(args.group)
    save_device(state, device)
    return emit(ev.to_dict(), draft=_draft_group(device, args.group))


@command("gift-wrap")
def cmd_gift_wrap(args, state) -> int:
    """The kind 1059 gift wrap of a kind 444 rumor for its recipient (publish it to their inbox relays)."""
    secret = load_identity(args.identity)
    if not args.rumor or not args.to:
        raise Failed("usage", "gift-wrap needs --rumor FILE and --to PUBKEY")
    rumor, draft = read_unlabelled(args.rumor, "rumor")
    # The welcome of a draft group (labelled by create-group/commit): its gift wrap is labelled too.
    return emit(transport.wrap_welcome(rumor, secret, args.to).to_dict(), draft=draft)


# -- the draft multi-device join ------------------------------------------------------------------------

@command("group-info", draft=True)
def cmd_group_info(args, state) -> int:
    device = load_device(args, state)
    group = _multi_device_group(device, _need(args.group, "--group ID"))
    return emit({"group_id": args.group, "epoch": group.epoch, "group_info": _b64(group.group_info())}, draft=True)


@command("join-psk", draft=True)
def cmd_join_psk(args, state) -> int:
    device = load_device(args, state)
    group = _multi_device_group(device, _need(args.group, "--group ID"))
    psk_id, psk = multidevice.join_psk(group)
    doc = {"group_id": args.group, "epoch": group.epoch, "join_psk_id": psk_id.hex()}
    if args.show_secrets:
        doc["join_psk"] = psk.hex()
    return emit(doc, draft=True)


@command("pairing-seal", draft=True)
def cmd_pairing_seal(args, state) -> int:
    """Existing device: seal each named group's current join material to a new device's pairing key."""
    device = load_device(args, state)
    if not args.recipient or not args.group_list:
        raise Failed("usage", "pairing-seal needs --recipient PAIRING_KEY and at least one --group ID")
    for gid in args.group_list:
        _multi_device_group(device, gid)
    entries = [pair.PairingGroupEntry(*device.pairing_entry(gid)) for gid in args.group_list]
    envelope, payload = pair.seal_pairing(decode_blob(args.recipient, "pairing key"), entries,
                                          validity=args.validity)
    return emit({"envelope": _b64(envelope), "pairing_id": payload.pairing_id.hex(),
                 "not_after": payload.not_after, "groups": args.group_list}, draft=True)


@command("pairing-open", draft=True)
def cmd_pairing_open(args, state) -> int:
    """New device: open a pairing envelope with our pairing key (single use), keep its entries."""
    if not args.envelope:
        raise Failed("usage", "pairing-open needs --envelope FILE")
    envelope = read_blob(args.envelope, "pairing envelope", "envelope")
    recipient = pair.peek_envelope(envelope)["recipient_pub"]
    record = state.read("pairing/keys", recipient)
    if record is None:
        raise Failed("pairing.unknown_key", "no unused pairing key of this state opens that envelope")
    key = pair.PairingKey(bytes.fromhex(record["private"]), record["created_at"])
    payload = pair.open_pairing(envelope, key, used_ids=state.used_pairing_ids())
    state.delete("pairing/keys", recipient)  # single use: the key is gone
    state.mark_pairing_used(payload.pairing_id.hex(), payload.not_after)
    groups = []
    for entry in payload.groups:
        info = mls_group_info(entry.group_info)
        gid = info.group_context.group_id.hex()
        state.write("pairing/groups", gid, {"group_event_key": entry.group_event_key.hex(),
                                            "join_psk": entry.join_psk.hex(), "group_info": _b64(entry.group_info),
                                            "expires_at": payload.not_after})
        groups.append({"group_id": gid, "epoch": info.group_context.epoch})
    return emit({"pairing_id": payload.pairing_id.hex(), "expires_at": payload.not_after, "groups": groups},
                draft=True)


@command("join-request", draft=True)
def cmd_join_request(args, state) -> int:
    """New device: fix our joining leaf for a paired group; an admin authorizes the printed request."""
    secret = load_identity(args.identity)
    gid = _need(args.group, "--group ID")
    entry = state.read("pairing/groups", gid)
    if entry is None:
        raise Failed("pairing.no_entry", f"no opened pairing entry for group {gid} (run pairing-open first)")
    _need_components_context(mls_group_info(_unb64(entry["group_info"])).group_context, f"group {gid}")
    pending, leaf = multidevice.prepare_external_join(
        secret, _unb64(entry["group_info"]), bytes.fromhex(entry["join_psk"]),
        group_event_key=bytes.fromhex(entry["group_event_key"]), device_label=args.device_label)
    state.write("pending", gid, {"pending": _b64(pending.to_bytes()), "expires_at": entry["expires_at"]})
    context = pending.candidate_context()
    return emit({"group_id": gid, "epoch": context.epoch, "account": public_key(secret),
                 "group_context": _b64(context.encode()), "leaf_node": _b64(leaf.encode())}, draft=True)


@command("authorize-join", draft=True)
def cmd_authorize_join(args, state) -> int:
    """Admin: the kind 452 proof for a join request, only over our group's current GroupContext."""
    device = load_device(args, state)
    if not args.request:
        raise Failed("usage", "authorize-join needs --request FILE (the join-request output)")
    request = read_json(args.request, "join request")
    try:
        context, leaf = _unb64(request["group_context"]), _unb64(request["leaf_node"])
        gid = request["group_id"]
    except (KeyError, TypeError, ValueError):
        raise Failed("input.json", "a join request has group_id, group_context and leaf_node") from None
    group = _multi_device_group(device, gid)
    if group.group_context_bytes() != context:
        raise Failed("multi_device.stale_request", "the request is not for this group's current epoch: "
                     "the new device must pair again")
    try:
        joining_leaf = MlsLeafNode.decode(leaf)
    except MLSError as exc:
        raise Failed("input.leaf_node", f"the join request's leaf_node is not a LeafNode: {exc}") from None
    # The admin reviews the leaf before signing anything (the same rules every member applies).
    try:
        proof = multidevice.authorize_join(device.secret, group.context, joining_leaf, tree=group.tree)
    except MarmotError as exc:
        raise Failed(exc.code, f"not authorized, nothing signed: {exc.reason}") from None
    template = proofs.signing_event(multidevice.join_binding(group.context, MlsLeafNode.decode(leaf)),
                                    proof.signer_hex, proof.created_at)
    return emit({"group_id": gid, "epoch": group.epoch, "proof": proof.encode().hex(),
                 "event": {**template, "sig": proof.signature.hex()}}, draft=True)


@command("external-commit", draft=True)
def cmd_external_commit(args, state) -> int:
    """New device: the External Commit with the admin's authorization; publish the printed event."""
    device = load_device(args, state)
    gid = _need(args.group, "--group ID")
    record = state.read("pending", gid)
    if record is None:
        raise Failed("pairing.no_pending", f"no join request for group {gid} (run join-request first)")
    if not args.authorization:
        raise Failed("usage", "external-commit needs --authorization FILE (the authorize-join output)")
    proof = read_blob(args.authorization, "authorization", "proof")
    pending = multidevice.PendingJoin.from_bytes(_unb64(record["pending"]))
    ev = device.finish_external_join(pending, proof, name=args.name or "")
    save_device(state, device)
    state.delete("pending", gid)
    state.delete("pairing/groups", gid)  # the pairing material is spent
    return emit({**_group_summary(device, gid), "commit": ev.to_dict()}, draft=True)


def _need(value, what: str):
    if value is None:
        raise Failed("usage", f"this command needs {what}")
    return value


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def mls_group_info(data: bytes):
    from appliance.marmot.mls.structs import MLSMessage, WF_GROUP_INFO

    msg = MLSMessage.decode(data)
    if msg.wire_format != WF_GROUP_INFO:
        raise Failed("input.group_info", "not a GroupInfo message")
    return msg.body


def inspect_bytes(kind: str, data: bytes) -> dict[str, Any]:
    """Readable JSON for one Marmot-owned binary object."""
    if kind == "proof":
        return {"type": "MarmotAuthorizationProof", **proofs.MarmotAuthorizationProof.decode(data).to_json()}
    if kind == "pairing-envelope":
        return {"type": "MarmotPairingEnvelopeV1", **pair.peek_envelope(data)}
    if kind == "admin-policy":
        return {"type": "component", **comp.AdminPolicy.decode(data).to_json()}
    if kind == "nostr-routing":
        return {"type": "component", **comp.NostrRouting.decode(data).to_json()}
    if kind == "multi-device-extension":
        return {"type": "extension", **MultiDeviceExtension.decode(data).to_json()}
    if kind == "device-label":
        return {"type": "extension", **EncryptedDeviceName.decode(data).to_json()}
    if kind in MLS_TYPES:
        return inspect_mls(kind, data)
    raise Failed("usage", f"cannot inspect {kind!r}")


def _hex16(values) -> list[str]:
    return [f"0x{v:04x}" for v in values]


def _leaf_json(leaf) -> dict[str, Any]:
    out: dict[str, Any] = {
        "account": leaf.credential.identity.hex() if leaf.credential.identity else None,
        "signature_key": leaf.signature_key.hex(), "encryption_key": leaf.encryption_key.hex(),
        "source": {1: "key_package", 2: "update", 3: "commit"}.get(leaf.leaf_node_source),
        "capabilities": {"extensions": _hex16(leaf.capabilities.extensions),
                         "proposals": _hex16(leaf.capabilities.proposals)},
        "extensions": _hex16(e.extension_type for e in leaf.extensions),
        "leaf_node_hash": hashlib.sha256(leaf.encode()).hexdigest(),
    }
    if leaf.lifetime is not None:
        out["lifetime"] = {"not_before": leaf.lifetime.not_before, "not_after": leaf.lifetime.not_after}
    try:
        profile.account_of_leaf(leaf)
        out["account_identity_proof"] = "valid"
    except MarmotError as exc:
        out["account_identity_proof"] = f"invalid: {exc.reason}"
    return out


def _context_json(ctx) -> dict[str, Any]:
    out: dict[str, Any] = {"group_id": ctx.group_id.hex(), "epoch": ctx.epoch,
                           "ciphersuite": f"0x{ctx.cipher_suite:04x}",
                           "extensions": _hex16(e.extension_type for e in ctx.extensions),
                           "group_context_hash": hashlib.sha256(ctx.encode()).hexdigest()}
    if ctx.extension(comp.EXT_MULTI_DEVICE) is not None:  # a draft multi-device group
        out["join_psk_id"] = multidevice.join_psk_id(ctx.encode()).hex()
    try:
        state = profile.read_group_state(ctx)
        out.update({"profile": state.profile, "nostr_group_id": state.h, "relays": state.relays,
                    "admins": sorted(a.hex() for a in state.admins)})
    except MarmotError as exc:
        out["marmot"] = f"unreadable: {exc.reason}"
    return out


def inspect_mls(kind: str, data: bytes) -> dict[str, Any]:
    """Readable JSON for MLS objects (decoded and, where they carry signatures, verified)."""
    from appliance.marmot import mls
    from appliance.marmot.mls import structs as st

    try:
        if kind == "key-package":
            kp = mls.parse_key_package(data)
            return {"type": "KeyPackage", "ref": mls.key_package_ref(kp).hex(), "leaf": _leaf_json(kp.leaf_node)}
        if kind == "leaf-node":
            return {"type": "LeafNode", **_leaf_json(st.LeafNode.decode(data))}
        if kind == "group-context":
            return {"type": "GroupContext", **_context_json(st.GroupContext.decode(data))}
        if kind == "join-psk-id":
            if len(data) != 64 or data[:32] != b"\x1f" + multidevice.JOIN_PSK_LABEL:
                raise Failed("input.join_psk_id", "not a MarmotMultiDeviceJoinPskId (0x1f, label, 32-byte hash)")
            return {"type": "MarmotMultiDeviceJoinPskId", "label": multidevice.JOIN_PSK_LABEL.decode(),
                    "group_context_hash": data[32:].hex()}
        msg = st.MLSMessage.decode(data)
        if kind == "group-info" or msg.wire_format == st.WF_GROUP_INFO:
            if msg.wire_format != st.WF_GROUP_INFO:
                raise Failed("input.group_info", "not a GroupInfo message")
            gi = msg.body
            return {"type": "GroupInfo", "signer": gi.signer, "context": _context_json(gi.group_context),
                    "extensions": _hex16(e.extension_type for e in gi.extensions)}
        names = {1: "PublicMessage", 2: "PrivateMessage", 3: "Welcome", 4: "GroupInfo", 5: "KeyPackage"}
        out: dict[str, Any] = {"type": "MLSMessage", "wire_format": names.get(msg.wire_format, msg.wire_format)}
        if msg.wire_format == st.WF_PUBLIC_MESSAGE:
            c = msg.body.content
            out.update({"group_id": c.group_id.hex(), "epoch": c.epoch, "sender_type": c.sender.sender_type,
                        "content_type": c.content_type, "authenticated_data": c.authenticated_data.hex()})
            if c.content_type == st.CT_COMMIT:
                out["proposals"] = [_hex16([p.proposal_type])[0] if hasattr(p, "proposal_type") else "ref"
                                    for p in c.content.proposals]
        elif msg.wire_format == st.WF_PRIVATE_MESSAGE:
            out.update({"group_id": msg.body.group_id.hex(), "epoch": msg.body.epoch})
        return out
    except mls.MLSError as exc:
        raise Failed("input.mls", f"{kind}: {exc}") from None


def inspect_event(obj: Any) -> dict[str, Any]:
    """Readable JSON for a Marmot transport event or rumor (what can be seen without secrets)."""
    if not isinstance(obj, dict):
        raise Failed("input.json", "expected a JSON object")
    kind = obj.get("kind")
    if kind == transport.WELCOME_RUMOR_KIND:
        w = transport.parse_welcome_rumor(obj)
        return {"type": "welcome-rumor", "kind": 444, "sender": w.sender, "key_package_event": w.key_package_event_id,
                "relays": w.relays, "welcome_bytes": len(w.welcome)}
    if "sig" not in obj:  # an unsigned rumor: an application message's payload (receive prints it)
        try:
            rumor = nip59.parse_rumor(obj)
        except nip59.UnwrapError as exc:
            raise Failed("input.event", str(exc)) from None
        return {"type": "rumor", "kind": rumor["kind"], "author": rumor["pubkey"], "id": rumor["id"],
                "created_at": rumor["created_at"], "tags": rumor["tags"], "content": rumor["content"]}
    try:
        ev = parse_event(obj)
    except InvalidEvent as exc:
        raise Failed("input.event", exc.reason) from None
    if ev.kind in proofs.LOCAL_ONLY_KINDS:  # a proof's signing event (authorize-join prints its kind 452)
        return {"type": "proof-signing-event", "kind": ev.kind, "signer": ev.pubkey, "created_at": ev.created_at,
                "tags": ev.tags, "content": ev.content, "signature_valid": verify_event(ev),
                "note": "a local-only signing template: never published (relays refuse it)"}
    if ev.kind == transport.GROUP_MESSAGE_KIND:
        h = transport.check_group_message(ev)
        return {"type": "group-message", "kind": 445, "h": h, "one_time_pubkey": ev.pubkey,
                "ciphertext_bytes": len(base64.b64decode(ev.content)) - transport.NONCE_LEN}
    if ev.kind in (transport.KEY_PACKAGE_KIND, transport.LEGACY_KEY_PACKAGE_KIND):
        kp = transport.parse_key_package_event(ev)
        out = {"type": "key-package-event", "kind": ev.kind, "author": ev.pubkey, "d": kp.d, "ref": kp.ref,
               "ciphersuite": kp.ciphersuite, "relays": kp.relays, "key_package_bytes": len(kp.key_package)}
        try:
            out["key_package"] = inspect_mls("key-package", kp.key_package)
        except Failed as exc:
            out["key_package"] = f"invalid: {exc.message}"
        return out
    if ev.kind == transport.KEY_PACKAGE_RELAYS_KIND:
        return {"type": "key-package-relays", "kind": ev.kind, "author": ev.pubkey,
                "relays": transport.parse_key_package_relays(ev)}
    if ev.kind == 1059:
        return {"type": "gift-wrap", "kind": 1059, "recipients": [t[1] for t in ev.tags if t[0] == "p" and len(t) > 1],
                "one_time_pubkey": ev.pubkey}
    raise Failed("input.event", f"kind {ev.kind} is not a Marmot transport event")


# Objects only the draft multi-device feature defines, and the code points that mark a draft object.
DRAFT_INSPECT_TYPES = frozenset({"pairing-envelope", "multi-device-extension", "device-label", "join-psk-id"})
# What inspect reports for objects only the draft defines.
DRAFT_DOCUMENT_TYPES = frozenset({"MarmotPairingEnvelopeV1", "MarmotMultiDeviceJoinPskId", "join-request",
                                  "join-authorization", "pairing-key", "pairing-opened", "device-label-opened"})
DRAFT_CODE_POINTS = frozenset({f"0x{comp.EXT_MULTI_DEVICE:04x}", f"0x{comp.EXT_ENCRYPTED_DEVICE_NAME:04x}"})


def _is_draft(doc: Any) -> bool:
    """Does an inspected object carry or advertise a part of the draft (0xf2f0, 0xf2ef, a join PSK id)?"""
    if isinstance(doc, dict):
        return "join_psk_id" in doc or doc.get("type") in DRAFT_DOCUMENT_TYPES or doc.get("kind") == 452 \
            or any(_is_draft(v) for v in doc.values())
    if isinstance(doc, list):
        return any(_is_draft(v) for v in doc)
    return isinstance(doc, str) and doc in DRAFT_CODE_POINTS


def emit_inspected(doc: dict[str, Any], as_type: str | None = None) -> int:
    return emit(doc, draft=as_type in DRAFT_INSPECT_TYPES or _is_draft(doc)
                or doc.get("name") in ("marmot.multi-device.v1", "marmot.encrypted-device-name.v1"))


@command("inspect")
def cmd_inspect(args, state) -> int:
    if not args.input:
        raise Failed("usage", "inspect needs --input FILE (or - for stdin)")
    if args.as_type:
        field = FIELD_FOR.get(args.as_type)
        text = read_text(args.input) if args.input != "-" else None
        if text is None or field is None or f'"{field}"' not in text:
            field = None
        return emit_inspected(inspect_bytes(args.as_type, read_blob(args.input, args.as_type, field)), args.as_type)
    text = read_text(args.input).strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            raise Failed("input.json", f"{args.input} is not valid JSON") from None
        labelled = isinstance(obj, dict) and obj.get("draft") == DRAFT_LABEL
        if labelled:  # an output of a draft group or feature: what it shows is draft too
            obj = {k: v for k, v in obj.items() if k != "draft"}
        doc = inspect_document(obj)
        return emit(doc, draft=labelled or _is_draft(doc))
    return emit_inspected(recognise_bytes(decode_blob(text, "input")))


# What `receive` prints as "type" (Received.type).
RECEIVED_TYPES = ("application", "commit", "proposal")


def inspect_document(obj: Any) -> dict[str, Any]:
    """What a JSON input is, without --as: a Nostr event or rumor, or one of the commands' own outputs
    (recognised by the fields each prints)."""
    if not isinstance(obj, dict):
        raise Failed("input.json", "expected a JSON object")
    if isinstance(obj.get("kind"), int) and "pubkey" in obj:
        return inspect_event(obj)
    blob = lambda field, what: decode_blob(obj[field], what) if isinstance(obj.get(field), str) else None  # noqa: E731
    if "envelope" in obj:  # pairing-seal
        return {**inspect_bytes("pairing-envelope", blob("envelope", "pairing envelope")),
                **({"pairing_id": obj["pairing_id"]} if "pairing_id" in obj else {})}
    if "leaf_node" in obj and "group_context" in obj:  # join-request
        return inspect_join_request(obj)
    if "proof" in obj and isinstance(obj.get("event"), dict):  # authorize-join
        return inspect_authorization(obj)
    if "pairing_key" in obj:  # pairing-key
        key = blob("pairing_key", "pairing key")
        if key is None or len(key) != 32:
            raise Failed("input.pairing_key", "pairing_key is not a 32-byte X25519 public key")
        return {"type": "pairing-key", "pairing_key": key.hex(), "expires_at": obj.get("expires_at")}
    if "group_info" in obj:  # group-info
        return inspect_bytes("group-info", blob("group_info", "GroupInfo"))
    if "join_psk_id" in obj:  # join-psk (never its secret value)
        return inspect_bytes("join-psk-id", blob("join_psk_id", "join PSK id"))
    if "extension_data" in obj:  # encrypt-device-label, or a 0xf2f0 body
        data = blob("extension_data", "extension data")
        return inspect_bytes("multi-device-extension" if data == MultiDeviceExtension().encode() else "device-label",
                             data)
    if "proof" in obj:
        return inspect_bytes("proof", blob("proof", "proof"))
    if "pairing_id" in obj and isinstance(obj.get("groups"), list):  # pairing-open
        return {"type": "pairing-opened", **{k: obj[k] for k in ("pairing_id", "expires_at", "groups")}}
    received = obj.get("type") in RECEIVED_TYPES and "group_id" in obj and "epoch" in obj
    if received or any(k in obj for k in ("commit", "welcomes", "rumor", "members")):
        # create-group, commit, external-commit, join, receive (of any message type)
        out: dict[str, Any] = {"type": "output", **{k: obj[k] for k in ("group_id", "nostr_group_id", "epoch",
                                                                         "profile", "members", "sender",
                                                                         "external_join") if k in obj}}
        if "type" in obj:
            out["type"], out["message_type"] = "received", obj["type"]
        if isinstance(obj.get("commit"), dict):
            out["commit"] = inspect_event(obj["commit"])
        if isinstance(obj.get("welcomes"), list):
            out["welcomes"] = [inspect_event(w) for w in obj["welcomes"]]
        if isinstance(obj.get("rumor"), dict):
            out["rumor"] = inspect_event(obj["rumor"])
        return out
    if set(obj) == {"label"} and isinstance(obj["label"], str):  # decrypt-device-label
        return {"type": "device-label-opened", "label": obj["label"]}
    if set(obj) == {"error", "message"}:  # any command's refusal
        return {"type": "refusal", "error": obj["error"], "message": obj["message"]}
    raise Failed("usage", "cannot tell what this JSON document is; name it with --as")


def inspect_join_request(obj: dict) -> dict[str, Any]:
    try:
        context = st.GroupContext.decode(decode_blob(obj["group_context"], "group_context"))
        leaf = MlsLeafNode.decode(decode_blob(obj["leaf_node"], "leaf_node"))
    except (MLSError, TypeError) as exc:
        raise Failed("input.join_request", f"not a join request: {exc}") from None
    return {"type": "join-request", "group_id": context.group_id.hex(), "epoch": context.epoch,
            "account": leaf.credential.identity.hex() if leaf.credential.identity else None,
            "leaf": _leaf_json(leaf), "group_context": _context_json(context)}


def inspect_authorization(obj: dict) -> dict[str, Any]:
    """authorize-join's output: the 104-byte proof and its kind 452 signing event, checked together."""
    proof = proofs.MarmotAuthorizationProof.decode(decode_blob(obj["proof"], "proof"))
    ev = obj["event"]
    tags = ev.get("tags") if isinstance(ev.get("tags"), list) else []
    binding = {t[0]: t[1] for t in tags if isinstance(t, list) and len(t) == 2 and isinstance(t[0], str)}
    try:
        rebuilt = compute_id(ev["pubkey"], ev["created_at"], ev["kind"], tags, ev["content"])
        signature_ok = rebuilt == ev.get("id") and schnorr_verify(ev["pubkey"], bytes.fromhex(rebuilt),
                                                                  proof.signature.hex())
    except (KeyError, TypeError, ValueError):
        signature_ok = False
    return {"type": "join-authorization", "kind": ev.get("kind"), "signer": proof.signer_hex,
            "created_at": proof.created_at, "group_id": binding.get("group_id"), "epoch": binding.get("epoch"),
            "account": binding.get("account"), "leaf_node_hash": binding.get("leaf_node_hash"),
            "matches_event": ev.get("kind") == proofs.JOIN_AUTHORIZATION_KIND and ev.get("pubkey") == proof.signer_hex
            and ev.get("created_at") == proof.created_at and ev.get("sig") == proof.signature.hex() and signature_ok}


def recognise_bytes(data: bytes) -> dict[str, Any]:
    """Raw bytes without --as: the first decoding that consumes them exactly, most specific first."""
    if data == MultiDeviceExtension().encode():
        return inspect_bytes("multi-device-extension", data)
    if len(data) == 64 and data[:32] == b"\x1f" + multidevice.JOIN_PSK_LABEL:
        return inspect_bytes("join-psk-id", data)
    for kind in ("mls-message", "key-package", "pairing-envelope", "proof", "leaf-node", "group-context"):
        try:
            return inspect_bytes(kind, data)
        except (Failed, MarmotError, MLSError):
            continue
    raise Failed("usage", "cannot tell what these bytes are; name them with --as")


# -- argument parsing and dispatch -----------------------------------------------------------------

FIELD_FOR = {"proof": "proof", "pairing-envelope": "envelope", "group-info": "group_info", "leaf-node": "leaf_node",
             "group-context": "group_context", "join-psk-id": "join_psk_id", "device-label": "extension_data",
             "multi-device-extension": "extension_data"}
MLS_TYPES = ("key-package", "leaf-node", "group-context", "group-info", "mls-message", "join-psk-id")
INSPECT_TYPES = ("proof", "pairing-envelope", "admin-policy", "nostr-routing", "multi-device-extension",
                 "device-label", *MLS_TYPES)


def add_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="marmot_command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser, state: bool = True, identity: bool = True) -> None:
        if state:
            p.add_argument("--state", metavar="DIR", required=True, help="This device's Marmot state directory.")
        if identity:
            p.add_argument("--identity", metavar="FILE",
                           help="File holding the account's secret key (64 hex or nsec).")
        p.add_argument("--draft-multi-device", action="store_true",
                       help="Allow the draft multi-device commands for this run (setting marmot_draft_multi_device).")
        p.add_argument("--config", metavar="FILE", help="TOML config file (also APPLIANCE_CONFIG).")
        p.add_argument("--show-secrets", action="store_true", help="Also print secret values.")

    p = sub.add_parser("key-package", help="Make a signed kind 30443 key package event (private part kept).")
    common(p)
    p.add_argument("--relay", action="append", default=[], metavar="URL", help="Relay for the key package (repeat).")
    p.add_argument("--device-label", metavar="TEXT", help="[draft] Encrypted device label (0xf2ef) on the leaf.")
    p = sub.add_parser("create-group", help="Create a group, inviting the given key packages.")
    common(p)
    p.add_argument("--name", metavar="NAME", help="Group name (kept in this state).")
    p.add_argument("--relay", action="append", default=[], metavar="URL", help="Group relay (repeat).")
    p.add_argument("--member-key-package", action="append", default=[], metavar="FILE",
                   help="A member's kind 30443 key package event (repeat).")
    p.add_argument("--admin", action="append", default=[], metavar="PUBKEY", help="Another admin (repeat).")
    p.add_argument("--description", metavar="TEXT", help="Group description (MDK-compatible groups carry it).")
    p.add_argument("--profile", choices=("components", "mdk"),
                   help="Group state as app components, or as MDK's group data (0xf2ee) so MDK clients can "
                        "join. Default: mdk when any invitee's key package lacks the app components.")
    p = sub.add_parser("join", help="Join from a kind 444 welcome rumor (or its gift wrap).")
    common(p)
    p.add_argument("--welcome", metavar="FILE")
    p = sub.add_parser("send", help="A kind 445 event carrying an application message (an unsigned rumor).")
    common(p)
    p.add_argument("--group", metavar="ID")
    p.add_argument("--content", metavar="TEXT")
    p.add_argument("--kind", type=int, default=9, help="Kind of the inner rumor (default 9).")
    p = sub.add_parser("receive", help="Process one kind 445 event.")
    common(p)
    p.add_argument("--event", metavar="FILE")
    p = sub.add_parser("commit", help="Add members, remove accounts, or update our leaf.")
    common(p)
    p.add_argument("--group", metavar="ID")
    p.add_argument("--add", action="append", default=[], metavar="FILE", help="Key package event to add (repeat).")
    p.add_argument("--remove", action="append", default=[], metavar="PUBKEY", help="Account to remove (repeat).")
    p.add_argument("--add-admin", action="append", default=[], metavar="PUBKEY",
                   help="Make a member an admin (MDK-compatible groups: through the group data; repeat).")
    p.add_argument("--remove-admin", action="append", default=[], metavar="PUBKEY",
                   help="Take an admin's rights away (repeat).")
    p = sub.add_parser("leave", help="Leave a group: a SelfRemove proposal another member commits.")
    common(p)
    p.add_argument("--group", metavar="ID")
    p = sub.add_parser("gift-wrap", help="Gift-wrap a kind 444 welcome rumor for its recipient (kind 1059).")
    common(p, state=False)
    p.add_argument("--rumor", metavar="FILE")
    p.add_argument("--to", metavar="PUBKEY")
    p = sub.add_parser("group-info", help="[draft] Export the group's GroupInfo (external_pub, ratchet_tree).")
    common(p)
    p.add_argument("--group", metavar="ID")
    p = sub.add_parser("join-psk", help="[draft] The group's join PSK id (and value with --show-secrets).")
    common(p)
    p.add_argument("--group", metavar="ID")
    p = sub.add_parser("pairing-seal", help="[draft] Seal groups' join material to a new device's pairing key.")
    common(p)
    p.add_argument("--recipient", metavar="PAIRING_KEY")
    p.add_argument("--group", dest="group_list", action="append", default=[], metavar="ID")
    p.add_argument("--validity", type=int, default=pair.DEFAULT_PAIRING_VALIDITY, metavar="SECONDS")
    p = sub.add_parser("pairing-open", help="[draft] New device: open a pairing envelope (single use).")
    common(p, identity=False)
    p.add_argument("--envelope", metavar="FILE")
    p = sub.add_parser("join-request", help="[draft] New device: prepare the joining leaf for an admin to authorize.")
    common(p)
    p.add_argument("--group", metavar="ID")
    p.add_argument("--device-label", metavar="TEXT")
    p = sub.add_parser("authorize-join", help="[draft] Admin: sign the kind 452 authorization of a join request.")
    common(p)
    p.add_argument("--request", metavar="FILE")
    p = sub.add_parser("external-commit", help="[draft] New device: build the External Commit.")
    common(p)
    p.add_argument("--group", metavar="ID")
    p.add_argument("--authorization", metavar="FILE")
    p.add_argument("--name", metavar="NAME")
    p = sub.add_parser("pairing-key", help="[draft] New device: make a fresh X25519 pairing key.")
    common(p, identity=False)
    p = sub.add_parser("encrypt-device-label", help="[draft] Encrypt a device label to the account's own key.")
    common(p, state=False)
    p.add_argument("--label", metavar="TEXT")
    p = sub.add_parser("decrypt-device-label", help="[draft] Decrypt a device label extension.")
    common(p, state=False)
    p.add_argument("--input", metavar="FILE")
    p = sub.add_parser("inspect", help="Show a Marmot object (event, rumor, proof, envelope, component) as JSON.")
    common(p, state=False, identity=False)
    p.add_argument("--input", metavar="FILE", help="The object: a JSON event/rumor, or hex/base64 bytes; - reads stdin.")
    p.add_argument("--as", dest="as_type", choices=INSPECT_TYPES, help="What the bytes are.")


def run(args: argparse.Namespace) -> int:
    handler, draft = COMMANDS[args.marmot_command]
    try:
        settings = load(flags={"marmot_draft_multi_device": True if args.draft_multi_device else None},
                        config_path=args.config)
        args.draft_enabled = bool(settings.marmot_draft_multi_device)
        if draft and not args.draft_enabled:
            raise DraftDisabled(f"`{args.marmot_command}` is part of the draft multi-device join")
        state = StateDir(args.state) if getattr(args, "state", None) else None
        if state is not None:
            state.purge_expired()
        return handler(args, state)
    except Failed as exc:
        return _fail(exc.code, exc.message)
    except MarmotError as exc:
        return _fail(exc.code, exc.reason)
    except MLSError as exc:
        return _fail("mls.invalid", f"MLS: {exc}")
    except ConfigError as exc:
        return _fail("config", str(exc))


def _fail(code: str, message: str) -> int:
    sys.stdout.write(json.dumps({"error": code, "message": message}) + "\n")
    print(f"appliance marmot: {message}", file=sys.stderr)
    return 2

