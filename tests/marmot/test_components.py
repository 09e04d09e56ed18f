"""Marmot binary profile, app component state (0x8003, 0x8004) and the draft extensions (0xf2f0, 0xf2ef)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from appliance.marmot.components import AdminPolicy, NostrRouting
from appliance.marmot.errors import ComponentError, DeviceLabelError, EncodingError, MarmotError
from appliance.marmot.extensions import EncryptedDeviceName, MultiDeviceExtension
from appliance.marmot.wire import Reader, quic_varint, quic_vector
from appliance.nostr.keys import generate_secret


# canonical-encoding.md, "QUIC length prefixes" examples
@pytest.mark.parametrize("n,prefix", [(0, "00"), (7, "07"), (63, "3f"), (64, "4040"), (16383, "7fff"),
                                      (16384, "80004000"), (1073741823, "bfffffff"),
                                      (1073741824, "c000000040000000")])
def test_quic_prefix_examples(n, prefix):
    assert quic_varint(n).hex() == prefix
    assert Reader(bytes.fromhex(prefix), "x").varint() == n


def test_seven_byte_example():
    assert quic_vector(bytes.fromhex("090262 22375a36".replace(" ", ""))).hex() == "0709026222375a36"


@pytest.mark.parametrize("raw", ["4000", "4007", "8000003f", "c00000000000003f", "c000000000003fff"])
def test_non_shortest_prefix_refused(raw):
    with pytest.raises(EncodingError) as e:
        Reader(bytes.fromhex(raw), "x").varint()
    assert e.value.code == "encoding.non_minimal_length"


@given(st.binary(max_size=300))
def test_vector_round_trip(data):
    r = Reader(quic_vector(data), "x")
    assert r.vector() == data
    r.done()


def test_truncated_and_trailing():
    with pytest.raises(EncodingError) as e:
        Reader(b"\x05abc", "x").vector()
    assert e.value.code == "encoding.truncated"
    r = Reader(b"\x01ab", "x")
    r.vector()
    with pytest.raises(EncodingError) as e:
        r.done()
    assert e.value.code == "encoding.trailing"


K1, K2, K3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def test_admin_policy_round_trip_and_rules():
    p = AdminPolicy.of([K3, K1, K2, K1])
    assert p.admins == (K1, K2, K3)
    data = p.encode()
    assert data == bytes.fromhex("4060") + K1 + K2 + K3  # 96 bytes of keys: a two-byte QUIC prefix
    assert AdminPolicy.decode(data) == p
    assert p.is_admin(K2) and not p.is_admin(b"\x04" * 32)
    for admins, code in [((), "component.admin_policy.empty"), ((K2, K1), "component.admin_policy.unsorted"),
                         ((K1, K1), "component.admin_policy.duplicate"), ((b"\x01" * 31,), "component.admin_policy.key_length")]:
        with pytest.raises(ComponentError) as e:
            AdminPolicy(admins)
        assert e.value.code == code
    # The decoder never sorts or deduplicates: non-canonical bytes are invalid.
    with pytest.raises(ComponentError):
        AdminPolicy.decode(quic_vector(K2 + K1))
    with pytest.raises(EncodingError):
        AdminPolicy.decode(quic_vector(K1 + b"\x02" * 31))
    with pytest.raises(EncodingError):
        AdminPolicy.decode(data + b"\x00")


def test_nostr_routing_round_trip_and_rules():
    gid = bytes(range(32))
    r = NostrRouting.of(gid, ["wss://b.example", "ws://127.0.0.1:7777", "wss://a.example"])
    assert r.relay_urls() == ["ws://127.0.0.1:7777", "wss://a.example", "wss://b.example"]
    data = r.encode()
    assert data[:32] == gid
    assert NostrRouting.decode(data) == r
    assert r.h == gid.hex()
    with pytest.raises(ComponentError) as e:
        NostrRouting(gid, (b"wss://b.example", b"wss://a.example"))
    assert e.value.code == "component.routing.unsorted"
    with pytest.raises(ComponentError) as e:
        NostrRouting(gid, (b"wss://a.example", b"wss://a.example"))
    assert e.value.code == "component.routing.duplicate"
    with pytest.raises(ComponentError) as e:
        NostrRouting(gid, ())
    assert e.value.code == "component.routing.empty"
    with pytest.raises(ComponentError) as e:
        NostrRouting(gid[:31], (b"wss://a.example",))
    assert e.value.code == "component.routing.group_id"


def test_relay_sort_is_by_url_bytes_not_by_encoding():
    """Spec note M5: "wss://a.b" sorts before "wss://aa" although its encoding is longer."""
    r = NostrRouting.of(bytes(32), ["wss://aa", "wss://a.b"])
    assert r.relay_urls() == ["wss://a.b", "wss://aa"]
    assert NostrRouting.decode(r.encode()) == r


@pytest.mark.parametrize("url", ["https://relay.example", "wss://", "wss://user:pw@relay.example",
                                 "wss://relay.example/#frag", "wss://relay example", "wss://relä.example",
                                 "wss://r.example:99999", "x" * 513, ""])
def test_relay_url_profile(url):
    with pytest.raises(MarmotError):
        NostrRouting(bytes(32), (url.encode(),))


def test_multi_device_extension():
    ext = MultiDeviceExtension()
    assert ext.encode() == b"\x00\x01"
    assert MultiDeviceExtension.decode(b"\x00\x01") == ext
    for bad in (b"\x00\x00", b"\x00\x02", b"\x00", b"\x00\x01\x00"):
        with pytest.raises(MarmotError):
            MultiDeviceExtension.decode(bad)


def test_encrypted_device_name_only_the_account_reads_it():
    sk = generate_secret()
    sealed = EncryptedDeviceName.seal(sk, "Pixel 8 — work")
    data = sealed.encode()
    opened = EncryptedDeviceName.decode(data)
    assert opened.open(sk) == "Pixel 8 — work"
    with pytest.raises(DeviceLabelError) as e:
        opened.open(generate_secret())
    assert e.value.code == "device_label.decrypt"
    with pytest.raises(DeviceLabelError):
        EncryptedDeviceName.seal(sk, "x" * 65)
    with pytest.raises(DeviceLabelError):
        EncryptedDeviceName.seal(sk, "")
    assert EncryptedDeviceName.seal(sk, "é" * 64).open(sk) == "é" * 64
    with pytest.raises(EncodingError):
        EncryptedDeviceName.decode(b"\x00")
    with pytest.raises(EncodingError):
        EncryptedDeviceName.decode(quic_vector(b"A" * 2000))
