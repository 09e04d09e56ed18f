"""A `transport = "unifiedpush"` app profile's settings are checked when the configuration loads:
the error names the field and says what is expected."""

from __future__ import annotations

import time

import pytest

from appliance.errors import ConfigError
from appliance.origins import Origin
from appliance.push.config import check_push_config
from appliance.push.profiles import ProfileTransports, Unconfigured
from appliance.testing.distributor import Distributor
from appliance.transports import WakeRequest
from appliance.transports.unifiedpush import DEFAULT_HOST_BURST, DEFAULT_HOST_RATE, UnifiedPushTransport

UP = "org.example.app/up"


def push(**fields) -> dict:
    return {"app_profiles": [{"id": UP, "transport": "unifiedpush", **fields}]}


def test_a_complete_profile_loads(tmp_path):
    from appliance.testing.tls import make_test_pki

    pki = make_test_pki(tmp_path)
    check_push_config(push(vapid_subject="mailto:ops@example.org", allow_hosts=["Up.Example.lan", "10.0.0.5", "::1"],
                           host_rate=2.5, host_burst=5, ca_file=str(pki.ca_file)), "[push]")
    check_push_config(push(vapid_subject="https://relay.example.org/contact"), "[push]")
    check_push_config(push(), "[push]")  # no settings: advertised, delivers nothing until they come


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"allow_hosts": ["up.example.lan"]}, "vapid_subject", "needs vapid_subject"),
    ({"vapid_subject": "ops@example.org"}, "vapid_subject", "mailto:"),
    ({"vapid_subject": "http://example.org"}, "vapid_subject", "mailto:"),
    ({"vapid_subject": "mailto:a@b", "allow_hosts": "up.example.lan"}, "allow_hosts", "list of host names"),
    ({"vapid_subject": "mailto:a@b", "allow_hosts": ["https://up.example.lan"]}, "allow_hosts", "not a host"),
    ({"vapid_subject": "mailto:a@b", "allow_hosts": ["up.example.lan:8080"]}, "allow_hosts", "not a host"),
    ({"vapid_subject": "mailto:a@b", "host_rate": 0}, "host_rate", "above 0"),
    ({"vapid_subject": "mailto:a@b", "host_rate": True}, "host_rate", "above 0"),
    ({"vapid_subject": "mailto:a@b", "host_burst": 0}, "host_burst", "whole number"),
    ({"vapid_subject": "mailto:a@b", "host_burst": 2.5}, "host_burst", "whole number"),
    ({"vapid_subject": "mailto:a@b", "ca_file": "ca.pem"}, "ca_file", "absolute path"),
    ({"vapid_subject": "mailto:a@b", "ca_file": "/nonexistent/ca.pem"}, "ca_file", "cannot be read"),
    ({"vapid_subject": "mailto:a@b", "topic": "com.example"}, "topic", "APNs setting"),
])
def test_a_bad_setting_names_its_field(fields, field, says):
    with pytest.raises(ConfigError) as exc:
        check_push_config(push(**fields), "[push]")
    assert exc.value.name == f"[push] app_profiles[0].{field}" and says in exc.value.hint, exc.value


def test_profiles_get_a_transport_per_origin_with_host_caps_per_origin(tmp_path):
    from tests.pg import make_store

    from appliance.store.keyfile import KeyFile

    store = make_store(tmp_path).open()
    try:
        entry = {"id": UP, "transport": "unifiedpush", "vapid_subject": "mailto:a@b"}
        bare_entry = {"id": "bare", "transport": "unifiedpush"}
        origins = [Origin(id=1, origin="wss://one.example", push={"app_profiles": [entry]}),
                   Origin(id=2, origin="wss://two.example", push={"app_profiles": [entry, bare_entry]})]
        transports = ProfileTransports(store=store, keyfile=KeyFile.for_store(tmp_path, store))
        transports.configure(origins, {}, drafts=True)
        one, two = transports.get(1, UP), transports.get(2, UP)
        assert isinstance(one, UnifiedPushTransport) and isinstance(two, UnifiedPushTransport) and one is not two
        assert one.vapid_keys.origin == 1 and two.vapid_keys.origin == 2  # each origin its own VAPID keys
        assert one.rates is not two.rates  # buckets per (origin, push host): NIP-PL partitions by origin
        assert (one.rates.rate, one.rates.burst) == (DEFAULT_HOST_RATE, DEFAULT_HOST_BURST)
        bare = transports.get(2, "bare")
        assert isinstance(bare, Unconfigured) and "vapid_subject" in bare.detail
        # A reload with the same settings keeps the transports (their connections and token caches).
        transports.configure(origins, {}, drafts=True)
        assert transports.get(1, UP) is one
    finally:
        store.close()


async def test_one_origins_wakes_do_not_use_up_another_origins_host_cap(tmp_path, anyio_backend):
    from tests.pg import make_store

    from appliance.store.keyfile import KeyFile

    store = make_store(tmp_path).open()
    try:
        entry = {"id": UP, "transport": "unifiedpush", "vapid_subject": "mailto:a@b"}
        second = {"id": "org.example.other/up", "transport": "unifiedpush", "vapid_subject": "mailto:a@b"}
        origins = [Origin(id=1, origin="wss://one.example", push={"app_profiles": [entry, second]}),
                   Origin(id=2, origin="wss://two.example", push={"app_profiles": [entry]})]
        transports = ProfileTransports(store=store, keyfile=KeyFile.for_store(tmp_path, store))
        transports.configure(origins, {}, drafts=True)
        one, other, two = transports.get(1, UP), transports.get(1, second["id"]), transports.get(2, UP)

        async def offline(host, port):  # nothing leaves the machine: the attempt fails after the cap
            raise OSError("offline test")

        one.resolve = other.resolve = two.resolve = offline
        keys = Distributor().subscribe("/x").endpoint.split("#", 1)[1]
        exp = int(time.time()) + 600
        outs = [await one.send(WakeRequest(f"https://push.example.net/up/a{i}#{keys}", "id", exp))
                for i in range(DEFAULT_HOST_BURST)]
        assert all(o.reason == "ResolveFailed" for o in outs)
        # Origin 1 has spent its burst to that host, on every one of its profiles with that cap ...
        out = await other.send(WakeRequest(f"https://push.example.net/up/c#{keys}", "id", exp))
        assert out.reason == "HostRateCap"
        # ... and origin 2 has not.
        out = await two.send(WakeRequest(f"https://push.example.net/up/b#{keys}", "id", exp))
        assert out.reason == "ResolveFailed", out
    finally:
        store.close()
