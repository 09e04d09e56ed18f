"""The NIP-11 relay information document of an origin, with the limits this relay enforces."""

from __future__ import annotations

from typing import Any, Callable

from appliance import __version__
from appliance.origins import Origin
from appliance.settings import Settings

SUPPORTED_NIPS = [1, 9, 11, 29, 40, 42, 45, 77]
# NIP-50 search, advertised while some kinds are searchable (the search_kinds setting).
SEARCH_NIP = 50

NOSTR_JSON = "application/nostr+json"


def wants_nostr_json(accept: str) -> bool:
    """Whether an HTTP `Accept` header asks for the NIP-11 document: `application/nostr+json`
    listed with a non-zero q. Media types are case-insensitive (RFC 9110 8.3.1) and may carry
    parameters; wildcards (`*/*`, what browsers send) do not count: they get the HTML page."""
    for media_range in accept.split(","):
        media_type, *params = media_range.split(";")
        if media_type.strip().lower() != NOSTR_JSON:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False

# Extra NIP-11 members contributed by other parts (the push descriptor), per origin.
Extension = Callable[[Origin, dict[str, Any]], None]


def document(origin: Origin, settings: Settings, extensions: list[Extension] = ()) -> dict[str, Any]:
    s = settings
    doc: dict[str, Any] = {
        # Each origin's own (the default origin's come from relay_name / relay_description).
        "name": origin.name,
        "description": origin.description,
        "software": "appliance",
        "version": __version__,
        "supported_nips": sorted([*SUPPORTED_NIPS, SEARCH_NIP]) if s.search_kinds else SUPPORTED_NIPS,
        "limitation": {
            "max_message_length": s.max_message_length,
            "max_subscriptions": s.max_subscriptions,
            "max_filters": s.max_filters,
            "max_limit": s.max_limit,
            "default_limit": s.default_limit,
            "max_subid_length": 64,
            "max_event_tags": s.max_event_tags,
            "max_content_length": s.max_content_length,
            "auth_required": origin.auth_required,
            "restricted_writes": origin.access_policy == "members" or bool(origin.allow),
            "created_at_lower_limit": s.created_at_past,
            "created_at_upper_limit": s.created_at_future,
            "event_rate_per_second": s.event_rate,
            "event_burst": s.event_burst,
            "req_rate_per_second": s.req_rate,
            "req_burst": s.req_burst,
            # NIP-77: past this many records a NEG-OPEN gets NEG-ERR `blocked: too many records`
            "max_negentropy_records": s.negentropy_max_records,
            "max_negentropy_sessions": s.negentropy_max_sessions,
        },
        "negentropy": 1,  # the negentropy protocol version NEG-OPEN speaks (strfry's member)
    }
    contact = origin.contact or s.relay_contact
    if contact:
        doc["contact"] = contact
    if origin.icon:
        doc["icon"] = origin.icon
    pubkey = origin.pubkey or s.relay_pubkey
    if pubkey:
        doc["pubkey"] = pubkey
    for extend in extensions:
        extend(origin, doc)
    return doc
