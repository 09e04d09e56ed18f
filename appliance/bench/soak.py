"""`appliance bench soak --minutes N`: a long steady mixed load, sampled for growth and errors.

Starts `appliance serve` (push enabled, one APNs app profile) on a temporary data directory and
the APNs emulator as a process of its own, then for N minutes, at steady rates:

- publishers send signed events (`--rate` per second in all): kind 1 tagged #t soak, and a share
  (`--wake-share`) of kind-9 events each mentioning one of `--wake-users` users who hold a lease,
  so each of those wakes one device at the emulator;
- live subscribers (`--subscribers` connections) hold a subscription to the kind-1 stream and
  count what arrives;
- readers send REQs (`--req-rate` per second) over stored events and time them to EOSE;
- lease churn: `--churn-users` users replace their lease with a new generation and a new
  endpoint (`--churn-rate` per second), and now and then revoke it with a tombstone.

Every `--interval` seconds (10 by default) a row goes into `soak.csv`: the appliance's resident
memory and open files (from /proc), its event-loop lag and wake queue depth (from /admin/metrics),
the database size, and in that interval the events published, OK, REQ and event-to-APNs
latencies, wakes delivered and errors. At the end `soak.svg` plots the columns over time and
the summary gives each column's first and last thirds and its trend after the warm-up (`verdict`).

Errors: an OK false, a REQ CLOSED, a dropped connection, an APNs answer other than 200, a
failed metrics scrape, a line at ERROR or worse in the appliance's log, and at the end any wake
or live event that never arrived. The exit status is 1 when there was any.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import itertools
import os
import random
import secrets
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from appliance.bench.harness import (
    NostrClient,
    appliance_process,
    dir_mb,
    executor_key,
    free_port,
    info,
    lease_event,
    open_files,
    parse_metrics,
    percentile,
    rss_mb,
)
from appliance.bench.wakes import ORIGIN, PROFILE, Emulator, config_text

METRICS_TOKEN = "soak-" + secrets.token_hex(8)
COLUMNS = ("elapsed_s", "rss_mb", "sqlite_mb", "open_files", "loop_lag_ms", "queue_depth", "db_mb", "connections",
           "published", "ok_p50_ms", "ok_p99_ms", "reqs", "req_p50_ms", "req_p99_ms", "wakes", "wake_p50_ms",
           "wake_p99_ms", "live_received", "errors")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=30.0, help="length of the run (default 30)")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between samples (default 10)")
    p.add_argument("--rate", type=float, default=20.0, help="events published per second (default 20)")
    p.add_argument("--wake-share", type=float, default=0.25,
                   help="share of the published events that wake a leased device (default 0.25)")
    p.add_argument("--wake-users", type=int, default=200, help="users holding a lease that wakes (default 200)")
    p.add_argument("--publishers", type=int, default=4, help="publishing connections (default 4)")
    p.add_argument("--subscribers", type=int, default=10, help="connections holding a live subscription")
    p.add_argument("--req-rate", type=float, default=5.0, help="REQs per second over stored events (default 5)")
    p.add_argument("--churn-users", type=int, default=10, help="users whose leases churn (default 10)")
    p.add_argument("--churn-rate", type=float, default=1.0, help="lease replacements per second (default 1)")
    p.add_argument("--event-ttl", type=int, default=300,
                   help="NIP-40 expiration of the published events, in seconds (default 300): the purge "
                        "sweeps them away, so the database reaches a steady size and growth means a leak")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"), help="SQLite durability (default full)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `appliance serve` (repeatable)")
    p.add_argument("--out", metavar="DIR", help="write soak.csv, soak.svg and the logs here (default: a new "
                   "directory under /tmp, kept)")


@dataclass
class Interval:
    """What the load saw since the last sample."""

    published: int = 0
    ok_lat: list[float] = field(default_factory=list)
    req_lat: list[float] = field(default_factory=list)
    wake_lat: list[float] = field(default_factory=list)
    live: int = 0
    errors: int = 0


class Soak:
    def __init__(self, args, work: Path):
        self.args = args
        self.work = work
        self.now = Interval()
        self.errors: dict[str, int] = {}
        self.rng = random.Random(14)
        # Device token -> when each of its mentions was sent, oldest first (the wakes still to come).
        self.wake_sent: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.wake_turn = itertools.count()  # the wake users in turn: each is mentioned as rarely as can be
        self.wakes_expected = 0
        self.wakes_delivered = 0
        self.live_expected = 0  # kind-1 events acknowledged x subscribers
        self.live_received = 0
        self.stopping = False  # the publishers, the reader and the churner stop
        self.unsubscribing = False  # then, once what they published arrived, the live subscribers
        self.users: list[tuple[str, str, str]] = []  # (secret, pubkey, token) of the wake users
        self.wake_tokens: set[str] = set()
        self.unmatched: list[tuple[float, str]] = []  # wakes received before their event's OK was read

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1
        self.now.errors += 1

    # -- the load ----------------------------------------------------------------------------------------

    async def lease_wake_users(self, url: str, exec_key: tuple[str, str]) -> None:
        from appliance.nostr.keys import generate_secret, public_key

        async def one(secret: str) -> None:
            c = await NostrClient.connect(url)
            try:
                ok, msg = await c.auth(secret, ORIGIN)
                token = secrets.token_hex(32)
                ev = lease_event(secret, origin=ORIGIN, profile=PROFILE, endpoint=token, generation=1,
                                 d=secrets.token_urlsafe(16), exec_id=exec_key[0], exec_pub=exec_key[1])
                ok2, msg2 = await c.publish(ev.to_json(), ev.id)
                if not (ok and ok2):
                    raise RuntimeError(f"leasing refused: {msg} {msg2}")
                self.users.append((secret, public_key(secret), token))
                self.wake_tokens.add(token)
            finally:
                await c.close()

        todo = [generate_secret() for _ in range(self.args.wake_users)]
        for i in range(0, len(todo), 20):
            await asyncio.gather(*(one(s) for s in todo[i:i + 20]))

    async def paced(self, rate: float, step) -> None:
        """Call `step(i)` `rate` times a second until stopped (catching up a little when late)."""
        if rate <= 0:
            return
        t0 = time.perf_counter()
        for i in itertools.count():
            if self.stopping:
                return
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -5:  # far behind (a stall): skip ahead rather than burst
                t0 = time.perf_counter() - i / rate
            await step(i)

    async def publisher(self, url: str, n: int) -> None:
        from appliance.nostr.event import sign_event
        from appliance.nostr.keys import generate_secret

        secret = generate_secret()
        c = await NostrClient.connect(url)
        rate = self.args.rate / self.args.publishers
        rng = random.Random(n)
        pending: set[asyncio.Task] = set()

        def expiry() -> list[str]:
            return ["expiration", str(int(time.time()) + self.args.event_ttl)]

        async def send(i: int) -> None:
            if rng.random() < self.args.wake_share and self.users:
                _s, pub, token = self.users[next(self.wake_turn) % len(self.users)]
                ev = sign_event(secret, 9, [["p", pub], expiry()], f"soak wake {n}.{i} {secrets.token_hex(4)}")
            else:
                token = None
                ev = sign_event(secret, 1, [["t", "soak"], expiry()], f"soak note {n}.{i} {secrets.token_hex(4)}")
            t = time.perf_counter()
            sent_at = time.time()
            try:
                ok, msg = await c.publish(ev.to_json(), ev.id)
            except (ConnectionError, TimeoutError, OSError) as exc:
                self.error(f"publish failed ({type(exc).__name__})")
                return
            self.now.published += 1
            self.now.ok_lat.append(time.perf_counter() - t)
            if not ok:
                self.error(f"OK false: {msg}")
            elif token is not None:
                self.wake_sent[token].append(sent_at)
                self.wakes_expected += 1
            else:
                self.live_expected += self.args.subscribers

        async def step(i: int) -> None:
            task = asyncio.create_task(send(i))  # OKs overlap: the rate holds while one is slow
            pending.add(task)
            task.add_done_callback(pending.discard)

        try:
            await self.paced(rate, step)
            if pending:
                await asyncio.wait(pending, timeout=30)
        finally:
            await c.close()

    async def subscriber(self, url: str, n: int) -> None:
        c = await NostrClient.connect(url)

        def on_event(_ev) -> None:
            self.live_received += 1
            self.now.live += 1

        await c.subscribe(f"live{n}", [{"kinds": [1], "#t": ["soak"], "since": int(time.time())}], on_event)
        try:
            while not self.unsubscribing:
                await asyncio.sleep(0.5)
                if c.closed:
                    self.error("live subscription dropped")
                    return
        finally:
            await c.close()

    async def reader(self, url: str) -> None:
        c = await NostrClient.connect(url)
        rng = random.Random(5)
        counter = itertools.count()

        async def step(_i: int) -> None:
            shape = rng.randrange(3)
            if shape == 0:
                f = {"kinds": [1], "#t": ["soak"], "limit": 20}
            elif shape == 1:
                f = {"kinds": [1], "since": int(time.time()) - 60, "limit": 50}
            else:
                f = {"kinds": [1, 9], "until": int(time.time()) - rng.randrange(600), "limit": 10}
            t = time.perf_counter()
            try:
                _events, closed = await c.req(f"r{next(counter)}", [f])
            except (ConnectionError, TimeoutError, OSError) as exc:
                self.error(f"REQ failed ({type(exc).__name__})")
                return
            self.now.req_lat.append(time.perf_counter() - t)
            if closed is not None:
                self.error(f"REQ CLOSED: {closed}")

        try:
            await self.paced(self.args.req_rate, step)
        finally:
            await c.close()

    async def churner(self, url: str, exec_key: tuple[str, str]) -> None:
        from appliance.nostr.keys import generate_secret

        people = []
        for _ in range(self.args.churn_users):
            secret = generate_secret()
            c = await NostrClient.connect(url)
            ok, msg = await c.auth(secret, ORIGIN)
            if not ok:
                raise RuntimeError(f"AUTH refused: {msg}")
            people.append({"secret": secret, "client": c, "d": secrets.token_urlsafe(16), "generation": 0,
                           "created": 0})
        rng = random.Random(9)

        async def step(i: int) -> None:
            who = people[i % len(people)]
            who["generation"] += 1
            who["created"] = max(int(time.time()), who["created"] + 1)  # a replacement must be newer
            revoke = rng.random() < 0.1
            ev = lease_event(who["secret"], origin=ORIGIN, profile=PROFILE, endpoint=secrets.token_hex(32),
                             generation=who["generation"], d=who["d"], exec_id=exec_key[0], exec_pub=exec_key[1],
                             active=not revoke, created_at=who["created"])
            try:
                ok, msg = await who["client"].publish(ev.to_json(), ev.id)
            except (ConnectionError, TimeoutError, OSError) as exc:
                self.error(f"lease publish failed ({type(exc).__name__})")
                return
            if not ok:
                self.error(f"lease refused: {msg}")

        try:
            await self.paced(self.args.churn_rate, step)
        finally:
            for who in people:
                await who["client"].close()

    # -- the samples -----------------------------------------------------------------------------------

    def read_wakes(self, emu: Emulator, offset: int) -> int:
        """Emulator log lines since `offset` (one per answered request): wake latencies and statuses."""
        try:
            with open(emu.log, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return offset
        end = data.rfind(b"\n") + 1
        lines, self.unmatched = self.unmatched, []
        for line in data[:end].decode().splitlines():
            at, status, _reason, _apns_id, token = line.split(" ")
            if status != "200":
                self.error(f"APNs answered {status}")
            elif token in self.wake_tokens:
                lines.append((float(at), token))
        for at, token in lines:
            waiting = self.wake_sent.get(token)
            if waiting:
                self.wakes_delivered += 1
                self.now.wake_lat.append(at - waiting.popleft())
            else:  # its OK may not be read yet; left over at the end, it is a duplicate
                self.unmatched.append((at, token))
        return offset + end

    async def sample(self, http: httpx.AsyncClient, pid: int, data: Path, t0: float) -> dict:
        m: dict[str, float] = {}
        try:
            r = await http.get("/admin/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
            r.raise_for_status()
            m = parse_metrics(r.text)
        except (httpx.HTTPError, OSError) as exc:
            self.error(f"metrics scrape failed ({type(exc).__name__})")
        iv, self.now = self.now, Interval()

        def ms(values, q):
            return round(percentile(values, q) * 1000, 2) if values else ""

        return {
            "elapsed_s": round(time.monotonic() - t0, 1), "rss_mb": round(rss_mb(pid), 1),
            "sqlite_mb": round(m.get("appliance_sqlite_memory_bytes", float("nan")) / 1e6, 1),
            "open_files": open_files(pid),
            "loop_lag_ms": round(m.get("appliance_event_loop_lag_seconds", float("nan")) * 1000, 2),
            "queue_depth": int(m.get('appliance_wake_queue_depth{state="queued"}', -1)),
            "db_mb": round(dir_mb(data), 2),
            "connections": int(sum(v for k, v in m.items() if k.startswith("appliance_connections"))),
            "published": iv.published, "ok_p50_ms": ms(iv.ok_lat, 50), "ok_p99_ms": ms(iv.ok_lat, 99),
            "reqs": len(iv.req_lat), "req_p50_ms": ms(iv.req_lat, 50), "req_p99_ms": ms(iv.req_lat, 99),
            "wakes": len(iv.wake_lat), "wake_p50_ms": ms(iv.wake_lat, 50), "wake_p99_ms": ms(iv.wake_lat, 99),
            "live_received": iv.live, "errors": iv.errors,
        }


def log_errors(path: Path, offset: int) -> tuple[int, list[str]]:
    """Lines at ERROR or CRITICAL (and tracebacks) in the appliance's log since `offset`."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return offset, []
    bad = [ln for ln in data.decode(errors="replace").splitlines()
           if " ERROR " in ln or " CRITICAL " in ln or ln.startswith("Traceback") or "ERROR:" in ln]
    return offset + len(data), bad


# -- the plot ------------------------------------------------------------------------------------------

PANELS = (
    ("Resident memory, and SQLite's share of it (MB)", ("rss_mb", "sqlite_mb")),
    ("Open files", ("open_files",)),
    ("Event-loop lag, worst per interval (ms)", ("loop_lag_ms",)),
    ("Latency p99 (ms)", ("ok_p99_ms", "req_p99_ms", "wake_p99_ms")),
    ("Wake queue depth", ("queue_depth",)),
    ("Per interval: events published, wakes, errors", ("published", "wakes", "errors")),
    ("Database size (MB)", ("db_mb",)),
)
COLORS = ("#2563eb", "#dc2626", "#16a34a")


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def plot_svg(rows: list[dict], title: str) -> str:
    """The sampled columns as stacked line charts over minutes (plain SVG, no library)."""
    w, ph, left, right, top_pad, gap = 760, 120, 64, 150, 34, 34
    height = top_pad + len(PANELS) * (ph + gap)
    t_end = max((_num(r["elapsed_s"]) or 0 for r in rows), default=1) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {height}" width="{w}" height="{height}" '
           'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13" font-weight="bold">{_esc(title)}</text>']
    plot_w = w - left - right
    for p, (name, cols) in enumerate(PANELS):
        y0 = top_pad + p * (ph + gap) + 14
        values = [v for r in rows for c in cols if (v := _num(r.get(c))) is not None]
        vmax = max(values, default=1.0) * 1.1 or 1.0
        out.append(f'<text x="{left}" y="{y0 - 4}" font-weight="bold">{_esc(name)}</text>')
        out.append(f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{ph}" fill="none" stroke="#bbb"/>')
        for frac in (0, 0.5, 1):
            yy = y0 + ph - frac * ph
            out.append(f'<text x="{left - 4}" y="{yy + 4:.1f}" text-anchor="end">{vmax * frac:.4g}</text>')
            if 0 < frac < 1:
                out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>')
        for m in range(0, int(t_end // 60) + 1, max(1, int(t_end // 60) // 10 or 1)):
            xx = left + m * 60 / t_end * plot_w
            out.append(f'<text x="{xx:.1f}" y="{y0 + ph + 12}" text-anchor="middle">{m}m</text>')
        for i, c in enumerate(cols):
            pts = [(left + (_num(r["elapsed_s"]) or 0) / t_end * plot_w, y0 + ph - v / vmax * ph)
                   for r in rows if (v := _num(r.get(c))) is not None]
            if pts:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                out.append(f'<polyline fill="none" stroke="{COLORS[i]}" stroke-width="1.5" points="{path}"/>')
            out.append(f'<text x="{left + plot_w + 8}" y="{y0 + 14 + i * 14}" fill="{COLORS[i]}">{_esc(c)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- the trend -----------------------------------------------------------------------------------------


def least_squares_per_hour(pts: list[tuple[float, float]]) -> float:
    """Least-squares slope of (elapsed_s, value) points, per hour."""
    if len(pts) < 3:
        return float("nan")
    xs, ys = zip(*pts)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den * 3600 if den else float("nan")


def theil_sen_per_hour(points: list[tuple[float, float]]) -> float:
    """Median of the slopes between every pair of samples (Theil-Sen), per hour: the trend of a
    series that a few spikes (other jobs on the box, a GC pause) do not tilt, as they would a
    least-squares line. NaN for fewer than 3 samples."""
    if len(points) < 3:
        return float("nan")
    step = -(-len(points) // 600)  # at most 600 samples: 180,000 pairs
    pts = points[::step]
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts) for x2, y2 in pts[i + 1:] if x2 > x1]
    return statistics.median(slopes) * 3600 if slopes else float("nan")


# The trend rule (docs/reliability.md, "The growth verdict"). The first 20 % of the run, and at
# least its first 5 minutes (never more than half of it), is warm-up: caches filling, the first
# events expiring. After it, a column is growing when the Theil-Sen slope of the settled samples
# projects past its limit per hour, and the slope of the settled samples' second half does too
# (still growing at the end: a cache that filled and levelled off, or a one-off step, is not a
# trend). A settled stretch under 5 minutes is too short to tell a leak from noise: no verdict.
WARM_UP_SHARE = 0.2
WARM_UP_S = 300.0
MIN_SETTLED_S = 300.0
# (column, what it is, unit, limit per hour). Memory: resident less SQLite's own (its page caches
# are bounded by their cache_size, so they fill and stop); 10 MB/h is 240 MB a day, the smallest
# leak a 30-minute run tells from the allocator's steps. One file descriptor, or 30 queued wakes,
# or 100 ms of event-loop lag more every hour is growth nothing in the appliance should have.
GROWTH_LIMITS = (
    ("heap_mb", "memory outside SQLite's caches", "MB", 10.0),
    ("open_files", "open files", "", 1.0),
    ("queue_depth", "the wake queue", "", 30.0),
    ("loop_lag_ms", "event-loop lag", "ms", 100.0),
)


def _series(rows: list[dict], col: str) -> list[tuple[float, float]]:
    """(elapsed_s, value) of `col`; heap_mb is rss_mb less sqlite_mb (rss_mb where SQLite's is unknown)."""
    out = []
    for r in rows:
        if col == "heap_mb":
            rss, sql = _num(r.get("rss_mb")), _num(r.get("sqlite_mb"))
            v = None if rss is None else rss - (sql or 0.0)
        else:
            v = _num(r.get(col))
        if v is not None:
            out.append((float(r["elapsed_s"]), v))
    return out


def settled(rows: list[dict]) -> list[dict]:
    """The samples after the warm-up; [] when what is left is too short to judge a trend."""
    if not rows:
        return []
    t0, t1 = float(rows[0]["elapsed_s"]), float(rows[-1]["elapsed_s"])
    run = t1 - t0
    warm = min(max(WARM_UP_SHARE * run, WARM_UP_S), run / 2)
    if run - warm < MIN_SETTLED_S:
        return []
    return [r for r in rows if float(r["elapsed_s"]) >= t0 + warm]


def trends(rows: list[dict], cols=None) -> dict[str, tuple[float, float]]:
    """Per column (the verdict's by default): the Theil-Sen slope per hour of the settled samples,
    and of their second half; {} when the run is too short to judge."""
    after = settled(rows)
    late = after[len(after) // 2:]
    cols = cols or [c for c, _what, _unit, _limit in GROWTH_LIMITS]
    return {col: (theil_sen_per_hour(_series(after, col)), theil_sen_per_hour(_series(late, col)))
            for col in cols} if after else {}


def verdict(rows: list[dict]) -> list[str]:
    """Lines naming every column whose settled trend projects past its limit per hour."""
    bad = []
    slopes = trends(rows)
    for col, what, unit, limit in GROWTH_LIMITS:
        whole, late = slopes.get(col, (float("nan"), float("nan")))
        if whole > limit and late > limit:
            u = f" {unit}" if unit else ""
            bad.append(f"{what}: {whole:+.1f}{u}/h ({whole * 24:+,.0f}{u} a day), {late:+.1f}{u}/h over the last "
                       f"half, past the limit of {limit:g}{u}/h")
    return bad


# -- the run -------------------------------------------------------------------------------------------


async def drive(soak: Soak, url: str, port: int, emu: Emulator, pid: int, data: Path, log_path: Path,
                csv_path: Path) -> list[dict]:
    args = soak.args
    exec_key = executor_key(port)
    await soak.lease_wake_users(url, exec_key)
    info(f"  {len(soak.users)} users leased; load for {args.minutes:g} minutes, a sample every {args.interval:g} s")
    subscribers = [asyncio.create_task(soak.subscriber(url, n)) for n in range(args.subscribers)]
    await asyncio.sleep(0.5)  # the live subscriptions are in place before anything is published
    tasks = list(subscribers)
    tasks += [asyncio.create_task(soak.publisher(url, n)) for n in range(args.publishers)]
    tasks += [asyncio.create_task(soak.reader(url)), asyncio.create_task(soak.churner(url, exec_key))]
    rows: list[dict] = []
    offset, log_offset = 0, 0
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}")
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        next_at = t0 + args.interval
        while time.monotonic() < end:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += args.interval
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    soak.error(f"a load task failed ({type(t.exception()).__name__}: {t.exception()})")
                    tasks.remove(t)
            offset = soak.read_wakes(emu, offset)
            log_offset, bad = log_errors(log_path, log_offset)
            for line in bad:
                soak.error("appliance logged an error")
                info(f"  appliance log: {line[:300]}")
            row = await soak.sample(http, pid, data, t0)
            rows.append(row)
            writer.writerow(row)
            fh.flush()
            info(f"  {row['elapsed_s'] / 60:5.1f} min  rss {row['rss_mb']} MB (sqlite {row['sqlite_mb']})  files {row['open_files']}  "
                 f"lag {row['loop_lag_ms']} ms  queue {row['queue_depth']}  ok p99 {row['ok_p99_ms']} ms  "
                 f"wake p99 {row['wake_p99_ms']} ms  errors {row['errors']}")
        soak.stopping = True
        others = [t for t in tasks if t not in subscribers]
        if others:
            await asyncio.wait(others, timeout=60)
        # Let the last wakes and live events arrive (the subscribers stay until then), then count
        # what never did.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            offset = soak.read_wakes(emu, offset)
            if soak.wakes_delivered >= soak.wakes_expected and soak.live_received >= soak.live_expected:
                break
            await asyncio.sleep(0.5)
        soak.unsubscribing = True
        if subscribers:
            await asyncio.wait(subscribers, timeout=30)
    await http.aclose()
    missing = soak.wakes_expected - soak.wakes_delivered
    for _ in range(max(0, missing)):
        soak.error("a wake never arrived")
    for _ in soak.unmatched:
        soak.error("a wake nobody expected (a duplicate)")
    if soak.live_received < soak.live_expected:
        soak.errors["live events never delivered"] = soak.live_expected - soak.live_received
    return rows


def run(args: argparse.Namespace) -> int:
    if args.minutes <= 0 or args.interval <= 0 or args.rate <= 0 or args.publishers < 1:
        info("appliance bench soak: --minutes, --interval, --rate and --publishers must be positive")
        return 2
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="appliance-bench-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    emu = Emulator(work)
    config = work / "appliance.toml"
    # The purge sweeps expired events every 30 s (60 by default), so the database holds about
    # --event-ttl seconds of traffic.
    config.write_text("wake_min_interval = 0\npurge_interval = 30\n" + config_text(emu))
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    port = free_port()
    log_path = work / "appliance.log"
    relay = appliance_process(data, port, log_path, args.sync_mode,
                              ["--config", str(config), "--metrics-token", METRICS_TOKEN,
                               *args.server_arg])
    soak = Soak(args, work)
    started = time.time()
    try:
        relay.start()
        load0 = os.getloadavg()
        rows = asyncio.run(drive(soak, relay.url, port, emu, relay.proc.pid, data, log_path, work / "soak.csv"))
        if relay.proc.poll() is not None:
            soak.errors["the appliance exited"] = 1
    finally:
        relay.stop()
        emu.stop()
    load1 = os.getloadavg()
    title = (f"appliance bench soak: {args.minutes:g} min, {args.rate:g} events/s ({args.wake_share:.0%} waking), "
             f"{args.req_rate:g} REQ/s, {args.subscribers} live subs, {args.churn_rate:g} lease changes/s")
    (work / "soak.svg").write_text(plot_svg(rows, title))
    growth = verdict(rows)
    total_errors = sum(soak.errors.values())
    print(f"\n{title}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(started))} UTC, {os.cpu_count()} CPUs, "
          f"load average {load0[0]:.2f} at start, {load1[0]:.2f} at end (a shared machine gives noisy latencies)")
    print(f"samples: {len(rows)} every {args.interval:g} s -> {work / 'soak.csv'}, plot {work / 'soak.svg'}")
    pub = sum(r["published"] for r in rows)
    print(f"published {pub:,} events, {soak.wakes_expected:,} of them waking: {soak.wakes_delivered:,} wakes "
          f"delivered; {sum(r['reqs'] for r in rows):,} REQs; {soak.live_received:,} of {soak.live_expected:,} "
          "live deliveries")
    columns = (("rss_mb", "MB"), ("sqlite_mb", "MB"), ("heap_mb", "MB"), ("open_files", ""), ("loop_lag_ms", "ms"),
               ("queue_depth", ""), ("ok_p99_ms", "ms"), ("req_p99_ms", "ms"), ("wake_p99_ms", "ms"), ("db_mb", "MB"))
    slopes = trends(rows, [c for c, _u in columns])
    print("  column       first third   last third  max            slope (whole run)   settled trend, last half")
    for col, unit in columns:
        pts = _series(rows, col)
        vals = [v for _t, v in pts]
        k = max(1, len(vals) // 3)
        a, b = (statistics.median(vals[:k]), statistics.median(vals[-k:])) if vals else (float("nan"),) * 2
        top = max(vals) if vals else float("nan")
        trend = (f"{slopes[col][0]:+9.2f}/h {slopes[col][1]:+9.2f}/h" if col in slopes else "")
        print(f"  {col:<12} {a:9.2f}    {b:9.2f}    {top:9.2f} {unit:<3}  {least_squares_per_hour(pts):+9.2f}/h   "
              f"{trend}")
    limits = ", ".join(f"{what} {limit:g}{' ' + unit if unit else ''}/h" for _c, what, unit, limit in GROWTH_LIMITS)
    print("growth: " + ("; ".join(growth) if growth else
                        f"none past the limits ({limits}; Theil-Sen slope after the warm-up, and over its last half)"
                        if slopes else "not judged: under 5 minutes after the warm-up (a run of 10 minutes or more "
                        "gets a verdict)"))
    print("errors: " + (", ".join(f"{n}x {k}" for k, n in sorted(soak.errors.items())) if soak.errors else "none"))
    return 1 if total_errors or growth else 0
