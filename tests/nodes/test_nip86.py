"""NIP-86 on several nodes: a change's authorization event is spent in the shared database, so a
request spent on one node is refused on every other, and of one request sent to several nodes at
once exactly one makes the change."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from appliance.nostr.nip98 import make_http_auth
from tests.conftest import Identity
from tests.nodes.conftest import PUBLIC

CT = "application/nostr+json+rpc"
SPENT = {"error": "unauthorized: this authorization event was already used"}


def change(admin: Identity, method: str, params: list) -> tuple[bytes, dict]:
    body = json.dumps({"method": method, "params": params}).encode()
    return body, {"Content-Type": CT, "Host": "relay.test",
                  "Authorization": make_http_auth(admin.secret, "http://relay.test/", "POST", body)}


def test_a_change_spent_on_one_node_is_refused_on_another(nodes):
    admin, target = Identity(), Identity()
    n = nodes(config=f'public_url = "{PUBLIC}"\nadmin_pubkeys = ["{admin.pubkey}"]\n')
    a, b = n.add("a"), n.add("b")
    body, headers = change(admin, "banpubkey", [target.pubkey, "spam"])
    r = httpx.post(a.http + "/", content=body, headers=headers)
    assert r.status_code == 200 and r.json() == {"result": True}, r.text
    here = httpx.post(a.http + "/", content=body, headers=headers)
    assert (here.status_code, here.json()) == (401, SPENT)
    there = httpx.post(b.http + "/", content=body, headers=headers)
    assert (there.status_code, there.json()) == (401, SPENT)


@pytest.mark.slow
def test_one_request_sent_to_two_nodes_at_once_is_accepted_once(nodes):
    admin = Identity()
    n = nodes(config=f'public_url = "{PUBLIC}"\nadmin_pubkeys = ["{admin.pubkey}"]\n')
    a, b = n.add("a"), n.add("b")
    for i in range(10):
        body, headers = change(admin, "blockip", [f"203.0.113.{i}"])
        targets = [a, b, a, b]
        with ThreadPoolExecutor(len(targets)) as pool:
            answers = list(pool.map(lambda s: httpx.post(s.http + "/", content=body, headers=headers, timeout=30),
                                    targets))
        assert sorted(r.status_code for r in answers) == [200, 401, 401, 401], [r.text for r in answers]
        assert [r.json() for r in answers if r.status_code == 401] == [SPENT] * 3
