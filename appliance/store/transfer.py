"""The operator's bulk reads and deletes of one origin's events (`appliance export`, `delete`).

A filter here selects every event it matches at the origin, whoever may read it (the operator's
tools see all the data, as a backup does), oldest first. Reads go in pages keyed on
(created_at, id), so memory stays constant however many events match, on both backends (a
PostgreSQL cursor would otherwise hold the whole answer); deletes go in chunks of rowids, each its
own short write transaction, so a server running beside them waits for the write lock at most
one chunk's time.
"""

from __future__ import annotations

from typing import Iterator

from appliance.nostr.filters import Filter
from appliance.store.backend import value_errors
from appliance.store.events import _in, delete_row
from appliance.store.interface import Connection, is_sqlite
from appliance.store.statement import SQL, Dialect, dialect_of

# Events per page of an export, and per write transaction of a delete.
DEFAULT_PAGE = 5000


def filter_condition(d: Dialect, f: Filter, now: int) -> tuple[str, list]:
    """The filter (but its `limit`) as a condition on `events e` past its origin, in `d`'s text, and
    its bindings. Expired events not purged yet are left out, as REQ leaves them out."""
    mark = d.mark
    where = [f"(e.expiration IS NULL OR e.expiration > {mark})"]
    params: list = [now]
    if f.ids is not None:
        where.append(_in(d, "e.id", sorted(f.ids), params))
    if f.authors is not None:
        where.append(_in(d, "e.pubkey", sorted(f.authors), params))
    if f.kinds is not None:
        where.append(_in(d, "e.kind", sorted(f.kinds), params))
    if f.since is not None:
        where.append(f"e.created_at >= {mark}")
        params.append(f.since)
    if f.until is not None:
        where.append(f"e.created_at <= {mark}")
        params.append(f.until)
    for name, values in sorted(f.tags.items()):
        sub: list = [name]
        cond = _in(d, "x.value", sorted(values), sub)
        where.append(f"EXISTS (SELECT 1 FROM tags x WHERE x.event = e.rowid AND x.name = {mark} AND {cond})")
        params.extend(sub)
    return " AND ".join(where), params


def _matches_nothing(f: Filter) -> bool:
    return ((f.ids is not None and not f.ids) or (f.authors is not None and not f.authors)
            or (f.kinds is not None and not f.kinds) or any(not v for v in f.tags.values())
            or f.limit == 0 or (f.since is not None and f.until is not None and f.since > f.until))


def _condition(conn, origin: int, f: Filter, now: int) -> tuple[Dialect, str, list]:
    """The connection's dialect, and the filter as a condition in it (`filter_condition`). With a
    `limit`, the filter selects its newest `limit` events (newest first, on equal created_at the
    lowest id first: REQ's order): the condition grows a bound on (created_at, id) at the last of
    them, found with one indexed walk."""
    d = dialect_of(conn)
    mark = d.mark
    cond, params = filter_condition(d, f, now)
    if f.limit is None:
        return d, cond, params
    row = conn.execute(d.text(
        f"SELECT e.created_at, e.id FROM events e WHERE e.origin = {mark} AND {cond} "
        f"ORDER BY e.created_at DESC, e.id LIMIT 1 OFFSET {mark}"), [origin, *params, f.limit - 1]).fetchone()
    if row is None:  # fewer than `limit` match: all of them
        return d, cond, params
    created_at, eid = row
    return (d, f"{cond} AND e.created_at >= {mark} AND (e.created_at > {mark} OR e.id <= {mark})",
            [*params, created_at, created_at, eid])


def export_pages(conn, origin: int, f: Filter, now: int, page: int = DEFAULT_PAGE) -> Iterator[list[bytes]]:
    """The stored JSON (UTF-8 bytes) of every event at `origin` the filter selects, oldest first and
    on equal created_at the lowest id first (the order strfry writes a batch of events in, so an
    export it imports comes out of its own export in the same order), a page at a time. Run it
    inside one read transaction: the pages then come from one snapshot."""
    if _matches_nothing(f):
        return
    d, cond, params = _condition(conn, origin, f, now)
    mark = d.mark
    head = f"SELECT e.created_at, e.id, {d.blob('e.raw')} FROM events e{d.indexed_by('events_time')} "
    first = d.text(f"{head}WHERE e.origin = {mark} AND {cond} ORDER BY e.created_at, e.id LIMIT {mark}")
    rest = d.text(f"{head}WHERE e.origin = {mark} AND {cond} AND e.created_at >= {mark} "
                  f"AND (e.created_at > {mark} OR e.id > {mark}) ORDER BY e.created_at, e.id LIMIT {mark}")
    rows = conn.execute(first, [origin, *params, page]).fetchall()
    while rows:
        yield [r[2] for r in rows]
        if len(rows) < page:
            return
        created_at, eid = rows[-1][0], rows[-1][1]
        rows = conn.execute(rest, [origin, *params, created_at, created_at, eid, page]).fetchall()


SQL_MAX_ROWID = SQL("SELECT max(rowid) FROM events", "SELECT max(rowid) FROM events")


def count_matching(conn, origin: int, f: Filter, now: int) -> int:
    """How many events at `origin` the filter selects (what a `Deletion` of it deletes)."""
    if _matches_nothing(f):
        return 0
    d, cond, params = _condition(conn, origin, f, now)
    return conn.execute(d.text(f"SELECT count(*) FROM events e WHERE e.origin = {d.mark} AND {cond}"),
                        [origin, *params]).fetchone()[0]


class Deletion:
    """Deleting what a filter selects, one chunk per write transaction (`step`), in rowid order.

    Only events stored when it began are deleted: the first step notes the highest rowid, and
    later steps go no further. (New rows get rowids above every stored one, and the highest goes
    in the last step; only if the server deletes that row first, a replacement of it for
    instance, can a row stored meanwhile get a rowid within the bound.)"""

    def __init__(self, origin: int, f: Filter, now: int, chunk: int = DEFAULT_PAGE):
        self.origin, self.filter, self.now, self.chunk = origin, f, now, chunk
        self.bound: int | None = None
        self.after = 0
        self.deleted = 0
        self.done = _matches_nothing(f)
        self._cond: tuple[Dialect, str, list] | None = None

    def step(self, conn) -> int:
        """Delete the next chunk (inside a write transaction); how many rows went."""
        if self.done:
            return 0
        if self._cond is None:
            self.bound = conn.execute(SQL_MAX_ROWID).fetchone()[0] or 0
            self._cond = _condition(conn, self.origin, self.filter, self.now)
        d, cond, params = self._cond
        mark = d.mark
        rowids = [r[0] for r in conn.execute(d.text(
            f"SELECT e.rowid FROM events e WHERE e.origin = {mark} AND e.rowid > {mark} AND e.rowid <= {mark} "
            f"AND {cond} ORDER BY e.rowid LIMIT {mark}"), [self.origin, self.after, self.bound, *params, self.chunk])]
        for rowid in rowids:
            delete_row(conn, rowid)
        if len(rowids) < self.chunk:
            self.done = True
        if rowids:
            self.after = rowids[-1]
        self.deleted += len(rowids)
        return len(rowids)


# Page cache of an import's writer connection (SQLite): a bulk load's indexes outgrow the usual
# 64 MiB: docs/performance.md#import_cache_kib
IMPORT_CACHE_KIB = 256 * 1024
SQL_WIDEN_CACHE = SQL(f"PRAGMA cache_size = -{IMPORT_CACHE_KIB}", None)  # SQLite's only


def widen_cache(conn) -> None:
    """Give this (the import's own) SQLite writer connection IMPORT_CACHE_KIB of page cache."""
    if is_sqlite(conn):
        conn.execute(SQL_WIDEN_CACHE)


SQL_SAVEPOINT = SQL("SAVEPOINT imported", "SAVEPOINT imported")
SQL_UNDO = SQL("ROLLBACK TO imported", "ROLLBACK TO imported")
SQL_RELEASE = SQL("RELEASE imported", "RELEASE imported")


def store_imported(conn, items: list) -> list:
    """Store imported events (`events.PendingEvent`s, no hooks) in order, inside one write
    transaction, under the rules of a publish (NIP-01 replacement, NIP-09 deletion, NIP-40
    expiry): one StoreResult, AlreadyStored or Rejected per item. Runs of plain events take the
    batched path; the others go one at a time, each in a savepoint of its own."""
    from appliance.errors import AlreadyStored, Rejected
    from appliance.store.events import batchable, store_events_batch

    results: list = [None] * len(items)
    i = 0
    while i < len(items):
        j = i
        while j < len(items) and batchable(items[j].ev, None):
            j += 1
        if j - i > 1:
            conn.execute(SQL_SAVEPOINT)
            try:
                results[i:j] = store_events_batch(conn, items[i:j])
            except (AlreadyStored, Rejected, *_DB_ERRORS):
                # (a value the batch statement cannot take, say): the run again one by one
                conn.execute(SQL_UNDO)
                conn.execute(SQL_RELEASE)
            else:
                conn.execute(SQL_RELEASE)
                i = j
                continue
        j = max(j, i + 1)
        for k in range(i, j):
            conn.execute(SQL_SAVEPOINT)
            try:
                results[k] = items[k](conn)
            except (AlreadyStored, Rejected) as exc:
                conn.execute(SQL_UNDO)
                results[k] = exc
            conn.execute(SQL_RELEASE)
        i = j
    return results


_DB_ERRORS = value_errors()
