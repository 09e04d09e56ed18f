"""The group tables (`groups`, `group_members`) and the per-origin relay keys that sign group
snapshots. The rules live in `appliance.relay.groups`; this module only reads and writes rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from appliance.store.interface import Connection
from appliance.store.statement import SQL

SQL_GROUP = SQL("SELECT name, about, picture, closed, private FROM groups WHERE origin = ? AND h = ?",
                "SELECT name, about, picture, closed, private FROM groups WHERE origin = %s AND h = %s")
SQL_GROUPS = SQL("SELECT origin, h, name, about, picture, closed, private FROM groups",
                 "SELECT origin, h, name, about, picture, closed, private FROM groups")
SQL_MEMBERS = SQL("SELECT pubkey, role FROM group_members WHERE origin = ? AND h = ?",
                  "SELECT pubkey, role FROM group_members WHERE origin = %s AND h = %s")
SQL_ALL_MEMBERS = SQL("SELECT origin, h, pubkey, role FROM group_members",
                      "SELECT origin, h, pubkey, role FROM group_members")
SQL_CREATE = SQL(
    "INSERT INTO groups (origin, h, name, about, picture, closed, private, created_at) VALUES (?,?,?,?,?,?,?,?)",
    "INSERT INTO groups (origin, h, name, about, picture, closed, private, created_at) VALUES "
    "(%s,%s,%s,%s,%s,%s,%s,%s)",
)
SQL_UPDATE = SQL(
    "UPDATE groups SET name = ?, about = ?, picture = ?, closed = ?, private = ? WHERE origin = ? AND h = ?",
    "UPDATE groups SET name = %s, about = %s, picture = %s, closed = %s, private = %s WHERE origin = %s AND h = %s",
)
SQL_PUT = SQL(
    "INSERT INTO group_members (origin, h, pubkey, role) VALUES (?,?,?,?) "
    "ON CONFLICT (origin, h, pubkey) DO UPDATE SET role = excluded.role",
    "INSERT INTO group_members (origin, h, pubkey, role) VALUES (%s,%s,%s,%s) "
    "ON CONFLICT (origin, h, pubkey) DO UPDATE SET role = excluded.role",
)
SQL_REMOVE = SQL("DELETE FROM group_members WHERE origin = ? AND h = ? AND pubkey = ?",
                 "DELETE FROM group_members WHERE origin = %s AND h = %s AND pubkey = %s")
SQL_DROP = SQL("DELETE FROM groups WHERE origin = ? AND h = ?", "DELETE FROM groups WHERE origin = %s AND h = %s")
SQL_GROUP_EVENT_ROWS = SQL("SELECT rowid FROM events WHERE origin = ? AND grp = ?",
                           "SELECT rowid FROM events WHERE origin = %s AND grp = %s")
SQL_GROUP_EVENT_BY_ID = SQL("SELECT rowid FROM events WHERE origin = ? AND grp = ? AND id = ?",
                            "SELECT rowid FROM events WHERE origin = %s AND grp = %s AND id = %s")
SQL_RELAY_KEY = SQL("SELECT pubkey, wrapped FROM relay_keys WHERE origin = ?",
                    "SELECT pubkey, wrapped FROM relay_keys WHERE origin = %s")
SQL_SAVE_RELAY_KEY = SQL("INSERT INTO relay_keys (origin, pubkey, wrapped) VALUES (?, ?, ?)",
                         "INSERT INTO relay_keys (origin, pubkey, wrapped) VALUES (%s, %s, %s)")
SQL_IS_PRIVATE = SQL("SELECT private FROM groups WHERE origin = ? AND h = ?",
                     "SELECT private FROM groups WHERE origin = %s AND h = %s")
SQL_IS_MEMBER = SQL("SELECT 1 FROM group_members WHERE origin = ? AND h = ? AND pubkey = ?",
                    "SELECT 1 FROM group_members WHERE origin = %s AND h = %s AND pubkey = %s")
SQL_HIDDEN = SQL(
    "SELECT g.h FROM groups g WHERE g.origin = ? AND g.private = 1 AND NOT EXISTS "
    "(SELECT 1 FROM group_members m WHERE m.origin = g.origin AND m.h = g.h AND m.pubkey = ?)",
    "SELECT g.h FROM groups g WHERE g.origin = %s AND g.private = 1 AND NOT EXISTS "
    "(SELECT 1 FROM group_members m WHERE m.origin = g.origin AND m.h = g.h AND m.pubkey = %s)",
)


@dataclass
class Group:
    h: str
    name: str = ""
    about: str = ""
    picture: str = ""
    closed: bool = False
    private: bool = False
    members: dict[str, str] = field(default_factory=dict)  # pubkey -> role ('' or 'admin')

    def is_admin(self, pubkey: str) -> bool:
        return self.members.get(pubkey) == "admin"


def read_group(conn: Connection, origin: int, h: str) -> Group | None:
    row = conn.execute(SQL_GROUP, (origin, h)).fetchone()
    if row is None:
        return None
    name, about, picture, closed, private = row
    members = dict(conn.execute(SQL_MEMBERS, (origin, h)).fetchall())
    return Group(h, name, about, picture, bool(closed), bool(private), members)


def group_exists(conn: Connection, origin: int, h: str) -> bool:
    return conn.execute(SQL_GROUP, (origin, h)).fetchone() is not None


def all_groups(conn: Connection) -> dict[tuple[int, str], Group]:
    """Every origin's groups with their members, keyed by (origin, h)."""
    groups: dict[tuple[int, str], Group] = {}
    for origin, h, name, about, picture, closed, private in conn.execute(SQL_GROUPS):
        groups[(origin, h)] = Group(h, name, about, picture, bool(closed), bool(private))
    for origin, h, pubkey, role in conn.execute(SQL_ALL_MEMBERS):
        group = groups.get((origin, h))
        if group is not None:
            group.members[pubkey] = role
    return groups


def create_group(conn: Connection, origin: int, h: str, *, name: str, closed: bool, private: bool,
                 now: int) -> None:
    conn.execute(SQL_CREATE, (origin, h, name, "", "", int(closed), int(private), now))


def update_group(conn: Connection, origin: int, h: str, *, name: str, about: str, picture: str,
                 closed: bool, private: bool) -> None:
    conn.execute(SQL_UPDATE, (name, about, picture, int(closed), int(private), origin, h))


def put_member(conn: Connection, origin: int, h: str, pubkey: str, role: str) -> None:
    conn.execute(SQL_PUT, (origin, h, pubkey, role))


def remove_member(conn: Connection, origin: int, h: str, pubkey: str) -> None:
    conn.execute(SQL_REMOVE, (origin, h, pubkey))


def drop_group(conn: Connection, origin: int, h: str) -> None:
    conn.execute(SQL_DROP, (origin, h))


def group_event_rows(conn: Connection, origin: int, h: str) -> list[int]:
    """Row ids of every stored event filed under the group."""
    return [r for (r,) in conn.execute(SQL_GROUP_EVENT_ROWS, (origin, h)).fetchall()]


def group_event_row(conn: Connection, origin: int, h: str, event_id: str) -> int | None:
    row = conn.execute(SQL_GROUP_EVENT_BY_ID, (origin, h, event_id)).fetchone()
    return row[0] if row is not None else None


def relay_key(conn: Connection, origin: int) -> tuple[str, bytes] | None:
    """(pubkey, wrapped secret) of the origin's relay key, if it has one."""
    row = conn.execute(SQL_RELAY_KEY, (origin,)).fetchone()
    return (row[0], row[1]) if row is not None else None


def save_relay_key(conn: Connection, origin: int, pubkey: str, wrapped: bytes) -> None:
    conn.execute(SQL_SAVE_RELAY_KEY, (origin, pubkey, wrapped))


class StoredGroups:
    """A `authz.GroupView` over the group tables as one connection sees them: inside a write
    transaction, that includes the changes it made and not yet committed. The push matcher and the
    wake workers use it, so membership is judged as of their own transaction, not as of the last
    in-memory update."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def is_private(self, origin_id: int, group: str) -> bool:
        row = self.conn.execute(SQL_IS_PRIVATE, (origin_id, group)).fetchone()
        return row is not None and bool(row[0])

    def is_member(self, origin_id: int, group: str, pubkey: str) -> bool:
        return self.conn.execute(SQL_IS_MEMBER, (origin_id, group, pubkey)).fetchone() is not None

    def hidden_groups(self, origin_id: int, reader: str | None) -> frozenset[str]:
        return frozenset(r[0] for r in self.conn.execute(SQL_HIDDEN, (origin_id, reader or "")))

