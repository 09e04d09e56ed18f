"""A statement's text per backend.

SQLite runs the texts the store modules write with `?` bindings as they are; PostgreSQL runs its
own text of each statement, written next to the SQLite one (psycopg's `%s` bindings, a literal `%`
doubled). Nothing is translated at run time: a PostgreSQL connection refuses a text that has no
PostgreSQL form.
"""

from __future__ import annotations

from appliance.store.interface import is_sqlite


class SQL(str):
    """One statement in both backends' texts. The string itself is the SQLite text (apsw takes it
    as it is); `postgres` is PostgreSQL's, or None for a statement that runs on SQLite only.
    `returns_id`: PostgreSQL's text ends in RETURNING the new row's id, which the connection keeps
    for last_insert_rowid() (SQLite keeps it itself)."""

    postgres: str | None
    returns_id: bool

    def __new__(cls, sqlite: str, postgres: str | None, *, returns_id: bool = False) -> "SQL":
        self = super().__new__(cls, sqlite)
        self.postgres = postgres
        self.returns_id = returns_id
        return self

    def __add__(self, other):  # concatenation would silently drop the PostgreSQL text
        raise TypeError("an SQL statement is not concatenated: build both texts (statement.Dialect)")


class PgText(str):
    """A statement written for PostgreSQL only: built at run time for a PostgreSQL connection
    (Dialect.text), or a PostgreSQL backend module's own."""


class Dialect:
    """What a statement built at run time (a filter's query, an operator's listing) writes
    differently per backend. A builder takes the connection's (`dialect_of`) and writes that
    backend's text itself: SQLite's runs as apsw gets it, PostgreSQL's comes out a PgText."""

    __slots__ = ("backend", "mark", "_marks", "indexed_by", "json_values", "_blob", "text")

    def __init__(self, backend: str, *, mark: str, indexed_by, json_values: str, blob: str, text):
        self.backend = backend
        self.mark = mark  # a binding's mark
        self._marks = [",".join((mark,) * n) for n in range(_MARKS_KEPT)]
        # `indexed_by(index)`: after a table in FROM, the index that drives its scan (SQLite's
        # planner hint, with a leading space; PostgreSQL has none: "").
        self.indexed_by = indexed_by
        self.json_values = json_values  # a subquery: the values of a JSON array bound as text
        self._blob = blob
        self.text = text  # the finished statement: a plain str on SQLite, a PgText on PostgreSQL

    def marks(self, n: int) -> str:
        """`n` binding marks, comma-separated (an IN list)."""
        return self._marks[n] if n < _MARKS_KEPT else ",".join((self.mark,) * n)

    def blob(self, expr: str) -> str:
        """A text column's value as its UTF-8 bytes."""
        return self._blob.format(expr)

    def __repr__(self) -> str:
        return f"Dialect({self.backend!r})"


_MARKS_KEPT = 64

SQLITE = Dialect(
    "sqlite", mark="?", indexed_by=lambda index: " INDEXED BY " + index,
    json_values="(SELECT value FROM json_each(?))", blob="CAST({} AS BLOB)", text=str)
POSTGRES = Dialect(
    "postgresql", mark="%s", indexed_by=lambda _index: "",
    json_values="(SELECT value FROM jsonb_array_elements_text(%s::jsonb))", blob="convert_to({}, 'UTF8')",
    text=PgText)


def dialect_of(conn) -> Dialect:
    """The dialect of a store connection's backend."""
    return SQLITE if is_sqlite(conn) else POSTGRES
