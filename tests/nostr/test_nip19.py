"""NIP-19 keys: the NIP's own examples, round trips, and refusals."""

from __future__ import annotations

import pytest

from appliance.nostr.nip19 import Nip19Error, decode_key, encode_key, parse_secret

# NIP-19, "Examples"
NPUB = ("npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg",
        "7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e")
NSEC = ("nsec1vl029mgpspedva04g90vltkh6fvh240zqtv9k0t9af8935ke9laqsnlfe5",
        "67dea2ed018072d675f5415ecfaed7d2597555e202d85b3d65ea4e58d2d92ffa")


def test_nip_examples():
    assert decode_key(NPUB[0], "npub").hex() == NPUB[1]
    assert decode_key(NSEC[0], "nsec").hex() == NSEC[1]
    assert encode_key(bytes.fromhex(NPUB[1]), "npub") == NPUB[0]
    assert encode_key(bytes.fromhex(NSEC[1]), "nsec") == NSEC[0]


def test_parse_secret():
    assert parse_secret(NSEC[0] + "\n") == NSEC[1]
    assert parse_secret(NSEC[1].upper()) == NSEC[1]
    for bad in (NPUB[0], NSEC[0][:-1] + "x", "ab" * 31, "", "nsec1"):
        with pytest.raises(Nip19Error):
            parse_secret(bad)
