"""`appliance sync URL`: NIP-77 negentropy against another relay, then the missing events each way.

The records compared here are the events at the origin that the filter selects and that anyone
may read there (`can_read` for a reader who is not authenticated, as REQ applies it): direct
messages, gift wraps, push leases and private groups' events never leave through a sync.

Fetched events ("down") are stored as the relay stores a published EVENT, by the relay's own
acceptance path over this data directory: the size and time limits, the origin's write policy
(as if the author had authenticated: blocked pubkeys and kinds, members-only origins admit their
members' events), the signature, NIP-01/09/40 (replacement, deletions, expiration) and NIP-29's
group rules. What it refuses is counted and named on stderr, never stored. It works with the
server running or not (SQLite's WAL lets the two write in turn); the running server's live
subscribers are not sent what the sync stored. Events we have and the other relay lacks ("up")
are published there one EVENT each, at most UP_WINDOW awaiting their OK.

Prints a progress bar on stderr and, last, `sync: have N, need M, fetched F, sent S` on stdout:
N ids only here, M only there; F events stored here, S accepted there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlsplit

import orjson

from appliance.errors import AlreadyStored, ConfigError, Rejected
from appliance.nostr.event import InvalidEvent, is_ephemeral, parse_event
from appliance.nostr.filters import InvalidFilter, parse_filter
from appliance.nostr.negentropy import Negentropy, NegentropyError, Storage, TooManyRecords
from appliance.settings import Settings

DIRECTIONS = ("down", "up", "both", "none")
# Our messages' frame size limit (bytes before hex): what strfry's sync uses, so that each
# NEG-MSG fits a relay's usual 128 KiB message limit.
FRAME_SIZE_LIMIT = 60_000
FETCH_BATCH = 100  # ids per REQ for missing events (well under common max_filter_values)
UP_WINDOW = 100  # EVENTs awaiting their OK at once
MAX_FRAME = 64 * 1024 * 1024  # largest message taken from the other relay
REPLY_TIMEOUT = 120.0  # seconds without a message from the other relay before giving up
RATE_LIMIT_RETRIES = 20
SUB_ID = "sync"


class SyncError(Exception):
    """The sync cannot go on: one line for the operator."""


def add_parser(sub, add_setting_flags) -> None:
    p = sub.add_parser(
        "sync", help="Reconcile events with another relay (NIP-77 negentropy), then copy the differences.",
        description="Find which events this relay and another have that the other lacks (NIP-77 negentropy; "
        "the other relay must support it, as strfry does), then fetch what is missing here (down) and "
        "publish what is missing there (up). Only events anyone may read are compared and sent. Prints a "
        "progress bar on stderr and `sync: have N, need M, fetched F, sent S` (have: only here, need: only "
        "there) on stdout. Runs with the server running or stopped.")
    p.add_argument("url", help="The other relay's ws:// or wss:// URL.")
    p.add_argument("--filter", default="{}", metavar="JSON",
                   help="One NIP-01 filter object selecting the events to sync (default: all).")
    p.add_argument("--dir", default="both", choices=DIRECTIONS, dest="direction",
                   help="down: fetch what is missing here; up: publish what is missing there; both (default); "
                   "none: only count the differences.")
    p.add_argument("--origin", metavar="URL",
                   help="The origin (community) whose events are synced (default: the default origin).")
    add_setting_flags(p)


def run(args: argparse.Namespace, settings: Settings) -> int:
    url = _check_url(args.url)
    raw_filter = _check_filter(args.filter, settings)
    return asyncio.run(sync(settings, url, raw_filter, args.direction, args.origin))


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ConfigError("url", url, "expected the other relay's ws:// or wss:// URL")
    return url


def _check_filter(text: str, settings: Settings) -> dict:
    try:
        obj = json.loads(text)
    except ValueError:
        raise ConfigError("--filter", text, "not JSON: give one filter object, such as '{\"kinds\": [1]}'") from None
    if not isinstance(obj, dict):
        raise ConfigError("--filter", text, "give one filter object (NIP-77 syncs one filter), not a list")
    try:
        parse_filter(obj, max_values=settings.max_filter_values, max_limit=settings.negentropy_max_records + 1)
    except InvalidFilter as exc:
        raise ConfigError("--filter", text, exc.reason) from None
    return obj


async def sync(settings: Settings, url: str, raw_filter: dict, direction: str, origin_url: str | None) -> int:
    err = sys.stderr
    from appliance.commands import find_origin, open_data

    with open_data(settings) as (store, registry):
        origin = find_origin(registry, origin_url) if origin_url else _default_origin(store, registry)
        progress = Progress(err)
        try:
            progress.cpu0, progress.wall0 = time.process_time(), time.monotonic()
            storage = _local_records(settings, store, origin, raw_filter)
            progress.note(f"sync: {storage.n} events here at {origin.origin} match the filter")
            await _reconcile_with(url, raw_filter, storage, progress, direction, store, origin, settings, registry)
        except SyncError as exc:
            progress.done()
            print(f"appliance sync: {exc}", file=err)
            return 1
    return 0


def _default_origin(store, registry):
    from appliance.origin_config import default_origin_id

    return registry.by_id(store.read_sync(default_origin_id))


def _local_records(settings: Settings, store, origin, raw_filter: dict) -> Storage:
    """The negentropy records of the events here that the filter selects and anyone may read."""
    from appliance.relay.authz import may_enter
    from appliance.store.events import negentropy_rows

    f = parse_filter(raw_filter, max_values=settings.max_filter_values, max_limit=settings.negentropy_max_records + 1)
    if not may_enter(origin, None):
        raise SyncError(f"{origin.origin} is members-only: its events are not synced")
    scope = _public_scope(store, origin)
    limit = settings.negentropy_max_records
    now = int(time.time())
    try:
        return store.read_sync(
            lambda conn: Storage.from_rows(negentropy_rows(conn, origin.id, f, scope, now, limit + 1), limit))
    except TooManyRecords:
        raise SyncError(f"the filter selects more than {limit} events here (negentropy_max_records): narrow it, "
                        "for example with since/until") from None


def _public_scope(store, origin):
    """`can_read` for a reader who is not authenticated, as SQL (see appliance.relay.authz)."""
    from appliance.relay.authz import read_scope
    from appliance.relay.groups import GroupState

    state = GroupState()
    store.read_sync(state.load)
    return read_scope(origin, None, state)


async def _reconcile_with(url, raw_filter, storage, progress, direction, store, origin, settings, registry):
    import websockets

    try:
        ws = await asyncio.wait_for(websockets.connect(url, max_size=MAX_FRAME, open_timeout=30), 60)
    except (OSError, asyncio.TimeoutError, websockets.exceptions.WebSocketException) as exc:
        raise SyncError(f"cannot connect to {url}: {exc or type(exc).__name__}") from None
    peer = Peer(ws, progress)
    try:
        have, need, rounds = await peer.reconcile(raw_filter, storage)
        fetched = sent = 0
        if direction in ("down", "both") and need:
            fetched = await Fetcher(settings, store, registry, origin, peer, progress).run(need)
        if direction in ("up", "both") and have:
            sent = await peer.publish(_raws(store, origin, have), len(have))
        progress.done()
        print(f"sync: have {len(have)}, need {len(need)}, fetched {fetched}, sent {sent}", flush=True)
    finally:
        await ws.close()


def _raws(store, origin, ids: list[bytes]):
    """The stored JSON of each id, in batches read from the store as they are sent."""
    from appliance.store.events import event_raw

    for i in range(0, len(ids), 500):
        batch = [x.hex() for x in ids[i:i + 500]]
        raws = store.read_sync(lambda conn: [event_raw(conn, origin.id, eid) for eid in batch])
        for eid, raw in zip(batch, raws):
            yield eid, raw  # None: deleted or replaced since it was counted


class Peer:
    """The other relay, over one websocket: its messages read by one task, answers routed."""

    def __init__(self, ws, progress: "Progress"):
        self.ws = ws
        self.progress = progress
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for text in self.ws:
                try:
                    msg = orjson.loads(text)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(msg, list) and msg and isinstance(msg[0], str):
                    await self.inbox.put(msg)
        except Exception:
            pass
        await self.inbox.put(None)  # the connection ended

    async def next(self) -> list:
        try:
            msg = await asyncio.wait_for(self.inbox.get(), REPLY_TIMEOUT)
        except asyncio.TimeoutError:
            raise SyncError(f"the other relay sent nothing for {REPLY_TIMEOUT:g} s") from None
        if msg is None:
            raise SyncError("the other relay closed the connection")
        return msg

    async def send(self, msg) -> None:
        await self.ws.send(msg if isinstance(msg, str) else orjson.dumps(msg).decode())

    async def reconcile(self, raw_filter: dict, storage: Storage) -> tuple[list[bytes], list[bytes], int]:
        ne = Negentropy(storage, FRAME_SIZE_LIMIT)
        first = ne.initiate()
        self.sent_bytes, self.received = len(first), 0  # negentropy bytes, before hex encoding
        await self.send(["NEG-OPEN", SUB_ID, raw_filter, first.hex()])
        have: dict[bytes, None] = {}  # a frame size limit may report an id twice
        need: dict[bytes, None] = {}
        rounds = 0
        answered = False
        while True:
            msg = await self.next()
            verb = msg[0]
            if verb == "NEG-MSG" and len(msg) >= 3 and msg[1] == SUB_ID and isinstance(msg[2], str):
                answered = True
                rounds += 1
                try:
                    reply, h, n = ne.reconcile_client(bytes.fromhex(msg[2]))
                except (ValueError, NegentropyError) as exc:
                    raise SyncError(f"the other relay's negentropy message is not valid: {exc}") from None
                have.update(dict.fromkeys(h))
                need.update(dict.fromkeys(n))
                self.progress.show("reconciling", rounds, None, f"have {len(have)}, need {len(need)}")
                self.received += len(msg[2]) // 2
                if reply is None:
                    await self.send(["NEG-CLOSE", SUB_ID])
                    p = self.progress
                    p.note(f"sync: reconciled {storage.n} records in {rounds} round(s): "
                           f"{time.monotonic() - p.wall0:.2f} s, CPU {time.process_time() - p.cpu0:.2f} s, "
                           f"{self.sent_bytes} bytes sent, {self.received} received")
                    return list(have), list(need), rounds
                self.sent_bytes += len(reply)
                await self.send(["NEG-MSG", SUB_ID, reply.hex()])
            elif verb == "NEG-ERR" and len(msg) >= 3 and msg[1] == SUB_ID:
                raise SyncError(f"the other relay refused the sync: {msg[2]}")
            elif verb == "NOTICE" and len(msg) >= 2:
                self.progress.note(f"sync: NOTICE from the other relay: {str(msg[1])[:300]}")
                if not answered and _sounds_like_error(str(msg[1])):
                    raise SyncError("the other relay answered NEG-OPEN with an error NOTICE: it likely does not "
                                    "support NIP-77 negentropy")
            elif verb == "CLOSED" and len(msg) >= 2 and msg[1] == SUB_ID:
                raise SyncError(f"the other relay refused the sync: {msg[2] if len(msg) > 2 else ''}")

    async def fetch(self, ids: list[str]) -> list[dict]:
        """The events of `ids` the other relay sends for one REQ (up to its EOSE)."""
        sub = "f" + str(id(ids) % 10_000_000)
        await self.send(["REQ", sub, {"ids": ids, "limit": len(ids)}])
        wanted = set(ids)
        got = []
        while True:
            msg = await self.next()
            if msg[0] == "EVENT" and len(msg) >= 3 and msg[1] == sub and isinstance(msg[2], dict):
                if msg[2].get("id") in wanted:
                    got.append(msg[2])
            elif msg[0] == "EOSE" and len(msg) >= 2 and msg[1] == sub:
                await self.send(["CLOSE", sub])
                return got
            elif msg[0] == "CLOSED" and len(msg) >= 2 and msg[1] == sub:
                reason = msg[2] if len(msg) > 2 else ""
                if str(reason).startswith("rate-limited:"):
                    await asyncio.sleep(1.0)
                    return await self.fetch(ids)
                raise SyncError(f"the other relay refused to send events: {reason}")

    async def publish(self, raws, total: int) -> int:
        """Send each (id, raw) as an EVENT; how many the other relay accepted."""
        sent = failed = 0
        refusals: dict[str, int] = {}
        pending: dict[str, tuple[str, int]] = {}  # id -> (raw, attempts)
        retry: list[str] = []
        source = iter(raws)
        exhausted = False
        done = 0
        while True:
            while not exhausted and len(pending) < UP_WINDOW and not retry:
                try:
                    eid, raw = next(source)
                except StopIteration:
                    exhausted = True
                    break
                if raw is None:
                    done += 1
                    continue
                pending[eid] = (raw, 0)
                await self.send('["EVENT",' + raw + "]")
            if not pending:
                break
            msg = await self.next()
            if msg[0] != "OK" or len(msg) < 3 or msg[1] not in pending:
                continue
            eid = msg[1]
            raw, attempts = pending[eid]
            message = str(msg[3]) if len(msg) > 3 else ""
            if msg[2] is True:
                sent += 1
            elif message.startswith("rate-limited:") and attempts < RATE_LIMIT_RETRIES:
                pending[eid] = (raw, attempts + 1)
                await asyncio.sleep(min(2.0, 0.1 * 2 ** attempts))
                await self.send('["EVENT",' + raw + "]")
                continue
            else:
                failed += 1
                reason = message.split(":", 1)[0] or "refused"
                refusals[reason] = refusals.get(reason, 0) + 1
                if failed <= 5:
                    self.progress.note(f"sync: the other relay refused {eid}: {message}")
            del pending[eid]
            done += 1
            self.progress.show("sending", done, total, f"sent {sent}")
        if failed:
            self.progress.note(f"sync: the other relay refused {failed} events ("
                               + ", ".join(f"{n} {r}" for r, n in sorted(refusals.items())) + ")")
        return sent


class Fetcher:
    """Fetches the missing events and stores them as a published EVENT is stored."""

    def __init__(self, settings, store, registry, origin, peer: Peer, progress: "Progress"):
        self.settings = settings
        self.store = store
        self.origin = origin
        self.peer = peer
        self.progress = progress
        self.relay, self.groups_wanted = _local_relay(settings, store, registry)

    async def run(self, need: list[bytes]) -> int:
        from appliance.relay.authz import AUTHOR_ONLY_KINDS

        total = len(need)
        stored = refused = received = 0
        reasons: dict[str, int] = {}
        group_events = False
        ids = [x.hex() for x in need]
        for i in range(0, total, FETCH_BATCH):
            batch = ids[i:i + FETCH_BATCH]
            events = await self.peer.fetch(batch)
            received += len(events)
            outcomes = await asyncio.gather(*(self._store(obj, AUTHOR_ONLY_KINDS) for obj in events))
            for obj, outcome in zip(events, outcomes):
                if outcome is None:
                    stored += 1
                    group_events = group_events or self.groups_wanted(obj)
                else:
                    refused += 1
                    reason = outcome.split(":", 1)[0]
                    reasons[reason] = reasons.get(reason, 0) + 1
                    if refused <= 5:
                        self.progress.note(f"sync: not stored {obj.get('id')}: {outcome}")
            self.progress.show("fetching", min(i + FETCH_BATCH, total), total, f"stored {stored}")
        if refused:
            self.progress.note(f"sync: {refused} fetched events not stored ("
                               + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())) + ")")
        if received < total:
            self.progress.note(f"sync: the other relay sent {received} of the {total} events it had listed "
                               "(deleted or expired since, or not for us to read)")
        if group_events:
            # The running server reloads its groups from the database (see Upkeep.reload_if_changed).
            from appliance.store.meta import bump_generation

            self.store.write_sync(bump_generation)
        return stored

    async def _store(self, obj: dict, author_only) -> str | None:
        """None once stored, else why not (a NIP-01 OK message)."""
        try:
            ev = parse_event(obj)
        except InvalidEvent as exc:
            return f"invalid: {exc.reason}"
        if ev.kind in author_only:
            return "blocked: push leases are accepted from their author only"
        if is_ephemeral(ev.kind):
            return "invalid: ephemeral events are not stored"
        try:
            # As published by its author: the origin's write policy judges the author.
            await self.relay.publish(self.origin, ev.pubkey, ev)
        except AlreadyStored:
            return None
        except Rejected as exc:
            return exc.wire
        return None


def _local_relay(settings, store, registry):
    """The relay's acceptance path over this data directory, without serving (see app.build):
    the relay with the NIP-29 group rules as its store hook. Also returns whether an event is one
    the group rules look at."""
    from appliance.relay.groups import DEFAULT_H_GRAMMAR, Groups, GroupState, RelayKeys
    from appliance.relay.relay import Relay
    from appliance.store.keyfile import KeyFile

    state = GroupState()
    store.read_sync(state.load)
    groups = Groups(state, RelayKeys(KeyFile.for_store(settings.data_path, store)),
                    h_grammar=lambda origin_id: registry.by_id(origin_id).push.get("h_grammar", DEFAULT_H_GRAMMAR))
    relay = Relay(settings=settings, store=store, origins=registry, groups=state)
    relay.store_hooks.add_check(groups.check, wants=groups.wants)
    relay.ephemeral_checks.append(groups.check_ephemeral)

    def wanted(obj: dict) -> bool:
        try:
            return groups.wants(parse_event(obj))
        except InvalidEvent:
            return False

    return relay, wanted


def _sounds_like_error(text: str) -> bool:
    lower = text.lower()
    return any(w in lower for w in ("error", "invalid", "unknown", "unsupported", "unrecognized", "disabled"))


class Progress:
    """One line on stderr redrawn in place: the phase, a bar when the total is known, counts."""

    WIDTH = 30

    def __init__(self, err):
        self.err = err
        self.last = 0.0
        self.shown = False
        self.width = 0  # of the line shown (a shorter one is padded over it)
        self.phase = ""
        self.cpu0 = self.wall0 = 0.0  # when the sync began (the reconciliation's figures)

    def show(self, phase: str, done: int, total: int | None, extra: str = "") -> None:
        now = time.monotonic()
        final = total is not None and done >= total
        if now - self.last < 0.1 and not final:
            return
        self.last = now
        if self.shown and phase != self.phase:
            self.done()  # each phase keeps its last line
        self.phase = phase
        if total:
            filled = int(self.WIDTH * min(done, total) / total)
            bar = "[" + "#" * filled + "-" * (self.WIDTH - filled) + f"] {done}/{total}"
        else:
            bar = f"round {done}"
        line = f"{phase:<12} {bar} {extra}"
        self.err.write("\r" + line.ljust(self.width))
        self.width = len(line)
        self.err.flush()
        self.shown = True

    def note(self, line: str) -> None:
        self.done()
        print(line, file=self.err, flush=True)

    def done(self) -> None:
        if self.shown:
            self.err.write("\n")
            self.err.flush()
            self.shown = False
            self.width = 0
