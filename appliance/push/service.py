"""The push executor: per-origin descriptors and keys, lease admission and state hooks, matching
into the wake outbox, and the delivery workers.

Wiring (see appliance.app.build): `relay.admission[30350] = push.admit` (steps 1-7 stateless,
authentication before signature), `relay.store_hooks.add_check(push.check, kind=30350)` (step 7
quotas/uniqueness and step 8 inside the write transaction), `add_stored(push.stored)` (leases:
effective state, watermark and match index; other events: matching and wake jobs, all in the
event's transaction), `add_stored_batch(push.stored_batch)` (events written together: matched and
their endpoints locked at once), `push.nip11` (descriptor), `push.delivery.run()` (the workers, a
background task).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from appliance.errors import ConfigError, Rejected
from appliance.nostr import nip44
from appliance.origins import Origin
from appliance.push.workers import LeaseValidator
from appliance.store import executor_keys, leases, wakes
from appliance.store.credentials import load_apns_keys
from appliance.store.interface import Connection, Store
from appliance.store.keyfile import KeyFile

from . import keys as keystore
from . import state
from .config import build_descriptor, check_push_fits_relay
from .delivery import Delivery, DeliverySettings
from .descriptor import LEASE_KIND, Descriptor, descriptor_to_json
from .errors import LeaseRejected, reason_message
from .matcher import Authorize, Matcher
from .profiles import ProfileTransports

log = logging.getLogger("appliance.push")


@contextmanager
def said_at(origin: Origin):
    """A ConfigError about an origin's push table names the origin in its hint (not in the setting's name)."""
    try:
        yield
    except ConfigError as exc:
        if origin.origin in exc.hint:
            raise
        raise ConfigError(exc.name, exc.value, f"{exc.hint} (at {origin.origin})") from None


@dataclass
class OriginPush:
    origin_id: int
    descriptor: Descriptor  # keys as of load time; `current_descriptor` re-filters by time
    rows: list[keystore.KeyRow]
    secrets: dict[str, tuple[str, keystore.KeyRow]]
    push_kinds: frozenset[int] = frozenset()  # kinds a lease may name: the only ones matched

    _cached: tuple[Descriptor, int] | None = None

    def current_descriptor(self, now: int) -> Descriptor:
        """The descriptor with the keys accepted at `now` (cached until a retiring window closes)."""
        cached = self._cached
        if cached is not None and now < cached[1]:
            return cached[0]
        desc = replace(self.descriptor, keys=keystore.advertised(self.rows, now))
        ends = [k.accept_until for k in self.rows if k.state == "retiring" and k.accept_until and k.accept_until > now]
        self._cached = (desc, min(ends, default=2**62))
        return desc


def lease_fingerprints(keyfile: KeyFile):
    """(pubkey, d) -> the lease's fingerprint as the dashboard shows it (`lease:1a2b3c4d5e`): the
    delivery log names leases the way the operator sees them everywhere else."""
    from appliance.store.fingerprints import KEY_PURPOSE, fingerprint

    key = keyfile.derive(KEY_PURPOSE)
    return lambda pubkey, d: fingerprint(key, f"{pubkey}:{d}", "lease")


class Push:
    CONV_CACHE = 65536

    def __init__(self, store: Store, keyfile: KeyFile, *, workers: int = 1,
                 relay_max_content_length: int | None = None, authorize: Authorize | None = None,
                 delivery: DeliverySettings | None = None, transports: ProfileTransports | None = None,
                 draft_transports: bool = False):
        self.store = store
        self.keyfile = keyfile
        # The relay's own content bound: a descriptor may not advertise more than it accepts.
        self.relay_max_content_length = relay_max_content_length
        self.validator = LeaseValidator(workers)
        self.origins: dict[int, OriginPush] = {}
        self._conv: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        # Without a read-authorization rule nothing may be woken (fail-closed).
        self.authorize: Authorize = authorize or (lambda conn, origin, reader, ev: False)
        self.matcher = Matcher(self.authorize)
        self.transports = transports or ProfileTransports()
        if self.transports.store is None:  # where transports keep keys of their own (VAPID)
            self.transports.store, self.transports.keyfile = store, keyfile
        #: the `push_draft_transports` setting: fcm/unifiedpush profiles advertised and delivered
        self.draft_transports = draft_transports
        self.settings = delivery or DeliverySettings()
        self.delivery = Delivery(store, transport_for=self.transports.get, authorize=self.authorize,
                                 settings=self.settings, lease_ref=lease_fingerprints(keyfile))
        self._retired: list = []
        #: origin id -> its push table as the operator wrote it (`[push]`, `origins[0].push`), for
        #: messages; any other origin's (made with the CLI or the dashboard) is `push`, with the origin said
        self.names: dict[int, str] = {}

    def close(self) -> None:
        self.validator.close()

    async def aclose(self) -> None:
        """Stop the delivery workers and close every provider connection."""
        await self.delivery.close()
        await self.close_retired()
        for transport in self.transports.all():
            await transport.close()

    async def close_retired(self) -> None:
        """Close the transports a reload left unused."""
        retired, self._retired = self._retired, []
        for transport in retired:
            await transport.close()

    # -- configuration ---------------------------------------------------------------------------

    def load(self, origins: list[Origin]) -> None:
        """(Re)build descriptors; generate first keys; ConfigError if a descriptor is invalid."""
        now = int(time.time())
        loaded: dict[int, OriginPush] = {}
        for o in origins:
            if not o.push:
                continue

            def op(conn, oid=o.id):
                keystore.ensure_current(conn, self.keyfile, oid, now)
                return keystore.list_keys(conn, oid), keystore.load_secrets(conn, self.keyfile, oid)

            if self.relay_max_content_length is not None:
                with said_at(o):
                    check_push_fits_relay(o.push, self.names.get(o.id, "push"), self.relay_max_content_length)
            rows, secrets = self.store.write_sync(op)
            desc = build_descriptor(o.origin, o.push, keystore.advertised(rows, now), drafts=self.draft_transports)
            loaded[o.id] = OriginPush(o.id, desc, rows, secrets, frozenset(desc.push_kinds))
        # Credentials last: a profile whose key does not load refuses the whole (re)load.
        stored = self.store.read_sync(lambda conn: load_apns_keys(conn, self.keyfile))
        self._retired += self.transports.configure([o for o in origins if o.id in loaded], stored, self.names,
                                                   drafts=self.draft_transports)
        self.origins = loaded

    def maintain(self, conn: Connection, now: int) -> int:
        """Purge-loop work (inside a write transaction): expire keys, erase secrets, GC state.
        Returns how many secrets were erased (the caller then scrubs the WAL of them)."""
        _expired, erased = executor_keys.expire_and_erase(conn, now)
        leases.purge(conn, now)
        wakes.purge(conn, now, self.settings.log_retention)
        for op in list(self.origins.values()):
            # Keys past their acceptance window never decrypt again: drop them from memory too.
            if any(not row.accepts(now) for _secret, row in op.secrets.values()):
                op.secrets = {kid: e for kid, e in op.secrets.items() if e[1].accepts(now)}
        return erased

    # -- NIP-11 ------------------------------------------------------------------------------------

    def nip11(self, origin: Origin, doc: dict[str, Any]) -> None:
        op = self.origins.get(origin.id)
        if op is None:
            return
        exts = doc.setdefault("supported_extensions", [])
        if "nip-pl" not in exts:
            exts.append("nip-pl")
        doc["push"] = descriptor_to_json(op.current_descriptor(int(time.time())))

    # -- admission (steps 1-7, stateless) -------------------------------------------------------------

    def _conversation_key(self, secret: str, pubkey: str) -> bytes:
        k = (secret, pubkey)
        ck = self._conv.get(k)
        if ck is None:
            ck = nip44.get_conversation_key(secret, pubkey)
            self._conv[k] = ck
            if len(self._conv) > self.CONV_CACHE:
                self._conv.popitem(last=False)
        return ck

    async def admit(self, origin: Origin, authed: str | None, ev, verify: Callable[[Any], Awaitable[bool]]) -> dict:
        # 1. NIP-42 precedes 2. signature
        try:
            if not authed:
                raise LeaseRejected("auth_required")
            if authed != ev.pubkey:
                raise LeaseRejected("pubkey_mismatch")
        except LeaseRejected as exc:
            raise Rejected.from_wire(exc.message) from None
        now = int(time.time())
        op = self.origins.get(origin.id)
        if op is None:
            if not await verify(ev):
                raise Rejected.from_wire(reason_message("bad_signature"))
            # Push disabled here: no executor key is advertised, so none is accepted.
            raise Rejected.from_wire(reason_message("unknown_executor_key"))
        # Steps 2-7 need no state: they run in the validator (a worker process by default). It
        # gets the conversation key of the executor key the lease names, never a private key.
        keys: dict[str, bytes] = {}
        exec_ids = ev.tag_values("exec")
        if len(exec_ids) == 1:
            entry = op.secrets.get(exec_ids[0])
            if entry is not None and entry[1].accepts(now):
                try:
                    keys[exec_ids[0]] = self._conversation_key(entry[0], ev.pubkey)
                except Exception:  # not a valid pubkey: the signature check refuses it first
                    pass
        try:
            verdict, value = await self.validator.validate(ev, authed, op.current_descriptor(now), keys, now)
        except Exception:
            log.exception("lease validation failed for event %s", ev.id)
            raise Rejected("error", "could not check the lease, try again") from None
        if verdict == "rejected":
            raise Rejected.from_wire(value)
        lease = value
        if lease.expiration <= now:
            # Inside the skew allowance but already past: NIP-40 forbids storing it; say so in NIP-PL words.
            raise Rejected.from_wire(reason_message("already_expired"))
        return {"lease": lease, "push_now": now}

    # -- in-transaction hooks ----------------------------------------------------------------------------

    def check(self, conn: Connection, origin: int, ev, ctx: dict) -> None:
        lease = ctx.get("lease")
        op = self.origins.get(origin)
        if lease is None or op is None:
            raise Rejected.from_wire(reason_message("unknown_executor_key"))
        ctx["push_watermark"] = state.check_stateful(conn, origin, lease, op.descriptor.limits,
                                                     ctx.get("push_now", int(time.time())))

    def stored(self, conn: Connection, origin: int, ev, ctx: dict) -> None:
        """The "event stored" hook, inside the event's write transaction."""
        if ev.kind == LEASE_KIND:
            self._lease_stored(conn, origin, ev, ctx)
            return
        op = self.origins.get(origin)
        if op is None or ev.kind not in op.push_kinds:
            return
        created = False
        fresh: list = []
        early = ctx.pop("push_matches", None)  # matched by `stored_batch`, endpoints locked already
        if early is not None:
            matches, now = early
        else:
            now = time.time()
            matches = self.matcher.match(conn, origin, op.descriptor, op.push_kinds, ev, int(now))
            # Several nodes: the event's endpoints locked at once, in the one global order (then
            # each insert_job finds its lock held), rather than in the order the matches came.
            wakes.lock_endpoints(conn, [(origin, m.app_profile, m.transport, m.endpoint_hash) for m in matches])
        for m in matches:
            job_id = wakes.new_job_id()
            # A wake due at once goes straight to a worker after the commit (already claimed, so a
            # crash before it is sent leaves a claim that lapses and is retried).
            fast = self.delivery.has_room()
            state_ = wakes.insert_job(
                conn, job_id=job_id, origin=origin, app_profile=m.app_profile, transport=m.transport,
                endpoint_hash=m.endpoint_hash, event_id=ev.id, lease_pubkey=m.pubkey, lease_d=m.d,
                generation=m.generation, cls=m.cls, now=now, useful_age=self.settings.useful_age,
                min_interval=self.settings.min_interval,
                claim_for=self.settings.visibility if fast else None)
            if state_ == "claimed":
                fresh.append(self.delivery.fresh_wake(job_id, origin, ev.id, m, now))
            created = created or state_ == "pending"
        if fresh:
            ctx.setdefault("after_commit", []).append(lambda: self.delivery.submit(fresh))
        if created:  # after the commit: the workers look for due wakes
            ctx.setdefault("after_commit", []).append(self.delivery.nudge)

    def stored_batch(self, conn: Connection, origin: int, run: list) -> None:
        """Before the "event stored" hooks of events written together (store.events, the batched
        path): match them all and lock every endpoint they wake at once, in the one global order
        (several nodes: no write of the batch then asks for a lock below one it holds); each
        event's `stored` takes its matches from its context."""
        op = self.origins.get(origin)
        if op is None:
            return
        now = time.time()
        keys: list = []
        for ev, ctx in run:
            if ev.kind == LEASE_KIND or ev.kind not in op.push_kinds:
                continue
            matches = self.matcher.match(conn, origin, op.descriptor, op.push_kinds, ev, int(now))
            ctx["push_matches"] = (matches, now)
            keys.extend((origin, m.app_profile, m.transport, m.endpoint_hash) for m in matches)
        if keys:
            wakes.lock_endpoints(conn, keys)

    def _lease_stored(self, conn: Connection, origin: int, ev, ctx: dict) -> None:
        lease = ctx.get("lease")
        op = self.origins.get(origin)
        if lease is None or op is None:  # cannot happen: the check hook refused it
            raise Rejected.from_wire(reason_message("unknown_executor_key"))
        now = ctx.get("push_now", int(time.time()))
        state.apply_lease(conn, origin, lease, op.descriptor.limits, now, ctx.get("push_watermark"))
        # NIP-PL, Lease and Key Lifecycle: a tombstone (or a newer generation) stops the undelivered
        # wakes of the address; they would fail their re-check anyway.
        wakes.cancel_lease_jobs(conn, origin, lease.pubkey, lease.d, time.time(),
                                "lease revoked" if not lease.active else "lease replaced by a newer generation")
