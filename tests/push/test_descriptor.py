from dataclasses import replace

import pytest

from appliance.push.descriptor import (
    CLASS_RANK,
    CLASS_REGISTRY,
    H_GRAMMARS,
    AppProfile,
    ExecutorKey,
    Limits,
    descriptor_to_json,
    is_never_push_eligible,
    validate_descriptor,
)
from appliance.push.errors import DescriptorError
from tests.push.helpers import DESCRIPTOR, EXEC_CURRENT, EXEC_RETIRING, make_descriptor

CUR = ExecutorKey("a", EXEC_CURRENT.public_key().to_hex(), current=True)
RET = ExecutorKey("b", EXEC_RETIRING.public_key().to_hex(), retiring=True)


def test_registry_and_order():
    assert CLASS_REGISTRY == ("silent", "default", "time_sensitive", "urgent")
    assert [CLASS_RANK[c] for c in CLASS_REGISTRY] == [0, 1, 2, 3]


def test_limits_defaults_match_spec():
    lim = Limits()
    assert (lim.max_lease_ttl, lim.max_leases_per_pubkey, lim.max_subscriptions_per_lease) == (2592000, 16, 16)
    assert (lim.max_kinds, lim.max_authors, lim.max_h, lim.max_tag_values, lim.max_ignore) == (16, 20, 50, 20, 8)
    assert (lim.max_content_len, lim.max_plaintext_len, lim.max_endpoint_len, lim.max_string_len) == (
        65536,
        32768,
        4096,
        512,
    )
    assert lim.allowed_skew == 900


def test_valid_descriptor_passes():
    validate_descriptor(DESCRIPTOR)
    validate_descriptor(make_descriptor(endpoint="https://push.example/v1"))
    validate_descriptor(make_descriptor(app_profiles=(), class_support={}))


BAD = [
    ("one-current-key", dict(keys=(RET,))),
    ("one-current-key", dict(keys=(CUR, replace(RET, id="c", current=True, retiring=False)))),
    ("unique-key-ids", dict(keys=(CUR, replace(RET, id="a")))),
    ("keys-shape", dict(keys=())),
    ("keys-shape", dict(keys=(replace(CUR, current=True, retiring=True),))),
    ("keys-shape", dict(keys=(CUR, replace(RET, retiring=False)))),
    ("keys-shape", dict(keys=(replace(CUR, pubkey="A" * 64),))),
    ("keys-shape", dict(keys=(replace(CUR, pubkey="a" * 63),))),
    ("keys-shape", dict(keys=(replace(CUR, id=""),))),
    ("unique-app-profile-ids", dict(app_profiles=(AppProfile("x", "apns"), AppProfile("x", "fcm")))),
    ("app-profile-transport", dict(app_profiles=(AppProfile("x", "webpush"),))),
    ("app-profiles-shape", dict(app_profiles=(AppProfile("", "apns"),))),
    ("urgent-subset", dict(urgent_kinds=(46010, 1))),
    ("never-push-eligible", dict(push_kinds=(9, 20000))),
    ("never-push-eligible", dict(push_kinds=(9, 29999))),
    ("never-push-eligible", dict(push_kinds=(9, 25000))),
    ("never-push-eligible", dict(push_kinds=(9, 39000))),
    ("never-push-eligible", dict(push_kinds=(9, 39009))),
    ("never-push-eligible", dict(push_kinds=(9, 30350))),
    ("kinds-shape", dict(push_kinds=(9, 9))),
    ("kinds-shape", dict(push_kinds=(9, True))),
    ("kinds-shape", dict(push_kinds=(9, 70000))),
    ("kinds-shape", dict(push_kinds=(9, -1))),
    ("class-support-transport", dict(class_support={"webpush": ("default",)})),
    ("class-support-registry", dict(class_support={"apns": ("default", "critical")})),
    ("class-support-registry", dict(class_support={"apns": ("default", "default")})),
    ("h-grammar", dict(h_grammar="uuid")),
    ("endpoint-https", dict(endpoint="http://push.example")),
    ("endpoint-https", dict(endpoint="https://")),
    ("endpoint-https", dict(endpoint="https://user@push.example")),
    ("endpoint-https", dict(endpoint="https://push.example/ x")),
    ("endpoint-https", dict(endpoint="HTTPS://push.example")),
    ("origin", dict(origin="")),
    ("limits-positive", dict(limits=Limits(max_kinds=0))),
    ("limits-positive", dict(limits=Limits(max_h=-1))),
    ("limits-positive", dict(limits=Limits(allowed_skew=0))),
    ("limits-positive", dict(limits=Limits(max_ignore=True))),
    ("limits-positive", dict(limits=Limits(max_string_len=1.5))),
]


@pytest.mark.parametrize("rule,overrides", BAD, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BAD)])
def test_invalid_descriptor_names_rule(rule, overrides):
    with pytest.raises(DescriptorError) as ei:
        validate_descriptor(make_descriptor(**overrides))
    assert ei.value.rule == rule


@pytest.mark.parametrize(
    "kind,never",
    [(9, False), (1059, False), (19999, False), (20000, True), (29999, True), (30000, False), (30350, True),
     (38999, False), (39000, True), (39009, True), (39010, False)],
)
def test_never_push_eligible(kind, never):
    assert is_never_push_eligible(kind) is never


def test_descriptor_to_json_shape():
    j = descriptor_to_json(DESCRIPTOR)
    assert list(j) == [
        "origin", "keys", "app_profiles", "push_kinds", "urgent_kinds", "h_grammar", "class_support", "limitation",
    ]
    assert j["keys"] == [
        {"id": "2026-06", "pubkey": EXEC_CURRENT.public_key().to_hex(), "current": True},
        {"id": "2026-01", "pubkey": EXEC_RETIRING.public_key().to_hex(), "retiring": True},
    ]
    assert j["app_profiles"][0] == {"id": "com.example.app/ios", "transport": "apns"}
    assert j["push_kinds"] == [9, 1059, 40007, 46010, 7]
    assert j["urgent_kinds"] == [46010]
    assert j["h_grammar"] == "uuid-v4-lowercase"
    assert j["class_support"]["apns"] == ["silent", "default", "time_sensitive", "urgent"]
    assert j["limitation"] == {
        "max_lease_ttl": 2592000, "max_leases_per_pubkey": 16, "max_subscriptions_per_lease": 16, "max_kinds": 16,
        "max_authors": 20, "max_h": 50, "max_tag_values": 20, "max_ignore": 8, "max_content_len": 65536,
        "max_plaintext_len": 32768, "max_endpoint_len": 4096, "max_string_len": 512,
    }
    assert "allowed_skew" not in j["limitation"]
    assert "endpoint" not in j
    assert descriptor_to_json(make_descriptor(endpoint="https://p.example"))["endpoint"] == "https://p.example"


@pytest.mark.parametrize(
    "value,ok",
    [
        ("3f2b8c1e-9d4a-4b6e-8f01-23456789abcd", True),
        ("3f2b8c1e-9d4a-4b6e-bf01-23456789abcd", True),
        ("3F2B8C1E-9D4A-4B6E-8F01-23456789ABCD", False),  # uppercase
        ("3f2b8c1e-9d4a-3b6e-8f01-23456789abcd", False),  # version 3
        ("3f2b8c1e-9d4a-4b6e-cf01-23456789abcd", False),  # variant
        ("3f2b8c1e9d4a4b6e8f0123456789abcd", False),  # no hyphens
        ("{3f2b8c1e-9d4a-4b6e-8f01-23456789abcd}", False),
        ("3f2b8c1e-9d4a-4b6e-8f01-23456789abcd\n", False),
        ("", False),
    ],
)
def test_uuid_v4_lowercase_grammar(value, ok):
    assert H_GRAMMARS["uuid-v4-lowercase"](value) is ok
