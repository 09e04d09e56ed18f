"""The lease property tests again, through the real server: generated valid plaintexts,
NIP-44-encrypted by nostr_sdk and published over a real websocket, are accepted; any single
rule-breaking mutation of one is refused with that rule's exact OK message and leaves the stored
event, the lease row and the watermark of the previously accepted lease unchanged.

The generators and mutations are the ones of `test_properties.py` (which runs them through the
pure pipeline with many more examples); here each example is a round trip, so fewer run in the
default suite. These are fuzz tests too: `pytest -m fuzz --fuzz-scale N` runs N times as many,
including any text at all (any JSON, one member of a valid lease replaced by anything) as a lease,
which is accepted or refused with a prefix, a refusal changing nothing."""

from __future__ import annotations

import copy
import json
import re
import secrets
import time

import nostr_sdk as sdk
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.sync.client import connect as ws_connect

from appliance.errors import PREFIXES
from appliance.nostr.event import sign_event
from appliance.push.errors import reason_message
from appliance.store.statement import SQL
from tests.conftest import Server
from tests.fuzzing import fuzz
from tests.push.e2e_helpers import current_key, db_rows, lease_state
from tests.push.helpers import AUTHOR, AUTHOR_HEX, DESCRIPTOR
from tests.pg import on_postgres
from tests.push.test_properties import ACTIVE_ONLY, ANY
from tests.push.test_properties import active_lease as any_active_lease
from tests.push.test_properties import inactive_lease
from tests.security.test_fuzz_parsers import json_values

pytestmark = pytest.mark.fuzz


def active_lease():
    """test_properties' active leases; on PostgreSQL without U+0000 in the plaintext, which that
    backend's text cannot hold (such a lease is refused there as invalid, see store/postgres.py)."""
    leases = any_active_lease()
    return leases.filter(lambda pt: "\\u0000" not in json.dumps(pt)) if on_postgres() else leases

# The server advertises exactly the descriptor the pure tests validate against, with room for
# every example's lease (each uses its own address and endpoint).
CONFIG = f"""
public_url = "{DESCRIPTOR.origin}"
push_draft_transports = true  # the fcm profile is a draft transport
[push]
app_profiles = [{{ id = "com.example.app/ios", transport = "apns" }}, {{ id = "com.example.app/android", transport = "fcm" }}]
push_kinds = {list(DESCRIPTOR.push_kinds)}
urgent_kinds = {list(DESCRIPTOR.urgent_kinds)}
class_support = {{ apns = ["silent", "default", "time_sensitive", "urgent"], fcm = ["silent", "default", "time_sensitive"] }}
[push.limitation]
max_leases_per_pubkey = 100000
"""

PREFIX = re.compile(r"^(%s):" % "|".join(sorted(PREFIXES)))
# Members of a lease plaintext (NIP-PL), one of which a text fuzz example replaces.
MEMBERS = ["v", "active", "origin", "app_profile", "transport", "endpoint", "generation", "subscriptions", "new"]


class SyncClient:
    """One authenticated websocket (as AUTHOR) for a whole module."""

    def __init__(self, ws):
        self.ws = ws
        msg = json.loads(self.ws.recv(timeout=10))
        assert msg[0] == "AUTH"
        auth = sign_event(AUTHOR.secret_key().to_hex(), 22242,
                          [["relay", DESCRIPTOR.origin], ["challenge", msg[1]]], "")
        assert self.publish(auth.to_dict()) == (True, "")

    def publish(self, ev: dict) -> tuple[bool, str]:
        kind = "AUTH" if ev["kind"] == 22242 else "EVENT"
        self.ws.send(json.dumps([kind, ev]))
        while True:
            msg = json.loads(self.ws.recv(timeout=10))
            if msg[0] == "OK" and msg[1] == ev["id"]:
                return msg[2], msg[3]

    def req_ids(self, d: str) -> list[str]:
        sub = secrets.token_hex(4)
        self.ws.send(json.dumps(["REQ", sub, {"kinds": [30350], "authors": [AUTHOR_HEX], "#d": [d]}]))
        ids = []
        while True:
            msg = json.loads(self.ws.recv(timeout=10))
            if msg[0] == "EVENT" and msg[1] == sub:
                ids.append(msg[2]["id"])
            elif msg[0] in ("EOSE", "CLOSED") and msg[1] == sub:
                self.ws.send(json.dumps(["CLOSE", sub]))
                return ids


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("push-props") / "data", config=CONFIG).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    # No keepalive: its pings draw from the global `random` in a thread of their own, which
    # hypothesis sees as a strategy using `random` when one lands during a draw.
    with ws_connect(server.url, max_size=None, open_timeout=10, ping_interval=None) as ws:
        yield SyncClient(ws)


@pytest.fixture(scope="module")
def exec_key(server):
    return current_key(server.nip11())


def unique(pt: dict) -> dict:
    """Give a generated plaintext an endpoint no earlier example used (endpoints are unique per
    author across active leases), keeping the generated text inside it."""
    if "endpoint" in pt and isinstance(pt["endpoint"], str):
        pt["endpoint"] = secrets.token_hex(8) + pt["endpoint"]
    return pt


def signed(pt: dict | str, exec_key, d: str, created_at: int) -> dict:
    kid, kpub = exec_key
    text = pt if isinstance(pt, str) else json.dumps(pt)
    content = sdk.nip44_encrypt(AUTHOR.secret_key(), sdk.PublicKey.parse(kpub), text, sdk.Nip44Version.V2)
    tags = [["d", d], ["expiration", str(created_at + 86400)], ["exec", kid]]
    ev = (sdk.EventBuilder(sdk.Kind(30350), content).tags([sdk.Tag.parse(t) for t in tags])
          .custom_created_at(sdk.Timestamp.from_secs(created_at)).finalize(AUTHOR))
    return json.loads(ev.as_json())


def new_d() -> str:
    return "prop-" + secrets.token_urlsafe(18)


@fuzz(25)
@given(pt=st.one_of(active_lease(), inactive_lease()))
def test_generated_valid_lease_accepted(server, client, exec_key, pt):
    d = new_d()
    ev = signed(unique(pt), exec_key, d, int(time.time()))
    assert client.publish(ev) == (True, "")
    assert client.req_ids(d) == [ev["id"]]
    rows = db_rows(server.data_dir, SQL("SELECT event_id, generation, active, endpoint FROM leases WHERE pubkey = ? "
                                        "AND d = ?",
                                        "SELECT event_id, generation, active, endpoint FROM leases WHERE pubkey = %s "
                                        "AND d = %s"),
                   (AUTHOR_HEX, d))
    assert rows == [(ev["id"], pt["generation"], int(pt["active"]), pt.get("endpoint"))]
    marks = db_rows(server.data_dir, SQL("SELECT generation FROM lease_watermarks WHERE pubkey = ? AND d = ?",
                                         "SELECT generation FROM lease_watermarks WHERE pubkey = %s "
                                         "AND d = %s"), (AUTHOR_HEX, d))
    assert marks == [(pt["generation"],)]


@pytest.mark.parametrize("mutation", ANY + ACTIVE_ONLY, ids=lambda m: m.__name__)
@fuzz(3)
@given(data=st.data())
def test_mutation_refused_with_exact_message_and_state_unchanged(server, client, exec_key, mutation, data):
    active = mutation in ACTIVE_ONLY or data.draw(st.booleans())
    pt = unique(data.draw(active_lease() if active else inactive_lease()))
    d = new_d()
    now = int(time.time())
    base = signed(pt, exec_key, d, now - 10)
    assert client.publish(base) == (True, "")
    before = lease_state(server.data_dir, AUTHOR_HEX)

    successor = copy.deepcopy(pt)
    successor["generation"] = min(pt["generation"] + 1, 2**53 - 1)
    mutated, code = mutation(successor, data.draw)
    ok, msg = client.publish(signed(mutated, exec_key, d, now))
    assert (ok, msg) == (False, reason_message(code)), mutation.__name__
    assert client.req_ids(d) == [base["id"]]
    assert lease_state(server.data_dir, AUTHOR_HEX) == before


@fuzz(10)
@given(base=active_lease(), text=st.none() | st.text(min_size=1, max_size=200) | json_values.map(json.dumps),
       member=st.sampled_from(MEMBERS), value=json_values)
def test_any_text_as_a_lease_is_accepted_or_refused_and_a_refusal_changes_nothing(server, client, exec_key, base,
                                                                                 text, member, value):
    """Over an accepted lease at the same address: any text at all, or a valid successor with one
    member replaced by any JSON value. A valid successor may be accepted; anything else is refused
    with a NIP-01 prefix, and leaves the leases, watermarks and stored lease events as they were."""
    d = new_d()
    now = int(time.time())
    base = unique(base)
    first = signed(base, exec_key, d, now - 10)
    assert client.publish(first) == (True, "")
    before = lease_state(server.data_dir, AUTHOR_HEX)
    if text is None:
        successor = copy.deepcopy(base)
        successor["generation"] = min(base["generation"] + 1, 2**53 - 1)
        successor[member] = value
        text = json.dumps(successor)
    ok, msg = client.publish(signed(text, exec_key, d, now))
    if ok:
        return
    assert PREFIX.match(msg), msg
    assert client.req_ids(d) == [first["id"]]
    assert lease_state(server.data_dir, AUTHOR_HEX) == before
