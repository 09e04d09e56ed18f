"""APNs token-based credentials: the .p8 signing key and the ES256 provider token (JWT) cache.

Importable on its own (the APNs gateway uses it for its own sends). Apple's rules, which this
module keeps:

- the provider token is a JWT with header `{"alg": "ES256", "kid": <key id>}` and claims
  `{"iss": <team id>, "iat": <issued at>}`, signed with the P-256 key of the .p8 file;
- one token is reused for many requests and connections: Apple refuses tokens older than an
  hour (403 ExpiredProviderToken) and answers 429 TooManyProviderTokenUpdates to a provider that
  makes new ones more often than about every 20 minutes. We reuse a token for 50 minutes, and
  make a new one early only when APNs called the one in use expired (`refresh(stale)`), once per
  stale token however many requests saw it.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

__all__ = ["CredentialError", "ApnsKey", "ProviderToken", "load_p8", "parse_p8", "TOKEN_LIFETIME"]

#: Seconds one provider token is reused. Apple: tokens older than an hour are refused, and new
#: tokens more often than every 20 minutes are throttled; 50 minutes leaves margin for clock skew.
TOKEN_LIFETIME = 50 * 60

# Apple's team and key identifiers are 10 characters, uppercase letters and digits.
_APPLE_ID = re.compile(r"[A-Z0-9]{10}")
# A .p8 file is a few hundred bytes; anything much bigger is not one.
_MAX_P8_BYTES = 16 * 1024


class CredentialError(ValueError):
    """Credentials that cannot be used; the message says why (never the key material)."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def parse_p8(data: bytes) -> ec.EllipticCurvePrivateKey:
    """The P-256 private key of a .p8 file's bytes (PEM PKCS#8); CredentialError if it is not one."""
    if len(data) > _MAX_P8_BYTES:
        raise CredentialError("not an APNs .p8 key: the file is too large")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CredentialError("the .p8 key is password-protected; APNs keys are not") from None
    except ValueError:
        raise CredentialError("not a PEM private key: use the .p8 file as Apple's developer site gives it "
                              "(AuthKey_<key id>.p8, a few lines of text)") from None
    except Exception:  # cryptography raises its own types for unsupported algorithms
        raise CredentialError("not a usable private key (an unsupported key type, or a damaged file)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise CredentialError("not an APNs key: APNs signing keys are P-256 (ES256) elliptic-curve keys")
    return key


def key_fingerprint(key: ec.EllipticCurvePrivateKey) -> str:
    """`p8:` and 16 hex of SHA-256 of the public key: names a .p8 key without revealing it."""
    import hashlib

    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "p8:" + hashlib.sha256(der).hexdigest()[:16]


def load_p8(path: str | Path) -> ec.EllipticCurvePrivateKey:
    """Read and parse a .p8 file; CredentialError naming the problem (missing, unreadable, wrong type)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise CredentialError(f"key file {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise CredentialError(f"key file {str(p)!r} is a directory") from None
    except OSError as exc:
        raise CredentialError(f"cannot read key file {str(p)!r}: {exc.strerror or exc}") from None
    return parse_p8(data)


def check_apple_id(name: str, value: object) -> str:
    """A team id or key id: exactly 10 uppercase letters or digits (as Apple issues them)."""
    if not isinstance(value, str) or not _APPLE_ID.fullmatch(value):
        raise CredentialError(f"{name} must be the 10-character identifier Apple shows (A-Z, 0-9)")
    return value


@dataclass(frozen=True)
class ApnsKey:
    """A team's APNs signing key: what a provider token is made from."""

    team_id: str
    key_id: str
    private_key: ec.EllipticCurvePrivateKey = field(repr=False, compare=False)

    @classmethod
    def load(cls, team_id: str, key_id: str, key_file: str | Path) -> "ApnsKey":
        check_apple_id("team_id", team_id)
        check_apple_id("key_id", key_id)
        return cls(team_id, key_id, load_p8(key_file))

    @classmethod
    def from_pem(cls, team_id: str, key_id: str, pem: bytes) -> "ApnsKey":
        """From the .p8 file's bytes (a key kept in the database rather than in a file)."""
        check_apple_id("team_id", team_id)
        check_apple_id("key_id", key_id)
        return cls(team_id, key_id, parse_p8(pem))

    @property
    def identity(self) -> tuple[str, str, str]:
        """(team id, key id, key fingerprint): transports with equal identities share one ProviderToken."""
        return (self.team_id, self.key_id, key_fingerprint(self.private_key))

    def sign_token(self, issued_at: int) -> str:
        """A provider token (JWT, ES256) issued at `issued_at`."""
        header = _b64url(json.dumps({"alg": "ES256", "kid": self.key_id}, separators=(",", ":")).encode())
        claims = _b64url(json.dumps({"iss": self.team_id, "iat": issued_at}, separators=(",", ":")).encode())
        signing_input = f"{header}.{claims}".encode("ascii")
        r, s = decode_dss_signature(self.private_key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        return f"{header}.{claims}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


class ProviderToken:
    """The provider token in use for one key: made once, reused for `lifetime` seconds.

    Thread-safe. `current()` is what every request sends; `refresh(stale)` replaces the token only
    if `stale` is still the one in use, so many requests answered ExpiredProviderToken at once
    cause one new token, not one each.
    """

    def __init__(self, key: ApnsKey, *, lifetime: int = TOKEN_LIFETIME, clock: Callable[[], float] = time.time):
        self.key = key
        self.lifetime = lifetime
        self.clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._issued_at = 0
        self.issued = 0  # how many tokens were made (tests and the dashboard read it)

    def _make(self) -> str:
        now = int(self.clock())
        self._token = self.key.sign_token(now)
        self._issued_at = now
        self.issued += 1
        return self._token

    def current(self) -> str:
        with self._lock:
            if self._token is None or self.clock() - self._issued_at >= self.lifetime:
                return self._make()
            return self._token

    def refresh(self, stale: str) -> str:
        """A token other than `stale`: a new one unless another caller already replaced it."""
        with self._lock:
            if self._token is None or self._token == stale:
                return self._make()
            return self._token
