"""The gateway's rows: challenges, installations (wrapped APNs token custody), delegations, delivery
fences (burned NIP-98 ids, reservations, endpoint quotas), grant sealing keys, and the read-only
views the dashboard shows. The rules live in `appliance.gateway.authority`; this module only reads
and writes rows. Nothing here returns an APNs token in the clear."""

from __future__ import annotations
from appliance.store.interface import Connection
from appliance.store.statement import SQL



SQL_PENDING_CHALLENGES = SQL(
    "SELECT count(*) FROM (SELECT 1 FROM gateway_challenges WHERE expires_at > ? LIMIT ?)",
    "SELECT count(*) FROM (SELECT 1 FROM gateway_challenges WHERE expires_at > %s LIMIT %s) AS _sub1",
)
SQL_PUT_CHALLENGE = SQL("INSERT INTO gateway_challenges (id, digest, expires_at) VALUES (?, ?, ?)",
                        "INSERT INTO gateway_challenges (id, digest, expires_at) VALUES (%s, %s, %s)")
SQL_CONSUME_CHALLENGE = SQL("DELETE FROM gateway_challenges WHERE id = ? AND digest = ? AND expires_at > ?",
                            "DELETE FROM gateway_challenges WHERE id = %s AND digest = %s AND expires_at > %s")
SQL_INSTALLATION = SQL(
    "SELECT handle, app_profile, public_key, sign_count, endpoint_epoch, token, token_sha256, expires_at, "
    "revoked_at FROM gateway_installations WHERE handle = ?",
    "SELECT handle, app_profile, public_key, sign_count, endpoint_epoch, token, token_sha256, expires_at, "
    "revoked_at FROM gateway_installations WHERE handle = %s",
)
SQL_KEY_ID_TAKEN = SQL("SELECT 1 FROM gateway_installations WHERE key_id = ?",
                       "SELECT 1 FROM gateway_installations WHERE key_id = %s")
SQL_TOKEN_OWNER = SQL(
    "SELECT handle, expires_at FROM gateway_installations WHERE app_profile = ? AND token_sha256 = ?",
    "SELECT handle, expires_at FROM gateway_installations WHERE app_profile = %s AND token_sha256 = %s",
)
SQL_INSERT_INSTALLATION = SQL(
    "INSERT INTO gateway_installations (handle, app_profile, key_id, public_key, sign_count, endpoint_epoch, "
    "token, token_sha256, expires_at, created_at) VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, ?)",
    "INSERT INTO gateway_installations (handle, app_profile, key_id, public_key, sign_count, endpoint_epoch, "
    "token, token_sha256, expires_at, created_at) VALUES (%s, %s, %s, %s, 0, %s, %s, %s, %s, %s)",
)
SQL_DELETE_INSTALLATION = SQL("DELETE FROM gateway_installations WHERE handle = ?",
                              "DELETE FROM gateway_installations WHERE handle = %s")
SQL_ADVANCE_COUNTER = SQL("UPDATE gateway_installations SET sign_count = ? WHERE handle = ? AND sign_count < ?",
                          "UPDATE gateway_installations SET sign_count = %s WHERE handle = %s AND sign_count < %s")
SQL_ROTATE = SQL(
    "UPDATE gateway_installations SET endpoint_epoch = ?, token = ?, token_sha256 = ? "
    "WHERE handle = ? AND endpoint_epoch = ? AND revoked_at IS NULL",
    "UPDATE gateway_installations SET endpoint_epoch = %s, token = %s, token_sha256 = %s "
    "WHERE handle = %s AND endpoint_epoch = %s AND revoked_at IS NULL",
)
SQL_REVOKE_INSTALLATION = SQL(
    "UPDATE gateway_installations SET endpoint_epoch = ?, revoked_at = ?, token = NULL, token_sha256 = NULL "
    "WHERE handle = ? AND endpoint_epoch = ? AND revoked_at IS NULL",
    "UPDATE gateway_installations SET endpoint_epoch = %s, revoked_at = %s, token = NULL, token_sha256 = NULL "
    "WHERE handle = %s AND endpoint_epoch = %s AND revoked_at IS NULL",
)
SQL_REVOKE_ALL_DELEGATIONS = SQL(
    "UPDATE gateway_delegations SET revoked_at = ? WHERE handle = ? AND revoked_at IS NULL",
    "UPDATE gateway_delegations SET revoked_at = %s WHERE handle = %s AND revoked_at IS NULL",
)
SQL_DELEGATION = SQL(
    "SELECT endpoint_epoch, generation, not_before, expires_at, revoked_at FROM gateway_delegations "
    "WHERE handle = ? AND relay_pubkey = ?",
    "SELECT endpoint_epoch, generation, not_before, expires_at, revoked_at FROM gateway_delegations "
    "WHERE handle = %s AND relay_pubkey = %s",
)
SQL_UPSERT_DELEGATION = SQL(
    "INSERT INTO gateway_delegations (handle, relay_pubkey, endpoint_epoch, generation, not_before, expires_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (handle, relay_pubkey) DO UPDATE SET "
    "endpoint_epoch = excluded.endpoint_epoch, generation = excluded.generation, "
    "not_before = excluded.not_before, expires_at = excluded.expires_at, revoked_at = NULL "
    "WHERE excluded.generation > gateway_delegations.generation",
    "INSERT INTO gateway_delegations (handle, relay_pubkey, endpoint_epoch, generation, not_before, expires_at) "
    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (handle, relay_pubkey) DO UPDATE SET "
    "endpoint_epoch = excluded.endpoint_epoch, generation = excluded.generation, "
    "not_before = excluded.not_before, expires_at = excluded.expires_at, revoked_at = NULL "
    "WHERE excluded.generation > gateway_delegations.generation",
)
SQL_REVOKE_DELEGATION = SQL(
    "UPDATE gateway_delegations SET revoked_at = ? WHERE handle = ? AND relay_pubkey = ? AND generation = ? "
    "AND revoked_at IS NULL",
    "UPDATE gateway_delegations SET revoked_at = %s WHERE handle = %s AND relay_pubkey = %s AND generation = %s "
    "AND revoked_at IS NULL",
)
SQL_RAISE_KEY_EXPIRY = SQL(
    "UPDATE gateway_grant_keys SET max_expires_at = max(max_expires_at, ?) WHERE key_id = ?",
    "UPDATE gateway_grant_keys SET max_expires_at = GREATEST(max_expires_at, %s) WHERE key_id = %s",
)
SQL_BURN_EVENT = SQL("INSERT INTO gateway_auth_events (event_id, expires_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                     "INSERT INTO gateway_auth_events (event_id, expires_at) VALUES (%s, %s) ON CONFLICT DO NOTHING")
SQL_RESERVE = SQL(
    "INSERT INTO gateway_reservations (relay_pubkey, request_id, expires_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
    "INSERT INTO gateway_reservations (relay_pubkey, request_id, expires_at) VALUES (%s, %s, %s) ON CONFLICT "
    "DO NOTHING",
)
SQL_QUOTA = SQL(
    "SELECT window_start, admitted FROM gateway_endpoint_quota WHERE app_profile = ? AND token_sha256 = ?",
    "SELECT window_start, admitted FROM gateway_endpoint_quota WHERE app_profile = %s AND token_sha256 = %s",
)
SQL_QUOTA_SET = SQL(
    "INSERT INTO gateway_endpoint_quota (app_profile, token_sha256, window_start, admitted) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (app_profile, token_sha256) DO UPDATE SET window_start = excluded.window_start, "
    "admitted = excluded.admitted",
    "INSERT INTO gateway_endpoint_quota (app_profile, token_sha256, window_start, admitted) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (app_profile, token_sha256) DO UPDATE SET window_start = excluded.window_start, "
    "admitted = excluded.admitted",
)
SQL_RELEASE = SQL("DELETE FROM gateway_reservations WHERE relay_pubkey = ? AND request_id = ?",
                  "DELETE FROM gateway_reservations WHERE relay_pubkey = %s AND request_id = %s")
SQL_GRANT_KEYS = SQL(
    "SELECT key_id, wrapped, state, created_at, retired_at, max_expires_at FROM gateway_grant_keys "
    "ORDER BY created_at, key_id",
    "SELECT key_id, wrapped, state, created_at, retired_at, max_expires_at FROM gateway_grant_keys "
    "ORDER BY created_at, key_id",
)
SQL_INSERT_GRANT_KEY = SQL(
    "INSERT INTO gateway_grant_keys (key_id, wrapped, state, created_at) VALUES (?, ?, 'current', ?)",
    "INSERT INTO gateway_grant_keys (key_id, wrapped, state, created_at) VALUES (%s, %s, 'current', %s)",
)
SQL_RETIRE_GRANT_KEY = SQL("UPDATE gateway_grant_keys SET state = 'retired', retired_at = ? WHERE state = 'current'",
                           "UPDATE gateway_grant_keys SET state = 'retired', retired_at = %s WHERE state = 'current'")
SQL_ERASE_GRANT_KEYS = SQL(
    "UPDATE gateway_grant_keys SET wrapped = NULL WHERE state = 'retired' AND wrapped IS NOT NULL "
    "AND max_expires_at < ?",
    "UPDATE gateway_grant_keys SET wrapped = NULL WHERE state = 'retired' AND wrapped IS NOT NULL "
    "AND max_expires_at < %s",
)
SQL_PURGE = (
    SQL("DELETE FROM gateway_challenges WHERE expires_at <= ?",
        "DELETE FROM gateway_challenges WHERE expires_at <= %s"),
    SQL("DELETE FROM gateway_auth_events WHERE expires_at < ?",
        "DELETE FROM gateway_auth_events WHERE expires_at < %s"),
    SQL("DELETE FROM gateway_reservations WHERE expires_at < ?",
        "DELETE FROM gateway_reservations WHERE expires_at < %s"),
    # Expired installations go with their delegations (ON DELETE CASCADE); revoked ones stay as
    # tombstones (their handle and key id stay taken) until their own expiry.
    SQL("DELETE FROM gateway_installations WHERE expires_at < ?",
        "DELETE FROM gateway_installations WHERE expires_at < %s"),
)
SQL_PURGE_QUOTA = SQL("DELETE FROM gateway_endpoint_quota WHERE window_start <= ?",
                      "DELETE FROM gateway_endpoint_quota WHERE window_start <= %s")


# -- challenges ----------------------------------------------------------------------------------

def pending_challenges(conn: Connection, now: int, cap: int) -> int:
    """Unexpired challenges waiting, counted up to `cap`."""
    (pending,) = conn.execute(SQL_PENDING_CHALLENGES, (now, cap)).fetchone()
    return pending


def put_challenge(conn: Connection, challenge_id: str, digest: bytes, expires_at: int) -> None:
    conn.execute(SQL_PUT_CHALLENGE, (challenge_id, digest, expires_at))


def consume_challenge(conn: Connection, challenge_id: str, digest: bytes, now: int) -> bool:
    conn.execute(SQL_CONSUME_CHALLENGE, (challenge_id, digest, now))
    return conn.changes() == 1


# -- installations -------------------------------------------------------------------------------

def installation_row(conn: Connection, handle: str) -> tuple | None:
    """(handle, app_profile, public_key, sign_count, endpoint_epoch, token, token_sha256, expires_at,
    revoked_at) of an installation."""
    return conn.execute(SQL_INSTALLATION, (handle,)).fetchone()


def key_id_taken(conn: Connection, key_id: bytes) -> bool:
    return conn.execute(SQL_KEY_ID_TAKEN, (key_id,)).fetchone() is not None


def token_owner(conn: Connection, profile: str, digest: bytes) -> tuple[str, int] | None:
    """(handle, expires_at) of the installation holding (profile, SHA-256(token)), if any."""
    return conn.execute(SQL_TOKEN_OWNER, (profile, digest)).fetchone()


def delete_installation(conn: Connection, handle: str) -> None:
    conn.execute(SQL_DELETE_INSTALLATION, (handle,))


def insert_installation(conn: Connection, *, handle: str, profile: str, key_id: bytes, public_key: bytes,
                        epoch: int, wrapped_token: bytes, digest: bytes, expires_at: int, now: int) -> None:
    conn.execute(SQL_INSERT_INSTALLATION, (handle, profile, key_id, public_key, epoch, wrapped_token, digest,
                                           expires_at, now))


def advance_counter(conn: Connection, handle: str, counter: int) -> bool:
    """Raise the stored sign counter to `counter` if it is strictly above it."""
    conn.execute(SQL_ADVANCE_COUNTER, (counter, handle, counter))
    return conn.changes() == 1


def rotate_token(conn: Connection, handle: str, epoch: int, new_epoch: int, wrapped_token: bytes,
                 digest: bytes) -> bool:
    conn.execute(SQL_ROTATE, (new_epoch, wrapped_token, digest, handle, epoch))
    return conn.changes() == 1


def revoke_installation(conn: Connection, handle: str, epoch: int, new_epoch: int, now: int) -> bool:
    """Revoke the installation at `epoch` and every delegation it made; False if it was not at `epoch`."""
    conn.execute(SQL_REVOKE_INSTALLATION, (new_epoch, now, handle, epoch))
    if conn.changes() != 1:
        return False
    conn.execute(SQL_REVOKE_ALL_DELEGATIONS, (now, handle))
    return True


# -- delegations ---------------------------------------------------------------------------------

def delegation_row(conn: Connection, handle: str, relay_pubkey: str) -> tuple | None:
    """(endpoint_epoch, generation, not_before, expires_at, revoked_at)."""
    return conn.execute(SQL_DELEGATION, (handle, relay_pubkey)).fetchone()


def upsert_delegation(conn: Connection, handle: str, relay_pubkey: str, epoch: int, generation: int,
                      not_before: int, expires_at: int) -> bool:
    """Record the delegation if its generation is above the stored one."""
    conn.execute(SQL_UPSERT_DELEGATION, (handle, relay_pubkey, epoch, generation, not_before, expires_at))
    return conn.changes() == 1


def revoke_delegation(conn: Connection, handle: str, relay_pubkey: str, generation: int, now: int) -> bool:
    conn.execute(SQL_REVOKE_DELEGATION, (now, handle, relay_pubkey, generation))
    return conn.changes() == 1


def raise_key_expiry(conn: Connection, grant_key_id: str, expires_at: int) -> None:
    conn.execute(SQL_RAISE_KEY_EXPIRY, (expires_at, grant_key_id))


# -- delivery fences -----------------------------------------------------------------------------

def burn_event(conn: Connection, event_id: str, expires_at: int) -> bool:
    """Burn a NIP-98 event id; False if it was burned before (a replay)."""
    conn.execute(SQL_BURN_EVENT, (event_id, expires_at))
    return conn.changes() == 1


def quota(conn: Connection, profile: str, digest: bytes) -> tuple[int, int] | None:
    """(window_start, admitted) of an endpoint's quota window."""
    return conn.execute(SQL_QUOTA, (profile, digest)).fetchone()


def set_quota(conn: Connection, profile: str, digest: bytes, window_start: int, admitted: int) -> None:
    conn.execute(SQL_QUOTA_SET, (profile, digest, window_start, admitted))


def reserve(conn: Connection, relay_pubkey: str, request_id: str, expires_at: int) -> bool:
    """Reserve (relay, request id); False if it is in flight or finished."""
    conn.execute(SQL_RESERVE, (relay_pubkey, request_id, expires_at))
    return conn.changes() == 1


def release(conn: Connection, relay_pubkey: str, request_id: str) -> None:
    conn.execute(SQL_RELEASE, (relay_pubkey, request_id))


# -- grant keys ----------------------------------------------------------------------------------

def grant_key_rows(conn: Connection) -> list[tuple]:
    """(key_id, wrapped, state, created_at, retired_at, max_expires_at), oldest first."""
    return conn.execute(SQL_GRANT_KEYS).fetchall()


def insert_grant_key(conn: Connection, key_id: str, wrapped: bytes, now: int) -> None:
    conn.execute(SQL_INSERT_GRANT_KEY, (key_id, wrapped, now))


def retire_grant_key(conn: Connection, now: int) -> None:
    conn.execute(SQL_RETIRE_GRANT_KEY, (now,))


# -- retention -----------------------------------------------------------------------------------

def maintain(conn: Connection, now: int, quota_window: int) -> int:
    """Drop what no rule needs any more; erase grant keys whose grants have all expired.
    Returns how many key secrets were erased (the caller scrubs the WAL then)."""
    for sql in SQL_PURGE:
        conn.execute(sql, (now,))
    conn.execute(SQL_PURGE_QUOTA, (now - quota_window,))
    conn.execute(SQL_ERASE_GRANT_KEYS, (now,))
    return conn.changes()


# -- operator views (the dashboard's Gateway page) -------------------------------------------------
# Nothing here returns an APNs token, a wrapped secret or an App Attest key; installation handles,
# token digests and relay pubkeys are returned for the caller to redact.

SQL_INSTALLATIONS = SQL(
    "SELECT handle, app_profile, endpoint_epoch, token_sha256, sign_count, created_at, expires_at, revoked_at "
    "FROM gateway_installations ORDER BY created_at DESC LIMIT ? OFFSET ?",
    "SELECT handle, app_profile, endpoint_epoch, token_sha256, sign_count, created_at, expires_at, revoked_at "
    "FROM gateway_installations ORDER BY created_at DESC LIMIT %s OFFSET %s",
)
SQL_INSTALLATION_COUNTS = SQL(
    "SELECT app_profile, sum(revoked_at IS NULL AND expires_at >= ?), sum(revoked_at IS NOT NULL), count(*) "
    "FROM gateway_installations GROUP BY app_profile ORDER BY app_profile",
    "SELECT app_profile, sum(revoked_at IS NULL AND expires_at >= %s), sum(revoked_at IS NOT NULL), count(*) "
    "FROM gateway_installations GROUP BY app_profile ORDER BY app_profile",
)
SQL_DELEGATIONS = SQL(
    "SELECT handle, relay_pubkey, endpoint_epoch, generation, not_before, expires_at, revoked_at "
    "FROM gateway_delegations ORDER BY not_before DESC LIMIT ? OFFSET ?",
    "SELECT handle, relay_pubkey, endpoint_epoch, generation, not_before, expires_at, revoked_at "
    "FROM gateway_delegations ORDER BY not_before DESC LIMIT %s OFFSET %s",
)
SQL_DELEGATION_COUNT = SQL("SELECT count(*), sum(revoked_at IS NULL AND expires_at >= ?) FROM gateway_delegations",
                           "SELECT count(*), sum(revoked_at IS NULL AND expires_at >= %s) FROM gateway_delegations")
SQL_RESERVATIONS = SQL(
    "SELECT relay_pubkey, count(*), sum(expires_at >= ?), max(expires_at) FROM gateway_reservations "
    "GROUP BY relay_pubkey ORDER BY count(*) DESC LIMIT ?",
    "SELECT relay_pubkey, count(*), sum(expires_at >= %s), max(expires_at) FROM gateway_reservations "
    "GROUP BY relay_pubkey ORDER BY count(*) DESC LIMIT %s",
)
SQL_QUOTA_USAGE = SQL(
    "SELECT app_profile, token_sha256, window_start, admitted FROM gateway_endpoint_quota "
    "ORDER BY admitted DESC, window_start DESC LIMIT ?",
    "SELECT app_profile, token_sha256, window_start, admitted FROM gateway_endpoint_quota "
    "ORDER BY admitted DESC, window_start DESC LIMIT %s",
)


def installations(conn: Connection, limit: int = 100, offset: int = 0) -> list[dict]:
    keys = ("handle", "app_profile", "endpoint_epoch", "token_sha256", "sign_count", "created_at", "expires_at",
            "revoked_at")
    return [dict(zip(keys, row)) for row in conn.execute(SQL_INSTALLATIONS, (limit, offset))]


def installation_counts(conn: Connection, now: int) -> list[tuple[str, int, int, int]]:
    """(app profile, active, revoked, rows) per profile."""
    return [(p, a or 0, r or 0, n) for p, a, r, n in conn.execute(SQL_INSTALLATION_COUNTS, (now,))]


def delegations(conn: Connection, limit: int = 100, offset: int = 0) -> list[dict]:
    keys = ("handle", "relay_pubkey", "endpoint_epoch", "generation", "not_before", "expires_at", "revoked_at")
    return [dict(zip(keys, row)) for row in conn.execute(SQL_DELEGATIONS, (limit, offset))]


def delegation_count(conn: Connection, now: int) -> tuple[int, int]:
    """(rows, active)."""
    n, active = conn.execute(SQL_DELEGATION_COUNT, (now,)).fetchone()
    return n or 0, active or 0


def reservations(conn: Connection, now: int, limit: int = 20) -> list[tuple[str, int, int, int]]:
    """(relay pubkey, reservations, those still fencing their request id, latest expiry) for the busiest
    relays. A reservation is kept from send-begin (in flight, then a terminal outcome) until its
    request's expiry; transient outcomes delete theirs."""
    return [(pk, n, t or 0, e) for pk, n, t, e in conn.execute(SQL_RESERVATIONS, (now, limit))]


def quota_usage(conn: Connection, limit: int = 20) -> list[tuple[str, bytes, int, int]]:
    """(app profile, token digest, window start, admitted) for the most used endpoints."""
    return conn.execute(SQL_QUOTA_USAGE, (limit,)).fetchall()
