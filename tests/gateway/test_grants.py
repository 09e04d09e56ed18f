"""Sealed endpoint grants: key-id prefix + AEAD, no token inside, rotation keeps decrypt-only keys."""

from __future__ import annotations

import base64
import secrets

import pytest

from appliance.gateway.grants import Grant, GrantInvalid, Keyring

G = Grant("22222222-2222-4222-8222-222222222222", "ab" * 32, 3, 7, "buzz-ios-sandbox", 100, 200)


def ring(kid="k1", key=None, **older) -> Keyring:
    return Keyring((kid, key or secrets.token_bytes(32)), older)


def test_round_trip_and_shape():
    r = ring()
    text = r.seal(G)
    assert text.startswith("k1.") and len(text) < 200
    assert r.open(text) == G
    assert r.seal(G) != text  # fresh nonce each time
    raw = base64.urlsafe_b64decode(text.split(".", 1)[1] + "==")
    assert b"ab" * 4 not in raw and bytes.fromhex("ab" * 32) not in raw  # sealed, not merely encoded


def test_rotation_keeps_predecessors_decrypt_only():
    old_key = secrets.token_bytes(32)
    old = ring("old", old_key)
    sealed_old = old.seal(G)
    rotated = ring("new", None, old=old_key)
    assert rotated.open(sealed_old) == G
    assert rotated.seal(G).startswith("new.")  # only the current key seals
    without = ring("new")
    with pytest.raises(GrantInvalid):
        without.open(sealed_old)


def test_relabelled_or_tampered_grants_fail():
    key = secrets.token_bytes(32)
    r = Keyring(("k1", key), {"k2": key})  # even with equal keys, the id is authenticated
    text = r.seal(G)
    with pytest.raises(GrantInvalid):
        r.open("k2." + text.split(".", 1)[1])
    body = text.split(".", 1)[1]
    for i in range(len(body)):
        c = "A" if body[i] != "A" else "B"
        mutated = "k1." + body[:i] + c + body[i + 1:]
        with pytest.raises(GrantInvalid):
            r.open(mutated)
    for bad in ("", "k1", "k1.", "nokey." + body, "k1." + body + "=", "k1." + body + "A", "k1." + body[:-1],
                "k1.!!!!", "k1." + body.replace("-", "+") if "-" in body else "k1.+" + body[1:]):
        with pytest.raises(GrantInvalid):
            r.open(bad)
    with pytest.raises(GrantInvalid):
        r.open("k1." + "A" * 5000)


def test_every_field_round_trips():
    r = ring()
    for g in (G, Grant("00000000-0000-0000-0000-000000000000", "00" * 32, 1, 1, "buzz-ios-production", -5, 2**62),
              Grant("ffffffff-ffff-ffff-ffff-ffffffffffff", "ff" * 32, 2**63 - 1, 2**63 - 1, "buzz-ios-sandbox", 0, 0)):
        assert r.open(r.seal(g)) == g
