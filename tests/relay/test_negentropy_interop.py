"""NIP-77 with real peers against the real server: strfry's `sync` (a strfry binary given by
STRFRY_BIN; skipped with the reason otherwise), rust-nostr's (nostr_sdk's `sync`) and nostr-tools'
(`NegentropySync`, npm, in tests/relay/interop)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import Identity
from tests.strfry import strfry  # noqa: F401 (fixture)

pytestmark = pytest.mark.anyio


def _sets(author: Identity, n_shared: int, n_here: int, n_there: int):
    now = int(time.time())
    shared = [author.sign(1, [["t", "s"]], f"shared {i}", now - 4000 + i) for i in range(n_shared)]
    here = [author.sign(1, [["t", "h"]], f"here {i}", now - 2000 + i) for i in range(n_here)]
    there = [author.sign(1, [["t", "t"]], f"there {i}", now - 1000 + i) for i in range(n_there)]
    return shared, here, there


async def _publish_all(c, events) -> None:
    for ev in events:
        ok, msg = await c.publish(ev)
        assert ok, msg


@pytest.mark.parametrize("direction", ["both", "down", "up"])
async def test_strfry_sync_against_the_appliance(make_server, connect, strfry, direction):  # noqa: F811
    author = Identity()
    shared, here, there = _sets(author, 300, 40, 35)
    strfry.import_events([e.to_json() for e in shared + there])
    server = make_server()
    c = await connect(server.url)
    await _publish_all(c, shared + here)

    out = strfry.sync(server.url, f"--dir={direction}")
    assert out.returncode == 0, out.stderr[-3000:]
    found = re.search(r"Set reconcile complete\. Have (\d+) need (\d+)", out.stderr)
    assert found and (int(found[1]), int(found[2])) == (len(there), len(here)), out.stderr[-3000:]

    in_strfry = {json.loads(line)["id"] for line in strfry.export()}
    got, _ = await c.req("all", {"authors": [author.pubkey], "limit": 5000})
    in_appliance = {e["id"] for e in got}
    expect_strfry = {e.id for e in shared + there + (here if direction in ("both", "down") else [])}
    expect_appliance = {e.id for e in shared + here + (there if direction in ("both", "up") else [])}
    assert in_strfry == expect_strfry
    assert in_appliance == expect_appliance


async def test_strfry_sync_with_a_filter_and_frame_limits(make_server, connect, strfry):  # noqa: F811
    """Many differences on both sides: several rounds of strfry's 60 kB frames (and ours)."""
    author = Identity()
    shared, here, there = _sets(author, 200, 900, 800)
    other_kind = author.sign(7, [], "+")
    strfry.import_events([e.to_json() for e in shared + there])
    server = make_server("--event-rate", "0")
    c = await connect(server.url)
    await _publish_all(c, shared + here + [other_kind])
    out = strfry.sync(server.url, "--dir=none", "--filter", json.dumps({"kinds": [1]}), "--frame-size-limit=4096")
    assert out.returncode == 0, out.stderr[-3000:]
    found = re.search(r"Set reconcile complete\. Have (\d+) need (\d+)", out.stderr)
    assert found and (int(found[1]), int(found[2])) == (len(there), len(here))


@pytest.mark.slow
async def test_nostr_sdk_sync_against_the_appliance(make_server, connect, tmp_path):
    ns = pytest.importorskip("nostr_sdk", reason="nostr_sdk (rust-nostr bindings) is not installed")
    keys = ns.Keys.generate()
    server = make_server()
    now = int(time.time())

    async def signed(content: str, at: int):
        builder = ns.EventBuilder(ns.Kind(1), content).custom_created_at(ns.Timestamp.from_secs(at))
        return await builder.finalize_async(keys)

    shared = [await signed(f"shared {i}", now - 900 + i) for i in range(50)]
    here = [await signed(f"here {i}", now - 600 + i) for i in range(12)]
    there = [await signed(f"there {i}", now - 300 + i) for i in range(9)]
    c = await connect(server.url)
    for ev in shared + here:
        ok, msg = await c.publish(json.loads(ev.as_json()))
        assert ok, msg

    # The client's own store (its default database only tracks ids): LMDB in a temporary directory,
    # which rust-nostr calls back through the bindings: they must know the asyncio loop.
    ns.uniffi_set_event_loop(asyncio.get_running_loop())
    lmdb = await ns.NostrLmdb.open(str(tmp_path / "nostr-sdk-db"))
    client = ns.ClientBuilder().database(lmdb).build()
    try:
        db = client.database()
        for ev in shared + there:
            await db.save_event(ev)
        await client.add_relay(ns.RelayUrl.parse(server.url))
        await client.connect()
        opts = ns.SyncOptions().direction(ns.SyncDirection.BOTH).initial_timeout(timedelta(seconds=20))
        flt = ns.Filter().author(keys.public_key()).kind(ns.Kind(1))
        output = await asyncio.wait_for(client.sync(flt, opts=opts), 60)
        assert not output.failed, output.failed
        report = output.report
        assert {e.to_hex() for e in report.received} == {e.id().to_hex() for e in here}
        assert {e.to_hex() for e in report.sent} == {e.id().to_hex() for e in there}
        assert not any(report.send_failures.values()), report.send_failures
        # Its store holds everything now too.
        assert await db.count(ns.Filter().author(keys.public_key())) == len(shared + here + there)
    finally:
        await client.shutdown()
        ns.uniffi_set_event_loop(None)
    got, _ = await c.req("all", {"authors": [keys.public_key().to_hex()], "limit": 500})
    assert {e["id"] for e in got} == {e.id().to_hex() for e in shared + here + there}


NOSTR_TOOLS = Path(__file__).with_name("interop")


@pytest.mark.slow
async def test_nostr_tools_negentropy_sync_against_the_appliance(make_server, connect):
    """nostr-tools' NegentropySync (its own port of the reference JavaScript) as the client."""
    if shutil.which("node") is None or not (NOSTR_TOOLS / "node_modules" / "nostr-tools").is_dir():
        pytest.skip("nostr-tools is not installed (make test runs npm ci --prefix tests/relay/interop)")
    author = Identity()
    shared, here, there = _sets(author, 400, 23, 31)
    server = make_server()
    c = await connect(server.url)
    await _publish_all(c, shared + here)
    request = {"url": server.url, "filter": {"authors": [author.pubkey]},
               "items": [[e.created_at, e.id] for e in shared + there]}
    proc = await asyncio.create_subprocess_exec(
        "node", str(NOSTR_TOOLS / "negentropy_sync.mjs"), cwd=NOSTR_TOOLS, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(request).encode()), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["error"] is None
    assert set(result["have"]) == {e.id for e in there}
    assert set(result["need"]) == {e.id for e in here}
