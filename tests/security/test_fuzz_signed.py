"""Fuzzing the relay's signed, stateful paths over the wire: properly signed events (a valid id and
signature, so they pass the checks the wire fuzz's made-up events stop at) with hostile kinds,
tags, content and timestamps. Each gets an OK: true, or false with a NIP-01 prefix; a refusal
leaves the whole database as it was, row for row, and the event is not served; the connection
stays open and the server logs no traceback. One real server for the module."""

from __future__ import annotations

import json
import re
import secrets
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.sync.client import connect

from appliance.errors import PREFIXES
from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret
from tests.conftest import Server
from tests.fuzzing import fuzz
from tests.pg import db_rows, table_names
from tests.security.test_fuzz_parsers import json_values

pytestmark = pytest.mark.fuzz

SECRET = generate_secret()
PREFIX = re.compile(r"^(%s):" % "|".join(sorted(PREFIXES) + ["unsupported"]))

# Kinds with a path of their own (NIP-09/29/42/59/98, leases, replaceable and addressable
# ranges, ephemeral), then any kind.
kinds = st.sampled_from([0, 1, 3, 4, 5, 7, 9, 10, 11, 12, 40, 41, 42, 443, 444, 445, 1059, 1984, 9000, 9001,
                         9002, 9005, 9007, 9008, 9009, 9021, 10002, 10050, 13194, 22242, 23194, 24133, 27235,
                         30000, 30023, 30350, 30351, 31990, 39000, 39001, 39002, 39003, 40000, 65535]) \
    | st.integers(0, 70000)
tag_names = st.sampled_from(["e", "p", "a", "d", "h", "t", "k", "expiration", "exec", "relay", "challenge", "-",
                             "protected", "delegation", "nonce", "alt", "q", "P", "E", "i", "u", "method",
                             "payload", "previous", "r", "name", "role"]) | st.text(max_size=3)
tag_values = (st.text(max_size=40) | st.text("0123456789abcdef", min_size=64, max_size=64)
              | st.integers(-2**70, 2**70).map(str)
              | st.sampled_from(["", "30350:" + "ab" * 32 + ":x", "0", "-1", "99999999999999999999", "1e9", " 5"]))
tags = st.lists(st.builds(lambda n, vs: [n, *vs], tag_names, st.lists(tag_values, max_size=3)), max_size=5)
content = st.text(max_size=120) | json_values.map(json.dumps)

# Nothing changes the database in the background while the module runs: the NIP-40 purge (an
# accepted event may expire within seconds) sweeps once a day here.
CONFIG = "purge_interval = 86400\n"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("fuzzsigned") / "data", config=CONFIG).start()
    yield server
    server.stop()
    log = server.log_path.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


def snapshot(data_dir) -> dict[str, list[str]]:
    """Every row of every table of the store."""
    return {t: sorted(map(repr, db_rows(data_dir, f'SELECT * FROM "{t}"'))) for t in table_names(data_dir)
            if not t.startswith("sqlite_")}


@pytest.fixture(scope="module")
def ws(srv):
    with connect(srv.url, max_size=None, ping_interval=None) as w:
        w.recv(10)
        srv.state = snapshot(srv.data_dir)
        yield w


def answer(ws, kind: str, key: str) -> list:
    while True:
        msg = json.loads(ws.recv(10))
        if msg[0] in kind and msg[1] == key:
            return msg


@fuzz(40)
@given(kind=kinds, tags=tags, content=content, created_at=st.integers(0, 2**33) | st.none())
def test_signed_hostile_events_are_answered_and_a_refusal_changes_nothing(srv, ws, kind, tags, content,
                                                                         created_at):
    ev = sign_event(SECRET, kind, tags, content, int(time.time()) if created_at is None else created_at)
    ws.send(json.dumps(["EVENT", ev.to_dict()]))
    _, _, ok, message = answer(ws, ("OK",), ev.id)
    assert ok is True or PREFIX.match(message), message
    sub = secrets.token_hex(4)
    ws.send(json.dumps(["REQ", sub, {"ids": [ev.id]}]))
    served = []
    while (msg := json.loads(ws.recv(10)))[0] != "EOSE" or msg[1] != sub:
        assert msg[0] != "CLOSED", msg
        if msg[0] == "EVENT" and msg[1] == sub:
            served.append(msg[2]["id"])
    ws.send(json.dumps(["CLOSE", sub]))
    if ok:
        srv.state = snapshot(srv.data_dir)
        return
    assert served == [], message
    after = snapshot(srv.data_dir)
    assert after == srv.state, (message, [t for t in after if after[t] != srv.state.get(t)])
