"""Fuzzing the appliance over the wire: websocket messages and raw frames at the relay, request
bodies at the gateway's HTTP routes. One real server per module (relay and gateway on one listener).

No crash (the server keeps answering, no traceback in its log), no hang (every answer within a
timeout), no state change on rejection (stored events; the gateway's installations, delegations,
grant keys and quotas, row for row)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time

import httpx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret
from appliance.testing.gateway_client import AppInstallation
from tests.conftest import Server
from tests.fuzzing import fuzz
from tests.gateway.helpers import PROFILE, GatewaySetup, token
from tests.security.test_fuzz_parsers import json_values

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzzwire")
    setup = GatewaySetup(tmp)
    server = Server(tmp / "data", config=setup.config())
    server.start()
    server.setup = setup
    with connect(server.url) as ws:  # one stored event: the baseline COUNT
        ws.recv()
        ev = sign_event(generate_secret(), 1, [], "baseline")
        ws.send(json.dumps(["EVENT", ev.to_dict()]))
        assert json.loads(ws.recv(10))[2] is True
    yield server
    server.stop()
    log = server.log_path.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def stored_count(server) -> int:
    with connect(server.url) as ws:
        ws.recv()
        ws.send('["COUNT","n",{}]')
        return json.loads(ws.recv(10))[2]["count"]


# -- websocket messages ------------------------------------------------------------------------------------

HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
fake_event = st.fixed_dictionaries(
    {"id": HEX64, "pubkey": HEX64, "sig": st.text("0123456789abcdef", min_size=128, max_size=128),
     "kind": st.integers(0, 70000), "created_at": st.integers(0, 2**34), "content": st.text(max_size=40),
     "tags": st.lists(st.lists(st.text(max_size=10), max_size=3), max_size=3)},
    optional={"extra": json_values})
filters = st.dictionaries(st.sampled_from(["ids", "authors", "kinds", "since", "until", "limit", "#p", "#h", "#zz",
                                           "search"]), json_values | st.lists(HEX64, max_size=2), max_size=4)
sub_ids = st.text(max_size=70) | json_values
verbs = st.sampled_from(["EVENT", "REQ", "COUNT", "CLOSE", "AUTH", "NEG-OPEN", "event", ""]) | st.text(max_size=8)
messages = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.tuples(verbs, st.lists(sub_ids | filters | fake_event | json_values, max_size=4)).map(
        lambda t: json.dumps([t[0], *t[1]])),
    st.tuples(st.sampled_from(["EVENT", "AUTH"]), fake_event).map(lambda t: json.dumps(list(t))),
    st.tuples(st.sampled_from(["REQ", "COUNT"]), sub_ids, st.lists(filters, max_size=3)).map(
        lambda t: json.dumps([t[0], t[1], *t[2]])),
    st.binary(max_size=100),
)


class Conn:
    """One long-lived connection reused across examples (reopened only if the relay closes it)."""

    def __init__(self, server):
        self.server, self.ws, self.n, self.closes = server, None, 0, []

    def open(self):
        if self.ws is None:
            # closed by the fixture; no keepalive: its pings draw from the global `random` in a thread
            # of their own, which hypothesis sees as a strategy using `random` when one lands in a draw
            self.ws = connect(self.server.url, max_size=None, ping_interval=None).__enter__()
            assert json.loads(self.ws.recv(10))[0] == "AUTH"
        return self.ws

    def probe(self) -> None:
        """The relay still answers this connection: a REQ gets its EOSE (or CLOSED) in time."""
        ws = self.open()
        self.n += 1
        sid = f"probe{self.n}"
        ws.send(json.dumps(["REQ", sid, {"ids": ["00" * 32]}]))
        deadline = time.monotonic() + 10
        while True:
            msg = json.loads(ws.recv(max(0.01, deadline - time.monotonic())))
            if msg[0] in ("EOSE", "CLOSED") and msg[1] == sid:
                break
        ws.send(json.dumps(["CLOSE", sid]))


@pytest.fixture(scope="module")
def conn(srv):
    c = Conn(srv)
    yield c
    if c.ws is not None:
        c.ws.close()


@fuzz(150)
@given(msg=messages)
def test_websocket_messages_are_answered_or_ignored_never_fatal(srv, conn, msg):
    ws = conn.open()
    try:
        ws.send(msg)
        conn.probe()
    except ConnectionClosed as exc:
        # Closing is allowed only with a protocol reason (never 1011, an internal error).
        assert exc.rcvd is not None and exc.rcvd.code in (1003, 1007, 1008, 1009), exc
        conn.closes.append(exc.rcvd.code)
        conn.ws = None
        conn.probe()


def test_websocket_fuzz_stored_nothing(srv, conn):
    assert stored_count(srv) == 1


# -- raw websocket frames ------------------------------------------------------------------------------------


def raw_upgrade(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


def frame(fin: bool, rsv: int, opcode: int, masked: bool, payload: bytes, length_form: int) -> bytes:
    b0 = (0x80 if fin else 0) | (rsv & 7) << 4 | (opcode & 15)
    n = len(payload)
    if length_form == 0 and n < 126:
        head = bytes([b0, (0x80 if masked else 0) | n])
    elif length_form <= 1 and n < 65536:
        head = bytes([b0, (0x80 if masked else 0) | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([b0, (0x80 if masked else 0) | 127]) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


frames = st.lists(st.builds(frame, st.booleans(), st.integers(0, 7), st.integers(0, 15), st.booleans() | st.just(True),
                            st.binary(max_size=200) | messages.map(lambda m: m if isinstance(m, bytes) else m.encode()),
                            st.integers(0, 2)) | st.binary(max_size=64), min_size=1, max_size=4)


@fuzz(40)
@given(chunks=frames)
def test_raw_frames_close_or_continue_and_others_are_served(srv, chunks):
    s = raw_upgrade(srv.port)
    try:
        for c in chunks:
            try:
                s.sendall(c)
            except (BrokenPipeError, ConnectionResetError):
                break  # the relay closed on an earlier frame
        s.settimeout(0.3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # read until the relay closes or goes quiet
            try:
                if not s.recv(65536):
                    break
            except TimeoutError:
                break
            except ConnectionResetError:
                break
        else:
            raise AssertionError("the relay kept talking for 10 s")
    finally:
        s.close()
    with connect(srv.url) as ws:  # another client is served at once
        ws.recv(10)
        ws.send('["REQ","x",{"limit":1}]')
        assert json.loads(ws.recv(10))[0] == "EVENT"


# -- gateway request bodies over HTTP ---------------------------------------------------------------------------

GATEWAY_ROUTES = ["/v1/installations/challenges", "/v1/installations", "/v1/delegations",
                  "/v1/installations/endpoint", "/v1/delegations/revoke", "/v1/installations/revoke",
                  "/v1/deliveries/apns"]
# Challenges are single use and NIP-98 events are burned when seen, refused or not (by design):
# every other gateway row must be unchanged by a refused request.
STATE_TABLES = ["gateway_installations", "gateway_delegations", "gateway_grant_keys", "gateway_reservations",
                "gateway_endpoint_quota"]


def gateway_state(server) -> dict:
    from tests.pg import db_rows

    return {t: db_rows(server.data_dir, f"SELECT * FROM {t} ORDER BY 1") for t in STATE_TABLES}


def refused_cleanly(r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    assert set(r.json()) <= {"error", "retry_after"} and r.json()["error"], r.text


@pytest.fixture(scope="module")
def enrolled(srv):
    """An enrolled installation with one delegation: refused requests must leave both as they are."""
    async def go():
        async with httpx.AsyncClient(base_url=srv.http, timeout=20) as http:
            inst = AppInstallation(http, srv.http, srv.setup.attester(), PROFILE, token())
            assert (await inst.enroll()).status_code == 201
            assert (await inst.delegate("ab" * 32, 1)).status_code == 201
            return inst

    return asyncio.run(go())


# Something under the HTTP client seeds from the global `random` module; hypothesis then warns
# that its examples may not replay exactly. The examples do not depend on it.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@fuzz(60)
@given(route=st.sampled_from(GATEWAY_ROUTES), body=st.binary(max_size=200) | json_values.map(
    lambda v: json.dumps(v).encode()), ctype=st.sampled_from(["application/json", "text/plain", None,
                                                              "application/json; charset=utf-8"]),
       auth=st.none() | st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40) | json_values.map(
           lambda v: "Nostr " + base64.b64encode(json.dumps(v).encode()).decode()))
def test_arbitrary_gateway_bodies_are_refused_cleanly(srv, enrolled, route, body, ctype, auth):
    before = gateway_state(srv)
    headers = {"content-type": ctype} if ctype else {}
    if auth is not None:
        headers["authorization"] = auth
    r = httpx.post(srv.http + route, content=body, headers=headers, timeout=20)
    if route.endswith("/challenges") and r.status_code == 201:
        return  # {"v":1}: a fresh challenge is the answer
    refused_cleanly(r)
    assert gateway_state(srv) == before


OPS = {
    "enroll": ["v", "challenge_id", "challenge", "key_id", "app_profile", "endpoint", "endpoint_epoch",
               "expires_at", "attestation", "extra"],
    "delegate": ["v", "challenge_id", "challenge", "installation_handle", "endpoint_epoch", "generation",
                 "relay_pubkey", "not_before", "expires_at", "assertion", "extra"],
    "rotate": ["v", "challenge", "installation_handle", "endpoint_epoch", "new_endpoint_epoch", "endpoint",
               "assertion", "extra"],
    "revoke_delegation": ["v", "challenge_id", "installation_handle", "relay_pubkey", "generation", "assertion"],
    "revoke": ["v", "challenge", "installation_handle", "endpoint_epoch", "new_endpoint_epoch", "assertion"],
}


def tampering(inst: AppInstallation, member: str, value, changed: list) -> AppInstallation:
    """`inst`, its signed requests then changed in one member on the way out (not challenge requests);
    `changed` notes whether the value really differed (else the request is a genuine one)."""
    post = AppInstallation.post.__get__(inst)

    async def tampered(route: str, body, **headers):
        if route.endswith("/challenges") or not isinstance(body, dict):
            return await post(route, body, **headers)
        old = body.get(member, changed)
        changed.append(old is changed or old != value or type(old) is not type(value))
        return await post(route, {**body, member: value}, **headers)

    inst.post = tampered
    return inst


# Something under the HTTP client seeds from the global `random` module; hypothesis then warns
# that its examples may not replay exactly. The examples do not depend on it.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@fuzz(60)
@given(op_member=st.sampled_from([(op, m) for op, ms in OPS.items() for m in ms]),
       value=json_values | st.text("0123456789abcdef-", max_size=70) | st.integers(0, 5))
def test_signed_requests_with_one_member_changed_change_nothing(srv, enrolled, op_member, value):
    """Properly attested/asserted requests over fresh challenges, one member then replaced: the
    attestation or assertion no longer covers it, so each is refused and nothing changes."""
    op, member = op_member
    before = gateway_state(srv)
    changed: list = []

    async def go():
        async with httpx.AsyncClient(base_url=srv.http, timeout=20) as http:
            if op == "enroll":
                inst = AppInstallation(http, srv.http, srv.setup.attester(), PROFILE, token())
                return await tampering(inst, member, value, changed).enroll()
            enrolled.http = http
            inst = tampering(enrolled, member, value, changed)
            try:
                if op == "delegate":
                    return await inst.delegate("cd" * 32, 1)
                if op == "rotate":
                    return await inst.rotate(token())
                if op == "revoke_delegation":
                    return await inst.revoke_delegation("ab" * 32, 1)
                return await inst.revoke()
            finally:
                del inst.post

    r = asyncio.run(go())
    assume(r.status_code != 429 and changed == [True])  # a same-value "change" is a genuine request
    refused_cleanly(r)
    assert gateway_state(srv) == before
