"""The draft pairing payload: seal/open, bounded validity, single use, all-zero shared secrets refused."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from appliance.marmot import pairing
from appliance.marmot.errors import PairingError, PairingExpired, PairingReused
from appliance.marmot.pairing import PairingGroupEntry, PairingKey, PairingPayload, open_pairing, peek_envelope, seal_pairing

NOW = 1_800_000_000


def _entries(n=2):
    return [PairingGroupEntry(os.urandom(32), os.urandom(32), os.urandom(100 + i)) for i in range(n)]


def test_round_trip():
    key = PairingKey.generate()
    entries = _entries()
    envelope, sealed = seal_pairing(key.public, entries, now=NOW)
    head = peek_envelope(envelope)
    assert head["version"] == 1 and head["recipient_pub"] == key.public.hex()
    opened = open_pairing(envelope, key, now=NOW + 10)
    assert opened == sealed and list(opened.groups) == entries
    assert opened.not_after - opened.not_before == pairing.DEFAULT_PAIRING_VALIDITY


def test_each_seal_uses_a_fresh_ephemeral_key():
    key = PairingKey.generate()
    a, _ = seal_pairing(key.public, _entries(1), now=NOW)
    b, _ = seal_pairing(key.public, _entries(1), now=NOW)
    assert peek_envelope(a)["sender_ephemeral_pub"] != peek_envelope(b)["sender_ephemeral_pub"]


def test_validity_is_bounded():
    key = PairingKey.generate()
    envelope, _ = seal_pairing(key.public, _entries(1), now=NOW, validity=60)
    with pytest.raises(PairingExpired) as e:
        open_pairing(envelope, key, now=NOW + 61)
    assert e.value.code == "pairing.expired"
    with pytest.raises(PairingExpired) as e:
        open_pairing(envelope, key, now=NOW - pairing.CLOCK_SKEW - 1)
    assert e.value.code == "pairing.not_yet_valid"
    open_pairing(envelope, key, now=NOW - pairing.CLOCK_SKEW)
    with pytest.raises(PairingError) as e:
        seal_pairing(key.public, _entries(1), now=NOW, validity=pairing.MAX_PAIRING_VALIDITY + 1)
    assert e.value.code == "pairing.validity"
    with pytest.raises(PairingError):
        seal_pairing(key.public, _entries(1), now=NOW, validity=0)


def test_single_use():
    key = PairingKey.generate()
    envelope, payload = seal_pairing(key.public, _entries(1), now=NOW)
    opened = open_pairing(envelope, key, now=NOW)
    with pytest.raises(PairingReused):
        open_pairing(envelope, key, now=NOW, used_ids={opened.pairing_id.hex()})


def test_wrong_key_and_tampering():
    key, other = PairingKey.generate(), PairingKey.generate()
    envelope, _ = seal_pairing(key.public, _entries(1), now=NOW)
    with pytest.raises(PairingError) as e:
        open_pairing(envelope, other, now=NOW)
    assert e.value.code == "pairing.wrong_key"
    for i in (5, 40, 70, len(envelope) - 1):  # sender key, recipient key, nonce, tag
        tampered = bytearray(envelope)
        tampered[i] ^= 1
        with pytest.raises(PairingError):
            open_pairing(bytes(tampered), key, now=NOW)
    with pytest.raises(PairingError):
        open_pairing(envelope[:-1], key, now=NOW)


# Low-order Curve25519 points (RFC 7748 section 6.1 advises checking for the all-zero output).
LOW_ORDER = [bytes(32), b"\x01" + bytes(31),
             bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")]


@pytest.mark.parametrize("point", LOW_ORDER)
def test_all_zero_shared_secret_refused_when_sealing(point):
    with pytest.raises(PairingError) as e:
        seal_pairing(point, _entries(1), now=NOW)
    assert e.value.code == "pairing.zero_shared_secret"


@pytest.mark.parametrize("point", LOW_ORDER)
def test_all_zero_shared_secret_refused_when_opening(point):
    key = PairingKey.generate()
    header = b"\x00\x01" + point + key.public + bytes(12)
    envelope = header + bytes([32]) + ChaCha20Poly1305(bytes(32)).encrypt(bytes(12), b"x" * 16, header)
    with pytest.raises(PairingError) as e:
        open_pairing(envelope, key, now=NOW)
    assert e.value.code == "pairing.zero_shared_secret"


def test_payload_layout_is_strict():
    p = PairingPayload(b"\x07" * 16, NOW, NOW + 60, tuple(_entries(1)))
    data = p.encode()
    assert data[:2] == b"\x00\x01" and data[2:18] == b"\x07" * 16
    assert PairingPayload.decode(data) == p
    with pytest.raises(PairingError):
        PairingPayload.decode(b"\x00\x02" + data[2:])
    with pytest.raises(PairingError):  # no groups
        PairingPayload.decode(data[:34] + b"\x00")
    with pytest.raises(Exception):
        PairingPayload.decode(data + b"\x00")
    with pytest.raises(PairingError):
        PairingGroupEntry(b"\x00" * 31, b"\x01", b"\x02")
    with pytest.raises(PairingError):
        PairingGroupEntry(b"\x00" * 32, b"", b"\x02")


def test_pairing_key_expiry():
    key = PairingKey.generate()
    assert not key.expired(key.created_at + pairing.MAX_PAIRING_VALIDITY)
    assert key.expired(key.created_at + pairing.MAX_PAIRING_VALIDITY + pairing.CLOCK_SKEW + 1)
    assert len(X25519PrivateKey.from_private_bytes(key.private).public_key().public_bytes_raw()) == 32
