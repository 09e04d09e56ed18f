"""A full disk: writes are refused with a clear `error:`, nothing acknowledged is lost or
corrupted, reads go on, and writes succeed again once space returns (a small tmpfs data dir)."""

from __future__ import annotations

import os
import sqlite3
import subprocess

import httpx
import pytest

from tests.conftest import Identity, Server

pytestmark = pytest.mark.anyio


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs (mounting needs root: the container runs the suite as root)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def grow(mnt, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)


async def fill(client, who: Identity, acked: list[str], refusals: list[str], n: int = 400) -> None:
    for i in range(n):
        ev = who.sign(1, [["t", "fill"]], f"{i} " + os.urandom(12_000).hex())  # ~24 KB each
        ok, msg = await client.publish(ev)
        if ok:
            acked.append(ev.id)
        else:
            refusals.append(msg)
            if len(refusals) >= 5:
                return


async def served(client, ids: list[str]) -> set[str]:
    out: set[str] = set()
    for i in range(0, len(ids), 200):
        events, closed = await client.req(f"s{i}", {"ids": ids[i:i + 200]})
        assert closed is None, closed
        out |= {e["id"] for e in events}
    return out


@pytest.mark.slow
@pytest.mark.sqlite_only("fills the data directory's filesystem, where SQLite keeps the database "
                        "(a PostgreSQL store's data lives with its server)")
async def test_a_full_disk_refuses_writes_clearly_and_recovers(small_disk, connect, tmp_path):
    server = Server(small_disk / "data")
    server.log_path = tmp_path / "server.log"  # not on the full disk
    server.start()
    try:
        alice = Identity()
        client = await connect(server.url)
        acked: list[str] = []
        refusals: list[str] = []
        await fill(client, alice, acked, refusals)
        assert acked, "nothing fitted at all"
        assert refusals, "the disk never filled"
        assert all(m.startswith("error: ") for m in refusals), refusals
        assert any("disk" in m or "space" in m for m in refusals), refusals
        # Reads go on, and every acknowledged event is there.
        assert await served(client, acked) == set(acked)
        health = httpx.get(server.http + "/admin/health", timeout=10)
        assert health.status_code == 503 and health.json()["checks"]["database_write"].startswith("failed")
        # Space returns: writes are accepted again without a restart.
        grow(small_disk, "64m")
        more: list[str] = []
        again: list[str] = []
        await fill(client, alice, more, again, n=20)
        assert again == [] and len(more) == 20
        assert await served(client, acked + more) == set(acked + more)
        assert httpx.get(server.http + "/admin/health", timeout=10).status_code == 200
    finally:
        server.stop()
    assert server.proc.returncode in (0, -15)  # stopped by our SIGTERM, not crashed
    db = sqlite3.connect(small_disk / "data" / "appliance.sqlite3")
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored = {r[0] for r in db.execute("SELECT id FROM events WHERE kind = 1")}
    finally:
        db.close()
    assert set(acked + more) <= stored
