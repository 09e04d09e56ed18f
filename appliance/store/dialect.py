"""SQLite-dialect statements as PostgreSQL ones, translated once per statement text.

The store modules keep one SQL text per statement, written for SQLite with `?` bindings. On
PostgreSQL each text is translated mechanically the first time it runs (`?` -> `%s`, `INSERT OR
IGNORE` -> `ON CONFLICT DO NOTHING`, `max(a, b)` -> `GREATEST(a, b)`, `json_each(?)` ->
`jsonb_array_elements(?::jsonb)`, index hints dropped, ...) and the result cached. A statement that
no rule can translate has an explicit PostgreSQL text registered next to its SQLite constant in
its store module (`postgres_variant`): the per-backend statement table.
"""

from __future__ import annotations

import re
import threading

# SQLite text -> PostgreSQL text (still with `?` bindings: the translation below finishes it).
_VARIANTS: dict[str, str] = {}
# (SQLite text, with bindings) -> (PostgreSQL text, returns the new row's id)
_CACHE: dict[tuple[str, bool], tuple[str, bool]] = {}
_LOCK = threading.Lock()

# Tables whose single-row INSERT ... VALUES reports the new row's id (apsw's last_insert_rowid):
# PostgreSQL has none, so those statements get RETURNING and the connection keeps the value.
ROWID_TABLES = {"events": "rowid"}

# Columns and primary key per table, for INSERT OR REPLACE (an upsert that resets the columns the
# statement does not name, as SQLite's delete-then-insert does). Filled from the schema at open.
TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def postgres_variant(sqlite_sql: str, postgres_sql: str) -> str:
    """Register the PostgreSQL text of one statement; returns the SQLite text (for assignment)."""
    _VARIANTS[sqlite_sql] = postgres_sql
    return sqlite_sql


def translate(sql: str, bound: bool = True) -> tuple[str, bool]:
    """(PostgreSQL text, whether it returns the new row's id) for one SQLite statement.

    `bound`: the statement is executed with bindings (psycopg then reads `%` as a placeholder
    marker, so literal ones are doubled); without, the text is sent as is."""
    key = (sql, bound)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    out = _translate(_VARIANTS.get(sql, sql), bound)
    with _LOCK:
        _CACHE[key] = out
    return out


_INDEXED = re.compile(r"\s+(?:INDEXED\s+BY\s+\w+|NOT\s+INDEXED)\b", re.I)
_CROSS = re.compile(r"\bCROSS\s+JOIN\b", re.I)
_BEGIN = re.compile(r"^\s*BEGIN\s+(?:IMMEDIATE|EXCLUSIVE|DEFERRED)\b", re.I)
_CAST_BLOB = re.compile(r"CAST\(([^()]*?)\s+AS\s+BLOB\)", re.I)
_EACH_VALUE = re.compile(r"\(\s*SELECT\s+value\s+FROM\s+json_each\(\?\)\s*\)", re.I)
_EACH = re.compile(r"\bjson_each\(\?\)", re.I)
_IS_NOT_PARAM = re.compile(r"\bIS\s+NOT\s+\?", re.I)
_IS_PARAM = re.compile(r"\bIS\s+\?", re.I)
_IFNULL = re.compile(r"\bifnull\(", re.I)
_OR_IGNORE = re.compile(r"\bINSERT\s+OR\s+IGNORE\s+INTO\b", re.I)
_OR_REPLACE = re.compile(r"^\s*INSERT\s+OR\s+REPLACE\s+INTO\s+(\w+)\s*\(([^)]*)\)", re.I)
_RETURNING = re.compile(r"\s+RETURNING\s+", re.I)
_INSERT_VALUES = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)\s*\([^)]*\)\s*VALUES\s*\(", re.I)
_FUNC = re.compile(r"\b(max|min)\(", re.I)
_FROM_SUB = re.compile(r"\bFROM\s+\(", re.I)
# Words that may follow a subquery in FROM when it has no alias (PostgreSQL 15 requires one).
_NOT_ALIAS = {"", "WHERE", "GROUP", "ORDER", "LIMIT", "UNION", "JOIN", "LEFT", "INNER", "CROSS", "ON", ")", ",",
              "HAVING", "OFFSET", "EXCEPT", "INTERSECT", "WINDOW"}


def _translate(sql: str, bound: bool) -> tuple[str, bool]:
    sql = _BEGIN.sub("BEGIN", sql)
    sql = _INDEXED.sub("", sql)
    sql = _CROSS.sub("JOIN", sql)  # SQLite's CROSS JOIN ... ON is a plain join with a fixed order
    sql = _CAST_BLOB.sub(r"convert_to(\1, 'UTF8')", sql)
    sql = _EACH_VALUE.sub("(SELECT value FROM jsonb_array_elements_text(?::jsonb))", sql)
    sql = _EACH.sub("jsonb_array_elements(?::jsonb)", sql)
    sql = _IS_NOT_PARAM.sub("IS DISTINCT FROM ?", sql)
    sql = _IS_PARAM.sub("IS NOT DISTINCT FROM ?", sql)
    sql = _IFNULL.sub("coalesce(", sql)
    sql = _scalar_minmax(sql)
    sql = _alias_subqueries(sql)
    m = _OR_REPLACE.match(sql)
    if m:
        sql = _upsert(sql, m)
    sql = _qualify_upsert(sql)
    if _OR_IGNORE.search(sql):
        sql = _OR_IGNORE.sub("INSERT INTO", sql)
        sql = _before_returning(sql, " ON CONFLICT DO NOTHING")
    returns_id = False
    m = _INSERT_VALUES.match(sql)
    if m and m.group(1).lower() in ROWID_TABLES and not _RETURNING.search(sql):
        sql = sql.rstrip().rstrip(";") + f" RETURNING {ROWID_TABLES[m.group(1).lower()]}"
        returns_id = True
    return _placeholders(sql, bound), returns_id


_DO_UPDATE = re.compile(r"\bDO\s+UPDATE\s+SET\b", re.I)
_INSERT_TABLE = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.I)
_WORD = re.compile(r"'(?:[^']|'')*'|[A-Za-z_][A-Za-z_0-9]*|.", re.S)


def _qualify_upsert(sql: str) -> str:
    """In ON CONFLICT ... DO UPDATE, a bare column names the existing row in SQLite; PostgreSQL
    finds it ambiguous (EXCLUDED has it too): qualify it with the table's name."""
    m = _DO_UPDATE.search(sql)
    t = _INSERT_TABLE.match(sql)
    if not m or not t:
        return sql
    table = t.group(1)
    columns = set(TABLES.get(table.lower(), ((), ()))[0])
    if not columns:
        raise ValueError(f"upsert into {table}: its columns are not known (see dialect.TABLES)")
    out = [sql[:m.end()]]
    tokens = _WORD.findall(sql[m.end():])
    prev = "SET"  # the previous significant token
    returning = False  # RETURNING sees the row as written: no EXCLUDED there
    for i, tok in enumerate(tokens):
        if tok.upper() == "RETURNING":
            returning = True
        if not returning and tok.lower() in columns and prev != ".":
            rest = "".join(tokens[i + 1:i + 4]).lstrip()
            is_target = prev.upper() in ("SET", ",") and rest.startswith("=")
            if not is_target:
                tok = f"{table}.{tok}"
        out.append(tok)
        if not tok.isspace():
            prev = tok
    return "".join(out)


def _before_returning(sql: str, clause: str) -> str:
    m = _RETURNING.search(sql)
    if m:
        return sql[:m.start()] + clause + sql[m.start():]
    return sql.rstrip().rstrip(";") + clause


def _upsert(sql: str, m: re.Match) -> str:
    """INSERT OR REPLACE -> INSERT ... ON CONFLICT (primary key) DO UPDATE, every other column set
    from the new row or back to its default (SQLite deletes the old row and inserts the new one)."""
    table = m.group(1).lower()
    if table not in TABLES:
        raise ValueError(f"INSERT OR REPLACE into {table}: its columns are not known (see dialect.TABLES)")
    columns, key = TABLES[table]
    named = [c.strip().lower() for c in m.group(2).split(",")]
    sets = [f"{c} = EXCLUDED.{c}" if c in named else f"{c} = DEFAULT" for c in columns if c not in key]
    head = re.match(r"\s*INSERT\s+OR\s+REPLACE\s+INTO", sql, re.I)
    sql = "INSERT INTO" + sql[head.end():]
    return _before_returning(sql, f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(sets)}")


def _matching_paren(sql: str, open_at: int) -> int:
    """Index of the `)` closing the `(` at `open_at` (string literals skipped)."""
    depth = 0
    i = open_at
    n = len(sql)
    while i < n:
        c = sql[i]
        if c == "'":
            i = sql.index("'", i + 1)
            while i + 1 < n and sql[i + 1] == "'":
                i = sql.index("'", i + 2)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced parentheses in {sql!r}")


def _top_level_commas(sql: str, start: int, end: int) -> bool:
    depth = 0
    i = start
    while i < end:
        c = sql[i]
        if c == "'":
            i = sql.index("'", i + 1)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            return True
        i += 1
    return False


def _scalar_minmax(sql: str) -> str:
    """SQLite's scalar max(a, b, ...) / min(a, b, ...) are PostgreSQL's GREATEST / LEAST (the
    aggregates, with one argument, stay)."""
    pos = 0
    while True:
        m = _FUNC.search(sql, pos)
        if not m:
            return sql
        open_at = m.end() - 1
        close = _matching_paren(sql, open_at)
        if _top_level_commas(sql, open_at + 1, close):
            name = "GREATEST" if m.group(1).lower() == "max" else "LEAST"
            sql = sql[:m.start()] + name + sql[open_at:]
        pos = m.start() + 1


def _alias_subqueries(sql: str) -> str:
    pos = 0
    n = 0
    while True:
        m = _FROM_SUB.search(sql, pos)
        if not m:
            return sql
        close = _matching_paren(sql, m.end() - 1)
        rest = sql[close + 1:].lstrip()
        word = re.match(r"[A-Za-z_]+|\)|,|", rest).group(0).upper()
        if word in _NOT_ALIAS:
            n += 1
            sql = sql[:close + 1] + f" AS _sub{n}" + sql[close + 1:]
        pos = m.start() + 1


def _placeholders(sql: str, bound: bool) -> str:
    """`?` -> `%s` outside string literals; with bindings, every literal `%` doubled."""
    if not bound:
        return sql
    out = []
    quoted = False
    for c in sql:
        if c == "'":
            quoted = not quoted
            out.append(c)
        elif c == "%":
            out.append("%%")
        elif c == "?" and not quoted:
            out.append("%s")
        else:
            out.append(c)
    return "".join(out)
