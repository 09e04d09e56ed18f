"""One connection flooding REQs and COUNTs (rate limits off, so nothing refuses them): every one
of its messages is still answered correctly, and a bystander is served correctly meanwhile. How
fast the bystander is served under the flood is measured by `appliance bench flood`, not here."""

from __future__ import annotations

import asyncio
import json

import websockets


async def test_a_pipelined_flood_is_answered_in_full_and_a_bystander_is_served(make_server, alice, connect):
    server = make_server("--req-rate", "0", "--event-rate", "0")
    c = await connect(server.url)
    for i in range(30):
        assert (await c.publish(alice.sign(1, [["t", "flood"]], f"n{i}")))[0]
    n_counts, n_reqs = 400, 200
    heavy = [{"kinds": [1], "since": k} for k in range(16)]
    async with websockets.connect(server.url, max_size=None) as attacker:
        await attacker.recv()  # AUTH
        frames = []
        for i in range(n_counts):
            frames.append(json.dumps(["COUNT", f"c{i}", *heavy]))
            if i < n_reqs:
                frames.append(json.dumps(["REQ", f"r{i}", {"kinds": [1], "limit": 5}]))
                frames.append(json.dumps(["CLOSE", f"r{i}"]))

        async def send_all():
            for f in frames:  # never waiting for an answer
                await attacker.send(f)

        answers: dict[str, list] = {}

        async def read_all():
            while len([k for k in answers if k.startswith("c")]) < n_counts:
                msg = json.loads(await asyncio.wait_for(attacker.recv(), 120))
                answers.setdefault(msg[1], []).append(msg)

        reading = asyncio.create_task(read_all())
        sending = asyncio.create_task(send_all())
        # Meanwhile, a well-behaved client's reads are answered, and right.
        for _ in range(5):
            events, closed = await c.req("by", {"kinds": [1], "#t": ["flood"], "limit": 10})
            assert closed is None and len(events) == 10
            await c.send(["CLOSE", "by"])
        await asyncio.wait_for(sending, 120)
        await asyncio.wait_for(reading, 120)
    for i in range(n_counts):
        assert answers[f"c{i}"] == [["COUNT", f"c{i}", {"count": 30}]], answers.get(f"c{i}")
