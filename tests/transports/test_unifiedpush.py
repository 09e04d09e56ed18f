"""The UnifiedPush transport against a local distributor: the constant message as a phone decrypts
it (http-ece, not our code), VAPID as a push service checks it, and every hostile-endpoint rule."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time

import http_ece
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from appliance.testing.distributor import Distributor
from appliance.transports import ACCEPTED, INVALID_ENDPOINT, PERMANENT, TRANSIENT, WakeRequest
from appliance.transports.unifiedpush import (
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    UNIFIEDPUSH_PLAINTEXT,
    EndpointError,
    HostRates,
    UnifiedPushProfile,
    UnifiedPushTransport,
    forbidden_address,
    parse_endpoint,
)
from appliance.transports.webpush import VapidKey, b64url, b64url_decode, encrypt, p256_private_from_bytes

pytestmark = pytest.mark.anyio

HOST = "distributor.test"  # resolved by the tests' resolver only: the system's cannot reach it
CONTACT = "mailto:operator@example.org"


def _d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Resolver:
    """Answers for HOST (and counts every question)."""

    def __init__(self, *answers: list[str]):
        self.answers = list(answers) or [["127.0.0.1"]]
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host != HOST:
            raise OSError("unknown host")
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


class Keys:
    """An in-memory VAPID key per push origin (the store's version is tested with the server)."""

    def __init__(self):
        self.keys: dict[str, VapidKey] = {}

    async def __call__(self, push_origin: str) -> VapidKey:
        return self.keys.setdefault(push_origin, VapidKey.generate())


@pytest.fixture
async def distributor(tmp_path, anyio_backend):
    d = Distributor(host=HOST, pki_dir=tmp_path / "pki")
    await d.start()
    yield d
    await d.stop()


def make_transport(distributor, *, allow=(HOST,), resolver=None, **kw) -> UnifiedPushTransport:
    opts = {k: kw.pop(k) for k in ("host_rate", "host_burst") if k in kw}
    profile = UnifiedPushProfile("com.example.app/android", CONTACT, allow_hosts=frozenset(allow),
                                 ca_file=distributor.ca_file if distributor else None, **opts)
    return UnifiedPushTransport(profile, Keys(), resolve=resolver or Resolver(), **kw)


@pytest.fixture
async def transport(distributor):
    t = make_transport(distributor)
    yield t
    await t.close()


def wake(endpoint: str, ttl: int = 600, request_id: str = "0190a7e4-0000-7000-8000-000000000001") -> WakeRequest:
    return WakeRequest(endpoint=endpoint, request_id=request_id, expires_at=int(time.time()) + ttl)


def phone_reads(sub, body: bytes) -> bytes:
    """What the phone decrypts, with http-ece and the subscription's private key and auth secret."""
    return http_ece.decrypt(body, private_key=sub.private_key, auth_secret=sub.auth, version="aes128gcm")


def verify_vapid(authorization: str) -> dict:
    """The push service's check (RFC 8292), with `cryptography` alone: the JWT against k."""
    assert authorization.startswith("vapid ")
    params = dict(p.strip().split("=", 1) for p in authorization[len("vapid "):].split(","))
    head, claims, sig = params["t"].split(".")
    key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), _d(params["k"]))
    raw = _d(sig)
    key.verify(encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")),
               f"{head}.{claims}".encode(), ec.ECDSA(hashes.SHA256()))
    assert json.loads(_d(head)) == {"typ": "JWT", "alg": "ES256"}
    return json.loads(_d(claims))


# -- RFC 8291 ------------------------------------------------------------------------------------------


def test_encryption_matches_rfc_8291_appendix_a():
    body = encrypt(b"When I grow up, I want to be a watermelon",
                   b64url_decode("BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"),
                   b64url_decode("BTBZMqHH6r4Tts7J_aSIgg"), salt=b64url_decode("DGv6ra1nlYgDCS1FRnbzlw"),
                   sender=p256_private_from_bytes(b64url_decode("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw")))
    assert b64url(body) == ("DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYW"
                            "AmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQ"
                            "exSgSxsj_Qulcy4a-fN")


def test_an_independent_decryptor_reads_our_messages():
    d = Distributor()
    sub = d.subscribe("/x")
    for plaintext in (UNIFIEDPUSH_PLAINTEXT, b"", b"x" * 3000):
        assert phone_reads(sub, encrypt(plaintext, sub.p256dh, sub.auth)) == plaintext


# -- the endpoint grammar ------------------------------------------------------------------------------

P256DH = b64url(Distributor().subscribe("/x").p256dh)
AUTH = b64url(bytes(range(16)))
KEYS = f"#p256dh={P256DH}&auth={AUTH}"


def test_a_push_url_with_its_keys_parses():
    sub = parse_endpoint(f"https://Push.Example.NET/up/Ab-c_1%2F?x=1&y=2{KEYS}")
    assert (sub.scheme, sub.host, sub.port, sub.target) == ("https", "push.example.net", 443, "/up/Ab-c_1%2F?x=1&y=2")
    assert sub.origin == "https://push.example.net" and sub.auth == bytes(range(16))
    assert parse_endpoint(f"https://[2001:db8::1]:8443{KEYS}").origin == "https://[2001:db8::1]:8443"
    assert parse_endpoint(f"http://10.0.0.2:80/a{KEYS}").authority == "10.0.0.2"


@pytest.mark.parametrize("endpoint", [
    "https://push.example.net/up/x",  # no keys
    f"https://push.example.net/up/x#auth={AUTH}&p256dh={P256DH}",  # order
    f"https://push.example.net/up/x#p256dh={P256DH}&auth={AUTH}&x=1",  # extra member
    f"https://push.example.net/up/x#p256dh={P256DH}=&auth={AUTH}",  # padding
    f"https://push.example.net/up/x#p256dh={P256DH[:-1]}&auth={AUTH}",  # 64 bytes and a bit
    f"https://push.example.net/up/x#p256dh={P256DH}&auth={AUTH[:-2]}AB",  # non-canonical tail
    f"https://push.example.net/up/x#p256dh={b64url(bytes([4]) + bytes(64))}&auth={AUTH}",  # not on the curve
    f"https://push.example.net/up/x#p256dh={P256DH}&auth={b64url(bytes(15))}",  # short auth
    f"ftp://push.example.net/up/x{KEYS}",
    f"https:/push.example.net/up/x{KEYS}",
    f"https://user:pw@push.example.net/up/x{KEYS}",
    f"https://push.example.net:0/up/x{KEYS}",
    f"https://push.example.net:080/up/x{KEYS}",
    f"https://push.example.net:65536/up/x{KEYS}",
    f"https://push.example.net:/up/x{KEYS}",
    f"https:///up/x{KEYS}",
    f"https://push..example.net/up/x{KEYS}",
    f"https://-push.example.net/up/x{KEYS}",
    f"https://push.example.net/up x{KEYS}",
    f"https://push.example.net/up/x\n{KEYS}",
    f"https://pùsh.example.net/up/x{KEYS}",
    f"https://push.example.net/up/%zz{KEYS}",
    f"https://push.example.net/up/<x>{KEYS}",
    f"https://push.example.net/up/x#a{KEYS}",
    f"https://[::1/up/x{KEYS}",
    f"https://[nope]/up/x{KEYS}",
])
def test_anything_else_is_refused(endpoint):
    with pytest.raises(EndpointError) as exc:
        parse_endpoint(endpoint)
    assert P256DH not in str(exc.value) and "/up/" not in str(exc.value)


# -- delivery ------------------------------------------------------------------------------------------


async def test_the_phone_reads_the_constant_and_the_push_service_accepts_the_vapid_token(distributor, transport):
    sub = distributor.subscribe("/up/abc")
    before = int(time.time())
    out = await transport.send(wake(sub.endpoint + "", ttl=900))
    assert out.kind == ACCEPTED and out.status == 201, out
    [r] = distributor.requests("/up/abc")
    assert r.problem == "" and r.method == "POST" and r.target == "/up/abc"  # the fragment never leaves
    assert r.sni == HOST and r.header("host") == f"{HOST}:{distributor.port}"
    assert r.header("urgency") == "high" and r.header("content-encoding") == "aes128gcm"
    assert 895 <= int(r.header("ttl")) <= 900
    assert phone_reads(sub, r.body) == UNIFIEDPUSH_PLAINTEXT
    claims = verify_vapid(r.header("authorization"))
    assert claims["aud"] == f"https://{HOST}:{distributor.port}" and claims["sub"] == CONTACT
    assert before < claims["exp"] <= before + 24 * 3600 + 5
    # One VAPID key per push service origin, made on first use.
    assert list(transport.vapid_keys.keys) == [f"https://{HOST}:{distributor.port}"]


async def test_the_ttl_never_outlives_the_job(distributor, transport):
    sub = distributor.subscribe("/up/late")
    await transport.send(WakeRequest(sub.endpoint, "0190a7e4-0000-7000-8000-000000000002", int(time.time()) - 5))
    assert distributor.requests("/up/late")[0].header("ttl") == "0"


async def test_the_body_varies_only_with_the_encryptions_randomness(distributor, transport):
    salt, sender = b"s" * 16, ec.generate_private_key(ec.SECP256R1())
    randomness, transport.fresh = transport.fresh, lambda: (salt, sender)
    a, b = distributor.subscribe("/up/a"), distributor.subscribe("/up/b")
    b.private_key, b.auth = a.private_key, a.auth  # the same phone keys behind two push URLs
    await transport.send(wake(a.endpoint, ttl=100, request_id="0190a7e4-0000-7000-8000-00000000000a"))
    await transport.send(wake(b.endpoint, ttl=3000, request_id="0190a7e4-0000-7000-8000-00000000000b"))
    bodies = {r.body for r in distributor.requests()}
    assert len(bodies) == 1  # nothing of the job, the endpoint or the time reached the body
    transport.fresh = randomness
    for _ in range(2):
        await transport.send(wake(a.endpoint))
    fresh = [r.body for r in distributor.requests("/up/a")[1:]]
    assert fresh[0] != fresh[1] and len(fresh[0]) == len(fresh[1]) == len(next(iter(bodies)))
    assert all(phone_reads(a, body) == UNIFIEDPUSH_PLAINTEXT for body in fresh)


@pytest.mark.parametrize(("status", "kind"), [
    (200, ACCEPTED), (202, ACCEPTED),
    (404, INVALID_ENDPOINT), (410, INVALID_ENDPOINT), (403, INVALID_ENDPOINT),
    (400, PERMANENT), (413, PERMANENT), (401, PERMANENT), (418, PERMANENT),
    (429, TRANSIENT), (500, TRANSIENT), (503, TRANSIENT), (599, TRANSIENT),
])
async def test_answers_are_classified(distributor, transport, status, kind):
    sub = distributor.subscribe("/up/c")
    distributor.behave("/up/c", status, retry_after=7)
    out = await transport.send(wake(sub.endpoint))
    assert (out.kind, out.status) == (kind, status)
    assert out.retry_after == (7 if kind == TRANSIENT else None)
    assert out.endpoint_fault == (kind != ACCEPTED)  # the push host's, never the operator's


async def test_an_unsubscribed_endpoint_is_invalid(distributor, transport):
    sub = distributor.subscribe("/up/gone")
    distributor.unsubscribe("/up/gone")
    assert (await transport.send(wake(sub.endpoint))).kind == INVALID_ENDPOINT


# -- hostile endpoints -----------------------------------------------------------------------------------


async def test_https_only_unless_the_host_is_allowlisted(tmp_path, anyio_backend):
    plain = Distributor(host=HOST, tls=False)
    await plain.start()
    try:
        sub = plain.subscribe("/up/plain")
        assert sub.endpoint.startswith("http://")
        strict = make_transport(None, allow=())
        out = await strict.send(wake(sub.endpoint))
        assert out.kind == INVALID_ENDPOINT and out.reason == "InsecureEndpoint" and plain.requests() == []
        allowed = make_transport(None, allow=(HOST,))
        assert (await allowed.send(wake(sub.endpoint))).kind == ACCEPTED
        assert len(plain.requests()) == 1
        await strict.close()
        await allowed.close()
    finally:
        await plain.stop()


async def test_loopback_is_refused_unless_allowlisted(distributor):
    sub = distributor.subscribe("/up/lo")
    strict = make_transport(distributor, allow=())
    out = await strict.send(wake(sub.endpoint))
    assert out.kind == INVALID_ENDPOINT and out.reason == "ForbiddenAddress" and "loopback" in out.detail
    literal = make_transport(distributor, allow=("localhost",))  # another name for it is no pass
    out = await literal.send(wake(sub.endpoint.replace(HOST, "127.0.0.1")))
    assert out.kind == INVALID_ENDPOINT and "loopback" in out.detail
    assert distributor.requests() == []
    allowed = make_transport(distributor, allow=(HOST,))
    assert (await allowed.send(wake(sub.endpoint))).kind == ACCEPTED
    for t in (strict, literal, allowed):
        await t.close()


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "224.0.0.1", "0.0.0.0",
    "240.0.0.1", "255.255.255.255", "100.64.0.1", "::1", "::", "fe80::1", "fc00::1", "ff02::1",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::1", "2002:a00:1::1", "64:ff9b:1::a00:1",
    "::ffff:8.8.8.8",  # an IPv4-mapped answer from DNS is not a public IPv6 address either (fail-closed)
    "fec0::1", "feff:ffff::1",  # site-local (fec0::/10, deprecated but still routed in places)
    "64:ff9b::808:808", "64:ff9b::7f00:1",  # NAT64 (64:ff9b::/96), even of a public IPv4 address
])
def test_non_public_addresses_are_forbidden(address):
    assert forbidden_address(address) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_not(address):
    assert forbidden_address(address) is None


async def test_one_forbidden_address_among_public_ones_refuses_the_host(distributor):
    sub = distributor.subscribe("/up/mixed")
    resolver = Resolver(["93.184.216.34", "2606:4700:4700::1111", "10.0.0.7"])
    t = make_transport(distributor, allow=(), resolver=resolver)
    out = await t.send(wake(sub.endpoint))
    assert out.kind == INVALID_ENDPOINT and "private" in out.detail and resolver.calls == [HOST]
    await t.close()


async def test_the_host_is_resolved_once_per_attempt_and_that_address_is_used(distributor):
    # The system resolver has never heard of HOST: a request that resolved the name again (or let
    # the HTTP client do it) could not arrive. A second answer would point elsewhere.
    sub = distributor.subscribe("/up/once")
    resolver = Resolver(["127.0.0.1"], ["10.9.9.9"], ["127.0.0.1"], ["10.9.9.9"])
    t = make_transport(distributor, allow=(HOST,), resolver=resolver)
    assert (await t.send(wake(sub.endpoint))).kind == ACCEPTED
    assert resolver.calls == [HOST]
    [r] = distributor.requests()
    assert r.sni == HOST and r.header("host") == f"{HOST}:{distributor.port}"  # the name, on the address
    # The next attempt resolves again (10.9.9.9: nothing there) and goes there, not to the old connection.
    t.timeout = 1.0
    out = await t.send(wake(sub.endpoint))
    assert out.kind == TRANSIENT and resolver.calls == [HOST, HOST] and len(distributor.requests()) == 1
    await t.close()


async def test_redirects_are_not_followed(distributor, transport):
    sub = distributor.subscribe("/up/moved")
    for status in (301, 302, 307, 308):
        distributor.behave("/up/moved", status, location=f"{distributor.url}/up/elsewhere")
        out = await transport.send(wake(sub.endpoint))
        assert (out.kind, out.status) == (INVALID_ENDPOINT, status) and "not followed" in out.detail
    assert [r.target for r in distributor.requests()] == ["/up/moved"] * 4


async def test_a_slow_push_service_gets_the_timeout(distributor):
    assert DEFAULT_TIMEOUT == 5.0 and make_transport(distributor).timeout == DEFAULT_TIMEOUT
    sub = distributor.subscribe("/up/slow")
    t = make_transport(distributor, timeout=0.5)
    distributor.behave("/up/slow", 201, delay=5)
    started = time.monotonic()
    out = await t.send(wake(sub.endpoint))
    assert out.kind == TRANSIENT and out.reason == "Timeout" and time.monotonic() - started < 2
    # The timeout bounds the whole attempt: an answer dripping a byte at a time runs out of it too.
    distributor.behave("/up/slow", 201, drip=0.05, body_size=1000)
    started = time.monotonic()
    out = await t.send(wake(sub.endpoint))
    assert out.kind == TRANSIENT and time.monotonic() - started < 2
    await t.close()


async def test_at_most_4_kib_of_an_answer_is_read(distributor):
    assert MAX_RESPONSE_BYTES == 4096
    sub = distributor.subscribe("/up/big")
    distributor.behave("/up/big", 201, endless=True)  # a body that never ends
    t = make_transport(distributor, timeout=2.0)
    out = await t.send(wake(sub.endpoint))
    assert out.kind == ACCEPTED and out.status == 201
    await asyncio.sleep(0.3)  # the server notices the closed connection
    # Read to the end (or the timeout), this would be megabytes; what remains is one read of the
    # HTTP client (64 KiB), TLS records and the client's socket buffer before the connection drops.
    assert 0 < distributor.body_bytes_sent <= 256 * 1024, distributor.body_bytes_sent
    await t.close()


async def test_a_host_has_a_rate_cap(distributor):
    t = make_transport(distributor, host_rate=1.0, host_burst=2)
    sub = distributor.subscribe("/up/rate")
    outs = [await t.send(wake(sub.endpoint)) for _ in range(3)]
    assert [o.kind for o in outs] == [ACCEPTED, ACCEPTED, TRANSIENT]
    assert outs[2].reason == "HostRateCap" and 0 < outs[2].retry_after <= 1.0
    assert len(distributor.requests()) == 2
    await t.close()


def test_the_token_bucket():
    now = [100.0]
    rates = HostRates(2.0, 3, clock=lambda: now[0])
    assert [rates.take("a") for _ in range(3)] == [0, 0, 0]
    assert rates.take("a") == pytest.approx(0.5)
    assert rates.take("b") == 0  # per host
    now[0] += 0.5
    assert rates.take("a") == 0 and rates.take("a") > 0
    now[0] += 100
    assert [rates.take("a") for _ in range(4)][:3] == [0, 0, 0]


async def test_an_untrusted_certificate_is_a_failed_attempt(distributor):
    sub = distributor.subscribe("/up/tls")
    t = make_transport(None, allow=(HOST,))  # the distributor's test CA is not trusted
    out = await t.send(wake(sub.endpoint))
    assert out.kind == PERMANENT and out.reason == "TlsUntrusted" and distributor.requests() == []
    await t.close()


async def test_no_endpoint_material_in_outcomes_or_logs(distributor, transport, caplog):
    from appliance.cli import QUIET_LOGGERS

    caplog.set_level(logging.DEBUG)
    for name in QUIET_LOGGERS:  # as `serve` sets them: httpx's own lines name every request's URL
        caplog.set_level(logging.WARNING, logger=name)
    sub = distributor.subscribe("/up/SeCrEtPaTh")
    outs = [await transport.send(wake(sub.endpoint))]
    for status in (410, 429, 307, 500):
        distributor.behave("/up/SeCrEtPaTh", status)
        outs.append(await transport.send(wake(sub.endpoint)))
    outs.append(await transport.send(wake(sub.endpoint.replace("#p256dh", "#x"))))
    outs.append(await make_transport(distributor, allow=()).send(wake(sub.endpoint)))
    said = " ".join(f"{o.reason} {o.detail}" for o in outs) + " ".join(r.getMessage() for r in caplog.records)
    assert "SeCrEtPaTh" not in said and b64url(sub.p256dh) not in said and b64url(sub.auth) not in said
    assert HOST in said


async def test_connections_are_kept_per_host_and_address_and_bounded(distributor, monkeypatch):
    import appliance.transports.unifiedpush as up

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    monkeypatch.setattr(up, "MAX_CLIENTS", 2)
    t = make_transport(distributor, allow=(HOST, "127.0.0.1", "localhost"), resolver=resolve)
    sub = distributor.subscribe("/up/pool")
    assert (await t.send(wake(sub.endpoint))).kind == ACCEPTED
    assert (await t.send(wake(sub.endpoint))).kind == ACCEPTED
    assert len(t._clients) == 1  # the same host and address: one pool, its connection reused
    assert len({r.connection for r in distributor.requests()}) == 1
    for name in ("127.0.0.1", "localhost"):  # other names of that address: pools of their own
        out = await t.send(wake(sub.endpoint.replace(HOST, name)))
        assert out.status == 401  # answered (the distributor wants its own name as the VAPID aud)
    assert len(t._clients) == 2 and (HOST not in {slot[1] for slot in t._clients})  # the oldest closed
    assert {r.sni for r in distributor.requests()} == {HOST, "localhost", None}  # an IP literal sends no SNI
    await t.close()


async def test_send_never_raises_whatever_the_push_host_trips(distributor):
    # Anything unforeseen on the way to a lease-chosen host is that endpoint's transient fault,
    # never an exception (which the executor would count against the profile and alert on).
    async def broken(host, port):
        raise LookupError("something no one planned for")
    t = make_transport(distributor, resolver=broken)
    out = await t.send(wake(distributor.subscribe("/up/odd").endpoint))
    assert (out.kind, out.reason, out.endpoint_fault) == (TRANSIENT, "PushHostError", True)
    assert "LookupError" in out.detail
    await t.close()
    distributor.behave("/up/odd", 503, retry_after="\xb2")
    t = make_transport(distributor)
    out = await t.send(wake(distributor.subscribe("/up/odd").endpoint))
    assert (out.kind, out.status, out.retry_after, out.endpoint_fault) == (TRANSIENT, 503, None, True)
    await t.close()


async def test_names_that_never_resolve_hold_neither_the_default_pool_nor_the_attempts(distributor, monkeypatch):
    # getaddrinfo cannot be interrupted: a lease naming a host whose DNS never answers blocks a
    # thread until the resolver gives up. Those threads are the transport's own, few, and an
    # attempt that finds them all busy fails at once instead of queueing.
    import socket
    import threading

    from appliance.transports.unifiedpush import RESOLVER_THREADS, system_resolve

    release = threading.Event()
    real = socket.getaddrinfo

    def stuck(host, *args, **kw):
        if isinstance(host, str) and host.endswith(".stuck.test"):
            release.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    keys = distributor.subscribe("/x").endpoint.split("#", 1)[1]
    t = make_transport(None, allow=(), resolver=system_resolve, timeout=30.0)
    try:
        sends = [asyncio.ensure_future(t.send(wake(f"https://h{i}.stuck.test/up#{keys}")))
                 for i in range(RESOLVER_THREADS + 4)]
        done, pending = await asyncio.wait(sends, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        while len(done) < 4:
            more, pending = await asyncio.wait(pending, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert more, "an attempt waited for a resolver thread instead of failing at once"
            done |= more
        assert len(pending) == RESOLVER_THREADS  # the resolutions under way, still blocked
        for out in (task.result() for task in done):
            assert (out.kind, out.reason, out.endpoint_fault) == (TRANSIENT, "ResolverBusy", True)
            assert 0 < out.retry_after <= 5
        # The default thread pool (password hashing, file work, other transports' lookups) is free.
        await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(lambda: None) for _ in range(16))), 10)
        assert not release.is_set() and all(not task.done() for task in pending)
        release.set()
        for out in await asyncio.gather(*pending):
            assert (out.kind, out.reason) == (TRANSIENT, "ResolveFailed")
    finally:
        release.set()
        await t.close()


def test_the_in_flight_limits():
    from appliance.transports.unifiedpush import InFlight

    slots = InFlight(3, 2)
    assert [slots.enter("a"), slots.enter("a"), slots.enter("a")] == [True, True, False]  # per host
    assert slots.enter("b") and not slots.enter("c")  # in all
    slots.leave("a")
    assert slots.enter("c") and not slots.enter("a")
    for host in ("a", "b", "c"):
        slots.leave(host)
    assert slots.total == 0 and slots.hosts == {}


async def test_an_attempt_waits_a_moment_for_a_slot_then_is_sent(distributor):
    from appliance.transports.unifiedpush import InFlight

    sub = distributor.subscribe("/up/brief")
    distributor.behave("/up/brief", 201, delay=0.05)
    t = make_transport(distributor, inflight=InFlight(1, 1))
    outs = await asyncio.gather(*(t.send(wake(sub.endpoint)) for _ in range(2)))
    # The second waited for the first's slot instead of being turned back.
    assert [o.kind for o in outs] == [ACCEPTED, ACCEPTED] and t.inflight.total == 0
    await t.close()


async def test_an_attempt_over_the_in_flight_limit_is_turned_back_at_once(distributor):
    from appliance.transports.unifiedpush import InFlight

    sub = distributor.subscribe("/up/stalled")
    distributor.behave("/up/stalled", 201, delay=3)
    t = make_transport(distributor, inflight=InFlight(4, 1))
    first = asyncio.ensure_future(t.send(wake(sub.endpoint)))
    await asyncio.sleep(0.2)
    out = await t.send(wake(sub.endpoint))  # not queued behind the first: answered while it waits
    assert not first.done()
    assert (out.kind, out.reason, out.endpoint_fault) == (TRANSIENT, "TooManyInFlight", True)
    assert 0 < out.retry_after <= 2
    assert (await first).kind == ACCEPTED and t.inflight.total == 0
    await t.close()
