"""`appliance bench crashloop --kills N`: SIGKILL the appliance at random points under load, N times,
and check after every restart that nothing acknowledged was lost.

One data directory, one APNs emulator (on a thread of this process, so every request is
recorded with its apns-id and device token). Users hold leases whose subscriptions wake them when
mentioned; other users replace and revoke their leases all the time. Each round: publishers send
notes and mentions (each mention wakes one leased device), the churners send new lease
generations and tombstones, and after a random 0.2..2.5 s the appliance gets SIGKILL. Then:

1. `PRAGMA integrity_check` on the database as the kill left it, read-only (its WAL stays for the
   restart to recover): `ok`.
2. The appliance starts again on the same directory, and
   - every event that got `OK true` is served by REQ (a replaced lease: a newer version is);
   - every stored mention has exactly one wake job per (origin, app profile, transport,
     H(endpoint), event id), delivered (or coalesced into a delivered wake), and the emulator
     accepted exactly the delivered jobs' apns-ids for that device, no other; a mention that was
     never stored woke nobody;
   - every lease address's row agrees with what REQ serves at the address (the same event, its
     generation), and its watermark is the highest generation ever accepted there.

A crash between APNs' 200 and the commit that records it is the one place a wake can go twice
(docs/spec-notes.md W11): the claim lapses and the same wake (same apns-id) is sent again. Those
repeats are counted and reported; a second apns-id for one key would be a duplicate wake and fails.
Some devices answer after a delay, so kills land while requests are in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from appliance.bench.harness import (
    NostrClient,
    appliance_process,
    executor_key,
    free_port,
    info,
    lease_event,
)
from appliance.store import audit
from appliance.store.sqlite import DB_FILENAME, integrity_check, read_file

ORIGIN = "ws://crash.loop"
PROFILE = "com.example.crash/ios"
TOPIC = "com.example.crash"
TEAM, KEY_ID = "CRASHTEAM1", "CRASHKEY01"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kills", type=int, default=50, help="SIGKILLs (default 50)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a new one, printed)")
    p.add_argument("--wake-users", type=int, default=30, help="users whose leased devices get woken (default 30)")
    p.add_argument("--churn-users", type=int, default=4, help="users whose leases churn (default 4)")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"),
                   help="SQLite durability (default full; `normal` may lose the last commits on power loss, "
                        "not on a process kill)")
    p.add_argument("--keep", metavar="DIR", help="work in (and keep) this directory")


@dataclass
class Address:
    """One churning lease address and every version sent to it."""

    secret: str
    pubkey: str
    d: str
    generation: int = 0
    created: int = 0
    versions: dict[str, tuple[int, bool, int]] = field(default_factory=dict)  # id -> (generation, active, at)
    acked: set[str] = field(default_factory=set)


@dataclass
class Report:
    kills: int = 0
    acked: int = 0
    mentions_stored: int = 0
    wakes: int = 0
    repeats: int = 0  # the same apns-id accepted again after a crash (W11)
    lease_versions: int = 0
    restarts_s: list[float] = field(default_factory=list)
    wal_bytes: list[int] = field(default_factory=list)  # the WAL each kill left for the restart
    violations: list[str] = field(default_factory=list)


class CrashLoop:
    def __init__(self, work: Path, *, seed: int, wake_users: int = 30, churn_users: int = 4,
                 sync_mode: str = "full", log=info):
        from appliance.testing.apns_emulator import ApnsEmulator
        from appliance.testing.tls import make_p8

        self.work = work
        self.rng = random.Random(seed)
        self.log = log
        self.n_wake, self.n_churn = wake_users, churn_users
        key_file = work / f"AuthKey_{KEY_ID}.p8"
        key = make_p8(key_file)
        self.emu = ApnsEmulator(topics=[TOPIC], pki_dir=work / "apns-pki")
        self.emu.add_key(TEAM, KEY_ID, key)
        self.emu.start_in_thread()
        self.config = work / "appliance.toml"
        # Claims lapse after 2 s (60 by default) so a wake a kill interrupted goes again soon.
        self.config.write_text(f"""public_url = "{ORIGIN}"
wake_min_interval = 0
wake_retry_delay = 0.2
wake_visibility_timeout = 2
[push]
app_profiles = [{{ id = "{PROFILE}", transport = "apns", topic = "{TOPIC}", team_id = "{TEAM}", \
key_id = "{KEY_ID}", key_file = "{key_file}", environment = "production", apns_url = "{self.emu.url}", \
ca_file = "{self.emu.ca_file}" }}]
push_kinds = [9]
""")
        self.data = work / "data"
        self.port = free_port()
        self.proc = appliance_process(self.data, self.port, work / "appliance.log", sync_mode,
                                      ["--config", str(self.config)])
        self.report = Report()
        self.wake_users: list[tuple[str, str, str]] = []  # (secret, pubkey, token)
        self.addresses: list[Address] = []
        self.publishers = [secrets.token_hex(32) for _ in range(3)]
        self.sent: dict[str, str | None] = {}  # every note or mention sent: id -> the woken token (None: a note)
        self.acked: set[str] = set()
        self.exec_key: tuple[str, str] | None = None
        self.turn = 0

    # -- load ----------------------------------------------------------------------------------------

    async def setup(self) -> None:
        from appliance.nostr.keys import public_key

        self.exec_key = executor_key(self.port)
        for i in range(self.n_wake):
            secret = secrets.token_hex(32)
            token = secrets.token_hex(32)
            c = await NostrClient.connect(self.proc.url)
            try:
                ok, msg = await c.auth(secret, ORIGIN)
                ev = lease_event(secret, origin=ORIGIN, profile=PROFILE, endpoint=token, generation=1,
                                 d=secrets.token_urlsafe(16), exec_id=self.exec_key[0], exec_pub=self.exec_key[1])
                ok2, msg2 = await c.publish(ev.to_json(), ev.id)
                if not (ok and ok2):
                    raise RuntimeError(f"leasing refused: {msg} {msg2}")
            finally:
                await c.close()
            self.wake_users.append((secret, public_key(secret), token))
            if i % 3 == 0:  # a third of the devices answer late: kills land mid-request
                self.emu.behave(token, delay=0.4)
        self.addresses = [Address(s, public_key(s), secrets.token_urlsafe(16))
                          for s in (secrets.token_hex(32) for _ in range(self.n_churn))]

    async def publisher(self, secret: str, stop: asyncio.Event) -> None:
        from appliance.nostr.event import sign_event

        c = await NostrClient.connect(self.proc.url)
        try:
            while not stop.is_set():
                self.turn += 1
                if self.turn % 2:
                    _s, pub, token = self.wake_users[self.turn // 2 % len(self.wake_users)]
                    ev = sign_event(secret, 9, [["p", pub]], f"wake {secrets.token_hex(6)}")
                else:
                    token = None
                    ev = sign_event(secret, 1, [["t", "crash"]], f"note {secrets.token_hex(6)}")
                self.sent[ev.id] = token
                ok, _msg = await c.publish(ev.to_json(), ev.id)
                if ok:
                    self.acked.add(ev.id)
                await asyncio.sleep(self.rng.random() * 0.02)
        finally:
            await c.close()

    async def churner(self, addr: Address, stop: asyncio.Event) -> None:
        c = await NostrClient.connect(self.proc.url)
        try:
            ok, msg = await c.auth(addr.secret, ORIGIN)
            if not ok:
                raise RuntimeError(f"AUTH refused: {msg}")
            while not stop.is_set():
                addr.generation += 1
                addr.created = max(int(time.time()), addr.created + 1)
                active = self.rng.random() > 0.2
                ev = lease_event(addr.secret, origin=ORIGIN, profile=PROFILE, endpoint=secrets.token_hex(32),
                                 generation=addr.generation, d=addr.d, exec_id=self.exec_key[0],
                                 exec_pub=self.exec_key[1], active=active, created_at=addr.created)
                addr.versions[ev.id] = (addr.generation, active, addr.created)
                ok, msg = await c.publish(ev.to_json(), ev.id)
                if ok:
                    addr.acked.add(ev.id)
                elif not msg.startswith(("duplicate:", "invalid: stale")):
                    self.report.violations.append(f"lease refused: {msg}")
                await asyncio.sleep(0.05)
        finally:
            await c.close()

    @staticmethod
    async def until_killed(work) -> None:
        """Run one load task until the kill drops its connection (that ends it, as expected)."""
        try:
            await work
        except (ConnectionError, OSError, TimeoutError):
            pass

    async def round(self) -> None:
        """Load, then SIGKILL at a random moment (connections drop mid-message)."""
        stop = asyncio.Event()
        tasks = [asyncio.create_task(self.until_killed(self.publisher(s, stop))) for s in self.publishers]
        tasks += [asyncio.create_task(self.until_killed(self.churner(a, stop))) for a in self.addresses]
        await asyncio.sleep(0.2 + self.rng.random() * 2.3)
        self.proc.kill()
        stop.set()
        await asyncio.wait(tasks, timeout=30)
        for t in tasks:
            if not t.done():
                t.cancel()
        self.report.kills += 1

    # -- checks --------------------------------------------------------------------------------------

    def integrity(self) -> None:
        # Read-only: a read-write connection, closed last, would checkpoint the WAL into the
        # database and delete it, and the restart would never recover the state the kill left.
        result = integrity_check(self.data / DB_FILENAME)
        if result != ["ok"]:
            self.report.violations.append(f"kill {self.report.kills}: integrity_check {result[:5]}")

    def rows(self, fn):
        """`fn(conn)` on a read-only connection to the database (see `integrity`)."""
        return read_file(self.data / DB_FILENAME, fn)

    async def served(self, ids: list[str], client: NostrClient) -> set[str]:
        out: set[str] = set()
        for i in range(0, len(ids), 500):
            events, closed = await client.req(f"ids{i}", [{"ids": ids[i:i + 500], "limit": 500}])
            if closed is not None:
                self.report.violations.append(f"REQ by ids CLOSED: {closed}")
            out |= {e["id"] for e in events}
        return out

    async def verify(self) -> None:
        n = self.report.kills
        bad = self.report.violations
        reader = await NostrClient.connect(self.proc.url)
        try:
            stored = await self.served(list(self.sent), reader)
        finally:
            await reader.close()
        lost = self.acked - stored
        for eid in sorted(lost):
            bad.append(f"kill {n}: event {eid[:12]} got OK true and is not served")
        # Wakes: every stored mention woken once, by a delivered job; wait for the lapsed claims.
        mentions = {eid: tok for eid, tok in self.sent.items() if tok is not None and eid in stored}
        self.report.mentions_stored = len(mentions)
        hashes = self.rows(audit.endpoint_hashes)
        deadline = time.monotonic() + 60
        while True:
            jobs = self.rows(audit.wake_jobs)
            by_id = {j[0]: j for j in jobs}
            delivered = {j[0] for j in jobs if j[6] == "delivered"}
            covered = {j[1] for j in jobs if j[6] == "delivered" or (j[6] == "coalesced" and j[7] in delivered)}
            accepted = {r.apns_id for r in self.emu.accepted()}
            if (set(mentions) <= covered and delivered <= accepted) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        keys = Counter((j[5], j[3], j[4], j[2], j[1]) for j in jobs if j[6] != "cancelled")
        for key, count in keys.items():
            if count > 1:
                bad.append(f"kill {n}: {count} wake jobs for one key (event {key[4][:12]})")
        for eid, tok in mentions.items():
            if eid not in covered:
                states = [j[6] for j in jobs if j[1] == eid]
                bad.append(f"kill {n}: mention {eid[:12]} stored but not woken (jobs: {states})")
            elif not any(j[2] == hashes.get(tok) for j in jobs if j[1] == eid):
                bad.append(f"kill {n}: mention {eid[:12]} woke another endpoint")
        for eid in set(self.sent) - stored:
            if any(j[1] == eid for j in jobs):
                bad.append(f"kill {n}: event {eid[:12]} not stored has a wake job")
        per_token: dict[str, Counter] = {}
        for r in self.emu.accepted():
            per_token.setdefault(r.token, Counter())[r.apns_id] += 1
        wake_tokens = {t for _s, _p, t in self.wake_users}
        repeats = 0
        for tok, ids in per_token.items():
            if tok not in wake_tokens:
                bad.append(f"kill {n}: a wake to a device nobody mentioned")
                continue
            for apns_id, count in ids.items():
                job = by_id.get(apns_id)
                if job is None or job[6] != "delivered":
                    bad.append(f"kill {n}: APNs accepted {apns_id}, not a delivered job "
                               f"({job[6] if job else 'unknown'})")
                elif hashes.get(tok) != job[2]:
                    bad.append(f"kill {n}: wake {apns_id} went to another device than its job's")
                repeats += count - 1
            mine = {j[0] for j in jobs if j[6] == "delivered" and j[2] == hashes.get(tok)}
            if set(ids) != mine:
                bad.append(f"kill {n}: device got {len(ids)} distinct wakes, {len(mine)} delivered jobs")
        self.report.wakes = sum(len(ids) for ids in per_token.values())
        self.report.repeats = repeats
        self.report.acked = len(self.acked)
        await self.verify_leases()

    async def verify_leases(self) -> None:
        n = self.report.kills
        bad = self.report.violations
        rows = {(r[0], r[1]): r[2:] for r in self.rows(audit.lease_generations)}
        for addr in self.addresses:
            c = await NostrClient.connect(self.proc.url)
            try:
                ok, msg = await c.auth(addr.secret, ORIGIN)
                events, closed = await c.req("lease", [{"kinds": [30350], "authors": [addr.pubkey],
                                                        "#d": [addr.d]}])
            finally:
                await c.close()
            if not addr.versions:
                continue
            if closed is not None or not ok:
                bad.append(f"kill {n}: lease REQ refused: {closed or msg}")
                continue
            newest_acked = max((addr.versions[e] for e in addr.acked), key=lambda v: v[2], default=None)
            if not events:
                if newest_acked is not None:
                    bad.append(f"kill {n}: lease address with acknowledged versions serves nothing")
                continue
            served = events[0]["id"]
            if len(events) != 1 or served not in addr.versions:
                bad.append(f"kill {n}: lease address serves {len(events)} events, or one never sent")
                continue
            gen, active, at = addr.versions[served]
            if newest_acked is not None and at < newest_acked[2]:
                bad.append(f"kill {n}: lease address serves generation {gen}, older than acknowledged "
                           f"generation {newest_acked[0]}")
            row = rows.get((addr.pubkey, addr.d))
            if row is None or row[0] != served or row[1] != gen or bool(row[2]) != active:
                bad.append(f"kill {n}: lease row {row and row[:3]} disagrees with the served event "
                           f"(generation {gen}, active {active})")
            highest = max([gen] + [addr.versions[e][0] for e in addr.acked])
            if row is not None and (row[3] is None or row[3] < highest):
                bad.append(f"kill {n}: watermark {row[3]} below generation {highest}, served or acknowledged")
            self.report.lease_versions = sum(len(a.acked) for a in self.addresses)

    # -- the loop ------------------------------------------------------------------------------------

    async def run(self, kills: int) -> Report:
        shutil.rmtree(self.data, ignore_errors=True)
        self.proc.start()
        try:
            await self.setup()
            for _ in range(kills):
                await self.round()
                self.integrity()
                wal = self.data / f"{DB_FILENAME}-wal"
                self.report.wal_bytes.append(wal.stat().st_size if wal.exists() else 0)
                t = time.monotonic()
                self.proc.start()
                self.report.restarts_s.append(time.monotonic() - t)
                before = len(self.report.violations)
                await self.verify()
                self.log(f"  kill {self.report.kills:>3}: {len(self.acked):,} events acknowledged, "
                         f"{self.report.mentions_stored:,} mentions woken, {self.report.wakes:,} wakes, "
                         f"{self.report.repeats} repeated after a crash, "
                         f"{len(self.report.violations) - before} violations")
        finally:
            self.proc.stop()
            self.emu.stop_thread()
        return self.report


def run(args: argparse.Namespace) -> int:
    if args.kills < 1:
        info("appliance bench crashloop: --kills must be at least 1")
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="appliance-bench-crashloop-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        loop = CrashLoop(work, seed=seed, wake_users=args.wake_users, churn_users=args.churn_users,
                         sync_mode=args.sync_mode)
        report = asyncio.run(loop.run(args.kills))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    restarts = sorted(report.restarts_s)
    print(f"\nappliance bench crashloop: {report.kills} SIGKILLs under load (seed {seed}, sync_mode {args.sync_mode}) "
          f"in {time.monotonic() - t0:.0f} s")
    print(f"  events acknowledged {report.acked:,}; stored mentions {report.mentions_stored:,}, each woken once: "
          f"{report.wakes:,} distinct wakes accepted by the emulator, {report.repeats} re-sent with the same "
          "apns-id after a crash")
    print(f"  lease versions acknowledged {report.lease_versions:,}; integrity_check ok after every kill: "
          f"{not any('integrity' in v for v in report.violations)}")
    if restarts:
        print(f"  restart to listening: median {restarts[len(restarts) // 2]:.2f} s, max {restarts[-1]:.2f} s")
        wals = sorted(report.wal_bytes)
        print(f"  each restart on the WAL its kill left: {sum(1 for w in wals if w)} of {len(wals)} non-empty, "
              f"median {wals[len(wals) // 2] / 1e6:.1f} MB, max {wals[-1] / 1e6:.1f} MB")
    print("violations: " + ("none" if not report.violations else str(len(report.violations))))
    for v in report.violations[:50]:
        print(f"  {v}")
    return 1 if report.violations else 0
