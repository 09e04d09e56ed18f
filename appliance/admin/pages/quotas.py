"""Quotas: the limits configured per origin and what is used now (top consumers by fingerprint),
and refusals by reason over time."""

from __future__ import annotations

import time
from collections import Counter

from starlette.requests import Request
from starlette.routing import Route

from appliance.origins import load_origins
from appliance.push.config import push_limits
from appliance.push.descriptor import LIMIT_HELP
from appliance.settings import BY_NAME, UNITS, summary
from appliance.store.leases import lease_totals, top_lease_authors
from appliance.store.events import event_counts, top_authors

from ..charts import line_chart

# Relay limits shown per origin (they apply to every origin alike).
RELAY_LIMITS = ("max_connections_per_ip", "max_subscriptions", "event_rate", "event_burst", "req_rate", "req_burst",
                "max_message_length", "max_content_length", "max_filters", "max_limit", "max_event_tags",
                "max_query_bytes", "query_timeout")
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
            return out, lease_totals(conn, now)

        rows, active = await admin.read(read)
        connections: dict[int, int] = {}
        per_address: Counter = Counter()
        busiest_subs = 0
        for session in list(admin.app.relay.sessions):
            connections[session.origin.id] = connections.get(session.origin.id, 0) + 1
            per_address[getattr(session, "peer_ip", None)] += 1
            busiest_subs = max(busiest_subs, len(getattr(session, "subs", ())))
        per_address.pop(None, None)
        rec = admin.recorder
        # What is in use now, where one number says it (the other limits bound one message each).
        in_use = {
            "max_connections_per_ip": f"{max(per_address.values(), default=0)} from the busiest address",
            "max_subscriptions": f"{busiest_subs} on the busiest connection",
            "event_rate": f"{rec.latest('events_per_s'):.1f} accepted per second, all connections together",
        }
        per_origin = []
        for o, stored, leases, events in rows:
            limits = push_limits(o.push) if o.push else None
            reasons = sorted(((reason, n) for (oid, reason), n in rec.rejections.items() if oid == o.id),
                             key=lambda r: -r[1])
            chart = line_chart(f"Refusals at {o.origin}, last hour",
                               {reason: rec.rejection_series(o.id, reason) for reason, _n in reasons[:5]},
                               span=3600)
            lease_use = {"max_leases_per_pubkey": f"{leases[0][1]} held by the busiest author (as the quota counts them)" if leases
                         else "0"} if limits else {}
            per_origin.append({
                "origin": o, "stored": stored, "connections": connections.get(o.id, 0), "limits": limits,
                "max_leases": limits.max_leases_per_pubkey if limits else None, "lease_use": lease_use,
                "active_leases": active.get(o.id, (0,))[0],
                "lease_top": [(red.fingerprint(pk, "pk"), n) for pk, n in leases],
                "event_top": [(red.fingerprint(pk, "pk"), n) for pk, n in events],
                "reasons": reasons, "chart": chart,
            })
        relay_limits = [(name, getattr(admin.settings, name), UNITS.get(name, ""), in_use.get(name, "-"),
                         summary(BY_NAME[name]).split(" Unit:")[0]) for name in RELAY_LIMITS]
        return admin.render(request, "admin/quotas.html", section="quotas", per_origin=per_origin,
                            relay_limits=relay_limits, top=TOP, limit_help=LIMIT_HELP)

    return [Route("/quotas", admin.guard(page), methods=["GET"])]
