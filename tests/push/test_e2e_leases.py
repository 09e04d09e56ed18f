"""NIP-PL lease acceptance over real websockets: one case per reason string, each proving the
previously accepted lease (stored event, lease row, watermark) is unchanged."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from appliance.store.statement import SQL
from tests.conftest import Client, Server
from tests.push.e2e_helpers import (
    ANDROID,
    CHANNEL,
    ORIGIN,
    Installation,
    active,
    current_key,
    lease,
    lease_state,
    pad_d,
    push_config,
    tombstone,
)

pytestmark = pytest.mark.anyio

LIMITS = {"max_leases_per_pubkey": 3, "max_lease_ttl": 7 * 86400}


@pytest.fixture(scope="module")
def push_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("push")
    server = Server(tmp / "data", config=push_config(limitation=LIMITS)).start()
    yield server
    server.stop()


@pytest.fixture
def exec_key(push_server):
    return current_key(push_server.nip11())


async def authed(server, user) -> Client:
    c = await Client.connect(server.url)
    ok, msg = await c.auth(user.secret, ORIGIN)
    assert ok, msg
    return c


def _case(name, build, expected, who="self"):
    return pytest.param(build, expected, who, id=name)


def L(**kw):  # noqa: N802 - terse table entries
    return kw


OTHER = "b" * 64
CASES = [
    _case("auth-required", lambda u, k: lease(u, active(u, generation=9), **k),
          "auth-required: push lease requires authentication", who="anon"),
    _case("pubkey-mismatch", lambda u, k: lease(u, active(u, generation=9), **k),
          "restricted: pubkey does not match authenticated user", who="other"),
    _case("bad-signature", lambda u, k: {**lease(u, active(u, generation=9), **k),
                                         "sig": "0" * 128}, "invalid: bad signature"),
    _case("missing-d", lambda u, k: lease(u, active(u, generation=9), **k, tags=[
        ["expiration", str(int(time.time()) + 3600)], ["exec", k["exec_id"]]]), "invalid: missing d tag"),
    _case("public-p-tag", lambda u, k: lease(u, active(u, generation=9), **k, tags=[
        ["d", pad_d("lease-d-1")], ["expiration", str(int(time.time()) + 3600)], ["exec", k["exec_id"]],
        ["p", u.pubkey]]), "invalid: unexpected tag"),
    _case("ttl-too-long", lambda u, k: lease(u, active(u, generation=9), **k, ttl=8 * 86400),
          "invalid: lease ttl too long"),
    _case("already-expired", lambda u, k: lease(u, active(u, generation=9), **k, ttl=-10),
          "invalid: lease already expired"),
    _case("unknown-executor-key", lambda u, k: lease(u, active(u, generation=9), **{**k, "exec_id": "nope"}),
          "invalid: unknown executor key"),
    _case("undecryptable", lambda u, k: lease(u, active(u, generation=9), **k, encrypt_to=OTHER_KEY),
          "invalid: undecryptable content"),
    _case("unknown-field", lambda u, k: lease(u, active(u, generation=9, color="red"), **k),
          "invalid: unknown field"),
    _case("origin-mismatch", lambda u, k: lease(u, active(u, generation=9, origin="wss://push.test"), **k),
          "invalid: origin mismatch"),
    _case("transport-mismatch", lambda u, k: lease(u, active(u, generation=9, transport="fcm"), **k),
          "invalid: transport mismatch"),
    _case("not-narrowed", lambda u, k: lease(u, active(u, generation=9, subscriptions=[
        {"filter": {"kinds": [9]}, "class": "default"}]), **k), "invalid: lease filter not narrowed"),
    _case("non-exact", lambda u, k: lease(u, active(u, generation=9, subscriptions=[
        {"filter": {"kinds": [9], "authors": ["abcd"]}, "class": "default"}]), **k),
        "invalid: non-exact match value"),
    _case("p-not-self", lambda u, k: lease(u, active(u, generation=9, subscriptions=[
        {"filter": {"kinds": [9], "#p": [OTHER]}, "class": "default"}]), **k), "invalid: p-tag must be self"),
    _case("kind-not-push-eligible", lambda u, k: lease(u, active(u, generation=9, subscriptions=[
        {"filter": {"kinds": [1], "#h": [CHANNEL]}, "class": "default"}]), **k),
        "invalid: kind not push-eligible"),
    _case("class-not-supported", lambda u, k: lease(u, active(u, generation=9, app_profile=ANDROID, transport="fcm",
          subscriptions=[{"filter": {"kinds": [9], "#h": [CHANNEL]}, "class": "time_sensitive"}]), **k),
          "invalid: class not supported"),
    _case("class-not-permitted", lambda u, k: lease(u, active(u, generation=9, subscriptions=[
        {"filter": {"kinds": [7], "#h": [CHANNEL]}, "class": "urgent"}]), **k),
        "invalid: class not permitted for kind"),
    _case("endpoint-already-leased", lambda u, k: lease(u, active(u, generation=9), **k, d="lease-d-2"),
          "invalid: endpoint already leased"),
    _case("stale-replacement", lambda u, k: lease(u, active(u, generation=99), **k,
                                                  created_at=int(time.time()) - 100),
          "invalid: stale replacement"),
    _case("stale-generation", lambda u, k: lease(u, active(u, generation=5), **k,
                                                 created_at=int(time.time()) + 5),
          "invalid: stale generation"),
]

import nostr_sdk as _sdk  # noqa: E402

OTHER_KEY = _sdk.Keys.generate().public_key().to_hex()


@pytest.mark.parametrize("build, expected, who", CASES)
async def test_rejection_leaves_prior_lease(push_server, exec_key, build, expected, who):
    user = Installation()
    kid, kpub = exec_key
    k = {"exec_id": kid, "exec_pub": kpub}
    me = await authed(push_server, user)
    try:
        base = lease(user, active(user, generation=5), **k, created_at=int(time.time()) - 10)
        assert await me.publish(base) == (True, "")
        before = lease_state(push_server.data_dir, user.pubkey)
        ev = build(user, k)
        if who == "anon":
            c = await Client.connect(push_server.url)
        elif who == "other":
            c = await authed(push_server, Installation())
        else:
            c = me
        ok, msg = await c.publish(ev)
        if c is not me:
            await c.close()
        assert (ok, msg) == (False, expected)
        events, closed = await me.req("q", {"kinds": [30350], "authors": [user.pubkey]})
        assert closed is None and [e["id"] for e in events] == [base["id"]]
        assert lease_state(push_server.data_dir, user.pubkey) == before
    finally:
        await me.close()


async def test_quota_exceeded_keeps_existing(push_server, exec_key):
    user = Installation()
    kid, kpub = exec_key
    me = await authed(push_server, user)
    ids = []
    for i in range(3):
        ev = lease(user, active(user, endpoint=f"tok-{i}"), exec_id=kid, exec_pub=kpub, d=f"d{i}")
        assert await me.publish(ev) == (True, "")
        ids.append(ev["id"])
    before = lease_state(push_server.data_dir, user.pubkey)
    over = lease(user, active(user, endpoint="tok-x"), exec_id=kid, exec_pub=kpub, d="d3")
    assert await me.publish(over) == (False, "invalid: lease quota exceeded")
    assert lease_state(push_server.data_dir, user.pubkey) == before
    # Replacing an existing address is not a new address: within quota.
    repl = lease(user, active(user, endpoint="tok-0b", generation=2), exec_id=kid, exec_pub=kpub, d="d0",
                 created_at=int(time.time()) + 1)
    assert await me.publish(repl) == (True, "")
    events, _ = await me.req("q", {"kinds": [30350]})
    assert sorted(e["id"] for e in events) == sorted([repl["id"], ids[1], ids[2]])
    await me.close()


async def test_watermark_not_poisoned_and_tombstone(push_server, exec_key):
    user = Installation()
    kid, kpub = exec_key
    k = {"exec_id": kid, "exec_pub": kpub}
    me = await authed(push_server, user)
    now = int(time.time())
    assert (await me.publish(lease(user, active(user, generation=5), **k, created_at=now - 10)))[0]
    # A high-generation event with an old created_at loses on ordering and must not poison the watermark.
    assert await me.publish(lease(user, active(user, generation=1000), **k, created_at=now - 20)) == (
        False, "invalid: stale replacement")
    assert (await me.publish(lease(user, active(user, generation=6), **k, created_at=now - 5))) == (True, "")
    # Revocation: minimal inactive schema, even for an app profile that does not exist.
    tomb = lease(user, tombstone(generation=7), **k, created_at=now)
    assert await me.publish(tomb) == (True, "")
    rows, wms, _ = lease_state(push_server.data_dir, user.pubkey)
    assert len(rows) == 1
    row = rows[0]
    assert row[7] == 0 and row[10] is None and row[11] is None  # inactive, no endpoint material
    assert wms[0][3] == 7
    from tests.push.e2e_helpers import db_rows

    assert db_rows(push_server.data_dir, SQL("SELECT * FROM lease_selectors WHERE pubkey = ?",
                                             "SELECT * FROM lease_selectors WHERE pubkey = %s"), (user.pubkey,)) == []
    # Replaying the older active event cannot resurrect it.
    assert (await me.publish(lease(user, active(user, generation=7), **k, created_at=now + 1))) == (
        False, "invalid: stale generation")
    # Reactivation with a higher generation works.
    assert (await me.publish(lease(user, active(user, generation=8), **k, created_at=now + 2))) == (True, "")
    # NIP-09 deletion requests for kind 30350 are ignored.
    from appliance.nostr.event import sign_event

    dele = sign_event(user.secret, 5, [["a", f"30350:{user.pubkey}:{pad_d('lease-d-1')}"]], "")
    await me.publish(dele)
    events, _ = await me.req("q", {"kinds": [30350]})
    assert len(events) == 1 and lease_state(push_server.data_dir, user.pubkey)[0][0][7] == 1
    await me.close()


async def test_author_only_reads(push_server, exec_key):
    alice, bob = Installation(), Installation()
    kid, kpub = exec_key
    a = await authed(push_server, alice)
    b = await authed(push_server, bob)
    anon = await Client.connect(push_server.url)
    # Live subscriptions opened before the lease exists.
    await b.req("live", {})
    await b.req("live2", {"authors": [alice.pubkey]})
    await a.req("mine", {"kinds": [30350]})
    ev = lease(alice, active(alice), exec_id=kid, exec_pub=kpub)
    assert await a.publish(ev) == (True, "")
    await a.expect(lambda m: m[0] == "EVENT" and m[1] == "mine" and m[2]["id"] == ev["id"])
    for flt in ({"kinds": [30350]}, {"authors": [alice.pubkey]}, {}, {"ids": [ev["id"]]}, {"#d": [pad_d("lease-d-1")]}):
        events, _ = await b.req("x", flt)
        assert ev["id"] not in [e["id"] for e in events]
        cnt = await b.count("c", {**flt, "authors": [alice.pubkey], "kinds": [30350]})
        assert cnt[0] == "CLOSED" or cnt[2] == {"count": 0}
        events, closed = await anon.req("y", flt)
        assert ev["id"] not in [e["id"] for e in events]
    _, closed = await anon.req("z", {"kinds": [30350]})
    assert closed is not None and closed[2].startswith("auth-required:")
    await asyncio.sleep(0.3)
    assert not [m for m in b.backlog if m[0] == "EVENT" and m[2]["id"] == ev["id"]]
    assert not [m for m in anon.backlog if m[0] == "EVENT" and m[2]["id"] == ev["id"]]
    assert (await a.count("c", {"kinds": [30350]}))[2] == {"count": 1}
    for c in (a, b, anon):
        await c.close()


async def test_race_one_endpoint_one_winner(push_server, exec_key):
    user = Installation()
    kid, kpub = exec_key
    for round_ in range(5):
        c1, c2 = await authed(push_server, user), await authed(push_server, user)
        ep = f"race-{round_}"
        e1 = lease(user, active(user, endpoint=ep), exec_id=kid, exec_pub=kpub, d=f"r{round_}a")
        e2 = lease(user, active(user, endpoint=ep), exec_id=kid, exec_pub=kpub, d=f"r{round_}b")
        r1, r2 = await asyncio.gather(c1.publish(e1), c2.publish(e2))
        assert sorted([r1[0], r2[0]]) == [False, True], (r1, r2)
        loser = r1 if not r1[0] else r2
        assert loser[1] in ("invalid: endpoint already leased", "invalid: lease quota exceeded")
        # Tombstone the winner so the quota stays available for the next round.
        won, d = (e1, f"r{round_}a") if r1[0] else (e2, f"r{round_}b")
        assert (await c1.publish(lease(user, tombstone(generation=2), exec_id=kid, exec_pub=kpub, d=d,
                                       created_at=won["created_at"] + 1)))[0]
        await c1.close()
        await c2.close()


async def test_nip11_descriptor(push_server):
    doc = push_server.nip11()
    assert "nip-pl" in doc["supported_extensions"]
    assert "nip-pl" not in doc["supported_nips"] and all(isinstance(n, int) for n in doc["supported_nips"])
    push = doc["push"]
    assert list(push) == ["origin", "keys", "app_profiles", "push_kinds", "urgent_kinds", "h_grammar",
                          "class_support", "limitation"]
    assert push["origin"] == ORIGIN
    assert [k.get("current") for k in push["keys"]] == [True]
    assert push["limitation"]["max_leases_per_pubkey"] == 3
    assert push["limitation"]["max_plaintext_len"] == 32768
    assert "allowed_skew" not in push["limitation"]


def test_invalid_descriptor_refuses_to_start(tmp_path):
    bad = push_config(extra="").replace("urgent_kinds = [9]", "urgent_kinds = [46010]")
    server = Server(tmp_path / "data", config=bad)
    with pytest.raises(RuntimeError) as exc:
        server.start()
    server.stop()
    assert "urgent-subset" in str(exc.value) and ORIGIN in str(exc.value)


@pytest.mark.parametrize("limitation, expect", [
    ({"max_lease_ttl": 9223372036854775000}, "limits-range"),
    ({"max_content_len": 120000}, "more than the relay accepts (max_content_length = 65536)"),
])
def test_limits_the_appliance_cannot_honour_refuse_to_start(tmp_path, limitation, expect):
    server = Server(tmp_path / "data", config=push_config(limitation=limitation))
    with pytest.raises(RuntimeError) as exc:
        server.start()
    server.stop()
    assert expect in str(exc.value)


@pytest.mark.parametrize("bad_push, expect", [
    ("urgent_kinds = [46010]\n", "urgent-subset"),
    ("[origins.push.limitation]\nmax_content_len = 120000\n", "more than the relay accepts"),
])
def test_cli_refuses_an_origin_whose_descriptor_is_invalid(tmp_path, bad_push, expect):
    """A command run with a config declaring a bad [[origins]] push table saves nothing (it used to
    save the origin, which then broke every reload and the next start)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    cfg = tmp_path / "bad.toml"
    cfg.write_text(push_config() + '[[origins]]\norigin = "wss://b.example"\n[origins.push]\n'
                   'app_profiles = [{ id = "a", transport = "apns" }]\n' + bad_push)
    data = tmp_path / "data"
    from tests.pg import process_env

    out = subprocess.run([sys.executable, "-m", "appliance", "keys", "rotate", ORIGIN, "--data-dir", str(data),
                          "--config", str(cfg)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env=process_env(data_dir=data))
    assert out.returncode == 2 and expect in out.stderr, out.stderr
    listed = subprocess.run([sys.executable, "-m", "appliance", "origins", "list", "--data-dir", str(data)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60, env=process_env(data_dir=data))
    assert "b.example" not in listed.stdout


@pytest.mark.parametrize("workers", ["0", "2"])
async def test_lease_workers_setting(make_server, workers):
    """Leases are checked the same on the event loop (0) and in worker processes (2)."""
    server = make_server("--lease-workers", workers, config=push_config(limitation=LIMITS))
    exec_id, exec_pub = current_key(server.nip11())
    k = {"exec_pub": exec_pub, "exec_id": exec_id}
    user = Installation()
    c = await authed(server, user)
    good = lease(user, active(user, generation=1), **k)
    assert await c.publish(good) == (True, "")
    ok, msg = await c.publish(lease(user, active(user, generation=2, color="red"), **k))
    assert (ok, msg) == (False, "invalid: unknown field")
    ok, msg = await c.publish(lease(user, active(user, generation=3), **{**k, "exec_id": "nope"}))
    assert (ok, msg) == (False, "invalid: unknown executor key")
    events, _ = await c.req("mine", {"kinds": [30350], "authors": [user.pubkey]})
    assert [e["id"] for e in events] == [good["id"]]
    await c.close()


def _worker_pids(parent: int) -> list[int]:
    """Worker processes of the appliance `parent` (multiprocessing spawn children): its lease
    workers and its signature worker."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if ppid == parent and b"spawn_main" in cmdline:
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker process through /proc (Linux)")
async def test_dead_lease_worker_is_replaced(make_server):
    """A worker killed from outside (OOM killer, a signal): later leases are still answered and
    accepted on a new worker, and the appliance still stops on SIGTERM."""
    server = make_server("--lease-workers", "1", config=push_config(limitation=LIMITS))
    exec_id, exec_pub = current_key(server.nip11())
    k = {"exec_pub": exec_pub, "exec_id": exec_id}
    user = Installation()
    c = await authed(server, user)
    # The relay's signature worker (appliance.relay.sigcheck) is a spawn child too, once an EVENT
    # has been checked: not a lease worker.
    others = set(_worker_pids(server.proc.pid))
    assert await c.publish(lease(user, active(user, generation=1), **k, d="w-1")) == (True, "")
    (worker,) = set(_worker_pids(server.proc.pid)) - others
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker in _worker_pids(server.proc.pid):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    after = lease(user, active(user, generation=1, endpoint="after-kill"), **k, d="w-2")
    assert await c.publish(after) == (True, "")
    assert set(_worker_pids(server.proc.pid)) - others - {worker}
    events, _ = await c.req("mine", {"kinds": [30350], "authors": [user.pubkey]})
    assert after["id"] in [e["id"] for e in events]
    await c.close()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=15) is not None


async def test_deletion_requests_never_touch_leases(push_server, exec_key):
    """NIP-PL, Lifecycle: deletion requests targeting kind 30350 are ignored, whatever they name
    and however they name it; so they can neither block a revocation nor change a reason."""
    from appliance.nostr.event import sign_event

    user = Installation()
    kid, kpub = exec_key
    k = {"exec_id": kid, "exec_pub": kpub}
    me = await authed(push_server, user)
    now = int(time.time())
    d = pad_d("del-test")
    first = lease(user, active(user, generation=1, endpoint="del-ep"), **k, d=d, created_at=now - 50)
    assert await me.publish(first) == (True, "")
    second = lease(user, active(user, generation=2, endpoint="del-ep"), **k, d=d, created_at=now - 40)
    assert await me.publish(second) == (True, "")
    coordinate = f"30350:{user.pubkey}:{d}"
    for tags in ([["e", coordinate]], [["a", coordinate]], [["e", first["id"]]], [["e", second["id"]]],
                 [["a", "0" + coordinate]]):
        ok, msg = await me.publish(sign_event(user.secret, 5, tags, "", now - 30))
        assert ok, msg
    # The replaced lease replays into step 8, not into a deletion record.
    assert await me.publish(first) == (False, "invalid: stale replacement")
    # Revocation is never blocked.
    tomb = lease(user, tombstone(generation=3), **k, d=d, created_at=now - 20)
    assert await me.publish(tomb) == (True, "")
    rows, marks, raws = lease_state(push_server.data_dir, user.pubkey)
    assert [(r[3], r[7]) for r in rows] == [(tomb["id"], 0)] and marks[0][3] == 3
    await me.close()


async def test_identical_resend_is_a_stale_replacement(push_server, exec_key):
    """NIP-PL step 8: the event must win over the stored one, and an identical id never does."""
    user = Installation()
    kid, kpub = exec_key
    me = await authed(push_server, user)
    ev = lease(user, active(user), exec_id=kid, exec_pub=kpub, d="resend")
    assert await me.publish(ev) == (True, "")
    before = lease_state(push_server.data_dir, user.pubkey)
    assert await me.publish(ev) == (False, "invalid: stale replacement")
    assert lease_state(push_server.data_dir, user.pubkey) == before
    await me.close()


async def test_lease_rules_decide_before_relay_limits(push_server, exec_key):
    """NIP-PL acceptance steps are evaluated in order and the first failure decides, before the
    relay's own limits (created_at bounds, content length) have their say."""
    user = Installation()
    kid, kpub = exec_key
    k = {"exec_id": kid, "exec_pub": kpub}
    anon = await Client.connect(push_server.url)
    future = lease(user, active(user), **k, d="order-1", created_at=int(time.time()) + 100_000)
    assert await anon.publish(future) == (False, "auth-required: push lease requires authentication")
    ancient = lease(user, active(user), **k, d="order-2", created_at=int(time.time()) - 4 * 365 * 86400)
    assert await anon.publish(ancient) == (False, "auth-required: push lease requires authentication")
    await anon.close()
    me = await authed(push_server, user)
    huge = lease(user, active(user), **k, d="order-3", content="A" * 70_000)
    assert await me.publish(huge) == (False, "invalid: content too long")
    # Past the lease rules, the relay's own bounds still hold.
    assert await me.publish(future) == (False, "invalid: created_at is too far in the future")
    await me.close()
