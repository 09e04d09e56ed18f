"""Secrets the tests used must never reach the logs of the servers they started.

Helpers register what they mint (`sensitive(...)`): secret keys and their pubkeys (every test
identity, lease author and relay), APNs device tokens, endpoints of leases, .p8 signing keys, the
admin password; each server's own key file is registered when it stops. Each server's log is
checked when it stops (the failure lands on the test that leaked), and `pytest_sessionfinish`
checks every log of the run once more against everything registered by then. On top of the list,
any base64 JSON (`eyJ...`: a JWT or a NIP-98 Authorization value) in a log is a leak; a random
base64 value that merely contains `eyJ` (the banner's setup token, one start in ~25,000) is not."""

from __future__ import annotations

import base64
import codecs
import re
import unicodedata
from pathlib import Path

HEX_RUN = re.compile(r"[0-9a-fA-F]{32,}")
B64_JSON = re.compile(r"eyJ[A-Za-z0-9_\-+/]{30,}")

_hex: dict[int, set[str]] = {}  # length -> lowercase hex values
_plain: set[str] = set()  # anything else, matched as is
LOGS: list[Path] = []


def sensitive(*values: str | bytes | None) -> None:
    """Register values that must never appear in a server log."""
    for v in values:
        if v is None:
            continue
        if isinstance(v, bytes):
            _hex.setdefault(len(v) * 2, set()).add(v.hex())
            _plain.add(base64.b64encode(v).decode().rstrip("="))
            _plain.add(base64.urlsafe_b64encode(v).decode().rstrip("="))
        elif re.fullmatch(r"[0-9a-fA-F]{32,}", v):
            _hex.setdefault(len(v), set()).add(v.lower())
        elif len(v) >= 12:
            _plain.add(v)


def leaks_in(text: str) -> list[str]:
    """The registered values (shortened for the report) and JWT-like strings found in `text`."""
    found = []
    for m in HEX_RUN.finditer(text):
        run = m.group().lower()
        for n, values in _hex.items():
            for i in range(0, len(run) - n + 1):
                if run[i:i + n] in values:
                    found.append(run[i:i + 12] + "…")
    found += [v[:12] + "…" for v in _plain if v in text]
    found += [m.group()[:16] + "…" for m in B64_JSON.finditer(text) if _decodes_to_text(m.group())]
    return found


def _decodes_to_text(b64: str) -> bool:
    """Whether the first 24 bytes `b64` encodes are text, as JSON's are: UTF-8 (not only ASCII:
    a name in a JWT) with no control character but JSON's whitespace (RFC 7515's own example
    header has a CRLF). Random bytes are, about one time in 10^7."""
    head = b64[:32].replace("-", "+").replace("_", "/")
    try:
        # (the 24th byte may cut a character in two: incremental, it is left out)
        text = codecs.getincrementaldecoder("utf-8")().decode(base64.b64decode(head, validate=True))
    except ValueError:  # (UnicodeDecodeError among them)
        return False
    return all(c in "\t\n\r" or unicodedata.category(c) != "Cc" for c in text)


def check_log(path: Path) -> list[str]:
    try:
        return leaks_in(path.read_text(errors="replace"))
    except FileNotFoundError:
        return []
