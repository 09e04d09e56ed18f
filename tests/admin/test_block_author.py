"""Moderation from what the dashboard shows: an author shown as a fingerprint (quotas, leases,
deliveries) is blocked from that page, the fingerprint resolved on the server (the page never holds
the full key); `appliance origins block`, NIP-86 and the origin page take hex, npub1... and a
fingerprint this appliance has seen, and name a resolved fingerprint only as the fingerprint."""

from __future__ import annotations

import re
import time

import pytest

from appliance.nostr.event import sign_event
from appliance.nostr.nip19 import encode_key
from tests.conftest import Identity, Server

from .conftest import CONFIG, ORIGIN
from .helpers import Dashboard, publish
from .test_nip86 import call
from .test_server import cli

pytestmark = pytest.mark.anyio

FP = re.compile(r"pk:[0-9a-f]{10}")


@pytest.fixture
async def api(tmp_path, anyio_backend):
    admin = Identity()
    d = Dashboard(tmp_path / "data", config=CONFIG, admin_pubkeys=admin.pubkey)
    d.operator = admin
    await d.set_up()
    yield d
    await d.close()


def blocked(d) -> frozenset[str]:
    return d.app.relay.origins.by_origin(ORIGIN).block


async def test_block_this_author_from_the_quotas_page(api):
    alice = Identity()
    await publish(api, None, sign_event(alice.secret, 1, [], "hello").to_dict())
    fp = api.admin.redactor.fingerprint(alice.pubkey, "pk")
    page = await api.get("/admin/quotas")
    assert fp in page.text and alice.pubkey not in page.text
    form = re.search(r'<form method="get" action="(/admin/origins/1/block)"[^>]*><input type="hidden" name="fp" '
                     r'value="([^"]+)"><input type="hidden" name="back" value="([^"]*)"><button[^>]*>block this author<',
                     page.text)
    assert form and form.group(2) == fp, page.text
    url = f"{form.group(1)}?fp={form.group(2)}&back={form.group(3)}"
    confirm = await api.get(url)
    assert confirm.status_code == 200 and fp in confirm.text and alice.pubkey not in confirm.text
    assert 'id="block-author"' in confirm.text
    r = await api.post_form("/admin/origins/1/moderation", {"action": "ban_pubkey", "value": fp, "back": "/quotas",
                                                            "reason": "spam"},
                            page=url, follow_redirects=True)
    assert r.status_code == 200 and r.url.path == "/admin/quotas"
    assert f"Blocked {fp}" in r.text and alice.pubkey not in r.text
    assert blocked(api) == {alice.pubkey}
    # The relay enforces it at once.
    with pytest.raises(Exception, match="blocked"):
        await publish(api, None, sign_event(alice.secret, 1, [], "again").to_dict())


async def test_the_origin_page_takes_hex_npub_and_fingerprints(api):
    alice, bob, carol = Identity(), Identity(), Identity()
    await publish(api, None, sign_event(alice.secret, 1, [], "hello").to_dict())
    fp = api.admin.redactor.fingerprint(alice.pubkey, "pk")
    r = await api.post_form("/admin/origins/1/moderation", {"action": "ban_pubkey", "value": fp},
                            follow_redirects=True, page="/admin/origins/1")
    assert f"Blocked {fp}" in r.text and alice.pubkey in blocked(api) and alice.pubkey not in r.text
    npub = encode_key(bytes.fromhex(bob.pubkey), "npub")
    r = await api.post_form("/admin/origins/1/moderation", {"action": "ban_pubkey", "value": npub},
                            follow_redirects=True, page="/admin/origins/1")
    assert bob.pubkey in blocked(api) and r.status_code == 200
    # A fingerprint of nobody this appliance has seen: refused with what to give instead.
    unseen = api.admin.redactor.fingerprint(carol.pubkey, "pk")
    r = await api.post_form("/admin/origins/1/moderation", {"action": "ban_pubkey", "value": unseen},
                            page="/admin/origins/1")
    assert r.status_code == 400 and "no pubkey this appliance has seen" in r.text and "npub" in r.text
    assert carol.pubkey not in blocked(api)
    page = await api.get(f"/admin/origins/1/block?fp={unseen}")
    assert page.status_code == 404 and "no pubkey this appliance has seen" in page.text
    assert 'id="block-author"' not in page.text


async def test_nip86_takes_npub_and_fingerprints(api):
    alice, bob = Identity(), Identity()
    await publish(api, None, sign_event(alice.secret, 1, [], "hello").to_dict())
    fp = api.admin.redactor.fingerprint(alice.pubkey, "pk")
    assert (await call(api, "banpubkey", [fp, "spam"])).json()["result"] is True
    assert alice.pubkey in blocked(api)
    assert (await call(api, "unbanpubkey", [fp])).json()["result"] is True
    assert alice.pubkey not in blocked(api)
    npub = encode_key(bytes.fromhex(bob.pubkey), "npub")
    assert (await call(api, "banpubkey", [npub])).json()["result"] is True
    assert bob.pubkey in blocked(api)
    r = await call(api, "banpubkey", ["pk:0123456789"])
    assert r.json()["result"] is None and "no pubkey this appliance has seen" in r.json()["error"]


@pytest.mark.slow
def test_cli_blocks_by_fingerprint_and_names_it_only_so(tmp_path):
    server = Server(tmp_path / "data").start()
    try:
        import asyncio

        from tests.conftest import Client

        alice = Identity()

        async def post():
            client = await Client.connect(server.url)
            ok, msg = await client.publish(alice.sign(1, [], "hello"))
            assert ok, msg
            await client.close()

        asyncio.run(post())
        from appliance.store.fingerprints import KEY_PURPOSE, fingerprint
        from appliance.store.keyfile import KeyFile

        key = KeyFile(server.data_dir, holds_wrapped_keys=True).derive(KEY_PURPOSE)
        fp = fingerprint(key, alice.pubkey, "pk")
        out = cli("origins", "block", server.url, fp, "--data-dir", str(server.data_dir))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"blocked {fp} at {server.url}" and alice.pubkey not in out.stdout + out.stderr
        for _ in range(50):  # the running appliance applies it within a second
            listed = cli("origins", "list", "--json", "--data-dir", str(server.data_dir))
            if alice.pubkey in listed.stdout:
                break
            time.sleep(0.1)
        assert alice.pubkey in listed.stdout
        bad = cli("origins", "block", server.url, "pk:0123456789", "--data-dir", str(server.data_dir))
        assert bad.returncode != 0 and "no pubkey this appliance has seen" in bad.stderr
        npub = encode_key(bytes.fromhex(Identity().pubkey), "npub")
        ok = cli("origins", "block", server.url, npub, "--data-dir", str(server.data_dir))
        assert ok.returncode == 0, ok.stderr
    finally:
        server.stop()
