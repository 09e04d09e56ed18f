"""The schema as a `user_version` migration ladder; a newer schema than we know is refused."""

from __future__ import annotations

import logging
import time

from appliance.errors import SchemaTooNew, StoreError
from appliance.store.interface import Connection

log = logging.getLogger("appliance.store")

# Each entry migrates from version i to i+1. Never edit a shipped step: append a new one.
MIGRATIONS: tuple[str, ...] = (
    # 1: origins, events, tag index, deletions, settings.
    """
    CREATE TABLE origins (
        id          INTEGER PRIMARY KEY,
        origin      TEXT NOT NULL UNIQUE,     -- canonical origin string, e.g. wss://chat.example.org
        config      TEXT NOT NULL DEFAULT '{}' -- JSON: hosts, path, nip11 fields, policy, lists
    );

    CREATE TABLE events (
        rowid       INTEGER PRIMARY KEY,
        origin      INTEGER NOT NULL REFERENCES origins(id),
        id          TEXT NOT NULL,
        pubkey      TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        kind        INTEGER NOT NULL,
        d           TEXT,                     -- address key of replaceable ('') / addressable (d tag)
        grp         TEXT,                     -- NIP-29 group (first h tag), NULL outside groups
        expiration  INTEGER,                  -- NIP-40, NULL when absent
        raw         TEXT NOT NULL             -- the event exactly as served
    );
    CREATE UNIQUE INDEX events_id ON events(origin, id);
    CREATE INDEX events_author ON events(origin, pubkey, created_at);
    CREATE INDEX events_kind ON events(origin, kind, created_at);
    CREATE INDEX events_time ON events(origin, created_at);
    CREATE INDEX events_address ON events(origin, pubkey, kind, d) WHERE d IS NOT NULL;
    CREATE INDEX events_expiration ON events(expiration) WHERE expiration IS NOT NULL;
    CREATE INDEX events_grp ON events(origin, grp, created_at) WHERE grp IS NOT NULL;

    -- One row per distinct (single-letter tag name, first value) of an event.
    CREATE TABLE tags (
        event       INTEGER NOT NULL REFERENCES events(rowid) ON DELETE CASCADE,
        origin      INTEGER NOT NULL,
        name        TEXT NOT NULL,
        value       TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE INDEX tags_lookup ON tags(origin, name, value, created_at);
    CREATE INDEX tags_event ON tags(event);

    -- NIP-09: what an author deleted, so it cannot be published again.
    CREATE TABLE deletions (
        origin      INTEGER NOT NULL,
        target      TEXT NOT NULL,            -- event id, or kind:pubkey:d coordinate
        pubkey      TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (origin, target, pubkey)
    ) WITHOUT ROWID;

    CREATE TABLE meta (
        name        TEXT PRIMARY KEY,
        value       TEXT NOT NULL
    ) WITHOUT ROWID;
    """,
    # 2: NIP-29 groups, per-origin relay signing keys, a change counter for out-of-process edits.
    """
    CREATE TABLE groups (
        origin      INTEGER NOT NULL REFERENCES origins(id),
        h           TEXT NOT NULL,
        name        TEXT NOT NULL DEFAULT '',
        about       TEXT NOT NULL DEFAULT '',
        picture     TEXT NOT NULL DEFAULT '',
        closed      INTEGER NOT NULL DEFAULT 0,   -- 1: joining needs an admin
        private     INTEGER NOT NULL DEFAULT 0,   -- 1: only members read
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (origin, h)
    ) WITHOUT ROWID;

    CREATE TABLE group_members (
        origin      INTEGER NOT NULL,
        h           TEXT NOT NULL,
        pubkey      TEXT NOT NULL,
        role        TEXT NOT NULL DEFAULT '',     -- '' member, 'admin'
        PRIMARY KEY (origin, h, pubkey),
        FOREIGN KEY (origin, h) REFERENCES groups(origin, h) ON DELETE CASCADE
    ) WITHOUT ROWID;

    -- Per-origin relay identity (signs NIP-29 39000-39002), wrapped by the key file.
    CREATE TABLE relay_keys (
        origin      INTEGER PRIMARY KEY REFERENCES origins(id),
        pubkey      TEXT NOT NULL,
        wrapped     BLOB NOT NULL
    );

    INSERT INTO meta (name, value) VALUES ('config_generation', '0');
    """,
    # 3: NIP-PL push executor: executor keys, effective lease state, watermarks, match index.
    """
    CREATE TABLE executor_keys (
        origin      INTEGER NOT NULL REFERENCES origins(id),
        key_id      TEXT NOT NULL,
        pubkey      TEXT NOT NULL,
        wrapped     BLOB,                     -- secret wrapped by the key file; NULL once erased
        state       TEXT NOT NULL CHECK (state IN ('current', 'retiring', 'expired')),
        created_at  INTEGER NOT NULL,
        became_retiring_at INTEGER,
        accept_until INTEGER,                 -- retiring: became_retiring_at + max_lease_ttl + allowed_skew
        PRIMARY KEY (origin, key_id)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX executor_keys_current ON executor_keys(origin) WHERE state = 'current';

    -- Effective push state: one row per lease address, written with the stored event.
    CREATE TABLE leases (
        origin      INTEGER NOT NULL,
        pubkey      TEXT NOT NULL,
        d           TEXT NOT NULL,
        event_id    TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        expiration  INTEGER NOT NULL,
        generation  INTEGER NOT NULL,
        active      INTEGER NOT NULL,
        app_profile TEXT,
        transport   TEXT,
        endpoint    TEXT,                     -- NULL for tombstones
        endpoint_hash TEXT,
        subscriptions TEXT NOT NULL DEFAULT '[]',
        exec_key_id TEXT NOT NULL,
        PRIMARY KEY (origin, pubkey, d)
    ) WITHOUT ROWID;
    CREATE INDEX leases_expiration ON leases(expiration);
    CREATE INDEX leases_exec_key ON leases(origin, exec_key_id);

    CREATE TABLE lease_watermarks (
        origin      INTEGER NOT NULL,
        pubkey      TEXT NOT NULL,
        d           TEXT NOT NULL,
        generation  INTEGER NOT NULL,
        last_active_expiration INTEGER,
        tombstone_accepted_at INTEGER,
        retain_until INTEGER NOT NULL,
        PRIMARY KEY (origin, pubkey, d)
    ) WITHOUT ROWID;
    CREATE INDEX lease_watermarks_retain ON lease_watermarks(retain_until);

    -- Match index of active leases: selector_type 'p' | 'h' | 'authors'.
    CREATE TABLE lease_selectors (
        origin      INTEGER NOT NULL,
        selector_type TEXT NOT NULL,
        value       TEXT NOT NULL,
        pubkey      TEXT NOT NULL,
        d           TEXT NOT NULL,
        PRIMARY KEY (origin, selector_type, value, pubkey, d)
    ) WITHOUT ROWID;
    CREATE INDEX lease_selectors_address ON lease_selectors(origin, pubkey, d);
    """,
    # 4: an endpoint index early development databases carry (the uniqueness check reads the author's
    # few active leases through the primary key instead); every database ends with the same schema.
    """
    DROP INDEX IF EXISTS leases_endpoint;
    """,
    # 5: the optional APNs gateway (NIP-PL, Public APNs Gateway Profile): installations with their
    # APNs tokens in encrypted custody, relay delegations, grant keys, challenges, and the delivery
    # replay/quota fences. No other part reads these tables.
    """
    CREATE TABLE gateway_challenges (
        id          TEXT PRIMARY KEY,         -- canonical UUID
        digest      BLOB NOT NULL,            -- SHA-256 of the 32 challenge bytes
        expires_at  INTEGER NOT NULL          -- single use, 300 s
    ) WITHOUT ROWID;
    CREATE INDEX gateway_challenges_expiry ON gateway_challenges(expires_at);

    CREATE TABLE gateway_installations (
        handle      TEXT PRIMARY KEY,         -- canonical UUID, the client's installation_handle
        app_profile TEXT NOT NULL,
        key_id      BLOB NOT NULL UNIQUE,     -- App Attest key id (32 bytes)
        public_key  BLOB NOT NULL,            -- attested P-256 key, uncompressed point
        sign_count  INTEGER NOT NULL,         -- last accepted assertion counter
        endpoint_epoch INTEGER NOT NULL,
        token       BLOB,                     -- APNs token wrapped by the key file; NULL once revoked
        token_sha256 BLOB,                    -- SHA-256(token); NULL once revoked
        expires_at  INTEGER NOT NULL,
        revoked_at  INTEGER,
        created_at  INTEGER NOT NULL
    ) WITHOUT ROWID;
    -- Global installation-endpoint uniqueness on (app_profile, SHA-256(token)).
    CREATE UNIQUE INDEX gateway_installations_token ON gateway_installations(app_profile, token_sha256)
        WHERE token_sha256 IS NOT NULL;
    CREATE INDEX gateway_installations_expiry ON gateway_installations(expires_at);

    -- One row per (installation, relay): the latest delegation; generation only increases.
    CREATE TABLE gateway_delegations (
        handle      TEXT NOT NULL REFERENCES gateway_installations(handle) ON DELETE CASCADE,
        relay_pubkey TEXT NOT NULL,
        endpoint_epoch INTEGER NOT NULL,
        generation  INTEGER NOT NULL,
        not_before  INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL,
        revoked_at  INTEGER,
        PRIMARY KEY (handle, relay_pubkey)
    ) WITHOUT ROWID;

    CREATE TABLE gateway_grant_keys (
        key_id      TEXT PRIMARY KEY,
        wrapped     BLOB,                     -- secret wrapped by the key file; NULL once erased
        state       TEXT NOT NULL CHECK (state IN ('current', 'retired')),
        created_at  INTEGER NOT NULL,
        retired_at  INTEGER,
        max_expires_at INTEGER NOT NULL DEFAULT 0  -- latest expiry of a grant it sealed
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX gateway_grant_keys_current ON gateway_grant_keys(state) WHERE state = 'current';

    -- NIP-98 event ids burned at delivery admission, kept until the event's time window closes.
    CREATE TABLE gateway_auth_events (
        event_id    TEXT PRIMARY KEY,
        expires_at  INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX gateway_auth_events_expiry ON gateway_auth_events(expires_at);

    -- Delivery reservations: committed before the APNs request (send-begin); terminal ones kept.
    CREATE TABLE gateway_reservations (
        relay_pubkey TEXT NOT NULL,
        request_id  TEXT NOT NULL,
        terminal    INTEGER NOT NULL DEFAULT 0,
        expires_at  INTEGER NOT NULL,
        PRIMARY KEY (relay_pubkey, request_id)
    ) WITHOUT ROWID;
    CREATE INDEX gateway_reservations_expiry ON gateway_reservations(expires_at);

    -- Endpoint quota: admitted attempts per fixed window, charged once per attempt, never refunded.
    CREATE TABLE gateway_endpoint_quota (
        app_profile TEXT NOT NULL,
        token_sha256 BLOB NOT NULL,
        window_start INTEGER NOT NULL,
        admitted    INTEGER NOT NULL,
        PRIMARY KEY (app_profile, token_sha256)
    ) WITHOUT ROWID;
    """,
    # 6: the admin dashboard: the operator password and one-time setup token, signed-in sessions,
    # the reasons given for moderation decisions (NIP-86 lists them), settings saved from the dashboard.
    """
    CREATE TABLE admin_auth (
        id          INTEGER PRIMARY KEY CHECK (id = 1),
        password_hash TEXT,                   -- scrypt$N$r$p$salt$hash; NULL until the operator sets one
        setup_token_hash TEXT,                -- sha256 hex of the one-time setup token; NULL when none
        setup_token_expires INTEGER,
        changed_at  INTEGER NOT NULL
    );
    INSERT INTO admin_auth (id, changed_at) VALUES (1, 0);

    CREATE TABLE admin_sessions (
        id_hash     TEXT PRIMARY KEY,         -- sha256 hex of the session id the cookie carries
        created_at  INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE moderation_notes (
        origin      INTEGER NOT NULL,
        subject     TEXT NOT NULL,            -- banned_pubkey | allowed_pubkey | banned_event | allowed_event | blocked_ip
        value       TEXT NOT NULL,
        reason      TEXT NOT NULL DEFAULT '',
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (origin, subject, value)
    ) WITHOUT ROWID;

    -- An operator revoked the lease (dashboard): inactive from then on, whatever its plaintext says.
    ALTER TABLE leases ADD COLUMN revoked_at INTEGER;

    CREATE TABLE stored_settings (
        name        TEXT PRIMARY KEY,
        value       TEXT NOT NULL             -- JSON
    ) WITHOUT ROWID;
    """,
    # 7: a gateway reservation needs no flag: the row committed at send-begin is the fence, kept for
    # terminal outcomes (no second write) and deleted for transient ones.
    """
    ALTER TABLE gateway_reservations DROP COLUMN terminal;
    """,
    # 8: NIP-PL wake delivery: the durable wake outbox, per-endpoint rate state, the delivery log,
    # operator alerts, and endpoint-generation invalidation on the lease row.
    """
    -- Set when the transport said the endpoint of this lease generation is permanently dead (APNs
    -- 410 and the like): no wake until a newer generation replaces the row (and this column).
    ALTER TABLE leases ADD COLUMN invalidated_at REAL;

    -- One job per (origin, app_profile, transport, H(endpoint), event id), written in the event's
    -- own transaction. A pending job is one wake for its endpoint; matches that arrive while it waits
    -- join it as 'coalesced' jobs pointing at it (wake_id). Times are Unix seconds (REAL).
    CREATE TABLE wake_jobs (
        id          TEXT PRIMARY KEY,         -- canonical UUID: the provider request id (apns-id)
        origin      INTEGER NOT NULL,
        app_profile TEXT NOT NULL,
        transport   TEXT NOT NULL,
        endpoint_hash TEXT NOT NULL,          -- H(endpoint); the endpoint itself stays in `leases`
        event_id    TEXT NOT NULL,
        lease_pubkey TEXT NOT NULL,           -- the lease address chosen at match time
        lease_d     TEXT NOT NULL,
        generation  INTEGER NOT NULL,         -- the lease generation at match time
        class       TEXT NOT NULL,            -- highest eligible class of the matches it covers
        state       TEXT NOT NULL CHECK (state IN ('pending', 'claimed', 'coalesced', 'delivered', 'dead',
                                                   'dropped', 'invalidated', 'cancelled')),
        wake_id     TEXT,                     -- coalesced: the job whose wake covers this one
        created_at  REAL NOT NULL,
        due_at      REAL NOT NULL,            -- pending: not before; claimed: when the claim lapses
        expires_at  REAL NOT NULL,            -- created_at + useful age: dead-lettered after that
        attempts    INTEGER NOT NULL DEFAULT 0,
        finished_at REAL,
        last_error  TEXT,
        UNIQUE (origin, app_profile, transport, endpoint_hash, event_id)
    ) WITHOUT ROWID;
    CREATE INDEX wake_jobs_due ON wake_jobs(due_at) WHERE state IN ('pending', 'claimed');
    CREATE INDEX wake_jobs_endpoint ON wake_jobs(origin, app_profile, transport, endpoint_hash)
        WHERE state = 'pending';
    CREATE INDEX wake_jobs_wake ON wake_jobs(wake_id) WHERE wake_id IS NOT NULL;
    CREATE INDEX wake_jobs_lease ON wake_jobs(origin, lease_pubkey, lease_d) WHERE state IN ('pending', 'coalesced');
    CREATE INDEX wake_jobs_state ON wake_jobs(state, created_at);
    CREATE INDEX wake_jobs_finished ON wake_jobs(finished_at) WHERE finished_at IS NOT NULL;

    -- The per-endpoint rate cap: when the last wake went to this endpoint.
    CREATE TABLE wake_endpoints (
        origin      INTEGER NOT NULL,
        app_profile TEXT NOT NULL,
        transport   TEXT NOT NULL,
        endpoint_hash TEXT NOT NULL,
        last_sent_at REAL NOT NULL,
        PRIMARY KEY (origin, app_profile, transport, endpoint_hash)
    ) WITHOUT ROWID;
    CREATE INDEX wake_endpoints_sent ON wake_endpoints(last_sent_at);

    -- Every delivery attempt. Never an endpoint token, never event content; the lease address is
    -- redacted.
    CREATE TABLE delivery_log (
        id          INTEGER PRIMARY KEY,
        at          REAL NOT NULL,
        origin      INTEGER NOT NULL,
        lease       TEXT NOT NULL,            -- redacted lease address
        app_profile TEXT NOT NULL,
        transport   TEXT NOT NULL,
        class       TEXT NOT NULL,
        job_id      TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        outcome     TEXT NOT NULL,            -- transports.base outcome kind
        status      INTEGER,                  -- provider status (NULL: no answer)
        reason      TEXT,                     -- provider reason
        latency_ms  REAL,
        detail      TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX delivery_log_at ON delivery_log(at);
    CREATE INDEX delivery_log_origin ON delivery_log(origin, at);
    CREATE INDEX delivery_log_job ON delivery_log(job_id);

    -- Operator-visible alerts (configuration faults), one row per (origin, profile, reason).
    CREATE TABLE push_alerts (
        origin      INTEGER NOT NULL,
        app_profile TEXT NOT NULL,
        reason      TEXT NOT NULL,
        detail      TEXT NOT NULL,
        status      INTEGER,
        first_at    REAL NOT NULL,
        last_at     REAL NOT NULL,
        count       INTEGER NOT NULL,
        cleared_at  REAL,                     -- set once a later attempt for the profile succeeded
        PRIMARY KEY (origin, app_profile, reason)
    ) WITHOUT ROWID;
    """,
    # 9: APNs .p8 signing keys uploaded through the dashboard, wrapped by the key file like executor
    # keys; an app profile names one by its fingerprint (`key_stored`) instead of a `key_file` path.
    """
    CREATE TABLE apns_keys (
        fingerprint TEXT PRIMARY KEY,         -- p8:<16 hex of SHA-256 of the public key>: safe to show
        wrapped     BLOB NOT NULL,            -- the PEM, wrapped by the key file
        created_at  INTEGER NOT NULL
    ) WITHOUT ROWID;
    """,
    # 10: the tag index carries each event's kind (and rowid), so `kinds` + `#x` filters (REQ, and
    # COUNT as an index-only count) are decided inside the index, without reading event rows. The
    # backfill rewrites every tag row once: docs/performance.md#tags-carry-their-kind-schema-10
    """
    DROP INDEX tags_lookup;
    ALTER TABLE tags ADD COLUMN kind INTEGER NOT NULL DEFAULT 0;
    UPDATE tags SET kind = (SELECT kind FROM events WHERE events.rowid = tags.event);
    CREATE INDEX tags_lookup ON tags(origin, name, value, created_at, kind, event);
    """,
    # 11: the wake outbox's lease index covers every job, not only undelivered ones. A partial
    # index on `state` is rewritten whenever a job's state changes, and a claim and an outcome
    # each change it: one random page of this index per wake. Kept whole, it changes only when a
    # job is written or purged; cancelling a lease's jobs reads its finished ones too (rare).
    """
    DROP INDEX wake_jobs_lease;
    CREATE INDEX wake_jobs_lease ON wake_jobs(origin, lease_pubkey, lease_d);
    """,
    # 12: an endpoint's pending wake (the one later matches join) is kept as a hint in its
    # wake_endpoints row, checked by primary key before use, instead of a partial index of
    # wake_jobs by endpoint: that index lost an entry at every claim, a random page per wake.
    # last_sent_at becomes nullable: a row may name a pending wake before anything was sent.
    """
    CREATE TABLE wake_endpoints_v12 (
        origin      INTEGER NOT NULL,
        app_profile TEXT NOT NULL,
        transport   TEXT NOT NULL,
        endpoint_hash TEXT NOT NULL,
        last_sent_at REAL,                    -- when the last wake went to it (NULL: none yet)
        pending_wake TEXT,                    -- a pending wake of it (a hint: checked before use)
        PRIMARY KEY (origin, app_profile, transport, endpoint_hash)
    ) WITHOUT ROWID;
    INSERT INTO wake_endpoints_v12 (origin, app_profile, transport, endpoint_hash, last_sent_at)
        SELECT origin, app_profile, transport, endpoint_hash, last_sent_at FROM wake_endpoints;
    INSERT INTO wake_endpoints_v12 (origin, app_profile, transport, endpoint_hash, pending_wake)
        SELECT origin, app_profile, transport, endpoint_hash, max(id) FROM wake_jobs WHERE state = 'pending'
        GROUP BY origin, app_profile, transport, endpoint_hash
        ON CONFLICT (origin, app_profile, transport, endpoint_hash) DO UPDATE SET pending_wake = excluded.pending_wake;
    DROP TABLE wake_endpoints;
    ALTER TABLE wake_endpoints_v12 RENAME TO wake_endpoints;
    CREATE INDEX wake_endpoints_sent ON wake_endpoints(last_sent_at);
    DROP INDEX wake_jobs_endpoint;
    """,
    # 13: no index of wake_endpoints by last_sent_at. Every claim moved its endpoint's entry (from
    # wherever its last send, or NULL, sorted it to the right edge): a random page per wake or so,
    # written to the WAL and checkpointed. The purge (once a minute) finds stale rows by scanning
    # the table instead: docs/performance.md#no-index-of-endpoints-by-last-send-schema-13
    """
    DROP INDEX wake_endpoints_sent;
    """,
    # 14: NIP-86 calls' spent authorization events (NIP-98 ids), kept until the event's time window
    # closes: a captured change request is refused after a restart and on every node, not only by
    # the process that took it first.
    """
    CREATE TABLE admin_auth_events (
        event_id    TEXT PRIMARY KEY,
        expires_at  INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX admin_auth_events_expiry ON admin_auth_events(expires_at);
    """,
    # 15: operator health of each app profile's transport (the overview, /admin/health, metrics):
    # transient failures in a row and whether the host refused the connection, written with each
    # outcome; an alert the operator dismissed stays hidden until it clears and comes back.
    """
    ALTER TABLE push_alerts ADD COLUMN dismissed_at REAL;
    CREATE TABLE transport_health (
        origin      INTEGER NOT NULL,
        app_profile TEXT NOT NULL,
        failures    INTEGER NOT NULL,         -- transient failures in a row since the last answer
        refused     INTEGER NOT NULL,         -- 1: the last attempt found the host refusing connections
        last_at     REAL NOT NULL,            -- the last attempt (wake or test wake)
        last_outcome TEXT NOT NULL,           -- its transports.base outcome kind
        last_detail TEXT NOT NULL,            -- status, reason and detail, for the operator
        ok_at       REAL,                     -- the last accepted attempt
        PRIMARY KEY (origin, app_profile)
    ) WITHOUT ROWID;
    """,
    # 16: NIP-50 search. The content of events of the searchable kinds (the `search_kinds` setting,
    # kept in its table by `serve`) in an FTS5 index without a copy of the text (contentless), its
    # rowids the events' own. Triggers keep it in each event's own transaction on every path that
    # writes or deletes an event (publish, import, replacement, NIP-09, expiry, bans, delete).
    """
    CREATE TABLE search_kinds (
        kind        INTEGER PRIMARY KEY
    ) WITHOUT ROWID;
    INSERT INTO search_kinds (kind) VALUES (1), (30023);
    CREATE VIRTUAL TABLE events_fts USING fts5(
        content, content = '', contentless_delete = 1, tokenize = 'unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER events_fts_insert AFTER INSERT ON events
        WHEN new.kind IN (SELECT kind FROM search_kinds)
    BEGIN
        INSERT INTO events_fts (rowid, content) VALUES (new.rowid, new.raw ->> '$.content');
    END;
    -- Whatever the kind: the kinds indexed may have changed since the event was stored.
    CREATE TRIGGER events_fts_delete AFTER DELETE ON events
    BEGIN
        DELETE FROM events_fts WHERE rowid = old.rowid;
    END;
    INSERT INTO events_fts (rowid, content)
        SELECT rowid, raw ->> '$.content' FROM events WHERE kind IN (SELECT kind FROM search_kinds);
    """,
    # 17: VAPID key pairs of the UnifiedPush profile (RFC 8292), one per origin and push service
    # origin, made on the first wake sent there and wrapped by the key file like executor keys.
    """
    CREATE TABLE vapid_keys (
        origin      INTEGER NOT NULL,
        push_origin TEXT NOT NULL,            -- scheme://host[:port] of the push service
        wrapped     BLOB NOT NULL,            -- the private key (PKCS#8 DER), wrapped by the key file
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (origin, push_origin)
    ) WITHOUT ROWID;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: Connection) -> int:
    """Bring the database to SCHEMA_VERSION; return the version found before."""
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    if found == 0 and conn.execute("SELECT count(*) FROM sqlite_schema WHERE type = 'table'").fetchone()[0]:
        raise StoreError("the database file holds tables this appliance did not create: "
                         "point --data-dir at a new directory (or at one the appliance made)")
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database has schema version {found} but this appliance knows up to {SCHEMA_VERSION}: "
            "upgrade the appliance (or restore a backup made by this version)"
        )
    for version in range(found, SCHEMA_VERSION):
        if found:  # an upgrade (a step can rewrite a big table): say what the start is waiting for
            log.info("upgrading the database schema to version %d (this can take a minute on a large "
                        "database; do not interrupt it)", version + 1)
        t0 = time.monotonic()
        with conn:  # one transaction per step
            conn.execute(MIGRATIONS[version])
            conn.execute(f"PRAGMA user_version = {version + 1}")
        if found:
            log.info("schema version %d done in %.1f s", version + 1, time.monotonic() - t0)
    return found
