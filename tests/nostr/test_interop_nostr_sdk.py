"""Interop with rust-nostr (nostr_sdk Python bindings): events and NIP-44 payloads both ways."""

from __future__ import annotations

import pytest

from appliance.nostr import nip44
from appliance.nostr.event import parse_event, sign_event, verify_event
from appliance.nostr.keys import generate_secret, public_key

ns = pytest.importorskip("nostr_sdk", reason="nostr_sdk (rust-nostr bindings) is not installed")

CONTENTS = [
    "hello",
    "",
    'quotes " backslash \\ slash / controls \x00\x01\x1f\x7f \t\n\r\b\f',
    "unicode é 中文 😀🦄 \u2028\u2029 \ufeff \U0010ffff",
]
TAGS = [["p", "b" * 64, "wss://relay.example.com"], ["t", "x\ny"], ["e", "1" * 64], ["d", ""], ["expiration", "1900000000"]]


def _sdk_sign(keys, kind, tags, content, created_at):
    builder = (
        ns.EventBuilder(ns.Kind(kind), content)
        .tags([ns.Tag.parse(t) for t in tags])
        .custom_created_at(ns.Timestamp.from_secs(created_at))
    )
    return keys.sign_event(builder.finalize_unsigned(keys.public_key()))


@pytest.mark.parametrize("content", CONTENTS)
def test_sdk_events_verify_here(content):
    import orjson

    keys = ns.Keys.generate()
    for kind in (1, 30023, 22242):
        sdk_ev = _sdk_sign(keys, kind, TAGS, content, 1_700_000_000)
        ev = parse_event(orjson.loads(sdk_ev.as_json()))
        assert verify_event(ev)
        assert ev.pubkey == keys.public_key().to_hex()
        assert ev.id == sdk_ev.id().to_hex()
        assert ev.content == content and ev.kind == kind
        # Re-serialising gives the same JSON rust-nostr produced.
        assert orjson.loads(ev.to_json()) == orjson.loads(sdk_ev.as_json())


@pytest.mark.parametrize("content", CONTENTS)
def test_our_events_verify_in_sdk(content):
    sk = generate_secret()
    ev = sign_event(sk, 1, TAGS, content, created_at=1_700_000_000)
    sdk_ev = ns.Event.from_json(ev.to_json())
    assert sdk_ev.verify()
    assert sdk_ev.id().to_hex() == ev.id
    assert sdk_ev.author().to_hex() == public_key(sk)
    assert sdk_ev.content() == content


def test_sdk_rejects_our_tampered_event():
    ev = sign_event(generate_secret(), 1, [], "x", created_at=1)
    d = ev.to_dict()
    d["content"] = "y"
    import orjson

    # rust-nostr either refuses to parse or refuses to verify; both are fine.
    try:
        sdk_ev = ns.Event.from_json(orjson.dumps(d).decode())
    except Exception:
        return
    assert not sdk_ev.verify()


MESSAGES = ["a", "hello nostr", "😀" * 100, "x" * 1000, "y" * 65000]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: f"len{len(m.encode())}")
def test_nip44_both_ways(msg):
    sk_a, sk_b = generate_secret(), generate_secret()
    pk_a, pk_b = public_key(sk_a), public_key(sk_b)
    sdk_sk_a = ns.SecretKey.parse(sk_a)
    sdk_sk_b = ns.SecretKey.parse(sk_b)
    sdk_pk_a = ns.PublicKey.parse(pk_a)
    sdk_pk_b = ns.PublicKey.parse(pk_b)

    # theirs -> ours
    payload = ns.nip44_encrypt(sdk_sk_a, sdk_pk_b, msg, ns.Nip44Version.V2)
    assert nip44.decrypt(payload, nip44.get_conversation_key(sk_b, pk_a)) == msg
    # ours -> theirs
    ours = nip44.encrypt(msg, nip44.get_conversation_key(sk_a, pk_b))
    assert ns.nip44_decrypt(sdk_sk_b, sdk_pk_a, ours) == msg


def test_nip44_sdk_refuses_tampered_payload():
    sk_a, sk_b = generate_secret(), generate_secret()
    ours = nip44.encrypt("secret", nip44.get_conversation_key(sk_a, public_key(sk_b)))
    tampered = ours[:50] + ("A" if ours[50] != "A" else "B") + ours[51:]
    with pytest.raises(Exception):
        ns.nip44_decrypt(ns.SecretKey.parse(sk_b), ns.PublicKey.parse(public_key(sk_a)), tampered)


@pytest.mark.parametrize("n", [65535, 65536, 70000])
def test_nip44_extended_prefix_vs_sdk(n):
    # nostr_sdk 0.45.1 predates the 2026-06-28 amendment: it refuses to
    # encrypt above 65408 bytes and to decrypt extended-prefix payloads.
    # Whatever it does, it must never yield a wrong plaintext.
    sk_a, sk_b = generate_secret(), generate_secret()
    msg = "x" * n
    ours = nip44.encrypt(msg, nip44.get_conversation_key(sk_a, public_key(sk_b)))
    try:
        got = ns.nip44_decrypt(ns.SecretKey.parse(sk_b), ns.PublicKey.parse(public_key(sk_a)), ours)
    except Exception:
        assert n >= nip44.EXTENDED_PREFIX_THRESHOLD  # only extended payloads may be refused
        return
    assert got == msg
