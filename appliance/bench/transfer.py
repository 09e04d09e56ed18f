"""`appliance bench transfer`: `appliance import` and `appliance export` of N signed events.

The events (kind 1, p and t tags, a sentence of content, signed in worker processes) are written
to a JSON-lines file once (kept with --events-file, so later runs skip the signing), then the real
commands run as a user runs them: `appliance import < file` into a fresh data directory (ids and
signatures checked, unless --no-verify) and `appliance export > /dev/null`, each timed on the wall
clock with its CPU time (the verifying workers' included) and its peak memory. With --strfry BIN
the same file goes through `strfry import` and `strfry export` for scale.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from appliance.bench.harness import appliance_command, info
from appliance.bench.relay import EventFactory, load_average


@dataclass
class Run:
    name: str
    events: int
    seconds: float
    cpu: float  # the command's CPU seconds, its children's included
    peak_mb: float  # the command's own peak RSS
    summary: str = ""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def timed(name: str, args: list[str], events: int, *, stdin: Path | None = None,
          stdout: Path | None = None, env: dict | None = None) -> Run:
    """Run a command to its end with stdin/stdout on files; its wall time, CPU (its children's
    included) and peak RSS (its own, from wait4)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile() as ferr, open(stdin or os.devnull, "rb") as fin, \
            open(stdout or os.devnull, "wb") as fout:
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, stdin=fin, stdout=fout, stderr=ferr, env=env)
        _pid, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        ferr.seek(0)
        err = ferr.read().decode(errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}): {err[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(name, events, seconds, cpu, usage.ru_maxrss / 1024, err)


def write_events(path: Path, n: int, workers: int, seed: int) -> None:
    factory = EventFactory(authors=1000, recipients=1000, workers=workers, seed=seed)
    now = int(time.time())
    written = 0
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as fh:
            for batch in factory.batches(n, newest=now - 60, spread=365 * 86400):
                fh.write(b"\n".join(batch) + b"\n")
                written += len(batch)
                if written % 200_000 < len(batch):
                    info(f"  signed {written:,} / {n:,} ({written / (time.perf_counter() - t0):,.0f}/s)")
    finally:
        factory.close()


def count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=1_000_000, metavar="N", help="events (default 1000000)")
    p.add_argument("--events-file", metavar="PATH",
                   help="the JSON-lines file of events: used if it exists (its first N lines), else written and kept")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, metavar="P",
                   help="processes signing the events (default: one per CPU)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the events (default 1)")
    p.add_argument("--no-verify", action="store_true", help="also time an import with --no-verify")
    p.add_argument("--sync-mode", default="full", choices=("full", "normal"),
                   help="the appliance's sync_mode (default full: durable commits)")
    p.add_argument("--search-kinds", default=None, metavar="KINDS",
                   help="the appliance's search_kinds (default: its default, 1 and 30023: the index on)")
    p.add_argument("--strfry", metavar="BIN", help="also time strfry import/export of the same file")
    p.add_argument("--work-dir", metavar="DIR", help="use (and keep) this directory instead of a temporary one")


def run(args: argparse.Namespace) -> int:
    if args.events < 1:
        print("appliance bench transfer: --events must be at least 1", file=sys.stderr)
        return 2
    keep = args.work_dir is not None
    work = Path(args.work_dir) if keep else Path(tempfile.mkdtemp(prefix="appliance-bench-transfer-"))
    work.mkdir(parents=True, exist_ok=True)
    load_start = load_average()
    runs: list[Run] = []
    try:
        source = Path(args.events_file) if args.events_file else work / "events.jsonl"
        if not source.exists() or count_lines(source) < args.events:
            info(f"signing {args.events:,} events into {source} ({args.workers} processes)...")
            write_events(source, args.events, max(1, args.workers), args.seed)
        if count_lines(source) > args.events:
            cut = work / "events-cut.jsonl"
            with open(source, "rb") as fin, open(cut, "wb") as fout:
                for i, line in enumerate(fin):
                    if i == args.events:
                        break
                    fout.write(line)
            source = cut
        n = args.events
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        common = ["--sync-mode", args.sync_mode, "--log-level", "warning"]
        if args.search_kinds is not None:
            common += ["--search-kinds", args.search_kinds]
        variants = [("import", [])] + ([("import --no-verify", ["--no-verify"])] if args.no_verify else [])
        for name, extra in variants:
            data = work / f"data-{len(runs)}"
            shutil.rmtree(data, ignore_errors=True)
            info(f"{name}: {n:,} events into {data} (load {load_average()})")
            said = work / "import.out"
            r = timed(name, [*appliance_command(), "import", "--data-dir", str(data), *common, *extra], n,
                      stdin=source, stdout=said, env=env)
            r.summary = said.read_text().strip()
            runs.append(r)
            info(f"{name}: {r.rate:,.0f} events/s")
        data = work / "data-0"
        info(f"export: {n:,} events from {data} (load {load_average()})")
        out = work / "export.jsonl"
        r = timed("export", [*appliance_command(), "export", "--data-dir", str(data), *common], n, stdout=out, env=env)
        got = count_lines(out)
        r.summary = f"{got:,} lines"
        runs.append(r)
        info(f"export: {r.rate:,.0f} events/s")
        out.unlink()
        if args.strfry:
            sdb = work / "strfry-db"
            shutil.rmtree(sdb, ignore_errors=True)
            sdb.mkdir()
            conf = work / "strfry.conf"
            conf.write_text(f'db = "{sdb}/"\nrelay {{\n  nofiles = 0\n}}\n')
            for name, what, io in (("strfry import", "import", {"stdin": source}), ("strfry export", "export", {})):
                r = timed(name, [args.strfry, f"--config={conf}", what], n, **io)
                done = [line.split("| ", 1)[-1] for line in r.summary.splitlines() if "Done." in line]
                r.summary = done[-1] if done else ""
                runs.append(r)
            shutil.rmtree(sdb, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nappliance bench transfer: {args.events:,} signed kind-1 events, sync_mode {args.sync_mode}, "
          f"search_kinds {args.search_kinds if args.search_kinds is not None else 'default (1, 30023)'}, "
          f"{os.cpu_count()} CPUs; load average {load_start} at the start, {load_average()} at the end")
    print(f"{'command':<20} {'events/s':>10} {'seconds':>9} {'CPU s':>8} {'CPU us/event':>13} {'peak MB':>8}  result")
    for r in runs:
        print(f"{r.name:<20} {r.rate:>10,.0f} {r.seconds:>9.1f} {r.cpu:>8.1f} {r.cpu / r.events * 1e6:>13.1f} "
              f"{r.peak_mb:>8.0f}  {r.summary}")
    return 0
