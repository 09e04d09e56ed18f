"""Settings and maintenance: change the admin password, see every setting and where it came from,
download a consistent backup of the database (SQLite's online backup API; on PostgreSQL the page
says how to back the database up with pg_dump instead, and there is no download)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.routing import Route

from appliance.commands.backup import postgres_backup
from appliance.errors import ConfigError
from appliance.settings import BY_NAME, SETTINGS, UNITS, summary
from appliance.store import admin as stored
from appliance.store.meta import bump_generation

from .. import auth

def refresh_runtime(app) -> None:
    """Parts that copied settings at start take the edited values."""
    from .deliveries import refresh_delivery_settings

    refresh_delivery_settings(app)


# Settings whose values are secret or personal: shown redacted.
SECRET_SETTINGS = {"metrics_token"}
PUBKEY_SETTINGS = {"admin_pubkeys", "relay_pubkey"}


def routes(admin) -> list[Route]:
    settings = admin.settings

    def rows() -> list[tuple[str, str, str, str]]:
        out = []
        for s in SETTINGS:
            value = settings.values[s.name]
            if s.name == "storage":
                from appliance.store.dsn import redact

                shown = redact(value)
            elif s.name in SECRET_SETTINGS:
                shown = "(set)" if value else "(empty)"
            elif s.name in PUBKEY_SETTINGS:
                values = value if isinstance(value, (list, tuple)) else ([value] if value else [])
                shown = ", ".join(admin.redactor.fingerprint(v, "pk") for v in values) or "(empty)"
            else:
                shown = str(value)
            unit = UNITS.get(s.name)
            out.append((s.name, f"{shown} {unit}" if unit and shown not in ("", "(set)", "(empty)") else shown,
                        settings.sources.get(s.name, "default"), summary(s)))
        return out

    def shown(name: str) -> str:
        return next(r[1] for r in rows() if r[0] == name)

    async def page(request: Request, error: str = "", status: int = 200):
        extra = [await section.settings_context(admin) for section in admin.sections.values()
                 if hasattr(section, "settings_context")]
        editable = [(s.name, shown(s.name), settings.sources.get(s.name, "default"), summary(s),
                     "" if s.name in PUBKEY_SETTINGS | SECRET_SETTINGS else str(settings.values[s.name]))
                    for s in SETTINGS if s.editable]
        postgres = postgres_backup(settings) if admin.app.store.backend == "postgresql" else None
        return admin.render(request, "admin/settings.html", status=status, section="settings", rows=rows(),
                            editable=editable, error=error, extra_sections=extra, postgres=postgres,
                            data_dir=str(settings.data_path.resolve()), full_help={s.name: s.help for s in SETTINGS})

    async def edit(request: Request):
        form = request.state.form
        name = str(form.get("name", ""))
        setting = BY_NAME.get(name)
        if setting is None or not setting.editable:
            return await page(request, f"{name!r} cannot be changed from the dashboard.", 400)
        if settings.sources.get(name, "default") not in ("default", "dashboard"):
            return await page(request, f"{name} is set by the configuration ({settings.sources[name]}): change it "
                                       "there.", 400)
        if form.get("reset") == "1":
            await admin.app.store.write(lambda conn: (stored.drop_setting(conn, name), bump_generation(conn)))
            settings.clear_stored(name)
            refresh_runtime(admin.app)
            return admin.redirect("/settings", f"{name} is back to its default.")
        raw = str(form.get("value", ""))
        try:
            value = setting.coerce(raw)
        except ConfigError as exc:
            return await page(request, str(exc), 400)
        # The generation bump: every other node over the same database applies it too.
        await admin.app.store.write(lambda conn: (stored.save_setting(conn, name, raw), bump_generation(conn)))
        settings.apply_stored({name: raw})
        del value
        refresh_runtime(admin.app)
        return admin.redirect("/settings", f"{name} saved; it applies now and after restarts.")

    async def password(request: Request):
        form = request.state.form
        current, new, confirm = (str(form.get(k, "")) for k in ("current", "password", "confirm"))
        row = await admin.read(auth.rows.auth_row)
        if not await asyncio.to_thread(auth.verify_password, current, row.password_hash):
            return await page(request, "The current password is wrong.", 400)
        problem = auth.password_problem(new, confirm)
        if problem:
            return await page(request, problem.capitalize() + ".", 400)
        hashed = await asyncio.to_thread(auth.hash_password, new)
        now = int(time.time())

        def op(conn):
            auth.rows.set_password(conn, hashed, now)  # ends every session, this one too
            return auth.new_session(conn, now, settings.admin_session_ttl)

        session_id = await admin.app.store.write(op)
        response = admin.redirect("/settings", "Password changed; other sessions were signed out.")
        admin._cookie(response, auth.SESSION_COOKIE, session_id, max_age=settings.admin_session_ttl)
        return response

    async def backup(request: Request):
        if admin.app.store.backend == "postgresql":  # the page says how instead (pg_dump)
            return await page(request, "This appliance keeps its data in PostgreSQL: there is no download here; "
                              "back the database up with pg_dump as the Backup section says.", 409)
        fd, name = tempfile.mkstemp(prefix=".backup-", suffix=".sqlite3", dir=settings.data_path)
        os.close(fd)
        try:
            await asyncio.to_thread(admin.app.store.backup, name)
        except Exception:
            os.unlink(name)
            raise
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return FileResponse(name, media_type="application/vnd.sqlite3",
                            filename=f"appliance-{stamp}.sqlite3", background=BackgroundTask(os.unlink, name))

    return [
        Route("/settings", admin.guard(page), methods=["GET"]),
        Route("/settings/password", admin.guard(password), methods=["POST"]),
        Route("/settings/edit", admin.guard(edit), methods=["POST"]),
        Route("/settings/backup", admin.guard(backup), methods=["POST"]),
    ]
