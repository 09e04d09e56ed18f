"""Who may use the dashboard: one operator password, a one-time setup token, signed sessions,
CSRF tokens and login rate limits.

- No default password. Until one is set, the start banner prints a setup URL whose token (32
  random bytes) lets one browser set it; `appliance admin reset` forgets the password, ends every
  session and makes a fresh token. Only the token's SHA-256 is stored; it is spent atomically.
- Passwords: scrypt (memory-hard: each guess costs memory as well as time), run off the event loop.
- Sessions: a random id in an HttpOnly, SameSite=Strict cookie, signed with a key derived from the
  key file; the server keeps the id's hash and expiry, so signing out, a password change or a reset
  ends sessions at once.
- CSRF: every state-changing request carries a token (a form field, or the X-CSRF-Token header htmx
  sends) that is an HMAC of the session id; before sign-in, of a random cookie (double submit).
- Login attempts are limited per client address and overall (`LoginLimiter`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import deque
from dataclasses import dataclass

from appliance.store import admin as rows
from appliance.store.interface import Connection

# scrypt cost: dear enough per guess in memory and time, cheap enough for one sign-in:
# docs/performance.md#scrypt_n
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
SCRYPT_MAXMEM = 64 * 1024 * 1024
MIN_PASSWORD_LENGTH = 10
MAX_PASSWORD_LENGTH = 1024
# A setup URL printed at start or by `appliance admin reset` works for a day.
SETUP_TOKEN_TTL = 86400

SESSION_COOKIE = "appliance_admin"
PRESESSION_COOKIE = "appliance_admin_pre"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


# -- passwords ---------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                            maxmem=SCRYPT_MAXMEM, dklen=32)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, stored: str | None) -> bool:
    if not stored:
        return False
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
                             maxmem=SCRYPT_MAXMEM, dklen=32)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, base64.b64decode(digest))


def password_problem(password: str, confirm: str | None = None) -> str | None:
    """Why this new password is refused, or None."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"the password must have at least {MIN_PASSWORD_LENGTH} characters"
    if len(password) > MAX_PASSWORD_LENGTH:
        return f"the password may have at most {MAX_PASSWORD_LENGTH} characters"
    if confirm is not None and confirm != password:
        return "the two passwords differ"
    return None


# -- setup tokens ---------------------------------------------------------------------------------------------


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_setup_token(conn: Connection, now: int) -> str:
    """Make (and store the hash of) a fresh one-time setup token; any earlier one stops working."""
    token = secrets.token_urlsafe(32)
    rows.set_setup_token(conn, token_hash(token), now + SETUP_TOKEN_TTL)
    return token


def reset(conn: Connection, now: int) -> str:
    """`appliance admin reset`: forget the password, end every session, return a new setup token."""
    rows.clear_password(conn, now)
    return new_setup_token(conn, now)


def setup_token_valid(conn: Connection, token: str, now: int) -> bool:
    auth = rows.auth_row(conn)
    return bool(token) and auth.setup_token_hash is not None and hmac.compare_digest(
        auth.setup_token_hash, token_hash(token)) and (auth.setup_token_expires or 0) > now


def set_password_with_token(conn: Connection, token: str, password_hash: str, now: int) -> bool:
    """Spend the token and set the password in one transaction; False if the token was not valid."""
    if not rows.spend_setup_token(conn, token_hash(token), now):
        return False
    rows.set_password(conn, password_hash, now)
    return True


# -- sessions and CSRF ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signer:
    """Signs cookie values and derives CSRF tokens with a key derived from the key file."""

    key: bytes

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self.key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def sign(self, value: str) -> str:
        return f"{value}.{self._mac('cookie', value)}"

    def unsign(self, signed: str | None) -> str | None:
        if not signed or "." not in signed:
            return None
        value, _, mac = signed.rpartition(".")
        return value if hmac.compare_digest(mac, self._mac("cookie", value)) else None

    def csrf(self, session_id: str) -> str:
        return self._mac("csrf", session_id)

    def check_csrf(self, session_id: str | None, token: str | None) -> bool:
        return bool(session_id) and bool(token) and hmac.compare_digest(self.csrf(session_id), token)


def new_session(conn: Connection, now: int, ttl: int) -> str:
    session_id = secrets.token_urlsafe(32)
    rows.new_session(conn, token_hash(session_id), now, now + ttl)
    return session_id


def session_valid(conn: Connection, session_id: str | None, now: int) -> bool:
    if not session_id:
        return False
    row = rows.session_row(conn, token_hash(session_id))
    return row is not None and row[1] > now


def end_session(conn: Connection, session_id: str) -> None:
    rows.end_session(conn, token_hash(session_id))


# -- rate limiting ------------------------------------------------------------------------------------------------


class LoginLimiter:
    """Failed sign-ins per client address (5 per 15 minutes) and overall (30 per minute, which
    bounds a distributed guesser and the scrypt work it can cause). The client address is the one
    a trusted proxy forwards (`PeerLimits.client_address`), so clients behind the local TLS proxy
    are not one address. Each attempt is charged as a failure when it starts (`attempt`), before
    the password is checked: requests sent at once cannot all pass the check before any of them
    has failed. A successful sign-in clears the address's count. In memory: a restart forgets,
    which costs an attacker a restart of ours."""

    PER_ADDRESS = 5
    PER_ADDRESS_WINDOW = 900.0
    OVERALL = 30
    OVERALL_WINDOW = 60.0
    MAX_ADDRESSES = 10_000

    def __init__(self) -> None:
        self.failures: dict[str, deque[float]] = {}
        self.overall: deque[float] = deque()

    def _prune(self, now: float) -> None:
        while self.overall and self.overall[0] <= now - self.OVERALL_WINDOW:
            self.overall.popleft()

    def retry_after(self, address: str, now: float | None = None) -> int:
        """Seconds until this address may try again (0: now)."""
        now = time.monotonic() if now is None else now
        self._prune(now)
        waits = [0.0]
        if len(self.overall) >= self.OVERALL:
            waits.append(self.overall[0] + self.OVERALL_WINDOW - now)
        mine = self.failures.get(address)
        if mine:
            while mine and mine[0] <= now - self.PER_ADDRESS_WINDOW:
                mine.popleft()
            if len(mine) >= self.PER_ADDRESS:
                waits.append(mine[0] + self.PER_ADDRESS_WINDOW - now)
        return int(max(waits) + 0.999)

    def attempt(self, address: str, now: float | None = None) -> int:
        """Start a sign-in attempt: 0 and the attempt is charged (as a failure, until `succeeded`),
        or the seconds to wait, nothing charged. No await between the check and the charge."""
        now = time.monotonic() if now is None else now
        wait = self.retry_after(address, now)
        if not wait:
            self.failed(address, now)
        return wait

    def failed(self, address: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.overall.append(now)
        if address not in self.failures and len(self.failures) >= self.MAX_ADDRESSES:
            self.failures.pop(next(iter(self.failures)))  # oldest first: bounded memory
        self.failures.setdefault(address, deque()).append(now)

    def succeeded(self, address: str) -> None:
        self.failures.pop(address, None)
