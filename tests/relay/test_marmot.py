"""Marmot group messages (kind 445) through the relay: shape rules, and real MDK clients.

MDK (the reference Marmot implementation, `mdk-python`) is installed by `.ci/run` through
`../shared/tools/install-mdk-python.sh`; without it the MDK test is skipped with the reason.
"""

from __future__ import annotations

import base64
import json
import os

import pytest

pytestmark = pytest.mark.anyio

GROUP_ID = "ab" * 32
CIPHERTEXT = base64.b64encode(bytes(range(40))).decode()


async def test_group_message_shape(server, alice, connect):
    c = await connect(server.url)
    ok = alice.sign(445, [["h", GROUP_ID]], CIPHERTEXT)
    assert await c.publish(ok) == (True, "")
    # Other tags are allowed beside the one h tag.
    assert (await c.publish(alice.sign(445, [["h", GROUP_ID], ["e", "cd" * 32]], CIPHERTEXT)))[0]
    refused = {
        "two h tags": alice.sign(445, [["h", GROUP_ID], ["h", "cd" * 32]], CIPHERTEXT),
        "an h tag and a bare h": alice.sign(445, [["h", GROUP_ID], ["h"]], CIPHERTEXT),
        "no h tag": alice.sign(445, [], CIPHERTEXT),
        "uppercase h": alice.sign(445, [["h", GROUP_ID.upper()]], CIPHERTEXT),
        "uuid h": alice.sign(445, [["h", "0b7a2d6e-1c4b-4f7a-9d2e-3a5b6c7d8e9f"]], CIPHERTEXT),
        "not base64": alice.sign(445, [["h", GROUP_ID]], "not base64!"),
        "too short": alice.sign(445, [["h", GROUP_ID]], base64.b64encode(bytes(27)).decode()),
    }
    for what, ev in refused.items():
        accepted, message = await c.publish(ev)
        assert not accepted and message.startswith("invalid: "), what
    # Served by #h on REQ and COUNT; never treated as a NIP-29 group (no "group not found").
    events, closed = await c.req("h", {"kinds": [445], "#h": [GROUP_ID]})
    assert closed is None and len(events) == 2
    assert (await c.count("n", {"#h": [GROUP_ID]}))[2] == {"count": 2}


def _mdk():
    try:
        import mdk
    except Exception as exc:  # not installed, or its shared library does not load here
        pytest.skip(f"mdk-python (MDK) cannot load: {exc!r}; run ../shared/tools/install-mdk-python.sh")
    return mdk


class MarmotUser:
    """A Nostr identity with its own MDK state (an encrypted SQLite file)."""

    def __init__(self, mdk, identity, path):
        self.id = identity
        self.mdk = mdk.new_mdk_with_key(str(path), os.urandom(32), None)

    def key_package_event(self, relay: str) -> str:
        kp = self.mdk.create_key_package_for_event(self.id.pubkey, [relay])
        return json.dumps(self.id.sign(443, kp.tags, kp.key_package).to_dict())


async def test_mdk_clients_exchange_group_messages(server, alice, bob, connect, tmp_path):
    mdk = _mdk()
    a, b = MarmotUser(mdk, alice, tmp_path / "alice.mdk"), MarmotUser(mdk, bob, tmp_path / "bob.mdk")
    created = a.mdk.create_group(alice.pubkey, [b.key_package_event(server.url)], "ops", "", [server.url],
                                 [alice.pubkey])
    group = created.group
    a.mdk.merge_pending_commit(group.mls_group_id)
    for rumor in created.welcome_rumors_json:  # delivered by gift wrap in real life
        b.mdk.accept_welcome(b.mdk.process_welcome("00" * 32, rumor))
    h = group.nostr_group_id
    assert len(h) == 64

    ca, cb = await connect(server.url), await connect(server.url)
    await cb.send(["REQ", "live", {"kinds": [445], "#h": [h]}])
    assert (await cb.expect(lambda m: m[0] == "EOSE"))[1] == "live"

    first = json.loads(a.mdk.create_message(group.mls_group_id, alice.pubkey, "hello bob", 9, None, None))
    assert first["kind"] == 445 and first["pubkey"] != alice.pubkey  # a one-time key signs it
    assert await ca.publish(first) == (True, "")
    live = await cb.expect(lambda m: m[0] == "EVENT" and m[1] == "live")
    assert live[2]["id"] == first["id"]

    # Bob reads it by #h (as MDK clients fetch a group's messages) and decrypts it with MDK.
    events, closed = await cb.req("hist", {"kinds": [445], "#h": [h]})
    assert closed is None and [e["id"] for e in events] == [first["id"]]
    result = b.mdk.process_message(json.dumps(events[0]))
    assert result.is_application_message()
    assert json.loads(result.message.event_json)["content"] == "hello bob"

    reply = json.loads(b.mdk.create_message(group.mls_group_id, bob.pubkey, "hi alice", 9, None, None))
    assert await cb.publish(reply) == (True, "")
    events, _ = await ca.req("hist", {"kinds": [445], "#h": [h], "since": first["created_at"]})
    assert {e["id"] for e in events} == {first["id"], reply["id"]}
    got = a.mdk.process_message(json.dumps(next(e for e in events if e["id"] == reply["id"])))
    assert json.loads(got.message.event_json)["content"] == "hi alice"
    assert (await ca.count("n", {"kinds": [445], "#h": [h]}))[2] == {"count": 2}
    # A resend is already stored: accepted (NIP-01 duplicate), stored once.
    assert await ca.publish(first) == (True, "duplicate: already have this event")
    assert (await ca.count("n2", {"#h": [h]}))[2] == {"count": 2}

