"""Every dashboard page, in-process: what it shows and what its forms do, through the same
functions as the CLI; nothing shows a full author pubkey, #p value or endpoint."""

from __future__ import annotations

import html
import sqlite3

import pytest

from appliance.errors import Rejected
from tests.pg import db_rows
from tests.push.e2e_helpers import Installation, active, current_key, lease

from .helpers import PASSWORD, csrf_of, enable_push, nip11, publish

pytestmark = pytest.mark.anyio

ENDPOINT = "tok-" + "e" * 60


async def test_descriptor_save_and_rejected_invalid_descriptor(signed_in):
    d = signed_in
    assert "push" not in await nip11(d)
    await enable_push(d)
    doc = await nip11(d)
    assert doc["push"]["app_profiles"] == [{"id": "com.example.app/ios", "transport": "apns"}]
    assert doc["push"]["urgent_kinds"] == [9] and "nip-pl" in doc["supported_extensions"]
    page = await d.get("/admin/descriptor?origin=1")
    assert '"push_kinds": [' in html.unescape(page.text)  # the NIP-11 preview
    # urgent_kinds not a subset of push_kinds: refused, the failing rule named, nothing changed.
    form = {"origin": "1", "push_enabled": "on", "push_kinds": "9, 7", "urgent_kinds": "1059",
            "profile_id": "com.example.app/ios", "profile_transport": "apns",
            "profile_original_0": "com.example.app/ios", "cs_apns_default": "on"}
    r = await d.post_form("/admin/descriptor", form, page="/admin/descriptor?origin=1")
    assert r.status_code == 400 and "urgent-subset" in r.text
    assert (await nip11(d))["push"] == doc["push"]
    # A limit over the relay's own bound, and a kind that can never be push-eligible.
    r = await d.post_form("/admin/descriptor", {**form, "urgent_kinds": "", "lim_max_content_len": "99999999"},
                          page="/admin/descriptor?origin=1")
    assert r.status_code == 400 and "max_content_len" in r.text
    r = await d.post_form("/admin/descriptor", {**form, "urgent_kinds": "", "push_kinds": "9, 20001"},
                          page="/admin/descriptor?origin=1")
    assert r.status_code == 400 and "never-push-eligible" in r.text
    # The live preview answers the same rules without saving.
    token = csrf_of(page.text)
    r = await d.client.post("/admin/descriptor/preview", data={**form, "csrf": token})
    assert r.status_code == 200 and "urgent-subset" in r.text
    r = await d.client.post("/admin/descriptor/preview", data={**form, "urgent_kinds": "9", "csrf": token,
                                                               "lim_max_lease_ttl": "86400"})
    assert '"max_lease_ttl": 86400' in html.unescape(r.text)
    assert (await nip11(d))["push"]["limitation"]["max_lease_ttl"] == 2592000
    # A valid edit applies at once (no restart): a limitation value and a second profile.
    r = await d.post_form("/admin/descriptor", {**form, "urgent_kinds": "9", "lim_max_lease_ttl": "86400",
                                                "new_profile_id": "com.example.app/ios-sandbox",
                                                "new_profile_transport": "apns"}, page="/admin/descriptor?origin=1")
    assert r.status_code == 303
    push = (await nip11(d))["push"]
    assert push["limitation"]["max_lease_ttl"] == 86400 and len(push["app_profiles"]) == 2


async def test_descriptor_owned_by_the_config_file_is_not_editable(tmp_path, anyio_backend):
    from .helpers import Dashboard

    d = Dashboard(tmp_path / "data", config='public_url = "ws://push.test"\n[push]\n'
                  'app_profiles = [{ id = "a.b/ios", transport = "apns" }]\npush_kinds = [9]\n')
    try:
        await d.set_up()
        page = await d.get("/admin/descriptor?origin=1")
        assert "set by the configuration" in page.text
        r = await d.post_form("/admin/descriptor", {"origin": "1", "push_enabled": "on", "push_kinds": "9, 7",
                                                    "profile_id": "a.b/ios", "profile_transport": "apns",
                                                    "profile_original_0": "a.b/ios", "cs_apns_default": "on"},
                              page="/admin/descriptor?origin=1")
        assert r.status_code == 400 and "configuration" in r.text
        assert (await nip11(d))["push"]["push_kinds"] == [9]
    finally:
        await d.close()


async def test_rotate_a_key_and_see_the_new_nip11_then_erase_the_retired_one(signed_in):
    d = signed_in
    await enable_push(d)
    old_id, _old_pub = current_key(await nip11(d))
    page = await d.get("/admin/keys")
    assert old_id in page.text
    r = await d.post_form("/admin/keys/rotate", {"origin": "1"}, page="/admin/keys")
    assert r.status_code == 400 and "confirmation" in r.text
    r = await d.post_form("/admin/keys/rotate", {"origin": "1", "confirm": "yes"}, page="/admin/keys")
    assert r.status_code == 303
    doc = await nip11(d)
    new_id, _ = current_key(doc)
    assert new_id != old_id and any(k["id"] == old_id and k.get("retiring") for k in doc["push"]["keys"])
    page = await d.get("/admin/keys")
    assert "retiring" in page.text and new_id in page.text
    # The current key cannot be erased; the retired one (no lease depends on it) can.
    r = await d.post_form("/admin/keys/erase", {"origin": "1", "key_id": new_id}, page="/admin/keys")
    assert r.status_code == 400 and "current key" in r.text
    r = await d.post_form("/admin/keys/erase", {"origin": "1", "key_id": old_id}, page="/admin/keys")
    assert r.status_code == 303
    assert [k["id"] for k in (await nip11(d))["push"]["keys"]] == [new_id]


async def test_a_lease_appears_redacted_and_can_be_revoked(signed_in):
    d = signed_in
    await enable_push(d)
    exec_id, exec_pub = current_key(await nip11(d))
    user = Installation()
    ev = lease(user, active(user, endpoint=ENDPOINT), exec_pub=exec_pub, exec_id=exec_id)
    await publish(d, user.pubkey, ev)
    # The erase refusal names the dependent lease.
    r = await d.post_form("/admin/keys/rotate", {"origin": "1", "confirm": "yes"}, page="/admin/keys")
    r = await d.post_form("/admin/keys/erase", {"origin": "1", "key_id": exec_id}, page="/admin/keys")
    assert r.status_code == 400 and "1 active lease" in r.text
    listing = await d.get("/admin/leases")
    author_fp = d.admin.redactor.fingerprint(user.pubkey, "pk")
    assert author_fp in listing.text and "active" in listing.text
    assert user.pubkey not in listing.text and ENDPOINT not in listing.text
    for query in ("state=active", "transport=apns", "app_profile=com.example.app/ios", "expiring=soon", "origin=1"):
        assert author_fp in (await d.get(f"/admin/leases?{query}")).text, query
    assert author_fp not in (await d.get("/admin/leases?state=expired")).text
    ref = listing.text.split('href="/admin/leases/', 1)[1].split('"', 1)[0]
    detail = await d.get(f"/admin/leases/{ref}")
    assert detail.status_code == 200 and "time_sensitive" in detail.text and author_fp in detail.text
    assert user.pubkey not in detail.text and ENDPOINT not in detail.text
    r = await d.post_form(f"/admin/leases/{ref}/revoke", {"confirm": "yes"}, page=f"/admin/leases/{ref}")
    assert r.status_code == 303
    assert "revoked by the operator" in (await d.get(f"/admin/leases/{ref}")).text
    assert [(a, e, bool(r)) for a, e, r in db_rows(d.settings.data_path, "SELECT active, endpoint, "
            "revoked_at IS NOT NULL FROM leases")] == [(0, None, True)]
    assert db_rows(d.settings.data_path, "SELECT count(*) FROM lease_selectors") == [(0,)]
    # A forged reference is refused.
    assert (await d.get("/admin/leases/AAAA")).status_code == 404


async def test_origins_create_edit_lists_and_groups(signed_in):
    d = signed_in
    alice, bob = Installation(), Installation()
    r = await d.post_form("/admin/origins", {"origin": "ws://chat.test", "hosts": "chat.test",
                                             "access_policy": "members"}, page="/admin/origins")
    assert r.status_code == 303
    oid = r.headers["location"].split("?")[0].rsplit("/", 1)[-1]
    page = await d.get(f"/admin/origins/{oid}")
    assert "ws://chat.test" in page.text
    # Route conflicts are refused with the reason.
    r = await d.post_form("/admin/origins", {"origin": "ws://other.test", "hosts": "chat.test"}, page="/admin/origins")
    assert r.status_code == 400 and "routed to both" in r.text
    r = await d.post_form(f"/admin/origins/{oid}", {"name": "Chat", "description": "a test", "icon": "https://x/i.png",
                                                   "access_policy": "members"}, page=f"/admin/origins/{oid}")
    assert r.status_code == 303
    doc = (await d.get("/", headers={"Accept": "application/nostr+json", "Host": "chat.test"})).json()
    assert doc["name"] == "Chat" and doc["icon"] == "https://x/i.png"
    # The default origin's routing belongs to public_url (the configuration).
    page = await d.get("/admin/origins/1")
    assert "set by the configuration" in page.text
    r = await d.post_form("/admin/origins/1", {"hosts": "elsewhere.test"}, page="/admin/origins/1")
    assert r.status_code == 400 and "configuration" in r.text
    # Allowlist: add by pubkey, shown by fingerprint, removed by fingerprint.
    r = await d.post_form(f"/admin/origins/{oid}/moderation", {"action": "allow_pubkey", "value": alice.pubkey},
                          page=f"/admin/origins/{oid}")
    assert r.status_code == 303
    page = await d.get(f"/admin/origins/{oid}")
    fp = d.admin.redactor.fingerprint(alice.pubkey, "pk")
    assert fp in page.text and alice.pubkey not in page.text
    r = await d.post_form(f"/admin/origins/{oid}/moderation", {"action": "allow_pubkey", "value": "npub1nope"},
                          page=f"/admin/origins/{oid}")
    assert r.status_code == 400 and "64 lowercase hex" in r.text
    # Groups: create with an admin, add a member, promote, remove.
    r = await d.post_form(f"/admin/origins/{oid}/groups", {"name": "ops", "private": "on", "admins": alice.pubkey},
                          page=f"/admin/origins/{oid}")
    assert r.status_code == 303
    group = d.app.groups.state.groups_of(int(oid))[0]
    assert group.private and group.members == {alice.pubkey: "admin"}
    r = await d.post_form(f"/admin/origins/{oid}/groups/{group.h}", {"action": "add", "pubkey": bob.pubkey},
                          page=f"/admin/origins/{oid}")
    assert r.status_code == 303
    assert d.app.groups.state.get(int(oid), group.h).members[bob.pubkey] == ""
    bob_fp = d.admin.redactor.fingerprint(bob.pubkey, "pk")
    page = await d.get(f"/admin/origins/{oid}")
    assert bob_fp in page.text and bob.pubkey not in page.text
    r = await d.post_form(f"/admin/origins/{oid}/groups/{group.h}", {"action": "promote", "fp": bob_fp},
                          page=f"/admin/origins/{oid}")
    assert d.app.groups.state.get(int(oid), group.h).members[bob.pubkey] == "admin"
    r = await d.post_form(f"/admin/origins/{oid}/groups/{group.h}", {"action": "remove", "fp": bob_fp},
                          page=f"/admin/origins/{oid}")
    assert r.status_code == 303 and bob.pubkey not in d.app.groups.state.get(int(oid), group.h).members
    r = await d.post_form(f"/admin/origins/{oid}/groups/{group.h}", {"action": "edit", "name": "ops2"},
                          page=f"/admin/origins/{oid}")
    g = d.app.groups.state.get(int(oid), group.h)
    assert g.name == "ops2" and not g.private
    r = await d.post_form(f"/admin/origins/{oid}/moderation", {"action": "unallow_pubkey", "fp": fp},
                          page=f"/admin/origins/{oid}")
    assert r.status_code == 303 and alice.pubkey not in d.app.relay.origins.by_id(int(oid)).allow


async def test_an_origins_page_while_the_loop_applies_group_changes(signed_in):
    """An origin's page lists its groups while the loop goes on applying the group changes events
    commit (`GroupState.put`): the page is served whole every time. (Before, it looked through
    every group on a reader thread and now and then failed with "dictionary changed size during
    iteration" when the loop created or deleted one meanwhile.)"""
    import asyncio
    import time

    from appliance.store import groups as store_groups
    from tests.races import churn_groups, thread_switches_often

    d = signed_in
    r = await d.post_form("/admin/origins", {"origin": "ws://chat.test", "hosts": "chat.test"},
                          page="/admin/origins")
    oid = int(r.headers["location"].split("?")[0].rsplit("/", 1)[-1])
    state = d.app.groups.state

    def many_groups(conn):  # another origin's: a long pass over them for each page of origin 1
        for n in range(5000):
            store_groups.create_group(conn, oid, f"stored-{n}", name="", closed=False, private=False,
                                      now=int(time.time()))

    await d.app.store.write(many_groups)
    d.app.store.read_sync(state.load)
    changes = asyncio.ensure_future(churn_groups(state, oid))
    try:
        with thread_switches_often():
            for _ in range(200):
                assert (await d.get("/admin/origins/1")).status_code == 200
    finally:
        changes.cancel()


async def test_moderation_from_the_dashboard_is_enforced_by_the_relay(signed_in):
    d = signed_in
    alice = Installation()
    from appliance.nostr.event import sign_event

    note = sign_event(alice.secret, 1, [], "hello").to_dict()
    await publish(d, None, note)
    for action, value in (("ban_event", note["id"]), ("disallow_kind", "7")):
        r = await d.post_form("/admin/origins/1/moderation", {"action": action, "value": value, "reason": "spam"},
                              page="/admin/origins/1")
        assert r.status_code == 303
    with pytest.raises(Rejected, match="banned"):
        await publish(d, None, note)
    with pytest.raises(Rejected, match="kind 7"):
        await publish(d, None, sign_event(alice.secret, 7, [], "+").to_dict())
    page = await d.get("/admin/origins/1")
    assert note["id"] in page.text and "spam" in page.text
    r = await d.post_form("/admin/origins/1/moderation", {"action": "ban_pubkey", "value": alice.pubkey},
                          page="/admin/origins/1")
    with pytest.raises(Rejected, match="blocked"):
        await publish(d, None, sign_event(alice.secret, 1, [], "again").to_dict())
    r = await d.post_form("/admin/origins/1/moderation", {"action": "block_ip", "value": "127.0.0.1"},
                          page="/admin/origins/1")
    assert r.status_code == 303
    assert (await d.get("/", headers={"Accept": "application/nostr+json"})).status_code == 403
    r = await d.post_form("/admin/origins/1/moderation", {"action": "unblock_ip", "value": "127.0.0.1"},
                          page="/admin/origins/1")
    assert (await d.get("/", headers={"Accept": "application/nostr+json"})).status_code == 200


async def test_quotas_overview_and_charts(signed_in):
    d = signed_in
    alice = Installation()
    from appliance.nostr.event import sign_event

    await d.admin.recorder.sample()
    for i in range(3):
        await publish(d, None, sign_event(alice.secret, 1, [], f"n{i}").to_dict())
    with pytest.raises(Rejected):
        await publish(d, None, sign_event(alice.secret, 22242, [], "x").to_dict())
    await d.admin.recorder.sample()
    page = await d.get("/admin/quotas")
    fp = d.admin.redactor.fingerprint(alice.pubkey, "pk")
    assert fp in page.text and alice.pubkey not in page.text
    assert "AUTH events are sent in AUTH messages" in page.text and "<svg" in page.text
    overview = await d.get("/admin/")
    assert "<svg" in overview.text and "<polyline" in overview.text and "Events/s" in overview.text
    stats = await d.get("/admin/overview/stats")
    assert stats.status_code == 200 and 'id="connections"' in stats.text and "<html" not in stats.text


@pytest.mark.sqlite_only("the dashboard's backup downloads the SQLite database file")
async def test_settings_password_change_and_backup(signed_in):
    d = signed_in
    r = await d.post_form("/admin/settings/password", {"current": "wrong one!", "password": "a new long password",
                                                       "confirm": "a new long password"}, page="/admin/settings")
    assert r.status_code == 400
    r = await d.post_form("/admin/settings/password", {"current": PASSWORD, "password": "a new long password",
                                                       "confirm": "a new long password"}, page="/admin/settings")
    assert r.status_code == 303 and (await d.get("/admin/settings")).status_code == 200
    page = await d.get("/admin/settings")
    assert "admin_listen" in page.text and "metrics_token" in page.text
    r = await d.post_form("/admin/settings/backup", {}, page="/admin/settings")
    assert r.status_code == 200 and r.content[:16] == b"SQLite format 3\x00"
    assert "attachment" in r.headers["content-disposition"]
    copy = d.settings.data_path.parent / "copy.sqlite3"
    copy.write_bytes(r.content)
    conn = sqlite3.connect(copy)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT origin FROM origins").fetchall() == [("ws://push.test",)]
    conn.close()
    assert not list(d.settings.data_path.glob(".backup-*"))  # the temporary copy is gone


async def test_health_and_metrics(signed_in, tmp_path):
    d = signed_in
    health = await d.get("/admin/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["checks"] == {"database_read": "ok", "database_write": "ok"}
    metrics = await d.get("/admin/metrics")
    assert metrics.status_code == 200 and "appliance_connections{origin=\"ws://push.test\"} 0" in metrics.text
    assert "# TYPE appliance_events_accepted_total counter" in metrics.text
    # What a soak samples: the event loop's lag and the wake outbox's depth.
    lag = [ln for ln in metrics.text.splitlines() if ln.startswith("appliance_event_loop_lag_seconds ")]
    assert len(lag) == 1 and 0 <= float(lag[0].split()[1]) < 5
    assert 'appliance_wake_queue_depth{state="queued"} 0' in metrics.text
    assert "# TYPE appliance_sqlite_memory_bytes gauge" in metrics.text
    import httpx

    async with httpx.AsyncClient(transport=d.client._transport, base_url="http://127.0.0.1:7777") as anonymous:
        assert (await anonymous.get("/admin/metrics")).status_code == 401
        assert (await anonymous.get("/admin/health")).status_code == 200
    # Every label value comes from a bounded set.
    for line in metrics.text.splitlines():
        if "{" in line and not line.startswith("#"):
            labels = dict(kv.split("=", 1) for kv in line.split("{", 1)[1].split("}", 1)[0].split(","))
            assert set(labels) <= {"origin", "prefix", "state", "version"}, line
            if "origin" in labels:
                assert labels["origin"].strip('"') in {"ws://push.test", "other"}


async def test_metrics_token(tmp_path, anyio_backend):
    import httpx

    from .helpers import Dashboard

    d = Dashboard(tmp_path / "data", metrics_token="s3cret-token")
    try:
        async with httpx.AsyncClient(transport=d.client._transport, base_url="http://127.0.0.1:7777") as c:
            assert (await c.get("/admin/metrics")).status_code == 401
            assert (await c.get("/admin/metrics", headers={"Authorization": "Bearer wrong"})).status_code == 401
            r = await c.get("/admin/metrics", headers={"Authorization": "Bearer s3cret-token"})
            assert r.status_code == 200 and "appliance_info" in r.text
    finally:
        await d.close()


async def test_no_page_shows_a_full_pubkey_or_endpoint(signed_in):
    """Crawl every page with leases, groups and lists in place: no author pubkey, #p value or
    endpoint from the test data appears anywhere."""
    d = signed_in
    await enable_push(d)
    exec_id, exec_pub = current_key(await nip11(d))
    users = [Installation() for _ in range(3)]
    secrets_ = []
    for i, user in enumerate(users):
        endpoint = f"tok-{i}-" + "f" * 58
        secrets_ += [user.pubkey, endpoint]
        pt = active(user, endpoint=endpoint)  # its #p is the author's own pubkey (the spec's rule)
        await publish(d, user.pubkey, lease(user, pt, exec_pub=exec_pub, exec_id=exec_id))
    from appliance.nostr.event import sign_event

    await publish(d, None, sign_event(users[0].secret, 1, [["p", users[1].pubkey]], "hi").to_dict())
    await d.post_form("/admin/origins/1/moderation", {"action": "allow_pubkey", "value": users[0].pubkey},
                      page="/admin/origins/1")
    await d.post_form("/admin/origins/1/groups", {"name": "g", "admins": users[1].pubkey}, page="/admin/origins/1")
    listing = (await d.get("/admin/leases")).text
    refs = {part.split('"', 1)[0] for part in listing.split('href="/admin/leases/')[1:]}
    pages = ["/admin/", "/admin/overview/stats", "/admin/origins", "/admin/origins/1", "/admin/descriptor",
             "/admin/keys", "/admin/leases", "/admin/quotas", "/admin/settings", "/admin/metrics", "/admin/health",
             *[f"/admin/leases/{ref}" for ref in refs]]
    assert len(refs) == 3
    for path in pages:
        r = await d.get(path)
        assert r.status_code == 200, path
        for secret in secrets_:
            assert secret not in r.text, (path, secret[:12])


async def test_settings_editable_from_the_dashboard_persist_and_yield_to_the_configuration(signed_in, tmp_path):
    from appliance.nostr.nip98 import make_http_auth
    from tests.conftest import Identity

    from .helpers import Dashboard

    d = signed_in
    admin = Identity()
    r = await d.post_form("/admin/settings/edit", {"name": "admin_pubkeys", "value": "npub1x"}, page="/admin/settings")
    assert r.status_code == 400 and "admin_pubkeys" in r.text
    r = await d.post_form("/admin/settings/edit", {"name": "data_dir", "value": "/tmp"}, page="/admin/settings")
    assert r.status_code == 400
    r = await d.post_form("/admin/settings/edit", {"name": "admin_pubkeys", "value": admin.pubkey},
                          page="/admin/settings")
    assert r.status_code == 303 and d.settings.admin_pubkeys == (admin.pubkey,)
    page = await d.get("/admin/settings")
    assert admin.pubkey not in page.text and d.admin.redactor.fingerprint(admin.pubkey, "pk") in page.text
    body = b'{"method": "supportedmethods", "params": []}'
    r = await d.client.post("/", content=body, headers={"Content-Type": "application/nostr+json+rpc",
                                                        "Authorization": make_http_auth(admin.secret, "ws://push.test",
                                                                                        "POST", body)})
    assert r.status_code == 200  # NIP-86 admits the new admin at once
    await d.close()
    # After a restart the saved value still applies; a flag wins over it.
    again = Dashboard(d.settings.data_path, config="public_url = \"ws://push.test\"\n")
    try:
        assert again.settings.admin_pubkeys == (admin.pubkey,) and again.settings.sources["admin_pubkeys"] == "dashboard"
    finally:
        await again.close()
    other = Identity()
    flagged = Dashboard(d.settings.data_path, config="public_url = \"ws://push.test\"\n", admin_pubkeys=other.pubkey)
    try:
        assert flagged.settings.admin_pubkeys == (other.pubkey,)
    finally:
        await flagged.close()
