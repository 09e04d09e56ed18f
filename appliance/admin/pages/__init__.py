"""The dashboard's pages, one module each; `routes(admin)` gathers their routes."""

from __future__ import annotations

from starlette.routing import BaseRoute


def routes(admin) -> list[BaseRoute]:
    from . import descriptor, keys, leases, origins, overview, quotas, settings

    out: list[BaseRoute] = []
    for page in (overview, origins, descriptor, keys, leases, quotas, settings):
        out += page.routes(admin)
    for section in admin.sections.values():
        out += section.routes(admin)
    return out
