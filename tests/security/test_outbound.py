"""No outbound request to a client-supplied URL.

Structurally: the appliance reaches out from exactly these places, each to an address from the
operator's configuration (never from a request or an event; from a lease only where NIP-PL's
profile makes the endpoint a URL: the draft UnifiedPush one); a new one fails the test until it is
reviewed and listed. Behaviourally: a canary listener's address goes into every place
a client can name a URL (AUTH relay tag, event tags and content, relay lists, profile metadata,
a lease's endpoint, a NIP-98 `u` tag, gateway request bodies, the Host header) and the canary is
never contacted."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path

import httpx

from appliance.nostr.event import sign_event
from appliance.nostr.nip98 import make_http_auth
from tests.gateway.helpers import GatewaySetup
from tests.push.e2e_helpers import ORIGIN, Installation, active, current_key, lease, push_config

ROOT = Path(__file__).resolve().parents[2] / "appliance"
OUTBOUND = re.compile(r"httpx\.(Async)?Client\(|Http2Client\(|create_connection\(|open_connection\(|urlopen\(|"
                      r"\bnpm\b.*(view|pack)")
# file -> why its outbound address is the operator's, not a client's
REVIEWED = {
    "transports/apns.py": "APNs base URL of an app profile in the configuration",
    "transports/http2.py": "the HTTP/2 client the APNs transport builds from that URL",
    "transports/gateway.py": "gateway_url of an app profile in the configuration (no redirects followed)",
    "transports/fcm.py": "fcm_url and the service account's token_uri, both checked operator configuration",
    "transports/unifiedpush.py": "a lease's push URL, as the draft UnifiedPush profile defines it, only with "
                                 "push_draft_transports on and past the hostile-endpoint rules (spec-notes U1-U7)",
    "commands/doctor.py": "`appliance doctor` probes the operator's own public_url",
    "admin/assets.py": "`npm` fetches the pinned htmx from the registry npm is configured with",
}


def test_every_outbound_call_site_is_reviewed():
    found = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("testing/", "bench/")):
            continue  # test doubles and benchmarks: never part of a serving appliance
        if OUTBOUND.search(path.read_text()):
            found.add(rel)
    assert found == set(REVIEWED), (sorted(found - set(REVIEWED)), sorted(set(REVIEWED) - found))


class Canary:
    """A TCP listener that counts every connection made to it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.hits += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


async def test_client_supplied_urls_are_never_contacted(make_server, tmp_path, alice, connect):
    canary = Canary()
    try:
        urls = [f"{scheme}://127.0.0.1:{canary.port}/x" for scheme in ("http", "https", "ws", "wss")]
        setup = GatewaySetup(tmp_path)
        server = make_server(config=push_config() + "\n" + setup.config())
        c = await connect(server.url)
        # AUTH naming the canary as the relay (refused: wrong relay), then a proper one.
        for u in urls:
            ev = sign_event(alice.secret, 22242, [["relay", u], ["challenge", c.challenge]], "")
            await c.send(["AUTH", ev.to_dict()])
            assert (await c.expect(lambda m: m[0] == "OK" and m[1] == ev.id))[2] is False
        # Events carrying URLs everywhere a client may put one.
        events = [
            alice.sign(1, [["r", u] for u in urls] + [["relay", urls[2]], ["e", "00" * 32, urls[3]]], " ".join(urls)),
            alice.sign(10002, [["r", u] for u in urls[2:]]),
            alice.sign(0, content=json.dumps({"picture": urls[0], "nip05": f"a@127.0.0.1:{canary.port}",
                                              "lud16": f"a@127.0.0.1:{canary.port}", "website": urls[1]})),
            alice.sign(10050, [["relay", urls[3]]]),
        ]
        for ev in events:
            assert (await c.publish(ev))[0]
        # A lease whose endpoint is a URL (refused: not this profile's endpoint form) ...
        user = Installation()
        exec_id, exec_pub = current_key(server.nip11())
        u = await connect(server.url)
        assert (await u.auth(user.secret, ORIGIN))[0]
        ok, _ = await u.publish(lease(user, active(user, endpoint=urls[1]), exec_pub=exec_pub, exec_id=exec_id))
        # ... or, accepted or not, a wake for it must not go there either.
        await u.publish(sign_event(alice.secret, 9, [["p", user.pubkey], ["h", "3f2b8c1e-9d4a-4b6e-8f01-23456789abcd"]],
                                   "wake?").to_dict())
        async with httpx.AsyncClient(base_url=server.http, timeout=10) as http:
            # NIP-98 naming the canary; gateway bodies naming it; NIP-11 and NIP-86 with its Host.
            body = json.dumps({"v": 1, "endpoint_grant": urls[0], "request_id": "11111111-1111-4111-8111-111111111111",
                               "expires_at": int(time.time()) + 60}).encode()
            for u_ in urls[:2]:
                r = await http.post("/v1/deliveries/apns", content=body, headers={
                    "content-type": "application/json", "authorization": make_http_auth(alice.secret, u_, "POST", body)})
                assert r.status_code in (400, 401, 404)
            r = await http.post("/v1/installations", content=json.dumps({"v": 1, "endpoint": urls[0]}).encode(),
                                headers={"content-type": "application/json"})
            assert r.status_code == 400
            host = {"Host": f"127.0.0.1:{canary.port}"}
            await http.get("/", headers={"Accept": "application/nostr+json", **host})
            rpc = json.dumps({"method": "supportedmethods", "params": []}).encode()
            await http.post("/", content=rpc, headers={"Content-Type": "application/nostr+json+rpc", **host,
                                                       "Authorization": make_http_auth(alice.secret, urls[0], "POST", rpc)})
        time.sleep(2.0)  # anything scheduled (wakes, retries) has had its chance
        assert canary.hits == 0
    finally:
        canary.close()
