"""The change counter that tells a running appliance to reload state edited out of process, and the
health check's probe row."""

from __future__ import annotations

import hashlib
from appliance.store.interface import Connection, is_sqlite
from appliance.store.statement import PgText, SQL


SQL_BUMP_GENERATION = SQL("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE name = 'config_generation'",
                          "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE name = 'config_generation'")
SQL_GENERATION = SQL("SELECT value FROM meta WHERE name = 'config_generation'",
                     "SELECT value FROM meta WHERE name = 'config_generation'")
# Several nodes over PostgreSQL: a transaction-scoped lock on a name's 64-bit key (`lock_key`).
SQL_NODE_LOCK = PgText("SELECT pg_advisory_xact_lock(%s)")
SQL_HEALTH_PROBE = SQL(
    "INSERT INTO meta (name, value) VALUES ('health_probe', ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    "INSERT INTO meta (name, value) VALUES ('health_probe', %s) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
)
SQL_META = SQL("SELECT value FROM meta WHERE name = ?", "SELECT value FROM meta WHERE name = %s")
SQL_SET_META = SQL(
    "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    "INSERT INTO meta (name, value) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
)


def meta_value(conn: Connection, name: str) -> str | None:
    """A value of the `meta` table (None: not set)."""
    row = conn.execute(SQL_META, (name,)).fetchone()
    return row[0] if row else None


def set_meta(conn: Connection, name: str, value: str) -> None:
    conn.execute(SQL_SET_META, (name, value))


SQL_READ_PROBE = SQL("SELECT 1", "SELECT 1")


def read_probe(conn: Connection) -> None:
    """The cheapest real read: the health check's proof that a reader answers."""
    conn.execute(SQL_READ_PROBE).fetchone()


def bump_generation(conn: Connection) -> None:
    """Tell a running appliance that origins, groups or keys changed outside it (the CLI)."""
    conn.execute(SQL_BUMP_GENERATION)


def lock_key(name: str) -> int:
    """The 64-bit advisory lock key of a node lock's name: the first 8 bytes of its BLAKE2b, signed.
    Computed here rather than by the server so that a transaction can sort the keys it needs
    before it takes any (a hash collision between two names costs only a little waiting)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


def node_lock(conn, *names: str) -> None:
    """Serialize the rest of this write transaction with every other node's transactions that
    lock one of `names`, until commit (PostgreSQL advisory locks). Nothing to do on SQLite: its one
    writer serializes every write already.

    Every write transaction takes its node locks in one global order, ascending key, so no two
    nodes ever wait on each other in a cycle: the writer's connection knows the keys its
    transaction holds (`HeldLocks`), and a key below the highest one held raises `LockOrder`,
    on which the writer commits what came before, and runs the operation again in a transaction
    that takes all the keys it needs first, in order (store.writer)."""
    if is_sqlite(conn):
        return
    keys = sorted({lock_key(name) for name in names})
    held: HeldLocks | None = getattr(conn, "locks", None)
    if held is None:
        for key in keys:
            conn.execute(SQL_NODE_LOCK, (key,))
    else:
        held.take(conn, keys)


class LockOrder(BaseException):
    """An operation needs node locks ordered below one its transaction holds: the writer commits
    what came before and runs the operation again with `keys` (those it held and those it asked
    for) taken first, in order. A BaseException, so that no operation's own `except Exception`
    turns it into the operation's failure."""

    def __init__(self, keys: frozenset[int]):
        super().__init__(f"{len(keys)} node locks to take in order")
        self.keys = keys


class HeldLocks:
    """The node locks a PostgreSQL write transaction holds, in the order taken, with its savepoints
    (rolling back to a savepoint releases the advisory locks taken since, as PostgreSQL does).
    With `ordered` set (the writer's connection), a key below the highest held raises `LockOrder`
    instead of being waited for; otherwise every key is taken as asked and nothing is followed
    (one-off transactions of a tool, autocommit statements)."""

    __slots__ = ("keys", "taken", "top", "savepoints", "ordered")

    def __init__(self, ordered: bool = False):
        self.keys: set[int] = set()
        self.taken: list[int] = []  # in the order taken
        self.top: list[int] = []  # top[i]: the highest of taken[:i + 1]
        self.savepoints: list[tuple[str, int]] = []  # (name, len(taken) when it was made)
        self.ordered = ordered

    def take(self, conn, keys: list[int]) -> None:
        """Lock the ascending `keys` this transaction does not hold yet."""
        if not self.ordered:  # not the writer's: lock them all, as asked (no transaction to follow)
            for key in keys:
                conn.execute(SQL_NODE_LOCK, (key,))
            return
        new = [k for k in keys if k not in self.keys]
        if not new:
            return
        if self.top and new[0] < self.top[-1]:
            raise LockOrder(frozenset(self.keys).union(new))
        for key in new:
            conn.execute(SQL_NODE_LOCK, (key,))
            self.keys.add(key)
            self.taken.append(key)
            self.top.append(key if not self.top or key > self.top[-1] else self.top[-1])

    # -- transaction control, as the connection runs it ------------------------------------------

    def end(self) -> None:
        """COMMIT or ROLLBACK: every advisory lock of the transaction is released."""
        self.keys.clear()
        self.taken.clear()
        self.top.clear()
        self.savepoints.clear()

    def savepoint(self, name: str) -> None:
        self.savepoints.append((name, len(self.taken)))

    def _find(self, name: str) -> int | None:
        for i in range(len(self.savepoints) - 1, -1, -1):
            if self.savepoints[i][0] == name:
                return i
        return None

    def rollback_to(self, name: str) -> None:
        i = self._find(name)
        if i is None:
            return
        mark = self.savepoints[i][1]
        del self.savepoints[i + 1:]
        for key in self.taken[mark:]:
            self.keys.discard(key)
        del self.taken[mark:]
        del self.top[mark:]

    def release(self, name: str) -> None:
        i = self._find(name)
        if i is not None:
            del self.savepoints[i:]

    def statement(self, sql: str) -> None:
        """Follow a transaction control statement run on the connection."""
        head = sql.split(None, 3)
        if not head:
            return
        verb = head[0].upper()
        if verb in ("BEGIN", "COMMIT", "ROLLBACK", "END", "ABORT"):
            if verb == "ROLLBACK" and len(head) > 1 and head[1].upper() == "TO":
                name = head[-1] if head[2].upper() == "SAVEPOINT" else head[2]
                self.rollback_to(name.rstrip(";"))
            else:
                self.end()
        elif verb == "SAVEPOINT" and len(head) > 1:
            self.savepoint(head[1].rstrip(";"))
        elif verb == "RELEASE" and len(head) > 1:
            name = head[-1] if head[1].upper() == "SAVEPOINT" else head[1]
            self.release(name.rstrip(";"))


def config_generation(conn: Connection) -> int:
    row = conn.execute(SQL_GENERATION).fetchone()
    return int(row[0]) if row else 0


def health_probe(now: float):
    """A real one-row write for the health check (an empty transaction commits whatever happens).
    It is marked `probe`: the writer does not take it as proof that writes fit again after the
    disk filled up, since one small row often still fits where events do not."""

    def op(conn: Connection) -> None:
        conn.execute(SQL_HEALTH_PROBE, (f"{now:.3f}",))

    op.probe = True
    return op
