"""NIP-42 client authentication: validation of kind-22242 AUTH events."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from .event import Event, verify_event

__all__ = ["AuthError", "AUTH_KIND", "validate_auth_event", "normalize_relay_url"]

AUTH_KIND = 22242


class AuthError(ValueError):
    """A refused AUTH event; str() is the reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_DEFAULT_PORTS = {"ws": 80, "wss": 443}


def normalize_relay_url(url: str) -> str:
    """Lowercase scheme and host, drop the scheme's default port and one trailing slash of the
    path; path, query and fragment are otherwise kept as given.

    Clients disagree on "wss://host" vs "wss://host/" vs "wss://host:443" and on host case; all
    name the same relay (as URL parsers in browsers and nostr libraries agree); nothing else is folded.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url
    scheme = parts.scheme.lower()
    netloc = parts.netloc.lower()
    if port is not None and port == _DEFAULT_PORTS.get(scheme):
        netloc = netloc.rsplit(":", 1)[0]
    path = parts.path[:-1] if parts.path.endswith("/") else parts.path
    return urlunsplit((scheme, netloc, path, parts.query, parts.fragment))


def validate_auth_event(
    ev: Event,
    *,
    challenge: str,
    relay_url: str,
    now: int,
    window: int = 600,
    also_urls: tuple[str, ...] = (),
) -> str:
    """Return the authenticated pubkey, or raise AuthError with the reason.

    Cheap checks run before the signature so junk costs little. The relay tag must name
    `relay_url` (or one of `also_urls`, other URLs the caller knows reach this same relay).
    """
    if ev.kind != AUTH_KIND:
        raise AuthError("wrong kind")
    if abs(ev.created_at - now) > window:
        raise AuthError("created_at out of window")
    tag_challenge = ev.first_tag("challenge")
    if tag_challenge is None:
        raise AuthError("missing challenge tag")
    if tag_challenge != challenge:
        raise AuthError("challenge mismatch")
    tag_relay = ev.first_tag("relay")
    if tag_relay is None:
        raise AuthError("missing relay tag")
    tag_url = normalize_relay_url(tag_relay)
    if tag_url != normalize_relay_url(relay_url) and not any(tag_url == normalize_relay_url(u) for u in also_urls):
        raise AuthError("relay url mismatch")
    if not verify_event(ev):
        raise AuthError("invalid signature")
    return ev.pubkey
