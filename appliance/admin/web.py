"""The dashboard's web plumbing: one Starlette app under /admin, sign-in, sessions, CSRF, security
headers, templates, static assets, and the helpers every page uses."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import quote, urlsplit

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from appliance import __version__
from appliance.errors import ApplianceError, ConfigError
from appliance.push.kinds import is_draft, provider_name
from appliance.settings import Settings

from . import assets, auth
from .redact import Redactor
from .stats import LoopLag, Recorder

log = logging.getLogger("appliance.admin")

ROOT = Path(__file__).resolve().parents[2]
BASE = "/admin"
# The whole dashboard is same-origin HTML: no inline script, no third-party anything.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # The setup URL carries its token: never send it on as a Referer.
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# Most bytes read from one dashboard form (a .p8 key is a few hundred bytes).
MAX_FORM_BYTES = 256 * 1024


def admin_base_url(settings: Settings) -> str | None:
    """The dashboard's URL as the operator reaches it (None when it is off)."""
    listen = settings.admin_listen
    if listen == "off":
        return None
    if listen:
        host, _, port = listen.rpartition(":")
        return f"http://{_display_host(host)}:{port}{BASE}/"
    if settings.public_url:
        parts = urlsplit(settings.public_url)
        scheme = "https" if parts.scheme == "wss" else "http"
        return f"{scheme}://{parts.netloc}{BASE}/"
    return f"http://{_display_host(settings.host)}:{settings.port}{BASE}/"


def _display_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def setup_url(base: str, token: str) -> str:
    return f"{base}setup?token={quote(token)}"


def transport_label(transport: str | None) -> Markup:
    """A transport as the pages show it: the draft ones (fcm, unifiedpush) say so."""
    if transport and is_draft(transport):
        return Markup('{} <span class="draft" title="a draft transport beyond NIP-PL v1, on only with '
                      'push_draft_transports">draft</span>').format(transport)
    return Markup("{}").format(transport or "-")


def transport_text(transport: str) -> str:
    """The same as plain text (an <option>)."""
    return f"{transport} (draft)" if is_draft(transport) else transport


@dataclass(frozen=True)
class Upload:
    """A file sent with a form (read into memory; forms are small)."""

    filename: str
    data: bytes


class Page(Exception):
    """Raised by a handler to answer with a rendered page or a redirect at once."""

    def __init__(self, response: Response):
        self.response = response


class Admin:
    """Everything the dashboard shares: the running appliance, keys, limiter, recorder, templates."""

    def __init__(self, app):
        self.app = app
        self.settings: Settings = app.settings
        self.signer = auth.Signer(app.keyfile.derive("admin-session"))
        self.redactor = Redactor(app.keyfile.derive("admin-fingerprint"))
        self._sealer = AESGCM(app.keyfile.derive("admin-reference"))
        self.limiter = auth.LoginLimiter()
        self.recorder = Recorder(app)
        self.loop_lag = LoopLag()
        self.assets: dict[str, bytes] = {}
        self.fetch_missing_assets = False  # fetch missing assets in the background once serving
        self.base_url = admin_base_url(self.settings)
        self.secure_cookies = bool(self.base_url and self.base_url.startswith("https://"))
        self.templates = Environment(loader=FileSystemLoader(ROOT / "templates"), autoescape=True,
                                     trim_blocks=True, lstrip_blocks=True)
        self.templates.globals.update(base=BASE, version=__version__, fp=self.redactor.fingerprint,
                                      fmt_time=fmt_time, fmt_age=fmt_age, htmx_sri=assets.HTMX.sri)
        self.templates.filters["fp"] = self.redactor.fingerprint
        self.templates.filters["transport"] = transport_label
        self.templates.globals.update(transport_text=transport_text, provider_name=provider_name,
                                      is_draft=is_draft)
        self.tasks: list[asyncio.Task] = []
        self.server = None  # the separate listener's server (admin_listen; appliance.front.Server)
        self.listen_socket: socket.socket | None = None
        self.own_app = None  # the separate listener's app (admin_listen)
        self.management = None  # the NIP-86 API (appliance.admin.nip86)
        self.machines = None  # health and metrics, with this appliance's registry (appliance.admin.metrics)
        # Optional sections other parts provide (the delivery side, the gateway).
        self.sections: dict[str, Any] = {}

    async def start(self) -> None:
        self.tasks.append(asyncio.create_task(self.recorder.run()))
        self.tasks.append(asyncio.create_task(self.loop_lag.run()))
        if self.fetch_missing_assets:
            self.tasks.append(asyncio.create_task(self.fetch_assets()))
        if self.listen_socket is not None:
            from appliance.front import Guard, Server, Site
            from appliance.relay.peers import PeerLimits

            # The same head limits as the relay's listener; no per-address cap (an operator's).
            self.server = Server()
            self.server.add(Site(self.own_app, Guard(PeerLimits(0))), self.listen_socket)
            await self.server.start()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.server is not None:
            self.server.close_listeners()
            try:
                await self.server.close(asyncio.get_running_loop().time() + 10)
            except Exception:
                log.exception("closing the dashboard's listener failed")
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def fetch_assets(self) -> None:
        """Fetch the assets that are not installed (npm, integrity checked) and use them once verified."""
        for asset in assets.ASSETS:
            if asset.name in self.assets:
                continue
            try:
                await assets.fetch_async(asset, self.settings.data_path)
            except assets.AssetError as exc:
                print(f"appliance: the dashboard's htmx could not be fetched ({exc}). The dashboard works without "
                      "it (no live refresh or previews); run `appliance admin fetch-assets` once online.", flush=True)
                continue
            data = assets.load(asset, self.settings.data_path)
            if data is not None:
                self.assets[asset.name] = data
                log.info("%s fetched and verified; the dashboard uses it from now on", asset.spec)

    # -- references: opaque, tamper-proof handles for rows whose keys must not appear in URLs ------------

    def seal(self, value: Any) -> str:
        nonce = secrets.token_bytes(12)
        blob = nonce + self._sealer.encrypt(nonce, json.dumps(value).encode(), b"admin-ref")
        return base64.urlsafe_b64encode(blob).decode().rstrip("=")

    def unseal(self, ref: str) -> Any:
        try:
            blob = base64.urlsafe_b64decode(ref + "=" * (-len(ref) % 4))
            return json.loads(self._sealer.decrypt(blob[:12], blob[12:], b"admin-ref"))
        except Exception:
            raise Page(self.error_page(None, "That link is not valid (or is from another appliance).", 404)) from None

    # -- responses -----------------------------------------------------------------------------------------

    def render(self, request: Request | None, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        session_id = getattr(request.state, "session_id", None) if request is not None else None
        presession = getattr(request.state, "presession", None) if request is not None else None
        csrf = self.signer.csrf(session_id) if session_id else (self.signer.csrf("pre:" + presession)
                                                                 if presession else "")
        html = self.templates.get_template(template).render(
            request=request, csrf=csrf, signed_in=bool(session_id), htmx=assets.HTMX.name in self.assets, status=status,
            gateway_enabled="gateway" in self.sections, deliveries_enabled="deliveries" in self.sections,
            message=request.query_params.get("msg", "") if request is not None else "", **ctx)
        response = HTMLResponse(html, status_code=status)
        if presession and request is not None and request.cookies.get(auth.PRESESSION_COOKIE) != presession:
            self._cookie(response, auth.PRESESSION_COOKIE, presession, max_age=3600)
        return response

    def error_page(self, request: Request | None, message: str, status: int = 400) -> HTMLResponse:
        return self.render(request, "admin/error.html", status=status, error=message)  # (status: the title)

    def redirect(self, path: str, msg: str = "") -> RedirectResponse:
        url = f"{BASE}{path}"
        if msg:
            url += ("&" if "?" in url else "?") + "msg=" + quote(msg)
        return RedirectResponse(url, status_code=303)

    def _cookie(self, response: Response, name: str, value: str, max_age: int | None) -> None:
        response.set_cookie(name, self.signer.sign(value) if name == auth.SESSION_COOKIE else value,
                            max_age=max_age, path=BASE, httponly=True, samesite="strict",
                            secure=self.secure_cookies)

    # -- reads and writes through the running appliance ------------------------------------------------------

    async def read(self, fn: Callable):
        return await self.app.store.read(fn)

    async def write(self, op: Callable, *, reload: bool = True):
        """Run an edit (a `commands` function) through the writer, then apply it at once (as the
        reload loop would within a second): origins, groups, descriptors and keys reach open
        connections and NIP-11 before the response is sent."""
        from appliance.relay.nodes import announce_edit

        ctx: dict = {}
        bus = getattr(self.app, "bus", None)

        def run(conn):
            ctx.clear()  # a write run again (node locks taken in order) starts from nothing
            result = op(conn, ctx)
            announce_edit(bus, conn, ctx)  # group edits reach the other nodes' subscribers
            return result

        result = await self.app.store.write(run)
        for apply in ctx.get("after_commit", ()):
            apply()
        if reload:
            await self.app.upkeep.reload_if_changed()
        for ev in ctx.get("broadcast", ()):
            origin_id = ctx.get("origin_id")
            if origin_id is not None:
                try:
                    origin = self.app.relay.origins.by_id(origin_id)
                except LookupError:
                    continue
                self.app.relay.broadcast(origin, ev, ev.to_json())
        return result

    # -- the ASGI app ---------------------------------------------------------------------------------------------

    def asgi(self, page_routes: list[BaseRoute]) -> Starlette:
        own = [
            Route("/setup", self.public(self.setup), methods=["GET", "POST"]),
            Route("/login", self.public(self.login), methods=["GET", "POST"]),
            Route("/logout", self.guard(self.logout), methods=["POST"]),
            Route("/static/{name}", self.static, methods=["GET", "HEAD"]),
        ]
        # Any other /admin URL is a page that does not exist (styled, with a way back): the router's 404,
        # handled, not a catch-all route, so the route table lists real pages only.
        return Starlette(routes=own + page_routes, exception_handlers={404: self.not_found})

    async def not_found(self, request: Request, exc: Exception | None = None) -> Response:
        request.state.session_id = await self._session(request)
        request.state.presession = None
        return self._finish(self.render(request, "admin/not_found.html", status=404, path=request.url.path))

    # -- request wrappers -------------------------------------------------------------------------------------------

    async def _session(self, request: Request) -> str | None:
        session_id = self.signer.unsign(request.cookies.get(auth.SESSION_COOKIE))
        if not session_id:
            return None
        now = int(time.time())
        return session_id if await self.read(lambda conn: auth.session_valid(conn, session_id, now)) else None

    def _csrf_ok(self, request: Request, token: str | None) -> str | None:
        """Why this state-changing request fails the CSRF check, or None."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"a {site} request"
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            host = request.headers.get("host", "")
            if urlsplit(origin).netloc != host:
                return "the request came from another site"
        tokens = [t for t in (request.headers.get(auth.CSRF_HEADER), token) if t]
        session_id = getattr(request.state, "session_id", None)
        if session_id:
            ok = any(self.signer.check_csrf(session_id, t) for t in tokens)
        else:
            pre = request.cookies.get(auth.PRESESSION_COOKIE)
            ok = bool(pre) and any(self.signer.check_csrf("pre:" + pre, t) for t in tokens)
        return None if ok else "the form's CSRF token is missing or wrong (reload the page and try again)"

    async def form(self, request: Request) -> dict[str, Any]:
        """The request's form, after the CSRF check (403 without a valid token)."""
        if int(request.headers.get("content-length") or 0) > MAX_FORM_BYTES:
            raise Page(PlainTextResponse("form too large\n", status_code=413))
        form = await request.form(max_files=4, max_fields=2000)
        data: dict[str, Any] = {}
        items = []
        for key, value in form.multi_items():
            if hasattr(value, "read"):  # an uploaded file: read now (the form is bounded), closed below
                value = Upload(value.filename or "", await value.read(MAX_FORM_BYTES))
            items.append((key, value))
        await form.close()
        for key, value in items:
            if key in data:
                data[key] = data[key] if isinstance(data[key], list) else [data[key]]
                data[key].append(value)
            else:
                data[key] = value
        problem = self._csrf_ok(request, data.get(auth.CSRF_FIELD) if isinstance(data.get(auth.CSRF_FIELD), str)
                                else None)
        if problem:
            raise Page(PlainTextResponse(f"forbidden: CSRF check failed: {problem}\n", status_code=403))
        return data

    def _finish(self, response: Response) -> Response:
        for k, v in SECURITY_HEADERS.items():
            response.headers.setdefault(k, v)
        return response

    def guard(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable:
        """A page for a signed-in operator; anyone else is sent to sign in (or set up)."""

        async def endpoint(request: Request) -> Response:
            request.state.session_id = await self._session(request)
            if request.state.session_id is None:
                if request.method != "GET":
                    return self._finish(PlainTextResponse("forbidden: sign in first\n", status_code=403))
                return self._finish(RedirectResponse(f"{BASE}/login", status_code=303))
            try:
                if request.method not in ("GET", "HEAD"):
                    # Every state-changing request passes the CSRF check here, whatever its handler.
                    request.state.form = await self.form(request)
            except Page as page:
                return self._finish(page.response)
            try:
                response = await handler(request)
            except Page as page:
                response = page.response
            except ConfigError as exc:
                response = self.error_page(request, str(exc), 400)
            return self._finish(response)

        return endpoint

    def public(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable:
        """A page anyone may open (sign-in, setup); it gets a pre-session CSRF cookie."""

        async def endpoint(request: Request) -> Response:
            request.state.session_id = None
            request.state.presession = request.cookies.get(auth.PRESESSION_COOKIE) or secrets.token_urlsafe(24)
            try:
                if request.method not in ("GET", "HEAD"):
                    request.state.form = await self.form(request)
                response = await handler(request)
            except Page as page:
                response = page.response
            return self._finish(response)

        return endpoint

    def open_endpoint(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable:
        """An endpoint for machines (health, metrics): security headers only."""

        async def endpoint(request: Request) -> Response:
            try:
                response = await handler(request)
            except Page as page:
                response = page.response
            return self._finish(response)

        return endpoint

    # -- sign-in ---------------------------------------------------------------------------------------------------------

    async def setup(self, request: Request) -> Response:
        token = request.query_params.get("token", "")
        now = int(time.time())
        if request.method == "GET":
            valid = await self.read(lambda conn: auth.setup_token_valid(conn, token, now))
            if not valid:
                return self.render(request, "admin/setup.html", status=403, token="", invalid=True)
            return self.render(request, "admin/setup.html", token=token, invalid=False)
        form = request.state.form
        token = str(form.get("token") or token)
        # The token first: hashing is costly on purpose (auth.SCRYPT_N), and this form is open to anyone.
        if not await self.read(lambda conn: auth.setup_token_valid(conn, token, now)):
            return self.render(request, "admin/setup.html", status=403, token="", invalid=True)
        password, confirm = str(form.get("password", "")), str(form.get("confirm", ""))
        problem = auth.password_problem(password, confirm)
        if problem:
            return self.render(request, "admin/setup.html", status=400, token=token, invalid=False, error=problem)
        hashed = await asyncio.to_thread(auth.hash_password, password)

        def op(conn):
            if not auth.set_password_with_token(conn, token, hashed, now):
                return None
            return auth.new_session(conn, now, self.settings.admin_session_ttl)

        session_id = await self.app.store.write(op)
        if session_id is None:
            return self.render(request, "admin/setup.html", status=403, token="", invalid=True)
        log.info("admin password set with the one-time setup token")
        response = self.redirect("/", "Password set. You are signed in.")
        self._cookie(response, auth.SESSION_COOKIE, session_id, max_age=self.settings.admin_session_ttl)
        response.delete_cookie(auth.PRESESSION_COOKIE, path=BASE)
        return response

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            if await self._session(request):
                return self.redirect("/")
            has_password = (await self.read(lambda conn: auth.rows.auth_row(conn))).password_hash is not None
            return self.render(request, "admin/login.html", has_password=has_password)
        form = request.state.form
        address = self.app.peers.client_address(request) or "unknown"
        wait = self.limiter.attempt(address)  # charged before the check: see LoginLimiter
        if wait:
            response = self.render(request, "admin/login.html", status=429, has_password=True,
                                   error=f"Too many failed sign-ins. Try again in {wait} s.")
            response.headers["Retry-After"] = str(wait)
            return response
        row = await self.read(auth.rows.auth_row)
        ok = await asyncio.to_thread(auth.verify_password, str(form.get("password", "")), row.password_hash)
        if not ok:
            # The address only when the operator asked for addresses in the log (log_client_addresses).
            log.warning("admin sign-in failed%s", f" from {address}" if self.settings.log_client_addresses else "")
            return self.render(request, "admin/login.html", status=401, has_password=row.password_hash is not None,
                               error="Wrong password." if row.password_hash else
                               "No password is set yet: open the setup URL the appliance printed at start, "
                               "or run `appliance admin reset`.")
        self.limiter.succeeded(address)
        now = int(time.time())
        session_id = await self.app.store.write(lambda conn: auth.new_session(conn, now, self.settings.admin_session_ttl))
        response = self.redirect("/")
        self._cookie(response, auth.SESSION_COOKIE, session_id, max_age=self.settings.admin_session_ttl)
        return response

    async def logout(self, request: Request) -> Response:
        session_id = request.state.session_id
        await self.app.store.write(lambda conn: auth.end_session(conn, session_id))
        response = self.redirect("/login", "Signed out.")
        response.delete_cookie(auth.SESSION_COOKIE, path=BASE)
        return response

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name in self.assets:
            return self._finish(Response(self.assets[name], media_type="text/javascript",
                                         headers={"Cache-Control": "public, max-age=86400"}))
        if name == "admin.css":
            return self._finish(Response((ROOT / "static" / "admin.css").read_bytes(), media_type="text/css"))
        return self._finish(PlainTextResponse("not found\n", status_code=404))


# -- formatting helpers for templates ----------------------------------------------------------------------------------


def fmt_time(ts: int | float | None) -> str:
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    neg = seconds < 0
    seconds = abs(seconds)
    if seconds >= 86400:
        text = f"{seconds // 86400} d {seconds % 86400 // 3600} h"
    elif seconds >= 3600:
        text = f"{seconds // 3600} h {seconds % 3600 // 60} min"
    elif seconds >= 60:
        text = f"{seconds // 60} min"
    else:
        text = f"{seconds} s"
    return f"{text} ago" if neg else text


def form_error(exc: ApplianceError) -> str:
    """A ConfigError's message for a form: the field, the value and the hint."""
    return str(exc)
