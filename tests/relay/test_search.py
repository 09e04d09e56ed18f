"""NIP-50 search over the real server: `search` in REQ and COUNT, ranked by relevance then
created_at, every other filter field applied, read authorization as REQ's, live events matched as
the index matches stored ones, the index kept through deletions, replacements, expiry and bans,
`search_kinds`, and `appliance search reindex`."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.conftest import Identity
from tests.ops.test_transfer import run
from tests.pg import database_for, on_postgres

from .test_origins_groups import make_group


def ids(events) -> list[str]:
    return [e["id"] for e in events]


def test_nip11_lists_50_while_some_kinds_are_searchable(make_server):
    assert 50 in make_server().nip11()["supported_nips"]
    assert 50 not in make_server("--search-kinds", "").nip11()["supported_nips"]


async def test_search_ranks_by_relevance_then_created_at_and_applies_every_field(server, connect):
    alice, bob = Identity(), Identity()
    c = await connect(server.url)
    now = int(time.time())
    # One word, in contents of one length: equally relevant, so newest first.
    same = [alice.sign(1, [["t", "x"]], f"the heron flew {w}", now - 100 + i)
            for i, w in enumerate(("away", "home", "east"))]
    dense = bob.sign(1, [], "heron heron heron", now - 500)  # the word three times in three: most relevant
    long = alice.sign(30023, [["d", "a"], ["t", "y"]], "an article that mentions the Heron once among many "
                      "other words about birds and lakes and weather and travel and food", now - 50)
    reaction = bob.sign(7, [], "heron", now - 10)  # kind 7 is not searchable by default
    unrelated = alice.sign(1, [], "herons are plural, heronry is a place", now - 20)
    for ev in [*same, dense, long, reaction, unrelated]:
        assert (await c.publish(ev))[0]

    got, closed = await c.req("s", {"search": "heron"})
    assert closed is None
    assert ids(got) == [dense.id, same[2].id, same[1].id, same[0].id, long.id]
    # Case is folded; NIP-50 key:value extensions are not words.
    assert ids((await c.req("s2", {"search": "HERON include:spam language:en"}))[0]) == ids(got)
    assert ids((await c.req("s3", {"search": "heron", "limit": 2}))[0]) == [dense.id, same[2].id]
    accented = alice.sign(1, [], "Café crème")  # diacritics fold too (docs/spec-notes.md, J8)
    assert (await c.publish(accented))[0]
    assert ids((await c.req("s5", {"search": "cafe CREME"}))[0]) == [accented.id]
    # Every word must be there.
    assert ids((await c.req("s4", {"search": "heron home"}))[0]) == [same[1].id]
    # The other fields: kinds, authors, tags, since/until.
    assert ids((await c.req("k", {"search": "heron", "kinds": [30023]}))[0]) == [long.id]
    assert ids((await c.req("k7", {"search": "heron", "kinds": [7]}))[0]) == []
    assert ids((await c.req("a", {"search": "heron", "authors": [bob.pubkey]}))[0]) == [dense.id]
    assert ids((await c.req("t", {"search": "heron", "#t": ["x"]}))[0]) == [same[2].id, same[1].id, same[0].id]
    assert ids((await c.req("u", {"search": "heron", "since": now - 99, "until": now - 60}))[0]) == [
        same[2].id, same[1].id]
    assert ids((await c.req("i", {"search": "heron", "ids": [same[0].id, reaction.id]}))[0]) == [same[0].id]
    # No word to look for (punctuation only, extensions only): nothing, and no error.
    assert (await c.req("p", {"search": "!!! ..."})) == ([], None)
    assert (await c.req("e", {"search": "domain:example.com"})) == ([], None)
    # COUNT counts what REQ finds.
    assert (await c.count("n", {"search": "heron"}))[2]["count"] == 5
    assert (await c.count("n2", {"search": "heron"}, {"authors": [bob.pubkey]}))[2]["count"] == 6


async def test_search_never_finds_what_the_reader_could_not_req(make_server, connect):
    server = make_server("--search-kinds", "1,4,9")
    alice, bob, carol = Identity(), Identity(), Identity()
    ca = await connect(server.url)
    assert (await ca.auth(alice.secret, server.url))[0]
    h = await make_group(ca, alice, private=True)
    assert (await ca.publish(alice.sign(9000, [["h", h], ["p", bob.pubkey]], "")))[0]
    in_group = alice.sign(9, [["h", h]], "the albatross plan")
    dm = alice.sign(4, [["p", bob.pubkey]], "albatross (pretend ciphertext)")
    public = alice.sign(1, [], "an albatross in public")
    for ev in (in_group, dm, public):
        assert (await ca.publish(ev))[0]

    cb = await connect(server.url)
    assert (await cb.auth(bob.secret, server.url))[0]
    cc = await connect(server.url)
    assert (await cc.auth(carol.secret, server.url))[0]
    anon = await connect(server.url)
    for client, sees in ((ca, {in_group.id, dm.id, public.id}), (cb, {in_group.id, dm.id, public.id}),
                         (cc, {public.id}), (anon, {public.id})):
        got, closed = await client.req("s", {"search": "albatross"})
        assert closed is None and set(ids(got)) == sees
        assert (await client.count("n", {"search": "albatross"}))[2]["count"] == len(sees)
    # Asking for the gated kind by name still needs AUTH, as REQ does.
    _, closed = await anon.req("dm", {"search": "albatross", "kinds": [4]})
    assert closed is not None and closed[2].startswith("auth-required:")

    # Live: a new matching event reaches a search subscription only if its reader may read it,
    # and only if the index would find it (a word, a searchable kind).
    await cc.send(["REQ", "live", {"search": "albatross", "limit": 0}])
    await cc.expect(lambda m: m[0] == "EOSE" and m[1] == "live")
    await cb.send(["REQ", "live", {"search": "albatross", "limit": 0}])
    await cb.expect(lambda m: m[0] == "EOSE" and m[1] == "live")
    for ev in (alice.sign(9, [["h", h]], "albatross again"), alice.sign(1, [], "albatrosses, not the word"),
               alice.sign(7, [], "albatross"), alice.sign(1, [], "ALBATROSS live")):
        assert (await ca.publish(ev))[0]
    last = (await cb.expect(lambda m: m[0] == "EVENT" and m[1] == "live"))[2]
    assert last["content"] == "albatross again"
    assert (await cb.expect(lambda m: m[0] == "EVENT" and m[1] == "live"))[2]["content"] == "ALBATROSS live"
    assert (await cc.expect(lambda m: m[0] == "EVENT" and m[1] == "live"))[2]["content"] == "ALBATROSS live"
    await asyncio.sleep(0.3)
    assert not [m for m in cc.backlog + cb.backlog if m[0] == "EVENT" and m[1] == "live"]


async def test_stored_and_live_search_split_words_alike_on_each_backend(server, connect):
    """Punctuation, symbols and `_` separate words, and case and diacritics fold, in the index as in
    the live matcher, on both backends (PostgreSQL's own parser keeps `heron.egret`, URLs, paths
    and addresses as one token each; it is not what splits the words)."""
    alice = Identity()
    c = await connect(server.url)
    await c.send(["REQ", "live", {"search": "heron", "limit": 0}])
    await c.expect(lambda m: m[0] == "EOSE" and m[1] == "live")
    contents = ["the heron.egret flew", "https://example.com/heron/nest.jpg", "see /usr/share/heron",
                "mail me: a@heron.org", "heron🎉 at dawn", "“heron”", "heron—egret",
                "HERON_ibis", "héron? no: HÉRON", "x=3.14;heron"]
    published = [alice.sign(1, [], text) for text in contents]
    for ev in published:
        assert (await c.publish(ev))[0]
    live = [(await c.expect(lambda m: m[0] == "EVENT" and m[1] == "live"))[2]["id"] for _ in published]
    assert live == [ev.id for ev in published]
    got, closed = await c.req("s", {"search": "heron"})
    assert closed is None and sorted(ids(got)) == sorted(live)
    for word, content in (("egret", "the heron.egret flew"), ("example", contents[1]), ("jpg", contents[1]),
                          ("usr", contents[2]), ("org", contents[3]), ("ibis", contents[7]),
                          ("14", contents[9]), ("Héron", contents[8])):
        found = [e["content"] for e in (await c.req("w", {"search": word}))[0]]
        assert content in found, (word, found)


async def test_the_index_follows_deletions_replacements_expiry_and_delete(server, connect):
    alice = Identity()
    c = await connect(server.url)
    now = int(time.time())
    doomed = alice.sign(1, [], "quokka one")
    article = alice.sign(30023, [["d", "q"]], "quokka draft", now - 10)
    # Alive through the next seven round trips, however busy the machine (with now + 2, as little
    # as one second from `now`'s whole second), then waited out.
    expiring = alice.sign(1, [["expiration", str(now + 5)]], "quokka briefly")
    for ev in (doomed, article, expiring):
        assert (await c.publish(ev))[0]
    assert len((await c.req("s", {"search": "quokka"}))[0]) == 3
    assert (await c.publish(alice.sign(5, [["e", doomed.id]], "")))[0]
    newer = alice.sign(30023, [["d", "q"]], "wombat final", now)
    assert (await c.publish(newer))[0]
    assert ids((await c.req("s", {"search": "quokka"}))[0]) == [expiring.id]
    assert ids((await c.req("w", {"search": "wombat"}))[0]) == [newer.id]
    await asyncio.sleep(max(0.0, now + 5.1 - time.time()))
    assert (await c.req("s", {"search": "quokka"}))[0] == []
    out = run("delete", "--data-dir", server.data_dir, "--filter", '{"kinds": [30023]}')
    assert out.returncode == 0, out.stderr
    assert (await c.req("w", {"search": "wombat"}))[0] == []
    # Index rows of deleted events are gone, not just hidden: counted straight from the index.
    assert index_count(server.data_dir, "wombat") == 0 and index_count(server.data_dir, "one") == 0


def index_count(data_dir, word: str) -> int:
    """Entries of the search index holding `word`, read beside the server."""
    if on_postgres():
        import psycopg

        with psycopg.connect(database_for(data_dir)) as c:
            return c.execute("SELECT count(*) FROM events_search WHERE tsv @@ plainto_tsquery('simple', %s)",
                             (word,)).fetchone()[0]
    import apsw

    conn = apsw.Connection(str(data_dir / "appliance.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT count(*) FROM events_fts WHERE events_fts MATCH ?", (word,)).fetchone()[0]
    finally:
        conn.close()


@pytest.mark.slow
async def test_search_kinds_change_and_reindex(make_server, connect, tmp_path):
    data = tmp_path / "data"
    server = make_server(data_dir=data)
    alice = Identity()
    c = await connect(server.url)
    note, reaction = alice.sign(1, [], "narwhal note"), alice.sign(7, [], "narwhal")
    for ev in (note, reaction):
        assert (await c.publish(ev))[0]
    assert ids((await c.req("s", {"search": "narwhal"}))[0]) == [note.id]
    await c.close()
    server.stop()
    # Started again with kind 7 searchable and kind 1 not: the index follows at start.
    server = make_server("--search-kinds", "7", data_dir=data)
    c = await connect(server.url)
    assert ids((await c.req("s", {"search": "narwhal"}))[0]) == [reaction.id]
    # A full rebuild beside the running server finds the same.
    out = run("search", "reindex", "--data-dir", data, "--search-kinds", "7")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == "search: reindexed 1 events of kinds [7]"
    assert ids((await c.req("s2", {"search": "narwhal"}))[0]) == [reaction.id]
    out = run("search", "reindex", "--data-dir", data, "--search-kinds", "x")
    assert out.returncode == 2 and b"search_kinds" in out.stderr


@pytest.mark.sqlite_only("the FTS5 index's own view of a migrated database")
def test_migration_indexes_what_was_stored(tmp_path):
    """A database of the schema before search gets its searchable events indexed by the migration."""
    import apsw

    from appliance.nostr.event import sign_event
    from appliance.store.schema import MIGRATIONS, migrate

    path = tmp_path / "old.sqlite3"
    old = apsw.Connection(str(path))
    step = next(i for i, sql in enumerate(MIGRATIONS) if "events_fts" in sql)
    for version, sql in enumerate(MIGRATIONS[:step]):
        with old:
            old.execute(sql)
            old.execute(f"PRAGMA user_version = {version + 1}")
    secret = Identity().secret
    old.execute("INSERT INTO origins (id, origin) VALUES (1, 'ws://x')")
    for kind, content in ((1, "stored before"), (7, "stored before"), (30023, "long before")):
        ev = sign_event(secret, kind, [], content, 1_700_000_000)
        old.execute("INSERT INTO events (origin, id, pubkey, created_at, kind, raw) VALUES (1, ?, ?, ?, ?, ?)",
                    (ev.id, ev.pubkey, ev.created_at, ev.kind, ev.to_json()))
    migrate(old)
    assert old.execute("SELECT e.kind FROM events_fts f JOIN events e ON e.rowid = f.rowid "
                       "WHERE events_fts MATCH 'before' ORDER BY e.kind").fetchall() == [(1,), (30023,)]
    old.close()


def test_reindex_indexes_each_event_once(tmp_path):
    """Imported events are indexed by the triggers; a rebuild, twice, leaves one entry each."""
    from appliance.nostr.event import sign_event
    from tests.ops.test_transfer import lines

    secret = Identity().secret
    events = [sign_event(secret, 1, [], f"kiwi {uuid.uuid4()}", 1_700_000_000 + i) for i in range(50)]
    data = tmp_path / "d"
    assert run("import", "--data-dir", data, stdin=lines(*events)).returncode == 0
    out = run("search", "reindex", "--data-dir", data)
    assert out.stdout.decode().strip() == "search: reindexed 50 events of kinds [1, 30023]"
    assert run("search", "reindex", "--data-dir", data).stdout.decode().strip() == \
        "search: reindexed 50 events of kinds [1, 30023]"
    assert index_count(data, "kiwi") == 50
