"""Endpoints for machines: a JSON health check and Prometheus metrics.

`/admin/health` answers anyone (monitoring, a container healthcheck): 200 with `"status": "ok"` when
the database answers a read and a write within a few seconds, else 503. It says nothing private.

`/admin/metrics` (text format 0.0.4, written by prometheus_client) needs a signed-in session or
`Authorization: Bearer <metrics_token>`, except on the dashboard's own listener (`admin_listen`),
which the operator has bound to a private address. Each appliance has its own registry (several in
one process never share one): the values read at each scrape, then two histograms the relay and the
push executor feed as they go, the REQ latency (a REQ taken to its EOSE queued) and the wake latency
(an event accepted to the provider's answer to the wake it caused). Label sets are bounded: `origin`
takes the configured origins' URLs, `prefix` the NIP-01 refusal prefixes, `state` and `outcome`
fixed lists.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from appliance import __version__
from appliance.errors import PREFIXES
from appliance.origins import UnknownOrigin
from appliance.store import meta
from appliance.store.meta import health_probe

from .health import STATES
from .health import states as transport_states

# Seconds the health check waits for the database before it answers 503.
HEALTH_TIMEOUT = 5.0
MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Bucket bounds (seconds). A REQ's answer takes about a millisecond on a quiet relay and up to its
# query timeout under load; a wake's provider answer takes tens of milliseconds when sent at once,
# and up to the wake's useful age (an hour by default) when it waited for retries.
REQ_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAKE_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

Samples = Iterable[tuple[dict[str, str], float]]


def _failed(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return f"failed: no answer within {HEALTH_TIMEOUT:g} s"
    return "failed: the database refused it"


def _family(kind, name: str, documentation: str, samples: Samples, labels: tuple[str, ...] | None) -> Metric:
    """A metric family of `kind` (gauge, counter) with its samples; its label names are `labels`,
    else those of its first sample (a family that may have no samples names them)."""
    samples = list(samples)
    if labels is None:
        labels = tuple(samples[0][0]) if samples else ()
    family = kind(name, documentation, labels=labels)
    for values, value in samples:
        family.add_metric([values[k] for k in labels], value)
    return family


def _gauge(name: str, documentation: str, samples: Samples, labels: tuple[str, ...] | None = None) -> Metric:
    return _family(GaugeMetricFamily, name, documentation, samples, labels)


def _counter(name: str, documentation: str, samples: Samples, labels: tuple[str, ...] | None = None) -> Metric:
    return _family(CounterMetricFamily, name, documentation, samples, labels)


class _Scrape:
    """The collector of the values read for the scrape under way (`Machines.render`)."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> list[Metric]:
        return self.families


class Machines:
    def __init__(self, admin):
        self.admin = admin
        self.app = admin.app
        self.registry = CollectorRegistry(auto_describe=False)
        self._scrape = _Scrape()
        self.registry.register(self._scrape)
        self.req_latency = Histogram(
            "appliance_req_latency_seconds", "Seconds from a REQ taken from its connection to its stored answer "
            "and EOSE queued for it, by origin (REQs closed, replaced or refused first are not counted).",
            ["origin"], buckets=REQ_LATENCY_BUCKETS, registry=self.registry)
        self._req_children: dict[str, Any] = {}  # req_latency by origin URL (origins are few)
        self.wake_latency = Histogram(
            "appliance_wake_latency_seconds", "Seconds from an event accepted to the provider's answer to the wake "
            "it caused (each answered attempt; retries included), by origin and outcome (accepted, transient, "
            "invalid_endpoint, configuration, refresh_retry, permanent).",
            ["origin", "outcome"], buckets=WAKE_LATENCY_BUCKETS, registry=self.registry)

    def observe(self) -> None:
        """Feed the histograms from the relay and, when it runs, the push executor."""
        self.app.relay.on_req_answered.append(self._req_answered)
        if self.app.push is not None:
            self.app.push.delivery.on_answered.append(self._wake_answered)

    def _req_answered(self, origin, seconds: float) -> None:
        child = self._req_children.get(origin.origin)
        if child is None:  # labels() takes a lock and a lookup on every call
            child = self._req_children[origin.origin] = self.req_latency.labels(origin.origin)
        child.observe(seconds)

    def _wake_answered(self, origin_id: int, outcome: str, seconds: float) -> None:
        try:
            origin = self.app.relay.origins.by_id(origin_id).origin
        except UnknownOrigin:  # removed since the wake was written
            origin = "other"
        self.wake_latency.labels(origin, outcome).observe(seconds)

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.admin.open_endpoint(self.health), methods=["GET", "HEAD"]),
            Route("/metrics", self.admin.open_endpoint(self.metrics), methods=["GET"]),
        ]

    def root_routes(self) -> list[Route]:
        """On the dashboard's own listener, also at /health and /metrics."""
        return self.routes()

    async def health(self, request: Request) -> Response:
        checks: dict[str, str] = {}
        try:
            await asyncio.wait_for(self.app.store.read(meta.read_probe),
                                   HEALTH_TIMEOUT)
            checks["database_read"] = "ok"
        except Exception as exc:  # the check's whole point is to report it
            checks["database_read"] = _failed(exc)
        try:
            await asyncio.wait_for(self.app.store.write(health_probe(time.time())), HEALTH_TIMEOUT)
            full_since = self.app.store.full_since
            if full_since is not None:
                checks["database_write"] = (f"failed: the disk is full (writes refused since "
                                            f"{int(time.time() - full_since)} s ago)")
            else:
                checks["database_write"] = "ok"
        except Exception as exc:
            checks["database_write"] = _failed(exc)
        ok = all(v == "ok" for v in checks.values())
        body = {"status": "ok" if ok else "failing", "version": __version__,
                "uptime_seconds": int(time.time() - self.app.started_at), "checks": checks,
                "origins": len(self.app.relay.origins.origins), "connections": len(self.app.relay.sessions)}
        if ok and self.app.push is not None:
            # Each app profile's transport (the HTTP status stays the database's: a provider being
            # down is not cured by restarting the appliance). A short reason, never a host or status.
            try:
                states = await asyncio.wait_for(transport_states(self.app), HEALTH_TIMEOUT)
            except Exception:
                states = None
            if states is not None:
                body["transports"] = [{"origin": t.origin, "app_profile": t.profile, "transport": t.transport,
                                       "state": t.state, "reason": t.reason} for t in states]
                body["push"] = "failing" if any(t.state == "failing" for t in states) else \
                    "fault" if any(t.state == "fault" for t in states) else "ok"
        return JSONResponse(body, status_code=200 if ok else 503)

    async def _authorized(self, request: Request) -> bool:
        if self.admin.listen_socket is not None:
            return True
        token = self.admin.settings.metrics_token
        header = request.headers.get("authorization", "")
        if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip(), token):
            return True
        return await self.admin._session(request) is not None

    async def metrics(self, request: Request) -> Response:
        if not await self._authorized(request):
            return PlainTextResponse("unauthorized: sign in to the dashboard, or send Authorization: Bearer "
                                     "<metrics_token>\n", status_code=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="appliance metrics"'})
        return Response(await self.render(), media_type=MEDIA_TYPE)

    async def render(self) -> bytes:
        """The exposition of one scrape: what is read now, then the histograms."""
        families = await self._read()
        # No await from here on: a concurrent scrape cannot swap in its own values meanwhile.
        self._scrape.families = families
        try:
            return generate_latest(self.registry)
        finally:
            self._scrape.families = []

    async def _read(self) -> list[Metric]:
        """The values read at scrape time, in the order the endpoint has always given them."""
        app, relay = self.app, self.app.relay
        origins = {o.id: o.origin for o in relay.origins.origins}
        now = int(time.time())
        memory = app.store.memory_used()  # None on PostgreSQL: the gauge then has no sample
        out: list[Metric] = [
            _gauge("appliance_info", "Version of the running appliance.", [({"version": __version__}, 1)]),
            _gauge("appliance_uptime_seconds", "Seconds since the appliance started.",
                   [({}, round(time.time() - app.started_at, 1))]),
            _gauge("appliance_origins", "Origins (communities) served.", [({}, len(origins))]),
            _gauge("appliance_sqlite_memory_bytes", "Memory SQLite holds now (page caches of the writer and the "
                   "readers, statements), of the process's resident memory.",
                   [({}, memory)] if memory is not None else []),
            _gauge("appliance_event_loop_lag_seconds", "Largest delay of the event loop's timer ticks since the "
                   "last scrape (how long a ready task may wait to run).",
                   [({}, round(self.admin.loop_lag.worst(), 4))]),
        ]
        per_origin: dict[int, int] = {oid: 0 for oid in origins}
        for session in list(relay.sessions):
            oid = session.origin.id
            if oid in per_origin:
                per_origin[oid] += 1
        out.append(_gauge("appliance_connections", "Open websocket connections.",
                          [({"origin": origins[oid]}, n) for oid, n in per_origin.items()]))
        out.append(_gauge("appliance_output_queued_bytes", "Bytes of answers queued for clients that have not "
                          "read them yet, all connections together (bounded by max_output_buffer_total).",
                          [({}, relay.queued_bytes)]))
        out.append(_gauge("appliance_output_queued_bytes_peak", "The most bytes of unread answers there have "
                          "been queued at once since start.", [({}, relay.output_peak)]))
        out.append(_counter("appliance_events_accepted_total", "Events accepted since start.",
                            [({}, relay.stats["accepted"])]))
        by_prefix: dict[tuple[str, str], int] = {}
        for (oid, reason), n in self.admin.recorder.rejections.items():
            prefix = reason.partition(":")[0]
            prefix = prefix if prefix in PREFIXES else "other"
            key = (origins.get(oid, "other"), prefix)
            by_prefix[key] = by_prefix.get(key, 0) + n
        out.append(_counter("appliance_events_rejected_total", "Events refused since start, by NIP-01 prefix.",
                            [({"origin": o, "prefix": p}, n) for (o, p), n in sorted(by_prefix.items())],
                            labels=("origin", "prefix")))
        commits, writes = app.store.writer_stats
        out.append(_counter("appliance_store_commits_total", "Write transactions committed.", [({}, commits)]))
        out.append(_counter("appliance_store_writes_total", "Writes committed.", [({}, writes)]))
        out.append(_gauge("appliance_store_writes_queued", "Writes waiting for the writer (not the batch it is "
                          "writing).", [({}, app.store.writes_queued)]))
        out.append(_counter("appliance_store_lock_reorders_total", "Writes run again in a new transaction to "
                            "take their node locks in order (several nodes over PostgreSQL).",
                            [({}, app.store.lock_reorders)]))
        from appliance.store.leases import lease_totals

        totals = await app.store.read(lambda conn: lease_totals(conn, now))
        out.append(_gauge("appliance_leases", "Push leases by state.",
                          [({"origin": origins[oid], "state": state}, totals.get(oid, (0, 0, 0))[i])
                           for oid in origins for i, state in ((0, "active"), (1, "inactive"))],
                          labels=("origin", "state")))
        if app.push is not None:
            from appliance.store.wakes import alerts, queue_summary

            summary = await app.store.read(queue_summary)
            out.append(_gauge("appliance_wake_queue_depth", "Wakes waiting in the outbox (due, retrying or being "
                              "sent), and dead-lettered ones.",
                              [({"state": "queued"}, summary["queued"]), ({"state": "retrying"}, summary["failed"]),
                               ({"state": "dead"}, summary["dead"])]))
            states = await transport_states(app)
            out.append(_gauge("appliance_transport_state", "State of each app profile's transport: 1 for the state "
                              "it is in (ok, idle, failing: the last 3 attempts failed transiently or the host "
                              "refuses connections, fault: configuration), 0 for the others.",
                              [({"origin": t.origin, "app_profile": t.profile, "state": state},
                                int(t.state == state)) for t in states for state in STATES],
                              labels=("origin", "app_profile", "state")))
            out.append(_gauge("appliance_transport_failures", "Transient failures in a row of each app profile's "
                              "transport since its last answer.",
                              [({"origin": t.origin, "app_profile": t.profile}, t.failures) for t in states],
                              labels=("origin", "app_profile")))
            active = await app.store.read(alerts)
            per_origin_alerts = {oid: 0 for oid in origins}
            for a in active:
                if a["origin"] in per_origin_alerts:
                    per_origin_alerts[a["origin"]] += 1
            out.append(_gauge("appliance_push_alerts", "Push alerts not cleared by a success yet (dismissed ones "
                              "included).", [({"origin": origins[oid]}, n) for oid, n in per_origin_alerts.items()]))
        return out
