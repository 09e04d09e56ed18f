"""sync_mode full on SQLite: a write is answered only once its commit is synced to disk, by the
WAL syncer beside the writer (the writer meanwhile builds the next batch); when the WAL cannot be
synced, the write is answered with an error, never with success."""

from __future__ import annotations

import asyncio
import logging
import os

import apsw
import pytest

from appliance.store.sqlite import SqliteStore
from appliance.store.statement import SQL

pytestmark = pytest.mark.sqlite_only("the WAL syncer is SQLite's")

SQL_TABLE = SQL("CREATE TABLE IF NOT EXISTS t (v INTEGER)", "CREATE TABLE IF NOT EXISTS t (v INTEGER)")
SQL_INSERT = SQL("INSERT INTO t (v) VALUES (?)", "INSERT INTO t (v) VALUES (%s)")
SQL_COUNT = SQL("SELECT count(*) FROM t", "SELECT count(*) FROM t")


def insert(v):
    return lambda conn: conn.execute(SQL_INSERT, (v,))


async def write_many(store: SqliteStore, n: int) -> list:
    return await asyncio.gather(*(store.write(insert(i)) for i in range(n)), return_exceptions=True)


def test_full_commits_without_fsync_and_answers_after_the_syncers(tmp_path):
    store = SqliteStore(tmp_path, sync_mode="full").open()
    try:
        store.write_sync(lambda conn: conn.execute(SQL_TABLE))
        writer = store._writer
        synced = writer._syncer.syncs
        assert synced >= 1  # the first answer already waited for one
        for _ in range(5):
            results = asyncio.run(write_many(store, 300))
            assert not [r for r in results if isinstance(r, BaseException)]
            assert writer._syncer.syncs > synced  # every round of answers came after a sync
            synced = writer._syncer.syncs
        assert synced <= writer.commits + 1  # a sync never waits for nothing; several commits may share one
        # The writer's own commits do not fsync (the syncer does); other connections keep FULL.
        assert writer._conn.execute("PRAGMA synchronous").fetchone() == (1,)
        assert store.read_sync(lambda c: c.execute(SQL_COUNT).fetchone()) == (1500,)
    finally:
        store.close()


def test_normal_has_no_syncer(tmp_path):
    store = SqliteStore(tmp_path, sync_mode="normal").open()
    try:
        store.write_sync(lambda conn: conn.execute(SQL_TABLE))
        assert store._writer._syncer is None
    finally:
        store.close()


def test_a_wal_that_cannot_be_synced_answers_errors_not_success(tmp_path, caplog):
    store = SqliteStore(tmp_path, sync_mode="full").open()
    try:
        store.write_sync(lambda conn: conn.execute(SQL_TABLE))
        (tmp_path / "appliance.sqlite3-wal").unlink()  # SQLite goes on writing its open file
        caplog.set_level(logging.ERROR, logger="appliance.store")
        results = asyncio.run(write_many(store, 50))
        assert len(results) == 50 and all(isinstance(r, apsw.IOError) for r in results), results[:3]
        assert "syncing the WAL to disk failed" in str(results[0])
        failed = [r for r in caplog.records if "syncing the WAL to disk failed" in r.getMessage()]
        assert len(failed) == 1  # logged once for the outage, not per write
    finally:
        store.close()


def test_a_symlinked_database_syncs_the_wal_sqlite_writes(tmp_path):
    # SQLite names the WAL after the database file it resolved, beside the link's target.
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "appliance.sqlite3").touch(mode=0o600)
    data = tmp_path / "data"
    data.mkdir()
    (data / "appliance.sqlite3").symlink_to(disk / "appliance.sqlite3")
    store = SqliteStore(data, sync_mode="full").open()
    try:
        store.write_sync(lambda conn: conn.execute(SQL_TABLE))
        results = asyncio.run(write_many(store, 20))
        assert not [r for r in results if isinstance(r, BaseException)], results[:3]
        assert store._writer._syncer.wal.samefile(disk / "appliance.sqlite3-wal")
    finally:
        store.close()


def test_a_wal_replaced_under_sqlite_is_not_synced_instead(tmp_path):
    store = SqliteStore(tmp_path, sync_mode="full").open()
    try:
        store.write_sync(lambda conn: conn.execute(SQL_TABLE))
        wal = tmp_path / "appliance.sqlite3-wal"
        wal.unlink()  # SQLite goes on writing the file it has open, not this new one
        wal.touch()
        results = asyncio.run(write_many(store, 20))
        assert len(results) == 20 and all(isinstance(r, apsw.IOError) for r in results), results[:3]
    finally:
        store.close()


def test_no_write_is_answered_as_synced_after_a_sync_failed(tmp_path):
    # After a failed fsync Linux may drop the unwritten pages and let the next fsync succeed: the
    # commits after them in the WAL would be answered as durable yet lost with them.
    store = SqliteStore(tmp_path, sync_mode="full").open()
    try:
        store.write_sync(lambda conn: conn.execute(SQL_TABLE))
        syncer = store._writer._syncer
        wal_fd = syncer._fd
        r, w = os.pipe()
        try:
            syncer._fd = r  # fdatasync of a pipe fails (EINVAL): a sync failing once
            with pytest.raises(apsw.IOError):
                store.write_sync(insert(1))
        finally:
            syncer._fd = wal_fd
            os.close(r)
            os.close(w)
        results = asyncio.run(write_many(store, 20))
        assert all(isinstance(r, apsw.IOError) for r in results), results[:3]
        assert store.read_sync(lambda c: c.execute(SQL_COUNT).fetchone()) == (1,)  # nothing more written
    finally:
        store.close()
