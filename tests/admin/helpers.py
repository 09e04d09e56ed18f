"""Helpers for dashboard tests: an in-process appliance with its dashboard (httpx over ASGI, no
lifespan: background loops are driven by the tests), and the setup/sign-in steps."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from appliance.admin import install
from appliance.app import asgi, build
from appliance.settings import load
from tests.leaks import sensitive

PASSWORD = "correct horse battery"
sensitive(PASSWORD)
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    m = CSRF.search(html)
    assert m, "no CSRF field on the page"
    return m.group(1)


def setup_token(app) -> str:
    line = next(line for line in app.banner if line.startswith("  admin  "))
    assert "token=" in line, line
    return line.split("token=", 1)[1]


class Dashboard:
    """A built appliance with its dashboard, served in-process."""

    def __init__(self, data_dir: Path, config: str | None = None, **flags):
        cfg = None
        if config is not None:
            cfg = data_dir.parent / f"{data_dir.name}.toml"
            cfg.write_text(config)
        from tests.pg import storage_env

        self.settings = load(flags={"data_dir": str(data_dir), **{k: str(v) for k, v in flags.items()}},
                             environ=storage_env(data_dir), config_path=cfg)
        self.app = build(self.settings)
        self.admin = install(self.app, fetch_assets=False)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(self.app)),
                                        base_url="http://127.0.0.1:7777")
        self.closed = False

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.client.aclose()
        if self.app.push is not None:
            await self.app.push.aclose()
            self.app.push.close()
        self.app.relay.close()
        self.app.store.close()

    async def get(self, path: str, **kw) -> httpx.Response:
        return await self.client.get(path, **kw)

    async def post_form(self, path: str, data: dict | list, *, page: str | None = None, files=None,
                        **kw) -> httpx.Response:
        """POST a form with the CSRF token of `page` (default: `path`)."""
        html = (await self.client.get(page or path)).text
        items = list(data.items()) if isinstance(data, dict) else list(data)
        form: dict[str, list] = {"csrf": [csrf_of(html)]}
        for key, value in items:
            form.setdefault(key, []).append(value)
        return await self.client.post(path, data=form, files=files, **kw)

    async def set_up(self, password: str = PASSWORD) -> None:
        token = setup_token(self.app)
        page = await self.client.get(f"/admin/setup?token={token}")
        assert page.status_code == 200, page.text
        r = await self.client.post("/admin/setup", data={"csrf": csrf_of(page.text), "token": token,
                                                         "password": password, "confirm": password})
        assert r.status_code == 303, r.text


PUSH_FORM = {
    "origin": "1", "push_enabled": "on", "push_kinds": "9, 1059, 7", "urgent_kinds": "9",
    "h_grammar": "uuid-v4-lowercase", "new_profile_id": "com.example.app/ios", "new_profile_transport": "apns",
    "cs_apns_silent": "on", "cs_apns_default": "on", "cs_apns_time_sensitive": "on", "cs_apns_urgent": "on",
}


async def nip11(dash) -> dict:
    r = await dash.get("/", headers={"Accept": "application/nostr+json"})
    assert r.status_code == 200
    return r.json()


async def enable_push(dash, **over) -> None:
    """Turn push on at the default origin through the descriptor page."""
    r = await dash.post_form("/admin/descriptor", {**PUSH_FORM, **over}, page="/admin/descriptor?origin=1")
    assert r.status_code == 303, r.text


async def publish(dash, authed: str | None, event: dict, origin: str = "ws://push.test") -> str:
    """Publish an event through the relay in-process (as a session authenticated as `authed`)."""
    from appliance.nostr.event import parse_event

    return await dash.app.relay.publish(dash.app.relay.origins.by_origin(origin), authed, parse_event(event))
