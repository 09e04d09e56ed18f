"""`appliance export`, `import` and `delete`: events in and out as JSON lines, and deletion by filter.

They work as strfry's commands of the same names do, beside a running server or without one:
each opens the store as the other commands do, and writes through its one writer thread in
short transactions (a server running beside it waits at most one of them for the write lock).

- export: one event per line, the NIP-01 JSON as stored, oldest first, streamed a page at a time.
- import: one event per line on stdin; ids and signatures checked in worker processes (the
  store's writer meanwhile commits the lines checked before), then stored under the rules of a
  publish; a summary line `import: read N, stored S, duplicate D, rejected R` at the end.
- delete: every event a filter selects, in chunks; `--dry-run` counts them only.

The relay's one serialization is strfry's (keys in alphabetical order, JSON.stringify's
escaping), so lines move between the two byte for byte (docs/spec-notes.md, JSON lines).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, BinaryIO, Callable, Iterator

import orjson

from appliance.errors import AlreadyStored, ApplianceError, Rejected
from appliance.nostr.event import (MAX_SAFE_INT, Event, InvalidEvent, expiration as event_expiration, is_ephemeral,
                                   parse_event, verify_id, verify_signature)
from appliance.nostr.filters import Filter, InvalidFilter, parse_filter
from appliance.settings import Settings

# Lines checked per task of a verifying worker.
CHUNK = 2000
# Lines committed per write transaction: larger ones write each index page once for more events;
# a server writing beside the import waits at most one of them: docs/performance.md#commit_lines
COMMIT_LINES = 10_000
# Seconds between progress lines on stderr.
PROGRESS_SECONDS = 2.0
# NIP-PL leases: accepted only from their authors over the relay (authentication, decryption).
LEASE_KIND = 30350
AUTH_KIND = 22242
# The keys a command-line filter may have: an unknown key (a typo) would widen what it selects.
FILTER_KEYS = frozenset({"ids", "authors", "kinds", "since", "until", "limit", "search"})


class UsageError(ApplianceError):
    """A command-line argument the command cannot use: one line saying which and why."""


def add_parsers(sub, add_setting_flags: Callable) -> None:
    """The export, import and delete subcommands."""
    export = sub.add_parser(
        "export", help="Write the events of an origin to stdout, one JSON per line, oldest first.",
        description="Write every event of an origin (the default one unless --origin names another) that the "
        "filter selects to stdout, one NIP-01 JSON per line as stored, oldest first (strfry's `export` "
        "format). Streams: memory stays constant however many events there are. Runs beside the server.")
    export.add_argument("--origin", metavar="URL", help="The origin to export (default: the default origin).")
    export.add_argument("--filter", metavar="JSON", help="A NIP-01 filter selecting the events (default: all).")
    export.add_argument("--since", metavar="T", help="Only events with created_at >= T (Unix seconds).")
    export.add_argument("--until", metavar="T", help="Only events with created_at <= T (Unix seconds).")
    add_setting_flags(export)

    imp = sub.add_parser(
        "import", help="Store events read from stdin, one JSON per line (strfry's `export` format).",
        description="Read events from stdin, one NIP-01 JSON per line, check their ids and signatures (in "
        "worker processes) and store them at an origin under the rules of a publish: replaceable and "
        "addressable events replace older versions, deletions (NIP-09) delete, expired events (NIP-40) are "
        "refused. Events already stored count as duplicates; a bad line is reported with its number on "
        "stderr and skipped. Progress goes to stderr, the summary line to stdout: "
        "`import: read N, stored S, duplicate D, rejected R`. Runs beside the server.")
    imp.add_argument("--origin", metavar="URL", help="The origin to store into (default: the default origin).")
    imp.add_argument("--no-verify", action="store_true",
                     help="Do not check ids and signatures (for a trusted source: faster).")
    add_setting_flags(imp)

    delete = sub.add_parser(
        "delete", help="Delete the events a filter selects at an origin, printing the count.",
        description="Delete every event of an origin that a NIP-01 filter selects (strfry's `delete`) and print "
        "how many went. Live subscriptions are not touched. With --dry-run nothing is deleted: it prints how "
        "many would be. Runs beside the server.")
    delete.add_argument("--filter", metavar="JSON", required=True, help="A NIP-01 filter selecting the events.")
    delete.add_argument("--origin", metavar="URL", help="The origin (default: the default origin).")
    delete.add_argument("--dry-run", action="store_true", help="Count what the filter selects; delete nothing.")
    add_setting_flags(delete)


# -- arguments ------------------------------------------------------------------------------------


def cli_filter(text: str | None, option: str = "--filter") -> Filter:
    """A filter given on the command line: NIP-01's grammar, strictly (an unknown key is refused,
    not ignored as a relay ignores it: a typo would widen what an export or a delete selects)."""
    if text is None:
        return Filter()
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{option}: not JSON ({exc})") from None
    if type(obj) is not dict:
        raise UsageError(f"{option}: a filter is a JSON object, such as '{{\"kinds\": [1]}}'")
    for key in obj:
        if key not in FILTER_KEYS and not (key.startswith("#") and len(key) == 2):
            raise UsageError(f"{option}: unknown filter field {key!r} (NIP-01 fields: ids, authors, kinds, #x, "
                             "since, until, limit, search)")
    try:
        return parse_filter(obj, max_values=1_000_000, max_limit=MAX_SAFE_INT)
    except InvalidFilter as exc:
        raise UsageError(f"{option}: {exc.reason}") from None


def _timestamp(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise UsageError(f"{option}: expected a Unix time in seconds, such as 1700000000; got {text!r}") from None
    if not 0 <= value <= MAX_SAFE_INT:
        raise UsageError(f"{option}: {value} is out of range (0 to 2^53-1)")
    return value


def with_times(f: Filter, since: int | None, until: int | None) -> Filter:
    """The filter narrowed to [since, until] (both bounds apply when given twice)."""
    if since is not None:
        f.since = since if f.since is None else max(f.since, since)
    if until is not None:
        f.until = until if f.until is None else min(f.until, until)
    return f


def pick_origin(store, registry, origin: str | None):
    """The origin named by --origin, or the default one."""
    from appliance.origin_config import default_origin_id
    from appliance.commands import find_origin

    if origin is not None:
        return find_origin(registry, origin)
    return registry.by_id(store.read_sync(default_origin_id))


# -- export ---------------------------------------------------------------------------------------


_CANONICAL_HEAD = b'{"content":'


def canonical_line(raw: bytes) -> bytes:
    """A stored event's JSON in the relay's serialization: as stored, unless it was stored before
    the serialization became strfry's (keys in NIP-01's order then): re-serialized."""
    if raw.startswith(_CANONICAL_HEAD):
        return raw
    return parse_event(orjson.loads(raw)).to_json_bytes()


def run_export(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.commands import open_data
    from appliance.store.transfer import export_pages

    f = with_times(cli_filter(args.filter), _timestamp(args.since, "--since"), _timestamp(args.until, "--until"))
    if f.search is not None:
        raise UsageError("--filter: search is for REQ (ranked by relevance); export selects by the other fields")
    out = sys.stdout.buffer
    with open_data(settings) as (store, registry):
        origin = pick_origin(store, registry, args.origin)
        now = int(time.time())

        def export(conn) -> int:
            n = 0
            for page in export_pages(conn, origin.id, f, now):
                out.write(b"\n".join(map(canonical_line, page)) + b"\n")
                n += len(page)
            return n

        try:
            store.read_sync(export)
            out.flush()
        except BrokenPipeError:  # the reader went away (`| head`): not an error
            quiet_stdout()
        except OSError as exc:  # a full disk, a quota: one line, not a traceback
            quiet_stdout()
            raise ExportFailed(f"export: cannot write the events: {exc.strerror or exc}") from None
    return 0


class ExportFailed(ApplianceError):
    """Standard output refused the export's lines (a full disk, say): one line saying so."""


def quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# -- import ---------------------------------------------------------------------------------------


def check_line(line: bytes) -> str | None:
    """Why a line is not a valid event (its id and signature checked), or None. Runs in a worker."""
    try:
        ev = parse_event(orjson.loads(line))
    except orjson.JSONDecodeError:
        return "invalid: not a JSON object"
    except InvalidEvent as exc:
        return f"invalid: {exc.reason}"
    if not verify_id(ev):
        return "invalid: event id does not match its content"
    if not verify_signature(ev):
        return "invalid: bad signature"
    return None


def check_lines(lines: list[bytes]) -> list[str | None]:
    return [None if line is None else check_line(line) for line in lines]


def _warm(_n: int) -> int:
    return os.getpid()


def read_lines(stream: BinaryIO, max_bytes: int) -> Iterator[bytes | None]:
    """The lines of `stream` without their line break; None for a line longer than `max_bytes`
    (read past without holding it)."""
    readline = stream.readline
    while True:
        line = readline(max_bytes + 2)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1]
        elif len(line) <= max_bytes:  # the last line, with no line break
            yield line
        else:
            while line and not line.endswith(b"\n"):
                line = readline(1 << 16)
            yield None


class Counts:
    def __init__(self) -> None:
        self.read = self.stored = self.duplicate = self.rejected = 0

    def summary(self) -> str:
        return f"import: read {self.read}, stored {self.stored}, duplicate {self.duplicate}, rejected {self.rejected}"


class Importer:
    """Reads lines, has them checked by worker processes, admits and stores them in order.

    Three stages run at once: worker processes check ids and signatures of the next chunks, this
    thread admits the lines of checked chunks (the rules of a publish that need no database), and
    a committer thread stores the lines admitted before them through the store's writer,
    COMMIT_LINES to a transaction. At most a few chunks are in flight, so memory stays constant."""

    def __init__(self, store, origin, settings: Settings, *, verify: bool, workers: int | None = None,
                 err: Any = None):
        self.store = store
        self.origin = origin
        self.settings = settings
        self.verify = verify
        self.workers = workers if workers is not None else max(1, os.cpu_count() or 1)
        self.err = err or sys.stderr
        self.counts = Counts()
        self.pool: ProcessPoolExecutor | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._pending: list = []  # admitted lines not handed to the committer yet
        self._failed: BaseException | None = None
        self._last_progress = time.monotonic()
        self._started = time.monotonic()

    def start_workers(self) -> None:
        """The verifying processes (spawned: this process has threads; started before reading)."""
        if self.verify and self.workers > 0 and self.pool is None:
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
            list(self.pool.map(_warm, range(self.workers)))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def run(self, stream: BinaryIO) -> Counts:
        from appliance.store.transfer import widen_cache

        self.start_workers()
        self.store.write_sync(widen_cache)
        committer = threading.Thread(target=self._commit_loop, name="appliance-import-commit", daemon=True)
        committer.start()
        try:
            self._feed(stream)
        finally:
            self._queue.put(None)
            committer.join()
        if self._failed is not None:
            raise self._failed
        return self.counts

    # -- stages -----------------------------------------------------------------------------

    def _chunks(self, stream: BinaryIO) -> Iterator[tuple[int, list]]:
        """(first line number, lines) of CHUNK lines each."""
        lines: list = []
        first = 1
        for line in read_lines(stream, self.settings.max_message_length):
            lines.append(line)
            if len(lines) == CHUNK:
                yield first, lines
                first += len(lines)
                lines = []
        if lines:
            yield first, lines

    def _feed(self, stream: BinaryIO) -> None:
        inflight: list = []
        # Checks run up to two transactions ahead, so the workers keep going while the committer
        # stores one batch and this thread admits the next (both at once, else they wait in turn).
        depth = 2 * COMMIT_LINES // CHUNK + self.workers
        for first, lines in self._chunks(stream):
            if self._failed is not None:
                return
            if self.pool is None:
                self._admit(first, lines, check_lines(lines) if self.verify else None)
                continue
            inflight.append((first, lines, self.pool.submit(check_lines, lines)))
            while len(inflight) >= depth:
                self._admit_next(inflight)
        while inflight and self._failed is None:
            self._admit_next(inflight)
        self._flush()

    def _admit_next(self, inflight: list) -> None:
        first, lines, fut = inflight.pop(0)
        self._admit(first, lines, fut.result())

    def _flush(self) -> None:
        """Hand the lines admitted so far to the committer (one write transaction)."""
        if self._pending:
            self._queue.put(self._pending)
            self._pending = []

    def _admit(self, first: int, lines: list, problems: list | None) -> None:
        """Turn a checked chunk into pending writes (and refusals), for the committer."""
        from appliance.store.events import PendingEvent

        now = int(time.time())
        origin_id = self.origin.id
        outcomes: list = []  # per line: (line number, PendingEvent | Rejected)
        for k, line in enumerate(lines):
            n = first + k
            if line is None:
                outcomes.append((n, Rejected("invalid", f"line longer than max_message_length "
                                                        f"({self.settings.max_message_length} bytes)")))
                continue
            problem = problems[k] if problems is not None else None
            if problem is not None:
                outcomes.append((n, Rejected.from_wire(problem)))
                continue
            try:
                if problems is None:
                    ev = parse_event(orjson.loads(line))
                else:  # checked by a worker already (check_line): its shape is known to be right
                    d = orjson.loads(line)
                    ev = Event(d["id"], d["pubkey"], d["created_at"], d["kind"], d["tags"], d["content"], d["sig"])
                expiration = admit(self.origin, ev, self.settings, now)
            except orjson.JSONDecodeError:
                outcomes.append((n, Rejected("invalid", "not a JSON object")))
                continue
            except InvalidEvent as exc:
                outcomes.append((n, Rejected("invalid", exc.reason)))
                continue
            except Rejected as exc:
                outcomes.append((n, exc))
                continue
            outcomes.append((n, PendingEvent(origin_id, ev, ev.to_json(), expiration, now, None, {})))
        self._pending.extend(outcomes)
        if len(self._pending) >= COMMIT_LINES:
            self._flush()

    def _commit_loop(self) -> None:
        from appliance.store.transfer import store_imported

        while True:
            outcomes = self._queue.get()
            if outcomes is None:
                return
            if self._failed is not None:
                continue  # drain: the feeder stops at its next chunk
            pending = [o for _n, o in outcomes if not isinstance(o, Rejected)]
            try:
                results = iter(self.store.write_sync(lambda conn: store_imported(conn, pending)) if pending else ())
            except BaseException as exc:  # noqa: BLE001 - the database failed: the import stops
                self._failed = exc
                continue
            counts = self.counts
            for n, outcome in outcomes:
                counts.read += 1
                result = outcome if isinstance(outcome, Rejected) else next(results)
                if isinstance(result, AlreadyStored):
                    counts.duplicate += 1
                elif isinstance(result, BaseException):
                    counts.rejected += 1
                    reason = result.wire if isinstance(result, Rejected) else str(result)
                    print(f"import: line {n}: {reason}", file=self.err)
                else:
                    counts.stored += 1
            self._progress()

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_SECONDS:
            self._last_progress = now
            c = self.counts
            rate = c.read / max(now - self._started, 1e-9)
            print(f"import: progress: {c.read:,} lines, {c.stored:,} stored, {c.duplicate:,} duplicate, "
                  f"{c.rejected:,} rejected ({rate:,.0f} lines/s)", file=self.err, flush=True)


def admit(origin, ev: Event, settings: Settings, now: int) -> int | None:
    """The rules of a publish that need no database, for an imported event (its id and signature
    already checked): its NIP-40 expiration, or Rejected. The relay's envelope limits and the
    origin's write policy on the event's author, id and kind apply; created_at bounds do not (an
    import carries history). Events whose acceptance depends on more than the events stored
    (NIP-29 group events, NIP-PL leases) are refused: they are accepted only when published."""
    from appliance.relay.groups import Groups
    from appliance.relay.marmot import MARMOT_KINDS, check_marmot_event

    kind = ev.kind
    if kind == AUTH_KIND or is_ephemeral(kind):
        raise Rejected("invalid", f"kind {kind} is ephemeral: never stored")
    if len(ev.tags) > settings.max_event_tags:
        raise Rejected("invalid", f"too many tags (max {settings.max_event_tags})")
    if len(ev.content) * 4 > settings.max_content_length and len(ev.content.encode()) > settings.max_content_length:
        raise Rejected("invalid", f"content too long (max {settings.max_content_length} bytes)")
    if kind in MARMOT_KINDS:
        check_marmot_event(ev)
    if ev.pubkey in origin.block:
        raise Rejected("blocked", "this pubkey is blocked here")
    if ev.id in origin.ban_events:
        raise Rejected("blocked", "this event is banned here")
    if kind in origin.block_kinds or (origin.allow_kinds and kind not in origin.allow_kinds):
        raise Rejected("blocked", f"kind {kind} is not accepted here")
    if origin.access_policy == "members":  # members only: an empty list admits nobody
        if ev.pubkey not in origin.allow:
            raise Rejected("restricted", "the event author is not a member")
    elif origin.allow and ev.pubkey not in origin.allow:
        raise Rejected("restricted", "this pubkey may not publish here")
    if Groups.wants(ev):
        raise Rejected("restricted", "group events are accepted only when published to the relay (membership rules)")
    if kind == LEASE_KIND:
        raise Rejected("restricted", "push leases are accepted only when published to the relay by their authors")
    try:
        expiration = event_expiration(ev)
    except InvalidEvent as exc:
        raise Rejected("invalid", exc.reason) from None
    if expiration is not None and expiration <= now:
        raise Rejected("invalid", "event has expired")
    return expiration


def run_import(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.commands import open_data

    importer = None
    try:
        with open_data(settings) as (store, registry):
            origin = pick_origin(store, registry, args.origin)
            importer = Importer(store, origin, settings, verify=not args.no_verify)
            counts = importer.run(sys.stdin.buffer)
    finally:
        if importer is not None:
            importer.close()
    print(counts.summary(), flush=True)
    return 0


# -- delete ---------------------------------------------------------------------------------------


def run_delete(args: argparse.Namespace, settings: Settings) -> int:
    from appliance.commands import open_data
    from appliance.store.transfer import Deletion, count_matching

    f = cli_filter(args.filter)
    if f.search is not None:
        raise UsageError("--filter: search is for REQ (ranked by relevance); delete selects by the other fields")
    with open_data(settings) as (store, registry):
        origin = pick_origin(store, registry, args.origin)
        now = int(time.time())
        if args.dry_run:
            n = store.read_sync(lambda conn: count_matching(conn, origin.id, f, now))
            print(f"delete: would delete {n} events")
            return 0
        deletion = Deletion(origin.id, f, now)
        while not deletion.done:
            store.write_sync(deletion.step)
        print(f"delete: deleted {deletion.deleted} events")
    return 0
