"""EVENT (NIP-01): publish one event, answered by one OK."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from appliance.errors import AlreadyStored, Rejected, StorageFull
from appliance.nostr.event import InvalidEvent, parse_event
from appliance.relay.verbs.base import STOPPING_MESSAGE, Verb, event_argument

if TYPE_CHECKING:
    from appliance.relay.session import Session

log = logging.getLogger("appliance.relay")

# EVENTs one connection may have in flight (verifying or committing) at once.
DEFAULT_MAX_INFLIGHT = 512

USAGE = 'invalid: EVENT takes exactly one event object: ["EVENT", {...}]'
DISK_FULL_MESSAGE = "error: the relay's disk is full; nothing was stored, try again later"


def on_event(session: "Session", msg: list, _admitted: bool = False) -> None:
    arg = event_argument(session, msg, USAGE)
    if arg is None:
        return
    obj, event_id = arg
    governor = session.governor
    if not governor.take_event():
        session.ok(event_id, False, "rate-limited: publishing too fast")
        governor.refused_event()
        return
    try:
        ev = parse_event(obj)
    except InvalidEvent as exc:
        session.ok(event_id, False, f"invalid: {exc.reason}")
        return
    session.inflight += 1  # counted before it is answered, so the receive loop sees it at once
    # Most events need nothing awaited: checked here and answered from the writer's commit,
    # with no task; the others (a kind with its own admission, say) take a task.
    if not session.relay.publish_then(session.origin, session.reader, ev,
                                      lambda message, exc: published(session, ev, message, exc)):
        session.spawn(_publish(session, ev))


async def _publish(session: "Session", ev) -> None:
    try:
        message = await session.relay.publish(session.origin, session.reader, ev)
    except Exception as exc:
        published(session, ev, None, exc)
    except BaseException:
        settled(session)
        raise
    else:
        published(session, ev, message, None)


def published(session: "Session", ev, message: str | None, exc: Exception | None) -> None:
    """An EVENT's outcome: its OK, and room for the next EVENT."""
    try:
        if exc is None:
            session.ok(ev.id, True, message)
        elif isinstance(exc, AlreadyStored):  # NIP-01: accepted, already stored
            session.relay.stats["duplicate"] += 1
            session.ok(ev.id, True, exc.wire)
        elif isinstance(exc, Rejected):  # counted by the relay
            session.ok(ev.id, False, exc.wire)
        elif isinstance(exc, StorageFull):  # the writer logged it; the operator frees space, the client retries
            session.ok(ev.id, False, DISK_FULL_MESSAGE)
        else:
            log.error("failed to store event %s", ev.id, exc_info=exc)
            session.ok(ev.id, False, "error: could not store the event, try again")
    finally:
        settled(session)


def settled(session: "Session") -> None:
    session.inflight -= 1
    if session.inflight < DEFAULT_MAX_INFLIGHT:
        session.wake()


def refuse_stopping(session: "Session", msg: list) -> None:
    """The relay is shutting down: an OK false, nothing stored."""
    arg = event_argument(session, msg, USAGE)
    if arg is not None:
        session.ok(arg[1], False, STOPPING_MESSAGE)


EVENT = Verb(on_event, stopping=refuse_stopping)
