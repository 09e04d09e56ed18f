"""NIP-86 calls' spent authorization events in the store: spent once, kept while the event's
time window is open, purged after it."""

from __future__ import annotations

from appliance.store.admin import spend_auth_event
from appliance.store.statement import SQL
from tests.store.test_wakes import conn  # noqa: F401 (fixture: a fresh database, SQLite or PostgreSQL)

T0 = 1_800_000_000


def stored(conn) -> list[tuple]:  # noqa: F811
    return conn.execute(SQL("SELECT event_id, expires_at FROM admin_auth_events ORDER BY event_id",
                            "SELECT event_id, expires_at FROM admin_auth_events ORDER BY event_id")).fetchall()


def test_an_event_is_spent_once_and_purged_after_its_window(conn):  # noqa: F811
    assert spend_auth_event(conn, "a" * 64, T0 + 61, T0)
    assert not spend_auth_event(conn, "a" * 64, T0 + 61, T0)
    assert not spend_auth_event(conn, "a" * 64, T0 + 61, T0 + 61)  # the last second of its window
    assert spend_auth_event(conn, "b" * 64, T0 + 70, T0 + 30)
    # Once a's window has closed, the next spend purges it; b is still kept.
    assert spend_auth_event(conn, "c" * 64, T0 + 122, T0 + 62)
    assert [row[0] for row in stored(conn)] == ["b" * 64, "c" * 64]
