"""NIP-98 HTTP Authorization header verification, one test per refusal reason."""

from __future__ import annotations

import base64
import hashlib

import pytest

from appliance.nostr.event import sign_event
from appliance.nostr.keys import public_key
from appliance.nostr.nip98 import HttpAuthError, make_http_auth, verify_http_auth

from .helpers import SK3

NOW = 1_800_000_000
URL = "https://relay.example.com/api/upload?x=1"


def header_for(tags, kind=27235, created_at=NOW, content=""):
    ev = sign_event(SK3, kind, tags, content, created_at=created_at)
    return "Nostr " + base64.b64encode(ev.to_json_bytes()).decode()


def verify(header, url=URL, method="POST", body=None, **kw):
    return verify_http_auth(header, url=url, method=method, body=body, now=kw.pop("now", NOW), **kw)


def reason(header, **kw):
    with pytest.raises(HttpAuthError) as info:
        verify(header, **kw)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == info.value.reason
    return info.value.reason


def test_roundtrip_with_and_without_body():
    h = make_http_auth(SK3, URL, "post", b"hello", created_at=NOW)
    ev = verify(h, body=b"hello")
    assert ev.pubkey == public_key(SK3)
    assert ev.first_tag("payload") == hashlib.sha256(b"hello").hexdigest()
    h = make_http_auth(SK3, URL, "GET", None, created_at=NOW)
    assert verify(h, method="GET").kind == 27235
    assert verify(h, method="get").kind == 27235  # server-side method is upper-cased
    assert verify(h, method="GET", body=b"").kind == 27235
    assert verify(h.replace("Nostr ", "nostr "), method="GET").kind == 27235  # scheme is case-insensitive
    unpadded = h.rstrip("=")
    assert verify(unpadded, method="GET").kind == 27235


def test_window():
    h = make_http_auth(SK3, URL, "GET", None, created_at=NOW - 60)
    assert verify(h, method="GET")
    assert reason(make_http_auth(SK3, URL, "GET", None, created_at=NOW - 61), method="GET") == "created_at out of window"
    assert reason(make_http_auth(SK3, URL, "GET", None, created_at=NOW + 61), method="GET") == "created_at out of window"
    assert verify(make_http_auth(SK3, URL, "GET", None, created_at=NOW - 100), method="GET", window=120)


def test_url_exact():
    h = make_http_auth(SK3, URL, "GET", None, created_at=NOW)
    for other in (URL + "&y=2", URL.replace("https", "http"), URL.upper(), "https://relay.example.com/api/upload",
                  URL.replace("relay.example.com", "Relay.example.com")):
        assert reason(h, url=other, method="GET") == "url mismatch"
    assert reason(header_for([["method", "GET"]]), method="GET") == "missing u tag"


def test_method():
    h = make_http_auth(SK3, URL, "GET", None, created_at=NOW)
    assert reason(h, method="POST") == "method mismatch"
    lower = header_for([["u", URL], ["method", "get"]])
    assert reason(lower, method="GET") == "method mismatch"
    assert reason(header_for([["u", URL]]), method="GET") == "missing method tag"


def test_payload():
    h = make_http_auth(SK3, URL, "POST", b"hello", created_at=NOW)
    assert reason(h, body=b"hellO") == "payload hash mismatch"
    assert reason(h, body=None) == "payload hash mismatch"  # tag present must match the (empty) body
    no_payload = make_http_auth(SK3, URL, "POST", None, created_at=NOW)
    assert reason(no_payload, body=b"data") == "missing payload tag"
    upper = header_for([["u", URL], ["method", "POST"], ["payload", hashlib.sha256(b"x").hexdigest().upper()]])
    assert verify(upper, body=b"x")


def test_kind_and_signature():
    assert reason(header_for([["u", URL], ["method", "POST"]], kind=1)) == "wrong kind"
    h = make_http_auth(SK3, URL, "POST", None, created_at=NOW)
    ev = verify(h)
    d = ev.to_dict()
    d["sig"] = "0" * 128
    import orjson

    forged = "Nostr " + base64.b64encode(orjson.dumps(d)).decode()
    assert reason(forged) == "invalid signature"
    d = ev.to_dict()
    d["content"] = "changed"
    tampered = "Nostr " + base64.b64encode(orjson.dumps(d)).decode()
    assert reason(tampered) == "invalid signature"


def test_header_shape():
    assert reason("") == "missing authorization header"
    assert reason("Bearer abc") == "authorization scheme must be Nostr"
    assert reason("Nostr") == "missing event in authorization header"
    assert reason("Nostr    ") == "missing event in authorization header"
    assert reason("Nostr !!!!") == "authorization header is not valid base64"
    assert reason("Nostr " + base64.b64encode(b"{not json").decode()) == "authorization event is not valid JSON"
    assert reason("Nostr " + base64.b64encode(b'{"kind":27235}').decode()).startswith("malformed event: ")
    assert reason("Nostr " + "A" * 20000) == "authorization header too large"
