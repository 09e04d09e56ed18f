"""Who may use the dashboard: no default password, one-time setup token, sessions, CSRF, login
rate limits, `appliance admin reset`, security headers."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from appliance.admin import auth
from appliance.app import asgi

from .helpers import PASSWORD, csrf_of, setup_token

pytestmark = pytest.mark.anyio


async def test_no_default_password_and_a_one_time_setup_url(dash):
    line = next(line for line in dash.app.banner if line.startswith("  admin  "))
    assert line.startswith("  admin  http://push.test/admin/setup?token=") or "/admin/setup?token=" in line
    # Nothing is reachable before setup; signing in with any password fails.
    r = await dash.get("/admin/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/admin/login"
    login = await dash.get("/admin/login")
    assert "No admin password is set yet" in login.text
    r = await dash.post_form("/admin/login", {"password": ""}, page="/admin/login")
    assert r.status_code == 401
    # The token sets the password once.
    await dash.set_up()
    assert (await dash.get("/admin/")).status_code == 200
    token = setup_token(dash.app)
    again = await dash.get(f"/admin/setup?token={token}")
    assert again.status_code == 403 and "not valid" in again.text


async def test_setup_refuses_bad_tokens_and_weak_passwords(dash):
    r = await dash.get("/admin/setup?token=nope")
    assert r.status_code == 403
    token = setup_token(dash.app)
    page = await dash.get(f"/admin/setup?token={token}")
    r = await dash.client.post("/admin/setup", data={"csrf": csrf_of(page.text), "token": token,
                                                     "password": "short", "confirm": "short"})
    assert r.status_code == 400 and "at least 10 characters" in r.text
    r = await dash.client.post("/admin/setup", data={"csrf": csrf_of(page.text), "token": "forged",
                                                     "password": PASSWORD, "confirm": PASSWORD})
    assert r.status_code == 403
    # The real token still works (a failed attempt did not spend it).
    await dash.set_up()


async def test_password_is_stored_with_scrypt_never_in_clear(signed_in):
    row = await signed_in.app.store.read(auth.rows.auth_row)
    assert row.password_hash.startswith("scrypt$32768$8$1$") and PASSWORD not in row.password_hash
    assert row.setup_token_hash is None


async def test_session_cookie_is_signed_httponly_samesite(dash):
    token = setup_token(dash.app)
    page = await dash.get(f"/admin/setup?token={token}")
    r = await dash.client.post("/admin/setup", data={"csrf": csrf_of(page.text), "token": token,
                                                     "password": PASSWORD, "confirm": PASSWORD})
    cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie" and v.startswith("appliance_admin="))
    attrs = cookie.lower()
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/admin" in attrs
    # A tampered cookie is no session.
    value = dash.client.cookies.get("appliance_admin")
    dash.client.cookies.set("appliance_admin", value[:-1] + ("0" if value[-1] != "0" else "1"), path="/admin")
    r = await dash.get("/admin/", follow_redirects=False)
    assert r.status_code == 303


async def test_login_logout_and_rate_limit(signed_in):
    d = signed_in
    page = await d.get("/admin/")
    r = await d.client.post("/admin/logout", data={"csrf": csrf_of(page.text)})
    assert r.status_code == 303
    assert (await d.get("/admin/", follow_redirects=False)).status_code == 303
    for _ in range(auth.LoginLimiter.PER_ADDRESS):
        r = await d.post_form("/admin/login", {"password": "wrong password!"}, page="/admin/login")
        assert r.status_code == 401 and "Wrong password" in r.text
    r = await d.post_form("/admin/login", {"password": PASSWORD}, page="/admin/login")
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    d.admin.limiter.failures.clear()
    r = await d.post_form("/admin/login", {"password": PASSWORD}, page="/admin/login")
    assert r.status_code == 303
    assert (await d.get("/admin/")).status_code == 200


async def test_csrf_required_on_every_state_changing_request(signed_in):
    d = signed_in
    # No token at all.
    r = await d.client.post("/admin/origins", data={"origin": "ws://x.test"})
    assert r.status_code == 403 and "CSRF" in r.text
    # A wrong token.
    r = await d.client.post("/admin/origins", data={"origin": "ws://x.test", "csrf": "0" * 64})
    assert r.status_code == 403
    # The right token, but sent from another site.
    token = csrf_of((await d.get("/admin/origins")).text)
    r = await d.client.post("/admin/origins", data={"origin": "ws://x.test", "csrf": token},
                            headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    r = await d.client.post("/admin/origins", data={"origin": "ws://x.test", "csrf": token},
                            headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    # htmx sends it as a header: accepted.
    r = await d.client.post("/admin/origins", data={"origin": "ws://x.test"}, headers={"X-CSRF-Token": token,
                                                                                       "HX-Request": "true"})
    assert r.status_code == 303
    # Nothing was created by the refused requests: exactly one new origin.
    assert (await d.get("/admin/origins")).text.count("ws://x.test</a>") == 1
    # Sign-in and sign-out are forms too.
    r = await d.client.post("/admin/logout", data={})
    assert r.status_code == 403
    r = await d.client.post("/admin/login", data={"password": PASSWORD})
    assert r.status_code == 403


async def test_admin_reset_clears_the_password_and_ends_sessions(signed_in):
    d = signed_in
    token = await d.app.store.write(lambda conn: auth.reset(conn, int(time.time())))
    assert (await d.get("/admin/", follow_redirects=False)).status_code == 303
    r = await d.post_form("/admin/login", {"password": PASSWORD}, page="/admin/login")
    assert r.status_code == 401
    page = await d.get(f"/admin/setup?token={token}")
    assert page.status_code == 200
    r = await d.client.post("/admin/setup", data={"csrf": csrf_of(page.text), "token": token,
                                                  "password": "another long one", "confirm": "another long one"})
    assert r.status_code == 303


async def test_security_headers_and_escaping(signed_in):
    d = signed_in
    r = await d.post_form("/admin/origins/1", {"name": "<script>alert(1)</script>"}, page="/admin/origins/1")
    assert r.status_code == 303
    page = await d.get("/admin/origins/1")
    assert "<script>alert(1)</script>" not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    for header in ("content-security-policy", "x-frame-options", "referrer-policy", "x-content-type-options"):
        assert header in page.headers
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_sign_ins_sent_at_once_cannot_outrun_the_limit(signed_in):
    """Each attempt is charged before its (slow) password check: a burst from one address gets no
    more guesses than the limit."""
    d = signed_in
    page = await d.get("/admin/")
    await d.client.post("/admin/logout", data={"csrf": csrf_of(page.text)})
    token = csrf_of((await d.get("/admin/login")).text)
    burst = await asyncio.gather(*[d.client.post("/admin/login", data={"csrf": token, "password": f"guess {i}!!!!"})
                                   for i in range(3 * auth.LoginLimiter.PER_ADDRESS)])
    codes = [r.status_code for r in burst]
    assert codes.count(401) == auth.LoginLimiter.PER_ADDRESS and codes.count(429) == len(codes) - codes.count(401)


async def test_sign_in_limits_count_the_client_behind_a_trusted_proxy(signed_in):
    """Behind the local TLS proxy every request comes from 127.0.0.1: the limit is per forwarded
    client, so one guesser does not lock the operator out, and the log names the client."""
    d = signed_in
    page = await d.get("/admin/")
    await d.client.post("/admin/logout", data={"csrf": csrf_of(page.text)})
    for _ in range(auth.LoginLimiter.PER_ADDRESS):
        r = await d.post_form("/admin/login", {"password": "wrong password!"}, page="/admin/login",
                              headers={"X-Forwarded-For": "203.0.113.9"})
        assert r.status_code == 401
    r = await d.post_form("/admin/login", {"password": PASSWORD}, page="/admin/login",
                          headers={"X-Forwarded-For": "203.0.113.9"})
    assert r.status_code == 429
    assert "203.0.113.9" in d.admin.limiter.failures and "127.0.0.1" not in d.admin.limiter.failures
    r = await d.post_form("/admin/login", {"password": PASSWORD}, page="/admin/login",
                          headers={"X-Forwarded-For": "198.51.100.7"})
    assert r.status_code == 303


async def test_a_client_that_is_not_a_proxy_cannot_pick_its_address(dash):
    """X-Forwarded-For from a peer that is not a trusted proxy is ignored: it cannot dodge the limit."""
    await dash.set_up()
    remote = httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(dash.app), client=("192.0.2.50", 40000)),
                               base_url="http://127.0.0.1:7777")
    try:
        for i in range(auth.LoginLimiter.PER_ADDRESS + 1):
            token = csrf_of((await remote.get("/admin/login")).text)
            r = await remote.post("/admin/login", data={"csrf": token, "password": "wrong password!"},
                                  headers={"X-Forwarded-For": f"198.51.100.{i}"})
            assert r.status_code == (401 if i < auth.LoginLimiter.PER_ADDRESS else 429)
        assert set(dash.admin.limiter.failures) == {"192.0.2.50"}
    finally:
        await remote.aclose()


async def test_a_forged_setup_token_costs_no_password_hashing(dash, monkeypatch):
    """/admin/setup is open to anyone: the token is checked before the (memory-hard) hashing."""
    hashed = []
    real = auth.hash_password
    monkeypatch.setattr(auth, "hash_password", lambda password: hashed.append(1) or real(password))
    page = await dash.get("/admin/login")
    for _ in range(3):
        r = await dash.client.post("/admin/setup", data={"csrf": csrf_of(page.text), "token": "forged",
                                                         "password": PASSWORD, "confirm": PASSWORD})
        assert r.status_code == 403
    assert hashed == []
    await dash.set_up()  # the real token still works, and hashes once
    assert hashed == [1]
