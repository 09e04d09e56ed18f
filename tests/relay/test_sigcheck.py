"""The signature worker (appliance.relay.sigcheck): answers in the order the checks were begun,
the right answer for each, and none lost or given twice when the worker dies with checks in hand
or stops answering."""

from __future__ import annotations

import asyncio
import os
import signal

from appliance.nostr.event import sign_event
from appliance.nostr.keys import generate_secret
from appliance.relay import sigcheck
from appliance.relay.sigcheck import PendingCheck, SignatureWorker

SECRET = generate_secret()


def events(n: int) -> tuple[list, list[bool]]:
    """n events, every third with a forged signature, every fifth with a wrong id; and whether
    each is valid."""
    out, valid = [], []
    for i in range(n):
        ev = sign_event(SECRET, 1, [["t", "x"]], f"note {i}")
        ok = True
        if i % 3 == 1:
            ev.sig = ev.sig[:-2] + ("00" if ev.sig[-2:] != "00" else "11")
            ok = False
        if i % 5 == 4:
            ev.content += "!"
            ok = False
        out.append(ev)
        valid.append(ok)
    return out, valid


async def ready_worker() -> SignatureWorker:
    worker = SignatureWorker()
    worker._wanted = True  # (started whatever this machine's CPU count)
    worker._maybe_start()
    deadline = asyncio.get_running_loop().time() + 30
    while not worker.ready:
        assert asyncio.get_running_loop().time() < deadline, "the worker did not start"
        await asyncio.sleep(0.01)
    return worker


def collect(worker: SignatureWorker, evs: list) -> tuple[list, list]:
    """Begin every check; (the order answers came in, each check's answers)."""
    order: list[int] = []
    answers: list[list[bool]] = [[] for _ in evs]
    for i, ev in enumerate(evs):
        result = worker.begin(ev)
        if type(result) is bool:
            order.append(i)
            answers[i].append(result)
        else:
            assert isinstance(result, PendingCheck)
            result.then(lambda valid, i=i: (order.append(i), answers[i].append(valid)))
    return order, answers


def test_answers_are_right_and_in_order():
    async def run():
        worker = await ready_worker()
        try:
            evs, valid = events(300)
            order, answers = collect(worker, evs)
            deadline = asyncio.get_running_loop().time() + 30
            while len(order) < len(evs):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            return order, answers, valid, evs
        finally:
            worker.close()

    order, answers, valid, evs = asyncio.run(run())
    assert answers == [[v] for v in valid]
    # A wrong id is refused at once; every check sent to the worker is answered in order.
    sent = [i for i in order if valid[i] or i % 5 != 4]
    assert sent == sorted(sent)


def test_checks_held_by_a_dying_worker_are_answered_here_in_order():
    async def run():
        worker = await ready_worker()
        try:
            evs, valid = events(200)
            order, answers = collect(worker, evs)
            worker._proc.kill()  # with every check in hand (or on its way)
            deadline = asyncio.get_running_loop().time() + 30
            while len(order) < len(evs):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # (a second answer would have come by now)
            after = worker.begin(evs[0])  # no worker: checked on the loop at once
            return order, answers, valid, after, worker.failures
        finally:
            worker.close()

    order, answers, valid, after, failures = asyncio.run(run())
    assert answers == [[v] for v in valid]
    sent = [i for i in order if valid[i] or i % 5 != 4]
    assert sent == sorted(sent)
    assert after is True
    assert failures == 1


def test_a_worker_that_stops_answering_is_given_up_and_its_checks_answered_here(monkeypatch):
    """A worker alive but not answering (stopped, here with SIGSTOP) holds no EVENT for good: once
    checks have waited STALL_AFTER without an answer it is killed and they are checked here, in
    order."""
    monkeypatch.setattr(sigcheck, "STALL_AFTER", 0.5, raising=False)

    async def run():
        worker = await ready_worker()
        try:
            pid = worker._proc.pid
            os.kill(pid, signal.SIGSTOP)
            evs, valid = events(60)
            order, answers = collect(worker, evs)
            started = asyncio.get_running_loop().time()
            deadline = started + 30
            while len(order) < len(evs):
                assert asyncio.get_running_loop().time() < deadline, "checks left unanswered"
                await asyncio.sleep(0.01)
            waited = asyncio.get_running_loop().time() - started
            return order, answers, valid, waited, worker.failures, pid, worker._proc
        finally:
            worker.close()

    order, answers, valid, waited, failures, pid, proc = asyncio.run(run())
    assert answers == [[v] for v in valid]
    sent = [i for i in order if valid[i] or i % 5 != 4]
    assert sent == sorted(sent)
    assert 0.5 <= waited < 10
    assert failures == 1
    assert proc is None and not os.path.exists(f"/proc/{pid}")  # killed and reaped


def test_ctrl_c_leaves_the_worker_to_the_appliance(capfd):
    """SIGINT (Ctrl+C in a terminal reaches the whole process group) neither stops the worker nor
    prints its traceback: the appliance stops it when it stops."""

    async def run():
        worker = await ready_worker()
        try:
            os.kill(worker._proc.pid, signal.SIGINT)
            await asyncio.sleep(0.5)
            evs, valid = events(30)
            order, answers = collect(worker, evs)
            deadline = asyncio.get_running_loop().time() + 30
            while len(order) < len(evs):
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            return answers, valid, worker.failures
        finally:
            worker.close()

    answers, valid, failures = asyncio.run(run())
    assert answers == [[v] for v in valid]
    assert failures == 0
    assert "Traceback" not in capfd.readouterr().err


def test_the_worker_starts_with_the_first_check(monkeypatch):
    """A relay given no EVENT spawns no process: the worker starts with the first check begun
    (checked on the loop, as every check until the worker is ready)."""
    monkeypatch.setattr(sigcheck, "_cpus", lambda: 2)

    async def run():
        worker = SignatureWorker()
        try:
            worker.start()
            await asyncio.sleep(0.3)
            before = worker._proc, worker._starting
            evs, valid = events(2)
            first = worker.begin(evs[0])
            deadline = asyncio.get_running_loop().time() + 30
            while not worker.ready:
                assert asyncio.get_running_loop().time() < deadline, "the worker did not start"
                await asyncio.sleep(0.01)
            later = worker.begin(evs[0])
            return before, first, await later
        finally:
            worker.close()

    before, first, later = asyncio.run(run())
    assert before == (None, False)
    assert first is True and later is True
