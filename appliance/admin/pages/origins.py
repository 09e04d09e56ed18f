"""Origins: canonical origin, host routing, access policy, allow/block lists, moderation lists,
groups with their members and admins; create and edit. Pubkeys are shown as fingerprints and
removed by fingerprint; the operator pastes a full pubkey only to add one."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.routing import Route

from appliance.commands import groups as group_cmds
from appliance.commands import moderation
from appliance.commands.origins import EDITABLE, add_origin, edit_origin, find, owned_fields
from appliance.errors import ConfigError
from appliance.origins import load_origins
from appliance.relay.groups import read_group

from ..web import Page


def safe_back(path: str) -> str:
    """A dashboard path to return to (`/leases?...`), or '' for anything else (no open redirect)."""
    return path if re.fullmatch(r"/[a-z][A-Za-z0-9/_-]*(\?[^\s<>\"\\]*)?", path) and "//" not in path else ""


def _lines(text: str) -> list[str]:
    return [v for v in text.replace(",", " ").split() if v]


def routes(admin) -> list[Route]:
    settings = admin.settings
    red = admin.redactor

    async def origin_or_404(request: Request):
        oid = request.path_params["oid"]
        try:
            return await admin.read(lambda conn: find(conn, oid))
        except ConfigError:
            raise Page(admin.error_page(request, f"No origin with id {oid}.", 404)) from None

    async def listing(request: Request, error: str = "", status: int = 200, form: dict | None = None):
        origins = await admin.read(load_origins)
        groups = {o.id: len(admin.app.groups.state.groups_of(o.id)) for o in origins}
        return admin.render(request, "admin/origins.html", status=status, section="origins", origins=origins,
                            group_counts=groups, error=error, form=form or {})

    async def create(request: Request):
        form = request.state.form
        data = {"origin": str(form.get("origin", "")).strip()}
        if form.get("hosts"):
            data["hosts"] = _lines(str(form["hosts"]))
        for key in ("path", "name", "description"):
            if str(form.get(key, "")).strip():
                data[key] = str(form[key]).strip()
        data["access_policy"] = str(form.get("access_policy", "public"))
        try:
            saved = await admin.write(lambda conn, ctx: add_origin(conn, settings, data))
        except ConfigError as exc:
            return await listing(request, str(exc), 400, form)
        return admin.redirect(f"/origins/{saved.id}", f"Origin {saved.origin} created.")

    async def detail(request: Request, error: str = "", status: int = 200):
        origin = await origin_or_404(request)
        # Its groups' ids taken here: the loop changes the mirror of the groups in place.
        hs = [g.h for g in admin.app.groups.state.groups_of(origin.id)]

        def read(conn):
            owned = owned_fields(conn, settings, origin)
            reasons = {
                "block": dict(moderation.list_pubkeys(conn, origin.id, "block")),
                "allow": dict(moderation.list_pubkeys(conn, origin.id, "allow")),
                "events": dict(moderation.list_events(conn, origin.id, "banned")),
                "ips": dict(moderation.list_blocked_ips(conn, origin.id)),
            }
            groups = [read_group(conn, origin.id, h) for h in hs]
            return owned, reasons, [g for g in groups if g is not None]

        owned, reasons, groups = await admin.read(read)
        return admin.render(request, "admin/origin.html", status=status, section="origins", origin=origin,
                            owned=owned, reasons=reasons, groups=sorted(groups, key=lambda g: (g.name, g.h)),
                            error=error)

    async def edit(request: Request):
        origin = await origin_or_404(request)
        form = request.state.form
        changes: dict = {}
        for key in EDITABLE:
            if key not in form:
                continue
            value = form[key]
            if key == "hosts":
                changes[key] = _lines(str(value))
            elif key == "auth_required":
                changes[key] = str(value) == "on"
            else:
                changes[key] = str(value).strip()
        if "auth_required_present" in form and "auth_required" not in form:
            changes["auth_required"] = False
        try:
            await admin.write(lambda conn, ctx: edit_origin(conn, settings, origin.id, changes))
        except ConfigError as exc:
            return await detail(request, str(exc), 400)
        return admin.redirect(f"/origins/{origin.id}", "Saved.")

    def resolve_fp(values, fp: str, kind: str = "pk") -> str:
        for v in values:
            if admin.redactor.fingerprint(v, kind) == fp:
                return v
        raise ConfigError("fingerprint", fp, "no such entry on this list (reload the page)")

    async def moderate(request: Request):
        origin = await origin_or_404(request)
        form = request.state.form
        action = str(form.get("action", ""))
        value = str(form.get("value", "")).strip()
        reason = str(form.get("reason", "")).strip()
        fp = str(form.get("fp", ""))
        back = safe_back(str(form.get("back", "")))
        done: list[str] = []

        def pubkey(conn) -> str:
            """hex, npub1... or a fingerprint (pk:...) of a pubkey seen here, resolved on the server"""
            ref = moderation.resolve_pubkey(conn, value, origin=find(conn, origin.id), fingerprint_key=red.key)
            done.append(red.fingerprint(ref.pubkey, "pk"))
            return ref.pubkey

        def op(conn, ctx):
            current = find(conn, origin.id)
            if action == "ban_pubkey":
                return moderation.ban_pubkey(conn, settings, origin.id, pubkey(conn), reason)
            if action == "unban_pubkey":
                return moderation.unban_pubkey(conn, settings, origin.id, resolve_fp(current.block, fp))
            if action == "allow_pubkey":
                return moderation.allow_pubkey(conn, settings, origin.id, pubkey(conn), reason)
            if action == "unallow_pubkey":
                return moderation.unallow_pubkey(conn, settings, origin.id, resolve_fp(current.allow, fp))
            if action == "ban_event":
                return moderation.ban_event(conn, settings, origin.id, value, reason)
            if action == "unban_event":
                return moderation.unban_event(conn, settings, origin.id, value)
            if action in ("allow_kind", "disallow_kind", "clear_kind"):
                try:
                    kind = int(value)
                except ValueError:
                    raise ConfigError("kind", value, "expected a kind number") from None
                return getattr(moderation, action)(conn, settings, origin.id, kind)
            if action == "block_ip":
                return moderation.block_ip(conn, settings, origin.id, value, reason)
            if action == "unblock_ip":
                return moderation.unblock_ip(conn, settings, origin.id, value)
            raise ConfigError("action", action, "unknown moderation action")

        try:
            await admin.write(op)
        except ConfigError as exc:
            if back:
                return await block_page(request, str(exc), 400)
            return await detail(request, str(exc), 400)
        if action == "ban_pubkey" and done:
            msg = f"Blocked {done[0]} at {origin.origin}: it can neither read nor publish there."
        elif action == "allow_pubkey" and done:
            msg = f"Allowed {done[0]} at {origin.origin}."
        else:
            msg = "Saved."
        return admin.redirect(back or f"/origins/{origin.id}", msg)

    async def block_page(request: Request, error: str = "", status: int = 200):
        """Confirm blocking an author the dashboard showed as a fingerprint (resolved here, on the
        server: the page never holds the full key)."""
        origin = await origin_or_404(request)
        params = request.query_params if request.method == "GET" else request.state.form
        fp = str(params.get("fp", params.get("value", ""))).strip()
        back = safe_back(str(params.get("back", "")))
        blocked = False
        if not error:
            try:
                ref = await admin.read(lambda conn: moderation.resolve_pubkey(
                    conn, fp, origin=find(conn, origin.id), fingerprint_key=red.key, what="author"))
                blocked = ref.pubkey in origin.block
            except ConfigError as exc:
                error, status = str(exc), 404 if "no pubkey" in str(exc) else 409
        return admin.render(request, "admin/block_author.html", status=status, section="origins", origin=origin,
                            fp=fp, back=back, error=error, blocked=blocked)

    async def group_create(request: Request):
        origin = await origin_or_404(request)
        form = request.state.form

        def op(conn, ctx):
            ctx["origin_id"] = origin.id
            return group_cmds.create_group(conn, admin.app.groups, origin.id, ctx,
                                           h=str(form.get("h", "")).strip() or None,
                                           name=str(form.get("name", "")).strip(),
                                           private=form.get("private") == "on", closed=form.get("closed") == "on",
                                           admins=_lines(str(form.get("admins", ""))))

        try:
            await admin.write(op)
        except ConfigError as exc:
            return await detail(request, str(exc), 400)
        return admin.redirect(f"/origins/{origin.id}", "Group created.")

    async def group_edit(request: Request):
        origin = await origin_or_404(request)
        form = request.state.form
        h = request.path_params["h"]
        action = str(form.get("action", ""))

        def op(conn, ctx):
            ctx["origin_id"] = origin.id
            group = read_group(conn, origin.id, h)
            if group is None:
                raise ConfigError("group", h, "no such group")
            if action == "edit":
                return group_cmds.edit_group(conn, admin.app.groups, origin.id, h, ctx,
                                             name=str(form.get("name", group.name)).strip(),
                                             private=form.get("private") == "on", closed=form.get("closed") == "on")
            if action == "add":
                return group_cmds.set_member(conn, admin.app.groups, origin.id, h, str(form.get("pubkey", "")).strip(),
                                             "admin" if form.get("admin") == "on" else "", ctx)
            pubkey = resolve_fp(group.members, str(form.get("fp", "")))
            if action == "remove":
                return group_cmds.set_member(conn, admin.app.groups, origin.id, h, pubkey, None, ctx)
            if action in ("promote", "demote"):
                return group_cmds.set_member(conn, admin.app.groups, origin.id, h, pubkey,
                                             "admin" if action == "promote" else "", ctx)
            raise ConfigError("action", action, "unknown group action")

        try:
            await admin.write(op)
        except ConfigError as exc:
            return await detail(request, str(exc), 400)
        return admin.redirect(f"/origins/{origin.id}", "Group saved.")

    return [
        Route("/origins", admin.guard(listing), methods=["GET"]),
        Route("/origins", admin.guard(create), methods=["POST"]),
        Route("/origins/{oid:int}", admin.guard(detail), methods=["GET"]),
        Route("/origins/{oid:int}", admin.guard(edit), methods=["POST"]),
        Route("/origins/{oid:int}/moderation", admin.guard(moderate), methods=["POST"]),
        Route("/origins/{oid:int}/block", admin.guard(block_page), methods=["GET"]),
        Route("/origins/{oid:int}/groups", admin.guard(group_create), methods=["POST"]),
        Route("/origins/{oid:int}/groups/{h}", admin.guard(group_edit), methods=["POST"]),
    ]
