"""Overview: version, uptime, origins, live connections, events/s, active leases, wake jobs,
transport health and alerts, and the last hour as small charts; the numbers refresh every 10 s."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.routing import Route

from appliance.store.leases import lease_totals

from ..charts import line_chart


def routes(admin) -> list[Route]:
    async def page(request: Request):
        return admin.render(request, "admin/overview.html", section="overview", **await context(admin))

    async def stats(request: Request):
        return admin.render(request, "admin/overview_stats.html", **await context(admin))

    return [Route("/", admin.guard(page)), Route("/overview/stats", admin.guard(stats))]


async def context(admin) -> dict:
    app = admin.app
    now = int(time.time())
    totals = await app.store.read(lambda conn: lease_totals(conn, now))
    per_origin: dict[int, int] = {}
    for session in list(app.relay.sessions):
        per_origin[session.origin.id] = per_origin.get(session.origin.id, 0) + 1
    rec = admin.recorder
    ctx = {
        "uptime": time.time() - app.started_at,
        "origins": app.relay.origins.origins,
        "connections": len(app.relay.sessions),
        "per_origin": per_origin,
        "events_per_s": rec.latest("events_per_s"),
        # Effective leases only: at origins whose push is on (a lease elsewhere wakes nothing).
        "active_leases": sum(t[0] for oid, t in totals.items() if app.push is not None and oid in app.push.origins),
        "wakes": None, "alerts": [], "transports": [], "wakes_per_s": rec.latest("wakes_per_s"),
        "chart_events": line_chart("Events per second, last hour", {"events/s": rec.series("events_per_s")},
                                   span=3600),
        "chart_wakes": line_chart("Wakes per second, last hour", {"wakes/s": rec.series("wakes_per_s")}, span=3600),
        "chart_queue": line_chart("Wake jobs waiting, last hour", {"queued": rec.series("queue_depth")}, span=3600),
    }
    deliveries = admin.sections.get("deliveries")
    if deliveries is not None:
        ctx.update(await deliveries.overview(admin))
    return ctx
