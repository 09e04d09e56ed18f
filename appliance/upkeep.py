"""Upkeep while the appliance serves: configuration edits made out of process applied (the reload
loop) and expired rows purged, with the key material they erase scrubbed from the WAL (the purge
loop). `lifespan` (appliance.app) runs both; the dashboard and NIP-86 apply their own edits at once
with `reload_if_changed`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from appliance.errors import ApplianceError
from appliance.origins import load_origins
from appliance.store.admin import stored_settings
from appliance.store.events import purge_expired
from appliance.store.meta import config_generation

if TYPE_CHECKING:
    from appliance.gateway.service import Gateway
    from appliance.push.service import Push
    from appliance.relay.groups import Groups
    from appliance.relay.nodes import NodeFanout
    from appliance.relay.relay import Relay
    from appliance.settings import Settings
    from appliance.store.interface import Store

log = logging.getLogger("appliance")

# Seconds between checks for origin/group edits made by the CLI while the server runs.
DEFAULT_RELOAD_INTERVAL = 1.0


class Upkept(Protocol):
    """What upkeep uses of the running appliance (appliance.app.Appliance)."""

    settings: Settings
    store: Store
    relay: Relay
    groups: Groups
    push: Push | None
    gateway: Gateway | None
    fanout: NodeFanout | None
    on_reload: list[Callable[[], None]]


class Upkeep:
    """The reload and purge loops of one appliance, and what they carry from one turn to the next."""

    def __init__(self, app: Upkept, generation: int = 0) -> None:
        self.app = app
        self.generation = generation  # the configuration generation applied
        # Erased key material waits in the WAL until a scrub succeeds (readers can keep it busy).
        self.wal_scrub_pending = False
        # One reload at a time: the loop's and a dashboard edit's could otherwise both read, and
        # the one that read the older generation apply it last.
        self._reload_lock = asyncio.Lock()

    async def reload_loop(self) -> None:
        app = self.app
        while True:
            await asyncio.sleep(DEFAULT_RELOAD_INTERVAL)
            try:
                await self.reload_if_changed()
                if app.fanout is not None and not app.fanout.listening:
                    # Not hearing the other nodes: their group changes arrive by polling meanwhile.
                    await app.groups.state.reload(app.store)
            except Exception:
                log.exception("reloading origins and groups failed")

    async def reload_if_changed(self) -> bool:
        """Pick up origins and groups edited out of process (CLI); True if anything changed."""
        async with self._reload_lock:
            return await self._reload_if_changed()

    async def _reload_if_changed(self) -> bool:
        app = self.app
        generation = await app.store.read(config_generation)
        if generation == self.generation:
            if app.push is not None and app.push.transports.files_changed():
                await self._reload_push_files(app.push)
            return False
        origins = await app.store.read(load_origins)
        if app.push is not None:
            # First, as it can refuse the new configuration: then nothing of it is applied.
            try:
                await asyncio.to_thread(app.push.load, origins)
                await app.push.close_retired()
            except ApplianceError as exc:
                self.generation = generation  # said once; the next edit is tried afresh
                log.error("configuration edit not applied, still serving the previous one: %s", exc)
                return False
        await app.groups.state.reload(app.store)
        await self._reload_stored_settings()
        app.relay.origins.origins = origins
        app.relay.origins_changed()
        await asyncio.to_thread(app.groups.keys.ensure, app.store, origins)
        if app.gateway is not None:
            await asyncio.to_thread(app.gateway.reload_keys)  # grant-key rotation by the CLI
        self.generation = generation
        self.wal_scrub_pending = True  # an edit may have erased key material (`appliance keys erase`)
        log.info("reloaded origins and groups generation=%d", generation)
        return True

    async def _reload_push_files(self, push: Push) -> None:
        """A key_file or ca_file changed on disk: the profiles naming it read it again (a file that
        no longer loads is said once; the transports that read the old one keep serving)."""
        changed = push.transports.files_changed()
        origins = await self.app.store.read(load_origins)
        try:
            await asyncio.to_thread(push.load, origins)
            await push.close_retired()
            log.info("read again after a change on disk: %s", ", ".join(changed))
        except ApplianceError as exc:
            push.transports.forget_files(changed)
            log.error("a changed key or CA file was not applied, still serving the previous one: %s", exc)

    async def _reload_stored_settings(self) -> None:
        """Settings saved from the dashboard (of this node or another over the same database)."""
        app = self.app
        stored = await app.store.read(stored_settings)
        for name, source in list(app.settings.sources.items()):
            if source == "dashboard" and name not in stored:
                app.settings.clear_stored(name)
        app.settings.apply_stored(stored)
        for hook in app.on_reload:
            try:
                hook()
            except Exception:
                log.exception("applying reloaded settings failed")

    async def purge_loop(self) -> None:
        while True:
            await asyncio.sleep(self.app.settings.purge_interval)
            try:
                await self.purge_once()
            except Exception:
                log.exception("expired-event purge failed")

    async def purge_once(self) -> int:
        app = self.app
        total = 0
        while True:
            n = await app.store.write(lambda conn: purge_expired(conn, int(time.time())))
            total += n
            if n == 0:
                # Push and gateway retention: each erases key material that has served its time.
                for part in (app.push, app.gateway):
                    if part is not None:
                        erased = await app.store.write(lambda conn, part=part: part.maintain(conn, int(time.time())))
                        self.wal_scrub_pending = self.wal_scrub_pending or erased > 0
                if self.wal_scrub_pending:
                    self.wal_scrub_pending = not await asyncio.to_thread(app.store.scrub_wal)
                return total
