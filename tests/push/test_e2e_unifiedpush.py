"""UnifiedPush (draft) end to end: a real appliance process, a lease naming a local HTTPS
distributor, an event -> the distributor receives a Web Push message that an independent decryptor
(http-ece) opens to the profile's constant, signed with a VAPID key the appliance keeps."""

from __future__ import annotations

import base64
import json
import time

import http_ece
import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from appliance.testing.distributor import Distributor
from appliance.transports.unifiedpush import UNIFIEDPUSH_PLAINTEXT
from tests.conftest import Server
from tests.leaks import sensitive
from tests.push.delivery_helpers import Pusher, jobs, log_rows, wait_until
from tests.push.e2e_helpers import ORIGIN, db_rows

pytestmark = pytest.mark.anyio

UP = "org.example.app/up"
CONTACT = "mailto:operator@example.org"


def config(distributor: Distributor, *, allow: bool = True, drafts: bool = True, extra: str = "") -> str:
    fields = [f'id = "{UP}"', 'transport = "unifiedpush"', f'vapid_subject = "{CONTACT}"',
              f'ca_file = "{distributor.ca_file}"']
    if allow:
        fields.append(f'allow_hosts = ["{distributor.host}"]')
    return f"""
public_url = "{ORIGIN}"
push_draft_transports = {str(drafts).lower()}
wake_min_interval = 0
wake_retry_delay = 0.2
purge_interval = 3600
[push]
app_profiles = [{{ {", ".join(fields)}{extra} }}]
push_kinds = [9]
class_support = {{ unifiedpush = ["default", "time_sensitive"] }}
"""


@pytest.fixture
def distributor(tmp_path):
    d = Distributor(host="localhost", pki_dir=tmp_path / "pki").start_in_thread(host="localhost")
    yield d
    d.stop_thread()


def subscription(distributor: Distributor, name: str):
    sub = distributor.subscribe(f"/up/{name}")
    sensitive(sub.endpoint, f"/up/{name}")
    return sub


def mention(user) -> list[dict]:
    return [{"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": "time_sensitive"}]


def _d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def vapid(record) -> tuple[dict, str]:
    """(claims, k) of a request's VAPID authorization, the JWT verified against k here."""
    params = dict(p.strip().split("=", 1) for p in record.header("authorization")[len("vapid "):].split(","))
    head, claims, sig = params["t"].split(".")
    raw = _d(sig)
    ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), _d(params["k"])).verify(
        encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")),
        f"{head}.{claims}".encode(), ec.ECDSA(hashes.SHA256()))
    return json.loads(_d(claims)), params["k"]


async def test_lease_event_wake_decrypts_to_the_constant(tmp_path, distributor):
    server = Server(tmp_path / "data", config=config(distributor)).start()
    try:
        assert {"id": UP, "transport": "unifiedpush"} in server.nip11()["push"]["app_profiles"]
        bob, alice = await Pusher.connect(server), await Pusher.connect(server)
        sub = subscription(distributor, "bob-phone")
        await bob.lease(sub.endpoint, app_profile=UP, transport="unifiedpush", subscriptions=mention(bob))
        await alice.publish(9, [["p", bob.pubkey]])
        [r] = distributor.wait_for(lambda rs: len(rs) >= 1)
        assert r.status == 201 and r.problem == "" and r.target == "/up/bob-phone"
        # The phone's side: only its private key and auth secret open the message, to the constant.
        plain = http_ece.decrypt(r.body, private_key=sub.private_key, auth_secret=sub.auth, version="aes128gcm")
        assert plain == UNIFIEDPUSH_PLAINTEXT
        claims, k = vapid(r)
        assert claims["aud"] == distributor.url and claims["sub"] == CONTACT
        assert claims["exp"] <= time.time() + 24 * 3600
        assert r.header("urgency") == "high" and 0 < int(r.header("ttl")) <= 3600
        await wait_until(lambda: [j["state"] for j in jobs(server)] == ["delivered"])
        [row] = log_rows(server)
        assert (row["transport"], row["outcome"], row["status"]) == ("unifiedpush", "accepted", 201)
        # The key is kept wrapped: one row for this origin and push service, the same after a restart.
        [(push_origin, wrapped)] = db_rows(server.data_dir, "SELECT push_origin, wrapped FROM vapid_keys")
        assert push_origin == distributor.url and _d(k) not in bytes(wrapped)
        await bob.client.close()
        await alice.client.close()
        server.stop()
        server.start()
        bob, alice = await Pusher.connect(server, user=bob.user), await Pusher.connect(server)
        await alice.publish(9, [["p", bob.pubkey]])
        rs = distributor.wait_for(lambda rs: len(rs) >= 2)
        assert vapid(rs[1])[1] == k
        assert http_ece.decrypt(rs[1].body, private_key=sub.private_key, auth_secret=sub.auth,
                                version="aes128gcm") == UNIFIEDPUSH_PLAINTEXT
        await bob.client.close()
        await alice.client.close()
    finally:
        server.stop()


async def test_a_loopback_distributor_is_refused_without_the_allowlist(tmp_path, distributor):
    server = Server(tmp_path / "data", config=config(distributor, allow=False)).start()
    try:
        bob, alice = await Pusher.connect(server), await Pusher.connect(server)
        sub = subscription(distributor, "lo")
        await bob.lease(sub.endpoint, app_profile=UP, transport="unifiedpush", subscriptions=mention(bob))
        await alice.publish(9, [["p", bob.pubkey]])
        await wait_until(lambda: [j["state"] for j in jobs(server)] == ["invalidated"])
        [row] = log_rows(server)
        assert (row["outcome"], row["reason"]) == ("invalid_endpoint", "ForbiddenAddress")
        assert "localhost" in row["detail"] and "/up/lo" not in row["detail"]
        # That endpoint generation is disabled, and no request left the appliance.
        [(invalidated,)] = db_rows(server.data_dir, "SELECT invalidated_at FROM leases")
        assert invalidated is not None and distributor.requests() == []
        await alice.publish(9, [["p", bob.pubkey]])
        time.sleep(0.5)
        assert distributor.requests() == [] and len(log_rows(server)) == 1
        # The lease holder's endpoint is at fault, not the operator's profile: no alert.
        assert db_rows(server.data_dir, "SELECT reason FROM push_alerts") == []
        await bob.client.close()
        await alice.client.close()
    finally:
        server.stop()


# "\xb2" ('²'): str.isdigit() says yes, float() says no; a lease-chosen host must not make send() raise.
@pytest.mark.parametrize("retry_after", [0, "\xb2", "1" * 100, "Wed, 32 Foo 99999 25:61:00 GMT"])
async def test_a_failing_push_service_neither_fails_the_profile_nor_alerts(tmp_path, distributor, retry_after):
    server = Server(tmp_path / "data", config=config(distributor, extra=", host_rate = 1000")).start()
    try:
        bob, alice = await Pusher.connect(server), await Pusher.connect(server)
        sub = subscription(distributor, "down")
        distributor.behave("/up/down", 503, retry_after=retry_after)
        await bob.lease(sub.endpoint, app_profile=UP, transport="unifiedpush", subscriptions=mention(bob))
        await alice.publish(9, [["p", bob.pubkey]])
        distributor.wait_for(lambda rs: len(rs) >= 4, timeout=30)
        assert all(r.status == 503 for r in distributor.requests())
        assert {r["outcome"] for r in log_rows(server)} == {"transient"}
        assert db_rows(server.data_dir, "SELECT reason FROM push_alerts") == []
        health = {t["app_profile"]: t for t in httpx.get(server.http + "/admin/health").json()["transports"]}
        assert health[UP]["state"] not in ("failing", "fault"), health[UP]
        await bob.client.close()
        await alice.client.close()
    finally:
        server.stop()


async def test_off_unless_draft_transports_are_on(tmp_path, distributor):
    server = Server(tmp_path / "data", config=config(distributor, drafts=False)).start()
    try:
        assert "push" not in server.nip11() or all(p["id"] != UP for p in server.nip11()["push"]["app_profiles"])
    finally:
        server.stop()


async def test_a_test_wake_from_the_dashboard(tmp_path, distributor):
    import re

    from tests.admin.test_health import signed_in

    server = Server(tmp_path / "data", config=config(distributor)).start()
    dash = None
    try:
        dash = signed_in(server)
        page = dash.get("/admin/descriptor").text
        assert "unifiedpush (draft)" in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        sub = subscription(distributor, "test-wake")
        r = dash.post("/admin/descriptor/test-wake", data={"csrf": csrf, "origin": "1", "profile": UP,
                                                            "token": sub.endpoint})
        assert r.status_code == 200 and "201" in r.text, r.text
        [rec] = distributor.requests()
        plain = http_ece.decrypt(rec.body, private_key=sub.private_key, auth_secret=sub.auth, version="aes128gcm")
        assert plain == UNIFIEDPUSH_PLAINTEXT
        assert "/up/test-wake" not in r.text  # the page names the endpoint by a fingerprint only
    finally:
        if dash is not None:
            dash.close()
        server.stop()


class Tarpit:
    """A push host (named by a lease holder) that accepts connections and never answers."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.conns:
            conn.close()


async def test_stalled_push_hosts_do_not_hold_the_workers_apns_wakes_need(tmp_path):
    # Four delivery workers; one tenant's leases name a push host that never answers (each attempt
    # would hold a worker for the whole 5 s timeout). Another tenant's APNs wake still goes at once:
    # it is delivered before any of the stalled attempts has even timed out.
    from tests.push.delivery_helpers import Apns, token
    from tests.push.e2e_helpers import IOS

    apns = Apns(tmp_path).start()
    pit = Tarpit()
    up = (f'{{ id = "{UP}", transport = "unifiedpush", vapid_subject = "{CONTACT}", '
          f'allow_hosts = ["localhost"], host_rate = 1000 }}')
    cfg = f"""
public_url = "{ORIGIN}"
push_draft_transports = true
wake_workers = 4
wake_min_interval = 0
wake_retry_delay = 30
purge_interval = 3600
[push]
app_profiles = [{apns.profile()}, {up}]
push_kinds = [9]
class_support = {{ apns = ["default", "time_sensitive"], unifiedpush = ["default", "time_sensitive"] }}
"""
    server = Server(tmp_path / "data", config=cfg).start()
    try:
        mallory, carol, alice = [await Pusher.connect(server) for _ in range(3)]
        keys = Distributor().subscribe("/x").endpoint.split("#", 1)[1]
        for i in range(8):
            await mallory.lease(f"http://localhost:{pit.port}/up/{i}#{keys}", d=f"m-{i}", app_profile=UP,
                                transport="unifiedpush", subscriptions=mention(mallory))
        await carol.lease(token(), app_profile=IOS, transport="apns", subscriptions=mention(carol))
        await alice.publish(9, [["p", mallory.pubkey]])
        await wait_until(lambda: len(pit.conns) >= 1, timeout=10)
        await alice.publish(9, [["p", carol.pubkey]])
        await wait_until(lambda: [j["state"] for j in jobs(server, app_profile=IOS)] == ["delivered"], timeout=20)
        up_rows = [r for r in log_rows(server) if r["app_profile"] == UP]
        assert not any(r["reason"] == "Timeout" for r in up_rows), "the APNs wake waited for a stalled attempt"
        # The stalled host's other wakes were turned back at once (not queued behind the stalled one).
        assert any(r["reason"] == "TooManyInFlight" and r["outcome"] == "transient" for r in up_rows), up_rows
        assert db_rows(server.data_dir, "SELECT reason FROM push_alerts") == []
    finally:
        server.stop()
        apns.stop()
        pit.close()
