"""JSON lines between strfry and the appliance, byte for byte: `strfry export | appliance import`
then `appliance export` gives strfry's bytes back, and `appliance export | strfry import` then
`strfry export` gives the appliance's. Needs a strfry binary (STRFRY_BIN); skipped without one."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from appliance.nostr.event import sign_event
from tests.conftest import Identity

from .test_transfer import exported, lines, run

STRFRY_BIN = os.environ.get("STRFRY_BIN")
pytestmark = pytest.mark.skipif(not STRFRY_BIN, reason="STRFRY_BIN is not set: no strfry binary to round-trip with "
                                "(build one with ../shared/tools/strfry-build.sh)")

# Contents whose JSON takes every escape of the serialization: quotes, backslashes, the short
# control escapes, other C0 controls (\u00XX), a slash (never escaped), non-ASCII (raw UTF-8),
# U+2028 (raw). DEL (U+007F) is left out: strfry escapes it when it computes an id, so it refuses
# any event holding one as having a wrong id (docs/spec-notes.md, JSON lines).
CONTENTS = ['plain', 'quote " backslash \\ slash /', "tab\tnewline\nreturn\rbackspace\bformfeed\f",
            "controls \x00\x01\x1b\x1f", "ünïcödé — 日本語 🎉 \u2028\u2029", "</script><b>&amp;</b>", "",
            '{"json": ["inside", 1]}', "x" * 3000]


class Strfry:
    """strfry's command line over a database directory of its own."""

    def __init__(self, work: Path):
        self.db = work / "strfry-db"
        self.db.mkdir(parents=True)
        self.conf = work / "strfry.conf"
        self.conf.write_text(f'db = "{self.db}/"\nrelay {{\n  nofiles = 0\n}}\n')

    def __call__(self, *args: str, stdin: bytes = b"") -> bytes:
        out = subprocess.run([STRFRY_BIN, f"--config={self.conf}", *args], input=stdin, capture_output=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
        return out.stdout


def varied_events(count: int, seed: int) -> list:
    rng = random.Random(seed)
    people = [Identity() for _ in range(3)]
    base = int(time.time()) - 86400
    out = []
    for i in range(count):
        who = people[i % 3]
        kind = rng.choice([1, 1, 1, 7, 30023, 10002])
        tags = [["t", rng.choice(CONTENTS)[:40]], ["p", people[(i + 1) % 3].pubkey, "wss://r.example", "mention"]]
        if kind == 30023:
            tags.append(["d", f"article-{i % 4}"])
        out.append(sign_event(who.secret, kind, tags, rng.choice(CONTENTS) + f" #{i}", base + rng.randrange(3600)))
    return out


def test_strfry_export_into_the_appliance_and_back_keeps_every_byte(make_server, tmp_path):
    strfry = Strfry(tmp_path)
    events = varied_events(300, seed=1)
    # strfry takes any key order and escaping (it stores its own serialization): give it another.
    shuffled = []
    for ev in events:
        d = ev.to_dict()
        keys = list(d)
        random.Random(ev.id).shuffle(keys)
        shuffled.append(orjson.dumps({k: d[k] for k in keys}))
    strfry("import", stdin=b"\n".join(shuffled) + b"\n")
    theirs = strfry("export")
    assert theirs.count(b"\n") >= 150  # replaceable and addressable events replaced older ones

    server = make_server()
    out = run("import", "--data-dir", server.data_dir, stdin=theirs)
    assert out.returncode == 0, out.stderr
    n = theirs.count(b"\n")
    assert out.stdout.decode().splitlines()[-1] == f"import: read {n}, stored {n}, duplicate 0, rejected 0"
    ours = b"".join(line + b"\n" for line in exported(server.data_dir))
    assert ours == theirs


async def test_appliance_export_into_strfry_and_back_keeps_every_byte(make_server, connect, tmp_path):
    server = make_server()
    client = await connect(server.url)
    for ev in varied_events(300, seed=2):
        ok, message = await client.publish(ev)
        assert ok or message.startswith("duplicate: a newer version"), message
    ours = b"".join(line + b"\n" for line in exported(server.data_dir))
    assert ours.count(b"\n") >= 150
    strfry = Strfry(tmp_path)
    strfry("import", stdin=ours)
    theirs = strfry("export")
    assert theirs == ours


def test_strfry_refuses_what_the_appliance_refuses_and_counts_the_rest(tmp_path):
    """An import of strfry's export into a data directory that has some of it already."""
    strfry = Strfry(tmp_path)
    events = varied_events(60, seed=3)
    strfry("import", stdin=lines(*events))
    theirs = strfry("export")
    data = tmp_path / "data"
    half = b"".join(theirs.splitlines(keepends=True)[::2])
    assert run("import", "--data-dir", data, stdin=half).returncode == 0
    out = run("import", "--data-dir", data, stdin=theirs)
    n, d = theirs.count(b"\n"), half.count(b"\n")
    assert out.stdout.decode().splitlines()[-1] == f"import: read {n}, stored {n - d}, duplicate {d}, rejected 0"
    assert b"".join(line + b"\n" for line in exported(data)) == theirs
