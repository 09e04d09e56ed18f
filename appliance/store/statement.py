"""A statement's text per backend.

SQLite runs the texts the store modules write with `?` bindings as they are; PostgreSQL runs its
own text of each statement, written next to the SQLite one (psycopg's `%s` bindings, a literal `%`
doubled). Nothing is translated at run time: a PostgreSQL connection refuses a text that has no
PostgreSQL form.
"""

from __future__ import annotations


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
