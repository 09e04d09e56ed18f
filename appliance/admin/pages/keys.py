"""Keys: each push-enabled origin's executor encryption keys (id, pubkey, current/retiring,
created, end of the acceptance window, how many accepted leases depend on each); rotate with
confirmation; erase a retired key only when no lease depends on it."""

from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.routing import Route

from appliance.commands.keys import erase_key, rotate_key
from appliance.commands.origins import find
from appliance.errors import ConfigError
from appliance.origins import load_origins
from appliance.push import keys as keystore
from appliance.push.descriptor import descriptor_to_json


def routes(admin) -> list[Route]:
    async def page(request: Request, error: str = "", status: int = 200):
        now = int(time.time())

        def read(conn):
            out = []
            for o in load_origins(conn):
                if not o.push:
                    continue
                out.append((o, keystore.list_keys(conn, o.id), keystore.dependent_leases(conn, o.id, now)))
            return out

        rows = await admin.read(read)
        advertised = {}
        if admin.app.push is not None:
            for o, _keys, _deps in rows:
                op = admin.app.push.origins.get(o.id)
                if op is not None:
                    advertised[o.id] = json.dumps(descriptor_to_json(op.current_descriptor(now))["keys"], indent=2)
        sections = [section.keys_context for section in admin.sections.values() if hasattr(section, "keys_context")]
        extra = [await fn(admin) for fn in sections]
        return admin.render(request, "admin/keys.html", status=status, section="keys", rows=rows, now=now,
                            advertised=advertised, error=error, extra_sections=extra)

    async def rotate(request: Request):
        form = request.state.form
        if form.get("confirm") != "yes":
            return await page(request, "Not rotated: tick the confirmation box first.", 400)
        origin = await admin.read(lambda conn: find(conn, int(form.get("origin", 0))))
        now = int(time.time())
        try:
            row = await admin.write(lambda conn, ctx: rotate_key(conn, admin.app.keyfile, origin, now))
        except ConfigError as exc:
            return await page(request, str(exc), 400)
        return admin.redirect("/keys", f"Rotated: {row.key_id} is the current key of {origin.origin}; "
                                       "NIP-11 advertises it now.")

    async def erase(request: Request):
        form = request.state.form
        origin = await admin.read(lambda conn: find(conn, int(form.get("origin", 0))))
        key_id = str(form.get("key_id", ""))
        try:
            await admin.write(lambda conn, ctx: erase_key(conn, origin, key_id, int(time.time())))
        except ConfigError as exc:
            return await page(request, str(exc), 400)
        admin.app.upkeep.wal_scrub_pending = True
        return admin.redirect("/keys", f"Key {key_id} erased.")

    return [
        Route("/keys", admin.guard(page), methods=["GET"]),
        Route("/keys/rotate", admin.guard(rotate), methods=["POST"]),
        Route("/keys/erase", admin.guard(erase), methods=["POST"]),
    ]
