"""Leases (author-redacted): list and filter by origin, app profile, transport, state and expiring
soon; a detail view (subscriptions, classes, generation, expiration, endpoint fingerprint); revoke
by operator. Authors, `#p` values and endpoints appear only as fingerprints; links carry sealed
references, never a pubkey."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.routing import Route

from appliance.origins import load_origins
from appliance.store.leases import LEASE_STATES, get_lease, lease_state, list_leases, revoke_lease

PAGE_SIZE = 100
EXPIRING_SOON = 86400


def routes(admin) -> list[Route]:
    red = admin.redactor

    def view(row: dict, now: int, origins: dict) -> dict:
        return {
            "lease_fp": red.lease(row["pubkey"], row["d"]),
            "author_fp": red.fingerprint(row["pubkey"], "pk"),
            "endpoint_fp": red.fingerprint(row["endpoint_hash"], "ep") if row["endpoint_hash"] else "",
            "origin": origins.get(row["origin"], str(row["origin"])),
            "origin_id": row["origin"],
            "app_profile": row["app_profile"] or "", "transport": row["transport"] or "",
            "state": lease_state(row, now), "generation": row["generation"],
            "created_at": row["created_at"], "expiration": row["expiration"], "expires_in": row["expiration"] - now,
            "exec_key_id": row["exec_key_id"], "revoked_at": row["revoked_at"],
            "subscriptions": red.subscriptions(row["subscriptions"]),
            "ref": admin.seal([row["origin"], row["pubkey"], row["d"]]),
        }

    async def page(request: Request):
        q = request.query_params
        now = int(time.time())
        filters = {
            "origin": int(q["origin"]) if q.get("origin", "").isdigit() else None,
            "app_profile": q.get("app_profile") or None,
            "transport": q.get("transport") or None,
            "state": q.get("state") if q.get("state") in LEASE_STATES else None,
            "expiring_within": EXPIRING_SOON if q.get("expiring") == "soon" else None,
        }
        offset = int(q["offset"]) if q.get("offset", "").isdigit() else 0

        def read(conn):
            rows = list_leases(conn, now, **filters, limit=PAGE_SIZE + 1, offset=offset)
            return rows, load_origins(conn)

        rows, origins = await admin.read(read)
        names = {o.id: o.origin for o in origins}
        profiles = sorted({p["id"] for o in origins for p in o.push.get("app_profiles", [])})
        return admin.render(request, "admin/leases.html", section="leases",
                            leases=[view(r, now, names) for r in rows[:PAGE_SIZE]], more=len(rows) > PAGE_SIZE,
                            offset=offset, page_size=PAGE_SIZE, origins=origins, profiles=profiles,
                            states=LEASE_STATES, q=q,
                            back="/leases" + (f"?{request.url.query}" if request.url.query else ""))

    async def detail(request: Request, error: str = "", status: int = 200):
        origin_id, pubkey, d = admin.unseal(request.path_params["ref"])
        now = int(time.time())
        row, origins = await admin.read(lambda conn: (get_lease(conn, origin_id, pubkey, d), load_origins(conn)))
        if row is None:
            return admin.error_page(request, "This lease is gone (expired and collected, or replaced).", 404)
        lease = view(row, now, {o.id: o.origin for o in origins})
        return admin.render(request, "admin/lease.html", status=status, section="leases", lease=lease, error=error)

    async def revoke(request: Request):
        form = request.state.form
        ref = request.path_params["ref"]
        origin_id, pubkey, d = admin.unseal(ref)
        if form.get("confirm") != "yes":
            return await detail(request, "Not revoked: tick the confirmation box first.", 400)
        done = await admin.write(lambda conn, ctx: revoke_lease(conn, origin_id, pubkey, d, int(time.time())),
                                 reload=False)
        return admin.redirect(f"/leases/{ref}", "Lease revoked by the operator." if done else
                              "Nothing to revoke: the lease is not active.")

    return [
        Route("/leases", admin.guard(page), methods=["GET"]),
        Route("/leases/{ref}", admin.guard(detail), methods=["GET"]),
        Route("/leases/{ref}/revoke", admin.guard(revoke), methods=["POST"]),
    ]
