"""The `storage` setting's value: "sqlite" or a PostgreSQL URL, which is a secret (its password)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

# Connection parameters (libpq's names) whose value is a secret, in a URL's query string.
SECRET_PARAMS = frozenset({"password", "sslpassword"})


def is_postgres(storage: str) -> bool:
    return storage.startswith(("postgresql://", "postgres://"))


def redact(storage: str) -> str:
    """The value as it may be shown: a URL without its password, in its user part or in its query
    string (`?password=...`); other parameters (host, port, sslmode) stay, so the URL still says
    where the database is. A query string that does not parse is hidden whole."""
    if not is_postgres(storage):
        return storage
    parts = urlsplit(storage)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = (user.split(":", 1)[0] + ":***@" if ":" in user else user + "@") + host
    query = parts.query
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            query = "***"
        else:
            query = "&".join(f"{quote(k, safe='')}=" + ("***" if k.lower() in SECRET_PARAMS else quote(v, safe="/:,"))
                             for k, v in pairs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def has_password(storage: str) -> bool:
    """Whether the URL carries a password (in its user part or its query string)."""
    if not is_postgres(storage):
        return False
    parts = urlsplit(storage)
    if parts.password is not None:
        return True
    return any(k.lower() in SECRET_PARAMS for k, _v in parse_qsl(parts.query, keep_blank_values=True))


def without_password(storage: str) -> str:
    """The URL with its password left out (not masked): one a command such as pg_dump can use as
    it stands, the password then coming from PGPASSWORD or ~/.pgpass."""
    if not is_postgres(storage):
        return storage
    parts = urlsplit(storage)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = user.split(":", 1)[0] + "@" + host
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='/:,')}" for k, v in pairs
                     if k.lower() not in SECRET_PARAMS)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def error_text(exc: BaseException, storage: str) -> str:
    """An error's first line (or its class name) with the URL's password taken out, should the
    driver have echoed it."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
    password = urlsplit(storage).password
    if password:
        text = text.replace(password, "***")
    return re.sub(r"password=\S+", "password=***", text)
