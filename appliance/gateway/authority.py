"""The gateway's durable authority: challenges, installations, delegations, grant keys, delivery fences.

Every function here runs inside one transaction of the store (`store.write(op)` / `store.read(fn)`),
so each authority transition is atomic: a challenge is consumed, an assertion counter advanced and
the route's change applied together. Functions that can refuse return an `Outcome` rather than
raise, so what must stick (a consumed challenge, a burned NIP-98 event id) commits with the refusal.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from appliance.store import gateway as rows
from appliance.store.interface import Connection
from appliance.store.keyfile import KeyFile

from .grants import Grant, Keyring, new_key_id


class Outcome(enum.Enum):
    OK = "ok"
    NOT_AUTHORIZED = "not_authorized"          # 404 not_authorized
    INVALID_ATTESTATION = "invalid_attestation"  # 401: replayed counter, vanished installation
    UNAVAILABLE = "temporarily_unavailable"    # 503
    INVALID_GRANT = "invalid_grant"            # 404 invalid_grant


# -- challenges ----------------------------------------------------------------------------------


def put_challenge(conn: Connection, challenge_id: str, value: bytes, expires_at: int, now: int,
                  max_pending: int) -> Outcome:
    """Store a new challenge unless `max_pending` unexpired ones already wait (unauthenticated route)."""
    if rows.pending_challenges(conn, now, max_pending) >= max_pending:
        return Outcome.UNAVAILABLE
    rows.put_challenge(conn, challenge_id, hashlib.sha256(value).digest(), expires_at)
    return Outcome.OK


def consume_challenge(conn: Connection, challenge_id: str, value: bytes, now: int) -> bool:
    """Single use: True (and gone) if that id holds that value and has not expired."""
    return rows.consume_challenge(conn, challenge_id, hashlib.sha256(value).digest(), now)


# -- installations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Installation:
    handle: str
    app_profile: str
    public_key: bytes
    sign_count: int
    endpoint_epoch: int
    token: bytes | None  # wrapped
    token_sha256: bytes | None
    expires_at: int
    revoked_at: int | None

    def active(self, now: int) -> bool:
        return self.revoked_at is None and now <= self.expires_at


def token_label(handle: str, epoch: int) -> str:
    """Associated data binding a wrapped APNs token to its installation and endpoint epoch."""
    return f"gateway-token:{handle}:{epoch}"


def token_digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def installation(conn: Connection, handle: str) -> Installation | None:
    row = rows.installation_row(conn, handle)
    return Installation(*row) if row else None


def _token_free(conn: Connection, profile: str, digest: bytes, now: int, owner: str | None) -> bool:
    """Whether (profile, SHA-256(token)) is free for `owner`; an expired holder is removed first."""
    row = rows.token_owner(conn, profile, digest)
    if row is None or row[0] == owner:
        return True
    if now > row[1]:  # expired: its custody ends, and so does its claim on the token
        rows.delete_installation(conn, row[0])
        return True
    return False


def enroll(conn: Connection, *, handle: str, challenge_id: str, challenge: bytes, profile: str,
           key_id: bytes, public_key: bytes, token: bytes, keyfile: KeyFile, expires_at: int, now: int) -> Outcome:
    """Consume the challenge, then create the installation unless its key or token is taken."""
    if not consume_challenge(conn, challenge_id, challenge, now):
        return Outcome.NOT_AUTHORIZED
    digest = token_digest(token)
    if rows.key_id_taken(conn, key_id) or not _token_free(conn, profile, digest, now, None):
        return Outcome.NOT_AUTHORIZED
    rows.insert_installation(conn, handle=handle, profile=profile, key_id=key_id, public_key=public_key, epoch=1,
                             wrapped_token=keyfile.wrap(token, label=token_label(handle, 1)), digest=digest,
                             expires_at=expires_at, now=now)
    return Outcome.OK


def begin_asserted(conn: Connection, *, handle: str, challenge_id: str, challenge: bytes, counter: int,
                   now: int) -> Outcome:
    """The common start of every assertion route, after the signature verified: the counter must still
    be above the stored one (strictly increasing, atomically), then the challenge is consumed."""
    if not rows.advance_counter(conn, handle, counter):
        return Outcome.INVALID_ATTESTATION
    if not consume_challenge(conn, challenge_id, challenge, now):
        return Outcome.NOT_AUTHORIZED
    return Outcome.OK


def rotate_endpoint(conn: Connection, inst: Installation, *, epoch: int, new_epoch: int, token: bytes,
                    keyfile: KeyFile, now: int) -> Outcome:
    digest = token_digest(token)
    if not _token_free(conn, inst.app_profile, digest, now, inst.handle):
        return Outcome.NOT_AUTHORIZED
    rotated = rows.rotate_token(conn, inst.handle, epoch, new_epoch,
                                keyfile.wrap(token, label=token_label(inst.handle, new_epoch)), digest)
    return Outcome.OK if rotated else Outcome.NOT_AUTHORIZED


def revoke_installation(conn: Connection, inst: Installation, *, epoch: int, new_epoch: int,
                        now: int) -> Outcome:
    """Invalidate the installation and every delegation at once; the token custody is erased.
    Repeating a revocation that already took effect (same epochs) succeeds again."""
    if rows.revoke_installation(conn, inst.handle, epoch, new_epoch, now):
        return Outcome.OK
    if inst.revoked_at is not None and inst.endpoint_epoch == new_epoch:
        return Outcome.OK
    return Outcome.NOT_AUTHORIZED


# -- delegations ---------------------------------------------------------------------------------


def delegate(conn: Connection, inst: Installation, *, relay_pubkey: str, epoch: int, generation: int,
             not_before: int, expires_at: int, grant_key_id: str) -> Outcome:
    """Record the delegation if it names the current epoch, ends within the installation's lifetime
    and raises the (installation, relay) generation; the sealing key remembers the grant's expiry."""
    if epoch != inst.endpoint_epoch or expires_at > inst.expires_at:
        return Outcome.NOT_AUTHORIZED
    if not rows.upsert_delegation(conn, inst.handle, relay_pubkey, epoch, generation, not_before, expires_at):
        return Outcome.NOT_AUTHORIZED  # generation not above the last one for this relay
    rows.raise_key_expiry(conn, grant_key_id, expires_at)
    return Outcome.OK


def revoke_delegation(conn: Connection, inst: Installation, *, relay_pubkey: str, generation: int,
                      now: int) -> Outcome:
    """Revoke the current delegation generation; repeating it succeeds again."""
    if rows.revoke_delegation(conn, inst.handle, relay_pubkey, generation, now):
        return Outcome.OK
    row = rows.delegation_row(conn, inst.handle, relay_pubkey)
    if row is not None and row[1] == generation and row[4] is not None:
        return Outcome.OK
    return Outcome.NOT_AUTHORIZED


# -- delivery fences -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    outcome: Outcome
    handle: str = ""
    epoch: int = 0
    token: bytes | None = None  # wrapped


def admit_delivery(conn: Connection, *, event_id: str, event_expires_at: int, signer: str,
                   grant: Grant | None, request_id: str, request_expires_at: int, enabled: frozenset[str],
                   quota_window: int, quota_max: int, now: int) -> Admission:
    """The delivery reservation transaction; its commit is send-begin.

    The NIP-98 event id is burned first, whatever follows (every id is burned at admission). Then the
    grant's authority (signer, installation, epoch, delegation generation, times, profile), the
    (relay, request_id) reservation and the endpoint quota: all or nothing beyond the burn.
    """
    if not rows.burn_event(conn, event_id, event_expires_at) or grant is None:
        return Admission(Outcome.INVALID_GRANT)
    if (grant.relay_pubkey != signer or not grant.not_before <= now <= grant.expires_at
            or not now <= request_expires_at <= grant.expires_at or grant.app_profile not in enabled):
        return Admission(Outcome.INVALID_GRANT)
    inst = installation(conn, grant.installation)
    if (inst is None or not inst.active(now) or inst.endpoint_epoch != grant.endpoint_epoch
            or inst.app_profile != grant.app_profile or inst.token is None):
        return Admission(Outcome.INVALID_GRANT)
    d = rows.delegation_row(conn, inst.handle, signer)
    if d is None:
        return Admission(Outcome.INVALID_GRANT)
    d_epoch, d_generation, d_not_before, d_expires_at, d_revoked_at = d
    if (d_revoked_at is not None or d_generation != grant.generation or d_epoch != grant.endpoint_epoch
            or not d_not_before <= now <= d_expires_at):
        return Admission(Outcome.INVALID_GRANT)
    # Quota before the reservation insert: a refusal must leave no reservation behind.
    row = rows.quota(conn, inst.app_profile, inst.token_sha256)
    start, admitted = (now, 0) if row is None or now - row[0] >= quota_window else row
    if admitted >= quota_max:
        return Admission(Outcome.INVALID_GRANT)
    if not rows.reserve(conn, signer, request_id, request_expires_at):
        return Admission(Outcome.INVALID_GRANT)  # that request id is in flight or finished
    rows.set_quota(conn, inst.app_profile, inst.token_sha256, start, admitted + 1)
    return Admission(Outcome.OK, inst.handle, inst.endpoint_epoch, inst.token)


def release_reservation(conn: Connection, signer: str, request_id: str) -> None:
    """A transient or configuration outcome releases the reservation after provider processing, so a
    fresh NIP-98 event may retry the job. A terminal outcome keeps the row committed at send-begin
    as it is: no write at all."""
    rows.release(conn, signer, request_id)


# -- grant keys ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrantKeyRow:
    key_id: str
    state: str
    created_at: int
    retired_at: int | None
    max_expires_at: int
    has_secret: bool

    def to_json(self) -> dict:
        return {"id": self.key_id, "state": self.state, "created_at": self.created_at,
                "retired_at": self.retired_at, "decrypts_until": self.max_expires_at if self.state == "retired" else None,
                "secret_held": self.has_secret}


def _grant_label(key_id: str) -> str:
    return f"gateway-grant-key:{key_id}"


def grant_keys(conn: Connection) -> list[GrantKeyRow]:
    return [GrantKeyRow(kid, state, created, retired, max_exp, wrapped is not None)
            for kid, wrapped, state, created, retired, max_exp in rows.grant_key_rows(conn)]


def ensure_grant_key(conn: Connection, keyfile: KeyFile, now: int) -> None:
    if not any(k.state == "current" for k in grant_keys(conn)):
        _new_grant_key(conn, keyfile, now)


def _new_grant_key(conn: Connection, keyfile: KeyFile, now: int) -> str:
    import secrets

    kid = new_key_id(now)
    rows.insert_grant_key(conn, kid, keyfile.wrap(secrets.token_bytes(32), label=_grant_label(kid)), now)
    return kid


def rotate_grant_key(conn: Connection, keyfile: KeyFile, now: int) -> str:
    """A new current sealing key; the old one keeps opening the grants it sealed until they expire."""
    rows.retire_grant_key(conn, now)
    return _new_grant_key(conn, keyfile, now)


def load_keyring(conn: Connection, keyfile: KeyFile, now: int) -> Keyring:
    current: tuple[str, bytes] | None = None
    older: dict[str, bytes] = {}
    for kid, wrapped, state, _created, _retired, max_exp in rows.grant_key_rows(conn):
        if wrapped is None:
            continue
        if state == "current":
            current = (kid, keyfile.unwrap(wrapped, label=_grant_label(kid)))
        elif max_exp >= now:
            older[kid] = keyfile.unwrap(wrapped, label=_grant_label(kid))
    if current is None:
        raise LookupError("no current grant key")
    return Keyring(current, older)


# -- retention -----------------------------------------------------------------------------------

def maintain(conn: Connection, now: int, quota_window: int) -> int:
    """Drop what no rule needs any more; erase grant keys whose grants have all expired.
    Returns how many key secrets were erased (the caller scrubs the WAL then)."""
    return rows.maintain(conn, now, quota_window)
