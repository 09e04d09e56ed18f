"""Gateway (shown when `[gateway] enabled = true`): installations and delegations (redacted),
delivery reservations, endpoint quotas, and the grant-sealing keys (rotate, as
`appliance gateway keys rotate` does). Installation handles, APNs token digests and relay pubkeys
appear only as fingerprints."""

from __future__ import annotations

import time

from markupsafe import Markup
from starlette.requests import Request
from starlette.routing import Route

from appliance.commands.gateway import rotate_grant_key
from appliance.gateway import authority
from appliance.store import gateway as overview

PAGE_SIZE = 100


class GatewaySection:
    def routes(self, admin) -> list[Route]:
        red = admin.redactor

        async def page(request: Request):
            now = int(time.time())
            gw = admin.app.gateway

            def read(conn):
                return {
                    "installations": overview.installations(conn, PAGE_SIZE),
                    "counts": overview.installation_counts(conn, now),
                    "delegations": overview.delegations(conn, PAGE_SIZE),
                    "delegation_count": overview.delegation_count(conn, now),
                    "reservations": overview.reservations(conn, now),
                    "quota": overview.quota_usage(conn),
                }

            data = await admin.read(read)
            installations = [{
                "handle_fp": red.fingerprint(i["handle"], "inst"),
                "app_profile": i["app_profile"], "epoch": i["endpoint_epoch"],
                "token_fp": red.fingerprint(i["token_sha256"].hex(), "ep") if i["token_sha256"] else "",
                "created_at": i["created_at"], "expires_at": i["expires_at"], "revoked_at": i["revoked_at"],
                "state": "revoked" if i["revoked_at"] else ("expired" if i["expires_at"] < now else "active"),
            } for i in data["installations"]]
            delegations = [{
                "handle_fp": red.fingerprint(d["handle"], "inst"), "relay_fp": red.fingerprint(d["relay_pubkey"], "pk"),
                "epoch": d["endpoint_epoch"], "generation": d["generation"], "not_before": d["not_before"],
                "expires_at": d["expires_at"], "revoked_at": d["revoked_at"],
                "state": "revoked" if d["revoked_at"] else ("expired" if d["expires_at"] < now else "active"),
            } for d in data["delegations"]]
            reservations = [(red.fingerprint(pk, "pk"), n, t, e) for pk, n, t, e in data["reservations"]]
            quota = [(p, red.fingerprint(digest.hex(), "ep"), start, admitted) for p, digest, start, admitted
                     in data["quota"]]
            return admin.render(request, "admin/gateway.html", section="gateway", config=gw.config,
                                installations=installations, counts=data["counts"], delegations=delegations,
                                delegation_count=data["delegation_count"], reservations=reservations, quota=quota,
                                grant_keys=await admin.read(authority.grant_keys), now=now)

        async def rotate(request: Request):
            if request.state.form.get("confirm") != "yes":
                return admin.error_page(request, "Not rotated: tick the confirmation box first.", 400)
            row = await admin.write(lambda conn, ctx: rotate_grant_key(conn, admin.app.keyfile, int(time.time())))
            return admin.redirect("/gateway", f"Grant key rotated: {row.key_id} seals new grants now.")

        return [Route("/gateway", admin.guard(page), methods=["GET"]),
                Route("/gateway/keys/rotate", admin.guard(rotate), methods=["POST"])]

    async def keys_context(self, admin) -> Markup:
        keys = await admin.read(authority.grant_keys)
        return Markup(admin.templates.get_template("admin/gateway_keys.html").render(
            grant_keys=keys, csrf="", show_rotate=False))
