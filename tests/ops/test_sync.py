"""`appliance sync URL`: NIP-77 negentropy against another relay, then the missing events each way,
run as the operator would (a real process on the real data directory, the server running)."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import Identity
from tests.ops.helpers import cli
from tests.strfry import strfry  # noqa: F401 (fixture)

pytestmark = pytest.mark.anyio


def _summary(out) -> str:
    lines = [line for line in out.stdout.splitlines() if line.startswith("sync: ")]
    assert lines, (out.stdout, out.stderr)
    return lines[-1]


def _events(author: Identity, n: int, tag: str, start: int) -> list:
    return [author.sign(1, [["t", tag]], f"{tag} {i}", start + i) for i in range(n)]


async def test_sync_with_strfry_both_directions(make_server, connect, strfry, tmp_path):  # noqa: F811
    author = Identity()
    now = int(time.time())
    common = _events(author, 120, "common", now - 3000)
    theirs = _events(author, 30, "theirs", now - 2000)
    ours = _events(author, 25, "ours", now - 1000)
    strfry.import_events([e.to_json() for e in common + theirs])
    strfry.start()
    server = make_server()
    c = await connect(server.url)
    for ev in common + ours:
        assert (await c.publish(ev))[0]

    out = cli("sync", strfry.url, "--data-dir", server.data_dir, "--dir", "both", timeout=120)
    assert out.returncode == 0, out.stderr
    assert _summary(out) == "sync: have 25, need 30, fetched 30, sent 25"
    assert "fetching" in out.stderr and "sending" in out.stderr  # the progress bar
    everything = {e.id for e in common + theirs + ours}
    got, _ = await c.req("all", {"authors": [author.pubkey], "limit": 1000})
    assert {e["id"] for e in got} == everything
    assert {json.loads(line)["id"] for line in strfry.export()} == everything

    again = cli("sync", strfry.url, "--data-dir", server.data_dir, timeout=120)
    assert again.returncode == 0, again.stderr
    assert _summary(again) == "sync: have 0, need 0, fetched 0, sent 0"


async def test_sync_directions_and_filter(make_server, connect, strfry):  # noqa: F811
    author = Identity()
    now = int(time.time())
    theirs_1 = _events(author, 10, "a", now - 500)
    theirs_7 = [author.sign(7, [], "+", now - 400 + i) for i in range(4)]
    ours = _events(author, 6, "b", now - 300)
    strfry.import_events([e.to_json() for e in theirs_1 + theirs_7])
    strfry.start()
    server = make_server()
    c = await connect(server.url)
    for ev in ours:
        assert (await c.publish(ev))[0]

    # none: only counted
    out = cli("sync", strfry.url, "--data-dir", server.data_dir, "--dir", "none")
    assert _summary(out) == "sync: have 6, need 14, fetched 0, sent 0"
    # down, kind 7 only: only those fetched, nothing sent
    out = cli("sync", strfry.url, "--data-dir", server.data_dir, "--dir", "down", "--filter", '{"kinds": [7]}')
    assert out.returncode == 0, out.stderr
    assert _summary(out) == "sync: have 0, need 4, fetched 4, sent 0"
    got, _ = await c.req("k7", {"kinds": [7]})
    assert {e["id"] for e in got} == {e.id for e in theirs_7}
    # up: ours sent, theirs not fetched
    out = cli("sync", strfry.url, "--data-dir", server.data_dir, "--dir", "up")
    assert _summary(out) == "sync: have 6, need 10, fetched 0, sent 6"
    got, _ = await c.req("k1", {"kinds": [1]})
    assert {e["id"] for e in got} == {e.id for e in ours}
    assert {json.loads(line)["id"] for line in strfry.export()} == {e.id for e in theirs_1 + theirs_7 + ours}


async def test_sync_stores_fetched_events_as_published_ones(make_server, connect, strfry):  # noqa: F811
    """What the other relay has is stored only if a published EVENT would be: the origin's write
    policy (a blocked author), NIP-09 deletions, the replaceable rule; and what only authenticated
    readers may read here is never sent."""
    good, blocked, dm_author = Identity(), Identity(), Identity()
    now = int(time.time())
    fine = good.sign(1, [], "fine", now - 100)
    spam = blocked.sign(1, [], "spam", now - 99)
    old_profile = good.sign(0, [], '{"name":"old"}', now - 200)
    deleted_later = good.sign(1, [], "to be deleted", now - 150)
    strfry.import_events([e.to_json() for e in (fine, spam, old_profile, deleted_later)])
    strfry.start()
    server = make_server()
    c = await connect(server.url)
    new_profile = good.sign(0, [], '{"name":"new"}', now - 10)
    assert (await c.publish(new_profile))[0]
    assert (await c.publish(good.sign(5, [["e", deleted_later.id]], "", now - 5)))[0]
    dm = dm_author.sign(4, [["p", good.pubkey]], "secret?iv=x", now - 50)
    assert (await c.publish(dm))[0]
    blocking = cli("origins", "block", server.url, blocked.pubkey, "--data-dir", server.data_dir)
    assert blocking.returncode == 0, blocking.stderr

    out = cli("sync", strfry.url, "--data-dir", server.data_dir, "--dir", "both")
    assert out.returncode == 0, out.stderr
    # Here only: the new kind 0 and the deletion (the DM is not for anyone to read: not compared).
    # Fetched: only `fine` (the blocked author, the older profile and the deleted event refused).
    assert _summary(out) == "sync: have 2, need 4, fetched 1, sent 2"
    assert "3 fetched events not stored" in out.stderr
    got, _ = await c.req("all", {"authors": [good.pubkey, blocked.pubkey]})
    ids = {e["id"] for e in got}
    assert fine.id in ids
    assert old_profile.id not in ids and new_profile.id in ids  # the newer profile stays
    assert deleted_later.id not in ids  # deleted by its author here
    exported = {json.loads(line)["id"] for line in strfry.export()}
    assert dm.id not in exported


def test_sync_bad_input_one_line_and_nothing_changed(tmp_path):
    data = tmp_path / "data"
    cases = [
        (["http://relay.example"], "url"),
        (["ws://127.0.0.1:9", "--filter", "[{}]"], "one filter object"),
        (["ws://127.0.0.1:9", "--filter", "{nope"], "not JSON"),
        (["ws://127.0.0.1:9", "--filter", '{"kinds": ["x"]}'], "kinds"),
    ]
    for args, words in cases:
        out = cli("sync", *args, "--data-dir", data)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
        assert "sync: have" not in out.stdout


def test_sync_unreachable_relay(tmp_path):
    from tests.conftest import free_port

    out = cli("sync", f"ws://127.0.0.1:{free_port()}", "--data-dir", tmp_path / "data")
    assert out.returncode == 1
    assert "appliance sync: cannot connect to" in out.stderr


async def test_sync_between_two_appliances(make_server, connect):
    author = Identity()
    now = int(time.time())
    common = _events(author, 80, "common", now - 3000)
    only_a = _events(author, 12, "a", now - 2000)
    only_b = _events(author, 9, "b", now - 1000)
    a, b = make_server(), make_server()
    ca, cb = await connect(a.url), await connect(b.url)
    for ev in common + only_a:
        assert (await ca.publish(ev))[0]
    for ev in common + only_b:
        assert (await cb.publish(ev))[0]
    out = cli("sync", b.url, "--data-dir", a.data_dir)
    assert out.returncode == 0, out.stderr
    assert _summary(out) == "sync: have 12, need 9, fetched 9, sent 12"
    everything = {e.id for e in common + only_a + only_b}
    for c in (ca, cb):
        got, _ = await c.req("all", {"authors": [author.pubkey]})
        assert {e["id"] for e in got} == everything
