"""The operator's path in real headless Chromium (Debian's `chromium`, driven by Playwright), on a
real `appliance serve` and the APNs emulator: truthful transport health and alerts (dismissed, and
cleared by a success or a test wake), blocking an author the dashboard shows only as a
fingerprint, and plain words (errors naming the form's field, units, usage, a 404 with a way
back, the test wake's headline, the delivery log within 1280 px). Screenshots go to
test-artifacts/screenshots/operator-*.png."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.nostr.event import sign_event
from tests.conftest import Server
from tests.push.delivery_helpers import Apns, Pusher, delivery_config, token
from tests.push.e2e_helpers import IOS, Installation

from .helpers import PASSWORD
from .test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS, playwright_api
from .test_server import admin_url

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser():
    import shutil

    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                               args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def apns(tmp_path):
    a = Apns(tmp_path).start()
    yield a
    a.stop()


def serve(tmp_path, apns: Apns | None, *, push: bool = True) -> Server:
    server = Server(tmp_path / "data", "--wake-retry-delay", "0.3")
    if push:
        server.config = delivery_config(apns, origin=server.url, profiles=[apns.profile()])
    return server.start()


def page_for(browser, server: Server):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(15_000)
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(admin_url(server))
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=confirm]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.http}/admin/?*")
    return page


def shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"operator-{name}.png"), full_page=True)


def run(coro):
    """Run a websocket client's coroutine on a thread of its own (Playwright's loop holds this one)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def lease_and_wake(server: Server, endpoint: str) -> tuple[Pusher, Pusher]:
    bob = await Pusher.connect(server, origin=server.url)
    await bob.lease(endpoint, subscriptions=[{"filter": {"kinds": [9], "#p": [bob.pubkey]},
                                              "class": "time_sensitive"}])
    alice = await Pusher.connect(server, origin=server.url)
    await alice.publish(9, [["p", bob.pubkey]])
    await alice.client.close()
    await bob.client.close()
    return alice, bob


def wait_overview(page, server: Server, text: str, timeout: float = 40.0) -> None:
    """Reload the overview until `text` is on it (the overview refreshes itself every 10 s)."""
    end = time.monotonic() + timeout
    while True:
        page.goto(f"{server.http}/admin/")
        if text in page.content():
            return
        if time.monotonic() > end:
            raise AssertionError(f"{text!r} not on the overview:\n{page.locator('main').inner_text()}")
        page.wait_for_timeout(300)


def test_health_failing_dismissed_and_cleared(browser, apns, tmp_path):
    port = apns.emulator.port
    server = serve(tmp_path, apns)
    try:
        page = page_for(browser, server)
        apns.stop()  # APNs goes away: every connection is refused
        run(lease_and_wake(server, token()))
        wait_overview(page, server, "state-failing")
        row = page.locator("#transport-health tr", has_text=IOS)
        assert row.locator("td.state-failing").inner_text() == "failing"
        assert "refuses connections" in row.inner_text()
        alert = page.locator("#alerts li.alert").filter(has_text="connection refused")
        assert alert.count() == 1
        shot(page, "overview-failing")
        # Dismissed: the alert leaves the list; the transport table still says failing.
        alert.locator("button", has_text="dismiss").click()
        page.locator(".flash").filter(has_text="Alert dismissed").wait_for()
        assert page.locator("#alerts li.alert").count() == 0 and "1 dismissed" in page.locator("#no-alerts").inner_text()
        assert page.locator("#transport-health td.state-failing").count() == 1
        health = json.loads(page.evaluate("async () => await (await fetch('/admin/health')).text()"))
        assert [t["state"] for t in health["transports"]] == ["failing"] and health["push"] == "failing"
        metrics = page.evaluate("async () => await (await fetch('/admin/metrics')).text()")
        assert [s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                if s.name == "appliance_transport_state"
                and s.labels == {"origin": server.url, "app_profile": IOS, "state": "failing"}] == [1]
        # APNs back: the waiting wake is accepted and the profile is ok again.
        apns.emulator.start_in_thread(port=port)
        wait_overview(page, server, "state-ok")
        assert page.locator("#transport-health td.state-failing").count() == 0
        shot(page, "overview-ok")

        # A configuration fault: an alert and "fault"; a successful test wake clears both.
        apns.emulator.behave(None, 403, "InvalidProviderToken")
        run(lease_and_wake(server, token()))
        wait_overview(page, server, "InvalidProviderToken")
        assert page.locator("#transport-health td.state-fault").count() == 1
        apns.emulator.clear()
        page.goto(f"{server.http}/admin/descriptor")
        page.fill("form.test-wake input[name=token]", token())
        with page.expect_navigation():
            page.click("form.test-wake button[type=submit]")
        assert page.locator("#test-wake-headline").inner_text() == "Sent: accepted by APNs"
        shot(page, "test-wake-sent")
        page.goto(f"{server.http}/admin/")
        assert page.locator("#alerts li.alert").count() == 0
        assert page.locator("#transport-health td.state-fault").count() == 0
        assert page.locator("#transport-health td.state-ok").count() == 1
        page.close()
    finally:
        server.stop()


def test_block_an_author_shown_as_a_fingerprint(browser, apns, tmp_path):
    server = serve(tmp_path, apns)
    try:
        page = page_for(browser, server)
        user = Installation()
        bob = run(_lease_only(server, user, token()))
        spammer = Installation()

        async def spam():
            p = await Pusher.connect(server, origin=server.url, user=spammer)
            for i in range(3):
                await p.publish(1, [], f"spam {i}")
            await p.client.close()

        run(spam())
        # The leases page: the lease's author, with its block action.
        page.goto(f"{server.http}/admin/leases")
        assert page.locator("tr.lease").first.locator("button", has_text="block this author").count() == 1
        assert user.pubkey not in page.content()
        # The quotas page: the top publishers; block the spammer from there.
        page.goto(f"{server.http}/admin/quotas")
        fp = fingerprint_of(server, spammer.pubkey)
        row = page.locator("tr", has=page.locator("button", has_text="block this author")).filter(has_text=fp)
        assert row.first.locator("td").last.inner_text() == "3" and spammer.pubkey not in page.content()
        row.first.locator("button", has_text="block this author").click()
        page.locator("#block-author").wait_for()
        shot(page, "block-author")
        assert page.locator("h1").inner_text() == f"Block author {fp}" and spammer.pubkey not in page.content()
        page.fill("#block-author input[name=reason]", "spam")
        page.click("#block-author button[type=submit]")
        page.locator(".flash").filter(has_text=f"Blocked {fp}").wait_for()
        assert page.locator("h1").inner_text() == "Quotas"  # back where the author was shown
        assert spammer.pubkey not in page.content()
        page.goto(f"{server.http}/admin/origins/1")
        assert fp in page.locator("#blocklist").inner_text() and "spam" in page.locator("#blocklist").inner_text()
        # The relay refuses the author at once.
        async def refused() -> str:
            from tests.conftest import Client

            client = await Client.connect(server.url)
            await client.auth(spammer.secret, server.url)
            ok, msg = await client.publish(sign_event(spammer.secret, 1, [], "more spam"))
            await client.close()
            return msg if not ok else ""

        assert run(refused()).startswith("blocked")
        # The origin page's ban form takes a fingerprint too (bob's, from the leases page).
        page.goto(f"{server.http}/admin/leases")
        bob_fp = page.locator("tr.lease td.author code").first.inner_text()
        page.goto(f"{server.http}/admin/origins/1")
        form = page.locator("form", has=page.locator("input[value=ban_pubkey]")).last
        form.locator("input[name=value]").fill(bob_fp)
        form.locator("button[type=submit]").click()
        page.locator(".flash").filter(has_text=f"Blocked {bob_fp}").wait_for()
        assert bob.pubkey not in page.content() and bob_fp in page.locator("#blocklist").inner_text()
        page.close()
    finally:
        server.stop()


def fingerprint_of(server: Server, pubkey: str) -> str:
    """The dashboard's fingerprint of a pubkey (from the server's key file, as the test's own check)."""
    from appliance.store.fingerprints import KEY_PURPOSE, fingerprint
    from appliance.store.keyfile import KeyFile

    return fingerprint(KeyFile(server.data_dir, holds_wrapped_keys=True).derive(KEY_PURPOSE), pubkey)


async def _lease_only(server: Server, user: Installation, endpoint: str) -> Pusher:
    p = await Pusher.connect(server, origin=server.url, user=user)
    await p.lease(endpoint, subscriptions=[{"filter": {"kinds": [9], "#p": [p.pubkey]}, "class": "default"}])
    await p.client.close()
    return p


def test_plain_words(browser, apns, tmp_path):
    server = serve(tmp_path, apns, push=False)
    try:
        page = page_for(browser, server)
        base = f"{server.http}/admin"
        # Push on with no app profile: refused, with the reason, naming the form's field.
        page.goto(f"{base}/descriptor")
        page.check("input[name=push_enabled]")
        page.click("#descriptor-form button[type=submit]")
        error = page.locator("main > .error").inner_text()
        assert error.startswith("Not saved. App profiles:") and "no app profile" in error, error
        assert "push.push" not in error and "ValueError" not in error
        # Every limitation field says what it bounds, with its unit.
        for name in ("max_lease_ttl", "max_leases_per_pubkey", "max_content_len", "allowed_skew"):
            help_text = page.locator("label.limit", has=page.locator(f"input[name=lim_{name}], input[name={name}]"))
            assert "(" in help_text.locator(".help").inner_text(), name
        assert "seconds" in page.locator("label.limit", has_text="max_lease_ttl").inner_text()
        # A profile with a key file that is no key: the field named as the form labels it.
        page.fill("input[name=new_profile_id]", IOS)
        for cls in ("silent", "default", "time_sensitive", "urgent"):
            page.check(f"input[name=cs_apns_{cls}]")
        page.click("#descriptor-form button[type=submit]")
        page.locator(".flash").filter(has_text="Descriptor saved").wait_for()
        bad = tmp_path / "not-a-key.p8"
        bad.write_text("this is not a key\n")
        page.locator("details", has_text="APNs credentials").first.evaluate("d => d.open = true")
        for field, value in (("topic", "com.example.app"), ("team_id", "TEAM123456"), ("key_id", "ABC123DEFG"),
                             ("key_file", str(bad))):
            page.fill(f"input[name=cred_0_{field}]", value)
        page.select_option("select[name=cred_0_environment]", "production")
        page.click("#descriptor-form button[type=submit]")
        error = page.locator("main > .error").inner_text()
        shot(page, "descriptor-error")
        assert f"App profile {IOS}: .p8 path on this server: not a PEM private key" in error, error
        for jargon in ("push.push", "ValueError", "(ValueError)", f"{server.url}.push", "public_url.push"):
            assert jargon not in error, (jargon, error)
        # Credentials that work, then a test wake with a token APNs cannot take: "Not sent: ...".
        good = tmp_path / "AuthKey.p8"
        good.write_bytes(apns.key_file.read_bytes())
        page.goto(f"{base}/descriptor")
        page.locator("details", has_text="APNs credentials").first.evaluate("d => d.open = true")
        for field, value in (("topic", "com.example.app"), ("team_id", "TEAM123456"), ("key_id", "ABC123DEFG"),
                             ("key_file", str(good)), ("apns_url", apns.emulator.url),
                             ("ca_file", apns.emulator.ca_file)):
            page.fill(f"input[name=cred_0_{field}]", value)
        page.select_option("select[name=cred_0_environment]", "production")
        page.click("#descriptor-form button[type=submit]")
        page.locator(".flash").filter(has_text="Descriptor saved").wait_for()
        page.fill("form.test-wake input[name=token]", "not-a-device-token")
        with page.expect_navigation():
            page.click("form.test-wake button[type=submit]")
        assert page.locator("#test-wake-headline").inner_text().startswith("Not sent: ")
        shot(page, "test-wake-not-sent")
        # An unknown dashboard URL: a styled 404 with a way back.
        response = page.goto(f"{base}/no-such-page")
        assert response.status == 404 and page.locator("h1").inner_text() == "Not found"
        assert page.locator("header nav").count() == 1
        shot(page, "404")
        page.click("#back-to-overview")
        page.locator("h1", has_text="Overview").wait_for()
        # Active leases: only effective ones (a lease whose endpoint APNs says is gone does not count).
        dead = token()
        apns.emulator.unregister(dead)
        run(lease_and_wake(server, dead))
        for _ in range(100):
            page.goto(f"{base}/leases?state=endpoint-invalid")
            if page.locator("tr.lease").count():
                break
            page.wait_for_timeout(200)
        assert page.locator("tr.lease").count() == 1
        page.goto(f"{base}/")
        assert page.locator("#active-leases").inner_text() == "0"
        # Quotas: limits with their units and what is in use now.
        page.goto(f"{base}/quotas")
        limits = page.locator("#relay-limits")
        assert "bytes" in limits.locator("tr", has_text="max_message_length").inner_text()
        assert "on the busiest connection" in limits.locator("tr", has_text="max_subscriptions").inner_text()
        assert "held by the busiest author" in page.locator("table.push-limits").inner_text()
        shot(page, "quotas")
        # The delivery log fits a 1280 px window: no sideways scrolling, long details included.
        apns.stop()
        run(lease_and_wake(server, token()))
        for _ in range(100):
            page.goto(f"{base}/deliveries")
            if page.locator("tr.outcome-transient").count():
                break
            page.wait_for_timeout(200)
        assert "connection refused" in page.locator("tr.outcome-transient").first.inner_text()
        assert page.locator("tr.delivery").count() >= 1
        width = page.evaluate("() => document.documentElement.scrollWidth")
        shot(page, "deliveries")
        assert width <= 1280, width
        # Settings: every row says what it is, with its unit where it has one.
        page.goto(f"{base}/settings")
        row = page.locator("#settings-table tr", has_text="max_message_length")
        assert "bytes" in row.inner_text()
        page.close()
    finally:
        server.stop()
