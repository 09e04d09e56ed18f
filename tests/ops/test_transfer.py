"""`appliance export`, `import` and `delete` beside a running server: JSON lines out and in under the
rules of a publish, deletion by filter, and one clear line for every bad input."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import orjson
import pytest

from appliance.nostr.event import sign_event
from tests.conftest import Identity
from tests.pg import process_env

from .helpers import ROOT


def run(*args, stdin: bytes = b"", timeout: float = 120) -> subprocess.CompletedProcess:
    """An `appliance` command as a user runs it, bytes in and out."""
    args = [str(a) for a in args]
    return subprocess.run([sys.executable, "-m", "appliance", *args], input=stdin, capture_output=True,
                          env=process_env(args), cwd=ROOT, timeout=timeout)


def lines(*events) -> bytes:
    return b"".join((e if isinstance(e, bytes) else e.to_json_bytes()) + b"\n" for e in events)


def exported(data_dir, *args) -> list[bytes]:
    out = run("export", "--data-dir", data_dir, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


async def test_import_beside_a_running_server_applies_the_rules_of_a_publish(make_server, connect):
    server = make_server()
    alice, bob = Identity(), Identity()
    client = await connect(server.url)
    live = await connect(server.url)
    await live.send(["REQ", "live", {"authors": [bob.pubkey]}])
    await live.expect(lambda m: m[0] == "EOSE")
    published = alice.sign(1, content="published over the websocket")
    assert (await client.publish(published))[0]

    now = int(time.time())
    old = alice.sign(1, [["t", "history"]], "an old note", created_at=now - 5 * 365 * 86400)
    profile_old = alice.sign(0, content='{"name":"old"}', created_at=now - 100)
    profile_new = alice.sign(0, content='{"name":"new"}', created_at=now - 50)
    doomed = alice.sign(1, content="deleted by the next line", created_at=now - 40)
    deletion = alice.sign(5, [["e", doomed.id]], "", created_at=now - 30)
    expired = alice.sign(1, [["expiration", str(now - 10)]], "gone already", created_at=now - 20)
    expiring = alice.sign(1, [["expiration", str(now + 3600)]], "here for an hour", created_at=now - 20)
    tampered = orjson.loads(alice.sign(1, content="honest").to_json())
    tampered["content"] = "tampered"
    bad_sig = orjson.loads(alice.sign(1, content="forged").to_json())
    bad_sig["sig"] = "00" * 64
    ephemeral = alice.sign(20001, content="never stored")
    group = alice.sign(9, [["h", "8d7b9a4e-4b1c-4c0e-9a43-2f0b6e2c1d5a"]], "a group message")
    lease = alice.sign(30350, [["d", "x"]], "")
    by_bob = bob.sign(1, content="bob's note")
    stdin = lines(old, profile_new, profile_old, doomed, deletion, published, expired, expiring,
                  orjson.dumps(tampered), orjson.dumps(bad_sig), b"{not json", b"", ephemeral, group, lease,
                  old, by_bob, b'{"kind": 1}')

    out = run("import", "--data-dir", server.data_dir, stdin=stdin)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().splitlines()[-1] == "import: read 18, stored 6, duplicate 2, rejected 10"
    errors = out.stderr.decode()
    for n, reason in ((3, "duplicate: a newer version of this event is already stored"),
                      (7, "invalid: event has expired"),
                      (9, "invalid: event id does not match its content"), (10, "invalid: bad signature"),
                      (11, "invalid: not a JSON object"), (12, "invalid: not a JSON object"),
                      (13, "invalid: kind 20001 is ephemeral: never stored"),
                      (14, "restricted: group events are accepted only when published"),
                      (15, "restricted: push leases are accepted only when published"),
                      (18, "invalid: missing field: id")):
        assert f"import: line {n}: {reason}" in errors, errors
    assert "line 4:" not in errors and "line 6:" not in errors  # stored, then deleted; a duplicate

    # The running server serves what the import stored, and not what it replaced or deleted.
    got, closed = await client.req("r", {"authors": [alice.pubkey]})
    assert closed is None
    assert {e["id"] for e in got} == {old.id, profile_new.id, deletion.id, published.id, expiring.id}
    again = alice.sign(1, content="deleted by the next line", created_at=now - 40)
    assert again.id == doomed.id and (await client.publish(again)) == (False, "blocked: this event was deleted "
                                                                              "by its author")
    # Live subscribers are not sent imported events (an import is history, not a publish) and
    # their subscription goes on.
    note = bob.sign(1, content="live after the import")
    assert (await client.publish(note))[0]
    msg = await live.expect(lambda m: m[0] in ("EVENT", "CLOSED"))
    assert msg[0] == "EVENT" and msg[2]["id"] == note.id

    # Imported again: every stored event is a duplicate, what was refused is refused again.
    again = run("import", "--data-dir", server.data_dir, "--no-verify", stdin=lines(old, profile_new, by_bob))
    assert again.stdout.decode().splitlines()[-1] == "import: read 3, stored 0, duplicate 3, rejected 0"


async def test_export_oldest_first_with_filters_beside_a_running_server(make_server, connect):
    server = make_server()
    alice, bob = Identity(), Identity()
    base = int(time.time()) - 1000
    events = [sign_event(alice.secret if i % 2 else bob.secret, 1 if i % 3 else 7, [["t", f"t{i % 4}"]],
                         f"note {i} ünïcödé \"quoted\" \\ \n\t\u2028 🎉", base + i // 2) for i in range(40)]
    client = await connect(server.url)
    for ev in reversed(events):  # stored newest first: the export still goes oldest first
        assert (await client.publish(ev))[0]
    every = exported(server.data_dir)
    assert len(every) == 40
    times = [orjson.loads(line)["created_at"] for line in every]
    assert times == sorted(times)
    # Each line is the event as served (the relay's one serialization), byte for byte.
    by_id = {ev.id: ev.to_json_bytes() for ev in events}
    assert all(by_id[orjson.loads(line)["id"]] == line for line in every)
    got, _ = await client.req("all", {"limit": 100})
    assert sorted(orjson.dumps(e) for e in got) == sorted(every)

    def ids(*args) -> set[str]:
        return {orjson.loads(line)["id"] for line in exported(server.data_dir, *args)}

    assert ids("--filter", orjson.dumps({"authors": [alice.pubkey], "kinds": [7]}).decode()) == {
        e.id for e in events if e.pubkey == alice.pubkey and e.kind == 7}
    assert ids("--filter", '{"#t": ["t1", "t2"]}') == {e.id for e in events if e.tags[0][1] in ("t1", "t2")}
    assert ids("--since", str(base + 5), "--until", str(base + 9)) == {
        e.id for e in events if base + 5 <= e.created_at <= base + 9}
    assert ids("--filter", f'{{"since": {base + 5}}}', "--until", str(base + 6)) == {
        e.id for e in events if base + 5 <= e.created_at <= base + 6}
    # limit: the newest `limit` the filter selects (REQ's choice), written oldest first.
    newest = [orjson.loads(x) for x in exported(server.data_dir, "--filter", '{"limit": 7}')]
    assert {e["id"] for e in newest} == {e["id"] for e in got[:7]}
    assert [e["created_at"] for e in newest] == sorted(e["created_at"] for e in newest)


def test_export_pages_through_many_events_in_order(tmp_path):
    data = tmp_path / "data"
    secret = Identity().secret
    base = 1_600_000_000
    events = [sign_event(secret, 1, [], f"n{i}", base + (i * 7919) % 3000) for i in range(12_000)]
    out = run("import", "--data-dir", data, "--no-verify", stdin=lines(*events))
    assert out.stdout.decode().splitlines()[-1] == "import: read 12000, stored 12000, duplicate 0, rejected 0"
    got = exported(data)
    assert len(got) == 12_000 and len(set(got)) == 12_000  # pages of 5,000: none lost, none twice
    order = [(orjson.loads(line)["created_at"]) for line in got]
    assert order == sorted(order)


async def test_delete_by_filter_leaves_live_subscribers_alone(make_server, connect):
    server = make_server()
    alice, bob = Identity(), Identity()
    client = await connect(server.url)
    spam = [bob.sign(1, [["t", "spam"]], f"spam {i}") for i in range(12)]
    keep = [alice.sign(1, [["t", "spam"]], "alice's, kept"), bob.sign(7, [], "+")]
    for ev in spam + keep:
        assert (await client.publish(ev))[0]
    watcher = await connect(server.url)
    await watcher.send(["REQ", "w", {"authors": [bob.pubkey], "limit": 0}])
    await watcher.expect(lambda m: m[0] == "EOSE" and m[1] == "w")
    selection = orjson.dumps({"authors": [bob.pubkey], "kinds": [1], "#t": ["spam"]}).decode()

    dry = run("delete", "--data-dir", server.data_dir, "--filter", selection, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.decode().strip() == "delete: would delete 12 events"
    assert len((await client.req("a", {"authors": [bob.pubkey]}))[0]) == 13  # nothing deleted

    done = run("delete", "--data-dir", server.data_dir, "--filter", selection)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "delete: deleted 12 events"
    got, _ = await client.req("b", {"#t": ["spam"]})
    assert [e["id"] for e in got] == [keep[0].id]
    assert {e["id"] for e in (await client.req("c", {"authors": [bob.pubkey]}))[0]} == {keep[1].id}
    # The subscription lives on: the next event of bob's reaches it, and nothing closed it.
    later = bob.sign(1, [["t", "spam"]], "after the delete")
    assert (await client.publish(later))[0]
    msg = await watcher.expect(lambda m: m[0] in ("EVENT", "CLOSED"))
    assert msg[0] == "EVENT" and msg[2]["id"] == later.id

    # With a limit: its newest events only.
    run("delete", "--data-dir", server.data_dir, "--filter", '{"kinds": [1], "limit": 1}')
    got, _ = await client.req("d", {"kinds": [1]})
    assert [e["id"] for e in got] == [keep[0].id]
    assert run("delete", "--data-dir", server.data_dir, "--filter", '{"kinds": [1]}', "--dry-run").stdout \
        == b"delete: would delete 1 events\n"


@pytest.mark.parametrize("args, message", [
    (("export", "--filter", "{kinds: [1]}"), "appliance: --filter: not JSON"),
    (("export", "--filter", "[1]"), "appliance: --filter: a filter is a JSON object"),
    (("export", "--filter", '{"kind": [1]}'), "appliance: --filter: unknown filter field 'kind'"),
    (("export", "--filter", '{"kinds": ["1"]}'), "appliance: --filter: kinds must contain integers"),
    (("export", "--since", "yesterday"), "appliance: --since: expected a Unix time in seconds"),
    (("export", "--until", "-5"), "appliance: --until: -5 is out of range"),
    (("export", "--filter", '{"search": "x"}'), "appliance: --filter: search is for REQ"),
    (("export", "--origin", "wss://nowhere.example"), "no such origin"),
    (("import", "--origin", "wss://nowhere.example"), "no such origin"),
    (("delete", "--filter", '{"authors": ["abc"]}'), "appliance: --filter: authors must contain 64-character"),
    (("delete", "--filter", '{"authorz": []}'), "appliance: --filter: unknown filter field 'authorz'"),
    (("delete", "--filter", "{}", "--origin", "wss://nowhere.example"), "no such origin"),
])
async def test_bad_arguments_get_one_line_and_change_nothing(module_server, connect, args, message):
    # One server for every case: each compares the export after its own refused command with the
    # export just before it.
    server = module_server
    alice = Identity()
    client = await connect(server.url)
    assert (await client.publish(alice.sign(1, content="stays")))[0]
    before = exported(server.data_dir)
    out = run(*args, "--data-dir", server.data_dir, stdin=lines(alice.sign(1, content="not imported")))
    assert out.returncode == 2
    err = out.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert out.stdout == b""
    assert exported(server.data_dir) == before


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full to stand for a full disk")
def test_export_to_a_full_disk_is_one_line(tmp_path):
    data = tmp_path / "d"
    secret = Identity().secret
    out = run("import", "--data-dir", data, "--no-verify", stdin=lines(*(sign_event(secret, 1, [], f"n{i}")
                                                                          for i in range(3))))
    assert out.returncode == 0, out.stderr
    args = ["export", "--data-dir", str(data)]
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-m", "appliance", *args], stdout=full, stderr=subprocess.PIPE,
                              env=process_env(args), cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "appliance: export: cannot write the events: No space left on device"], done.stderr


def test_import_on_a_members_origin_stores_members_events_only(tmp_path):
    data = tmp_path / "d"
    member, outsider = Identity(), Identity()
    settings = ("--data-dir", data, "--access-policy", "members")
    first = run("import", *settings, stdin=lines(outsider.sign(1, content="nobody is a member yet")))
    assert first.stdout.decode().splitlines()[-1] == "import: read 1, stored 0, duplicate 0, rejected 1"
    assert "import: line 1: restricted: the event author is not a member" in first.stderr.decode()
    origin = orjson.loads(run("origins", "list", "--json", *settings).stdout.splitlines()[0])["origin"]
    assert run("origins", "allow", *settings, origin, member.pubkey).returncode == 0
    out = run("import", *settings, stdin=lines(member.sign(1, content="a member's"), outsider.sign(1, content="no")))
    assert out.stdout.decode().splitlines()[-1] == "import: read 2, stored 1, duplicate 0, rejected 1"
    assert "import: line 2: restricted: the event author is not a member" in out.stderr.decode()


def test_import_reports_an_overlong_line_and_goes_on(tmp_path):
    secret = Identity().secret
    ok = sign_event(secret, 1, [], "fits")
    huge = sign_event(secret, 1, [], "x" * 5000)
    out = run("import", "--data-dir", tmp_path / "d", "--max-message-length", "4096", "--max-content-length", "8000",
              stdin=lines(huge, ok))
    assert out.stdout.decode().splitlines()[-1] == "import: read 2, stored 1, duplicate 0, rejected 1"
    assert "import: line 1: invalid: line longer than max_message_length (4096 bytes)" in out.stderr.decode()


async def test_import_while_the_server_writes(make_server, connect):
    """Both write at once (the server's writer and the import's): nothing is lost on either side."""
    server = make_server()
    alice, bob = Identity(), Identity()
    imported = [alice.sign(1, content=f"imported {i}", created_at=1_600_000_000 + i) for i in range(3000)]
    client = await connect(server.url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "appliance", "import", "--data-dir", str(server.data_dir),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=process_env(("--data-dir", server.data_dir)), cwd=ROOT)
    feeding = asyncio.ensure_future(proc.communicate(lines(*imported)))
    published = [bob.sign(1, content=f"live {i}") for i in range(150)]
    for ev in published:
        ok, message = await client.publish(ev)
        assert ok, message
    out, err = await asyncio.wait_for(feeding, 120)
    assert proc.returncode == 0, err
    assert out.decode().splitlines()[-1] == "import: read 3000, stored 3000, duplicate 0, rejected 0"
    assert (await client.count("n", {"authors": [alice.pubkey]}))[2]["count"] == 3000
    assert (await client.count("m", {"authors": [bob.pubkey]}))[2]["count"] == 150
