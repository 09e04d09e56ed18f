"""The dashboard in real headless Chromium (Debian's `chromium`, driven by Playwright): first-run
setup, sign-in, descriptor edit with a rejected invalid descriptor and the live preview, key
rotation seen in NIP-11, a lease made over websockets shown redacted, CSRF refusal, and a
screenshot of every page (test-artifacts/screenshots/). No page shows a full author pubkey or
endpoint from the test data."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from appliance.nostr.event import sign_event
from tests.conftest import ROOT, Server
from tests.push.delivery_helpers import KEY_ID, TEAM, TOPIC, Apns, token
from tests.push.e2e_helpers import Installation, active, current_key, lease

from .helpers import PASSWORD
from .test_server import admin_url

CHROMIUM = os.environ.get("APPLIANCE_CHROMIUM", "/usr/bin/chromium")
playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium); the browser tests need it",
                allow_module_level=True)

# The flags this machine's Chromium needs (no sandbox as root, no background network).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "test-artifacts" / "screenshots"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    apns = Apns(tmp).start()
    server = Server(tmp / "data", "--wake-min-interval", "0").start()
    server.apns = apns
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                     args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(10_000)
        page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm prompts
        try:
            yield server, page
        finally:
            browser.close()
            server.stop()
            apns.stop()


def shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def nip11(server: Server) -> dict:
    return server.nip11()


def publish(server: Server, user: Installation, ev) -> None:
    """AUTH (NIP-42) and publish one event over a real websocket."""
    with connect(server.url) as ws:
        challenge = json.loads(ws.recv())[1]
        auth = sign_event(user.secret, 22242, [["relay", server.url], ["challenge", challenge]], "")
        ws.send(json.dumps(["AUTH", auth.to_dict()]))
        assert json.loads(ws.recv())[2] is True
        ws.send(json.dumps(["EVENT", ev]))
        reply = json.loads(ws.recv())
        assert reply[0] == "OK" and reply[2] is True, reply


def publish_lease(server: Server, user: Installation, endpoint: str) -> None:
    exec_id, exec_pub = current_key(nip11(server))
    publish(server, user, lease(user, active(user, endpoint=endpoint, origin=server.url), exec_pub=exec_pub,
                                exec_id=exec_id))


def test_dashboard_in_a_browser(stack):
    server, page = stack
    base = server.http + "/admin"
    # First run: the one-time setup URL from the start banner.
    page.goto(admin_url(server))
    shot(page, "setup")
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=confirm]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/?*")
    assert page.locator("h1").inner_text() == "Overview"
    # Sign out, then sign in with the password.
    page.click("text=Sign out")
    page.wait_for_url(f"{base}/login*")
    shot(page, "login")
    page.fill("input[name=password]", "not the password")
    page.click("button[type=submit]")
    assert "Wrong password" in page.content()
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    shot(page, "overview")

    # Descriptor: enable push with a profile; the live preview follows the form.
    page.goto(f"{base}/descriptor")
    page.check("input[name=push_enabled]")
    page.fill("input[name=push_kinds]", "9, 1059, 7")
    page.fill("input[name=new_profile_id]", "com.example.app/ios")
    for cls in ("silent", "default", "time_sensitive", "urgent"):
        page.check(f"input[name=cs_apns_{cls}]")
    page.fill("input[name=urgent_kinds]", "40")
    page.locator("#preview-error").filter(has_text="urgent-subset").wait_for()  # htmx preview, before saving
    page.click("#descriptor-form button[type=submit]")
    assert "urgent-subset" in page.locator(".error").first.inner_text()  # rejected, rule named
    assert "push" not in nip11(server)
    page.fill("input[name=urgent_kinds]", "9")
    page.locator("#preview-json").filter(has_text='"urgent_kinds": [').wait_for()
    shot(page, "descriptor")
    page.click("#descriptor-form button[type=submit]")
    page.locator(".flash").filter(has_text="Descriptor saved").wait_for()
    doc = nip11(server)
    assert doc["push"]["urgent_kinds"] == [9] and doc["push"]["app_profiles"][0]["id"] == "com.example.app/ios"

    # Keys: rotate (confirmed), and NIP-11 advertises the new current key at once.
    old_id, _ = current_key(doc)
    page.goto(f"{base}/keys")
    page.check("input[name=confirm]")
    page.click("text=Rotate key")
    page.locator(".flash").filter(has_text="Rotated").wait_for()
    new_id, _ = current_key(nip11(server))
    assert new_id != old_id and new_id in page.content()
    shot(page, "keys")

    # APNs credentials for the profile, with the .p8 uploaded (stored wrapped by the key file).
    page.goto(f"{base}/descriptor")
    apns = server.apns
    for field, value in (("topic", TOPIC), ("team_id", TEAM), ("key_id", KEY_ID), ("apns_url", apns.emulator.url),
                         ("ca_file", apns.emulator.ca_file)):
        page.fill(f"input[name=cred_0_{field}]", value)
    page.select_option("select[name=cred_0_environment]", "production")
    page.set_input_files("input[name=cred_0_p8]", str(apns.key_file))
    page.click("#descriptor-form button[type=submit]")
    page.locator(".flash").filter(has_text="Descriptor saved").wait_for()
    assert "uploaded, in the database" in page.content()
    # A test wake from the profile's page: APNs' answer is shown.
    test_token = token()
    page.fill("form.test-wake input[name=token]", test_token)
    with page.expect_navigation():
        page.click("form.test-wake button[type=submit]")
    assert "accepted by APNs" in page.content() and test_token not in page.content()
    shot(page, "test-wake")

    # A lease made over websockets appears on the Leases page, redacted.
    user = Installation()
    endpoint = token()
    publish_lease(server, user, endpoint)
    page.goto(f"{base}/leases")
    rows = page.locator("tr.lease")
    assert rows.count() == 1 and "active" in rows.first.inner_text()
    content = page.content()
    assert user.pubkey not in content and endpoint not in content
    shot(page, "leases")
    rows.first.locator("a").click()
    page.wait_for_url(f"{base}/leases/*")
    assert "time_sensitive" in page.content() and user.pubkey not in page.content()
    shot(page, "lease")

    # An event for the lease wakes the device: the APNs emulator gets it, the delivery log shows it.
    sender = Installation()
    publish(server, sender, sign_event(sender.secret, 9, [["p", user.pubkey]], "hello").to_dict())
    apns.emulator.wait_for(lambda records: any(r.token == endpoint and r.status == 200 for r in records))
    for _ in range(50):
        page.goto(f"{base}/deliveries")
        if page.locator("tr.outcome-accepted").count():
            break
        page.wait_for_timeout(100)
    assert page.locator("tr.outcome-accepted").count() == 1
    assert endpoint not in page.content() and user.pubkey not in page.content()
    shot(page, "deliveries")

    # Every page: a screenshot, and no full pubkey or endpoint of the test data anywhere.
    for name, path in (("overview", "/"), ("origins", "/origins"), ("origin", "/origins/1"),
                       ("descriptor", "/descriptor"), ("keys", "/keys"), ("leases", "/leases"),
                       ("quotas", "/quotas"), ("deliveries", "/deliveries"), ("settings", "/settings")):
        page.goto(base + path)
        assert page.locator("h1").count() == 1, path
        shot(page, name)
        content = page.content()
        assert user.pubkey not in content and endpoint not in content, path
        assert "Internal Server Error" not in content
    for name in ("setup", "login", "overview", "origins", "origin", "descriptor", "keys", "leases", "lease",
                 "quotas", "deliveries", "test-wake", "settings"):
        assert (SHOTS / f"{name}.png").stat().st_size > 5_000, name


def test_csrf_rejected_without_the_token(stack):
    server, page = stack
    base = server.http + "/admin"
    page.goto(f"{base}/origins")
    if "Sign in" in page.content():
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.goto(f"{base}/origins")
    # A same-origin request that lacks the token (as an injected script's would) is refused...
    status = page.evaluate("""async () => (await fetch('/admin/origins', {method: 'POST',
        headers: {'Content-Type': 'application/x-www-form-urlencoded'},
        body: 'origin=ws%3A%2F%2Fcsrf.test'})).status""")
    assert status == 403
    # ...and so is the page's own form once its token is gone (no hidden field, no htmx header).
    page.evaluate("""() => { document.body.removeAttribute('hx-headers'); document.body.removeAttribute('hx-boost');
        document.querySelectorAll('input[name=csrf]').forEach(e => e.remove()); }""")
    page.fill("input[name=origin]", "ws://csrf.test")
    with page.expect_navigation():
        page.click("button:has-text('Add origin')")
    assert "CSRF check failed" in page.content()
    shot(page, "csrf-refused")
    origins = httpx.get(server.http + "/", headers={"Accept": "application/nostr+json", "Host": "csrf.test"})
    assert origins.status_code == 200  # a single origin answers every host: nothing was added
    page.goto(f"{base}/origins")
    assert "ws://csrf.test" not in page.content()
