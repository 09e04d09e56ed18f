"""The reader pool shares SQLite fairly: ordering and budget properties, never wall-clock speed.

A "long" read is a recursive CTE of a few million rows: CPU-bound work that takes far longer than
one 10 ms time slice on any machine, so the assertions are about order, not about speed.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
import time

import pytest

from appliance.store.sqlite import (INLINE_MAX_SECONDS, WRITER_MMAP_BYTES, QueryTimeout, ReadPool, SqliteStore,
                                    connect)

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only(
    "time slices and inline reads; a PostgreSQL read runs whole, bounded by statement_timeout")]

LONG = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) SELECT count(*) FROM c"


def long_read(conn):
    return conn.execute(LONG).fetchone()[0]


def short_read(conn):
    return conn.execute("SELECT 42").fetchone()[0]


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "data", sync_mode="normal", reader_threads=1).open()
    yield s
    s.close()


def use_pool(store, **kw) -> ReadPool:
    store._pool.stop()
    store._pool = ReadPool(store, 1, **kw)
    return store._pool


async def test_a_newcomer_runs_before_a_long_read_finishes(store):
    """One run slot: a connection's long reads pause for another connection's first read."""
    pool = use_pool(store)
    finished: list[str] = []
    hog, bystander = object(), object()

    async def run(name, fn, owner):
        await store.read(fn, owner=owner)
        finished.append(name)

    hogs = [asyncio.create_task(run(f"hog{i}", long_read, hog)) for i in range(2)]
    while pool.active == 0:
        await asyncio.sleep(0.001)
    await run("bystander", short_read, bystander)
    await asyncio.gather(*hogs)
    assert finished[0] == "bystander", finished
    assert pool.pauses >= 1


async def test_an_owners_second_read_waits_behind_others_first(store):
    """No time slices (one very long slice): the queue order alone is fair."""
    pool = use_pool(store, slice_seconds=3600)
    a, b, c = object(), object(), object()
    order: list[str] = []

    async def run(name, owner):
        await store.read(long_read if name == "a1" else short_read, owner=owner)
        order.append(name)

    first = asyncio.create_task(run("a1", a))
    while pool.active == 0:
        await asyncio.sleep(0.001)
    # Queued while a1 runs: a's second and third reads first, then b's and c's first reads.
    rest = [asyncio.create_task(run(n, o)) for n, o in (("a2", a), ("a3", a), ("b1", b), ("c1", c))]
    await asyncio.gather(first, *rest)
    assert order[0] == "a1"
    assert order.index("b1") < order.index("a3") and order.index("c1") < order.index("a3"), order


async def test_waiting_counts_against_the_budget(store):
    use_pool(store, slice_seconds=3600)
    hog = asyncio.create_task(store.read(long_read, owner="hog"))
    while store._pool.active == 0:
        await asyncio.sleep(0.001)
    with pytest.raises(QueryTimeout):
        await store.read(short_read, timeout=0.05, owner="bystander")
    assert await hog == 3000000


async def test_a_cancelled_waiting_read_never_runs(store):
    use_pool(store, slice_seconds=3600)
    ran: list[int] = []
    hog = asyncio.create_task(store.read(long_read, owner="hog"))
    while store._pool.active == 0:
        await asyncio.sleep(0.001)
    waiting = asyncio.create_task(store.read(lambda conn: ran.append(1), owner="other"))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await hog
    assert await store.read(short_read, owner="other") == 42
    assert ran == []


async def test_an_owner_never_has_more_than_two_started(store):
    pool = ReadPool(store, 4, per_owner=2)
    try:
        peak = 0
        live = 0
        lock = asyncio.Lock()

        def counted(conn):
            return conn.execute(LONG.replace("3000000", "300000")).fetchone()[0]

        async def one():
            nonlocal live, peak
            fut = pool.submit(counted, None, "greedy")
            await fut

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, pool._started.get("greedy", 0))
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(one() for _ in range(6)))
        watcher.cancel()
        assert 1 <= peak <= 2
    finally:
        pool.stop()


async def test_a_first_read_takes_the_thread_of_a_paused_one(store):
    """Every thread holds a started read (two hogs, two threads, one run slot): a third owner's
    first read takes a paused read's thread (that read is abandoned), and the rest keep running.
    Before, the waiting newcomer stopped the pool: nothing resumed until the deadlines."""
    pool = use_pool(store, max_threads=2)
    finished: list[str] = []

    async def run(name, fn, owner, timeout=None):
        try:
            await store.read(fn, timeout=timeout, owner=owner)
            finished.append(name)
        except QueryTimeout:
            finished.append(name + " abandoned")

    hogs = [asyncio.create_task(run(f"hog{i}", long_read, f"hog{i}", timeout=600)) for i in range(2)]
    while sum(pool._started.values()) < 2 or pool.pauses == 0:
        await asyncio.sleep(0.001)
    await asyncio.wait_for(run("bystander", short_read, "bystander"), 60)
    await asyncio.gather(*hogs)
    done = [name for name in finished if not name.endswith("abandoned")]
    assert done[0] == "bystander", finished
    assert sorted(finished) in (["bystander", "hog0", "hog1 abandoned"], ["bystander", "hog0 abandoned", "hog1"])
    assert pool.evictions == 1


async def test_an_evicted_read_without_a_budget_is_abandoned_cleanly(store):
    """query_timeout 0 (no budget): an evicted read still ends with QueryTimeout, not a crash."""
    pool = use_pool(store, max_threads=1)
    hog = asyncio.create_task(store.read(long_read, owner="hog"))
    while pool._started.get("hog", 0) == 0:
        await asyncio.sleep(0.001)
    bystander = asyncio.create_task(store.read(short_read, owner="bystander"))
    with pytest.raises(QueryTimeout):
        await hog
    assert await bystander == 42


class Owner:
    """An owner as a websocket session is one: weakly referenceable (the pool remembers, per
    owner, whether its reads skip the loop)."""


def noting_thread(fn, seen: list):
    loop_thread = threading.get_ident()

    def run(conn):
        seen.append("loop" if threading.get_ident() == loop_thread else "reader")
        return fn(conn)

    return run


async def test_a_short_read_runs_on_the_loop_a_long_one_on_a_reader(store):
    """Inline: a short read runs on the loop's thread and `done` comes in a later callback; one too
    long for the loop is abandoned there and done by a reader thread, and that owner's next reads
    go to the reader threads too (another owner's do not)."""
    pool = store._pool
    owner, other = Owner(), Owner()
    seen: list[str] = []
    answer = asyncio.get_running_loop().create_future()
    store.read_then(noting_thread(short_read, seen), lambda r, e: answer.set_result((r, e)), owner=owner,
                    inline=True)
    assert not answer.done()  # never from within the call
    assert await answer == (42, None)
    assert seen == ["loop"] and pool.inline_reads == 1
    assert await store.read(noting_thread(long_read, seen), owner=owner, inline=True) == 3000000
    assert seen[1:] == ["loop", "reader"] and pool.inline_abandoned == 1
    assert await store.read(noting_thread(short_read, seen), owner=owner, inline=True) == 42
    assert await store.read(noting_thread(short_read, seen), owner=other, inline=True) == 42
    assert seen[3:] == ["reader", "loop"]


async def test_an_owner_with_a_read_started_does_not_read_on_the_loop(store):
    """Inline reads keep the per-owner limit: an owner with a read on a reader thread (or any read
    waiting for one) gets its next read done there too."""
    pool = store._pool
    owner = Owner()
    seen: list[str] = []
    slow = asyncio.ensure_future(store.read(long_read, owner=owner))
    while pool.active == 0:
        await asyncio.sleep(0.001)
    assert await store.read(noting_thread(short_read, seen), owner=owner, inline=True) == 42
    await slow
    assert seen == ["reader"] and pool.inline_reads == 0


async def test_a_short_read_runs_on_the_loop_while_other_owners_wait_for_a_reader(store):
    """Other owners' reads waiting for a reader do not keep a short read off the loop: behind them
    it would wait until the longest reads pause or end."""
    pool = use_pool(store, slice_seconds=3600)
    hog = Owner()
    seen: list[str] = []
    hogs = [asyncio.ensure_future(store.read(long_read, owner=hog, timeout=600)) for _ in range(2)]
    while pool.active == 0 or not pool._queue:  # one running, the other waiting for the run slot
        await asyncio.sleep(0.001)
    assert await store.read(noting_thread(short_read, seen), owner=Owner(), inline=True) == 42
    assert seen == ["loop"] and pool.inline_reads == 1
    for read in hogs:
        read.cancel()
    await asyncio.gather(*hogs, return_exceptions=True)


async def test_an_owner_with_a_read_waiting_does_not_read_on_the_loop(store):
    """Nor does an owner's short read overtake its own read still waiting for a reader."""
    pool = use_pool(store, slice_seconds=3600)
    owner = Owner()
    seen: list[str] = []
    hog = asyncio.ensure_future(store.read(long_read, owner=Owner(), timeout=600))
    while pool.active == 0:
        await asyncio.sleep(0.001)
    waiting = asyncio.ensure_future(store.read(noting_thread(short_read, seen), owner=owner))
    while not pool._queue:
        await asyncio.sleep(0.001)
    assert await store.read(noting_thread(short_read, seen), owner=owner, inline=True) == 42
    assert seen == ["reader", "reader"] and pool.inline_reads == 0
    assert await waiting == 42
    hog.cancel()
    await asyncio.gather(hog, return_exceptions=True)


async def test_an_owners_reads_beyond_what_it_may_start_wait_outside_the_queue(store):
    """An owner's reads that could not start before its started ones end are kept out of the
    queue every dispatch scans (a never-reading client's 24 REQs made it hundreds long), and
    still all run, in order, and none runs once cancelled."""
    pool = use_pool(store, slice_seconds=3600)
    owner = Owner()
    order: list[int] = []

    def noting(i):
        def run(conn):
            order.append(i)
            return short_read(conn)
        return run

    hog = asyncio.ensure_future(store.read(long_read, owner=Owner(), timeout=600))
    while pool.active == 0:
        await asyncio.sleep(0.001)
    reads = [asyncio.ensure_future(store.read(noting(i), owner=owner)) for i in range(24)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(pool._queue) == pool._per_owner  # the others wait beside it
    reads[5].cancel()
    hog.cancel()
    await asyncio.gather(hog, return_exceptions=True)
    results = await asyncio.gather(*reads, return_exceptions=True)
    assert order == [i for i in range(24) if i != 5]
    assert [r for i, r in enumerate(results) if i != 5] == [42] * 23
    assert not pool._queue and not pool._later and not pool._waiting and not pool._queued_new


async def test_an_inline_read_failing_reports_its_error(store):
    failed = asyncio.get_running_loop().create_future()
    store.read_then(lambda conn: conn.execute("SELECT * FROM no_such_table").fetchall(),
                    lambda r, e: failed.set_result(e), owner=Owner(), inline=True)
    assert "no_such_table" in str(await failed)
    assert store._pool.inline_reads == 1


def napping_read(conn):
    """About 200 naps of ~0.1 ms: little CPU, few VM steps, 15-30 ms on the clock."""
    conn.create_scalar_function("nap", lambda: time.sleep(0.0001) or 1)
    return conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200) "
                        "SELECT sum(nap()) FROM c").fetchone()[0]


async def test_an_inline_read_keeps_a_smaller_time_budget(store):
    """A read whose own budget is below the loop's bounds leaves the loop (at its budget, or at
    the loop's bound, whichever comes first) and times out as any read does: QueryTimeout."""
    with pytest.raises(QueryTimeout):
        await store.read(napping_read, timeout=0.004, owner=Owner(), inline=True)
    assert store._pool.inline_abandoned == 1


def stalling_read(stall):
    """A read whose first row calls `stall()` (the thread held up off the CPU past the loop's
    wall-clock bound) and whose next few thousand VM steps use little CPU: far below the loop's
    step and CPU bounds, past its wall-clock one."""

    def run(conn):
        conn.create_scalar_function("stall", lambda x: (x == 1 and stall()) or 1)
        return conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 500) "
                            "SELECT sum(stall(x)) FROM c").fetchone()[0]

    return run


def preempted():
    """The loop's thread off the CPU, as when the machine runs something else."""
    time.sleep(INLINE_MAX_SECONDS + 0.005)


async def test_an_inline_read_stalled_off_the_cpu_keeps_its_owner_on_the_loop(store):
    """A read past the loop's wall-clock bound only, with nothing read from the disk (the loop's
    thread was preempted): that read goes to a reader thread, its owner's next read still runs on
    the loop (no cooldown for the machine's business)."""
    pool = store._pool
    owner = Owner()
    seen: list[str] = []
    assert await store.read(noting_thread(stalling_read(preempted), seen), owner=owner, inline=True) == 500
    assert seen == ["loop", "reader"]
    assert pool.inline_abandoned == 1 and pool.inline_stalled == 1
    assert await store.read(noting_thread(short_read, seen), owner=owner, inline=True) == 42
    assert seen[2:] == ["loop"] and pool.inline_reads == 1


def uncached_reads(path):
    """Reads of `path` that go to the disk: its pages dropped from the OS page cache first."""

    def read_from_disk():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            for offset in range(0, os.fstat(fd).st_size, 1 << 16):
                os.pread(fd, 4096, offset)
        finally:
            os.close(fd)

    return read_from_disk


def blocks_read():
    return resource.getrusage(resource.RUSAGE_THREAD).ru_inblock


async def test_an_inline_read_waiting_on_the_disk_sends_its_owner_to_the_readers(store, tmp_path):
    """A read past the loop's wall-clock bound while its thread read from the disk (a database
    larger than the page cache) was really too slow for the loop: its owner's next reads go to
    the reader threads too."""
    scratch = tmp_path / "cold"
    with open(scratch, "wb") as f:
        f.write(os.urandom(4 << 20))
        f.flush()
        os.fsync(f.fileno())
    from_disk = uncached_reads(scratch)
    before = blocks_read()
    from_disk()
    if blocks_read() == before:
        pytest.skip("this filesystem keeps no per-thread count of block reads (tmpfs?)")

    def cold_and_slow():
        from_disk()
        time.sleep(INLINE_MAX_SECONDS + 0.005)

    pool = store._pool
    owner = Owner()
    seen: list[str] = []
    assert await store.read(noting_thread(stalling_read(cold_and_slow), seen), owner=owner, inline=True) == 500
    assert seen == ["loop", "reader"]
    assert pool.inline_abandoned == 1 and pool.inline_stalled == 0
    assert await store.read(noting_thread(short_read, seen), owner=owner, inline=True) == 42
    assert seen[2:] == ["reader"] and pool.inline_reads == 0


async def test_the_loops_reads_see_every_commit_and_the_writer_maps_the_file(store):
    """Each inline read sees every commit before it, whether its pages are still in the WAL or
    checkpointed into the database file (which the writer maps, the loop's connection not)."""
    owner = Owner()
    await store.write(lambda conn: conn.execute("CREATE TABLE scratch (x INTEGER PRIMARY KEY, pad TEXT)"))

    def totals(conn):
        return conn.execute("SELECT count(*), coalesce(sum(x), 0) FROM scratch").fetchone()

    expected = (0, 0)
    for i in range(1, 7):
        rows = [(i * 1000 + j, "x" * 500) for j in range(100)]
        await store.write(lambda conn, rows=rows: conn.executemany("INSERT INTO scratch VALUES (?, ?)", rows))
        expected = (expected[0] + len(rows), expected[1] + sum(x for x, _pad in rows))
        if i % 2 == 0:  # into the database file (the writer keeps going meanwhile)
            other = connect(store.path, sync_mode="normal")
            try:
                other.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                other.close()
        assert tuple(await store.read(totals, owner=owner, inline=True)) == expected
    assert store._pool.inline_reads == 6
    assert store._inline_conn.execute("PRAGMA mmap_size").fetchone()[0] == 0  # see INLINE_CACHE_KIB
    # The mapped file never shrinks under the writer's mapping (see WRITER_MMAP_BYTES): no auto_vacuum.
    assert store._inline_conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    # The writer maps it too (the rows a write reads first are mostly not in its page cache).
    assert await store.write(lambda conn: conn.execute("PRAGMA mmap_size").fetchone()[0]) == WRITER_MMAP_BYTES


async def test_a_started_read_whose_waiter_is_gone_stops(store):
    """A REQ closed while its read runs on a reader thread (a pipelining client sends REQ then
    CLOSE): the read is abandoned at its next progress check, not run to its end; its thread and
    its owner's slot are free for the next read. Endless: only the cancellation can end it."""
    pool = use_pool(store, slice_seconds=3600)
    endless = LONG.replace("WHERE x < 3000000", "")
    answered: list = []
    handle = store.read_then(lambda conn: conn.execute(endless).fetchone()[0],
                             lambda result, exc: answered.append((result, exc)), owner="closer")
    while pool._started.get("closer", 0) == 0:
        await asyncio.sleep(0.001)
    handle.cancel()
    assert await asyncio.wait_for(store.read(short_read, owner="closer"), 60) == 42
    while pool._started.get("closer", 0):
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)  # a late `done` would have been scheduled on the loop by now
    assert answered == []
