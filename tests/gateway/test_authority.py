"""The authority transactions on a real store (the suite's backend): challenges, counters, fences, quota, retention."""

from __future__ import annotations

import hashlib
import secrets
import uuid

import pytest

from appliance.gateway import authority as auth
from appliance.gateway.grants import Grant
from appliance.store import gateway as gateway_rows
from appliance.store.keyfile import KeyFile
from appliance.store.statement import SQL
from tests.pg import make_store

NOW = 1_800_000_000
RELAY = "ab" * 32
PROFILE = "buzz-ios-production"


@pytest.fixture
def store(tmp_path):
    with make_store(tmp_path) as s:
        yield s


@pytest.fixture
def keyfile(tmp_path, store):
    return KeyFile.for_store(tmp_path, store)


def put(store, value=None, now=NOW, max_pending=100):
    cid, value = str(uuid.uuid4()), value or secrets.token_bytes(32)
    assert store.write_sync(lambda c: auth.put_challenge(c, cid, value, now + 300, now, max_pending)) is auth.Outcome.OK
    return cid, value


def enroll(store, keyfile, *, token=None, key_id=None, now=NOW, expires_at=NOW + 86400):
    cid, value = put(store, now=now)
    handle = str(uuid.uuid4())
    out = store.write_sync(lambda c: auth.enroll(c, handle=handle, challenge_id=cid, challenge=value, profile=PROFILE,
                                                 key_id=key_id or secrets.token_bytes(32), public_key=b"\x04" * 65,
                                                 token=token or secrets.token_bytes(32), keyfile=keyfile,
                                                 expires_at=expires_at, now=now))
    return out, handle


def test_challenges_single_use_expiry_and_bound(store):
    cid, value = put(store)
    assert not store.write_sync(lambda c: auth.consume_challenge(c, cid, secrets.token_bytes(32), NOW))
    assert not store.write_sync(lambda c: auth.consume_challenge(c, cid, value, NOW + 300))  # expired at 300 s
    assert store.write_sync(lambda c: auth.consume_challenge(c, cid, value, NOW + 299))
    assert not store.write_sync(lambda c: auth.consume_challenge(c, cid, value, NOW + 1))  # single use
    for _ in range(2):
        put(store, max_pending=3)
    assert store.write_sync(lambda c: auth.put_challenge(c, str(uuid.uuid4()), b"x" * 32, NOW + 300, NOW, 2)) \
        is auth.Outcome.UNAVAILABLE
    # Expired ones do not count, and maintenance drops them.
    assert store.write_sync(lambda c: auth.put_challenge(c, str(uuid.uuid4()), b"x" * 32, NOW + 900, NOW + 600, 2)) \
        is auth.Outcome.OK
    store.write_sync(lambda c: auth.maintain(c, NOW + 600, 10))
    assert store.read_sync(lambda c: c.execute(SQL("SELECT count(*) FROM gateway_challenges",
                                                   "SELECT count(*) FROM gateway_challenges")).fetchone()[0]) == 1


def test_enrollment_uniqueness_and_expired_holders(store, keyfile):
    tok, kid = secrets.token_bytes(32), secrets.token_bytes(32)
    out, first = enroll(store, keyfile, token=tok, key_id=kid, expires_at=NOW + 100)
    assert out is auth.Outcome.OK
    assert enroll(store, keyfile, token=tok)[0] is auth.Outcome.NOT_AUTHORIZED
    assert enroll(store, keyfile, key_id=kid)[0] is auth.Outcome.NOT_AUTHORIZED
    # After the holder expired, its token is free again (its custody ends with it).
    out, second = enroll(store, keyfile, token=tok, now=NOW + 101, expires_at=NOW + 1000)
    assert out is auth.Outcome.OK
    assert store.read_sync(lambda c: auth.installation(c, first)) is None
    inst = store.read_sync(lambda c: auth.installation(c, second))
    assert keyfile.unwrap(inst.token, label=auth.token_label(second, 1)) == tok
    assert inst.token_sha256 == hashlib.sha256(tok).digest()


def test_counter_advances_atomically(store, keyfile):
    _, handle = enroll(store, keyfile)
    for counter, expected in ((5, auth.Outcome.OK), (5, auth.Outcome.INVALID_ATTESTATION),
                              (4, auth.Outcome.INVALID_ATTESTATION), (6, auth.Outcome.OK)):
        cid, value = put(store)
        out = store.write_sync(lambda c: auth.begin_asserted(c, handle=handle, challenge_id=cid, challenge=value,
                                                            counter=counter, now=NOW))
        assert out is expected


def _grant(handle, **kw):
    fields = dict(installation=handle, relay_pubkey=RELAY, endpoint_epoch=1, generation=1, app_profile=PROFILE,
                  not_before=NOW - 10, expires_at=NOW + 3600)
    fields.update(kw)
    return Grant(**fields)


def admit(store, grant, *, event_id=None, request_id=None, signer=RELAY, now=NOW, expires_at=NOW + 60,
          quota=(10, 100), enabled=frozenset({PROFILE})):
    return store.write_sync(lambda c: auth.admit_delivery(
        c, event_id=event_id or secrets.token_hex(32), event_expires_at=now + 61, signer=signer, grant=grant,
        request_id=request_id or str(uuid.uuid4()), request_expires_at=expires_at, enabled=enabled,
        quota_window=quota[0], quota_max=quota[1], now=now))


def delegated(store, keyfile, generation=1):
    _, handle = enroll(store, keyfile)
    inst = store.read_sync(lambda c: auth.installation(c, handle))
    assert store.write_sync(lambda c: auth.delegate(c, inst, relay_pubkey=RELAY, epoch=1, generation=generation,
                                                    not_before=NOW - 10, expires_at=NOW + 3600,
                                                    grant_key_id="k")) is auth.Outcome.OK
    return handle


def test_admission_checks_every_binding(store, keyfile):
    handle = delegated(store, keyfile)
    ok = _grant(handle)
    assert admit(store, ok).outcome is auth.Outcome.OK
    bad = [
        (None, {}),
        (_grant(handle, relay_pubkey="cd" * 32), {}),                   # grant for another relay
        (ok, {"signer": "cd" * 32}),                                     # signed by another relay
        (_grant(handle, generation=2), {}),                              # not the delegation's generation
        (_grant(handle, endpoint_epoch=2), {}),                          # not the installation's epoch
        (_grant(handle, app_profile="buzz-ios-sandbox"), {}),            # not the installation's profile
        (_grant(str(uuid.uuid4())), {}),                                 # unknown installation
        (ok, {"expires_at": NOW - 1}),                                   # request already expired
        (ok, {"expires_at": NOW + 3601}),                                # request outlives the grant
        (_grant(handle, not_before=NOW + 5), {}),                        # grant not yet valid
        (_grant(handle, expires_at=NOW - 1), {"expires_at": NOW - 1}),   # grant expired
        (ok, {"enabled": frozenset()}),                                  # profile disabled since
    ]
    for grant, kw in bad:
        assert admit(store, grant, **kw).outcome is auth.Outcome.INVALID_GRANT, (grant, kw)
    # The delegation's own window binds too (now past its expiry).
    assert admit(store, _grant(handle, expires_at=NOW + 7200), now=NOW + 3601,
                 expires_at=NOW + 3700).outcome is auth.Outcome.INVALID_GRANT


def test_event_ids_burn_at_admission_even_when_refused(store, keyfile):
    handle = delegated(store, keyfile)
    ev = secrets.token_hex(32)
    assert admit(store, None, event_id=ev).outcome is auth.Outcome.INVALID_GRANT
    assert admit(store, _grant(handle), event_id=ev).outcome is auth.Outcome.INVALID_GRANT  # burned already
    ev2 = secrets.token_hex(32)
    assert admit(store, _grant(handle), event_id=ev2).outcome is auth.Outcome.OK
    assert admit(store, _grant(handle), event_id=ev2).outcome is auth.Outcome.INVALID_GRANT


def test_request_id_reservation_terminal_and_released(store, keyfile):
    handle = delegated(store, keyfile)
    rid = str(uuid.uuid4())
    assert admit(store, _grant(handle), request_id=rid).outcome is auth.Outcome.OK
    assert admit(store, _grant(handle), request_id=rid).outcome is auth.Outcome.INVALID_GRANT  # in flight
    store.write_sync(lambda c: auth.release_reservation(c, RELAY, rid))
    assert admit(store, _grant(handle), request_id=rid).outcome is auth.Outcome.OK  # released: a retry
    # Kept (terminal): nothing to write, the fence stands until the request's expiry.
    assert admit(store, _grant(handle), request_id=rid).outcome is auth.Outcome.INVALID_GRANT
    # Reservations are per relay: another relay's identical request id is its own.
    other = "cd" * 32
    inst = store.read_sync(lambda c: auth.installation(c, handle))
    store.write_sync(lambda c: auth.delegate(c, inst, relay_pubkey=other, epoch=1, generation=1,
                                             not_before=NOW - 10, expires_at=NOW + 3600, grant_key_id="k"))
    assert admit(store, _grant(handle, relay_pubkey=other), signer=other, request_id=rid).outcome is auth.Outcome.OK
    from appliance.store import gateway as overview

    rows = store.read_sync(lambda c: overview.reservations(c, NOW))
    assert sorted((pk, n, live) for pk, n, live, _exp in rows) == [(RELAY, 1, 1), (other, 1, 1)]
    assert store.read_sync(lambda c: overview.reservations(c, NOW + 61))[0][2] == 0


def test_quota_per_endpoint_charged_per_attempt_never_refunded(store, keyfile):
    handle = delegated(store, keyfile)
    for _ in range(3):
        assert admit(store, _grant(handle), quota=(10, 3)).outcome is auth.Outcome.OK
    assert admit(store, _grant(handle), quota=(10, 3)).outcome is auth.Outcome.INVALID_GRANT
    # A refused replay does not charge; a released transient attempt is not refunded.
    assert admit(store, _grant(handle), quota=(10, 3), now=NOW + 9).outcome is auth.Outcome.INVALID_GRANT
    assert admit(store, _grant(handle), quota=(10, 3), now=NOW + 10).outcome is auth.Outcome.OK  # new window
    # The quota follows the endpoint (token), not the relay or the delegation.
    other = "cd" * 32
    inst = store.read_sync(lambda c: auth.installation(c, handle))
    store.write_sync(lambda c: auth.delegate(c, inst, relay_pubkey=other, epoch=1, generation=1,
                                             not_before=NOW - 10, expires_at=NOW + 3600, grant_key_id="k"))
    for _ in range(2):
        admit(store, _grant(handle, relay_pubkey=other), signer=other, quota=(10, 3), now=NOW + 10)
    assert admit(store, _grant(handle, relay_pubkey=other), signer=other, quota=(10, 3),
                 now=NOW + 10).outcome is auth.Outcome.INVALID_GRANT


def test_revocations(store, keyfile):
    handle = delegated(store, keyfile, generation=3)
    inst = store.read_sync(lambda c: auth.installation(c, handle))
    revoke = lambda g: store.write_sync(lambda c: auth.revoke_delegation(c, inst, relay_pubkey=RELAY, generation=g, now=NOW))  # noqa: E731
    assert revoke(2) is auth.Outcome.NOT_AUTHORIZED
    assert revoke(3) is auth.Outcome.OK and revoke(3) is auth.Outcome.OK
    assert admit(store, _grant(handle, generation=3)).outcome is auth.Outcome.INVALID_GRANT
    assert store.write_sync(lambda c: auth.delegate(c, inst, relay_pubkey=RELAY, epoch=1, generation=3,
                                                    not_before=NOW, expires_at=NOW + 60, grant_key_id="k")) \
        is auth.Outcome.NOT_AUTHORIZED
    assert store.write_sync(lambda c: auth.delegate(c, inst, relay_pubkey=RELAY, epoch=1, generation=4,
                                                    not_before=NOW - 10, expires_at=NOW + 60, grant_key_id="k")) \
        is auth.Outcome.OK
    assert admit(store, _grant(handle, generation=4)).outcome is auth.Outcome.OK
    out = store.write_sync(lambda c: auth.revoke_installation(c, inst, epoch=1, new_epoch=2, now=NOW))
    assert out is auth.Outcome.OK
    after = store.read_sync(lambda c: auth.installation(c, handle))
    assert after.revoked_at == NOW and after.token is None and after.token_sha256 is None and after.endpoint_epoch == 2
    assert admit(store, _grant(handle, generation=4)).outcome is auth.Outcome.INVALID_GRANT
    assert store.read_sync(lambda c: c.execute(
        SQL("SELECT count(*) FROM gateway_delegations WHERE handle = ? AND revoked_at IS NULL",
            "SELECT count(*) FROM gateway_delegations WHERE handle = %s "
            "AND revoked_at IS NULL"), (handle,)).fetchone()[0]) == 0


def test_grant_keys_rotate_and_erase(store, keyfile):
    store.write_sync(lambda c: auth.ensure_grant_key(c, keyfile, NOW))
    ring1 = store.read_sync(lambda c: auth.load_keyring(c, keyfile, NOW))
    sealed = ring1.seal(_grant(str(uuid.uuid4())))
    store.write_sync(lambda c: gateway_rows.raise_key_expiry(c, ring1.current_id, NOW + 3600))
    new = store.write_sync(lambda c: auth.rotate_grant_key(c, keyfile, NOW + 10))
    ring2 = store.read_sync(lambda c: auth.load_keyring(c, keyfile, NOW + 10))
    assert ring2.current_id == new != ring1.current_id
    assert ring2.open(sealed).generation == 1
    # Once every grant it sealed has expired, the old key is dropped from the ring and erased.
    ring3 = store.read_sync(lambda c: auth.load_keyring(c, keyfile, NOW + 3601))
    assert ring3.key_ids == (new,)
    assert store.write_sync(lambda c: auth.maintain(c, NOW + 3600, 10)) == 0
    assert store.write_sync(lambda c: auth.maintain(c, NOW + 3601, 10)) == 1
    rows = store.read_sync(auth.grant_keys)
    assert [(r.state, r.has_secret) for r in rows] == [("retired", False), ("current", True)]
