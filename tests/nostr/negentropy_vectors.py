"""Negentropy test vectors: record sets made from a seed, and what the reference implementation
said about them.

`python -m tests.nostr.negentropy_vectors HARNESS` runs each scenario between two copies of a
harness speaking the reference test suite's stdio protocol (hoytech/negentropy test/cpp/harness,
built from that project's test/cpp/Makefile) and writes negentropy_vectors.json: per scenario, the
SHA-256 of every message (hex) in order, and how many ids the client learnt it has and needs
(with the SHA-256 of each sorted list). The tests replay
the scenarios with appliance.nostr.negentropy and compare (tests/nostr/test_negentropy.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

VECTORS = Path(__file__).with_name("negentropy_vectors.json")

# name: (records, P(client only), P(server only), distinct timestamps, client frame limit, server frame limit)
SCENARIOS = {
    "small": (250, 0.1, 0.1, 250, 0, 0),
    "client-empty": (3000, 0.0, 1.0, 3000, 0, 0),
    "server-empty": (3000, 1.0, 0.0, 3000, 0, 0),
    "identical": (20000, 0.0, 0.0, 20000, 0, 0),
    "one-percent": (20000, 0.005, 0.005, 20000, 0, 0),
    "shared-seconds": (5000, 0.02, 0.02, 40, 0, 0),
    "one-second": (3000, 0.03, 0.03, 1, 0, 0),
    "frame-limits": (20000, 0.05, 0.05, 5000, 4096, 8192),
    "server-frame-limit": (20000, 0.3, 0.3, 20000, 0, 4096),
}


def records(name: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The client's and the server's (timestamp, hex id) records of a scenario."""
    n, p1, p2, spread, _l1, _l2 = SCENARIOS[name]
    rng = random.Random(f"negentropy-{name}")
    client, server = [], []
    for _ in range(n):
        item = (1677970534 + rng.randrange(spread), rng.randbytes(32).hex())
        r = rng.random()
        if r < p1:
            client.append(item)
        elif r < p1 + p2:
            server.append(item)
        else:
            client.append(item)
            server.append(item)
    return client, server


def digest(hex_msg: str) -> str:
    return hashlib.sha256(hex_msg.encode()).hexdigest()[:32]


def id_set_digest(ids) -> str:
    return hashlib.sha256(",".join(sorted(ids)).encode()).hexdigest()[:32]


def run_reference(harness: str) -> dict:
    out = {}
    for name, (_n, _p1, _p2, _s, limit1, limit2) in SCENARIOS.items():
        client_items, server_items = records(name)
        sides = []
        for items, limit in ((client_items, limit1), (server_items, limit2)):
            env = dict(os.environ, FRAMESIZELIMIT=str(limit))
            proc = subprocess.Popen([harness], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            proc.stdin.write("".join(f"item,{ts},{i}\n" for ts, i in items) + "seal\n")
            sides.append(proc)
        client, server = sides
        client.stdin.write("initiate\n")
        client.stdin.flush()
        trace, have, need = [], set(), set()
        while True:
            line = client.stdout.readline().strip()
            if line.startswith("have,"):
                have.add(line[5:])
                continue
            if line.startswith("need,"):
                need.add(line[5:])
                continue
            if line == "done":
                break
            assert line.startswith("msg,"), line
            trace.append(digest(line[4:]))
            server.stdin.write(line + "\n")
            server.stdin.flush()
            reply = server.stdout.readline().strip()
            assert reply.startswith("msg,"), reply
            trace.append(digest(reply[4:]))
            client.stdin.write(reply + "\n")
            client.stdin.flush()
        for proc in sides:
            proc.kill()
            proc.wait()
        out[name] = {"trace": trace, "have": [len(have), id_set_digest(have)], "need": [len(need), id_set_digest(need)]}
        print(f"{name}: {len(trace)} messages, have {len(have)}, need {len(need)}", file=sys.stderr)
    return out


if __name__ == "__main__":
    VECTORS.write_text(json.dumps(run_reference(sys.argv[1]), indent=1) + "\n")
