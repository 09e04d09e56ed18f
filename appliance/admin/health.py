"""Transport health, as the overview, `/admin/health` and `/admin/metrics` all say it: one state
per (origin, app profile) from the profile's health row (written with every attempt's outcome,
`store.wakes.note_outcome`), its active alerts and whether it can deliver at all.

    failing   the last FAILING_AFTER attempts failed transiently, or the host refused the connection
    fault     no usable credentials or transport, or a configuration alert not cleared since
    ok        the last attempt in the last day was answered (accepted, or refused for its own reasons)
    idle      no attempt in the last day
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from appliance.origins import load_origins
from appliance.push.delivery import FAILING_AFTER
from appliance.push.profiles import Unconfigured
from appliance.store import wakes

STATES = ("ok", "idle", "failing", "fault")
# Alerts that say the transport is failing (FAILING_AFTER, refused); any other is configuration.
FAILING_REASONS = ("failing", "connection refused")
IDLE_AFTER = 86400


@dataclass(frozen=True)
class TransportState:
    origin_id: int
    origin: str
    profile: str
    transport: str
    state: str
    #: a short public reason (health JSON): never a host, status line or credential
    reason: str
    #: the operator's detail (the dashboard, which is signed in)
    detail: str
    failures: int = 0


def read_states(conn, push, now: float | None = None) -> list[TransportState]:
    """Every configured app profile's state (a read on a reader connection)."""
    now = time.time() if now is None else now
    origins = load_origins(conn)
    health = wakes.transport_health(conn)
    alerts = wakes.alerts(conn)
    out = []
    for o in origins:
        for p in o.push.get("app_profiles", []) if o.push else []:
            key = (o.id, p["id"])
            t = push.transports.get(o.id, p["id"]) if push is not None else None
            h = health.get(key)
            config_alerts = [a for a in alerts if (a["origin"], a["app_profile"]) == key
                             and a["reason"] not in FAILING_REASONS]
            failures = h["failures"] if h else 0
            if h and h["last_outcome"] == "transient" and h["refused"]:
                state, reason, detail = "failing", "connection refused", f"the host refuses connections: " \
                                                                         f"{h['last_detail']}"
            elif h and h["last_outcome"] == "transient" and failures >= FAILING_AFTER:
                state, reason = "failing", f"{failures} transient failures in a row"
                detail = f"the last {failures} attempts failed; the last: {h['last_detail']}"
            elif t is None and push is not None and push.transports.is_off(p["transport"]):
                state, reason = "fault", "draft transport off"
                detail = (f"{p['transport']} is a draft transport: not advertised, nothing delivered while "
                          "push_draft_transports is off")
            elif t is None or isinstance(t, Unconfigured):
                state, reason = "fault", "not configured"
                detail = t.detail if t is not None else "no transport for this profile (save the descriptor)"
            elif config_alerts:
                a = config_alerts[0]
                state, reason = "fault", "configuration alert"
                detail = f"configuration alert: {a['reason']}" + (" (dismissed)" if a["dismissed_at"] else "")
            elif h is None or h["last_at"] < now - IDLE_AFTER:
                state, reason, detail = "idle", "no attempt in the last day", "no delivery in the last day"
            else:
                state, reason = "ok", "answering"
                detail = f"{h['last_outcome']} {h['last_detail']}".strip()
            out.append(TransportState(o.id, o.origin, p["id"], p["transport"], state, reason, detail, failures))
    return out


async def states(app) -> list[TransportState]:
    if app.push is None:
        return []
    return await app.store.read(lambda conn: read_states(conn, app.push))
