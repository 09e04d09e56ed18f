"""Per-address budgets, refusal pacing and the flood backoff, over real websockets (issue #14: one
flooding client cannot starve others, and an ordinary heavy client is never refused).

Clients connect over loopback naming their address in X-Forwarded-For, as behind a TLS proxy on
the same box (loopback is a trusted proxy): the relay tells them apart by that address. How fast a
bystander is served under a flood is measured by `appliance bench flood`, not here."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
import websockets

from tests.conftest import Client

pytestmark = pytest.mark.anyio

RATE_LIMITED_REQ = "rate-limited: too many requests, slow down"
# The server's info line when it closes a flooding connection and bars its address (appliance.relay.governor).
FLOOD_CLOSED = re.compile(r"closed a flooding connection origin=\S+ barred_seconds=(\S+)")


async def client_from(url: str, address: str | None) -> Client:
    headers = {"X-Forwarded-For": address} if address else {}
    client = Client(await websockets.connect(url, max_size=None, additional_headers=headers))
    first = await client.recv()
    assert first[0] == "AUTH"
    client.challenge = first[1]
    return client


async def pipeline_counts(client: Client, n: int, prefix: str = "c") -> dict[str, list]:
    """Send n COUNTs without waiting, then collect one answer for each."""
    for i in range(n):
        await client.send(["COUNT", f"{prefix}{i}", {"kinds": [1]}])
    answers: dict[str, list] = {}
    while len(answers) < n:
        msg = await client.recv(30)
        if msg[0] in ("COUNT", "CLOSED"):
            answers[msg[1]] = msg
    return answers


async def test_a_client_paging_through_history_is_never_refused(make_server, alice, connect):
    """Sequential pages (each REQ sent once the previous EOSE is in), well past the REQ burst of a
    connection and of its address, with the default limits: slowed to the sustained rate at most,
    never refused; every event arrives once."""
    server = make_server()
    publisher = await connect(server.url)
    ids = []
    now = int(time.time())
    for i in range(160):
        ev = alice.sign(1, [["t", "history"]], f"n{i}", created_at=now - 1000 + i)
        assert (await publisher.publish(ev))[0]
        ids.append(ev.id)
    pager = await client_from(server.url, "198.51.100.20")
    seen: list[str] = []
    until = None
    pages = 0
    started = time.monotonic()
    while True:
        f = {"kinds": [1], "#t": ["history"], "limit": 1}
        if until is not None:
            f["until"] = until
        events, closed = await pager.req(f"page{pages}", f)
        assert closed is None, closed
        await pager.send(["CLOSE", f"page{pages}"])
        pages += 1
        if not events:
            break
        seen += [e["id"] for e in events]
        until = events[-1]["created_at"] - 1
    assert seen == ids[::-1]
    assert pages == 161  # past the connection's REQ burst (100): the rest were held, not refused
    # ... and held to about the sustained rate (20/s per connection): 61 past the burst.
    assert time.monotonic() - started > 2.0
    await pager.close()


async def test_a_pipelining_flood_is_refused_and_a_bystander_from_another_address_is_untouched(make_server):
    server = make_server("--req-rate", "10", "--req-burst", "20", "--ip-req-rate", "10", "--ip-req-burst", "20")
    attacker = await client_from(server.url, "203.0.113.5")
    bystander = await client_from(server.url, "198.51.100.5")
    started = time.monotonic()
    flood = asyncio.create_task(pipeline_counts(attacker, 60))
    for i in range(20):  # a bystander's sequential reads meanwhile: all answered, none refused
        answer = await bystander.count(f"b{i}", {"kinds": [1]})
        assert answer == ["COUNT", f"b{i}", {"count": 0}], answer
    answers = await asyncio.wait_for(flood, 60)
    elapsed = time.monotonic() - started
    refused = [m for m in answers.values() if m[0] == "CLOSED"]
    assert refused and all(m[2] == RATE_LIMITED_REQ for m in refused)  # exact NIP-01 prefix
    served = len(answers) - len(refused)
    # The burst, then one per token (10/s): each refusal holds the connection's reading until the
    # next token, so the flood is answered at the budget's pace, not at the attacker's.
    assert 20 <= served <= 20 + 10 * elapsed + 2, (served, elapsed)
    await attacker.close()
    await bystander.close()


@pytest.mark.slow
async def test_the_address_budget_is_shared_by_its_connections_and_survives_a_reconnect(make_server):
    server = make_server("--ip-req-rate", "1", "--ip-req-burst", "30")
    first = await client_from(server.url, "203.0.113.6")
    answers = await pipeline_counts(first, 34)  # within the connection's burst (100), past the address's
    assert 30 <= sum(m[0] == "COUNT" for m in answers.values()) <= 33
    await first.close()
    # A new connection from the same address finds the budget as the last one left it (spent,
    # refilling at 1/s): of six pipelined COUNTs, which a fresh budget would all serve, most are
    # refused ...
    again = await client_from(server.url, "203.0.113.6")
    answers = await pipeline_counts(again, 6, "d")
    refused = [m for m in answers.values() if m[0] == "CLOSED"]
    assert len(refused) >= 2 and all(m[2] == RATE_LIMITED_REQ for m in refused), answers
    # ... while another address has its own budget.
    other = await client_from(server.url, "203.0.113.7")
    answers = await pipeline_counts(other, 20, "e")
    assert all(m[0] == "COUNT" for m in answers.values()), answers
    for c in (again, other):
        await c.close()


@pytest.mark.slow
async def test_an_address_closed_for_flooding_backs_off_and_others_still_connect(make_server, connect):
    # A small message budget, so a garbage flood reaches the refusal limit (1000) quickly.
    server = make_server("--event-rate", "1000", "--req-rate", "1000", "--event-burst", "1", "--req-burst", "1",
                         "--ip-event-rate", "0", "--ip-req-rate", "0")
    flooder = await client_from(server.url, "203.0.113.8")
    for _ in range(3000):
        await flooder.send("[]")
    deadline = time.monotonic() + 30
    notices = []
    try:
        while True:
            notices.append(await flooder.recv(max(0.01, deadline - time.monotonic())))
    except websockets.exceptions.ConnectionClosed as exc:
        assert exc.rcvd is not None and exc.rcvd.code == 1008
    closed = time.monotonic()  # its address is barred from the close: 2 s the first time
    assert ["NOTICE", "rate-limited: too many refused messages; closing"] in notices
    assert ["NOTICE", "rate-limited: too many messages, slow down"] in notices

    # Its next attempts are refused before a websocket opens, saying when to come back. Both go at
    # once: each answer is held up to 1 s, so one after the other the second could come after the
    # bar on a busy machine.
    async def plain() -> httpx.Response:
        async with httpx.AsyncClient() as http:
            return await http.get(server.http + "/", headers={
                "X-Forwarded-For": "203.0.113.8", "Connection": "Upgrade", "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})

    async def websocket() -> int:
        try:
            await client_from(server.url, "203.0.113.8")
        except websockets.exceptions.InvalidStatus as exc:
            return exc.response.status_code
        raise AssertionError("a backed-off address was let in")

    r, status = await asyncio.gather(plain(), websocket())
    assert r.status_code == 429 and r.text.startswith("rate-limited:")
    assert int(r.headers["retry-after"]) == 1  # 2 s barred, the answer held 1 s (DEFAULT_BARRED_HOLD)
    assert status == 429
    # The bar is 2 s the first time, as the server says it set it. (The attempts above, sent at once,
    # show only that it had not ended yet: this pins its length from below, the step below from above.)
    deadline = time.monotonic() + 30
    while not (bars := FLOOD_CLOSED.findall(server.log_path.read_text())):
        assert time.monotonic() < deadline, "no 'closed a flooding connection' line in the server log"
        await asyncio.sleep(0.05)
    assert bars == ["2"], bars
    # Another address, and this machine itself (loopback is exempt by default), are served.
    other = await client_from(server.url, "198.51.100.8")
    assert (await other.count("x", {"kinds": [1]}))[0] == "COUNT"
    local = await connect(server.url)
    assert (await local.count("x", {"kinds": [1]}))[0] == "COUNT"
    await other.close()
    # After the backoff (2 s the first time) the address may connect again, with its budget as
    # the flood left it: spent, refilling at its rate.
    await asyncio.sleep(max(0.0, closed + 2.1 - time.monotonic()))
    back = await client_from(server.url, "203.0.113.8")
    assert (await back.count("y", {"kinds": [1]}))[0] == "COUNT"
    await back.close()


async def test_a_flood_of_large_frames_is_read_at_the_receive_rate_and_others_are_served(make_server, alice):
    server = make_server("--receive-rate", "200000", "--receive-burst", "100000")
    sender = await client_from(server.url, "203.0.113.9")
    bystander = await client_from(server.url, "198.51.100.9")
    # 8 frames of 60 KB, each an EVENT refused for its content length once read (64 KiB max).
    big = [alice.sign(1, [], f"{i}" + "x" * 66_000).to_dict() for i in range(8)]
    started = time.monotonic()
    for ev in big:
        await sender.send(["EVENT", ev])
    async def read_oks() -> list:
        return [await sender.expect(lambda m, i=ev["id"]: m[0] == "OK" and m[1] == i, timeout=30) for ev in big]

    reading = asyncio.create_task(read_oks())
    # Meanwhile the bystander is answered at once, however far behind the sender's frames are.
    for i in range(5):
        t0 = time.monotonic()
        assert (await bystander.count(f"b{i}", {"kinds": [1]}))[0] == "COUNT"
        assert time.monotonic() - t0 < 1.0
    oks = await reading
    assert all(m[2] is False and m[3].startswith("invalid:") for m in oks)
    # 530 KB past a 100 KB burst at 200 KB/s: about two seconds at least.
    assert time.monotonic() - started > 1.8
    await sender.close()
    await bystander.close()


async def test_an_event_flood_is_refused_with_ok_false_rate_limited(make_server, alice):
    server = make_server("--event-rate", "5", "--event-burst", "10", "--ip-event-rate", "5", "--ip-event-burst", "10")
    publisher = await client_from(server.url, "203.0.113.10")
    events = [alice.sign(1, [], f"e{i}").to_dict() for i in range(60)]
    for ev in events:  # pipelined
        await publisher.send(["EVENT", ev])
    oks = [await publisher.expect(lambda m, i=ev["id"]: m[0] == "OK" and m[1] == i, timeout=30) for ev in events]
    refused = [m for m in oks if not m[2]]
    assert refused and all(m[3] == "rate-limited: publishing too fast" for m in refused)
    assert 10 <= len(oks) - len(refused) < 40
    await publisher.close()


async def test_a_refused_event_flood_is_read_again_in_batches_not_a_token_at_a_time(make_server, alice):
    """Once refused, a connection is read again when its bucket holds a tenth of a second's refill
    (5 tokens at 50/s), so a pipelined flood gets several EVENTs accepted for each one refused,
    not one each (the refusals, wake-ups and commits of a flood are what cost the relay)."""
    server = make_server("--event-rate", "50", "--event-burst", "10", "--ip-event-rate", "0")
    publisher = await client_from(server.url, "203.0.113.11")
    events = [alice.sign(1, [], f"b{i}").to_dict() for i in range(150)]
    for ev in events:  # pipelined
        await publisher.send(["EVENT", ev])
    oks = [await publisher.expect(lambda m, i=ev["id"]: m[0] == "OK" and m[1] == i, timeout=60) for ev in events]
    refused = [m for m in oks if not m[2]]
    assert refused and all(m[3] == "rate-limited: publishing too fast" for m in refused)
    accepted = len(oks) - len(refused)
    # After the burst (10), at least ~5 tokens have come each time reading resumes, however slow
    # the machine (a slower one only lets more come): one token at a time would give about one
    # accepted per refused.
    assert accepted - 10 >= 3 * (len(refused) - 1), (accepted, len(refused))
    await publisher.close()


def test_a_bucket_waits_for_a_batch_of_at_most_its_burst():
    from appliance.relay.limits import TokenBucket

    bucket = TokenBucket(1000, 2)
    bucket.tokens = 0.0
    assert bucket.wait_for_batch(0.1) <= 0.002  # two tokens (its burst), not a hundred
    assert TokenBucket(0, 1).wait_for_batch(0.1) == 0.0  # unlimited


async def test_without_the_loopback_exemption_local_connections_share_one_budget(make_server):
    server = make_server("--loopback-exempt", "false", "--ip-req-rate", "1", "--ip-req-burst", "10")
    one = await client_from(server.url, None)
    two = await client_from(server.url, None)
    a = await pipeline_counts(one, 10)
    assert all(m[0] == "COUNT" for m in a.values())
    # The budget the first connection spent (refilling at 1/s): of six pipelined COUNTs, which a
    # budget of its own would all serve, most are refused.
    b = await pipeline_counts(two, 6, "d")
    refused = [m for m in b.values() if m[0] == "CLOSED"]
    assert len(refused) >= 2 and all(m[2] == RATE_LIMITED_REQ for m in refused), b
    for c in (one, two):
        await c.close()


def test_a_refused_req_costs_no_filter_parse():
    """The head of a REQ/COUNT names its verb and subscription id: a refused one is answered from
    that alone (the pattern the session uses)."""
    from appliance.relay.session import _REQ_HEAD

    head = _REQ_HEAD(json.dumps(["REQ", "sub 1", {"kinds": [1]}] + [{"authors": ["a" * 64] * 500}] * 16))
    assert head is not None and head.groups() == ("REQ", "sub 1")
    assert _REQ_HEAD('["COUNT","x"]').groups() == ("COUNT", "x")
    assert _REQ_HEAD('["REQ","a\\"b",{}]') is None  # escapes: the full parse handles it
    assert _REQ_HEAD('["REQ","",{}]') is None


@pytest.mark.slow
async def test_clients_that_wait_for_answers_are_held_not_refused_when_their_address_shares_a_token(make_server):
    """Two connections from one address (two tabs behind one NAT), each sending one COUNT and
    waiting for its answer, with one token a second for the address: both are held until a token
    is theirs. The one whose token the other took when both were due is held again, not refused."""
    server = make_server("--ip-req-rate", "1", "--ip-req-burst", "1")
    one = await client_from(server.url, "198.51.100.30")
    two = await client_from(server.url, "198.51.100.30")
    assert (await one.count("a0", {"kinds": [1]}))[0] == "COUNT"  # the address's one token
    for _round in range(2):
        answers = await asyncio.gather(one.count("a", {"kinds": [1]}), two.count("b", {"kinds": [1]}))
        assert [m[0] for m in answers] == ["COUNT", "COUNT"], answers
    for c in (one, two):
        await c.close()
