"""The batched write path stores exactly what the one-by-one path would, and falls back safely."""

from __future__ import annotations

import asyncio
import time

import pytest

from appliance.errors import AlreadyStored, Rejected
from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret
from appliance.store.events import PendingEvent, WriteHooks, batchable, store_event
from appliance.store.sqlite import SqliteStore
from appliance.store.statement import SQL
from tests.pg import make_store

SECRET = generate_secret()
SQL_ORIGIN = SQL("INSERT INTO origins (id, origin) VALUES (1, 'ws://a.test')",
                 "INSERT INTO origins (id, origin) VALUES (1, 'ws://a.test')")
SQL_DELETION = SQL("INSERT INTO deletions VALUES (1, ?, ?, ?)", "INSERT INTO deletions VALUES (1, %s, %s, %s)")


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path, sync_mode="normal").open()
    s.write_sync(lambda conn: conn.execute(SQL_ORIGIN))
    yield s
    s.close()


def submit_all(store: SqliteStore, ops: list) -> list:
    """Submit every op before awaiting any, so the writer sees them as one batch."""

    async def run():
        futures = [store.write(op) for op in ops]
        return await asyncio.gather(*futures, return_exceptions=True)

    return asyncio.run(run())


def rows(store: SqliteStore):
    return store.read_sync(lambda c: (c.execute(SQL("SELECT id, raw FROM events ORDER BY id",
                                                    "SELECT id, raw FROM events ORDER BY id")).fetchall(),
                                      c.execute(SQL("SELECT name, value FROM tags ORDER BY 1, 2",
                                                    "SELECT name, value FROM tags ORDER BY 1, 2")).fetchall()))


def pending(ev, now=None, expiration=None, hooks=None):
    return PendingEvent(1, ev, ev.to_json(), expiration, now or int(time.time()), hooks, {})


def test_batch_matches_one_by_one(store, tmp_path):
    now = int(time.time())
    evs = [sign_event(SECRET, 1, [["p", "a" * 64], ["t", f"n{i % 3}"], ["t", f"n{i % 3}"]], str(i)) for i in range(50)]
    deleted = evs[7]
    store.write_sync(lambda c: c.execute(SQL_DELETION, (deleted.id, deleted.pubkey, now)))
    stale = sign_event(SECRET, 1, [], "stale")
    ops = [pending(ev) for ev in evs] + [pending(evs[3])] + [pending(stale, expiration=now - 1)]
    results = submit_all(store, ops)
    assert isinstance(results[7], Rejected) and results[7].prefix == "blocked"
    assert isinstance(results[50], AlreadyStored) and results[50].wire == "duplicate: already have this event"
    assert isinstance(results[51], Rejected) and results[51].wire == "invalid: event has expired"
    assert sum(not isinstance(r, Exception) for r in results) == 49
    batched = rows(store)

    other = make_store(tmp_path / "other", sync_mode="normal").open()
    other.write_sync(lambda c: c.execute(SQL_ORIGIN))
    other.write_sync(lambda c: c.execute(SQL_DELETION, (deleted.id, deleted.pubkey, now)))
    for ev in evs:
        try:
            other.write_sync(lambda c, ev=ev: store_event(c, 1, ev, raw=ev.to_json(), expiration=None, now=now))
        except Rejected:
            pass
    assert rows(other) == batched
    other.close()


def test_failing_stored_hook_falls_back_to_one_by_one(store):
    def hook(conn, origin, ev, ctx):
        if ev.content == "bad":
            raise Rejected("error", "hook refused")

    hooks = WriteHooks()
    hooks.add_stored(hook)
    evs = [sign_event(SECRET, 1, [], c) for c in ("ok1", "bad", "ok2")]
    assert all(batchable(ev, hooks) for ev in evs)
    results = submit_all(store, [pending(ev, hooks=hooks) for ev in evs])
    assert isinstance(results[1], Rejected)
    stored = {raw for _id, raw in rows(store)[0]}
    assert stored == {evs[0].to_json(), evs[2].to_json()}


def test_what_is_not_batchable():
    hooks = WriteHooks()
    hooks.add_check(lambda *a: None, wants=lambda ev: ev.kind == 7)
    assert batchable(sign_event(SECRET, 1, [], ""), hooks)
    assert not batchable(sign_event(SECRET, 7, [], ""), hooks)
    assert not batchable(sign_event(SECRET, 0, [], ""), hooks)  # replaceable
    assert not batchable(sign_event(SECRET, 30023, [["d", "x"]], ""), hooks)  # addressable
    assert not batchable(sign_event(SECRET, 5, [["e", "0" * 64]], ""), hooks)  # deletion
    assert not batchable(sign_event(SECRET, 1, [["h", "g"]], ""), hooks)  # group-scoped


def test_write_then_answers_on_the_loop_after_the_commit(store):
    """`write_then`: no future, the callback runs on the caller's loop thread once the batch
    committed (the row is readable by then), with each write's own result or refusal; a callback
    that raises does not keep the batch's other writes unanswered."""
    import threading

    evs = [sign_event(SECRET, 1, [["t", "then"]], str(i)) for i in range(5)]
    ops = [pending(ev) for ev in evs] + [pending(evs[0])]

    async def run():
        loop = asyncio.get_running_loop()
        answers: dict[int, tuple] = {}
        all_in = loop.create_future()

        def done_for(i):
            def done(result, exc):
                stored = store.read_sync(lambda c: c.execute(SQL("SELECT count(*) FROM events",
                                                                 "SELECT count(*) FROM events")).fetchone()[0])
                answers[i] = (threading.get_ident(), result, exc, stored)
                if len(answers) == len(ops) and not all_in.done():
                    all_in.set_result(None)
                if i == 1:
                    raise RuntimeError("a failing callback")
            return done

        for i, op in enumerate(ops):
            store.write_then(op, done_for(i))
        await asyncio.wait_for(all_in, 30)
        return answers

    answers = asyncio.run(run())
    assert sorted(answers) == list(range(6))
    assert {thread for thread, *_ in answers.values()} == {threading.get_ident()}
    for i in range(5):
        _thread, result, exc, stored = answers[i]
        assert exc is None and result.message == "" and stored >= i + 1  # FIFO: its batch and those before
    _thread, result, exc, _stored = answers[5]
    assert result is None and isinstance(exc, AlreadyStored)
