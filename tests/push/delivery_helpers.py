"""Helpers for wake-delivery end-to-end tests: an APNs emulator on its own thread, a .p8 key, an
appliance configured to deliver to the emulator, and users who publish leases and events."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from appliance.store.statement import SQL
from appliance.testing.apns_emulator import ApnsEmulator
from appliance.testing.tls import make_p8
from tests.conftest import Client, Server
from tests.push.e2e_helpers import ANDROID, IOS, ORIGIN, Installation, active, current_key, db_rows, lease, tombstone
from tests.leaks import sensitive

TEAM = "TEAM123456"
KEY_ID = "ABC123DEFG"
TOPIC = "com.example.app"

__all__ = ["TEAM", "KEY_ID", "TOPIC", "Apns", "Fcm", "fcm_token", "delivery_config", "token", "Pusher", "wait_until", "jobs", "log_rows"]


def token() -> str:
    """A fresh APNs-style device token (32 bytes, hex)."""
    value = secrets.token_hex(32)
    sensitive(value)
    return value


class Apns:
    """The emulator on a thread plus the key it trusts."""

    def __init__(self, directory: Path):
        self.key_file = directory / "AuthKey_ABC123DEFG.p8"
        key = make_p8(self.key_file)
        self.emulator = ApnsEmulator(topics=[TOPIC], pki_dir=directory / "apns-pki")
        self.emulator.add_key(TEAM, KEY_ID, key)

    def start(self) -> "Apns":
        self.emulator.start_in_thread()
        return self

    def stop(self) -> None:
        self.emulator.stop_thread()

    def profile(self, profile_id: str = IOS, **over) -> str:
        """One app_profiles entry (TOML inline table) delivering to the emulator."""
        started = self.emulator.pki is not None
        fields = {"id": profile_id, "transport": "apns", "topic": TOPIC, "team_id": TEAM, "key_id": KEY_ID,
                  "key_file": str(self.key_file), "environment": "production",
                  "apns_url": self.emulator.url if started else None,
                  "ca_file": self.emulator.ca_file if started else None}
        fields.update(over)
        return "{ " + ", ".join(f'{k} = "{v}"' for k, v in fields.items() if v is not None) + " }"


def delivery_config(apns: Apns | None, *, settings: dict | None = None, profiles: list[str] | None = None,
                    origin: str = ORIGIN, extra: str = "") -> str:
    # The fcm profile is a draft transport: advertised only with push_draft_transports on.
    flat = {"wake_min_interval": 0, "wake_retry_delay": 0.2, "purge_interval": 3600, "push_draft_transports": True}
    flat.update(settings or {})
    if profiles is None:
        profiles = [apns.profile(), f'{{ id = "{ANDROID}", transport = "fcm" }}']
    lines = [f'public_url = "{origin}"'] + [f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" if not isinstance(v, str) else f'{k} = "{v}"'
                                           for k, v in flat.items()]
    lines += [
        "[push]",
        "app_profiles = [" + ", ".join(profiles) + "]",
        "push_kinds = [9, 1059, 7]",
        "urgent_kinds = [9]",
        'class_support = { apns = ["silent", "default", "time_sensitive", "urgent"], fcm = ["silent", "default"] }',
    ]
    return "\n".join(lines) + "\n" + extra


class Fcm:
    """The FCM emulator on a thread plus the service account it trusts (written as Google's JSON)."""

    def __init__(self, directory: Path, project: str = "appliance-emulator"):
        import json

        from appliance.testing.fcm_emulator import FcmEmulator

        self.emulator = FcmEmulator(pki_dir=directory / "fcm-pki")
        self.directory = directory
        self.project = project
        self._json = json
        self.sa_file = directory / "service-account.json"

    def start(self) -> "Fcm":
        self.emulator.start_in_thread()
        # The key file names the token endpoint, which the emulator knows once it listens.
        account = self.emulator.service_account(self.project)
        sensitive(*account["private_key"].splitlines()[1:3])  # never in a log
        self.sa_file.write_text(self._json.dumps(account))
        return self

    def stop(self) -> None:
        self.emulator.stop_thread()

    def profile(self, profile_id: str = ANDROID, **over) -> str:
        """One fcm app_profiles entry (TOML inline table) delivering to the emulator."""
        fields = {"id": profile_id, "transport": "fcm", "service_account_file": str(self.sa_file),
                  "fcm_url": self.emulator.url, "token_uri": self.emulator.token_url, "ca_file": self.emulator.ca_file}
        fields.update(over)
        return "{ " + ", ".join(f'{k} = "{v}"' for k, v in fields.items() if v is not None) + " }"


def fcm_token() -> str:
    """A fresh FCM-style registration token."""
    value = secrets.token_urlsafe(16) + ":APA91b" + secrets.token_urlsafe(100)
    sensitive(value)
    return value


class Pusher:
    """A user with an authenticated connection who can publish leases and events."""

    def __init__(self, server: Server, client: Client, user: Installation, origin: str = ORIGIN,
                 host: str | None = None):
        self.server = server
        self.client = client
        self.user = user
        self.origin = origin
        self.host = host
        self.pubkey = user.pubkey
        self._created: dict[str, int] = {}

    def _created_at(self, d: str) -> int:
        """A replacement must be newer (NIP-01): one second past the last at this address."""
        at = max(int(time.time()), self._created.get(d, 0) + 1)
        self._created[d] = at
        return at

    @classmethod
    async def connect(cls, server: Server, origin: str = ORIGIN, host: str | None = None,
                      user: Installation | None = None) -> "Pusher":
        user = user or Installation()
        client = await Client.connect(server.url, host)
        ok, msg = await client.auth(user.secret, origin)
        assert ok, msg
        return cls(server, client, user, origin, host)

    async def lease(self, endpoint: str, *, generation: int = 1, d: str = "lease-d-1", ttl: int = 86400,
                    subscriptions: list | None = None, **over) -> dict:
        exec_id, exec_pub = current_key(self.server.nip11(self.host))
        pt = active(self.user, generation=generation, endpoint=endpoint, origin=self.origin, **over)
        if subscriptions is not None:
            pt["subscriptions"] = subscriptions
        ev = lease(self.user, pt, exec_pub=exec_pub, exec_id=exec_id, d=d, ttl=ttl, created_at=self._created_at(d))
        ok, msg = await self.client.publish(ev)
        assert ok, msg
        return ev

    async def revoke(self, *, generation: int, d: str = "lease-d-1") -> None:
        exec_id, exec_pub = current_key(self.server.nip11(self.host))
        t = tombstone(generation=generation)
        t["origin"] = self.origin
        ok, msg = await self.client.publish(lease(self.user, t, exec_pub=exec_pub, exec_id=exec_id, d=d,
                                                  created_at=self._created_at(d)))
        assert ok, msg

    async def publish(self, kind: int = 9, tags=None, content: str | None = None, *, expect_ok: bool = True):
        from appliance.nostr.event import sign_event

        # Distinct content: two identical events in one second would be one event (same id).
        ev = sign_event(self.user.secret, kind, tags or [], content or f"hi {secrets.token_hex(4)}")
        ok, msg = await self.client.publish(ev)
        if expect_ok:
            assert ok, msg
        return ev


async def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02):
    """Poll `predicate()` (sync) until true; AssertionError after `timeout` seconds."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


def jobs(server: Server, **where) -> list[dict]:
    cols = ["id", "origin", "app_profile", "transport", "endpoint_hash", "event_id", "lease_pubkey", "lease_d",
            "generation", "class", "state", "wake_id", "attempts", "last_error"]
    sql = SQL(*(f"SELECT {', '.join(cols)} FROM wake_jobs"
                + (" WHERE " + " AND ".join(f"{k} = {mark}" for k in where) if where else "")
                + " ORDER BY created_at" for mark in ("?", "%s")))  # SQLite's binding mark, PostgreSQL's
    return [dict(zip(cols, r)) for r in db_rows(server.data_dir, sql, tuple(where.values()))]


def log_rows(server: Server) -> list[dict]:
    cols = ["at", "origin", "lease", "app_profile", "transport", "class", "job_id", "attempt", "outcome", "status",
            "reason", "latency_ms", "detail"]
    return [dict(zip(cols, r)) for r in db_rows(server.data_dir, f"SELECT {', '.join(cols)} FROM delivery_log "
                                                                 "ORDER BY id")]
