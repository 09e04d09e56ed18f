"""Test fixtures for NIP-PL push-lease validation.

Encryption/signing use nostr_sdk (an independent implementation), so these
tests do not depend on the concurrently written ``appliance.nostr`` package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import nostr_sdk as sdk

from appliance.push.descriptor import AppProfile, Descriptor, ExecutorKey, Limits

NOW = 1_770_000_000
CHANNEL = "3f2b8c1e-9d4a-4b6e-8f01-23456789abcd"
CHANNEL2 = "0a1b2c3d-4e5f-4a6b-9c7d-8e9f0a1b2c3d"
OTHER_PK = "b" * 64
EVENT_ID = "e" * 64
D_VALUE = "k3J9xQm2ZpL8vT4wR7nY1a"  # 22 chars ~ 128 bits base64url

AUTHOR = sdk.Keys.generate()
AUTHOR_HEX = AUTHOR.public_key().to_hex()
STRANGER = sdk.Keys.generate()
EXEC_CURRENT = sdk.Keys.generate()
EXEC_RETIRING = sdk.Keys.generate()
EXEC_UNLISTED = sdk.Keys.generate()

EXEC_SECRETS = {"2026-06": EXEC_CURRENT, "2026-01": EXEC_RETIRING}


def make_descriptor(**overrides: Any) -> Descriptor:
    base = dict(
        origin="wss://relay.example",
        keys=(
            ExecutorKey("2026-06", EXEC_CURRENT.public_key().to_hex(), current=True),
            ExecutorKey("2026-01", EXEC_RETIRING.public_key().to_hex(), retiring=True),
        ),
        app_profiles=(
            AppProfile("com.example.app/ios", "apns"),
            AppProfile("com.example.app/android", "fcm"),
        ),
        push_kinds=(9, 1059, 40007, 46010, 7),
        urgent_kinds=(46010,),
        h_grammar="uuid-v4-lowercase",
        class_support={
            "apns": ("silent", "default", "time_sensitive", "urgent"),
            "fcm": ("silent", "default", "time_sensitive"),
        },
        limits=Limits(),
    )
    base.update(overrides)
    return Descriptor(**base)


DESCRIPTOR = make_descriptor()


def active_plaintext(**overrides: Any) -> dict:
    pt = {
        "v": 1,
        "origin": "wss://relay.example",
        "app_profile": "com.example.app/ios",
        "transport": "apns",
        "endpoint": "a1b2c3d4" * 8,
        "generation": 3,
        "active": True,
        "subscriptions": [
            {"filter": {"kinds": [9], "#p": [AUTHOR_HEX]}, "class": "time_sensitive"},
            {
                "filter": {"kinds": [9], "#h": [CHANNEL]},
                "class": "default",
                "ignore": [{"kinds": [9], "authors": [OTHER_PK], "#h": [CHANNEL]}],
                "suppress": {"p_tags_max": 20},
            },
        ],
    }
    pt.update(overrides)
    return pt


def inactive_plaintext(**overrides: Any) -> dict:
    pt = {"v": 1, "origin": "wss://relay.example", "generation": 4, "active": False}
    pt.update(overrides)
    return pt


def std_tags(**overrides: Any) -> list[list[str]]:
    vals = {"d": D_VALUE, "expiration": str(NOW + 86400), "exec": "2026-06", "alt": "Push lease"}
    vals.update(overrides)
    return [[k, v] for k, v in vals.items() if v is not None]


@dataclass
class Ev:
    id: str
    pubkey: str
    created_at: int
    kind: int
    tags: list
    content: str
    sig: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "pubkey": self.pubkey,
                "created_at": self.created_at,
                "kind": self.kind,
                "tags": self.tags,
                "content": self.content,
                "sig": self.sig,
            }
        )


def encrypt(plaintext: str, *, to: sdk.Keys = EXEC_CURRENT, sender: sdk.Keys = AUTHOR) -> str:
    return sdk.nip44_encrypt(sender.secret_key(), to.public_key(), plaintext, sdk.Nip44Version.V2)


def make_event(
    plaintext: dict | str | None = None,
    *,
    tags: list | None = None,
    keys: sdk.Keys = AUTHOR,
    encrypt_to: sdk.Keys = EXEC_CURRENT,
    content: str | None = None,
    created_at: int = NOW,
    kind: int = 30350,
) -> Ev:
    if content is None:
        if plaintext is None:
            plaintext = active_plaintext()
        text = plaintext if isinstance(plaintext, str) else json.dumps(plaintext)
        content = encrypt(text, to=encrypt_to, sender=keys)
    tags = std_tags() if tags is None else tags
    builder = (
        sdk.EventBuilder(sdk.Kind(kind), content)
        .tags([sdk.Tag.parse(t) for t in tags])
        .custom_created_at(sdk.Timestamp.from_secs(created_at))
    )
    signed = builder.finalize(keys)
    j = json.loads(signed.as_json())
    return Ev(j["id"], j["pubkey"], j["created_at"], j["kind"], j["tags"], j["content"], j["sig"])


def sdk_verify(ev: Ev) -> bool:
    """NIP-01 id + signature check via nostr_sdk."""
    try:
        return bool(sdk.Event.from_json(ev.to_json()).verify())
    except Exception:
        return False


def decrypt_for(ev: Ev, secrets: dict[str, sdk.Keys] = EXEC_SECRETS):
    """The caller-provided ``decrypt(key_id, content)`` bound to ``ev``'s author."""

    def decrypt(key_id: str, content: str) -> str:
        keys = secrets[key_id]  # KeyError for unknown / no-longer-accepted ids
        try:
            return sdk.nip44_decrypt(keys.secret_key(), sdk.PublicKey.parse(ev.pubkey), content)
        except Exception as exc:
            raise ValueError(str(exc)) from None

    return decrypt


def identity_decrypt(key_id: str, content: str) -> str:
    if key_id not in EXEC_SECRETS:
        raise KeyError(key_id)
    return content


def plain_event(plaintext: dict | str, *, tags: list | None = None, pubkey: str = AUTHOR_HEX) -> Ev:
    """Unsigned, unencrypted event for fast tests (use with identity_decrypt and
    an always-true verify)."""
    text = plaintext if isinstance(plaintext, str) else json.dumps(plaintext)
    return Ev(EVENT_ID, pubkey, NOW, 30350, std_tags() if tags is None else tags, text, "0" * 128)


def always(_ev: Any) -> bool:
    return True


__all__ = [n for n in dir() if not n.startswith("__")] + ["replace", "field"]
