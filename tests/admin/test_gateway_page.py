"""The Gateway page (only when the gateway is enabled): installations and delegations made through
the real gateway routes appear redacted; grant keys rotate from the dashboard."""

from __future__ import annotations

import pytest

from appliance.gateway import authority
from appliance.testing.gateway_client import AppInstallation
from tests.gateway.helpers import PROFILE, GatewaySetup, token

from .helpers import Dashboard

pytestmark = pytest.mark.anyio

RELAY = "cd" * 32


async def test_gateway_page(tmp_path, anyio_backend):
    setup = GatewaySetup(tmp_path)
    d = Dashboard(tmp_path / "data", config=setup.config("http://127.0.0.1:7777"))
    try:
        await d.set_up()
        assert 'href="/admin/gateway"' in (await d.get("/admin/")).text
        inst = AppInstallation(d.client, "http://127.0.0.1:7777", setup.attester("production"), PROFILE, token())
        assert (await inst.enroll()).status_code == 201
        assert (await inst.delegate(RELAY, 1)).status_code == 201
        page = await d.get("/admin/gateway")
        assert page.status_code == 200
        text = page.text
        assert d.admin.redactor.fingerprint(inst.handle, "inst") in text
        assert d.admin.redactor.fingerprint(RELAY, "pk") in text
        for secret in (inst.handle, inst.endpoint, RELAY):
            assert secret not in text
        assert PROFILE in text and "active" in text
        keys = await d.get("/admin/keys")
        assert "Gateway grant keys" in keys.text
        before = [k.key_id for k in await d.app.store.read(authority.grant_keys)]
        r = await d.post_form("/admin/gateway/keys/rotate", {"confirm": "yes"}, page="/admin/gateway")
        assert r.status_code == 303
        page = await d.get("/admin/gateway")
        assert all(k in page.text for k in before) and "retired" in page.text
    finally:
        await d.close()


async def test_no_gateway_page_when_disabled(signed_in):
    assert 'href="/admin/gateway"' not in (await signed_in.get("/admin/")).text
    assert (await signed_in.get("/admin/gateway")).status_code == 404
