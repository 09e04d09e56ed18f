"""Executor key rotation while serving, key material at rest, and crash/restart consistency."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from appliance.store.statement import SQL
from tests.conftest import ROOT, Client
from tests.pg import on_postgres, process_env
from tests.push.e2e_helpers import (
    ORIGIN,
    Installation,
    active,
    current_key,
    db_rows,
    lease,
    push_config,
    tombstone,
)

pytestmark = pytest.mark.anyio


def cli(server, *args: str) -> str:
    cfg = server.data_dir.parent / f"config-{server.port}.toml"
    out = subprocess.run(
        [sys.executable, "-m", "appliance", *args, "--data-dir", str(server.data_dir), "--config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=process_env(data_dir=server.data_dir),
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


async def authed(server, user) -> Client:
    c = await Client.connect(server.url)
    ok, msg = await c.auth(user.secret, ORIGIN)
    assert ok, msg
    return c


async def wait_for(predicate, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached")


@pytest.mark.slow
async def test_rotation_while_serving(make_server):
    # The retiring key's window (max_lease_ttl + allowed_skew, 6 + 1 s, from the rotation's whole
    # second) holds the reload and two publishes: with 3 + 1 s, a busy machine could pass it first.
    server = make_server("--purge-interval", "1",
                         config=push_config(limitation={"max_lease_ttl": 6}, allowed_skew=1))
    old_id, old_pub = current_key(server.nip11())
    ((old_wrapped,),) = db_rows(server.data_dir, SQL("SELECT wrapped FROM executor_keys WHERE key_id = ?",
                                                     "SELECT wrapped FROM executor_keys WHERE key_id = %s"), (old_id,))
    user = Installation()
    c = await authed(server, user)
    assert await c.publish(lease(user, active(user), exec_id=old_id, exec_pub=old_pub, d="before", ttl=3)) == (True, "")
    rotated = json.loads(cli(server, "keys", "rotate", ORIGIN))
    assert rotated["state"] == "current" and rotated["id"] != old_id
    t_rot = time.time()
    doc = await wait_for(lambda: (d := server.nip11()) and len(d["push"]["keys"]) == 2 and d)
    keys = {k["id"]: k for k in doc["push"]["keys"]}
    assert keys[old_id].get("retiring") and keys[rotated["id"]].get("current")
    # Inside the window: the retiring key still decrypts new leases and replacements.
    assert await c.publish(lease(user, active(user, endpoint="e2"), exec_id=old_id, exec_pub=old_pub, d="during",
                                 ttl=3)) == (True, "")
    assert await c.publish(lease(user, active(user, endpoint="e3"), exec_id=rotated["id"],
                                 exec_pub=rotated["pubkey"], d="new", ttl=3)) == (True, "")
    # After became_retiring_at + max_lease_ttl + allowed_skew (6 + 1 s): rejected.
    await asyncio.sleep(max(0.0, t_rot + 7.2 - time.time()))
    ok, msg = await c.publish(lease(user, active(user, endpoint="e4"), exec_id=old_id, exec_pub=old_pub, d="after",
                                    ttl=3))
    assert (ok, msg) == (False, "invalid: unknown executor key")
    assert [k["id"] for k in server.nip11()["push"]["keys"]] == [rotated["id"]]
    assert (await c.publish(lease(user, active(user, endpoint="e5"), exec_id=rotated["id"],
                                  exec_pub=rotated["pubkey"], d="after2", ttl=3)))[0]
    # Once no unexpired lease names it, the purge loop erases the old private key.
    def erased():
        rows = [json.loads(line) for line in cli(server, "keys", "list", ORIGIN, "--json").splitlines()]
        old = next(r for r in rows if r["id"] == old_id)
        return old["state"] == "expired" and not old["private_key_held"]

    await wait_for(erased, timeout=10)

    # Erased means gone from the files too: the row is zeroed in place and the WAL scrubbed (on
    # PostgreSQL, whose files are the database server's: no row holds the wrapped key any more).
    def nowhere_on_disk():
        if on_postgres():
            return not any(w is not None and bytes(w) == bytes(old_wrapped)
                           for (w,) in db_rows(server.data_dir, "SELECT wrapped FROM executor_keys"))
        files = [server.data_dir / n for n in ("appliance.sqlite3", "appliance.sqlite3-wal")]
        return not any(f.exists() and old_wrapped in f.read_bytes() for f in files)

    await wait_for(nowhere_on_disk, timeout=10)
    await c.close()


async def test_keys_at_rest_are_wrapped(make_server):
    server = make_server(config=push_config())
    kid, pub = current_key(server.nip11())
    (wrapped,) = db_rows(server.data_dir, SQL("SELECT wrapped FROM executor_keys WHERE key_id = ?",
                                              "SELECT wrapped FROM executor_keys WHERE key_id = %s"), (kid,))[0]
    assert isinstance(wrapped, bytes) and len(wrapped) == 1 + 12 + 32 + 16
    assert (server.data_dir / "appliance.key").stat().st_mode & 0o777 == 0o600


@pytest.mark.slow
async def test_kill9_restart_state_matches_req(make_server):
    cfg = push_config()
    server = make_server(config=cfg)
    kid, pub = current_key(server.nip11())
    users = [Installation() for _ in range(3)]
    now = int(time.time())
    for i, u in enumerate(users):
        c = await authed(server, u)
        k = {"exec_id": kid, "exec_pub": pub}
        assert (await c.publish(lease(u, active(u, generation=1), **k, d="a", created_at=now - 5)))[0]
        assert (await c.publish(lease(u, active(u, generation=2, endpoint="x2"), **k, d="a", created_at=now - 4)))[0]
        assert (await c.publish(lease(u, active(u, generation=1, endpoint="y"), **k, d="b", created_at=now - 4)))[0]
        if i == 0:
            assert (await c.publish(lease(u, tombstone(generation=3), **k, d="b", created_at=now - 3)))[0]
        await c.close()
    data_dir = server.data_dir
    server.kill()
    server = make_server(config=cfg, data_dir=data_dir)
    assert current_key(server.nip11()) == (kid, pub)
    for i, u in enumerate(users):
        c = await authed(server, u)
        events, _ = await c.req("q", {"kinds": [30350]})
        rows = db_rows(data_dir, SQL("SELECT event_id, active, endpoint FROM leases WHERE pubkey = ?",
                                     "SELECT event_id, active, endpoint FROM leases WHERE pubkey = %s"), (u.pubkey,))
        assert sorted(e["id"] for e in events) == sorted(r[0] for r in rows)
        assert len(rows) == 2
        for eid, act, endpoint in rows:
            assert (endpoint is None) == (act == 0)
        sel = db_rows(data_dir, SQL("SELECT DISTINCT d FROM lease_selectors WHERE pubkey = ?",
                                    "SELECT DISTINCT d FROM lease_selectors WHERE pubkey = %s"), (u.pubkey,))
        active_ds = db_rows(data_dir, SQL("SELECT d FROM leases WHERE pubkey = ? AND active = 1",
                                          "SELECT d FROM leases WHERE pubkey = %s AND active = 1"), (u.pubkey,))
        assert sorted(sel) == sorted(active_ds)
        # The watermark survived: replaying generation 2 at address a fails.
        ok, msg = await c.publish(lease(u, active(u, generation=2, endpoint="x3"), exec_id=kid, exec_pub=pub, d="a"))
        assert (ok, msg) == (False, "invalid: stale generation")
        await c.close()


async def test_push_per_origin_and_disabled_origin(make_server, connect):
    from tests.push.e2e_helpers import IOS

    cfg = f"""
public_url = "ws://plain.test"
[[origins]]
origin = "ws://push.test"
hosts = ["push.test"]
push = {{ app_profiles = [{{ id = "{IOS}", transport = "apns" }}], push_kinds = [9] }}
"""
    server = make_server(config=cfg)
    plain = server.nip11("plain.test")
    assert "push" not in plain and "nip-pl" not in plain.get("supported_extensions", [])
    doc = server.nip11("push.test")
    assert doc["push"]["origin"] == ORIGIN and doc["push"]["push_kinds"] == [9]
    kid, pub = current_key(doc)
    user = Installation()
    # A lease at the push origin is accepted; the same lease at the plain origin is refused.
    ev = lease(user, active(user, subscriptions=[{"filter": {"kinds": [9], "#p": [user.pubkey]},
                                                  "class": "default"}]), exec_id=kid, exec_pub=pub)
    c = await connect(server.url, host="push.test")
    assert (await c.auth(user.secret, ORIGIN))[0]
    assert await c.publish(ev) == (True, "")
    p = await connect(server.url, host="plain.test")
    assert (await p.auth(user.secret, "ws://plain.test"))[0]
    assert await p.publish(ev) == (False, "invalid: unknown executor key")


@pytest.mark.slow
async def test_watermark_kept_for_retention_then_collected(make_server):
    """The watermark outlives the lease by the spec's formula, is then garbage-collected, and a
    replay after that fails the expiration lower bound."""
    server = make_server("--purge-interval", "1",
                         config=push_config(limitation={"max_lease_ttl": 3}, allowed_skew=1))
    kid, pub = current_key(server.nip11())
    k = {"exec_id": kid, "exec_pub": pub}
    user = Installation()
    c = await authed(server, user)
    now = int(time.time())
    first = lease(user, active(user, generation=1), **k, d="wm", ttl=2, created_at=now - 1)
    assert await c.publish(first) == (True, "")
    t_tomb = int(time.time())
    assert await c.publish(lease(user, tombstone(generation=2), **k, d="wm", ttl=2, created_at=now)) == (True, "")
    t_acked = int(time.time())
    rows = db_rows(server.data_dir, SQL("SELECT generation, last_active_expiration, tombstone_accepted_at, "
                                        "retain_until FROM lease_watermarks WHERE pubkey = ?",
                                        "SELECT generation, last_active_expiration, tombstone_accepted_at, "
                                        "retain_until FROM lease_watermarks WHERE pubkey = %s"), (user.pubkey,))
    assert len(rows) == 1
    gen, last_active, tomb_at, retain = rows[0]
    first_exp = int(next(t[1] for t in first["tags"] if t[0] == "expiration"))
    assert (gen, last_active) == (2, first_exp) and t_tomb <= tomb_at <= t_acked
    # max(last_active_expiration, tombstone_accepted_at + max_lease_ttl) + allowed_skew
    assert retain == max(last_active, tomb_at + 3) + 1
    # Still held before retain_until: the old generation cannot come back.
    assert await c.publish(lease(user, active(user, generation=2, endpoint="again"), **k, d="wm", ttl=2,
                                 created_at=now + 1)) == (False, "invalid: stale generation")
    await wait_for(lambda: not db_rows(server.data_dir, SQL("SELECT 1 FROM lease_watermarks WHERE pubkey = ?",
                                                            "SELECT 1 FROM lease_watermarks WHERE pubkey = %s"),
                                       (user.pubkey,)), timeout=15)
    assert time.time() >= retain
    assert db_rows(server.data_dir, SQL("SELECT 1 FROM leases WHERE pubkey = ?",
                                        "SELECT 1 FROM leases WHERE pubkey = %s"), (user.pubkey,)) == []
    # With the watermark gone, a replay of the first lease is refused by its own expiration.
    assert await c.publish(first) == (False, "invalid: lease already expired")
    await c.close()
