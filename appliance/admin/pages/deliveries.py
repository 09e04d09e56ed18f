"""Deliveries (the push executor's side): the delivery log with filters (origin, profile, outcome,
time), dead-lettered wakes with retry and discard, per-outcome counts and a latency chart; the
overview's wake counters, alerts and transport health; the "send a test wake" action of an app
profile (APNs, and the draft transports while they are on). Lease addresses appear as the dashboard's lease fingerprints; endpoints never."""

from __future__ import annotations

import asyncio
import time
import uuid

from starlette.requests import Request
from starlette.routing import Route

from appliance.commands.origins import find
from appliance.errors import ConfigError
from appliance.origins import load_origins
from appliance.push.delivery import DeliverySettings, note_health
from appliance.push.kinds import is_draft
from appliance.push.kinds import provider_name
from appliance.store import wakes
from appliance.transports import ACCEPTED, OUTCOME_KINDS, WakeRequest

from ..charts import line_chart

PAGE_SIZE = 100
WINDOWS = {"hour": 3600, "day": 86400, "week": 7 * 86400}
# Seconds a test wake may wait for the provider's answer.
TEST_WAKE_TIMEOUT = 35.0
# Seconds the provider may hold a test wake (apns-expiration, FCM's ttl): it is worth nothing later.
TEST_WAKE_EXPIRY = 60


class DeliveriesSection:
    def __init__(self, admin):
        self.admin = admin
        self._last_sent: tuple[float, int] | None = None
        admin.recorder.probes.append(self.probe)

    # -- the recorder's gauges ------------------------------------------------------------------------

    async def probe(self) -> dict[str, float]:
        app = self.admin.app
        now = time.time()
        sent = app.push.delivery.stats["sent"]
        rate = 0.0
        if self._last_sent is not None and now > self._last_sent[0]:
            rate = max(0, sent - self._last_sent[1]) / (now - self._last_sent[0])
        self._last_sent = (now, sent)
        summary = await app.store.read(wakes.queue_summary)
        return {"wakes_per_s": rate, "queue_depth": float(summary["queued"])}

    # -- overview ---------------------------------------------------------------------------------------

    async def overview(self, admin) -> dict:
        from ..health import read_states

        app = admin.app

        def read(conn):
            return wakes.queue_summary(conn), wakes.alerts(conn), load_origins(conn), read_states(conn, app.push)

        summary, alerts, origins, states = await admin.read(read)
        names = {o.id: o.origin for o in origins}
        kinds = {(o.id, p["id"]): p.get("transport") for o in origins for p in o.push.get("app_profiles", [])}
        fmt = admin.templates.globals["fmt_time"]
        alert_rows = [{"text": f"{names.get(a['origin'], a['origin'])} · {a['app_profile']}: {a['reason']} — "
                               f"{a['detail']} ({a['count']}×, last {fmt(a['last_at'])})",
                       "origin": a["origin"], "profile": a["app_profile"], "reason": a["reason"],
                       "transport": kinds.get((a["origin"], a["app_profile"]))}
                      for a in alerts if not a["dismissed_at"]]
        transports = [{"origin": s.origin, "profile": s.profile, "transport": s.transport, "state": s.state,
                       "detail": s.detail} for s in states]
        return {"wakes": summary, "alerts": alert_rows, "dismissed": sum(1 for a in alerts if a["dismissed_at"]),
                "transports": transports}

    # -- pages ---------------------------------------------------------------------------------------------

    def routes(self, admin) -> list[Route]:
        red = admin.redactor

        async def page(request: Request, error: str = "", status: int = 200):
            q = request.query_params
            now = time.time()
            window = q.get("window") if q.get("window") in WINDOWS else "day"
            filters = {
                "origin": int(q["origin"]) if q.get("origin", "").isdigit() else None,
                "app_profile": q.get("app_profile") or None,
                "outcome": q.get("outcome") if q.get("outcome") in OUTCOME_KINDS else None,
                "since": now - WINDOWS[window],
                "before_id": int(q["before"]) if q.get("before", "").isdigit() else None,
            }

            def read(conn):
                rows = wakes.delivery_log(conn, limit=PAGE_SIZE + 1, **filters)
                jobs = wakes.jobs_by_id(conn, {r["job_id"] for r in rows})
                dead = wakes.list_jobs(conn, state="dead", limit=PAGE_SIZE)
                counts = wakes.outcome_counts(conn, filters["since"], filters["origin"])
                latency = wakes.latency_by_minute(conn, now - 3600)
                return rows, jobs, dead, counts, latency, load_origins(conn)

            rows, jobs, dead, counts, latency, origins = await admin.read(read)
            names = {o.id: o.origin for o in origins}

            def lease_fp(job_id: str, fallback: str) -> str:
                job = jobs.get(job_id)
                return red.lease(job.lease_pubkey, job.lease_d) if job else fallback

            def author_fp(job_id: str) -> str:
                job = jobs.get(job_id)
                return red.fingerprint(job.lease_pubkey, "pk") if job else ""

            log = [{**r, "origin_name": names.get(r["origin"], str(r["origin"])),
                    "lease_fp": lease_fp(r["job_id"], r["lease"]), "author_fp": author_fp(r["job_id"])}
                   for r in rows[:PAGE_SIZE]]
            dead_rows = [{"id": j.id, "origin": names.get(j.origin, str(j.origin)), "origin_id": j.origin,
                          "profile": j.app_profile, "transport": j.transport, "author_fp": red.fingerprint(j.lease_pubkey, "pk"),
                          "lease_fp": red.lease(j.lease_pubkey, j.lease_d), "class": j.cls, "attempts": j.attempts,
                          "created_at": j.created_at, "finished_at": j.finished_at, "last_error": j.last_error or ""}
                         for j in dead]
            chart = line_chart("Delivery latency per minute, last hour (ms)", {
                "mean": [(t, avg or 0.0) for t, _n, avg, _mx in latency],
                "slowest": [(t, mx or 0.0) for t, _n, _avg, mx in latency],
            }, span=3600, unit="ms")
            # Profile id -> its transport (a draft one where any origin's profile of that id is).
            profiles: dict[str, str] = {}
            for p in sorted((p for o in origins for p in o.push.get("app_profiles", [])),
                            key=lambda p: is_draft(p.get("transport", ""))):
                profiles[p["id"]] = p.get("transport", "")
            profiles = dict(sorted(profiles.items()))
            return admin.render(request, "admin/deliveries.html", status=status, section="deliveries", log=log,
                                more=len(rows) > PAGE_SIZE, dead=dead_rows, counts=counts, outcomes=OUTCOME_KINDS,
                                chart=chart, origins=origins, profiles=profiles, windows=list(WINDOWS), window=window,
                                q=q, error=error,
                                back="/deliveries" + (f"?{request.url.query}" if request.url.query else ""))

        async def dead_action(request: Request):
            form = request.state.form
            job_id = str(form.get("job", ""))
            action = str(form.get("action", ""))
            now = time.time()
            useful_age = admin.settings.wake_useful_age
            if action == "retry":
                done = await admin.app.store.write(lambda conn: wakes.retry_dead(conn, job_id, now, useful_age))
                admin.app.push.delivery.nudge()
                msg = "Wake queued again." if done else "That wake is no longer dead-lettered."
            elif action == "discard":
                done = await admin.app.store.write(lambda conn: wakes.discard_dead(conn, job_id, now))
                msg = "Wake discarded." if done else "That wake is no longer dead-lettered."
            else:
                return await page(request, "Unknown action.", 400)
            return admin.redirect("/deliveries", msg)

        async def test_wake(request: Request):
            form = request.state.form
            origin = await admin.read(lambda conn: find(conn, int(form.get("origin", 0))))
            profile = str(form.get("profile", ""))
            token = str(form.get("token", "")).strip()
            entry = next((p for p in origin.push.get("app_profiles", []) if p["id"] == profile), None)
            if entry is None:
                raise ConfigError("profile", profile, "no app profile of that name at this origin")
            pushing = admin.app.push
            if pushing is not None and pushing.transports.is_off(entry["transport"]):
                raise ConfigError("profile", profile, f"{entry['transport']} is a draft transport, off while "
                                  "push_draft_transports is false: turn it on to send through this profile")
            transport = pushing.transports.get(origin.id, profile) if pushing else None
            if transport is None:
                raise ConfigError("profile", profile, "this profile has no transport yet (save the descriptor)")
            request_id = str(uuid.uuid4())
            started = time.monotonic()
            try:
                outcome = await asyncio.wait_for(transport.send(WakeRequest(
                    endpoint=token, request_id=request_id, expires_at=int(time.time()) + TEST_WAKE_EXPIRY)),
                    TEST_WAKE_TIMEOUT)
            except asyncio.TimeoutError:
                outcome = None
            latency = (time.monotonic() - started) * 1000
            if outcome is not None:
                # The profile's health takes the answer like a wake's: an accepted test wake clears
                # its alerts (a fixed configuration), a refused connection makes it failing.
                await admin.app.store.write(
                    lambda conn: note_health(conn, origin.id, profile, outcome, time.time()))
            return admin.render(request, "admin/test_wake.html", section="descriptor", origin=origin,
                                profile=profile, transport=entry["transport"],
                                provider=provider_name(entry["transport"]), outcome=outcome, accepted=outcome is not None and
                                outcome.kind == ACCEPTED, request_id=request_id, latency=latency,
                                token_fp=red.fingerprint(token, "ep"))

        async def dismiss(request: Request):
            form = request.state.form
            origin = int(form["origin"]) if str(form.get("origin", "")).isdigit() else -1
            profile, reason = str(form.get("profile", "")), str(form.get("reason", ""))
            done = await admin.app.store.write(
                lambda conn: wakes.dismiss_alert(conn, origin, profile, reason, time.time()))
            return admin.redirect("/", "Alert dismissed: it shows again if it comes back after a success."
                                  if done else "That alert is no longer active.")

        return [
            Route("/alerts/dismiss", admin.guard(dismiss), methods=["POST"]),
            Route("/deliveries", admin.guard(page), methods=["GET"]),
            Route("/deliveries/dead", admin.guard(dead_action), methods=["POST"]),
            Route("/descriptor/test-wake", admin.guard(test_wake), methods=["POST"]),
        ]


def refresh_delivery_settings(app) -> None:
    """Dashboard-edited settings the delivery side copied at start (the log retention) apply now."""
    if app.push is not None:
        fresh = DeliverySettings.from_settings(app.settings)
        app.push.settings = fresh
        app.push.delivery.settings = fresh
