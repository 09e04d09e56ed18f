"""The appliance and strfry side by side (`appliance bench relay` with STRFRY_BIN=/path/to/strfry).

Both relays run at once on fresh databases and meet the same load from the same Python client,
phase by phase, the order of the two alternating from one phase to the next (a shared machine's
load then falls on both alike): ingest of signed events from 4 clients, REQ round trips on a
quiet relay (50 events `kinds+#p`, `authors`, limit 1), REQs right after a burst of writes, and
live fan-out of one event to 300 subscribers. Each figure comes with the relay process's CPU
time per operation (/proc schedstat: every thread, user and system).
"""

from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from appliance.bench.harness import RelayProcess, cpu_seconds, free_port, info, percentile

# The targets: (figure, how the appliance must compare with strfry).
TARGETS = {
    "REQ kinds+#p limit 50, quiet": ("p50", 1.15),
    "REQ kinds+#p limit 50, right after a burst": ("p50", 1.5),
    "REQ kinds+#p limit 1, quiet": ("p50", 1.5),
}
INGEST_TARGET = 1.3  # appliance events/s >= 1.3x strfry's
FANOUT_TARGET = 3.0  # strfry's fan-out time >= 3x the appliance's


def strfry_config(db: Path, port: int) -> str:
    """A strfry configuration like its own defaults, on `db` and 127.0.0.1:`port`, compression off
    (as the bench's clients), NIP-42 challenges on (as the appliance sends them)."""
    return f'''db = "{db}/"
dbParams {{
    maxreaders = 256
    mapsize = 10995116277760
    noReadAhead = false
}}
events {{
    maxEventSize = 65536
    rejectEventsNewerThanSeconds = 900
    rejectEventsOlderThanSeconds = 94608000
    rejectEphemeralEventsOlderThanSeconds = 60
    ephemeralEventsLifetimeSeconds = 300
    maxNumTags = 2000
    maxTagValSize = 1024
}}
relay {{
    bind = "127.0.0.1"
    port = {port}
    nofiles = 0
    realIpHeader = ""
    auth {{
        enabled = true
        serviceUrl = ""
    }}
    maxWebsocketPayloadSize = 131072
    autoPingSeconds = 55
    enableTcpKeepalive = false
    queryTimesliceBudgetMicroseconds = 10000
    maxFilterLimit = 500
    maxSubsPerConnection = 200
    compression {{
        enabled = false
        slidingWindow = false
    }}
    logging {{
        dumpInAll = false
        dumpInEvents = false
        dumpInReqs = false
        dbScanPerf = false
        invalidEvents = false
    }}
}}
'''


def strfry_commit(binary: str) -> str:
    """strfry's version string (`strfry --version` names its git commit)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


def strfry_process(binary: str, work: Path, port: int, log_path: Path) -> RelayProcess:
    db = work / "strfry-db"
    db.mkdir(parents=True, exist_ok=True)
    conf = work / "strfry.conf"
    conf.write_text(strfry_config(db, port))
    return RelayProcess("strfry", [binary, f"--config={conf}", "relay"], port, log_path, cwd=work)


@dataclass
class Side:
    """One relay's figures."""

    name: str
    ingest_rate: float = 0.0
    ingest_cpu: float = float("nan")  # CPU seconds per accepted event
    accepted: int = 0
    latency: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # CPU seconds per REQ, per measurement
    returned: dict[str, int] = field(default_factory=dict)
    fanout: list[float] = field(default_factory=list)
    fanout_cpu: float = float("nan")


def side_by_side(relays: list[RelayProcess], raws: list[bytes], burst: list[bytes], factory, *, queries: int,
                 clients: int, window: int, fanout_connections: int, seed: int) -> list[Side]:
    """Every phase on each relay, alternating which goes first."""
    from appliance.bench.relay import _event_loop_runner, after_bursts, fanout, ingest, read_latencies, req_shapes

    arun = _event_loop_runner()
    sides = {r.name: Side(r.name) for r in relays}
    rng = random.Random(seed)
    quiet_shapes = req_shapes(factory, rng, queries + 10)
    burst_shapes = req_shapes(factory, rng, queries)
    phase = 0

    def order() -> list[RelayProcess]:
        nonlocal phase
        phase += 1
        return relays if phase % 2 else relays[::-1]

    for relay in order():
        side, pid = sides[relay.name], relay.proc.pid
        info(f"{relay.name}: ingest of {len(raws):,} events from {clients} clients")
        c0 = cpu_seconds(pid)
        r = arun(ingest(relay.url, raws, clients, window, False))
        side.accepted = r.accepted
        side.ingest_rate = r.accepted / r.seconds if r.seconds else 0.0
        side.ingest_cpu = (cpu_seconds(pid) - c0) / max(1, r.accepted)
    for relay in order():
        side, pid = sides[relay.name], relay.proc.pid
        info(f"{relay.name}: REQ round trips, quiet")
        out: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        arun(read_latencies(relay.url, quiet_shapes, out, side.returned, warm=10, pid=pid, cpu=cpu))
        for name, lat in out.items():
            side.latency[f"{name}, quiet"] = lat
            side.cpu[f"{name}, quiet"] = cpu.get(name, [])
    if burst:
        for relay in order():
            side, pid = sides[relay.name], relay.proc.pid
            info(f"{relay.name}: REQ round trips right after a burst of {len(burst):,} events")
            cpu = {}
            out, _rate = arun(after_bursts(relay.url, [burst], clients, window, [burst_shapes], pid=pid, cpu=cpu))
            for name, lat in out.items():
                side.latency[f"{name}, right after a burst"] = lat
                side.cpu[f"{name}, right after a burst"] = cpu.get(name, [])
    if fanout_connections:
        for relay in order():
            side, pid = sides[relay.name], relay.proc.pid
            info(f"{relay.name}: live fan-out to {fanout_connections} subscribers")
            side.fanout, side.fanout_cpu = arun(fanout(relay.url, fanout_connections, 30, factory, pid))
    return [sides[r.name] for r in relays]


def _ms(values: list[float], q: float) -> str:
    v = percentile(values, q)
    return "-" if v != v else f"{v * 1000:.2f}"


def _cpu(values) -> str:
    values = [v for v in (values if isinstance(values, list) else [values]) if v == v]
    return f"{sum(values) / len(values) * 1000:.3f}" if values else "-"


def table(sides: list[Side], strfry_version: str) -> str:
    """appliance | strfry | ratio | target, for each figure."""
    a, s = sides
    rows = [["figure", "appliance", "strfry", "ratio", "target", "met"]]

    def ratio(x: float, y: float) -> float:
        return x / y if y and y == y and x == x else float("nan")

    for name in a.latency:
        for q in (50, 99):
            pa, ps = percentile(a.latency[name], q), percentile(s.latency.get(name, []), q)
            r = ratio(pa, ps)
            target = TARGETS.get(name)
            want = f"<= {target[1]}x" if target and target[0] == f"p{q}" else ""
            met = ("yes" if r <= target[1] else "NO") if want and r == r else ""
            rows.append([f"{name} p{q} (ms)", _ms(a.latency[name], q), _ms(s.latency.get(name, []), q),
                         f"{r:.2f}x" if r == r else "-", want, met])
        rows.append([f"{name}: relay CPU per REQ (ms)", _cpu(a.cpu.get(name, [])), _cpu(s.cpu.get(name, [])),
                     "", "", ""])
    r = ratio(a.ingest_rate, s.ingest_rate)
    rows.append(["ingest (events/s)", f"{a.ingest_rate:,.0f}", f"{s.ingest_rate:,.0f}", f"{r:.2f}x" if r == r else "-",
                 f">= {INGEST_TARGET}x", ("yes" if r >= INGEST_TARGET else "NO") if r == r else ""])
    rows.append(["ingest: relay CPU per event (ms)", _cpu(a.ingest_cpu), _cpu(s.ingest_cpu), "", "", ""])
    if a.fanout:
        fa, fs = percentile(a.fanout, 50), percentile(s.fanout, 50)
        r = ratio(fs, fa)
        rows.append(["live fan-out, 300 subscribers p50 (ms)", _ms(a.fanout, 50), _ms(s.fanout, 50),
                     f"strfry {r:.1f}x slower" if r == r else "-", f">= {FANOUT_TARGET}x faster",
                     ("yes" if r >= FANOUT_TARGET else "NO") if r == r else ""])
        rows.append(["live fan-out: relay CPU per event (ms)", _cpu(a.fanout_cpu), _cpu(s.fanout_cpu), "", "", ""])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
           for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append("")
    out.append(f"strfry: {strfry_version}; events accepted: appliance {a.accepted:,}, strfry {s.accepted:,}")
    return "\n".join(out)


def strfry_binary() -> str | None:
    """The strfry to compare with: $STRFRY_BIN, if it names an executable."""
    path = os.environ.get("STRFRY_BIN")
    return path if path and os.access(path, os.X_OK) else None


def run_side_by_side(work: Path, binary: str, appliance: RelayProcess, raws: list[bytes], burst: list[bytes],
                     factory, args) -> str:
    """Start strfry beside the (running) appliance, measure both, stop strfry; the table."""
    strfry = strfry_process(binary, work / "strfry", free_port(), work / "strfry.log")
    strfry.start()
    try:
        sides = side_by_side([appliance, strfry], raws, burst, factory, queries=args.compare_queries,
                             clients=4, window=args.window, fanout_connections=args.fanout, seed=args.seed + 11)
    finally:
        strfry.stop()
    return table(sides, strfry_commit(binary))
