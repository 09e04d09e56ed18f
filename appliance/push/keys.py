"""NIP-PL executor encryption keys: generation, rotation, retirement window, erasure.

Private keys are wrapped by the appliance key file (a copy of the SQLite file alone leaks
nothing). States: ``current`` (exactly one per push-enabled origin), ``retiring`` (keeps
decrypting until ``accept_until = became_retiring_at + max_lease_ttl + allowed_skew``, the
limits in force when it was rotated out) and ``expired`` (rejected as ``invalid: unknown
executor key``; its wrapped secret is erased once no unexpired active lease names it).
"""

from __future__ import annotations

import secrets
import time

from appliance.nostr.keys import generate_secret, public_key
from appliance.store import executor_keys as rows
from appliance.store.executor_keys import KeyRow, dependent_leases, list_keys
from appliance.store.interface import Connection
from appliance.store.keyfile import KeyFile
from appliance.store.meta import node_lock

from .descriptor import ExecutorKey, Limits

class KeyNotErasable(ValueError):
    """Erasing this key now would break accepted leases (or it is the current key)."""


def _label(origin: int, key_id: str) -> str:
    return f"executor-key:{origin}:{key_id}"


def new_key_id(now: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now)) + "-" + secrets.token_hex(3)


def create_current(conn: Connection, keyfile: KeyFile, origin: int, now: int) -> KeyRow:
    secret = generate_secret()
    kid = new_key_id(now)
    rows.insert_current(conn, origin, kid, public_key(secret),
                        keyfile.wrap(bytes.fromhex(secret), label=_label(origin, kid)), now)
    return next(k for k in list_keys(conn, origin) if k.key_id == kid)


def ensure_current(conn: Connection, keyfile: KeyFile, origin: int, now: int) -> None:
    """Generate the first executor key of a push-enabled origin (inside a write transaction).
    Several nodes reloading a new origin at once: one makes the key, the others then see it."""
    node_lock(conn, f"executor-keys:{origin}")
    if not any(k.state == "current" for k in list_keys(conn, origin)):
        create_current(conn, keyfile, origin, now)


def rotate(conn: Connection, keyfile: KeyFile, origin: int, limits: Limits, now: int) -> KeyRow:
    """Make a new current key; the old one retires for max_lease_ttl + allowed_skew."""
    node_lock(conn, f"executor-keys:{origin}")
    rows.retire_current(conn, origin, now, now + limits.max_lease_ttl + limits.allowed_skew)
    return create_current(conn, keyfile, origin, now)


def erase(conn: Connection, origin: int, key_id: str, now: int) -> None:
    """Erase a retired key's private material at once (it stops decrypting and is no longer
    advertised); only when no accepted lease depends on it. The current key is never erased."""
    row = next((k for k in list_keys(conn, origin) if k.key_id == key_id), None)
    if row is None:
        raise KeyNotErasable(f"no executor key {key_id!r}")
    if row.state == "current":
        raise KeyNotErasable("the current key cannot be erased: rotate first")
    n = dependent_leases(conn, origin, now).get(key_id, 0)
    if n:
        raise KeyNotErasable(f"{n} active lease(s) still depend on key {key_id}; it is erased automatically "
                             "once they expire or are replaced")
    rows.erase_one(conn, origin, key_id)


def advertised(rows: list[KeyRow], now: int) -> tuple[ExecutorKey, ...]:
    """Descriptor keys: current first, then retiring keys still inside their window."""
    out = [ExecutorKey(k.key_id, k.pubkey, current=True) for k in rows if k.state == "current"]
    out += [ExecutorKey(k.key_id, k.pubkey, retiring=True) for k in rows
            if k.state == "retiring" and k.accepts(now)]
    return tuple(out)


def load_secrets(conn: Connection, keyfile: KeyFile, origin: int) -> dict[str, tuple[str, KeyRow]]:
    """key_id -> (secret_hex, row) for keys that still hold private material."""
    out: dict[str, tuple[str, KeyRow]] = {}
    by_id = {k.key_id: k for k in list_keys(conn, origin)}
    for kid, wrapped in rows.wrapped_secrets(conn, origin):
        out[kid] = (keyfile.unwrap(wrapped, label=_label(origin, kid)).hex(), by_id[kid])
    return out
