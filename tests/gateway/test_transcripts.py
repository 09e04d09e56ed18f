"""Known-answer transcript vectors (byte-exact, SHA-256) and the audience taken from the public URL."""

from __future__ import annotations

import hashlib
import json

import pytest

from appliance.gateway import transcript as tr
from tests.conftest import vectors_dir

VECTORS = vectors_dir()
pytestmark = pytest.mark.skipif(VECTORS is None, reason="../shared/vectors not found (set APPLIANCE_VECTORS)")


def _vectors():
    if VECTORS is None:
        return []
    return json.loads((VECTORS / "nip-pl-app-attest-transcripts.json").read_text())["vectors"]


@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: v["name"])
def test_transcript_vectors_byte_exact(vector):
    obj = vector["object"]
    base = obj["audience"][: obj["audience"].index("/v1/")]
    assert base == "https://push.buzz.xyz"
    # The request carries the members in any order (and extra ones, like the assertion): the
    # transcript orders them itself.
    request = dict(reversed(list(obj.items())))
    request.pop("audience")
    request["assertion"] = "ignored"
    out = tr.transcript(vector["domain"], "https://push.buzz.xyz", request)
    assert out == vector["transcript"].encode("utf-8")
    assert hashlib.sha256(out).hexdigest() == vector["sha256"]
    assert tr.client_data_hash(out) == bytes.fromhex(vector["sha256"])


def test_vectors_cover_every_domain():
    assert {v["domain"] for v in _vectors()} == set(tr.LAYOUTS)


def test_audience_follows_the_configured_base_url():
    fields = {"challenge_id": "11111111-1111-4111-8111-111111111111", "challenge": "A" * 43,
              "installation_handle": "22222222-2222-4222-8222-222222222222", "relay_pubkey": "aa" * 32,
              "generation": 2}
    a = tr.transcript(tr.REVOKE_DELEGATION, "https://push.example.org/", fields)
    b = tr.transcript(tr.REVOKE_DELEGATION, "https://push.example.org", fields)
    assert a == b
    assert b'"audience":"https://push.example.org/v1/delegations/revoke"' in a
    sub = tr.transcript(tr.REVOKE_DELEGATION, "https://example.org/push", fields)
    assert b'"audience":"https://example.org/push/v1/delegations/revoke"' in sub
    # Another route's audience never appears: a signature cannot cross routes.
    assert tr.audience("https://x.org", tr.DELEGATE) != tr.audience("https://x.org", tr.REVOKE_DELEGATION)


def test_strings_escape_only_quote_backslash_and_controls():
    fields = {"challenge_id": 'a"b\\c\n\x01\x7f\u00e9', "challenge": "c", "installation_handle": "h",
              "endpoint_epoch": 1, "new_endpoint_epoch": 2}
    out = tr.transcript(tr.REVOKE_INSTALLATION, "https://g", fields)
    assert '"challenge_id":"a\\"b\\\\c\\n\\u0001\x7f\u00e9"'.encode() in out
    with pytest.raises(TypeError):
        tr.transcript(tr.REVOKE_INSTALLATION, "https://g", {**fields, "endpoint_epoch": True})
