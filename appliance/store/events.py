"""Event storage rules in SQL: NIP-01 replacement, NIP-09 deletion, NIP-40 expiry, filter queries.

Every function takes a store connection (store.interface); writes run inside the writer's transaction, reads on a
reader connection. SQL text lives in module constants, but a filter's statements, which the builders
below write in the connection's dialect (statement.Dialect); values are always bound, never formatted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, islice
from operator import itemgetter
from typing import Callable, Iterable

import orjson

from appliance.errors import AlreadyStored, Rejected
from appliance.nostr.event import Event, is_addressable, is_event_id, is_replaceable
from appliance.nostr.filters import Filter
from appliance.store import search
from appliance.store.interface import Connection
from appliance.store.statement import POSTGRES, SQL, SQLITE, Dialect, dialect_of

# NIP-PL, Lease and Key Lifecycle: "relays MUST ignore deletion requests targeting this kind".
UNDELETABLE_KINDS = frozenset({30350})
DELETION_KIND = 5
# Marmot group messages: their `h` tag is an MLS group id, not a NIP-29 group (no `grp`).
GROUP_MESSAGE_KIND = 445


def group_of(ev: Event) -> str | None:
    """The NIP-29 group an event is filed under (the `grp` column): its h tag, except for kinds
    whose h tag names something else."""
    return None if ev.kind == GROUP_MESSAGE_KIND else ev.first_tag("h")



@dataclass(frozen=True)
class ReadScope:
    """What a reader may see, as the store needs it to build SQL.

    Built by the relay's read-authorization module, which owns the rules; the store only translates.
    """

    reader: str | None
    gated_kinds: frozenset[int]  # readable by the author and p-tagged recipients only
    author_only_kinds: frozenset[int]  # readable by the author only
    hidden_groups: frozenset[str] = frozenset()  # groups whose events this reader may not read


@dataclass
class StoreResult:
    """What happened to one submitted event (only returned when accepted)."""

    message: str = ""
    replaced: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


Hook = Callable[[Connection, int, Event, dict], None]
# Before the `stored` hooks of events written together: (conn, origin, [(event, context), ...]).
BatchHook = Callable[[Connection, int, list], None]


@dataclass
class WriteHooks:
    """Extension points that run inside the writer transaction of an event.

    `check` hooks run before the event is stored and may raise `Rejected`; `stored` hooks run right
    after the rows are written (the "event stored" hook): rows they add commit atomically with the
    event. Keyed hooks apply to one kind; `check_any` hooks apply to all. Every hook receives the
    per-event `context` dict the caller passed (for example a lease's decrypted plaintext).
    """

    check: dict[int, list[Hook]] = field(default_factory=dict)
    check_any: list[Hook] = field(default_factory=list)
    stored: list[Hook] = field(default_factory=list)
    # For each check_any hook, which events it needs to see (None: all of them).
    check_wants: list[Callable[[Event], bool] | None] = field(default_factory=list)
    # Run once for the events of one origin written together (the batched path), before their
    # `stored` hooks: to do at once what those would do each (the push matcher's endpoint locks).
    stored_batch: list[BatchHook] = field(default_factory=list)

    def add_check(self, hook: Hook, kind: int | None = None, wants: Callable[[Event], bool] | None = None) -> None:
        """Add a check hook for one kind, or for every event `wants` selects (all when None)."""
        if kind is None:
            self.check_any.append(hook)
            self.check_wants.append(wants)
        else:
            self.check.setdefault(kind, []).append(hook)

    def checks_event(self, ev: Event) -> bool:
        """Whether any check hook must see `ev` (such events take the one-by-one write path)."""
        if ev.kind in self.check:
            return True
        return any(wants is None or wants(ev) for wants in self.check_wants)

    def add_stored(self, hook: Hook) -> None:
        self.stored.append(hook)

    def add_stored_batch(self, hook: BatchHook) -> None:
        self.stored_batch.append(hook)


SQL_EXISTS_ID = SQL("SELECT 1 FROM events WHERE origin = ? AND id = ?",
                    "SELECT 1 FROM events WHERE origin = %s AND id = %s")
SQL_DELETED_ID = SQL("SELECT 1 FROM deletions WHERE origin = ? AND target = ? AND pubkey = ?",
                     "SELECT 1 FROM deletions WHERE origin = %s AND target = %s AND pubkey = %s")
SQL_DELETED_ADDR = SQL("SELECT 1 FROM deletions WHERE origin = ? AND target = ? AND pubkey = ? AND created_at >= ?",
                       "SELECT 1 FROM deletions WHERE origin = %s AND target = %s AND pubkey = %s AND created_at >= %s")
SQL_ADDRESS = SQL("SELECT rowid, id, created_at FROM events WHERE origin = ? AND pubkey = ? AND kind = ? AND d = ?",
                  "SELECT rowid, id, created_at FROM events WHERE origin = %s AND pubkey = %s AND kind = %s AND d = %s")
SQL_INSERT_EVENT = SQL(
    "INSERT INTO events (origin, id, pubkey, created_at, kind, d, grp, expiration, raw) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "INSERT INTO events (origin, id, pubkey, created_at, kind, d, grp, expiration, raw) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING rowid",
    returns_id=True,
)
SQL_INSERT_TAG = SQL("INSERT INTO tags (event, origin, name, value, created_at, kind) VALUES (?, ?, ?, ?, ?, ?)",
                     "INSERT INTO tags (event, origin, name, value, created_at, kind) VALUES (%s, %s, %s, %s, %s, %s)")
SQL_DELETE_ROW = SQL("DELETE FROM events WHERE rowid = ?", "DELETE FROM events WHERE rowid = %s")
SQL_DELETE_TAGS = SQL("DELETE FROM tags WHERE event = ?", "DELETE FROM tags WHERE event = %s")
SQL_ROW_BY_ID = SQL("SELECT rowid, pubkey, kind FROM events WHERE origin = ? AND id = ?",
                    "SELECT rowid, pubkey, kind FROM events WHERE origin = %s AND id = %s")
SQL_ROWS_BY_ADDR = SQL(
    "SELECT rowid, id, kind FROM events WHERE origin = ? AND pubkey = ? AND kind = ? AND d = ? AND created_at <= ?",
    "SELECT rowid, id, kind FROM events WHERE origin = %s AND pubkey = %s AND kind = %s AND d = %s "
    "AND created_at <= %s",
)
SQL_RECORD_DELETION = SQL(
    "INSERT INTO deletions (origin, target, pubkey, created_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (origin, target, pubkey) DO UPDATE SET created_at = max(created_at, excluded.created_at)",
    "INSERT INTO deletions (origin, target, pubkey, created_at) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (origin, target, pubkey) DO UPDATE SET created_at = GREATEST(deletions.created_at, "
    "excluded.created_at)",
)
SQL_EXPIRED_ROWS = SQL("SELECT rowid FROM events WHERE expiration IS NOT NULL AND expiration <= ? LIMIT ?",
                       "SELECT rowid FROM events WHERE expiration IS NOT NULL AND expiration <= %s LIMIT %s")


def address_rows(conn: Connection, origin: int, pubkey: str, kind: int, d: str) -> list[tuple[int, str, int]]:
    """(rowid, id, created_at) of what is stored at an addressable coordinate."""
    return conn.execute(SQL_ADDRESS, (origin, pubkey, kind, d)).fetchall()


def address_key(ev: Event) -> str | None:
    """The `d` column: '' for replaceable kinds, the d tag for addressable ones, else NULL."""
    if is_replaceable(ev.kind):
        return ""
    if is_addressable(ev.kind):
        return ev.first_tag("d") or ""
    return None


def coordinate(kind: int, pubkey: str, d: str) -> str:
    return f"{kind}:{pubkey}:{d}"


def delete_row(conn: Connection, rowid: int) -> None:
    conn.execute(SQL_DELETE_TAGS, (rowid,))
    conn.execute(SQL_DELETE_ROW, (rowid,))


def store_event(
    conn: Connection,
    origin: int,
    ev: Event,
    *,
    raw: str,
    expiration: int | None,
    now: int,
    hooks: WriteHooks | None = None,
    context: dict | None = None,
    grp: str | None = None,
) -> StoreResult:
    """Store one verified event under NIP-01/09/40 rules; raise Rejected to refuse it.

    `grp` files the event under a group other than its h tag (relay-signed group snapshots).
    Hooks may leave `after_commit` callables and `broadcast` events in the context; the caller
    runs/sends them once the transaction committed (`result.extra` is that context).
    """
    # A kind with its own ordered acceptance rules (a keyed check hook: NIP-PL leases) decides what
    # an identical resend is told (NIP-PL step 8: `stale replacement`); the duplicate check then
    # follows its hooks instead of preceding them.
    own_rules = hooks is not None and ev.kind in hooks.check
    if not own_rules and conn.execute(SQL_EXISTS_ID, (origin, ev.id)).fetchone():
        raise AlreadyStored()
    if expiration is not None and expiration <= now:
        raise Rejected("invalid", "event has expired")
    d = address_key(ev)
    if ev.kind not in UNDELETABLE_KINDS:  # deletion requests are ignored for these, recorded or not
        if conn.execute(SQL_DELETED_ID, (origin, ev.id, ev.pubkey)).fetchone():
            raise Rejected("blocked", "this event was deleted by its author")
        if d is not None and conn.execute(
            SQL_DELETED_ADDR, (origin, coordinate(ev.kind, ev.pubkey, d), ev.pubkey, ev.created_at)
        ).fetchone():
            raise Rejected("blocked", "this address was deleted by its author")

    ctx = {} if context is None else context
    if hooks is not None:
        for hook in hooks.check_any:
            hook(conn, origin, ev, ctx)
        for hook in hooks.check.get(ev.kind, ()):
            hook(conn, origin, ev, ctx)
    if own_rules and conn.execute(SQL_EXISTS_ID, (origin, ev.id)).fetchone():
        raise AlreadyStored()

    result = StoreResult()
    if d is not None:
        for rowid, old_id, old_created in conn.execute(SQL_ADDRESS, (origin, ev.pubkey, ev.kind, d)).fetchall():
            # NIP-01: the newer created_at wins; on a tie the lowest id wins.
            if old_created > ev.created_at or (old_created == ev.created_at and old_id < ev.id):
                raise Rejected("duplicate", "a newer version of this event is already stored")
            delete_row(conn, rowid)
            result.replaced.append(old_id)

    if ev.kind == DELETION_KIND:
        result.deleted = _apply_deletion(conn, origin, ev)

    if grp is None:
        grp = group_of(ev)
    conn.execute(
        SQL_INSERT_EVENT,
        (origin, ev.id, ev.pubkey, ev.created_at, ev.kind, d, grp, expiration, raw),
    )
    rowid = conn.last_insert_rowid()
    conn.executemany(SQL_INSERT_TAG, _tag_rows(rowid, origin, ev))

    if hooks is not None:
        for hook in hooks.stored:
            hook(conn, origin, ev, ctx)
    result.extra = ctx
    return result


def _tag_rows(rowid: int, origin: int, ev: Event) -> Iterable[tuple]:
    """One index row per distinct single-letter (name, value): every one, or `#x` queries and the
    recipient check of gated kinds would disagree with live matching. The relay bounds the count
    (max_event_tags) before an event gets here."""
    seen: set[tuple[str, str]] = set()
    for tag in ev.tags:
        if len(tag) >= 2 and len(tag[0]) == 1:
            key = (tag[0], tag[1])
            if key not in seen:
                seen.add(key)
                yield (rowid, origin, tag[0], tag[1], ev.created_at, ev.kind)


def _apply_deletion(conn: Connection, origin: int, ev: Event) -> list[str]:
    """NIP-09: delete the author's own events named by `e` and `a` tags; remember the targets."""
    deleted: list[str] = []
    for tag in ev.tags:
        if len(tag) < 2:
            continue
        if tag[0] == "e":
            target = tag[1]
            if not is_event_id(target):
                continue  # an `e` tag names an event id; coordinates belong in `a` tags
            row = conn.execute(SQL_ROW_BY_ID, (origin, target)).fetchone()
            if row is not None:
                rowid, pubkey, kind = row
                if pubkey != ev.pubkey or kind in UNDELETABLE_KINDS or kind == DELETION_KIND:
                    continue
                delete_row(conn, rowid)
                deleted.append(target)
            conn.execute(SQL_RECORD_DELETION, (origin, target, ev.pubkey, ev.created_at))
        elif tag[0] == "a":
            parts = tag[1].split(":", 2)
            if len(parts) != 3 or parts[1] != ev.pubkey or not parts[0].isdigit():
                continue  # only the author's own addresses
            kind = int(parts[0])
            if kind in UNDELETABLE_KINDS or not (is_replaceable(kind) or is_addressable(kind)):
                continue
            for rowid, old_id, _k in conn.execute(
                SQL_ROWS_BY_ADDR, (origin, ev.pubkey, kind, parts[2], ev.created_at)
            ).fetchall():
                delete_row(conn, rowid)
                deleted.append(old_id)
            conn.execute(SQL_RECORD_DELETION, (origin, tag[1], ev.pubkey, ev.created_at))
    return deleted


# -- the batched write path ---------------------------------------------------------------------
#
# Most events are regular, carry no group and interest no check hook. Writing them one statement
# at a time costs the writer thread a round trip through the GIL per statement, which it then
# waits to get back from the busy event loop. This path writes a whole run of such events with a
# handful of statements (json_each over the batch) and stays equivalent to store_event.

SQL_EXISTING_IDS = SQL(
    "SELECT id FROM events WHERE origin = ? AND id IN (SELECT value FROM json_each(?))",
    "SELECT id FROM events WHERE origin = %s AND id IN (SELECT value FROM jsonb_array_elements_text(%s::jsonb))",
)
SQL_DELETED_IDS = SQL(
    "SELECT target, pubkey FROM deletions WHERE origin = ? AND target IN (SELECT value FROM json_each(?))",
    "SELECT target, pubkey FROM deletions WHERE origin = %s AND target IN (SELECT value "
    "FROM jsonb_array_elements_text(%s::jsonb))",
)
SQL_INSERT_EVENTS = SQL(
    "INSERT INTO events (origin, id, pubkey, created_at, kind, d, grp, expiration, raw) "
    "SELECT ?, j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, NULL, NULL, j.value ->> 4, j.value ->> 5 "
    "FROM json_each(?) j",
    # PostgreSQL: ->> gives text, cast to the integer columns
    "INSERT INTO events (origin, id, pubkey, created_at, kind, d, grp, expiration, raw) "
    "SELECT %s, j.value ->> 0, j.value ->> 1, (j.value ->> 2)::bigint, (j.value ->> 3)::bigint, NULL, NULL, "
    "(j.value ->> 4)::bigint, j.value ->> 5 FROM jsonb_array_elements(%s::jsonb) j",
)
SQL_INSERT_TAGS = SQL(
    "INSERT INTO tags (event, origin, name, value, created_at, kind) "
    "SELECT e.rowid, e.origin, t.value ->> 1, t.value ->> 2, e.created_at, e.kind "
    "FROM json_each(?) t CROSS JOIN events e ON e.origin = ? AND e.id = t.value ->> 0",  # CROSS: json_each outer
    "INSERT INTO tags (event, origin, name, value, created_at, kind) "
    "SELECT e.rowid, e.origin, t.value ->> 1, t.value ->> 2, e.created_at, e.kind "
    "FROM jsonb_array_elements(%s::jsonb) t JOIN events e ON e.origin = %s AND e.id = t.value ->> 0",
)


def batchable(ev: Event, hooks: WriteHooks | None) -> bool:
    """Whether `ev` may take the batched write path."""
    return (
        not is_replaceable(ev.kind)
        and not is_addressable(ev.kind)
        and ev.kind != DELETION_KIND
        and group_of(ev) is None
        and (hooks is None or not hooks.checks_event(ev))
    )


@dataclass
class PendingEvent:
    """One event waiting in a batch, with everything store_event would be given."""

    origin: int
    ev: Event
    raw: str
    expiration: int | None
    now: int
    hooks: WriteHooks | None
    context: dict

    def __post_init__(self) -> None:
        self._given = dict(self.context)

    def fresh(self) -> dict:
        """The context as given, before a run: hooks fill it (`after_commit`, `broadcast`), and a
        run that is rolled back and done again (a batch that fell back to one by one, node locks
        taken again in order) must not leave them twice."""
        if self.context != self._given:
            self.context.clear()
            self.context.update(self._given)
        return self.context

    def __call__(self, conn: Connection) -> StoreResult:
        """The one-by-one path (also the fallback when a batch cannot be written together)."""
        self.fresh()
        return store_event(conn, self.origin, self.ev, raw=self.raw, expiration=self.expiration, now=self.now,
                           hooks=self.hooks, context=self.context)


def store_events_batch(conn: Connection, items: list["PendingEvent"]) -> list:
    """Store batchable events together; one StoreResult or Rejected per item, in order."""
    results: list = [None] * len(items)
    by_origin: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        item.fresh()
        if item.expiration is not None and item.expiration <= item.now:
            results[i] = Rejected("invalid", "event has expired")
        else:
            by_origin.setdefault(item.origin, []).append(i)
    for origin, idxs in by_origin.items():
        ids = orjson.dumps([items[i].ev.id for i in idxs]).decode()
        existing = {row[0] for row in conn.execute(SQL_EXISTING_IDS, (origin, ids))}
        deleted = set(conn.execute(SQL_DELETED_IDS, (origin, ids)).fetchall())
        rows, tag_rows, accepted = [], [], []
        for i in idxs:
            ev = items[i].ev
            if ev.id in existing:
                results[i] = AlreadyStored()
                continue
            if (ev.id, ev.pubkey) in deleted:
                results[i] = Rejected("blocked", "this event was deleted by its author")
                continue
            existing.add(ev.id)  # a second copy later in the same batch is a duplicate
            rows.append((ev.id, ev.pubkey, ev.created_at, ev.kind, items[i].expiration, items[i].raw))
            for _rowid, _origin, name, value, _created, _kind in _tag_rows(0, origin, ev):
                tag_rows.append((ev.id, name, value))
            accepted.append(i)
        if rows:
            conn.execute(SQL_INSERT_EVENTS, (origin, orjson.dumps(rows).decode()))
            if tag_rows:
                conn.execute(SQL_INSERT_TAGS, (orjson.dumps(tag_rows).decode(), origin))
        hooks = items[accepted[0]].hooks if accepted else None
        if hooks is not None and hooks.stored_batch and all(items[i].hooks is hooks for i in accepted):
            run = [(items[i].ev, items[i].context) for i in accepted]
            for batch_hook in hooks.stored_batch:
                batch_hook(conn, origin, run)
        for i in accepted:
            item = items[i]
            if item.hooks is not None:
                for hook in item.hooks.stored:
                    hook(conn, origin, item.ev, item.context)
            results[i] = StoreResult(extra=item.context)
    return results


PendingEvent.run_batch = staticmethod(store_events_batch)  # the writer groups these


def delete_event(conn: Connection, origin: int, event_id: str) -> bool:
    """Delete one stored event by id (an operator's ban); whether it was stored."""
    row = conn.execute(SQL_ROW_BY_ID, (origin, event_id)).fetchone()
    if row is None:
        return False
    delete_row(conn, row[0])
    return True


def purge_expired(conn: Connection, now: int, batch: int = 1000) -> int:
    """Delete up to `batch` events whose NIP-40 expiration has passed."""
    rows = conn.execute(SQL_EXPIRED_ROWS, (now, batch)).fetchall()
    for (rowid,) in rows:
        delete_row(conn, rowid)
    return len(rows)


# -- reading -----------------------------------------------------------------------------------

# Tag letters preferred as the driving index, most selective first.
_TAG_PREFERENCE = ("e", "p", "a", "h", "d", "t")


def _in(d: Dialect, column: str, values: Iterable, params: list) -> str:
    values = list(values)
    params.extend(values)
    if len(values) == 1:
        return f"{column} = {d.mark}"
    return f"{column} IN ({d.marks(len(values))})"


def _scope_sql(d: Dialect, scope: ReadScope, now: int, params: list, *, kinds: frozenset[int] | None = None,
               kind_col: str = "e.kind", rowid_col: str = "e.rowid", row_read: bool = False,
               expired: bool = True) -> tuple[str, bool]:
    """The read-authorization rule as SQL (mirrors relay.authz.can_read), and whether it needs
    the event row `e` (its pubkey or group). `kinds` (the filter's own, when it names them) drops
    the clauses about kinds it cannot match; `kind_col`/`rowid_col` may name the tag index's copies
    of the event's kind and rowid, so a scan of that index needs no event row. `row_read`: the
    statement reads each event row `e` anyway (it selects the event). `expired`: False when the
    read's snapshot holds no expired event not purged yet (see `any_expired`)."""
    if row_read:
        # Expired events not purged yet: the row at hand says so, with no list of them built for
        # the statement (cheaper than the list below: docs/performance.md#expiry-in-a-read).
        clauses = [_FIXED[d.backend]["live"]]
        params.append(now)
    elif expired:
        # Expired events not purged yet, found through the partial index on expiration (a handful
        # at any time): the check needs no event row, so index-only scans (COUNT by kind) stay
        # index-only. It costs every row scanned a probe (docs/performance.md#expiry-in-a-read):
        # left out when there are none.
        clauses = [f"{rowid_col} NOT IN (SELECT rowid FROM events WHERE expiration IS NOT NULL AND "
                   f"expiration <= {d.mark})"]
        params.append(now)
    else:
        clauses = []
    needs_row = False

    def relevant(ks: frozenset[int]) -> list[int]:
        return sorted(ks if kinds is None else ks & kinds)

    gated = relevant(scope.gated_kinds)
    author_only = relevant(scope.author_only_kinds)
    if scope.reader is None:
        hidden = gated + author_only
        if hidden:
            clauses.append(f"{kind_col} NOT IN (" + ",".join(str(k) for k in hidden) + ")")
    else:
        if gated:
            clauses.append(
                f"({kind_col} NOT IN (" + ",".join(str(k) for k in gated) + f") OR e.pubkey = {d.mark} OR EXISTS "
                f"(SELECT 1 FROM tags g WHERE g.event = {rowid_col} AND g.name = 'p' AND g.value = {d.mark}))"
            )
            params.extend([scope.reader, scope.reader])
            needs_row = True
        if author_only:
            clauses.append(f"({kind_col} NOT IN (" + ",".join(str(k) for k in author_only) +
                           f") OR e.pubkey = {d.mark})")
            params.append(scope.reader)
            needs_row = True
    if scope.hidden_groups:
        clauses.append(f"(e.grp IS NULL OR e.grp NOT IN {d.json_values})")
        params.append(orjson.dumps(sorted(scope.hidden_groups)).decode())
        needs_row = True
    return " AND ".join(clauses) or "TRUE", needs_row


SQL_ANY_EXPIRED = SQL("SELECT 1 FROM events WHERE expiration IS NOT NULL AND expiration <= ? LIMIT 1",
                      "SELECT 1 FROM events WHERE expiration IS NOT NULL AND expiration <= %s LIMIT 1")


def any_expired(conn, now: int) -> bool:
    """Whether the read's snapshot holds an expired event not purged yet (one step down the
    partial index on expiration)."""
    return conn.execute(SQL_ANY_EXPIRED, (now,)).fetchone() is not None


def build_query(d: Dialect, origin: int, f: Filter, scope: ReadScope | None, now: int, limit: int, *,
                count: bool = False, rowids: bool = False, condition: bool = False, raw_bytes: bool = False,
                at_second: int | None = None, expired: bool = True, records: bool = False, ranked: bool = False):
    """SQL and bindings for one filter, in `d`'s text: pick the most selective index to drive the scan.
    `expired`: as for `_scope_sql`. `records`: (created_at, id) rows, see `negentropy_rows`.
    A filter with `search` is driven by the search index (store/search.py); `ranked`: its answer,
    most relevant first (see `_search_answer`). `condition`: the filter as a condition on `events e`
    past its origin, a fragment of a statement (None: it drives from tags or searches)."""
    params: list = []
    where: list[str] = []
    tag_items = sorted(f.tags.items(), key=lambda kv: (_TAG_PREFERENCE.index(kv[0])
                                                       if kv[0] in _TAG_PREFERENCE else 99, kv[0]))
    drive_tag = None
    searching = f.search is not None
    mark = d.mark
    if searching:
        if condition:
            return None, None
        # The search's value is the first binding (PostgreSQL's text binds it in FROM).
        found = search.search_text(d)
        if found.condition is not None:
            where.append(found.condition)
        params.append(search.fts_query(search.search_terms(f.search)))
    elif f.ids is None and tag_items and (f.authors is None or tag_items[0][0] in ("e", "p")):
        drive_tag, tag_items = tag_items[0], tag_items[1:]

    # Driving from the tag index, the event's kind, rowid and created_at are in the index entry:
    # conditions on them are checked there, before (or instead of) reading the event row.
    needs_row = f.ids is not None or f.authors is not None
    if drive_tag is not None:
        name, values = drive_tag
        params.extend([origin, name])
        where.append(_FIXED[d.backend]["tag"])
        where.append(_in(d, "t.value", sorted(values), params))
        time_col, kind_col, rowid_col = "t.created_at", "t.kind", "t.event"
    else:
        where.append(_FIXED[d.backend]["origin"])
        params.append(origin)
        time_col, kind_col, rowid_col = "e.created_at", "e.kind", "e.rowid"
    if f.ids is not None:
        where.append(_in(d, "e.id", sorted(f.ids), params))
    if f.authors is not None:
        where.append(_in(d, "e.pubkey", sorted(f.authors), params))
    if f.kinds is not None:
        where.append(_in(d, kind_col, sorted(f.kinds), params))
    if f.since is not None:
        where.append(f"{time_col} >= {mark}")
        params.append(f.since)
    if f.until is not None:
        where.append(f"{time_col} <= {mark}")
        params.append(f.until)
    for name, values in tag_items:
        sub_params: list = [name]
        cond = _in(d, "x.value", sorted(values), sub_params)
        where.append(f"EXISTS (SELECT 1 FROM tags x WHERE x.event = {rowid_col} AND x.name = {mark} AND {cond})")
        params.extend(sub_params)
    if condition:  # the filter as a condition on `events e` past its origin (None: it drives from tags)
        if drive_tag is not None:
            return None, None
        return " AND ".join(where[1:]) or "TRUE", params[1:]
    if scope is not None:
        scope_sql, scope_needs_row = _scope_sql(d, scope, now, params, kinds=f.kinds, kind_col=kind_col,
                                                rowid_col=rowid_col, row_read=not (count or rowids),
                                                expired=expired)
        where.append(scope_sql)
        needs_row = needs_row or scope_needs_row
    clause = " AND ".join(where)
    # The driving index is named, not left to the planner: without statistics (a database that
    # has grown since it was opened has none) SQLite prefers an index that yields the ORDER BY
    # and scans every event of the origin in it (events_time for `ids`, events_id for the tie
    # reads below; docs/performance.md#the-driving-index-named).
    if searching:
        source = found.source
    elif drive_tag is None:
        source = _SOURCES[d.backend][_events_index(f)]
    elif (count or rowids) and not needs_row:
        source = _SOURCES[d.backend]["tags"]  # an index-only scan: nothing here needs the event row
    else:
        source = _SOURCES[d.backend]["tags+events"]
    # Driving from the tag index, an event carrying several of the wanted values appears once per
    # value: count distinct rows, and over-fetch so deduplication cannot starve the limit.
    fanout = len(drive_tag[1]) if drive_tag is not None else 1
    if rowids:  # the matching rows, for a COUNT over several filters (a fragment: no d.text)
        return f"SELECT {rowid_col} FROM {source} WHERE {clause}", params
    if count:
        what = f"count(DISTINCT {rowid_col})" if fanout > 1 else "count(*)"
        return d.text(f"SELECT {what} FROM {source} WHERE {clause}"), params
    if records:  # oldest first; with a filter limit, its newest `limit` (lowest id first within a second)
        distinct = "DISTINCT " if fanout > 1 else ""
        params.append(limit)
        if f.limit is not None:
            return d.text(f"SELECT created_at, id FROM (SELECT {distinct}{time_col} AS created_at, e.id AS id "
                          f"FROM {source} WHERE {clause} ORDER BY {time_col} DESC, e.id LIMIT {mark}) AS r "
                          "ORDER BY created_at"), params
        return d.text(f"SELECT {distinct}{time_col}, e.id FROM {source} WHERE {clause} ORDER BY {time_col} "
                      f"LIMIT {mark}"), params
    raw = _FIXED[d.backend]["raw bytes"] if raw_bytes else "e.raw"  # bytes: no UTF-8 decoding, ready to send
    if ranked:  # NIP-50: most relevant first, then newest, then lowest id
        params.append(limit)
        return d.text(f"SELECT e.created_at, e.id, {raw} FROM {source} WHERE {clause} "
                      f"ORDER BY {found.rank}, e.created_at DESC, e.id LIMIT {mark}"), params
    if at_second is not None:  # every event of one second, lowest id first (see _filter_answer)
        params.append(at_second)
        params.append(limit * fanout)
        return d.text(f"SELECT e.created_at, e.id, {raw} FROM {source} WHERE {clause} AND {time_col} = {mark} "
                      f"ORDER BY e.id LIMIT {mark}"), params
    # Newest first, one row more than the answer needs (it tells whether the last second is
    # complete); the order within a second is settled by the caller (_filter_answer).
    params.append(limit * fanout)
    return d.text(
        f"SELECT e.created_at, e.id, {raw} FROM {source} WHERE {clause} ORDER BY {time_col} DESC LIMIT {mark} + 1"
    ), params


# The fixed parts of a filter's statement, per backend (written once, not per REQ).
_FIXED = {
    d.backend: {
        "tag": f"t.origin = {d.mark} AND t.name = {d.mark}",
        "origin": f"e.origin = {d.mark}",
        "live": f"(e.expiration IS NULL OR e.expiration > {d.mark})",
        "raw bytes": d.blob("e.raw"),
    } for d in (SQLITE, POSTGRES)
}
# What drives a filter's scan (see _build_query), per backend.
_SOURCES = {
    d.backend: {
        **{index: "events e" + d.indexed_by(index) for index in ("events_id", "events_author", "events_kind",
                                                                  "events_time")},
        "tags": "tags t" + d.indexed_by("tags_lookup"),
        "tags+events": "tags t" + d.indexed_by("tags_lookup") + " JOIN events e ON e.rowid = t.event",
    } for d in (SQLITE, POSTGRES)
}


def _events_index(f: Filter) -> str:
    """The index of `events` that drives a filter with no driving tag: ids, then authors, then
    kinds (each leads to the fewest rows, in created_at order within one value), else time."""
    if f.ids is not None:
        return "events_id"
    if f.authors is not None:
        return "events_author"
    if f.kinds is not None:
        return "events_kind"
    return "events_time"


def _matches_nothing(f: Filter) -> bool:
    return (
        (f.ids is not None and not f.ids)
        or (f.authors is not None and not f.authors)
        or (f.kinds is not None and not f.kinds)
        or any(not v for v in f.tags.values())
        or (f.since is not None and f.until is not None and f.since > f.until)
        or (f.search is not None and not search.search_terms(f.search))  # no word to look for
    )


def query_events(
    conn: Connection,
    origin: int,
    filters: list[Filter],
    scope: ReadScope,
    now: int,
    *,
    default_limit: int,
    max_limit: int,
    max_bytes: int | None = None,
) -> list[str]:
    """Raw JSON of events matching any filter, newest first (ties: lowest id first), deduplicated.

    With `max_bytes`, each filter answers with its newest events up to its even share of it (at
    least one event), so memory stays bounded and a client can page on with `until`."""
    return [raw for _eid, raw in query_rows(conn, origin, filters, scope, now, default_limit=default_limit,
                                            max_limit=max_limit, max_bytes=max_bytes)]


def query_rows(
    conn: Connection,
    origin: int,
    filters: list[Filter],
    scope: ReadScope,
    now: int,
    *,
    default_limit: int,
    max_limit: int,
    max_bytes: int | None = None,
    raw_bytes: bool = False,
) -> list[tuple[str, str | bytes]]:
    """`query_events` as (id, raw) pairs; with `raw_bytes` each raw is the stored UTF-8 bytes."""
    live = [f for f in filters if not (_matches_nothing(f) or f.limit == 0)]
    share = max_bytes // len(live) if max_bytes is not None and live else None
    if len(live) == 1:  # one filter: its answer is in order and without duplicates already
        f = live[0]
        limit = min(f.limit if f.limit is not None else default_limit, max_limit)
        answer = _search_answer if f.search is not None else _filter_answer
        return [(eid, raw) for _c, eid, raw in answer(conn, origin, f, scope, now, limit, share, raw_bytes)]
    # Several filters (a search among them or not): their events together, newest first.
    found: dict[str, tuple[int, str | bytes]] = {}
    for f in live:
        limit = min(f.limit if f.limit is not None else default_limit, max_limit)
        answer = _search_answer if f.search is not None else _filter_answer
        for created_at, eid, raw in answer(conn, origin, f, scope, now, limit, share, raw_bytes):
            found[eid] = (created_at, raw)
    ordered = sorted(found.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [(eid, raw) for eid, (_c, raw) in ordered]


def _search_answer(conn: Connection, origin: int, f: Filter, scope: ReadScope, now: int, limit: int,
                   share: int | None, raw_bytes: bool) -> list[tuple]:
    """A search filter's answer (NIP-50): (created_at, id, raw), the most relevant first, then the
    newest, then the lowest id; at most `limit` events and, past the first, `share` bytes."""
    sql, params = build_query(dialect_of(conn), origin, f, scope, now, limit, raw_bytes=raw_bytes, ranked=True)
    rows = conn.execute(sql, params).fetchall()
    if share is None:
        return rows
    out: list[tuple] = []
    size = 0
    for row in rows:
        size += len(row[2])
        if size > share and out:
            break
        out.append(row)
    return out


def _filter_answer(conn: Connection, origin: int, f: Filter, scope: ReadScope, now: int, limit: int,
                   share: int | None, raw_bytes: bool) -> list[tuple]:
    """One filter's answer, (created_at, id, raw) newest first and on equal created_at lowest id
    first (NIP-01), at most `limit` events and, past the first, `share` bytes.

    SQLite returns the rows in created_at order from the index; the order within a second is
    settled here (sorting by id in SQL costs a temporary b-tree holding every row's JSON: half a
    50-event query). Rows are read a whole second at a time, so the last second's events are all
    seen before the lowest ids are kept; if the statement's LIMIT cut that second short, its
    events are read again by id."""
    d = dialect_of(conn)
    sql, params = build_query(d, origin, f, scope, now, limit, raw_bytes=raw_bytes)
    n = params[-1]  # the LIMIT: limit x the driving tag's values (one event can match each)
    fetched = conn.execute(sql, params)
    if n == limit:  # a row per event: at most limit + 1 rows, read at once while within `share`
        first, complete = _fetch_within(fetched, limit + 1, share)
        if complete:
            if _whole_answer(first, limit, share):
                got = first[:limit]
                if len(set(map(_CREATED_AT, got))) < len(got):  # ties within a second
                    got.sort(key=lambda r: (-r[0], r[1]))
                return got
            fetched = first
        else:  # past `share` already: the rest is read row by row, as far as the answer needs
            fetched = chain(first, fetched)
    # Else row by row (several driving values: up to n + 1 rows, most of them often not needed).
    got = []
    seen: set[str] = set()
    size = 0
    current = None  # created_at of the second being read
    group_start = 0  # index in `got` where that second begins
    ties = False
    rows = 0
    for row in fetched:
        rows += 1
        created_at = row[0]
        if created_at != current:
            if len(got) >= limit or (share is not None and got and size > share):
                break  # enough, and the seconds taken are complete
            current, group_start = created_at, len(got)
        elif not ties and len(got) > group_start:
            ties = True
        eid = row[1]
        if eid not in seen:
            seen.add(eid)
            got.append(row)
            size += len(row[2])
    else:
        if rows > n:  # the LIMIT (one row past n) cut the last second short: read it all by id
            tail_sql, tail_params = build_query(d, origin, f, scope, now, limit, raw_bytes=raw_bytes,
                                                at_second=current)
            del got[group_start:]
            last = None
            for row in conn.execute(tail_sql, tail_params):
                if row[1] != last:  # by id: an event's rows (one per matching tag value) are adjacent
                    got.append(row)
                    last = row[1]
            ties = True
    if ties:
        got.sort(key=lambda r: (-r[0], r[1]))
    if share is None:
        return got[:limit]
    out: list[tuple] = []
    size = 0
    for row in got:
        size += len(row[2])
        if size > share and out:
            break
        out.append(row)
        if len(out) == limit:
            break
    return out


_CREATED_AT, _ID, _RAW = itemgetter(0), itemgetter(1), itemgetter(2)


# `_fetch_within`: the rows read at once first (a usual answer's all), then at a time past them.
FETCH_FIRST_ROWS = 64
FETCH_MORE_ROWS = 16


def _fetch_within(cursor: Iterable[tuple], most: int, share: int | None) -> tuple[list[tuple], bool]:
    """Up to `most` rows of `cursor`, read in batches while their raws fit in `share` bytes, and
    whether that is all of them (False: the read stopped past `share`, the rest still in the
    cursor). A limit of large events is not read whole only to be cut to its share after: a
    reader holds about `share` bytes of rows (max_output_buffer_total counts on it)."""
    if share is None:
        return list(islice(cursor, most)), True
    rows = list(islice(cursor, min(most, FETCH_FIRST_ROWS)))
    if len(rows) < min(most, FETCH_FIRST_ROWS):
        return rows, True
    size = sum(map(len, map(_RAW, rows)))
    while len(rows) < most:
        if size > share:
            return rows, False
        want = min(most - len(rows), FETCH_MORE_ROWS)
        more = list(islice(cursor, want))
        rows += more
        if len(more) < want:
            return rows, True
        size += sum(map(len, map(_RAW, more)))
    return rows, True


def _whole_answer(fetched: list[tuple], limit: int, share: int | None) -> bool:
    """Whether the first `limit` rows of a one-row-per-event read (newest first, one row more than
    the limit when there are more) are the filter's whole answer, as `_filter_answer`'s row by row
    reading would find: no event twice, within `share` bytes, and a last second that the limit
    does not cut (the row past it is of an older second). Decided in C-level passes over the rows
    (a 50-event answer's rows one by one in Python cost about half of its SQL)."""
    if len(fetched) > limit and fetched[limit][0] == fetched[limit - 1][0]:
        return False  # the limit cuts a second: its events are read again by id
    if len(set(map(_ID, fetched))) < len(fetched):
        return False
    return share is None or sum(map(len, map(_RAW, fetched))) <= share


def negentropy_rows(conn: Connection, origin: int, f: Filter, scope: ReadScope, now: int,
                    cap: int) -> Iterable[tuple[int, str]]:
    """NIP-77: (created_at, id) of the events `f` selects that `scope` may read, in ascending
    created_at (the ids of one second in any order, an id possibly repeated), at most `cap` rows
    (with a filter `limit`, the newest that many), read as they are iterated."""
    if _matches_nothing(f) or f.search is not None or f.limit == 0:
        return ()
    limit = cap if f.limit is None else min(f.limit, cap)
    sql, params = build_query(dialect_of(conn), origin, f, scope, now, limit, records=True)
    return conn.execute(sql, params)


def count_events(conn: Connection, origin: int, filters: list[Filter], scope: ReadScope, now: int) -> int:
    """NIP-45 COUNT: distinct events matching any filter (limits do not apply), counted by SQLite
    in one statement (several filters: the UNION of their rows), never by collecting ids here."""
    live = [f for f in filters if not _matches_nothing(f)]
    if not live:
        return 0
    expired = any_expired(conn, now)
    d = dialect_of(conn)
    if len(live) == 1:
        sql, params = build_query(d, origin, live[0], scope, now, 0, count=True, expired=expired)
        return conn.execute(sql, params).fetchone()[0]
    # Broad filters (kinds, times, secondary tags; no ids, authors or driving tag): one pass over
    # the origin's events with all of them OR-ed, each event counted once. Selective filters: the
    # UNION of the (few) rows each one's own index finds.
    conditions, params = [], []
    for f in live:
        if f.ids is not None or f.authors is not None:
            break
        cond, cond_params = build_query(d, origin, f, None, now, 0, condition=True)
        if cond is None:
            break
        conditions.append(f"({cond})")
        params += cond_params
    else:
        scope_params: list = []
        scope_sql, _needs_row = _scope_sql(d, scope, now, scope_params, expired=expired)
        sql = d.text(f"SELECT count(*) FROM events e WHERE e.origin = {d.mark} AND ({' OR '.join(conditions)}) "
                     f"AND {scope_sql}")
        return conn.execute(sql, [origin, *params, *scope_params]).fetchone()[0]
    parts, params = [], []
    for f in live:
        part, part_params = build_query(d, origin, f, scope, now, 0, rowids=True, expired=expired)
        parts.append(part)
        params += part_params
    sql = d.text(f"SELECT count(*) FROM ({' UNION '.join(parts)}) AS u")
    return conn.execute(sql, params).fetchone()[0]


SQL_TOP_AUTHORS_SINCE = SQL(
    "SELECT pubkey, count(*) AS n FROM events WHERE origin = ? AND created_at >= ? "
    "GROUP BY pubkey ORDER BY n DESC, pubkey LIMIT ?",
    "SELECT pubkey, count(*) AS n FROM events WHERE origin = %s AND created_at >= %s "
    "GROUP BY pubkey ORDER BY n DESC, pubkey LIMIT %s",
)
SQL_EVENT_COUNTS = SQL("SELECT origin, count(*) FROM events GROUP BY origin",
                       "SELECT origin, count(*) FROM events GROUP BY origin")


def top_authors(conn: Connection, origin: int, since: int, limit: int = 10) -> list[tuple[str, int]]:
    """The authors with the most stored events created since `since` (events_time index range)."""
    return conn.execute(SQL_TOP_AUTHORS_SINCE, (origin, since, limit)).fetchall()


def event_counts(conn: Connection) -> dict[int, int]:
    """Stored events per origin."""
    return dict(conn.execute(SQL_EVENT_COUNTS).fetchall())


# Per origin, so each max is one step down the (origin, created_at) index.
SQL_NEWEST_CREATED_AT = SQL(
    "SELECT max(m) FROM (SELECT (SELECT max(created_at) FROM events WHERE origin = o.id) AS m FROM origins o)",
    "SELECT max(m) FROM (SELECT (SELECT max(created_at) FROM events WHERE origin = o.id) AS m FROM origins o) AS _sub1",
)


def newest_created_at(conn) -> int | None:
    """The latest created_at stored (None when empty): a clock that reads earlier went back."""
    return conn.execute(SQL_NEWEST_CREATED_AT).fetchone()[0]


SQL_EVENT_RAW = SQL("SELECT raw FROM events WHERE origin = ? AND id = ?",
                    "SELECT raw FROM events WHERE origin = %s AND id = %s")


def event_raw(conn, origin: int, event_id: str) -> str | None:
    """One stored event as served, or None (never stored, deleted or replaced)."""
    row = conn.execute(SQL_EVENT_RAW, (origin, event_id)).fetchone()
    return None if row is None else row[0]
