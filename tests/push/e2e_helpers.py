"""Helpers for NIP-PL end-to-end tests: leases built and NIP-44-encrypted by nostr_sdk."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nostr_sdk as sdk

from appliance.store.statement import SQL
from tests.leaks import sensitive

ORIGIN = "ws://push.test"
IOS = "com.example.app/ios"
ANDROID = "com.example.app/android"
CHANNEL = "3f2b8c1e-9d4a-4b6e-8f01-23456789abcd"

PUSH_CONFIG = f"""
public_url = "{ORIGIN}"
push_draft_transports = true  # the fcm profile is a draft transport
[push]
app_profiles = [{{ id = "{IOS}", transport = "apns" }}, {{ id = "{ANDROID}", transport = "fcm" }}]
push_kinds = [9, 1059, 7]
urgent_kinds = [9]
class_support = {{ apns = ["silent", "default", "time_sensitive", "urgent"], fcm = ["silent", "default"] }}
"""


def push_config(*, limitation: dict | None = None, allowed_skew: int | None = None, extra: str = "") -> str:
    text = PUSH_CONFIG
    if allowed_skew is not None:
        text += f"allowed_skew = {allowed_skew}\n"
    text += extra
    if limitation:
        text += "[push.limitation]\n" + "".join(f"{k} = {v}\n" for k, v in limitation.items())
    return text


class Installation:
    """One user's keys (nostr_sdk) plus the secret hex for the test client's AUTH."""

    def __init__(self):
        self.keys = sdk.Keys.generate()
        self.secret = self.keys.secret_key().to_hex()
        self.pubkey = self.keys.public_key().to_hex()
        sensitive(self.secret, self.pubkey)


def active(user: Installation, *, generation: int = 1, endpoint: str = "tok-" + "a" * 60, **over) -> dict:
    sensitive(endpoint)
    pt = {
        "v": 1,
        "origin": ORIGIN,
        "app_profile": IOS,
        "transport": "apns",
        "endpoint": endpoint,
        "generation": generation,
        "active": True,
        "subscriptions": [
            {"filter": {"kinds": [9], "#p": [user.pubkey]}, "class": "time_sensitive"},
            {"filter": {"kinds": [9], "#h": [CHANNEL]}, "class": "default"},
        ],
    }
    pt.update(over)
    return pt


def tombstone(*, generation: int) -> dict:
    return {"v": 1, "origin": ORIGIN, "generation": generation, "active": False}


def pad_d(d: str) -> str:
    """d values of test leases: readable names padded to a spec-sized random-looking length."""
    return d if len(d) >= 22 else (d + "-k3J9xQm2ZpL8vT4wR7nY1a")[:24]


def lease(
    user: Installation,
    plaintext: dict | str,
    *,
    exec_pub: str,
    exec_id: str,
    d: str = "lease-d-1",
    ttl: int = 86400,
    created_at: int | None = None,
    tags: list | None = None,
    encrypt_to: str | None = None,
    content: str | None = None,
) -> dict:
    now = int(time.time())
    if content is None:
        text = plaintext if isinstance(plaintext, str) else json.dumps(plaintext)
        content = sdk.nip44_encrypt(user.keys.secret_key(), sdk.PublicKey.parse(encrypt_to or exec_pub), text,
                                    sdk.Nip44Version.V2)
    if tags is None:
        tags = [["d", pad_d(d)], ["expiration", str(now + ttl)], ["exec", exec_id], ["alt", "Push lease"]]
    ev = (
        sdk.EventBuilder(sdk.Kind(30350), content)
        .tags([sdk.Tag.parse(t) for t in tags])
        .custom_created_at(sdk.Timestamp.from_secs(created_at if created_at is not None else now))
        .finalize(user.keys)
    )
    return json.loads(ev.as_json())


def current_key(nip11: dict) -> tuple[str, str]:
    k = next(k for k in nip11["push"]["keys"] if k.get("current"))
    return k["id"], k["pubkey"]


def db_rows(data_dir: Path, sql: str, args=()) -> list[tuple]:
    from tests.pg import db_rows as rows

    return rows(data_dir, sql, args)


def lease_state(data_dir: Path, pubkey: str) -> tuple[list, list, list]:
    return (
        db_rows(data_dir, SQL("SELECT * FROM leases WHERE pubkey = ? ORDER BY d",
                              "SELECT * FROM leases WHERE pubkey = %s ORDER BY d"), (pubkey,)),
        db_rows(data_dir, SQL("SELECT * FROM lease_watermarks WHERE pubkey = ? ORDER BY d",
                              "SELECT * FROM lease_watermarks WHERE pubkey = %s ORDER BY d"), (pubkey,)),
        db_rows(data_dir, SQL("SELECT raw FROM events WHERE pubkey = ? AND kind = 30350 ORDER BY d",
                              "SELECT raw FROM events WHERE pubkey = %s AND kind = 30350 ORDER BY d"), (pubkey,)),
    )
