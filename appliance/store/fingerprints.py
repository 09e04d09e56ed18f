"""Fingerprints of what operators are never shown in full (`pk:1a2b3c4d5e`), and the pubkeys this
instance has seen, to resolve a fingerprint an operator copied from the dashboard back to its pubkey.

A fingerprint is a keyed hash (HMAC-SHA256 under a key the key file derives, "admin-fingerprint"):
the same on every page, across restarts and on every node with the key file, and nobody who sees
one can check it against a pubkey they know. It is not reversible: resolving one hashes each
pubkey this instance has seen (authors of stored events and leases, lease `authors` selectors,
group members, an origin's lists) and keeps those that match. 40 bits tell one instance's users
apart, but not always: two matches are refused as ambiguous, never guessed.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Iterable, Iterator

from appliance.store.statement import SQL

FINGERPRINT_HEX = 10  # 40 bits
KEY_PURPOSE = "admin-fingerprint"

# Pubkeys seen at one origin, and at all of them (each column of each table is indexed by origin first).
SQL_SEEN = (
    SQL("SELECT DISTINCT pubkey FROM events WHERE origin = ?",
        "SELECT DISTINCT pubkey FROM events WHERE origin = %s"),
    SQL("SELECT DISTINCT pubkey FROM leases WHERE origin = ?",
        "SELECT DISTINCT pubkey FROM leases WHERE origin = %s"),
    SQL("SELECT DISTINCT value FROM lease_selectors WHERE origin = ? AND selector_type = 'authors'",
        "SELECT DISTINCT value FROM lease_selectors WHERE origin = %s AND selector_type = 'authors'"),
    SQL("SELECT DISTINCT pubkey FROM group_members WHERE origin = ?",
        "SELECT DISTINCT pubkey FROM group_members WHERE origin = %s"),
)
SQL_SEEN_ALL = (
    SQL("SELECT DISTINCT pubkey FROM events", "SELECT DISTINCT pubkey FROM events"),
    SQL("SELECT DISTINCT pubkey FROM leases", "SELECT DISTINCT pubkey FROM leases"),
    SQL("SELECT DISTINCT value FROM lease_selectors WHERE selector_type = 'authors'",
        "SELECT DISTINCT value FROM lease_selectors WHERE selector_type = 'authors'"),
    SQL("SELECT DISTINCT pubkey FROM group_members", "SELECT DISTINCT pubkey FROM group_members"),
)


def fingerprint(key: bytes, value: str, kind: str = "pk") -> str:
    """`pk:1a2b3c4d5e` (kinds: pk a pubkey, author or #p value alike; ep an endpoint; lease a lease address)."""
    digest = hmac.new(key, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()
    return f"{kind}:{digest[:FINGERPRINT_HEX]}"


def seen_pubkeys(conn, origin: int | None = None) -> Iterator[str]:
    """Every pubkey this instance has seen (at `origin`, or anywhere), each at least once."""
    for sql in SQL_SEEN if origin is not None else SQL_SEEN_ALL:
        for (value,) in conn.execute(sql, (origin,) if origin is not None else ()):
            yield value


def matching(key: bytes, fp: str, candidates: Iterable[str]) -> list[str]:
    """The distinct candidates whose pubkey fingerprint is `fp`."""
    found: dict[str, None] = {}
    for value in candidates:
        if value not in found and fingerprint(key, value, "pk") == fp:
            found[value] = None
    return list(found)
