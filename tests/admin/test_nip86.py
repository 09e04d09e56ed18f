"""NIP-86 management API over HTTP: NIP-98 auth by admin pubkeys, the standard methods, and the
same effects as the dashboard (enforced by the relay at once)."""

from __future__ import annotations

import json
import time

import pytest

from appliance.errors import Rejected
from appliance.nostr.event import sign_event
from appliance.nostr.nip98 import make_http_auth
from appliance.store.statement import SQL
from tests.conftest import Identity

from .conftest import CONFIG, ORIGIN
from .helpers import Dashboard, nip11, publish

pytestmark = pytest.mark.anyio

CT = "application/nostr+json+rpc"


@pytest.fixture
async def api(tmp_path, anyio_backend):
    admin = Identity()
    d = Dashboard(tmp_path / "data", config=CONFIG, admin_pubkeys=admin.pubkey)
    d.operator = admin
    yield d
    await d.close()


async def call(d, method: str, params=(), *, signer=None, url: str = ORIGIN, body: bytes | None = None,
               auth: str | None = None):
    body = body if body is not None else json.dumps({"method": method, "params": list(params)}).encode()
    signer = signer or d.operator
    headers = {"Content-Type": CT,
               "Authorization": auth if auth is not None else make_http_auth(signer.secret, url, "POST", body)}
    return await d.client.post("/", content=body, headers=headers)


async def test_authorization(api):
    stranger = Identity()
    assert 86 in (await nip11(api))["supported_nips"]
    r = await call(api, "supportedmethods", auth="")
    assert r.status_code == 401
    r = await call(api, "supportedmethods", signer=stranger)
    assert r.status_code == 403 and "not an admin" in r.json()["error"]
    r = await call(api, "supportedmethods", url="ws://elsewhere.test")
    assert r.status_code == 401 and "url" in r.json()["error"]
    # The payload tag binds the body: another body with the same header is refused.
    body = json.dumps({"method": "supportedmethods", "params": []}).encode()
    header = make_http_auth(api.operator.secret, ORIGIN, "POST", body)
    r = await call(api, "x", body=body.replace(b"[]", b"[ ]"), auth=header)
    assert r.status_code == 401 and "payload" in r.json()["error"]
    # Reads may repeat; an authorization event for a change is spent once used.
    assert (await call(api, "x", body=body, auth=header)).status_code == 200
    assert (await call(api, "x", body=body, auth=header)).status_code == 200
    change = json.dumps({"method": "blockip", "params": ["203.0.113.9"]}).encode()
    header = make_http_auth(api.operator.secret, ORIGIN, "POST", change)
    assert (await call(api, "x", body=change, auth=header)).json() == {"result": True}
    r = await call(api, "x", body=change, auth=header)
    assert r.status_code == 401 and "already used" in r.json()["error"]
    # An old event is out of the window.
    old = make_http_auth(api.operator.secret, ORIGIN, "POST", body, created_at=int(time.time()) - 600)
    assert (await call(api, "x", body=body, auth=old)).status_code == 401
    # The https form of the relay URL is accepted too.
    r = await call(api, "supportedmethods", url="http://push.test")
    assert r.status_code == 200
    # Not a NIP-86 body.
    r = await call(api, "x", body=b"not json")
    assert r.status_code == 400
    r = await api.client.post("/", content=b"{}", headers={"Content-Type": "application/json"})
    assert r.status_code == 415


async def test_supported_methods(api):
    r = await call(api, "supportedmethods")
    methods = r.json()["result"]
    for m in ("banpubkey", "listbannedpubkeys", "allowpubkey", "listallowedpubkeys", "banevent", "allowevent",
              "listbannedevents", "changerelayname", "changerelaydescription", "changerelayicon", "allowkind",
              "disallowkind", "listallowedkinds", "blockip", "unblockip", "listblockedips", "unbanpubkey"):
        assert m in methods
    r = await call(api, "frobnicate")
    assert r.status_code == 200 and r.json()["error"].startswith("unsupported method")


async def test_pubkeys(api):
    alice, bob = Identity(), Identity()
    r = await call(api, "banpubkey", [alice.pubkey, "spam"])
    assert r.json() == {"result": True}
    assert (await call(api, "listbannedpubkeys")).json()["result"] == [{"pubkey": alice.pubkey, "reason": "spam"}]
    with pytest.raises(Rejected, match="blocked"):
        await publish(api, None, sign_event(alice.secret, 1, [], "hi").to_dict())
    # allowpubkey lifts the ban (and restricts writers to the allowlist).
    assert (await call(api, "allowpubkey", [alice.pubkey])).json()["result"] is True
    assert (await call(api, "listbannedpubkeys")).json()["result"] == []
    assert (await call(api, "listallowedpubkeys")).json()["result"] == [{"pubkey": alice.pubkey, "reason": ""}]
    await publish(api, None, sign_event(alice.secret, 1, [], "hi").to_dict())
    with pytest.raises(Rejected, match="restricted"):
        await publish(api, None, sign_event(bob.secret, 1, [], "hi").to_dict())
    assert (await call(api, "unallowpubkey", [alice.pubkey])).json()["result"] is True
    await publish(api, None, sign_event(bob.secret, 1, [], "hi").to_dict())
    r = await call(api, "banpubkey", ["npub1notahexkey"])
    assert r.json()["result"] is None and "64 lowercase hex" in r.json()["error"]
    r = await call(api, "banpubkey", [])
    assert "missing parameter" in r.json()["error"]


async def test_events_kinds_and_info(api):
    alice = Identity()
    note = sign_event(alice.secret, 1, [], "delete me").to_dict()
    await publish(api, None, note)
    assert (await call(api, "banevent", [note["id"], "illegal"])).json()["result"] is True
    assert (await call(api, "listbannedevents")).json()["result"] == [{"id": note["id"], "reason": "illegal"}]
    rows = await api.app.store.read(lambda c: c.execute(SQL("SELECT count(*) FROM events WHERE id = ?",
                                                            "SELECT count(*) FROM events WHERE id = %s"),
                                                        (note["id"],)).fetchone()[0])
    assert rows == 0
    with pytest.raises(Rejected, match="banned"):
        await publish(api, None, note)
    assert (await call(api, "allowevent", [note["id"]])).json()["result"] is True
    assert (await call(api, "listbannedevents")).json()["result"] == []
    await publish(api, None, note)
    assert (await call(api, "listeventsneedingmoderation")).json()["result"] == []
    # Kinds.
    assert (await call(api, "disallowkind", [7])).json()["result"] is True
    with pytest.raises(Rejected, match="kind 7"):
        await publish(api, None, sign_event(alice.secret, 7, [], "+").to_dict())
    assert (await call(api, "listdisallowedkinds")).json()["result"] == [7]
    assert (await call(api, "allowkind", [1])).json()["result"] is True
    assert (await call(api, "listallowedkinds")).json()["result"] == [1]
    with pytest.raises(Rejected, match="kind 30023"):
        await publish(api, None, sign_event(alice.secret, 30023, [["d", "x"]], "long").to_dict())
    assert "error" in (await call(api, "allowkind", ["seven"])).json()
    # Relay information: NIP-11 changes at once.
    for method, value, key in (("changerelayname", "Managed", "name"), ("changerelaydescription", "by NIP-86",
                                                                        "description"),
                               ("changerelayicon", "https://example.org/i.png", "icon")):
        assert (await call(api, method, [value])).json()["result"] is True
        assert (await nip11(api))[key] == value


async def test_block_ip(api):
    assert (await call(api, "blockip", ["203.0.113.7", "abuse"])).json()["result"] is True
    assert (await call(api, "listblockedips")).json()["result"] == [{"ip": "203.0.113.7", "reason": "abuse"}]
    assert "error" in (await call(api, "blockip", ["not an address"])).json()
    assert (await call(api, "unblockip", ["203.0.113.7"])).json()["result"] is True
    assert (await call(api, "listblockedips")).json()["result"] == []


async def test_name_set_by_the_configuration_is_refused(tmp_path, anyio_backend):
    admin = Identity()
    d = Dashboard(tmp_path / "data", config=CONFIG + 'relay_name = "Fixed"\n', admin_pubkeys=admin.pubkey)
    d.operator = admin
    try:
        r = await call(d, "changerelayname", ["Other"])
        assert r.json()["result"] is None and "configuration" in r.json()["error"]
        assert (await nip11(d))["name"] == "Fixed"
    finally:
        await d.close()


async def test_no_admins_no_api(dash):
    someone = Identity()
    dash.operator = someone
    assert 86 not in (await nip11(dash))["supported_nips"]
    assert (await call(dash, "supportedmethods")).status_code == 403


async def test_a_call_signed_for_another_relay_is_refused_whatever_the_host_header(api):
    """NIP-98's `u` tag binds a call to this relay: a call the admin signed for another relay (which
    that relay could replay here, Host header and all) is refused, even though a single origin
    answers every host."""
    body = json.dumps({"method": "changerelayname", "params": ["Not yours"]}).encode()
    for other in ("https://other-relay.example.net/", "wss://other-relay.example.net"):
        header = make_http_auth(api.operator.secret, other, "POST", body)
        r = await api.client.post(other.replace("wss://", "https://"), content=body,
                                  headers={"Content-Type": CT, "Authorization": header})
        assert r.status_code == 401 and "url" in r.json()["error"], other
    assert (await nip11(api)).get("name") != "Not yours"


async def test_an_unconfigured_install_takes_the_local_url_it_was_reached_at(tmp_path, anyio_backend):
    """With no public_url, the URL a client used counts when its host is this machine (as for NIP-42)."""
    admin = Identity()
    d = Dashboard(tmp_path / "data", admin_pubkeys=admin.pubkey)
    d.operator = admin
    try:
        body = json.dumps({"method": "supportedmethods", "params": []}).encode()
        for url in ("http://localhost:7777/", "ws://localhost:7777", "http://127.0.0.1:7777", "ws://[::1]:7777/"):
            header = make_http_auth(admin.secret, url, "POST", body)
            r = await d.client.post(url.replace("ws://", "http://"), content=body,
                                    headers={"Content-Type": CT, "Authorization": header})
            assert r.status_code == 200, url
        header = make_http_auth(admin.secret, "http://relay.elsewhere.test/", "POST", body)
        r = await d.client.post("http://relay.elsewhere.test/", content=body,
                                headers={"Content-Type": CT, "Authorization": header})
        assert r.status_code == 401
    finally:
        await d.close()
