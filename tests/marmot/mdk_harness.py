"""MDK (the reference Marmot implementation, Rust on OpenMLS) driven from Python for interop tests.

`mdk_or_skip()` imports the `mdk-python` bindings or skips the calling test with the reason (install
them with `../shared/tools/install-mdk-python.sh .venv/bin/python`; `.ci/run` does).
`MdkClient` is one Marmot account on one device: its Nostr keys, an MDK instance with its own
database, and a websocket connection to the appliance's relay through which every event goes.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from appliance.marmot import transport as tp
from appliance.nostr.event import Event, parse_event, sign_event
from appliance.nostr.keys import generate_secret, public_key


def mdk_or_skip():
    try:
        import mdk  # noqa: F401
    except Exception as exc:  # ImportError, or OSError when the shared library cannot load
        pytest.skip(f"MDK (mdk-python 0.8.0) cannot load here: {exc!r}; run "
                    "../shared/tools/install-mdk-python.sh .venv/bin/python to install it")
    return mdk


class MdkClient:
    """One MDK account/device talking to the appliance relay over a websocket Client (tests/conftest.py)."""

    def __init__(self, name: str, workdir: Path, relay_url: str, client):
        mdk = mdk_or_skip()
        self.name = name
        self.secret = generate_secret()
        self.pubkey = public_key(self.secret)
        self.relay_url = relay_url
        self.client = client
        self.mdk = mdk.new_mdk_with_key(str(workdir / f"{name}.db"), os.urandom(32), None)
        self.published: list[dict] = []

    # -- relay I/O -----------------------------------------------------------------------------

    async def publish(self, ev: Event | dict | str) -> dict:
        """Publish an event; the relay must accept it (OK true)."""
        d = orjson.loads(ev) if isinstance(ev, str) else (ev.to_dict() if isinstance(ev, Event) else ev)
        ok, msg = await self.client.publish(d)
        assert ok, f"{self.name}: relay refused kind {d['kind']}: {msg}"
        self.published.append(d)
        return d

    async def fetch(self, sub: str, flt: dict) -> list[dict]:
        events, closed = await self.client.req(sub, flt)
        assert closed is None, f"{self.name}: REQ {flt} closed: {closed}"
        return events

    # -- account transport ---------------------------------------------------------------------

    async def publish_key_package(self) -> tuple[dict, dict]:
        """MDK builds the key package and its tags; we sign kind 30443 and the legacy kind 443 beside it,
        plus the kind 10051 key package relay list."""
        kp = self.mdk.create_key_package_for_event(self.pubkey, [self.relay_url])
        ev = await self.publish(sign_event(self.secret, tp.KEY_PACKAGE_KIND, kp.tags, kp.key_package))
        legacy = await self.publish(sign_event(self.secret, tp.LEGACY_KEY_PACKAGE_KIND, kp.tags_legacy,
                                               kp.key_package))
        await self.publish(tp.build_key_package_relays(self.secret, [self.relay_url]))
        return ev, legacy

    async def fetch_key_package(self, pubkey: str) -> str:
        """The account's relay list, then its newest kind 30443 key package, fetched by author."""
        lists = await self.fetch("kprelays", {"kinds": [tp.KEY_PACKAGE_RELAYS_KIND], "authors": [pubkey]})
        assert lists and tp.parse_key_package_relays(parse_event(lists[0])) == [self.relay_url]
        events = await self.fetch("kp", {"kinds": [tp.KEY_PACKAGE_KIND], "authors": [pubkey], "limit": 1})
        assert len(events) == 1
        ev = parse_event(events[0])
        tp.parse_key_package_event(ev)  # our outer checks hold for MDK's publication
        self.mdk.parse_key_package(ev.to_json())
        return ev.to_json()

    # -- welcomes --------------------------------------------------------------------------------

    async def send_welcomes(self, rumors_json: list[str], recipients: list[str]) -> None:
        """Gift-wrap each kind 444 rumor to its invitee and publish the kind 1059 wraps."""
        for rumor_json, recipient in zip(rumors_json, recipients, strict=True):
            rumor = orjson.loads(rumor_json)
            tp.parse_welcome_rumor(rumor)  # MDK's rumor passes our transport checks
            await self.publish(tp.wrap_welcome(rumor, self.secret, recipient))

    async def accept_welcome(self, expected_group: str) -> None:
        """Fetch our gift wraps by #p (after AUTH: gift wraps are recipient-gated), open, join."""
        assert (await self.client.auth(self.secret, self.relay_url))[0]
        wraps = await self.fetch("wraps", {"kinds": [1059], "#p": [self.pubkey]})
        assert wraps, f"{self.name}: no gift wrap for us on the relay"
        for raw in wraps:
            wrap = parse_event(raw)
            welcome = tp.unwrap_welcome(wrap, self.secret)
            pending = self.mdk.process_welcome(wrap.id, orjson.dumps(welcome.rumor).decode())
            if pending.mls_group_id == expected_group:
                self.mdk.accept_welcome(pending)
                return
        raise AssertionError(f"{self.name}: no welcome for group {expected_group}")

    # -- group messages ----------------------------------------------------------------------------

    async def send(self, group_id: str, text: str) -> dict:
        return await self.publish(self.mdk.create_message(group_id, self.pubkey, text, 9, None, None))

    async def publish_commit(self, group_id: str, result) -> dict:
        """Publish a commit (kind 445), then merge it locally (publish-before-apply)."""
        ev = await self.publish(result.evolution_event_json)
        self.mdk.merge_pending_commit(group_id)
        return ev

    async def receive(self, nostr_group_id: str, seen: set[str]) -> list:
        """Fetch the group's kind 445 events by #h and process those not yet seen, oldest first."""
        events = await self.fetch("h", {"kinds": [tp.GROUP_MESSAGE_KIND], "#h": [nostr_group_id]})
        results = []
        for raw in sorted(events, key=lambda e: e["created_at"]):
            if raw["id"] in seen:
                continue
            seen.add(raw["id"])
            tp.check_group_message(parse_event(raw))
            results.append(self.mdk.process_message(orjson.dumps(raw).decode()))
        return results
