"""One Marmot device of one account: key packages, groups, messages, and the draft multi-device
join, over the Nostr transport. Pure: state is a JSON-ready dict the caller stores (the CLI keeps it
in its state directory, tests in memory); every operation returns what to publish.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from typing import Any

from appliance.nostr import nip59
from appliance.nostr.event import Event
from appliance.nostr.keys import public_key

from . import components as comp
from . import mls, multidevice, profile, transport
from .errors import ComponentError, DraftDisabled, MarmotError, ProofError, TransportError
from .mls.structs import (EXT_REQUIRED_CAPABILITIES, P_SELF_REMOVE, SENDER_NEW_MEMBER_COMMIT, Extension,
                          GroupContext, MLSMessage, RequiredCapabilities, WF_PUBLIC_MESSAGE)

__all__ = ["Device", "Received"]

# Outer (kind 445) keys of past epochs kept so a late message of the previous epoch still opens.
EPOCH_KEYS_KEPT = 4
OWN_EVENTS_KEPT = 256


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


@dataclass
class Received:
    type: str                     # "application" | "commit" | "proposal"
    group_id: str
    epoch: int
    rumor: dict | None = None
    sender: str | None = None     # the MLS-authenticated account
    external_join: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "group_id": self.group_id, "epoch": self.epoch}
        if self.rumor is not None:
            out["rumor"] = self.rumor
        if self.sender is not None:
            out["sender"] = self.sender
        if self.external_join:
            out["external_join"] = True
        return out


@dataclass
class Device:
    secret: str
    key_packages: dict[str, dict] = field(default_factory=dict)   # ref hex -> {"secrets": b64, "event": id}
    groups: dict[str, dict] = field(default_factory=dict)         # group id hex -> record

    @property
    def account(self) -> str:
        return public_key(self.secret)

    # -- key packages ------------------------------------------------------------------------------

    def new_key_package(self, relays: list[str], *, device_label: str | None = None, draft: bool = False) -> Event:
        """A kind 30443 key package event; `draft` (the draft switch) lets it join multi-device groups."""
        kps = profile.create_key_package(self.secret, device_label=device_label, draft=draft)
        ev = profile.key_package_event(self.secret, kps, relays)
        ref = mls.key_package_ref(kps.key_package).hex()
        self.key_packages[ref] = {"secrets": _b64(kps.to_bytes()), "event": ev.id}
        return ev

    # -- groups ----------------------------------------------------------------------------------------

    def _record(self, group: mls.Group, *, name: str = "", draft: bool = False) -> dict:
        gid = group.group_id.hex()
        record = self.groups.get(gid, {"name": name, "draft": draft, "event_keys": []})
        state = profile.read_group_state(group.context)
        keys = [k for k in record["event_keys"] if k["epoch"] != group.epoch]
        keys.append({"epoch": group.epoch, "key": multidevice.group_event_key(group).hex()})
        record.update({"state": _b64(group.to_bytes()), "h": state.h, "relays": state.relays,
                       "event_keys": keys[-EPOCH_KEYS_KEPT:], "own": record.get("own", [])})
        self.groups[gid] = record
        return record

    def group(self, group_id: str) -> mls.Group:
        record = self.groups.get(group_id)
        if record is None:
            raise MarmotError(f"no group {group_id} in this state", "state.unknown_group")
        return mls.Group.from_bytes(_unb64(record["state"]))

    def group_by_h(self, h: str) -> str:
        for gid, record in self.groups.items():
            if record["h"] == h:
                return gid
        raise MarmotError(f"no group with nostr_group_id {h} in this state", "state.unknown_group")

    def choose_profile(self, members: list[Event]) -> tuple[str, list[str]]:
        """The profile a group with these invitees needs: "mdk" (MDK's group data, 0xf2ee) when any
        key package lacks the app components, with one reason per such invitee; else "components"."""
        reasons = []
        for ev in members:
            kp, _ = self._member_key_package(ev, require_proof=False)
            why = profile.lacks_components(kp.leaf_node)
            if why is not None:
                reasons.append(f"the key package of {ev.pubkey} has {why}")
        return ("mdk" if reasons else "components"), reasons

    def create_group(self, name: str, relays: list[str], members: list[Event], *, admins: list[str] | None = None,
                     multi_device: bool = False, group_profile: str = "components",
                     description: str = "") -> tuple[str, list[dict]]:
        """A new group with the given members' key package events; returns (group id, kind 444 rumors).

        `group_profile` "components" carries the group state as app components (spec note M18);
        "mdk" carries MDK 0.8.0's group data (0xf2ee) so MDK clients can join (M24)."""
        if group_profile not in profile.PROFILES:
            raise MarmotError(f"unknown group profile {group_profile!r}", "profile.unknown")
        sig_priv, sig_pub = mls.crypto.signature_keypair()
        admins = sorted({self.account, *(admins or [])})
        if group_profile == "mdk":
            if multi_device:
                raise MarmotError("the draft multi-device join needs a components group, not an MDK-compatible "
                                  "one", "profile.draft_needs_components")
            kps = [self._member_key_package(ev, require_proof=False) for ev in members]
            _check_mdk_invitees(self.account, kps, admins)
            data = comp.MdkGroupData.of(nostr_group_id=os.urandom(32), name=name, description=description,
                                        admins=admins, relays=relays)
            # MDK's rule: SelfRemove is required when every invitee supports it (none: nothing required)
            self_remove = bool(kps) and all(comp.SELF_REMOVE in kp.leaf_node.capabilities.proposals for kp, _ in kps)
            exts = profile.mdk_group_extensions(data, [comp.SELF_REMOVE] if self_remove else [])
            relays = data.relay_urls()  # as MDK writes them, also in the welcomes' relays tag
        else:
            kps = [self._member_key_package(ev) for ev in members]
            exts = profile.group_extensions(admins=[bytes.fromhex(a) for a in admins], nostr_group_id=os.urandom(32),
                                            relays=relays, multi_device=multi_device)
        group = mls.Group.create(profile.new_group_id(), profile.credential_of(self.secret), sig_priv,
                                 capabilities=profile.leaf_capabilities(multi_device), lifetime=profile.lifetime(),
                                 leaf_extensions=profile.leaf_extensions(self.secret, sig_pub, draft=multi_device),
                                 extensions=exts)
        rumors = []
        if kps:
            required = profile.required_components(group.context)
            for kp, _ in kps:
                profile.check_supports_required(required, kp.leaf_node, "that key package")
            out = group.commit(add=[kp for kp, _ in kps])
            group = out.group
            for _, ev in kps:
                rumors.append(transport.build_welcome_rumor(self.account, out.welcome, ev.id, relays))
        self._record(group, name=name, draft=multi_device)
        return group.group_id.hex(), rumors

    def _member_key_package(self, ev: Event, require_proof: bool = True):
        """A member's key package event, checked: outer rules, MLS signatures, author == credential, 0x8009."""
        parsed = transport.parse_key_package_event(ev)
        try:
            kp = mls.parse_key_package(parsed.key_package)
        except mls.MLSError as exc:
            raise TransportError(f"key package does not decode or verify: {exc}", "transport.key_package") from None
        if kp.leaf_node.credential.identity != bytes.fromhex(ev.pubkey):
            raise TransportError("the key package's credential is not the event author", "transport.key_package")
        if parsed.ref is not None and parsed.ref != mls.key_package_ref(kp).hex():
            raise TransportError("the i tag is not the KeyPackageRef", "transport.i_tag")
        profile.check_lifetime(kp.leaf_node)
        if require_proof:  # component groups require 0x8009 on every leaf; MDK groups do not have it
            profile.check_key_package_extensions(kp)
            profile.account_of_leaf(kp.leaf_node, kp.cipher_suite)
        return kp, ev

    def join(self, rumor: dict) -> str:
        """Join from a kind 444 welcome rumor (as unwrapped from its gift wrap)."""
        welcome = transport.parse_welcome_rumor(rumor)
        last_error: Exception | None = None
        for ref, record in list(self.key_packages.items()):
            kps = mls.KeyPackageSecrets.from_bytes(_unb64(record["secrets"]))
            try:
                group = mls.join_from_welcome(welcome.welcome, kps)
            except mls.StateError as exc:  # addressed to another of our key packages
                last_error = exc
                continue
            except mls.MLSError as exc:
                raise MarmotError(f"the welcome does not join: {exc}", "welcome.invalid") from None
            if group.group_id.hex() in self.groups:
                # joining.md: a welcome never silently replaces a group copy we retain.
                raise MarmotError("this welcome is for a group this state already holds", "welcome.known_group")
            state = profile.read_group_state(group.context)
            if state.profile == "components":
                profile.check_group_context(group.context)
                # joining.md: refused when the group requires what this client (our own leaf among
                # them) or any member does not support
                required = profile.required_components(group.context)
                for index, leaf in group.tree.leaves():
                    profile.account_of_leaf(leaf, group.context.cipher_suite)
                    profile.check_supports_required(required, leaf, f"member leaf {index}")
            # joining.md step 8: the welcome's author (the GroupInfo signer) is an active admin.
            author = group.tree.leaf(_welcome_signer(welcome.welcome, kps))
            if author is None or author.credential.identity not in state.admins:
                raise MarmotError("the welcome's author is not an active admin of the group", "welcome.not_admin")
            del self.key_packages[ref]  # consumed: its init key is gone with it
            self._record(group, draft=group.context.extension(0xF2F0) is not None)
            return group.group_id.hex()
        raise MarmotError(f"the welcome is not addressed to any key package in this state ({last_error})",
                          "welcome.not_ours")

    def members(self, group_id: str) -> list[str]:
        return [m.identity.hex() for m in self.group(group_id).members() if m.identity]

    # -- messages ------------------------------------------------------------------------------------

    def _publish(self, group_id: str, group_before: mls.Group, message: bytes) -> Event:
        record = self.groups[group_id]
        key = multidevice.group_event_key(group_before)
        ev = transport.encrypt_group_message(key, bytes.fromhex(record["h"]), message)
        # Our own events come back from the relay: remember them so receive() can tell (bounded).
        record["own"] = (record.get("own", []) + [ev.id])[-OWN_EVENTS_KEPT:]
        return ev

    def send(self, group_id: str, content: str, kind: int = 9, tags: list | None = None) -> Event:
        group = self.group(group_id)
        rumor = nip59.make_rumor(self.account, kind, tags or [], content)
        new, message = group.encrypt(json.dumps(rumor, separators=(",", ":")).encode())
        ev = self._publish(group_id, group, message)
        self._record(new)
        return ev

    def commit(self, group_id: str, *, add: list[Event] = (), remove: list[str] = (), add_admins: list[str] = (),
               remove_admins: list[str] = ()) -> tuple[Event, list[dict]]:
        """Add members (key package events), remove accounts, change the admins (MDK-profile groups:
        through the group data), or update our leaf (none of these); returns the kind 445 commit to
        publish first and the welcome rumors to send after it."""
        group = self.group(group_id)
        state = profile.read_group_state(group.context)
        components = state.profile == "components"
        kps = [self._member_key_package(ev, require_proof=components) for ev in add]
        if components:
            required = profile.required_components(group.context)
            for kp, _ in kps:
                profile.check_supports_required(required, kp.leaf_node, "that key package")
        else:
            _check_mdk_invitees(None, kps, ())
        members = {leaf.credential.identity.hex() for _, leaf in group.tree.leaves() if leaf.credential.identity}
        unknown = sorted(set(remove) - members)
        if unknown:
            raise MarmotError(f"not a member of this group: {', '.join(unknown)}", "commit.unknown_member")
        leaves = [i for i, leaf in group.tree.leaves() if leaf.credential.identity and
                  leaf.credential.identity.hex() in set(remove)]
        extensions = None
        if add_admins or remove_admins or not components:
            if components:
                raise MarmotError("admin changes in a components group (an AppDataUpdate of 0x8003) are not "
                                  "supported: only MDK-compatible groups change their admins here",
                                  "commit.unsupported")
            leaving = {group.tree.leaf(s.index).credential.identity.hex() for p, s in group.pending.values()
                       if p.proposal_type == P_SELF_REMOVE and group.tree.leaf(s.index) is not None}
            after = (members - set(remove) - leaving) | {ev.pubkey for _, ev in kps}
            extensions = _mdk_commit_extensions(self.account, group.context, state, bool(kps or leaves), after,
                                                add_admins, remove_admins)
        out = group.commit(add=[kp for kp, _ in kps], remove=leaves, group_context_extensions=extensions)
        ev = self._publish(group_id, group, out.message)
        relays = self.groups[group_id]["relays"]
        rumors = [transport.build_welcome_rumor(self.account, out.welcome, e.id, relays) for _, e in kps]
        self._record(out.group)
        return ev, rumors

    def leave(self, group_id: str) -> Event:
        """A SelfRemove proposal (a PublicMessage, in a kind 445 event): another member's next commit
        removes our leaf. An admin first gives its admin rights away: MDK refuses an admin's
        SelfRemove, and admin-policy-v1 lets an admin leave only while another admin remains."""
        group = self.group(group_id)
        state = profile.read_group_state(group.context)
        me = bytes.fromhex(self.account)
        if me in state.admins:
            others = {leaf.credential.identity for _, leaf in group.tree.leaves()} & set(state.admins) - {me}
            if state.profile == "mdk" or not others:
                raise MarmotError("an admin cannot leave while it is an admin: give the admin rights away first "
                                  "(commit --remove-admin, with another admin remaining)", "leave.admin")
        new, message = group.propose(mls.SelfRemove())
        ev = self._publish(group_id, group, message)
        self._record(new)
        return ev

    def receive(self, ev: Event, *, draft: bool = False) -> Received:
        """Process one kind 445 event of a group we are in."""
        h = transport.check_group_message(ev)
        gid = self.group_by_h(h)
        record = self.groups[gid]
        if ev.id in record.get("own", ()):
            raise MarmotError("this event is our own (its changes are already applied)", "message.own")
        group = self.group(gid)
        message = None
        for entry in reversed(record["event_keys"]):
            try:
                message = transport.decrypt_group_message(bytes.fromhex(entry["key"]), ev)
                break
            except TransportError as exc:
                if exc.code != "transport.decrypt":
                    raise
        if message is None:
            raise TransportError("no epoch key of this group opens the event", "transport.decrypt")
        external = _is_external_commit(message)
        try:
            if external:
                if not draft:
                    raise DraftDisabled("an External Commit (a new device joining) is refused here: the "
                                        "multi-device join is a draft feature, off on this device")
                processed = multidevice.process_external_commit(group, message)
            else:
                processed = group.process(message, validate=_admin_gate)
        except mls.MLSError as exc:
            raise MarmotError(f"the MLS message is invalid: {exc}", "mls.invalid") from None
        if processed.kind == "proposal" and processed.proposal.proposal_type == P_SELF_REMOVE:
            state = profile.read_group_state(group.context)
            leaver = processed.sender_leaf.credential.identity if processed.sender_leaf else None
            others = {leaf.credential.identity for _, leaf in group.tree.leaves()} & set(state.admins) - {leaver}
            if leaver in state.admins and (state.profile == "mdk" or not others):
                # MDK refuses an admin's SelfRemove; admin-policy-v1: only while another admin remains
                raise MarmotError("an admin's SelfRemove is refused: it must give its admin rights away first",
                                  "proposal.admin_self_remove")
        if processed.kind == "proposal" and _is_join_authorization(processed.proposal):
            # Standalone: never valid (multi-device-join-authorization-v1.md, carrier rules); not kept.
            raise MarmotError("a standalone join authorization proposal is invalid",
                              "multi_device.authorization_misplaced")
        sender_leaf = processed.sender_leaf
        sender = sender_leaf.credential.identity.hex() if sender_leaf and sender_leaf.credential.identity else None
        rumor = None
        if processed.kind == "application":
            rumor = _application_rumor(processed.application_data, sender)
        if processed.removed_self:
            del self.groups[gid]
        else:
            self._record(processed.group)
        return Received(processed.kind, gid, processed.epoch, rumor, sender, external)

    # -- the draft multi-device join -----------------------------------------------------------------

    def pairing_entry(self, group_id: str) -> tuple[bytes, bytes, bytes]:
        """(group_event_key, join_psk, GroupInfo) of the group's current epoch, for a pairing payload."""
        group = self.group(group_id)
        _, psk = multidevice.join_psk(group)
        return multidevice.group_event_key(group), psk, group.group_info()

    def finish_external_join(self, pending: multidevice.PendingJoin, proof: bytes, *, name: str = "") -> Event:
        group, message = multidevice.finish_external_join(pending, self.secret, proof)
        h = profile.read_group_state(pending.candidate_context()).h
        # Published under the parent epoch's outer key (the one the pairing payload carried).
        ev = transport.encrypt_group_message(_parent_event_key(pending), bytes.fromhex(h), message)
        record = self._record(group, name=name, draft=True)
        record["own"].append(ev.id)
        return ev

    # -- persistence -----------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"key_packages": self.key_packages, "groups": self.groups}

    @classmethod
    def from_json(cls, secret: str, data: dict | None) -> "Device":
        data = data or {}
        return cls(secret, dict(data.get("key_packages", {})), dict(data.get("groups", {})))


def _parent_event_key(pending: multidevice.PendingJoin) -> bytes:
    key = pending.group_event_key
    if len(key) != 32:
        raise MarmotError("the pending join does not carry the epoch's group_event_key", "state.pending")
    return key


def _check_mdk_invitees(creator: str | None, kps, admins) -> None:
    """What MDK 0.8.0 asks of a group it would create: every invitee supports its group data
    (0xf2ee); the creator is not invited again; every admin is the creator or an invitee."""
    invitees = {ev.pubkey for _, ev in kps}
    for kp, ev in kps:
        if comp.EXT_MDK_GROUP_DATA not in kp.leaf_node.capabilities.extensions:
            raise ComponentError(f"the key package of {ev.pubkey} does not support MDK's group data (0xf2ee)",
                                 "component.unsupported")
    if creator is not None and creator in invitees:
        raise ComponentError("an MDK-compatible group's creator cannot also be invited", "component.group_data.admin")
    for admin in admins:
        if admin != creator and admin not in invitees:
            raise ComponentError(f"admin {admin} is neither the creator nor an invitee of the group",
                                 "component.group_data.admin")


def _mdk_commit_extensions(account: str, context: GroupContext, state, membership: bool, after: set[str],
                           add_admins, remove_admins):
    """The GroupContext extensions an MDK-profile commit carries (None when the admins stay), after
    MDK's own rules: only an admin adds, removes or changes the group data; the admins after the
    commit are members, and at least one of them remains (MDK refuses the commit otherwise)."""
    me = bytes.fromhex(account)
    changes = bool(add_admins or remove_admins)
    if not (membership or changes):
        return None  # a self-update: any member may commit one
    if me not in state.admins:
        raise MarmotError("only an admin of this group may add or remove members or change its admins",
                          "commit.not_admin")
    admins = {a.hex() for a in state.admins}
    for key in list(add_admins) + list(remove_admins):
        if not isinstance(key, str) or len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise MarmotError(f"{key!r} is not a 64-character lowercase hex public key", "commit.admin")
    new_admins = (admins | set(add_admins)) - set(remove_admins)
    strangers = sorted(set(add_admins) - after)
    if strangers:
        raise MarmotError(f"an admin must be a member of the group: {', '.join(strangers)}", "commit.admin_not_member")
    if not new_admins & after:
        raise MarmotError("the commit would leave the group with no admin among its members", "commit.no_admin")
    if not changes:
        return None
    data = state.group_data.with_admins(bytes.fromhex(a) for a in new_admins)
    return tuple(Extension(e.extension_type, data.encode()) if e.extension_type == comp.EXT_MDK_GROUP_DATA
                 else e for e in context.extensions)


# admin-policy-v1.md, "Admin-Gated Actions": inviting, removing another member, changing group state.
_ADMIN_GATED = {1, 7, 0x0008}  # Add, GroupContextExtensions, AppDataUpdate


def _admin_gate(view) -> None:
    """Refuse a member's Commit that does what only an active admin may do."""
    sender_leaf = view.tree.leaf(view.sender.index) if view.sender.sender_type == 1 else None
    if sender_leaf is None:
        return  # External Commits have their own rules (multidevice.py)
    account = sender_leaf.credential.identity
    if any(_is_join_authorization(p) for p in view.proposals):
        raise MarmotError("a join authorization (AppEphemeral 0x800a) is valid only inside a multi-device "
                          "External Commit", "multi_device.authorization_misplaced")
    state = profile.read_group_state(view.parent_context)
    if state.profile == "mdk":
        _check_mdk_commit(view, account, state)
        return
    if state.profile == "components":
        _check_component_leaves(view, account)
    gated = any(p.proposal_type in _ADMIN_GATED for p in view.proposals)
    for p in view.proposals:
        if p.proposal_type == 3:  # Remove: of another account's leaf
            removed = view.tree.leaf(p.removed)
            if removed is not None and removed.credential.identity != account:
                gated = True
    if gated and account not in state.admins:
        raise MarmotError("only an active admin may add or remove members or change group state",
                          "commit.not_admin")


def _check_mdk_commit(view, account: bytes, state) -> None:
    """A member's Commit in an MDK-profile group, refused where MDK 0.8.0 refuses it (so both stay on
    one branch): no leaf changes its account; an admin's Commit leaves at least one admin among the
    members (with the admins its new group data names, if any); anyone else may only update its own
    leaf (a pure self-update)."""
    if view.path_leaf is not None and view.path_leaf.credential.identity != account:
        raise MarmotError("a committer's new leaf names another account", "commit.identity_changed")
    senders = view.proposal_senders or (view.sender,) * len(view.proposals)
    for p, s in zip(view.proposals, senders):
        if p.proposal_type == 2:  # Update: the proposer's replacement leaf
            old = view.tree.leaf(s.index) if s.sender_type == 1 else None
            if old is None or p.leaf_node.credential.identity != old.credential.identity:
                raise MarmotError("an Update changes its member's account", "commit.identity_changed")
    if account in state.admins:
        admins = state.admins
        for p in view.proposals:
            if p.proposal_type == 7:  # GroupContextExtensions: the new group data
                ext = next((e for e in p.extensions if e.extension_type == comp.EXT_MDK_GROUP_DATA), None)
                if ext is None:
                    raise MarmotError("the commit drops the group data (0xf2ee)", "commit.group_data")
                # MDK 0.8.0 refuses a group whose required_capabilities no longer requires 0xf2ee
                req = next((e for e in p.extensions if e.extension_type == EXT_REQUIRED_CAPABILITIES), None)
                try:
                    required = RequiredCapabilities.decode(req.extension_data).extension_types if req else ()
                except mls.MLSError:
                    required = ()
                if comp.EXT_MDK_GROUP_DATA not in required:
                    raise MarmotError("the commit's required_capabilities no longer requires the group data "
                                      "(0xf2ee)", "commit.group_data")
                try:
                    admins = frozenset(comp.MdkGroupData.decode(ext.extension_data).admins)
                except MarmotError as exc:
                    raise MarmotError(f"the commit's group data is invalid: {exc.reason}", "commit.group_data") \
                        from None
        _check_admins_remain(view, senders, admins)
        return
    own_updates = all(p.proposal_type == 2 and s.sender_type == 1 and s.index == view.sender.index
                      for p, s in zip(view.proposals, senders))
    self_removes = bool(view.proposals) and all(p.proposal_type == P_SELF_REMOVE
                                                for p in view.proposals)
    if self_removes:  # anyone may commit members' own departures (MDK: SelfRemove-only commits)
        _check_admins_remain(view, senders, state.admins)
    elif not own_updates or (view.path_leaf is None and not view.proposals):
        raise MarmotError("only an admin may add or remove members or change the group data",
                          "commit.not_admin")


def _check_admins_remain(view, senders, admins) -> None:
    """MDK's invariant after a Commit: at least one admin is still a member."""
    removed = {p.removed for p in view.proposals if p.proposal_type == 3}
    removed |= {s.index for p, s in zip(view.proposals, senders) if p.proposal_type == P_SELF_REMOVE}
    after = {leaf.credential.identity for i, leaf in view.tree.leaves() if i not in removed}
    after |= {p.key_package.leaf_node.credential.identity for p in view.proposals if p.proposal_type == 1}
    if not admins & after:
        raise MarmotError("the commit would leave the group with no admin among its members", "commit.no_admin")


def _check_component_leaves(view, committer: bytes) -> None:
    """Every leaf a member's Commit brings into a component group carries a valid 0x8009 proof, and a
    replaced leaf keeps its account (account-identity-proof-v2.md, Lifecycle); every leaf of the
    resulting group supports every component it requires (app-components/README.md, Negotiation)."""
    parent = view.parent_context
    suite = parent.cipher_suite
    context = parent
    try:
        for p in view.proposals:
            if p.proposal_type == 7:  # GroupContextExtensions: the new context must stay valid
                context = GroupContext(parent.version, suite, parent.group_id, parent.epoch, b"", b"", p.extensions)
                profile.check_group_context(context)
        required = profile.required_components(context)
        removed = {p.removed for p in view.proposals if p.proposal_type == 3}
        updated = set()
        for p in view.proposals:
            if p.proposal_type == 1:  # Add
                profile.check_key_package_extensions(p.key_package)
                profile.account_of_leaf(p.key_package.leaf_node, suite)
                profile.check_supports_required(required, p.key_package.leaf_node, "an added member")
            elif p.proposal_type == 2:  # Update (by reference): the member's replacement leaf
                profile.check_supports_required(required, p.leaf_node, "an updated leaf")
        if view.path_leaf is not None:
            if profile.account_of_leaf(view.path_leaf, suite) != committer:
                raise MarmotError("a committer's new leaf names another account", "commit.identity_changed")
            profile.check_supports_required(required, view.path_leaf, "the committer's new leaf")
            updated.add(view.sender.index)
        if context is not parent:  # a new requirement binds every member that stays
            for index, leaf in view.tree.leaves():
                if index not in removed and index not in updated:
                    profile.check_supports_required(required, leaf, f"member leaf {index}")
    except (ProofError, ComponentError) as exc:
        raise MarmotError(f"the Commit brings an invalid leaf or state: {exc.reason}", exc.code) from None


def _is_join_authorization(p) -> bool:
    return p.proposal_type == 0x0009 and getattr(p, "component_id", None) == 0x800A


def _welcome_signer(welcome: bytes, kps: mls.KeyPackageSecrets) -> int:
    """The leaf index that signed the welcome's GroupInfo (the MLS core verified that signature)."""
    from .mls import keyschedule as ks
    from .mls.codec import decode_exact
    from .mls.structs import GroupInfo, GroupSecrets

    w = MLSMessage.decode(welcome).body
    ref = mls.key_package_ref(kps.key_package)
    entry = next(s for s in w.secrets if s.new_member == ref)
    ct = entry.encrypted_group_secrets
    gs = decode_exact(mls.crypto.decrypt_with_label(kps.init_priv, b"Welcome", w.encrypted_group_info,
                                                    ct.kem_output, ct.ciphertext), GroupSecrets.read)
    if gs.psks:  # our welcomes never carry PSKs; the MLS core already refused ones we cannot open
        raise MarmotError("welcomes with PSKs are not supported", "welcome.psk")
    member_prk = mls.crypto.extract(gs.joiner_secret, ks.psk_secret([]))
    key, nonce = ks.welcome_key_nonce(mls.crypto.derive_secret(member_prk, b"welcome"))
    return decode_exact(mls.crypto.aead_open(key, nonce, b"", w.encrypted_group_info), GroupInfo.read).signer


def _is_external_commit(message: bytes) -> bool:
    try:
        msg = MLSMessage.decode(message)
    except mls.MLSError:
        return False
    return msg.wire_format == WF_PUBLIC_MESSAGE and msg.body.content.sender.sender_type == SENDER_NEW_MEMBER_COMMIT


def _application_rumor(data: bytes, sender: str | None) -> dict:
    """The unsigned Nostr rumor an application message carries; its author must be the MLS sender."""
    try:
        rumor = nip59.parse_rumor(json.loads(data))
    except (ValueError, nip59.UnwrapError) as exc:
        raise MarmotError(f"the application payload is not an unsigned Nostr event: {exc}", "payload.invalid") from None
    if sender is not None and rumor["pubkey"] != sender:
        raise MarmotError("the application payload's pubkey is not the MLS sender's account", "payload.sender")
    return rumor

