"""NIP-PL public-tag rules (acceptance step 3) and the expiration bound — pure.

Check order (first failure wins):

1. every tag is a non-empty list of strings           -> malformed tag
2. every tag name is d / expiration / exec / alt      -> unexpected tag
3. no tag name repeats                                -> duplicate tag
4. every tag has exactly one value                    -> missing / extra tag value
5. d, expiration, exec present (in that order)        -> missing d/expiration/exec tag
6. d 16..64 UTF-8 bytes; exec non-empty; alt <= max_string_len bytes
7. expiration is a canonical decimal integer <= 2^53-1 -> malformed expiration
8. now - allowed_skew < expiration <= now + max_lease_ttl
                                   -> lease already expired / lease ttl too long
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from .descriptor import Limits
from .errors import LeaseRejected

__all__ = ["PublicTags", "check_public_tags", "check_expiration", "D_MIN_BYTES", "D_MAX_BYTES"]

D_MAX_BYTES = 64
#: 128 bits of randomness cannot be encoded in fewer than 16 bytes.
D_MIN_BYTES = 16
_ALLOWED = ("d", "expiration", "exec", "alt")
_CANONICAL_DECIMAL = re.compile(r"0|[1-9][0-9]{0,15}")
_MAX_SAFE_INT = 2**53 - 1


@dataclass(frozen=True)
class PublicTags:
    d: str
    expiration: int
    exec_key_id: str
    alt: str | None = None


def _blen(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def check_expiration(expiration: int, *, now: int, limits: Limits) -> None:
    """``now - allowed_skew < expiration <= now + max_lease_ttl``."""
    if expiration <= now - limits.allowed_skew:
        raise LeaseRejected("already_expired")
    if expiration > now + limits.max_lease_ttl:
        raise LeaseRejected("ttl_too_long")


def check_public_tags(tags: Sequence[Any], *, now: int, limits: Limits) -> PublicTags:
    if not isinstance(tags, (list, tuple)):
        raise LeaseRejected("malformed_tag")
    for t in tags:
        if not isinstance(t, (list, tuple)) or not t or not all(isinstance(x, str) for x in t):
            raise LeaseRejected("malformed_tag")
    names = [t[0] for t in tags]
    if any(n not in _ALLOWED for n in names):
        raise LeaseRejected("unexpected_tag")
    if len(set(names)) != len(names):
        raise LeaseRejected("duplicate_tag")
    for t in tags:
        if len(t) < 2:
            raise LeaseRejected("missing_tag_value")
        if len(t) > 2:
            raise LeaseRejected("extra_tag_value")
    by_name = {t[0]: t[1] for t in tags}
    for name, code in (("d", "missing_d_tag"), ("expiration", "missing_expiration_tag"), ("exec", "missing_exec_tag")):
        if name not in by_name:
            raise LeaseRejected(code)
    d = by_name["d"]
    if _blen(d) > D_MAX_BYTES:
        raise LeaseRejected("d_too_long")
    if _blen(d) < D_MIN_BYTES:
        raise LeaseRejected("d_too_short")
    exec_id = by_name["exec"]
    if not exec_id:
        raise LeaseRejected("empty_exec_tag")
    alt = by_name.get("alt")
    if alt is not None and _blen(alt) > limits.max_string_len:
        raise LeaseRejected("alt_too_long")
    exp_s = by_name["expiration"]
    if _CANONICAL_DECIMAL.fullmatch(exp_s) is None:
        raise LeaseRejected("malformed_expiration")
    expiration = int(exp_s)
    if expiration > _MAX_SAFE_INT:
        raise LeaseRejected("malformed_expiration")
    check_expiration(expiration, now=now, limits=limits)
    return PublicTags(d=d, expiration=expiration, exec_key_id=exec_id, alt=alt)
