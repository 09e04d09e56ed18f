"""The dashboard against a hostile browser: every state-changing route (enumerated from the route
table, so a new one is covered the day it is added) refuses a request without a valid CSRF token or
from another site, and changes nothing; every form on every page carries the token; stored values
a client chose are rendered escaped on every page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.routing import Mount, Route

from appliance.nostr.event import sign_event
from tests.admin.helpers import Dashboard, csrf_of, nip11, publish
from tests.gateway.helpers import GatewaySetup
from tests.push.e2e_helpers import Installation, active, current_key, lease, push_config

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
PARAMS = {"oid": "1", "ref": "x", "h": "x", "name": "htmx.min.js"}


@pytest.fixture
async def full(tmp_path, anyio_backend):
    """A signed-in dashboard with every section on: push (deliveries) and the gateway."""
    setup = GatewaySetup(tmp_path)
    config = push_config() + "\n" + setup.config()
    d = Dashboard(tmp_path / "data", config=config)
    await d.set_up()
    yield d
    await d.close()


def dashboard_routes(app) -> list[tuple[str, Route]]:
    """(path template, route) of every route under the dashboard's mount."""
    out = []

    def walk(routes, prefix):
        for r in routes:
            if isinstance(r, Mount):
                walk(r.routes, prefix + r.path)
            elif isinstance(r, Route):
                out.append((prefix + r.path, r))

    walk([r for r in app.routes if isinstance(r, Mount) and r.path == "/admin"], "")
    return out


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: PARAMS[m.group(1)], path)


def snapshot(data_dir: Path) -> dict:
    from tests.pg import db_rows, table_names

    # Sign-in and rate-limit bookkeeping may move (a refused request is no session); nothing else.
    return {t: sorted(db_rows(data_dir, f"SELECT * FROM {t}"), key=repr) for t in table_names(data_dir)
            if t not in ("admin_sessions",)}


async def test_every_state_changing_route_requires_csrf_and_changes_nothing(full):
    d = full
    posts = [(p, r) for p, r in dashboard_routes(d.app) if STATE_CHANGING & set(r.methods or ())]
    paths = {p for p, _ in posts}  # the table was really walked, sections included
    assert len(paths) >= 15 and {"/admin/gateway/keys/rotate", "/admin/deliveries/dead", "/admin/logout"} <= paths
    token = csrf_of((await d.get("/admin/")).text)
    before = snapshot(d.settings.data_path)
    form = {"origin": "ws://x.test", "name": "x", "value": "ab" * 32, "action": "block_pubkey", "password": "x" * 20,
            "confirm": "x" * 20, "current": "x", "key": "max_subscriptions", "id": "1", "push_enabled": "on"}
    for path, _ in posts:
        url = concrete(path)
        r = await d.client.post(url, data=form)
        assert r.status_code == 403 and "CSRF" in r.text, (url, r.status_code, r.text[:200])
        r = await d.client.post(url, data={**form, "csrf": "0" * 64})
        assert r.status_code == 403, url
        for header in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
            r = await d.client.post(url, data={**form, "csrf": token}, headers=header)
            assert r.status_code == 403, (url, header)
    assert snapshot(d.settings.data_path) == before


async def test_every_form_on_every_page_carries_the_csrf_token(full):
    d = full
    gets = [concrete(p) for p, r in dashboard_routes(d.app) if "GET" in (r.methods or ())]
    forms = 0
    for url in gets:
        r = await d.get(url)
        if r.status_code != 200 or "text/html" not in r.headers.get("content-type", ""):
            continue
        for form in re.findall(r"<form\b[^>]*>.*?</form>", r.text, re.S | re.I):
            head = form[:form.index(">")].lower()
            if 'method="post"' in head or "hx-post" in head:
                forms += 1
                assert 'name="csrf"' in form, (url, head)
    assert forms >= 10


HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


async def test_client_chosen_values_are_rendered_escaped_everywhere(full):
    """Values that reach pages from the network (event content and tags, group names, lease
    details) and from forms, each carrying markup: no page contains the raw markup."""
    d = full
    exec_id, exec_pub = current_key(await nip11(d))
    user = Installation()
    await publish(d, user.pubkey, lease(user, active(user, app_profile="com.example.app/ios"), exec_pub=exec_pub,
                                        exec_id=exec_id, d="d" + HOSTILE))
    await publish(d, None, sign_event(user.secret, 1, [["t", HOSTILE], ["p", user.pubkey]], HOSTILE).to_dict())
    await publish(d, None, sign_event(user.secret, 0, [], '{"name": "%s"}' % HOSTILE.replace('"', "'")).to_dict())
    await d.post_form("/admin/origins/1/groups", {"name": HOSTILE, "about": HOSTILE}, page="/admin/origins/1")
    await d.post_form("/admin/origins/1/moderation", {"action": "block_pubkey", "value": "ab" * 32,
                                                      "reason": HOSTILE}, page="/admin/origins/1")
    await d.post_form("/admin/origins/1", {"name": HOSTILE}, page="/admin/origins/1")
    await d.post_form("/admin/origins", {"origin": "ws://esc.test", "name": HOSTILE}, page="/admin/origins")
    listing = (await d.get("/admin/leases")).text
    refs = {part.split('"', 1)[0] for part in listing.split('href="/admin/leases/')[1:]}
    urls = [concrete(p) for p, r in dashboard_routes(d.app) if "GET" in (r.methods or ())]
    urls += [f"/admin/leases/{ref}" for ref in refs] + ["/admin/origins/2", "/admin/?msg=" + HOSTILE,
                                                         "/admin/login?msg=" + HOSTILE]
    seen = 0
    for url in urls:
        r = await d.get(url)
        seen += HOSTILE.replace("<", "&lt;").replace(">", "&gt;")[:20] in r.text or "&lt;script&gt;" in r.text
        for raw in ("<script>alert(1)", "<img src=x onerror"):
            if "text/html" in r.headers.get("content-type", ""):
                assert raw not in r.text, (url, raw)
    assert seen >= 2  # the values did reach pages (escaped)


def test_templates_autoescape_and_mark_nothing_safe():
    from appliance.admin.web import ROOT

    for path in (ROOT / "templates").rglob("*.html"):
        text = path.read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text, path
