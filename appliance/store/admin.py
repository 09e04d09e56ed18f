"""The dashboard's rows: the operator password and setup token, sessions, moderation notes,
settings saved from the dashboard, and NIP-86 calls' spent authorization events. Functions take a
store connection (store.interface; writes inside the writer's transaction)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from appliance.store.interface import Connection
from appliance.store.statement import SQL


SQL_AUTH = SQL("SELECT password_hash, setup_token_hash, setup_token_expires, changed_at FROM admin_auth WHERE id = 1",
               "SELECT password_hash, setup_token_hash, setup_token_expires, changed_at FROM admin_auth WHERE id = 1")
SQL_SET_PASSWORD = SQL(
    "UPDATE admin_auth SET password_hash = ?, setup_token_hash = NULL, setup_token_expires = NULL, "
    "changed_at = ? WHERE id = 1",
    "UPDATE admin_auth SET password_hash = %s, setup_token_hash = NULL, setup_token_expires = NULL, "
    "changed_at = %s WHERE id = 1",
)
SQL_SET_TOKEN = SQL("UPDATE admin_auth SET setup_token_hash = ?, setup_token_expires = ? WHERE id = 1",
                    "UPDATE admin_auth SET setup_token_hash = %s, setup_token_expires = %s WHERE id = 1")
SQL_CLEAR_PASSWORD = SQL("UPDATE admin_auth SET password_hash = NULL, changed_at = ? WHERE id = 1",
                         "UPDATE admin_auth SET password_hash = NULL, changed_at = %s WHERE id = 1")
# Spends the token: only one request can see its hash match (the writer is single-threaded).
SQL_SPEND_TOKEN = SQL(
    "UPDATE admin_auth SET setup_token_hash = NULL, setup_token_expires = NULL "
    "WHERE id = 1 AND setup_token_hash = ? AND setup_token_expires > ?",
    "UPDATE admin_auth SET setup_token_hash = NULL, setup_token_expires = NULL "
    "WHERE id = 1 AND setup_token_hash = %s AND setup_token_expires > %s",
)

SQL_SESSION = SQL("SELECT created_at, expires_at FROM admin_sessions WHERE id_hash = ?",
                  "SELECT created_at, expires_at FROM admin_sessions WHERE id_hash = %s")
SQL_NEW_SESSION = SQL("INSERT INTO admin_sessions (id_hash, created_at, expires_at) VALUES (?, ?, ?)",
                      "INSERT INTO admin_sessions (id_hash, created_at, expires_at) VALUES (%s, %s, %s)")
SQL_END_SESSION = SQL("DELETE FROM admin_sessions WHERE id_hash = ?", "DELETE FROM admin_sessions WHERE id_hash = %s")
SQL_END_ALL_SESSIONS = SQL("DELETE FROM admin_sessions", "DELETE FROM admin_sessions")
SQL_PURGE_SESSIONS = SQL("DELETE FROM admin_sessions WHERE expires_at <= ?",
                         "DELETE FROM admin_sessions WHERE expires_at <= %s")

SQL_NOTES = SQL(
    "SELECT value, reason, created_at FROM moderation_notes WHERE origin = ? AND subject = ? ORDER BY value",
    "SELECT value, reason, created_at FROM moderation_notes WHERE origin = %s AND subject = %s ORDER BY value",
)
SQL_SAVE_NOTE = SQL(
    "INSERT INTO moderation_notes (origin, subject, value, reason, created_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (origin, subject, value) DO UPDATE SET reason = excluded.reason, created_at = excluded.created_at",
    "INSERT INTO moderation_notes (origin, subject, value, reason, created_at) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (origin, subject, value) DO UPDATE SET reason = excluded.reason, created_at = excluded.created_at",
)
SQL_DROP_NOTE = SQL("DELETE FROM moderation_notes WHERE origin = ? AND subject = ? AND value = ?",
                    "DELETE FROM moderation_notes WHERE origin = %s AND subject = %s AND value = %s")

# A NIP-86 call's authorization event is spent by the insert itself: of two requests (or nodes)
# carrying one event, only one inserts the row (its primary key), whatever the order.
SQL_SPEND_AUTH_EVENT = SQL(
    "INSERT INTO admin_auth_events (event_id, expires_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
    "INSERT INTO admin_auth_events (event_id, expires_at) VALUES (%s, %s) ON CONFLICT DO NOTHING",
)
SQL_PURGE_AUTH_EVENTS = SQL("DELETE FROM admin_auth_events WHERE expires_at < ?",
                            "DELETE FROM admin_auth_events WHERE expires_at < %s")

SQL_STORED_SETTINGS = SQL("SELECT name, value FROM stored_settings", "SELECT name, value FROM stored_settings")
SQL_SAVE_SETTING = SQL(
    "INSERT INTO stored_settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    "INSERT INTO stored_settings (name, value) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
)
SQL_DROP_SETTING = SQL("DELETE FROM stored_settings WHERE name = ?", "DELETE FROM stored_settings WHERE name = %s")

NOTE_SUBJECTS = ("banned_pubkey", "allowed_pubkey", "banned_event", "allowed_event", "blocked_ip")


@dataclass(frozen=True)
class AuthRow:
    password_hash: str | None
    setup_token_hash: str | None
    setup_token_expires: int | None
    changed_at: int


def auth_row(conn: Connection) -> AuthRow:
    return AuthRow(*conn.execute(SQL_AUTH).fetchone())


def set_password(conn: Connection, password_hash: str, now: int) -> None:
    """Set the password; any setup token is spent and every session ends."""
    conn.execute(SQL_SET_PASSWORD, (password_hash, now))
    conn.execute(SQL_END_ALL_SESSIONS)


def set_setup_token(conn: Connection, token_hash: str, expires: int) -> None:
    conn.execute(SQL_SET_TOKEN, (token_hash, expires))


def clear_password(conn: Connection, now: int) -> None:
    """Forget the password and end every session (`appliance admin reset`)."""
    conn.execute(SQL_CLEAR_PASSWORD, (now,))
    conn.execute(SQL_END_ALL_SESSIONS)


def spend_setup_token(conn: Connection, token_hash: str, now: int) -> bool:
    conn.execute(SQL_SPEND_TOKEN, (token_hash, now))
    return conn.changes() == 1


def session_row(conn: Connection, id_hash: str) -> tuple[int, int] | None:
    return conn.execute(SQL_SESSION, (id_hash,)).fetchone()


def new_session(conn: Connection, id_hash: str, now: int, expires: int) -> None:
    conn.execute(SQL_PURGE_SESSIONS, (now,))
    conn.execute(SQL_NEW_SESSION, (id_hash, now, expires))


def end_session(conn: Connection, id_hash: str) -> None:
    conn.execute(SQL_END_SESSION, (id_hash,))


def notes(conn: Connection, origin: int, subject: str) -> dict[str, tuple[str, int]]:
    """value -> (reason, created_at) of one origin's notes on one subject."""
    return {value: (reason, created) for value, reason, created in conn.execute(SQL_NOTES, (origin, subject))}


def save_note(conn: Connection, origin: int, subject: str, value: str, reason: str, now: int) -> None:
    conn.execute(SQL_SAVE_NOTE, (origin, subject, value, reason, now))


def drop_note(conn: Connection, origin: int, subject: str, value: str) -> None:
    conn.execute(SQL_DROP_NOTE, (origin, subject, value))


def spend_auth_event(conn: Connection, event_id: str, expires_at: int, now: int) -> bool:
    """Spend a NIP-86 call's authorization event (kept until `expires_at`); False if it was spent
    before, by this node or another. Spent events whose window has closed go first."""
    conn.execute(SQL_PURGE_AUTH_EVENTS, (now,))
    conn.execute(SQL_SPEND_AUTH_EVENT, (event_id, expires_at))
    return conn.changes() == 1


def stored_settings(conn: Connection) -> dict[str, Any]:
    return {name: json.loads(value) for name, value in conn.execute(SQL_STORED_SETTINGS)}


def save_setting(conn: Connection, name: str, value: Any) -> None:
    conn.execute(SQL_SAVE_SETTING, (name, json.dumps(value)))


def drop_setting(conn: Connection, name: str) -> None:
    conn.execute(SQL_DROP_SETTING, (name,))
