"""The admin dashboard: server-rendered pages (starlette + jinja2 + htmx) to run the whole appliance
from a browser, a JSON health endpoint, Prometheus metrics and the NIP-86 management API.

`install(appliance)` plugs it into a built appliance (the CLI calls it): routes under /admin on the
relay's listener (or on their own listener, `admin_listen`), the NIP-86 handler for POSTs to a
relay URL, the start banner's `admin` line, and its background tasks. Every edit goes through the
same functions as the CLI (`appliance.commands`), then applies at once.
"""

from __future__ import annotations

import logging
import socket
import time

from starlette.applications import Starlette
from starlette.responses import RedirectResponse
from starlette.routing import Mount, Route

from appliance.errors import ConfigError

from . import assets, auth
from .web import BASE, Admin, admin_base_url, setup_url

__all__ = ["install", "Admin", "admin_base_url", "setup_url"]

log = logging.getLogger("appliance.admin")


def install(app, *, fetch_assets: bool = True) -> Admin | None:
    """Wire the dashboard into a built (not yet serving) appliance; None when `admin_listen = off`."""
    from .metrics import Machines
    from .nip86 import Management
    from .pages import routes as page_routes

    settings = app.settings
    management = Management(app)
    app.relay_post = management.handle
    app.nip11_extensions.append(management.nip11)
    # Settings another node's dashboard saved reach this one's running parts too.
    from .pages.settings import refresh_runtime

    app.on_reload.append(lambda: refresh_runtime(app))
    admin = Admin(app)
    if admin.base_url is None:
        return None
    admin.management = management
    if app.push is not None:
        from .pages.deliveries import DeliveriesSection

        admin.sections["deliveries"] = DeliveriesSection(admin)
    if app.gateway is not None:
        from .pages.gateway import GatewaySection

        admin.sections["gateway"] = GatewaySection()
    if fetch_assets:
        admin.assets = {a.name: data for a in assets.ASSETS if (data := assets.load(a, settings.data_path)) is not None}
    if fetch_assets and len(admin.assets) < len(assets.ASSETS):
        # Fetched once serving (Admin.start): a registry that never answers must not delay the relay.
        admin.fetch_missing_assets = True
        print("appliance: the dashboard's htmx is not installed: fetching it from the npm registry in the "
              "background (pages work without it meanwhile: no live refresh or previews).", flush=True)
    machines = admin.machines = Machines(admin)
    machines.observe()
    dashboard = admin.asgi(page_routes(admin) + machines.routes())
    now = int(time.time())
    row = app.store.read_sync(auth.rows.auth_row)
    if row.password_hash is None:
        token = app.store.write_sync(lambda conn: auth.new_setup_token(conn, now))
        app.banner.append(f"  admin  {setup_url(admin.base_url, token)}")
        app.banner.append("         (one-time setup link: open it to set the admin password)")
    else:
        app.banner.append(f"  admin  {admin.base_url}")
    app.relay.on_rejected.append(admin.recorder.on_rejected)
    app.on_startup.append(admin.start)
    app.on_shutdown.append(admin.stop)
    if settings.admin_listen:
        admin.listen_socket = app.sockets.get("admin") or _bind(settings.admin_listen)
        admin.own_app = Starlette(routes=[
            Mount(BASE, app=dashboard),
            Route("/", lambda _r: RedirectResponse(f"{BASE}/", status_code=303)),
            *machines.root_routes(),
        ])
    else:
        app.routes.append(Mount(BASE, app=dashboard))
    return admin


def _bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError("admin_listen", listen, f"cannot listen there: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock
