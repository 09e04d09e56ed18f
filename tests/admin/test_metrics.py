"""`/admin/metrics` through prometheus_client: what it serves parses with prometheus_client's own
text parser, label values are escaped (a backslash, a quote and a newline come back as they were),
each appliance has its own registry (two in one process do not collide), and the two histograms
measure what they say: a REQ taken to its EOSE, an event accepted to the provider's answer to its
wake (a real `appliance serve` with the APNs emulator)."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Client, Server
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, token, wait_until
from tests.push.e2e_helpers import ORIGIN

from .helpers import Dashboard

pytestmark = pytest.mark.anyio

TOKEN = "metrics-test-token"

# Every metric the endpoint has served, with its type and label names (scrapers depend on them).
SERVED = {
    "appliance_info": ("gauge", {"version"}),
    "appliance_uptime_seconds": ("gauge", set()),
    "appliance_origins": ("gauge", set()),
    "appliance_sqlite_memory_bytes": ("gauge", set()),
    "appliance_event_loop_lag_seconds": ("gauge", set()),
    "appliance_connections": ("gauge", {"origin"}),
    "appliance_output_queued_bytes": ("gauge", set()),
    "appliance_output_queued_bytes_peak": ("gauge", set()),
    "appliance_events_accepted_total": ("counter", set()),
    "appliance_events_rejected_total": ("counter", {"origin", "prefix"}),
    "appliance_store_commits_total": ("counter", set()),
    "appliance_store_writes_total": ("counter", set()),
    "appliance_store_writes_queued": ("gauge", set()),
    "appliance_store_lock_reorders_total": ("counter", set()),
    "appliance_leases": ("gauge", {"origin", "state"}),
    "appliance_wake_queue_depth": ("gauge", {"state"}),
    "appliance_transport_state": ("gauge", {"origin", "app_profile", "state"}),
    "appliance_transport_failures": ("gauge", {"origin", "app_profile"}),
    "appliance_push_alerts": ("gauge", {"origin"}),
}


def parse(text: str) -> dict[str, list]:
    """Sample name -> [(labels, value)], through prometheus_client's parser (it fails on bad text)."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels) -> float:
    found = [v for have, v in samples.get(name, []) if all(have.get(k) == w for k, w in labels.items())]
    return sum(found)


def scrape(server: Server) -> tuple[str, dict]:
    r = httpx.get(f"{server.http}/admin/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return r.text, parse(r.text)


async def test_every_metric_keeps_its_name_type_and_labels_and_the_histograms_measure(tmp_path):
    apns = Apns(tmp_path).start()
    server = Server(tmp_path / "data", config=delivery_config(apns, settings={"metrics_token": TOKEN})).start()
    try:
        alice, bob = await Pusher.connect(server), await Pusher.connect(server)
        tok = token()
        await bob.lease(tok, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]},
                                            "class": "time_sensitive"}])
        text, before = scrape(server)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        for name, (kind, labels) in SERVED.items():
            family = families[name.removesuffix("_total") if kind == "counter" else name]
            assert family.type == kind, name
            assert f"# TYPE {name} {kind}\n" in text
            for s in family.samples:
                assert set(s.labels) == labels, (name, s.labels)
        assert value(before, "appliance_transport_state", origin=ORIGIN, app_profile="com.example.app/ios",
                     state="idle") == 1

        # A REQ: counted once, and no longer than the client waited for its EOSE.
        reader = await Client.connect(server.url, "push.test")
        started = time.monotonic()
        events, closed = await reader.req("r", {"kinds": [9], "limit": 10})
        waited = time.monotonic() - started
        assert closed is None
        _, after = scrape(server)
        count = "appliance_req_latency_seconds_count"
        assert value(after, count, origin=ORIGIN) == value(before, count, origin=ORIGIN) + 1
        spent = (value(after, "appliance_req_latency_seconds_sum", origin=ORIGIN)
                 - value(before, "appliance_req_latency_seconds_sum", origin=ORIGIN))
        assert 0 < spent <= waited, (spent, waited)
        assert value(after, "appliance_req_latency_seconds_bucket", origin=ORIGIN, le="+Inf") == \
            value(after, count, origin=ORIGIN)

        # A wake: from the event's acceptance to APNs's answer, once, outcome accepted. The job is
        # written when the event is accepted (before its OK); the answer comes after APNs has the
        # request and before the scrape shows it.
        published = time.time()
        await alice.publish(9, [["p", bob.pubkey]])
        accepted = time.time()
        apns.emulator.wait_for(lambda rs: any(r.token == tok and r.status == 200 for r in rs), timeout=30)
        received = time.time()
        wake = "appliance_wake_latency_seconds"
        await wait_until(lambda: value(scrape(server)[1], f"{wake}_count", outcome="accepted") == 1, timeout=10)
        seen = time.time()
        _, last = scrape(server)
        assert value(last, f"{wake}_count", origin=ORIGIN, outcome="accepted") == 1
        seconds = value(last, f"{wake}_sum", origin=ORIGIN, outcome="accepted")
        assert received - accepted <= seconds <= seen - published, (received - accepted, seconds, seen - published)
        assert value(last, f"{wake}_bucket", origin=ORIGIN, outcome="accepted", le="+Inf") == 1
        assert value(last, "appliance_events_accepted_total") >= 2
        for p in (alice, bob):
            await p.client.close()
        await reader.close()
    finally:
        server.stop()
        apns.stop()


async def test_label_values_are_escaped_and_parse_back(tmp_path, anyio_backend):
    d = Dashboard(tmp_path / "data", metrics_token=TOKEN)
    try:
        awkward = 'back\\slash "quoted"\nsecond line'
        d.admin.machines.req_latency.labels(awkward).observe(0.003)
        r = await d.get("/admin/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        assert 'origin="back\\\\slash \\"quoted\\"\\nsecond line"' in r.text  # the text format's escapes
        samples = parse(r.text)
        assert value(samples, "appliance_req_latency_seconds_count", origin=awkward) == 1
        assert value(samples, "appliance_req_latency_seconds_bucket", origin=awkward, le="0.005") == 1
        assert value(samples, "appliance_req_latency_seconds_bucket", origin=awkward, le="0.0025") == 0
    finally:
        await d.close()


async def test_the_database_memory_is_the_stores_own(tmp_path, anyio_backend):
    """The memory gauge asks the store: SQLite's caches live in this process; PostgreSQL's are the
    server's, so the gauge is served without a sample rather than with SQLite's idle figure."""
    d = Dashboard(tmp_path / "data", metrics_token=TOKEN)
    try:
        r = await d.get("/admin/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert "# TYPE appliance_sqlite_memory_bytes gauge" in r.text
        samples = parse(r.text).get("appliance_sqlite_memory_bytes", [])
        if d.app.store.backend == "sqlite":
            assert len(samples) == 1 and samples[0][1] > 0, samples
        else:
            assert d.app.store.memory_used() is None and samples == []
    finally:
        await d.close()


async def test_two_appliances_in_one_process_keep_their_own_metrics(tmp_path, anyio_backend):
    """Each appliance has its own registry: a second one in the same process builds (the global
    registry would refuse its histograms twice) and counts only its own REQs."""
    a = Dashboard(tmp_path / "a", metrics_token=TOKEN)
    b = Dashboard(tmp_path / "b", metrics_token=TOKEN)
    try:
        assert a.admin.machines.registry is not b.admin.machines.registry
        origin = a.app.relay.origins.origins[0]
        for observe in a.app.relay.on_req_answered:  # as the relay calls it once a REQ is answered
            observe(origin, 0.02)
        seen = []
        for d in (a, b):
            r = await d.get("/admin/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200
            seen.append(value(parse(r.text), "appliance_req_latency_seconds_count"))
        assert seen == [1, 0]
    finally:
        await a.close()
        await b.close()
