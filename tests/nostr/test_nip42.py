"""NIP-42 AUTH event validation, one test per refusal reason."""

from __future__ import annotations

import pytest

from appliance.nostr.event import Event, sign_event
from appliance.nostr.keys import public_key
from appliance.nostr.nip42 import AuthError, normalize_relay_url, validate_auth_event

from .helpers import SK3

NOW = 1_800_000_000
RELAY = "wss://relay.example.com"


def auth(challenge="c-123", relay=RELAY, kind=22242, created_at=NOW, extra=()):
    tags = []
    if relay is not None:
        tags.append(["relay", relay])
    if challenge is not None:
        tags.append(["challenge", challenge])
    tags.extend(extra)
    return sign_event(SK3, kind, tags, "", created_at=created_at)


def check(ev, **kw):
    args = {"challenge": "c-123", "relay_url": RELAY, "now": NOW}
    args.update(kw)
    return validate_auth_event(ev, **args)


def test_valid():
    assert check(auth()) == public_key(SK3)
    assert check(auth(created_at=NOW - 600)) == public_key(SK3)
    assert check(auth(created_at=NOW + 600)) == public_key(SK3)


@pytest.mark.parametrize(
    "relay",
    ["wss://relay.example.com/", "WSS://Relay.Example.COM", "wss://RELAY.example.com/"],
)
def test_relay_normalization(relay):
    assert check(auth(relay=relay)) == public_key(SK3)
    assert check(auth(), relay_url=relay) == public_key(SK3)


def test_normalize_relay_url():
    assert normalize_relay_url("WSS://Host.COM/") == "wss://host.com"
    assert normalize_relay_url("wss://host.com/Path/") == "wss://host.com/Path"
    assert normalize_relay_url("wss://host.com//") == "wss://host.com/"  # only one slash


def _reason(ev, **kw):
    with pytest.raises(AuthError) as info:
        check(ev, **kw)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == info.value.reason
    return info.value.reason


def test_wrong_kind():
    assert _reason(auth(kind=1)) == "wrong kind"


def test_created_at_out_of_window():
    assert _reason(auth(created_at=NOW - 601)) == "created_at out of window"
    assert _reason(auth(created_at=NOW + 601)) == "created_at out of window"
    assert _reason(auth(created_at=NOW - 61), window=60) == "created_at out of window"


def test_challenge():
    assert _reason(auth(challenge="other")) == "challenge mismatch"
    assert _reason(auth(challenge="C-123")) == "challenge mismatch"
    assert _reason(auth(challenge=None)) == "missing challenge tag"


def test_relay():
    assert _reason(auth(relay="wss://other.example.com")) == "relay url mismatch"
    assert _reason(auth(relay="wss://relay.example.com/path")) == "relay url mismatch"
    assert _reason(auth(relay="ws://relay.example.com")) == "relay url mismatch"
    assert _reason(auth(relay=None)) == "missing relay tag"


def test_invalid_signature():
    good = auth()
    forged = Event(good.id, good.pubkey, good.created_at, good.kind, good.tags, good.content, "0" * 128)
    assert _reason(forged) == "invalid signature"
    # tags changed after signing: id no longer matches
    tampered = Event(good.id, good.pubkey, good.created_at, good.kind,
                     [["relay", RELAY], ["challenge", "c-123"], ["x", "y"]], good.content, good.sig)
    assert _reason(tampered) == "invalid signature"


def test_relay_url_default_port_and_query_slash():
    from appliance.nostr.nip42 import normalize_relay_url as n

    assert n("wss://Relay.Example.com:443") == n("wss://relay.example.com/") == "wss://relay.example.com"
    assert n("ws://h:80/x/") == "ws://h/x"
    assert n("wss://h:8443") == "wss://h:8443"
    assert n("wss://h/?a=/") != n("wss://h/?a=")
    assert n("wss://h/#/") != n("wss://h/#")
