"""Endpoints for machines: a JSON health check and Prometheus metrics.

`/admin/health` answers anyone (monitoring, a container healthcheck): 200 with `"status": "ok"` when
the database answers a read and a write within a few seconds, else 503. It says nothing private.

`/admin/metrics` (text format 0.0.4) needs a signed-in session or `Authorization: Bearer
<metrics_token>`, except on the dashboard's own listener (`admin_listen`), which the operator has
bound to a private address. Label sets are bounded: `origin` takes the configured origins' URLs,
`prefix` the NIP-01 refusal prefixes, `state` a fixed list.
"""

from __future__ import annotations

import asyncio
import hmac
import time


from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from appliance import __version__
from appliance.errors import PREFIXES
from appliance.store import meta
from appliance.store.sqlite import memory_used as sqlite_memory_used
from appliance.store.meta import health_probe

from .health import STATES
from .health import states as transport_states

# Seconds the health check waits for the database before it answers 503.
HEALTH_TIMEOUT = 5.0


def _failed(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return f"failed: no answer within {HEALTH_TIMEOUT:g} s"
    return "failed: the database refused it"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Machines:
    def __init__(self, admin):
        self.admin = admin
        self.app = admin.app
        # Gauges and counters other parts add: callables returning [(name, help, type, [(labels, value)])].
        self.collectors: list = []

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
        return PlainTextResponse(await self.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def render(self) -> str:
        app, relay = self.app, self.app.relay
        origins = {o.id: o.origin for o in relay.origins.origins}
        now = int(time.time())
        metrics: list[tuple[str, str, str, list[tuple[dict, float]]]] = [
            ("appliance_info", "Version of the running appliance.", "gauge", [({"version": __version__}, 1)]),
            ("appliance_uptime_seconds", "Seconds since the appliance started.", "gauge",
             [({}, round(time.time() - app.started_at, 1))]),
            ("appliance_origins", "Origins (communities) served.", "gauge", [({}, len(origins))]),
            ("appliance_sqlite_memory_bytes", "Memory SQLite holds now (page caches of the writer and the "
             "readers, statements), of the process's resident memory.", "gauge", [({}, sqlite_memory_used())]),
            ("appliance_event_loop_lag_seconds", "Largest delay of the event loop's timer ticks since the last "
             "scrape (how long a ready task may wait to run).", "gauge",
             [({}, round(self.admin.loop_lag.worst(), 4))]),
        ]
        per_origin: dict[int, int] = {oid: 0 for oid in origins}
        for session in list(relay.sessions):
            oid = session.origin.id
            if oid in per_origin:
                per_origin[oid] += 1
        metrics.append(("appliance_connections", "Open websocket connections.", "gauge",
                        [({"origin": origins[oid]}, n) for oid, n in per_origin.items()]))
        metrics.append(("appliance_output_queued_bytes", "Bytes of answers queued for clients that have not read "
                        "them yet, all connections together (bounded by max_output_buffer_total).", "gauge",
                        [({}, relay.queued_bytes)]))
        metrics.append(("appliance_output_queued_bytes_peak", "The most bytes of unread answers there have been "
                        "queued at once since start.", "gauge", [({}, relay.output_peak)]))
        metrics.append(("appliance_events_accepted_total", "Events accepted since start.", "counter",
                        [({}, relay.stats["accepted"])]))
        by_prefix: dict[tuple[str, str], int] = {}
        for (oid, reason), n in self.admin.recorder.rejections.items():
            prefix = reason.partition(":")[0]
            prefix = prefix if prefix in PREFIXES else "other"
            key = (origins.get(oid, "other"), prefix)
            by_prefix[key] = by_prefix.get(key, 0) + n
        metrics.append(("appliance_events_rejected_total", "Events refused since start, by NIP-01 prefix.",
                        "counter", [({"origin": o, "prefix": p}, n) for (o, p), n in sorted(by_prefix.items())]))
        commits, writes = app.store.writer_stats
        metrics.append(("appliance_store_commits_total", "Write transactions committed.", "counter", [({}, commits)]))
        metrics.append(("appliance_store_writes_total", "Writes committed.", "counter", [({}, writes)]))
        metrics.append(("appliance_store_writes_queued", "Writes waiting for the writer (not the batch it is "
                        "writing).", "gauge", [({}, app.store.writes_queued)]))
        metrics.append(("appliance_store_lock_reorders_total", "Writes run again in a new transaction to take "
                        "their node locks in order (several nodes over PostgreSQL).", "counter",
                        [({}, app.store.lock_reorders)]))
        from appliance.store.leases import lease_totals

        totals = await app.store.read(lambda conn: lease_totals(conn, now))
        metrics.append(("appliance_leases", "Push leases by state.", "gauge",
                        [({"origin": origins[oid], "state": state}, totals.get(oid, (0, 0, 0))[i])
                         for oid in origins for i, state in ((0, "active"), (1, "inactive"))]))
        if app.push is not None:
            from appliance.store.wakes import queue_summary

            summary = await app.store.read(queue_summary)
            metrics.append(("appliance_wake_queue_depth", "Wakes waiting in the outbox (due, retrying or being "
                            "sent), and dead-lettered ones.", "gauge",
                            [({"state": "queued"}, summary["queued"]), ({"state": "retrying"}, summary["failed"]),
                             ({"state": "dead"}, summary["dead"])]))
        if app.push is not None:
            from appliance.store.wakes import alerts

            states = await transport_states(app)
            metrics.append(("appliance_transport_state", "State of each app profile's transport: 1 for the state it "
                            "is in (ok, idle, failing: the last 3 attempts failed transiently or the host refuses "
                            "connections, fault: configuration), 0 for the others.", "gauge",
                            [({"origin": t.origin, "app_profile": t.profile, "state": state}, int(t.state == state))
                             for t in states for state in STATES]))
            metrics.append(("appliance_transport_failures", "Transient failures in a row of each app profile's "
                            "transport since its last answer.", "gauge",
                            [({"origin": t.origin, "app_profile": t.profile}, t.failures) for t in states]))
            active = await app.store.read(alerts)
            per_origin_alerts = {oid: 0 for oid in origins}
            for a in active:
                if a["origin"] in per_origin_alerts:
                    per_origin_alerts[a["origin"]] += 1
            metrics.append(("appliance_push_alerts", "Push alerts not cleared by a success yet (dismissed ones "
                            "included).", "gauge",
                            [({"origin": origins[oid]}, n) for oid, n in per_origin_alerts.items()]))
        for collect in self.collectors:
            metrics.extend(await collect())
        lines: list[str] = []
        for name, help_text, kind, samples in metrics:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                text = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")
        return "\n".join(lines) + "\n"
