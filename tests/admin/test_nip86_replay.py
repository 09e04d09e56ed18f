"""A NIP-86 change's authorization event is spent once for good (docs/spec-notes.md A1): the
record is in the store, so the replay of a captured change request is refused after a restart too,
with the answer a replay gets from the process that took it first."""

from __future__ import annotations

import json

import httpx
import pytest

from appliance.nostr.nip98 import make_http_auth
from tests.conftest import Identity

CT = "application/nostr+json+rpc"
SPENT = {"error": "unauthorized: this authorization event was already used"}


def signed(admin: Identity, url: str, method: str, params: list) -> tuple[bytes, dict]:
    body = json.dumps({"method": method, "params": params}).encode()
    return body, {"Content-Type": CT, "Authorization": make_http_auth(admin.secret, url, "POST", body)}


def banned(server, admin: Identity) -> list[str]:
    body, headers = signed(admin, server.http + "/", "listbannedpubkeys", [])
    r = httpx.post(server.http + "/", content=body, headers=headers)
    assert r.status_code == 200, r.text
    return [e["pubkey"] for e in r.json()["result"]]


@pytest.mark.slow
def test_a_spent_change_is_refused_after_a_restart(make_server):
    admin, target = Identity(), Identity()
    server = make_server(config=f'admin_pubkeys = ["{admin.pubkey}"]\n')
    url = server.http + "/"
    ban = signed(admin, url, "banpubkey", [target.pubkey, "spam"])
    r = httpx.post(url, content=ban[0], headers=ban[1])
    assert r.status_code == 200 and r.json() == {"result": True}, r.text
    replay = httpx.post(url, content=ban[0], headers=ban[1])
    assert (replay.status_code, replay.json()) == (401, SPENT)
    unban = signed(admin, url, "unbanpubkey", [target.pubkey])
    assert httpx.post(url, content=unban[0], headers=unban[1]).json() == {"result": True}
    server.stop()
    server.start()
    # The captured ban, within its time window, after the restart: refused the same way, and the
    # admin's later decision (the unban) stands.
    r = httpx.post(url, content=ban[0], headers=ban[1])
    assert (r.status_code, r.json(), r.headers.get("www-authenticate")) == \
        (replay.status_code, replay.json(), replay.headers.get("www-authenticate"))
    assert target.pubkey not in banned(server, admin)
    # Reads may still repeat (a client listing twice within a second signs the same event).
    listing = signed(admin, url, "listbannedpubkeys", [])
    assert [httpx.post(url, content=listing[0], headers=listing[1]).status_code for _ in range(2)] == [200, 200]
