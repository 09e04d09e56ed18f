"""The `storage` setting's value: "sqlite" or a PostgreSQL URL, which is a secret (its password)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def is_postgres(storage: str) -> bool:
    return storage.startswith(("postgresql://", "postgres://"))


def redact(storage: str) -> str:
    """The value as it may be shown: a URL without its password (nor a query string, which may
    carry one: `?password=...`)."""
    if not is_postgres(storage):
        return storage
    parts = urlsplit(storage)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = (user.split(":", 1)[0] + ":***@" if ":" in user else user + "@") + host
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))
