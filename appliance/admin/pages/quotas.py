"""Quotas: the limits configured per origin and what is used now (top consumers by fingerprint),
and refusals by reason over time."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.routing import Route

from appliance.origins import load_origins
from appliance.push.config import push_limits
from appliance.store.leases import top_lease_authors
from appliance.store.events import event_counts, top_authors

from ..charts import line_chart

# Relay limits shown per origin (they apply to every origin alike).
RELAY_LIMITS = ("max_message_length", "max_subscriptions", "max_filters", "max_limit", "max_event_tags",
                "max_content_length", "event_rate", "event_burst", "req_rate", "req_burst", "max_query_bytes",
                "query_timeout")
TOP = 10
RECENT = 86400


def routes(admin) -> list[Route]:
    red = admin.redactor

    async def page(request: Request):
        now = int(time.time())

        def read(conn):
            origins = load_origins(conn)
            counts = event_counts(conn)
            out = []
            for o in origins:
                leases = top_lease_authors(conn, o.id, now, TOP) if o.push else []
                events = top_authors(conn, o.id, now - RECENT, TOP)
                out.append((o, counts.get(o.id, 0), leases, events))
            return out

        rows = await admin.read(read)
        connections: dict[int, int] = {}
        for session in list(admin.app.relay.sessions):
            connections[session.origin.id] = connections.get(session.origin.id, 0) + 1
        rec = admin.recorder
        per_origin = []
        for o, stored, leases, events in rows:
            limits = push_limits(o.push) if o.push else None
            reasons = sorted(((reason, n) for (oid, reason), n in rec.rejections.items() if oid == o.id),
                             key=lambda r: -r[1])
            chart = line_chart(f"Refusals at {o.origin}, last hour",
                               {reason: rec.rejection_series(o.id, reason) for reason, _n in reasons[:5]},
                               span=3600)
            per_origin.append({
                "origin": o, "stored": stored, "connections": connections.get(o.id, 0), "limits": limits,
                "max_leases": limits.max_leases_per_pubkey if limits else None,
                "lease_top": [(red.fingerprint(pk, "pk"), n) for pk, n in leases],
                "event_top": [(red.fingerprint(pk, "pk"), n) for pk, n in events],
                "reasons": reasons, "chart": chart,
            })
        relay_limits = [(name, getattr(admin.settings, name)) for name in RELAY_LIMITS]
        return admin.render(request, "admin/quotas.html", section="quotas", per_origin=per_origin,
                            relay_limits=relay_limits, top=TOP)

    return [Route("/quotas", admin.guard(page), methods=["GET"])]
