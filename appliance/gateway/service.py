"""The gateway's routes as methods: parse, verify, one authority transaction, answer.

Each method takes the raw body bytes (and, for deliveries, the Authorization header) and returns
`(status, body bytes)`; every refusal is a `GatewayError` with one of the spec's closed bodies.
Order on the assertion routes: closed-object and value rules (400) -> the installation's stored key
(an unknown, revoked or expired installation answers exactly as a bad assertion does: 401
invalid_attestation, so no one learns whether a handle exists) -> the transcript's assertion (401)
-> one write transaction: counter still above the stored one, challenge consumed, the route's
change (404 not_authorized when state forbids it; the caller proved possession of the key).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import secrets
import time
import uuid
from typing import Any, Callable

import orjson

from appliance.errors import ConfigError
from appliance.nostr.nip98 import HttpAuthError, verify_http_auth
from appliance.store.interface import Store
from appliance.transports.apns import ApnsTransport
from appliance.transports.base import (
    ACCEPTED,
    CONFIGURATION,
    INVALID_ENDPOINT,
    PERMANENT,
    REFRESH_RETRY,
    TRANSIENT,
    Outcome,
    Transport,
    WakeRequest,
)
from appliance.transports.credentials import CredentialError, ProviderToken
from appliance.store.keyfile import KeyFile

from . import authority as auth
from . import transcript as tr
from . import wire
from .attest import AttestationFailed, Verifier, load_roots
from .config import GatewayConfig
from .errors import (
    ConfigurationFault,
    InvalidAttestation,
    InvalidAuth,
    InvalidGrant,
    InvalidRequest,
    NotAuthorized,
    TemporarilyUnavailable,
)
from .grants import Grant, GrantInvalid, Keyring

log = logging.getLogger("appliance.gateway")

CHALLENGE_TTL = 300  # NIP-PL: challenges expire after 300 seconds
NOT_BEFORE_SLACK = 300  # NIP-PL: not_before <= now + 300
NIP98_WINDOW = 60  # NIP-98's suggested created_at window, in seconds
#: Unexpired challenges allowed at once: the route is unauthenticated, so its table is bounded.
DEFAULT_MAX_PENDING_CHALLENGES = 100_000
#: Gateway-local ceiling on apns-expiration: a reconnect wake older than an hour is noise.
DEFAULT_APNS_EXPIRATION_CEILING = 3600

Answer = tuple[int, bytes]

# Stands in for an unknown installation's key, so refusing one costs what refusing a bad assertion does.
_UNKNOWN = Verifier("unknown.installation", "production", ())
_UNKNOWN_KEY = bytes.fromhex(
    "046b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296"
    "4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5")  # the P-256 generator


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj)


class Gateway:
    """The Public APNs Gateway Profile over the appliance's store and key file."""

    def __init__(self, config: GatewayConfig, store: Store, keyfile: KeyFile, *, roots=None,
                 clock: Callable[[], float] = time.time, transports: dict[str, Transport] | None = None,
                 max_pending_challenges: int = DEFAULT_MAX_PENDING_CHALLENGES):
        self.config = config
        self.store = store
        self.keyfile = keyfile
        self.clock = clock
        #: profile id -> the APNs transport sending with that profile's credentials
        self.transports = transports if transports is not None else apns_transports(config)
        self.max_pending_challenges = max_pending_challenges
        self.profiles = {p.id: p for p in config.profiles}
        self.enabled = frozenset(self.profiles)
        roots = roots if roots is not None else load_roots(config.app_attest_root_ca)
        self.verifiers = {p.id: Verifier(p.app_id, p.attest_environment, roots) for p in config.profiles}
        self.keyring: Keyring | None = None
        self._inflight: set[asyncio.Task] = set()

    def now(self) -> int:
        return int(self.clock())

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> "Gateway":
        """Make sure a grant key exists and load the keyring (blocking; at start)."""
        self.store.write_sync(lambda conn: auth.ensure_grant_key(conn, self.keyfile, self.now()))
        self.reload_keys()
        return self

    def reload_keys(self) -> None:
        """Pick up a grant-key rotation made by the CLI (blocking)."""
        self.keyring = self.store.read_sync(lambda conn: auth.load_keyring(conn, self.keyfile, self.now()))

    def maintain(self, conn, now: int) -> int:
        return auth.maintain(conn, now, self.config.endpoint_quota_window)

    async def drain(self) -> None:
        """Let deliveries already past send-begin finish their bookkeeping, then close the APNs
        connections (at shutdown)."""
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        for transport in self.transports.values():
            await transport.close()

    # -- helpers --------------------------------------------------------------------------------

    async def _write(self, op):
        try:
            return await self.store.write(op)
        except Exception as exc:  # any storage failure is a 503, never a 500
            log.warning("gateway storage failure: %s", type(exc).__name__)
            raise TemporarilyUnavailable("storage") from None

    async def _read(self, fn):
        try:
            return await self.store.read(fn)
        except Exception as exc:
            log.warning("gateway storage failure: %s", type(exc).__name__)
            raise TemporarilyUnavailable("storage") from None

    # -- POST /v1/installations/challenges ------------------------------------------------------

    async def challenge(self, body: bytes) -> Answer:
        wire.parse_request(body, wire.CHALLENGE)
        now = self.now()
        try:
            value = secrets.token_bytes(wire.CHALLENGE_BYTES)
        except Exception:
            raise TemporarilyUnavailable("randomness") from None
        challenge_id = str(uuid.uuid4())
        expires_at = now + CHALLENGE_TTL
        outcome = await self._write(lambda conn: auth.put_challenge(
            conn, challenge_id, value, expires_at, now, self.max_pending_challenges))
        if outcome is not auth.Outcome.OK:
            raise TemporarilyUnavailable("too many pending challenges")
        text = base64.urlsafe_b64encode(value).rstrip(b"=").decode()
        return 200, _json({"challenge_id": challenge_id, "challenge": text, "expires_at": expires_at})

    # -- POST /v1/installations -----------------------------------------------------------------

    async def enroll(self, body: bytes) -> Answer:
        r = wire.parse_request(body, wire.ENROLL)
        now = self.now()
        if r["endpoint_epoch"] != 1:
            raise InvalidRequest("an installation starts at endpoint epoch 1")
        if not now < r["expires_at"] <= now + self.config.max_installation_lifetime:
            raise InvalidRequest("expires_at out of range")
        verifier = self.verifiers.get(r["app_profile"])
        if verifier is None:
            raise InvalidRequest("app_profile not enabled")
        challenge = wire.decode_challenge(r["challenge"])
        key_id = wire.decode_std_b64(r["key_id"], wire.KEY_ID_BYTES, wire.KEY_ID_BYTES)
        attestation = wire.decode_std_b64(r["attestation"], 1, wire.MAX_ATTESTATION_BYTES)
        client_data = tr.transcript(tr.ENROLL, self.config.base_url, r)
        try:
            attested = verifier.verify_attestation(attestation, key_id, client_data, now)
        except AttestationFailed as exc:
            log.debug("attestation refused: %s", exc)
            raise InvalidAttestation(str(exc)) from None
        handle = str(uuid.uuid4())
        token = bytes.fromhex(r["endpoint"])
        outcome = await self._write(lambda conn: auth.enroll(
            conn, handle=handle, challenge_id=r["challenge_id"], challenge=challenge, profile=r["app_profile"],
            key_id=key_id, public_key=attested.public_key, token=token, keyfile=self.keyfile,
            expires_at=r["expires_at"], now=now))
        if outcome is not auth.Outcome.OK:
            raise NotAuthorized("challenge, key or token")
        return 201, _json({"installation_handle": handle, "endpoint_epoch": 1, "expires_at": r["expires_at"]})

    # -- the assertion routes --------------------------------------------------------------------

    async def _asserted(self, r: dict, domain: str, change: Callable, *, revoked_ok: Callable | None = None) -> None:
        """Verify the installation's assertion over the route transcript, then run `change(conn, inst,
        now)` in the transaction that advances the counter and consumes the challenge."""
        now = self.now()
        handle = r["installation_handle"]
        challenge = wire.decode_challenge(r["challenge"])
        assertion = wire.decode_std_b64(r["assertion"], 1, wire.MAX_ASSERTION_BYTES)
        inst = await self._read(lambda conn: auth.installation(conn, handle))
        usable = inst is not None and (inst.active(now) or (revoked_ok is not None and revoked_ok(inst, now)))
        verifier = self.verifiers.get(inst.app_profile) if usable else None
        client_data = tr.transcript(domain, self.config.base_url, r)
        if verifier is None:
            # Indistinguishable from a bad assertion, in the answer and in the work done for it.
            stand_in = self.verifiers.get(inst.app_profile if inst else "") or next(iter(self.verifiers.values()),
                                                                                     _UNKNOWN)
            try:
                stand_in.verify_assertion(assertion, client_data, _UNKNOWN_KEY)
            except AttestationFailed:
                pass
            raise InvalidAttestation("no usable installation")
        try:
            counter = verifier.verify_assertion(assertion, client_data, inst.public_key)
        except AttestationFailed as exc:
            log.debug("assertion refused: %s", exc)
            raise InvalidAttestation(str(exc)) from None
        if counter <= inst.sign_count:
            raise InvalidAttestation("assertion counter did not increase")

        def op(conn):
            outcome = auth.begin_asserted(conn, handle=handle, challenge_id=r["challenge_id"], challenge=challenge,
                                          counter=counter, now=now)
            if outcome is not auth.Outcome.OK:
                return outcome
            current = auth.installation(conn, handle)
            if current is None:
                return auth.Outcome.NOT_AUTHORIZED
            if not current.active(now) and not (revoked_ok is not None and revoked_ok(current, now)):
                return auth.Outcome.NOT_AUTHORIZED
            return change(conn, current, now)

        outcome = await self._write(op)
        if outcome is auth.Outcome.INVALID_ATTESTATION:
            raise InvalidAttestation("assertion counter did not increase")
        if outcome is not auth.Outcome.OK:
            raise NotAuthorized(outcome.value)

    async def delegate(self, body: bytes) -> Answer:
        r = wire.parse_request(body, wire.DELEGATE)
        now = self.now()
        nb, exp = r["not_before"], r["expires_at"]
        if not (nb <= now + NOT_BEFORE_SLACK and nb < exp and now < exp <= now + self.config.max_grant_lifetime):
            raise InvalidRequest("not_before/expires_at out of range")
        keyring = self.keyring
        sealed: dict[str, Grant] = {}

        def change(conn, inst, _now):
            outcome = auth.delegate(conn, inst, relay_pubkey=r["relay_pubkey"], epoch=r["endpoint_epoch"],
                                    generation=r["generation"], not_before=nb, expires_at=exp,
                                    grant_key_id=keyring.current_id)
            if outcome is auth.Outcome.OK:
                sealed["grant"] = Grant(inst.handle, r["relay_pubkey"], r["endpoint_epoch"], r["generation"],
                                        inst.app_profile, nb, exp)
            return outcome

        await self._asserted(r, tr.DELEGATE, change)
        return 201, _json({"endpoint_grant": keyring.seal(sealed["grant"])})

    async def rotate_endpoint(self, body: bytes) -> Answer:
        r = wire.parse_request(body, wire.ROTATE_ENDPOINT)
        token = bytes.fromhex(r["endpoint"])

        def change(conn, inst, now):
            if inst.endpoint_epoch != r["endpoint_epoch"]:
                return auth.Outcome.NOT_AUTHORIZED
            return auth.rotate_endpoint(conn, inst, epoch=r["endpoint_epoch"], new_epoch=r["new_endpoint_epoch"],
                                        token=token, keyfile=self.keyfile, now=now)

        await self._asserted(r, tr.ROTATE_ENDPOINT, change)
        return 200, b'{"status":"rotated"}'

    async def revoke_delegation(self, body: bytes) -> Answer:
        r = wire.parse_request(body, wire.REVOKE_DELEGATION)

        def change(conn, inst, now):
            return auth.revoke_delegation(conn, inst, relay_pubkey=r["relay_pubkey"], generation=r["generation"],
                                          now=now)

        await self._asserted(r, tr.REVOKE_DELEGATION, change)
        return 200, b'{"status":"revoked"}'

    async def revoke_installation(self, body: bytes) -> Answer:
        r = wire.parse_request(body, wire.REVOKE_INSTALLATION)

        def retry_of_done(inst, now):
            # A repeated revocation (its answer lost) still proves possession and succeeds again.
            return inst.revoked_at is not None and inst.endpoint_epoch == r["new_endpoint_epoch"] and now <= inst.expires_at

        def change(conn, inst, now):
            return auth.revoke_installation(conn, inst, epoch=r["endpoint_epoch"], new_epoch=r["new_endpoint_epoch"],
                                            now=now)

        await self._asserted(r, tr.REVOKE_INSTALLATION, change, revoked_ok=retry_of_done)
        return 200, b'{"status":"revoked"}'

    # -- POST /v1/deliveries/apns ----------------------------------------------------------------

    async def deliver(self, body: bytes, authorization: str | None) -> Answer:
        r = wire.parse_request(body, wire.DELIVERY)
        now = self.now()
        try:
            event = verify_http_auth(authorization or "", url=self.config.delivery_url, method="POST", body=body,
                                     now=now, window=NIP98_WINDOW)
        except HttpAuthError as exc:
            log.debug("delivery authorization refused: %s", exc.reason)
            raise InvalidAuth(exc.reason) from None
        signer = event.pubkey
        try:
            grant = self.keyring.open(r["endpoint_grant"])
        except GrantInvalid as exc:
            log.debug("grant refused: %s", exc)
            grant = None  # the event id is burned all the same
        admission = await self._write(lambda conn: auth.admit_delivery(
            conn, event_id=event.id, event_expires_at=event.created_at + NIP98_WINDOW + 1, signer=signer,
            grant=grant, request_id=r["request_id"], request_expires_at=r["expires_at"], enabled=self.enabled,
            quota_window=self.config.endpoint_quota_window, quota_max=self.config.endpoint_quota_max, now=now))
        if admission.outcome is not auth.Outcome.OK:
            raise InvalidGrant("capability, signer, authority, replay, expiry or quota")
        # Send-begin has committed: the attempt and its bookkeeping run to the end even if the
        # client goes away, so a transient outcome always releases its reservation.
        task = asyncio.ensure_future(self._send(admission, grant, signer, r, now))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    async def _send(self, admission: auth.Admission, grant: Grant, signer: str, r: dict, now: int) -> Answer:
        try:
            token = self.keyfile.unwrap(admission.token, label=auth.token_label(admission.handle, admission.epoch))
        except Exception:
            await self._release(signer, r["request_id"])
            raise TemporarilyUnavailable("token custody") from None
        transport = self.transports[grant.app_profile]
        expiration = min(r["expires_at"], now + DEFAULT_APNS_EXPIRATION_CEILING)
        # Exactly one APNs request: the transport itself refreshes an expired provider token once
        # and retries once (ExpiredProviderToken), nothing else.
        try:
            outcome = await transport.send(WakeRequest(token.hex(), r["request_id"], expiration))
        except Exception:  # a transport bug must still release the reservation
            log.exception("APNs transport failed")
            outcome = Outcome(TRANSIENT, detail="transport error")
        if outcome.kind not in (ACCEPTED, INVALID_ENDPOINT, PERMANENT):  # not terminal: released
            await self._release(signer, r["request_id"])
        if outcome.kind in (CONFIGURATION, REFRESH_RETRY):
            log.warning("APNs configuration fault for %s: %s %s %s", grant.app_profile, outcome.status,
                        outcome.reason, outcome.detail)
        return answer_of(outcome, grant.generation)

    async def _release(self, signer: str, request_id: str) -> None:
        await self._write(lambda conn: auth.release_reservation(conn, signer, request_id))


def answer_of(outcome: Outcome, generation: int) -> Answer:
    """The spec's response mapping of one provider outcome (NIP-PL, "Relay delivery")."""
    if outcome.kind == ACCEPTED:
        return 200, b'{"status":"accepted"}'
    if outcome.kind == INVALID_ENDPOINT:
        return 410, _json({"status": "invalid_endpoint", "generation": generation, "invalid_at": outcome.invalid_at})
    if outcome.kind == TRANSIENT:
        after = None if not outcome.retry_after or outcome.retry_after <= 0 else max(1, math.ceil(outcome.retry_after))
        return 503, _json({"status": "retry", "retry_after_seconds": after})
    if outcome.kind == PERMANENT:
        raise InvalidRequest("provider refused the request permanently")
    # CONFIGURATION, or a provider token still called expired after the one refresh
    raise ConfigurationFault(outcome.kind)


def apns_transports(config: GatewayConfig) -> dict[str, Transport]:
    """One APNs transport (one HTTP/2 connection) per enabled profile; profiles signing with one
    .p8 key share its provider token (Apple throttles a key whose token changes too often)."""
    out: dict[str, Transport] = {}
    tokens: dict[tuple, ProviderToken] = {}
    for i, p in enumerate(config.profiles):
        try:
            profile = p.apns_profile()
            token = tokens.setdefault(profile.key.identity, ProviderToken(profile.key))
            out[p.id] = ApnsTransport(profile, token=token)
        except CredentialError as exc:  # ca_file not a CA bundle
            raise ConfigError(f"gateway.profiles[{i}].ca_file", p.ca_file, str(exc)) from None
    return out
