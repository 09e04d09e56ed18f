"""The Marmot transport kinds besides 445 through the relay: key packages (30443 and legacy 443), key
package relay lists (10051), gift-wrapped welcomes (1059, recipient-gated), and the refusals of the
local-only signing templates (450, 451, 452) and of bare welcome rumors (444)."""

from __future__ import annotations

import base64
import time

import pytest

from appliance.marmot import transport as tp
from appliance.nostr.event import parse_event
from appliance.nostr.keys import generate_secret, public_key

pytestmark = pytest.mark.anyio

KP = base64.b64encode(b"\x00\x01\x00\x01" + bytes(60)).decode()


def _kp_tags(d="slot-1", encoding="base64"):
    tags = [["d", d], ["mls_protocol_version", "1.0"], ["i", "ab" * 32], ["mls_ciphersuite", "0x0001"],
            ["mls_extensions", "0x000a", "0xf2ee"], ["mls_proposals", "0x000a"], ["relays", "ws://127.0.0.1"]]
    if encoding is not None:
        tags.append(["encoding", encoding])
    return tags


async def test_key_packages_and_relay_lists(server, alice, connect):
    c = await connect(server.url)
    built = tp.build_key_package_event(alice.secret, b"\x00\x01\x00\x01kp", key_package_ref=b"\x01" * 32,
                                       ciphersuite=1, extensions=[10], proposals=[10], relays=[server.url])
    assert await c.publish(built) == (True, "")
    accepted = {
        "30443": alice.sign(30443, _kp_tags(d="slot-2"), KP),
        "443 base64": alice.sign(443, _kp_tags()[1:], KP),
        "443 hex (MIP-00's first form)": alice.sign(443, _kp_tags(encoding=None)[1:], "0001000102"),
        "10051": alice.sign(10051, [["relay", server.url], ["relay", "wss://other.example"]], ""),
        "10051 empty (newer)": alice.sign(10051, [], "", created_at=int(time.time()) + 1),
    }
    for what, ev in accepted.items():
        assert await c.publish(ev) == (True, ""), what
    # transports/nostr.md describes kind 10051 (relay tags, empty content) but makes none of it a
    # MUST: the relay stores what NIP-01 allows (spec note M13), the newest one replacing the others.
    lenient = {
        "10051 content": alice.sign(10051, [["relay", server.url]], "not empty", created_at=int(time.time()) + 2),
        "10051 bare relay tag": alice.sign(10051, [["relay"]], "", created_at=int(time.time()) + 3),
    }
    for what, ev in lenient.items():
        assert await c.publish(ev) == (True, ""), what
    refused = {
        "30443 without d": alice.sign(30443, _kp_tags()[1:], KP),
        "30443 empty d": alice.sign(30443, _kp_tags(d=""), KP),
        "30443 without encoding": alice.sign(30443, _kp_tags(encoding=None), KP),
        "30443 hex encoding": alice.sign(30443, _kp_tags(encoding="hex"), "00010001"),
        "30443 two encodings": alice.sign(30443, _kp_tags() + [["encoding", "base64"]], KP),
        "30443 not base64": alice.sign(30443, _kp_tags(), "not base64!"),
        "30443 empty": alice.sign(30443, _kp_tags(), ""),
        "30443 i not hex": alice.sign(30443, [t if t[0] != "i" else ["i", "zz"] for t in _kp_tags()], KP),
        "443 other encoding": alice.sign(443, _kp_tags(encoding="hex")[1:], "00"),
        "443 not hex": alice.sign(443, _kp_tags(encoding=None)[1:], "xyz"),
    }
    for what, ev in refused.items():
        ok, message = await c.publish(ev)
        assert not ok and message.startswith("invalid: "), (what, message)
    # Fetched by author, as inviters look them up; the addressable kind keeps one per d.
    events, closed = await c.req("kp", {"kinds": [30443], "authors": [alice.pubkey]})
    assert closed is None and len(events) == 2
    stored = parse_event(next(e for e in events if e["id"] == built.id))
    assert tp.parse_key_package_event(stored).key_package == b"\x00\x01\x00\x01kp"
    events, _ = await c.req("legacy", {"kinds": [443], "authors": [alice.pubkey]})
    assert len(events) == 2
    events, _ = await c.req("lists", {"kinds": [10051], "authors": [alice.pubkey]})
    assert [e["tags"] for e in events] == [[["relay"]]]  # replaceable: the newest list replaced the others


async def test_gift_wrapped_welcomes_are_recipient_gated(server, alice, bob, connect):
    carol = generate_secret()
    rumor = tp.build_welcome_rumor(alice.pubkey, b"\x00\x01\x00\x03w", "cd" * 32, [server.url])
    wrap = tp.wrap_welcome(rumor, alice.secret, bob.pubkey)
    c = await connect(server.url)
    assert await c.publish(wrap) == (True, "")
    unaddressed = alice.sign(1059, [], "ciphertext")
    ok, message = await c.publish(unaddressed)
    assert not ok and message.startswith("invalid: ") and "p tag" in message

    # Not readable without AUTH, nor by a third party; readable by the recipient, who opens it.
    _, closed = await c.req("anon", {"kinds": [1059], "#p": [bob.pubkey]})
    assert closed is not None and closed[2].startswith("auth-required:")
    other = await connect(server.url)
    assert (await other.auth(carol, server.url))[0]
    events, closed = await other.req("third", {"kinds": [1059], "#p": [bob.pubkey]})
    assert closed is None and events == []
    mine = await connect(server.url)
    assert (await mine.auth(bob.secret, server.url))[0]
    events, closed = await mine.req("inbox", {"kinds": [1059], "#p": [bob.pubkey]})
    assert closed is None and [e["id"] for e in events] == [wrap.id]
    opened = tp.unwrap_welcome(parse_event(events[0]), bob.secret)
    assert opened.sender == alice.pubkey and opened.welcome == b"\x00\x01\x00\x03w"
    assert public_key(carol) not in {t[1] for t in events[0]["tags"]}


@pytest.mark.parametrize("kind,prefix,words", [
    (450, "blocked: ", "local-only"), (451, "blocked: ", "local-only"), (452, "blocked: ", "local-only"),
    (444, "invalid: ", "gift wraps"),
])
async def test_local_only_kinds_and_bare_rumors_refused(server, alice, connect, kind, prefix, words):
    c = await connect(server.url)
    ok, message = await c.publish(alice.sign(kind, [["d", "marmot.account-identity-proof.v2"]], "x"))
    assert not ok and message.startswith(prefix) and words in message, message
    events, _ = await c.req("none", {"kinds": [kind]})
    assert events == []
