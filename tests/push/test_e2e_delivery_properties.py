"""Property: whatever the lease, the event and the provider's answers, every APNs attempt carries
the same constant body and the same header set, and a job's attempts share one apns-id
(NIP-PL "Wake Delivery": application_body(a) = C_transport for every attempt a)."""

from __future__ import annotations

import json
import secrets
import time

import nostr_sdk as sdk
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect as ws_connect

from appliance.nostr.event import sign_event
from appliance.transports.apns import APNS_BODY
from tests.pg import on_postgres
from tests.conftest import Server
from tests.push.delivery_helpers import TOPIC, Apns, delivery_config, jobs
from tests.push.e2e_helpers import IOS, ORIGIN, current_key

FIXED = {"apns-push-type": "alert", "apns-priority": "10", "apns-topic": TOPIC}
HEADER_NAMES = {"authorization", "apns-push-type", "apns-priority", "apns-topic", "apns-id", "apns-expiration",
                "content-length"}
# Answers that lead to another attempt soon, and answers that end a job.
AGAIN = [(503, "ServiceUnavailable"), (500, "InternalServerError"), (429, "TooManyRequests"),
         (400, "IdleTimeout"), (403, "ExpiredProviderToken")]
FINAL = [(200, None), (410, "Unregistered"), (410, "ExpiredToken"), (400, "BadDeviceToken"),
         (400, "DeviceTokenNotForTopic"), (413, "PayloadTooLarge"), (400, "BadPriority")]
CLASSES = ["silent", "default", "time_sensitive", "urgent"]


class User:
    def __init__(self, ws):
        self.keys = sdk.Keys.generate()
        self.secret = self.keys.secret_key().to_hex()
        self.pubkey = self.keys.public_key().to_hex()
        self.ws = ws
        challenge = json.loads(self.ws.recv(timeout=10))[1]
        auth = sign_event(self.secret, 22242, [["relay", ORIGIN], ["challenge", challenge]], "")
        assert self.publish(auth.to_dict()) == (True, "")

    def publish(self, ev: dict) -> tuple[bool, str]:
        self.ws.send(json.dumps(["AUTH" if ev["kind"] == 22242 else "EVENT", ev]))
        while True:
            msg = json.loads(self.ws.recv(timeout=10))
            if msg[0] == "OK" and msg[1] == ev["id"]:
                return msg[2], msg[3]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("props")
    apns = Apns(tmp).start()
    server = Server(tmp / "data", config=delivery_config(apns, settings={"wake_retry_delay": 0.02,
                                                                        "wake_max_attempts": 20},
                                                            extra="[push.limitation]\nmax_leases_per_pubkey = 10000\n")
                    ).start()
    try:
        # No keepalive: its pings draw from the global `random` in a thread of their own, which
        # hypothesis sees as a strategy using `random` when one lands during a draw.
        with ws_connect(server.url, max_size=None, open_timeout=10, ping_interval=None) as a, \
                ws_connect(server.url, max_size=None, open_timeout=10, ping_interval=None) as b:
            yield server, apns, User(a), User(b)
    finally:
        server.stop()
        apns.stop()


def lease_event(server: Server, user: User, plaintext: dict, d: str) -> dict:
    kid, kpub = current_key(server.nip11())
    content = sdk.nip44_encrypt(user.keys.secret_key(), sdk.PublicKey.parse(kpub), json.dumps(plaintext),
                                sdk.Nip44Version.V2)
    now = int(time.time())
    tags = [["d", d], ["expiration", str(now + 3600)], ["exec", kid]]
    ev = (sdk.EventBuilder(sdk.Kind(30350), content).tags([sdk.Tag.parse(t) for t in tags])
          .custom_created_at(sdk.Timestamp.from_secs(now)).finalize(user.keys))
    return json.loads(ev.as_json())


# (On PostgreSQL without U+0000, which its text cannot hold: such an event is refused as invalid there.)
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00" if on_postgres() else ""),
                max_size=40)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(classes=st.lists(st.sampled_from(CLASSES), min_size=1, max_size=3),
       contents=st.lists(texts, min_size=1, max_size=3),
       extra_tags=st.lists(st.lists(texts, min_size=1, max_size=3), max_size=3),
       # (Two ExpiredProviderToken in a row would be a configuration fault, retried only after a minute.)
       answers=st.lists(st.sampled_from(AGAIN), max_size=3).filter(
           lambda a: all(not (x == y == (403, "ExpiredProviderToken")) for x, y in zip(a, a[1:]))),
       final=st.sampled_from(FINAL),
       generation=st.integers(1, 2**53 - 1))
def test_every_attempt_has_the_constant_body_and_header_set(world, classes, contents, extra_tags, answers, final,
                                                            generation):
    server, apns, alice, bob = world
    endpoint = secrets.token_hex(32)
    d = "prop-" + secrets.token_urlsafe(18)
    subs = [{"filter": {"kinds": [9], "#p": [bob.pubkey]} if i % 2 == 0 else
             {"kinds": [9], "authors": [alice.pubkey]}, "class": c} for i, c in enumerate(classes)]
    plaintext = {"v": 1, "origin": ORIGIN, "app_profile": IOS, "transport": "apns", "endpoint": endpoint,
                 "generation": generation, "active": True, "subscriptions": subs}
    assert bob.publish(lease_event(server, bob, plaintext, d)) == (True, "")
    apns.emulator.script(endpoint, answers + [final])
    event_ids = []
    for content in contents:
        tags = [["p", bob.pubkey]] + [["t", *t] for t in extra_tags]
        ev = sign_event(alice.secret, 9, tags, content + secrets.token_hex(4))
        assert alice.publish(ev.to_dict()) == (True, "")
        event_ids.append(ev.id)
    # Wait until every job of this lease is finished, then look at every attempt APNs saw.
    deadline = time.monotonic() + 30
    while True:
        mine = [j for e in event_ids for j in jobs(server, event_id=e) if j["lease_d"] == d]
        if mine and all(j["state"] in ("delivered", "invalidated", "dead", "coalesced", "dropped") for j in mine):
            break
        assert time.monotonic() < deadline, mine
        time.sleep(0.05)
    attempts = apns.emulator.requests(endpoint)
    assert attempts
    by_id: dict[str, set] = {}
    for rec in attempts:
        assert rec.body == APNS_BODY
        headers = dict(rec.headers)
        assert set(headers) == HEADER_NAMES and len(rec.headers) == len(HEADER_NAMES)
        assert {k: headers[k] for k in FIXED} == FIXED
        assert rec.path == f"/3/device/{endpoint}"
        by_id.setdefault(headers["apns-id"], set()).add(headers["apns-expiration"])
    assert set(by_id) <= {j["id"] for j in mine}
    assert all(len(expirations) == 1 for expirations in by_id.values())
