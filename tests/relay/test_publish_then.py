"""Relay.publish_then (the EVENT path with no task): a hook that fails with an unexpected error
gives the event an error answer, as the awaited path does, and the relay goes on."""

from __future__ import annotations

import asyncio

import pytest

from appliance.app import build
from appliance.nostr.keys import generate_secret
from appliance.nostr.event import sign_event
from appliance.settings import load
from tests.pg import storage_env

SECRET = generate_secret()


async def close_bus(app) -> None:
    """What the app's shutdown does for the node bus: on PostgreSQL a publish opened its NOTIFY
    connection on this test's loop, which must be closed before the loop ends."""
    if app.fanout is not None:
        await app.fanout.aclose()


async def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_failing_hooks_answer_with_an_error_and_the_relay_goes_on(tmp_path):
    data_dir = tmp_path / "data"
    settings = load(flags={"data_dir": str(data_dir)}, environ=storage_env(data_dir), config_path=None)
    app = build(settings)
    relay = app.relay
    origin = relay.origins.origins[0]

    def failing_ephemeral(_origin, ev):
        if ev.content == "boom":
            raise RuntimeError("an ephemeral check failed")

    def failing_stored(_conn, _origin, ev, _ctx):
        if ev.content == "boom":
            raise RuntimeError("a stored hook failed")

    relay.ephemeral_checks.append(failing_ephemeral)
    relay.store_hooks.add_stored(failing_stored)

    async def publish(ev):
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        assert relay.publish_then(origin, None, ev, lambda message, exc: answer.set_result((message, exc)))
        return await asyncio.wait_for(answer, 30)

    async def run():
        out = {}
        for name, kind, content in (("ephemeral boom", 20001, "boom"), ("stored boom", 1, "boom"),
                                    ("ephemeral ok", 20001, "fine"), ("stored ok", 1, "fine")):
            out[name] = await publish(sign_event(SECRET, kind, [], content))
        await close_bus(app)
        return out

    try:
        out = asyncio.run(run())
    finally:
        relay.close()
        app.store.close()
    message, exc = out["ephemeral boom"]
    assert message is None and isinstance(exc, RuntimeError)
    message, exc = out["stored boom"]
    assert message is None and isinstance(exc, RuntimeError)
    assert out["ephemeral ok"] == ("", None)
    assert out["stored ok"] == ("", None)
    assert relay.unbroadcast == {}


def test_a_failing_refusal_listener_still_answers_every_event_once(tmp_path):
    """A refusal listener that raises, for a refusal before the write (a bad signature) and for one
    the write finds (a duplicate): each event gets exactly one answer, an error, as the awaited
    path gives (its exception), and an accepted event after them is answered as usual."""
    data_dir = tmp_path / "data"
    settings = load(flags={"data_dir": str(data_dir)}, environ=storage_env(data_dir), config_path=None)
    app = build(settings)
    relay = app.relay
    origin = relay.origins.origins[0]
    answers: dict[str, list] = {}

    def failing_listener(_origin, _ev, _exc):
        raise RuntimeError("a refusal listener failed")

    async def publish(name, ev):
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        got = answers.setdefault(name, [])

        def done(message, exc):
            got.append((message, exc))
            if not answer.done():
                answer.set_result((message, exc))

        assert relay.publish_then(origin, None, ev, done)
        return await asyncio.wait_for(answer, 30)

    async def run():
        stored = sign_event(SECRET, 1, [], "stored once")
        assert await publish("first", stored) == ("", None)
        relay.on_rejected.append(failing_listener)
        forged = sign_event(SECRET, 1, [], "forged")
        forged.sig = "00" * 64
        await publish("bad signature", forged)
        await publish("duplicate", stored)
        await publish("after", sign_event(SECRET, 1, [], "after"))
        await asyncio.sleep(0.05)  # a second answer would be on the loop by now
        await close_bus(app)

    try:
        asyncio.run(run())
    finally:
        relay.close()
        app.store.close()
    for name in ("bad signature", "duplicate"):
        assert len(answers[name]) == 1, answers
        message, exc = answers[name][0]
        assert message is None and isinstance(exc, RuntimeError), answers[name]
    assert answers["after"] == [("", None)]
    assert relay.unbroadcast == {}


@pytest.mark.parametrize("worker", [False, True], ids=["on the loop", "in the worker"])
def test_both_paths_check_in_one_order(tmp_path, worker):
    """`publish` (awaited) and `publish_then` (no task) are one pipeline: an event breaking several
    rules gets the same first refusal on both (limits, then policy, then signature, then
    expiration), and the same refusals are counted."""
    data_dir = tmp_path / "data"
    settings = load(flags={"data_dir": str(data_dir), "max_event_tags": "3"}, environ=storage_env(data_dir),
                    config_path=None)
    app = build(settings)
    relay = app.relay
    origin = relay.origins.origins[0]
    from dataclasses import replace

    from appliance.nostr.keys import public_key

    blocked_origin = replace(origin, block=frozenset({public_key(SECRET)}))

    def forged(ev):
        ev.sig = "00" * 64
        return ev

    def wrong_id(ev):
        ev.content += "!"  # (the id no longer matches; the signature is the id's)
        return ev

    cases = [
        ("too many tags, bad signature", origin, forged(sign_event(SECRET, 1, [["t", "x"]] * 4, "a")),
         "invalid: too many tags (max 3)"),
        ("blocked, bad signature", blocked_origin, forged(sign_event(SECRET, 1, [], "b")),
         "blocked: this pubkey is blocked here"),
        ("expired, bad signature", origin, forged(sign_event(SECRET, 1, [["expiration", "1"]], "c")),
         "invalid: bad signature"),
        ("expired", origin, sign_event(SECRET, 1, [["expiration", "1"]], "d"), "invalid: event has expired"),
        ("malformed expiration, bad signature", origin,
         forged(sign_event(SECRET, 1, [["expiration", "soon"]], "e")), "invalid: bad signature"),
        ("malformed expiration, wrong id", origin,
         wrong_id(sign_event(SECRET, 1, [["expiration", "soon"]], "f")), "invalid: bad signature"),
        ("malformed expiration", origin, sign_event(SECRET, 1, [["expiration", "soon"]], "g"),
         "invalid: malformed expiration tag"),
    ]

    async def both(where, ev):
        try:
            await relay.publish(where, None, ev)
        except Exception as exc:
            awaited = exc.wire
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        assert relay.publish_then(where, None, ev, lambda message, exc: answer.set_result(exc))
        return awaited, (await answer).wire

    async def run():
        if worker:  # signatures checked in the worker process: the same first refusals
            relay.verifier.start()
            relay.verifier.worker._wanted = True  # (whatever this machine's CPU count)
            relay.verifier.worker._maybe_start()  # (else the first check starts it)
            await wait_until(lambda: relay.verifier.worker.ready)
        out = {name: await both(where, ev) for name, where, ev, _want in cases}
        await close_bus(app)
        relay.close()  # (the worker's socket is closed on the loop, as the server does)
        return out

    try:
        out = asyncio.run(run())
    finally:
        relay.close()
        app.store.close()
    for name, _where, _ev, want in cases:
        assert out[name] == (want, want), name
    assert relay.stats["rejected"] == 2 * len(cases)
