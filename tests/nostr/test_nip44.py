"""NIP-44 v2 against paulmillr/nip44 vectors, plus the 2026-06-28 extended-prefix amendment."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from appliance.nostr import nip44
from appliance.nostr.keys import public_key
from appliance.nostr.nip44 import Nip44Error

from .helpers import vector_file


@pytest.fixture(scope="module")
def v2():
    with open(vector_file("nip44.vectors.json")) as fh:
        return json.load(fh)["v2"]


def test_vector_file_checksum():
    # The checksum NIP-44 publishes for its vectors file.
    digest = hashlib.sha256(vector_file("nip44.vectors.json").read_bytes()).hexdigest()
    assert digest == "269ed0f69e4c192512cc779e78c555090cebc7c785b609e338a62afc3ce25040"


def test_valid_get_conversation_key(v2):
    cases = v2["valid"]["get_conversation_key"]
    assert cases
    for c in cases:
        assert nip44.get_conversation_key(c["sec1"], c["pub2"]).hex() == c["conversation_key"], c


def test_valid_get_message_keys(v2):
    mk = v2["valid"]["get_message_keys"]
    ck = bytes.fromhex(mk["conversation_key"])
    for c in mk["keys"]:
        chacha_key, chacha_nonce, hmac_key = nip44.get_message_keys(ck, bytes.fromhex(c["nonce"]))
        assert chacha_key.hex() == c["chacha_key"]
        assert chacha_nonce.hex() == c["chacha_nonce"]
        assert hmac_key.hex() == c["hmac_key"]


def test_valid_calc_padded_len(v2):
    for n, padded in v2["valid"]["calc_padded_len"]:
        assert nip44.calc_padded_len(n) == padded, n


def test_valid_encrypt_decrypt(v2):
    for c in v2["valid"]["encrypt_decrypt"]:
        pub2 = public_key(c["sec2"])
        ck = nip44.get_conversation_key(c["sec1"], pub2)
        assert ck.hex() == c["conversation_key"]
        payload = nip44.encrypt(c["plaintext"], ck, bytes.fromhex(c["nonce"]))
        assert payload == c["payload"]
        pub1 = public_key(c["sec1"])
        ck2 = nip44.get_conversation_key(c["sec2"], pub1)
        assert ck2 == ck
        assert nip44.decrypt(c["payload"], ck2) == c["plaintext"]


def test_valid_encrypt_decrypt_long_msg(v2):
    for c in v2["valid"]["encrypt_decrypt_long_msg"]:
        plaintext = c["pattern"] * c["repeat"]
        assert hashlib.sha256(plaintext.encode()).hexdigest() == c["plaintext_sha256"]
        ck = bytes.fromhex(c["conversation_key"])
        payload = nip44.encrypt(plaintext, ck, bytes.fromhex(c["nonce"]))
        assert hashlib.sha256(payload.encode()).hexdigest() == c["payload_sha256"]
        assert nip44.decrypt(payload, ck) == plaintext


def test_invalid_encrypt_msg_lengths_per_amendment(v2):
    # The vectors file predates the 2026-06-28 amendment, which raised the
    # maximum plaintext to 2^32-1 bytes using a 6-byte prefix from 65536 on.
    # Its entries above 65535 (65536, 100000, 10000000) are therefore VALID
    # now and are tested as such; only 0 is still invalid.
    ck = bytes(range(32))
    nonce = bytes(32)
    for n in v2["invalid"]["encrypt_msg_lengths"]:
        if n < nip44.MIN_PLAINTEXT_SIZE or n > nip44.MAX_PLAINTEXT_SIZE:
            with pytest.raises(Nip44Error):
                nip44.encrypt("a" * n, ck, nonce)
            with pytest.raises(Nip44Error):
                nip44.pad(b"a" * n)
        else:
            assert n >= nip44.EXTENDED_PREFIX_THRESHOLD
            payload = nip44.encrypt("a" * n, ck, nonce)
            assert nip44.decrypt(payload, ck) == "a" * n
            assert len(base64.b64decode(payload)) == 1 + 32 + 6 + nip44.calc_padded_len(n) + 32


def test_invalid_get_conversation_key(v2):
    cases = v2["invalid"]["get_conversation_key"]
    assert cases
    for c in cases:
        with pytest.raises(Nip44Error):
            nip44.get_conversation_key(c["sec1"], c["pub2"])


def test_invalid_decrypt(v2):
    cases = v2["invalid"]["decrypt"]
    assert cases
    for c in cases:
        with pytest.raises(Nip44Error) as info:
            nip44.decrypt(c["payload"], bytes.fromhex(c["conversation_key"]))
        note = c["note"]
        reason = info.value.reason
        if note.startswith("unknown encryption version"):
            assert "unknown encryption version" in reason, (note, reason)
        elif note == "invalid base64":
            assert reason == "invalid base64"
        elif note == "invalid MAC":
            assert reason == "invalid MAC"
        elif note == "invalid padding":
            assert reason == "invalid padding"
        elif note.startswith("invalid payload length"):
            assert reason in ("invalid payload size", "unknown encryption version"), (note, reason)


# --- the amendment: extended length prefix ---------------------------------

CK = bytes.fromhex("c41c775356fd92eadc63ff5a0dc1da211b268cbea22316767095b2871ea1412d")
NONCE = bytes(31) + b"\x01"


def _padded_of(payload: str) -> bytes:
    data = base64.b64decode(payload)
    nonce, ct = data[1:33], data[33:-32]
    chacha_key, chacha_nonce, _ = nip44.get_message_keys(CK, nonce)
    return nip44._chacha20(chacha_key, chacha_nonce, ct)


@pytest.mark.parametrize(
    ("n", "prefix"),
    [
        (1, b"\x00\x01"),
        (65535, b"\xff\xff"),  # largest short prefix
        (65536, b"\x00\x00\x00\x01\x00\x00"),  # first extended prefix
        (65537, b"\x00\x00\x00\x01\x00\x01"),
    ],
)
def test_prefix_boundaries(n, prefix):
    padded = nip44.pad(b"x" * n)
    assert padded.startswith(prefix)
    assert len(padded) == len(prefix) + nip44.calc_padded_len(n)
    assert nip44.unpad(padded) == b"x" * n
    payload = nip44.encrypt("x" * n, CK, NONCE)
    assert _padded_of(payload) == padded
    assert nip44.decrypt(payload, CK) == "x" * n


def test_calc_padded_len_large_values_and_bounds():
    assert nip44.calc_padded_len(65536) == 65536
    assert nip44.calc_padded_len(65537) == 81920  # chunk 16384 above 65536
    assert nip44.calc_padded_len(100000) == 114688
    assert nip44.calc_padded_len(2**32 - 1) == 2**32
    for bad in (0, -1, 2**32):
        with pytest.raises(Nip44Error):
            nip44.calc_padded_len(bad)


def test_unpad_rejects_noncanonical_and_truncated():
    good = nip44.pad(b"hello")
    # extended marker but a length that fits the short prefix: refused
    fake = b"\x00\x00" + (5).to_bytes(4, "big") + b"hello" + bytes(nip44.calc_padded_len(5) - 5)
    with pytest.raises(Nip44Error, match="invalid padding"):
        nip44.unpad(fake)
    for bad in (b"", b"\x00", b"\x00\x00\x00", good[:-1], good + b"\x00", b"\x00\x21" + good[2:]):
        with pytest.raises(Nip44Error, match="invalid padding"):
            nip44.unpad(bad)
    ext = nip44.pad(b"y" * 70000)
    with pytest.raises(Nip44Error, match="invalid padding"):
        nip44.unpad(ext[:-1])
    with pytest.raises(Nip44Error, match="invalid padding"):
        nip44.unpad(ext[:2] + (90000).to_bytes(4, "big") + ext[6:])


def test_decrypt_rejections():
    payload = nip44.encrypt("hello world", CK, NONCE)
    assert nip44.decrypt(payload, CK) == "hello world"
    raw = bytearray(base64.b64decode(payload))
    # unknown version byte
    v1 = bytes([1]) + bytes(raw[1:])
    with pytest.raises(Nip44Error, match="unknown encryption version"):
        nip44.decrypt(base64.b64encode(v1).decode(), CK)
    # '#' flag is "unsupported version", not "bad base64"
    with pytest.raises(Nip44Error, match="unknown encryption version"):
        nip44.decrypt("#" + payload[1:], CK)
    with pytest.raises(Nip44Error, match="unknown encryption version"):
        nip44.decrypt("", CK)
    # flipped ciphertext bit -> MAC
    flipped = bytearray(raw)
    flipped[40] ^= 1
    with pytest.raises(Nip44Error, match="invalid MAC"):
        nip44.decrypt(base64.b64encode(bytes(flipped)).decode(), CK)
    # wrong key -> MAC
    with pytest.raises(Nip44Error, match="invalid MAC"):
        nip44.decrypt(payload, bytes(32))
    # bad base64: stray char, missing padding
    with pytest.raises(Nip44Error, match="invalid base64"):
        nip44.decrypt(payload[:-4] + "!!!!", CK)
    padded_payload = nip44.encrypt("x" * 40, CK, NONCE)
    assert padded_payload.endswith("=")
    with pytest.raises(Nip44Error, match="invalid base64"):
        nip44.decrypt(padded_payload[:-1], CK)  # padding character missing
    # lengths
    with pytest.raises(Nip44Error, match="invalid payload size"):
        nip44.decrypt(payload[:131], CK)
    with pytest.raises(Nip44Error):
        nip44.decrypt(payload + "AAAA", CK)  # MAC no longer at the end
    with pytest.raises(Nip44Error):
        nip44.decrypt(payload, CK[:31])
    with pytest.raises(Nip44Error):
        nip44.decrypt(123, CK)  # type: ignore[arg-type]


def test_max_plaintext_bound():
    big = nip44.encrypt("z" * 70000, CK, NONCE)
    assert nip44.decrypt(big, CK, max_plaintext=70000) == "z" * 70000
    with pytest.raises(Nip44Error):
        nip44.decrypt(big, CK, max_plaintext=1000)  # refused by length, before decoding
    with pytest.raises(Nip44Error):
        nip44.decrypt(big, CK, max_plaintext=69999)  # same padded size, refused after unpad
    with pytest.raises(Nip44Error):
        nip44.encrypt("z" * 1001, CK, NONCE, max_plaintext=1000)
    assert len(nip44.encrypt("z" * 70000, CK, NONCE)) == nip44.max_payload_len(70000)


def test_invalid_utf8_plaintext_refused():
    # Build an authenticated payload whose plaintext is not UTF-8.
    chacha_key, chacha_nonce, hmac_key = nip44.get_message_keys(CK, NONCE)
    ct = nip44._chacha20(chacha_key, chacha_nonce, nip44.pad(b"\xff\xfe"))
    data = b"\x02" + NONCE + ct + nip44._mac(hmac_key, NONCE, ct)
    with pytest.raises(Nip44Error, match="utf-8"):
        nip44.decrypt(base64.b64encode(data).decode(), CK)


def test_random_nonce_and_unicode_roundtrip():
    text = "héllo 😀 \u2028 \x00 wörld"
    a = nip44.encrypt(text, CK)
    b = nip44.encrypt(text, CK)
    assert a != b
    assert nip44.decrypt(a, CK) == nip44.decrypt(b, CK) == text


def test_only_canonical_base64_is_decrypted():
    """Extra padding or non-zero unused bits decode in Python's base64 but are not RFC 4648
    canonical: refused, as other implementations do (else one plaintext has many contents)."""
    from appliance.nostr import nip44 as n44
    from appliance.nostr.keys import public_key

    ck = n44.get_conversation_key("1" * 64, public_key("2" * 64))
    p = n44.encrypt("hello", ck, nonce=bytes(32))
    assert n44.decrypt(p, ck) == "hello"
    for bad in (p + "=", p + "==="):
        with pytest.raises(n44.Nip44Error):
            n44.decrypt(bad, ck)
    q = n44.encrypt("y" * 40, ck, nonce=bytes(32))
    assert q.endswith("=")
    last = q.rstrip("=")[-1]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    tweaked = q.rstrip("=")[:-1] + alphabet[alphabet.index(last) ^ 1] + "=" * (len(q) - len(q.rstrip("=")))
    with pytest.raises(n44.Nip44Error):
        n44.decrypt(tweaked, ck)
