"""What every verb module shares: the `Verb` record the table holds, and common answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import orjson

if TYPE_CHECKING:
    from appliance.relay.session import Session

STOPPING_MESSAGE = "error: the relay is restarting; try again in a moment"
MAX_SUB_ID_LENGTH = 64


@dataclass(frozen=True)
class Verb:
    """How the session handles one message type.

    - `handle(session, msg, admitted)`: the message, parsed (a list whose first item is the verb);
      `admitted` is True when a metered verb's token was taken already (from its head, before the
      JSON parse). Runs on the loop, must not block; answers with `session.send`/`ok`/`closed_msg`/
      `notice`; anything slow goes to the store's `read_then`/`write_then` or a `session.spawn`ed task.
    - `metered`: costs a REQ/COUNT token (the `req_rate` settings), taken from the message's head
      (`["VERB","<subscription id>",...`) before the rest is parsed, so a refused one costs no JSON
      parse; `refused(session, sub_id)` answers one refused so. A metered message whose head is
      not in that plain form (an escaped id) reaches `handle` with `admitted` False: it takes its
      token itself (`session.req_token()`).
    - `stopping`: new work, refused while the relay shuts down: called instead of `handle` then.
    """

    handle: Callable[["Session", list, bool], None]
    metered: bool = False
    refused: Callable[["Session", str], None] | None = None
    stopping: Callable[["Session", list], None] | None = None


def dumps(obj) -> str:
    return orjson.dumps(obj).decode()


def refuse_subscription_stopping(session: "Session", msg: list) -> None:
    """A REQ-like message while the relay stops: CLOSED for its subscription id, nothing run."""
    if len(msg) >= 2 and isinstance(msg[1], str) and 0 < len(msg[1]) <= MAX_SUB_ID_LENGTH:
        session.closed_msg(msg[1], STOPPING_MESSAGE)


def event_argument(session: "Session", msg: list, usage: str) -> tuple[dict, str] | None:
    """The event object of an EVENT/AUTH message and the id to answer OK with (NOTICE `usage` and
    None if malformed)."""
    if len(msg) != 2 or not isinstance(msg[1], dict):
        session.notice(usage)
        return None
    obj = msg[1]
    raw_id = obj.get("id")
    return obj, raw_id if isinstance(raw_id, str) and len(raw_id) <= 64 else ""
