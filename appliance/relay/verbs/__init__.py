"""The relay's verbs: one module per message type a client sends, and the table that routes them.

`VERBS` maps a message's first item to its `Verb` (see `appliance.relay.verbs.base`); the session
parses each message, applies what every message meets (size, rate, the relay stopping) and calls
the verb's `handle(session, msg, admitted)`. A new verb is a module here with its handler and a
`Verb(...)`, and one line in this table.
"""

from __future__ import annotations

from appliance.relay.verbs.auth import AUTH
from appliance.relay.verbs.base import Verb
from appliance.relay.verbs.event import EVENT
from appliance.relay.verbs.negentropy import NEG_CLOSE, NEG_MSG, NEG_OPEN
from appliance.relay.verbs.req import CLOSE, COUNT, REQ

VERBS: dict[str, Verb] = {
    "EVENT": EVENT,
    "REQ": REQ,
    "COUNT": COUNT,
    "CLOSE": CLOSE,
    "AUTH": AUTH,
    "NEG-OPEN": NEG_OPEN,
    "NEG-MSG": NEG_MSG,
    "NEG-CLOSE": NEG_CLOSE,
}

__all__ = ["VERBS", "Verb"]
