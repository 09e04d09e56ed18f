"""NIP-50 search: the full-text index of the searchable kinds and how a filter's `search` reads it.

SQLite: an FTS5 table (`events_fts`, contentless, unicode61 tokenizer folding case and diacritics)
whose rowids are the events'. PostgreSQL: `events_search`, a tsvector per event ('simple'
configuration, over the words as pg_words.py splits and folds them) under a GIN index. On both,
triggers (schema.py, pg_schema.py) write an event's entry in the event's own transaction when its
kind is in `search_kinds`, and delete it with the event, whatever path writes or deletes it. This
module keeps the kinds table in step with the `search_kinds` setting, rebuilds the index in chunks
(a server beside it waits at most one chunk for the write lock), and turns a search string into the
terms both backends match.

A search matches the events whose content holds every word of the string (NIP-50 `key:value`
extensions are not words), ranked by relevance: BM25 on SQLite, ts_rank on PostgreSQL.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from appliance.nostr.search import search_terms  # noqa: F401 - the words a search looks for
from appliance.store.statement import SQL, Dialect

if TYPE_CHECKING:
    from appliance.store.interface import Store

# The start's lines about the index, under the logger of the start's other lines.
log = logging.getLogger("appliance")

# Events per write transaction of a rebuild.
DEFAULT_CHUNK = 10_000

def fts_query(terms: list[str]) -> str:
    """The value bound to the search condition: each word quoted (FTS5 reads `"a" "b"` as a AND b,
    and a quoted word cannot be an operator; PostgreSQL's plainto_tsquery ignores the quotes)."""
    return " ".join(f'"{t}"' for t in terms)


# -- a search in a filter's statement (events.build_query) ------------------------------------------

@dataclass(frozen=True)
class SearchText:
    """How one backend's statement reads the index: `source` in FROM (the index joined to the
    events `e`), `condition` in WHERE (None: the source matches already), `rank` to order by (the
    most relevant first). The search's value is the statement's first binding on both."""

    source: str
    condition: str | None
    rank: str


_TEXT = {
    "sqlite": SearchText("events_fts f JOIN events e ON e.rowid = f.rowid", "events_fts MATCH ?",
                         "f.rank"),  # BM25, lower is better
    # The search string goes through the words rule the index was written with (pg_words.py).
    # Normalization 1: divided by 1 + log(length), so a word among many weighs less (as BM25 has it).
    "postgresql": SearchText("(SELECT plainto_tsquery('simple', appliance_search_words(%s)) AS q) s "
                             "JOIN events_search f ON f.tsv @@ s.q JOIN events e ON e.rowid = f.event", None,
                             "-ts_rank(f.tsv, s.q, 1)"),
}


def search_text(d: Dialect) -> SearchText:
    return _TEXT[d.backend]


# -- the kinds indexed, and rebuilding --------------------------------------------------------------

SQL_KINDS = SQL("SELECT kind FROM search_kinds ORDER BY kind", "SELECT kind FROM search_kinds ORDER BY kind")
SQL_ADD_KIND = SQL("INSERT INTO search_kinds (kind) VALUES (?) ON CONFLICT (kind) DO NOTHING",
                   "INSERT INTO search_kinds (kind) VALUES (%s) ON CONFLICT (kind) DO NOTHING")
SQL_DROP_KIND = SQL("DELETE FROM search_kinds WHERE kind = ?", "DELETE FROM search_kinds WHERE kind = %s")
SQL_CLEAR_KINDS = SQL("DELETE FROM search_kinds", "DELETE FROM search_kinds")
SQL_MAX_ROWID = SQL("SELECT max(rowid) FROM events", "SELECT max(rowid) FROM events")
SQL_CLEAR = SQL("INSERT INTO events_fts (events_fts) VALUES ('delete-all')", "DELETE FROM events_search")
SQL_INDEX_RANGE = SQL(
    "INSERT INTO events_fts (rowid, content) SELECT rowid, raw ->> '$.content' FROM events "
    "WHERE rowid > ? AND rowid <= ? AND kind IN (SELECT value FROM json_each(?))",
    "INSERT INTO events_search (event, tsv) SELECT rowid, appliance_search_text(raw) FROM events "
    "WHERE rowid > %s AND rowid <= %s AND kind IN (SELECT value::bigint FROM jsonb_array_elements(%s::jsonb)) "
    "ON CONFLICT (event) DO NOTHING",
)
SQL_UNINDEX_RANGE = SQL(
    "DELETE FROM events_fts WHERE rowid IN (SELECT rowid FROM events "
    "WHERE rowid > ? AND rowid <= ? AND kind IN (SELECT value FROM json_each(?)))",
    "DELETE FROM events_search WHERE event IN (SELECT rowid FROM events "
    "WHERE rowid > %s AND rowid <= %s AND kind IN (SELECT value::bigint FROM jsonb_array_elements(%s::jsonb)))",
)
SQL_COUNT_KINDS = SQL(
    "SELECT count(*) FROM events WHERE kind IN (SELECT value FROM json_each(?))",
    "SELECT count(*) FROM events WHERE kind IN (SELECT value::bigint FROM jsonb_array_elements(%s::jsonb))",
)


def indexed_kinds(conn) -> tuple[int, ...]:
    return tuple(k for (k,) in conn.execute(SQL_KINDS))


def _json(kinds) -> str:
    return "[" + ",".join(str(int(k)) for k in sorted(kinds)) + "]"


class Rebuild:
    """Brings the index in step with a set of kinds, one chunk of events per write transaction.

    `full`: the whole index is dropped and written again (`appliance search reindex`); else only
    the kinds added since the last time are indexed and the kinds removed unindexed (`serve`).
    The first step sets the kinds table (from then on new events follow the new kinds, through
    the triggers) and notes the highest rowid: later steps cover the events up to it, those
    stored before the change."""

    def __init__(self, kinds, *, full: bool, chunk: int = DEFAULT_CHUNK):
        self.kinds = tuple(sorted(set(kinds)))
        self.full = full
        self.chunk = chunk
        self.added: tuple[int, ...] = ()
        self.removed: tuple[int, ...] = ()
        self.bound: int | None = None
        self.after = 0
        self.events = 0  # events of the added kinds (all, when full): the work to do
        self.done = False

    def step(self, conn) -> None:
        if self.bound is None:
            self._begin(conn)
            return
        upto = min(self.after + self.chunk, self.bound)
        if self.removed:
            conn.execute(SQL_UNINDEX_RANGE, (self.after, upto, _json(self.removed)))
        if self.added:
            conn.execute(SQL_INDEX_RANGE, (self.after, upto, _json(self.added)))
        self.after = upto
        self.done = upto >= self.bound

    def _begin(self, conn) -> None:
        before = set(indexed_kinds(conn))
        now = set(self.kinds)
        if self.full:
            conn.execute(SQL_CLEAR)
            self.added, self.removed = self.kinds, ()
        else:
            self.added, self.removed = tuple(sorted(now - before)), tuple(sorted(before - now))
        for kind in before - now:
            conn.execute(SQL_DROP_KIND, (kind,))
        for kind in now - before:
            conn.execute(SQL_ADD_KIND, (kind,))
        self.bound = conn.execute(SQL_MAX_ROWID).fetchone()[0] or 0
        self.events = conn.execute(SQL_COUNT_KINDS, (_json(self.added),)).fetchone()[0] if self.added else 0
        self.done = not (self.added or self.removed) or self.bound == 0

    def run(self, write: Callable, progress: Callable[["Rebuild"], None] | None = None) -> "Rebuild":
        """Every step, each through `write` (a store's write_sync)."""
        while not self.done:
            write(self.step)
            if progress is not None:
                progress(self)
        return self


def sync_search_kinds(store: Store, kinds: Iterable[int]) -> None:
    """NIP-50: index the events of kinds added to `search_kinds` since the last start, and unindex
    those of kinds removed, before serving (the kinds table then follows the setting)."""
    rebuild = Rebuild(kinds, full=False)
    last = [time.monotonic()]

    def progress(r: Rebuild) -> None:
        if time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            log.info("search index: %d of %d rowids done", r.after, r.bound or 0)

    rebuild.run(store.write_sync, progress)
    if rebuild.added or rebuild.removed:
        log.info("search index: kinds %s indexed, kinds %s unindexed (search_kinds is now %s)",
                 list(rebuild.added), list(rebuild.removed), list(rebuild.kinds))
