"""The `[gateway]` table: whether the gateway runs, its public base URL, trust anchor and APNs profiles.

```toml
[gateway]
enabled = true
public_url = "https://push.example.org"     # audience of every transcript; delivery URL = this + /v1/deliveries/apns
app_attest_root_ca = "/path/root.pem"       # optional; default: Apple's App Attestation Root CA (bundled)
[[gateway.profiles]]
id = "buzz-ios-production"                  # or buzz-ios-sandbox
app_id = "TEAMID.com.example.app"           # App Attest app id: <App ID prefix>.<bundle id>
environment = "production"                  # sandbox for buzz-ios-sandbox
topic = "com.example.app"                   # the bundle id of app_id
team_id = "TEAM123456"
key_id = "ABC123DEFG"
key_file = "/path/AuthKey.p8"
apns_url = "https://..."                    # optional override of Apple's host for the environment
ca_file = "/path/ca.pem"                    # optional extra CA bundle for that URL
```

`gateway_listen` (a flat setting, or a key of this table) serves the routes on their own address
instead of the main listener. A profile is enabled only when its App Attest app id, topic,
environment and credentials agree (NIP-PL, "Registered values"); anything else stops the start
with the field and the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from appliance.errors import ConfigError
from appliance.transports.apns import ApnsProfile, check_apns_url
from appliance.transports.credentials import ApnsKey, CredentialError

from .attest import load_roots
from .wire import REGISTERED_PROFILES

if TYPE_CHECKING:
    from appliance.settings import Settings

#: The APNs environment each registered profile sends to (NIP-PL, "Registered values").
PROFILE_ENVIRONMENT = {"buzz-ios-production": "production", "buzz-ios-sandbox": "sandbox"}

PROFILE_FIELDS = ("id", "app_id", "environment", "topic", "team_id", "key_id", "key_file", "apns_url", "ca_file")
PROFILE_REQUIRED = ("id", "app_id", "environment", "topic", "team_id", "key_id", "key_file")

# Defaults, each with its reason.
#: An enrolled installation lives 90 days unless re-enrolled: long enough for an app used weekly,
#: short enough that abandoned installs leave custody on their own.
DEFAULT_MAX_INSTALLATION_LIFETIME = 90 * 86400
#: Grants may last as long as the longest NIP-PL lease (max_lease_ttl default, 30 days).
DEFAULT_MAX_GRANT_LIFETIME = 30 * 86400
#: At most 10 admitted attempts per endpoint per 10 s: a phone woken more than once a second on
#: average gains nothing, and a compromised relay key cannot turn one device into a buzzer.
DEFAULT_QUOTA_WINDOW = 10
DEFAULT_QUOTA_MAX = 10

TABLE_FIELDS = ("enabled", "public_url", "app_attest_root_ca", "profiles", "gateway_listen",
                "max_installation_lifetime", "max_grant_lifetime", "endpoint_quota_window", "endpoint_quota_max")

_TOKEN = re.compile(r"[A-Za-z0-9]+\Z")


@dataclass(frozen=True)
class GatewayProfile:
    """One registered app profile and the APNs credentials it sends with."""

    id: str
    app_id: str
    environment: str
    topic: str
    team_id: str
    key_id: str
    key_file: str
    apns_url: str | None = None
    ca_file: str | None = None
    #: the loaded .p8 signing key (the same credentials code as the executor's direct APNs)
    apns_key: ApnsKey | None = field(default=None, compare=False, repr=False)

    @property
    def attest_environment(self) -> str:
        """App Attest AAGUID environment: production, or development for the APNs sandbox."""
        return "production" if self.environment == "production" else "development"

    def apns_profile(self) -> ApnsProfile:
        """What the APNs transport needs to send for this profile (the executor's own transport)."""
        assert self.apns_key is not None, "profile credentials not loaded"
        return ApnsProfile(self.id, self.topic, self.environment, self.apns_key, self.apns_url, self.ca_file)


@dataclass(frozen=True)
class GatewayConfig:
    enabled: bool = False
    public_url: str = ""          # as configured; "" means derived from the listening address
    app_attest_root_ca: str | None = None
    profiles: tuple[GatewayProfile, ...] = ()
    listen: str = ""              # host:port of a separate listener, "" = the main listener
    max_installation_lifetime: int = DEFAULT_MAX_INSTALLATION_LIFETIME
    max_grant_lifetime: int = DEFAULT_MAX_GRANT_LIFETIME
    endpoint_quota_window: int = DEFAULT_QUOTA_WINDOW
    endpoint_quota_max: int = DEFAULT_QUOTA_MAX
    derived_url: str = field(default="", compare=False)

    @property
    def base_url(self) -> str:
        """The public base URL without a trailing slash: every route and audience hangs off it."""
        return (self.public_url or self.derived_url).rstrip("/")

    @property
    def delivery_url(self) -> str:
        """The exact URL a relay's NIP-98 `u` tag must name."""
        return self.base_url + "/v1/deliveries/apns"

    @property
    def route_prefix(self) -> str:
        """The path under which the /v1 routes are served (the public URL's path)."""
        return urlsplit(self.base_url).path.rstrip("/")

    @property
    def host(self) -> str | None:
        """The host name requests must name to reach the gateway on the main listener (None: any)."""
        return urlsplit(self.public_url).hostname if self.public_url else None

    @property
    def display_url(self) -> str:
        return self.public_url or self.derived_url


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_listen(value: str, where: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) of a listener."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(where, value, "expected host:port, for example 127.0.0.1:7778")
    return host, int(port)


def _url(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(where, value, "expected an http:// or https:// URL such as https://push.example.org")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(where, value, "expected an http:// or https:// URL such as https://push.example.org")
    if parts.query or parts.fragment or parts.username or parts.password or value.endswith("?"):
        raise ConfigError(where, value, "the gateway URL takes no query, fragment or user part")
    try:
        parts.port
    except ValueError:
        raise ConfigError(where, value, "invalid port") from None
    return value


def _profile(data: Any, where: str) -> GatewayProfile:
    if not isinstance(data, dict):
        raise ConfigError(where, data, "expected a [[gateway.profiles]] table")
    unknown = sorted(set(data) - set(PROFILE_FIELDS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", data[unknown[0]],
                          "unknown profile field; known: " + ", ".join(PROFILE_FIELDS))
    for name in PROFILE_REQUIRED:
        if not isinstance(data.get(name), str) or not data[name]:
            raise ConfigError(f"{where}.{name}", data.get(name), "required, as text")
    for name in ("apns_url", "ca_file"):
        if name in data and (not isinstance(data[name], str) or not data[name]):
            raise ConfigError(f"{where}.{name}", data[name], "expected text (omit the field for the default)")
    p = GatewayProfile(**{k: data.get(k) for k in PROFILE_FIELDS})
    if p.id not in REGISTERED_PROFILES:
        raise ConfigError(f"{where}.id", p.id, "not a registered profile; use " + " or ".join(REGISTERED_PROFILES))
    if p.environment != PROFILE_ENVIRONMENT[p.id]:
        raise ConfigError(f"{where}.environment", p.environment,
                          f"{p.id} sends to the APNs {PROFILE_ENVIRONMENT[p.id]} environment")
    prefix, dot, bundle = p.app_id.partition(".")
    if not dot or not _TOKEN.match(prefix) or not bundle:
        raise ConfigError(f"{where}.app_id", p.app_id, "expected <App ID prefix>.<bundle id>, e.g. TEAM123456.com.example.app")
    if bundle != p.topic:
        raise ConfigError(f"{where}.topic", p.topic,
                          f"must be the bundle id of app_id ({bundle}): App Attest and APNs must name one app")
    try:
        key = ApnsKey.load(p.team_id, p.key_id, p.key_file)
    except CredentialError as exc:
        text = str(exc)
        name = "team_id" if text.startswith("team_id") else "key_id" if text.startswith("key_id") else "key_file"
        raise ConfigError(f"{where}.{name}", getattr(p, name), text) from None
    if p.apns_url is not None:
        _url(p.apns_url, f"{where}.apns_url")
        try:
            check_apns_url(p.apns_url)
        except CredentialError as exc:
            raise ConfigError(f"{where}.apns_url", p.apns_url, str(exc)) from None
    if p.ca_file is not None and not Path(p.ca_file).is_file():
        raise ConfigError(f"{where}.ca_file", p.ca_file, "no such file")
    return replace(p, apns_key=key)


def parse_gateway(table: Any, *, gateway_listen: str = "", derived_url: str = "") -> GatewayConfig:
    """Shape- and consistency-check the `[gateway]` table (ConfigError naming the field)."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError("gateway", table, "use a [gateway] table")
    unknown = sorted(set(table) - set(TABLE_FIELDS))
    if unknown:
        raise ConfigError(f"gateway.{unknown[0]}", table[unknown[0]],
                          "unknown gateway field; known: " + ", ".join(TABLE_FIELDS))
    enabled = table.get("enabled", False)
    if not isinstance(enabled, bool):
        raise ConfigError("gateway.enabled", enabled, "expected true or false")
    public_url = table.get("public_url", "")
    if public_url != "":
        _url(public_url, "gateway.public_url")
    root = table.get("app_attest_root_ca")
    if root is not None:
        if not isinstance(root, str) or not Path(root).is_file():
            raise ConfigError("gateway.app_attest_root_ca", root, "no such file (a PEM certificate)")
        try:
            load_roots(root)
        except (OSError, ValueError) as exc:
            raise ConfigError("gateway.app_attest_root_ca", root,
                              f"not a PEM certificate file (the App Attest root CA): {exc}") from None
    listen = table.get("gateway_listen", "")
    if not isinstance(listen, str):
        raise ConfigError("gateway.gateway_listen", listen, "expected host:port")
    if gateway_listen and listen and gateway_listen != listen:
        raise ConfigError("gateway_listen", gateway_listen, f"differs from gateway.gateway_listen ({listen}); set one")
    listen = gateway_listen or listen
    if listen:
        parse_listen(listen, "gateway_listen")
    limits = {}
    for name, default, lo, hi in (("max_installation_lifetime", DEFAULT_MAX_INSTALLATION_LIFETIME, 60, 10 * 365 * 86400),
                                  ("max_grant_lifetime", DEFAULT_MAX_GRANT_LIFETIME, 60, 10 * 365 * 86400),
                                  ("endpoint_quota_window", DEFAULT_QUOTA_WINDOW, 1, 86400),
                                  ("endpoint_quota_max", DEFAULT_QUOTA_MAX, 1, 1_000_000)):
        v = table.get(name, default)
        if not _is_int(v) or not lo <= v <= hi:
            raise ConfigError(f"gateway.{name}", v, f"expected a whole number from {lo} to {hi}")
        limits[name] = v
    raw_profiles = table.get("profiles", [])
    if not isinstance(raw_profiles, list):
        raise ConfigError("gateway.profiles", raw_profiles, "use [[gateway.profiles]] tables")
    profiles = tuple(_profile(p, f"gateway.profiles[{i}]") for i, p in enumerate(raw_profiles))
    ids = [p.id for p in profiles]
    for pid in ids:
        if ids.count(pid) > 1:
            raise ConfigError("gateway.profiles", pid, "profile configured twice")
    return GatewayConfig(enabled=enabled, public_url=public_url, app_attest_root_ca=root, profiles=profiles,
                         listen=listen, derived_url=derived_url, **limits)


def gateway_config(settings: Settings) -> GatewayConfig:
    """The checked `[gateway]` table (ConfigError naming the field), with its derived default URL."""
    listen = settings.gateway_listen or settings.gateway.get("gateway_listen", "")
    if listen:
        derived = f"http://{listen}"
    else:
        host = settings.host if settings.host not in {"0.0.0.0", "::", ""} else "127.0.0.1"
        derived = f"http://{host}:{settings.port}"
    return parse_gateway(settings.gateway, gateway_listen=settings.gateway_listen, derived_url=derived)
