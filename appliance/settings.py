"""One table of settings: name, default, env var, help; flag > APPLIANCE_* env > TOML file > default.

Every setting has the same name everywhere: `--max-subscriptions` on the command line,
`APPLIANCE_MAX_SUBSCRIPTIONS` in the environment and `max_subscriptions` in the config file.
Origins (communities) are not flat settings: they live in `[[origins]]` tables of the config file
and in the database (see `appliance.origins`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from appliance.errors import ConfigError

ENV_PREFIX = "APPLIANCE_"
#: APPLIANCE_* variables that are not settings (the config file, build and benchmark inputs); any
#: other that names no setting gets a warning (APPLIANCE_TEST_* are the test suite's).
KNOWN_ENV = frozenset({"APPLIANCE_CONFIG", "APPLIANCE_REVISION", "APPLIANCE_BINARY", "APPLIANCE_VECTORS",
                       "APPLIANCE_LOGS", "APPLIANCE_BENCH_PG", "APPLIANCE_CHROMIUM", "APPLIANCE_BENCH_SOURCE"})


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected true or false")


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a whole number")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 10)
    except ValueError:
        raise ValueError("expected a whole number") from None


def _float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number")
    if isinstance(value, (int, float)):
        out = float(value)
    else:
        try:
            out = float(str(value).strip())
        except ValueError:
            raise ValueError("expected a number, such as 2.5") from None
    if out != out or out in (float("inf"), float("-inf")):
        raise ValueError("expected a finite number")
    return out


def _str(value: Any) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError("expected text")
    return str(value)


def _storage(value: Any) -> str:
    text = _str(value).strip()
    if text == "sqlite" or text.startswith(("postgresql://", "postgres://")):
        return text
    # The value may be a mistyped URL with a password in it: the message does not repeat it.
    raise ValueError("must be 'sqlite' or a postgresql:// URL")


def _ws_url(value: Any) -> str:
    text = _str(value).strip()
    if not text:
        return ""
    parts = urlsplit(text)
    if parts.scheme not in {"ws", "wss"} or not parts.hostname:
        raise ValueError("expected a ws:// or wss:// URL, for example wss://relay.example.org")
    if parts.query or parts.fragment:
        raise ValueError("the public URL takes no query or fragment")
    return text


def _networks(value: Any) -> str:
    text = _str(value).strip()
    if text:
        import ipaddress

        for item in text.replace(" ", ",").split(","):
            if item:
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError:
                    raise ValueError(f"{item!r} is not an IP address or CIDR network, e.g. 10.0.0.2 or 10.0.0.0/8") from None
    return text


def _listen(value: Any) -> str:
    """'' (share the relay's listener), 'off', or HOST:PORT."""
    text = _str(value).strip()
    if text in ("", "off"):
        return text
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT (such as 127.0.0.1:7778), empty, or off")
    return f"{host}:{int(port)}"


def _pubkeys(value: Any) -> tuple[str, ...]:
    """A list of 64-hex pubkeys: a TOML list, or text separated by commas or spaces."""
    if isinstance(value, (list, tuple)):
        items = [_str(v).strip() for v in value]
    else:
        items = [v for v in _str(value).replace(",", " ").split() if v]
    for item in items:
        if item.lower().startswith("nsec1"):  # never repeated: ConfigError hides it too
            raise ValueError("an nsec is a secret key: give the pubkey (64 lowercase hex), and keep the nsec private")
        if len(item) != 64 or any(c not in "0123456789abcdef" for c in item):
            raise ValueError(f"{item!r} is not a pubkey (64 lowercase hex characters, not an npub)")
    return tuple(dict.fromkeys(items))


def _kinds(value: Any) -> tuple[int, ...]:
    """A list of event kinds: a TOML list, or numbers separated by commas or spaces ([] for none)."""
    if isinstance(value, (list, tuple)):
        items = list(value)
    else:
        text = _str(value).strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        items = [v for v in text.replace(",", " ").split() if v]
    kinds = []
    for item in items:
        try:
            kind = _int(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a kind (a whole number from 0 to 65535)") from None
        if not 0 <= kind <= 65535:
            raise ValueError(f"{kind} is not a kind (a whole number from 0 to 65535)")
        kinds.append(kind)
    return tuple(sorted(set(kinds)))


@dataclass(frozen=True)
class Setting:
    """One setting: its name, type, default and the help text shown everywhere."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    metavar: str = "VALUE"
    #: may be changed from the dashboard while serving (read afresh on every use); the
    #: configuration still wins: flag > env > config file > dashboard > default
    editable: bool = False
    #: its value is a secret (storage: a URL with a password): error messages do not repeat it
    secret: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def coerce(self, value: Any) -> Any:
        """Parse and range-check one raw value, raising ConfigError that names this setting."""
        try:
            parsed = self.parse(value)
        except ValueError as exc:
            raise ConfigError(self.name, "(not shown: a secret)" if self.secret else value, str(exc)) from None
        if self.minimum is not None and parsed < self.minimum:
            raise ConfigError(self.name, value, f"must be at least {self.minimum}")
        if self.maximum is not None and parsed > self.maximum:
            raise ConfigError(self.name, value, f"must be at most {self.maximum}")
        if self.choices is not None and parsed not in self.choices:
            raise ConfigError(self.name, value, "must be one of " + ", ".join(self.choices))
        return parsed


def _s(name, parse, default, help, **kw) -> Setting:
    return Setting(name, parse, default, help, **kw)


# The table. Defaults carry their reason in the help text.
SETTINGS: tuple[Setting, ...] = (
    _s("data_dir", _str, "./appliance-data",
       "Directory holding the SQLite database and the key file. Created on first start.", metavar="DIR"),
    _s("host", _str, "127.0.0.1",
       "Address to listen on. Loopback by default: put a TLS proxy in front, or set 0.0.0.0 deliberately."),
    _s("port", _int, 7777, "TCP port to listen on.", minimum=0, maximum=65535, metavar="PORT"),
    _s("public_url", _ws_url, "",
       "The wss:// URL clients use to reach this relay. It is the NIP-42 relay tag and the default "
       "origin. Empty means ws://HOST:PORT (fine on a laptop, wrong behind a proxy).", metavar="URL"),
    _s("relay_name", _str, "appliance", "NIP-11 name of the default origin."),
    _s("relay_description", _str, "A self-hosted Nostr relay with push.", "NIP-11 description of the default origin."),
    _s("relay_contact", _str, "", "NIP-11 contact (an email or URI) of the operator."),
    _s("relay_pubkey", _str, "", "NIP-11 pubkey of the operator (64 hex), shown to clients."),
    _s("access_policy", _str, "public",
       "Access policy of the default origin: 'public' (anyone reads public events) or 'members' "
       "(AUTH required; only members read or write).", choices=("public", "members")),
    _s("auth_required", _bool, False,
       "Require NIP-42 AUTH before any REQ, COUNT or EVENT on the default origin."),
    _s("max_message_length", _int, 131072,
       "Largest websocket message accepted, in bytes. 128 KiB fits any sane event with room to spare.",
       minimum=1024, maximum=16 * 1024 * 1024),
    _s("max_subscriptions", _int, 32,
       "Open subscriptions allowed per connection. Clients rarely need more than a dozen.", minimum=1, maximum=10000),
    _s("max_filters", _int, 16, "Filters allowed in one REQ or COUNT.", minimum=1, maximum=1000),
    _s("max_limit", _int, 5000,
       "Largest `limit` honoured in a filter; larger values are clamped, not refused.", minimum=1, maximum=1_000_000),
    _s("default_limit", _int, 500,
       "Events returned per filter when the client gives no `limit`. Bounds the cost of a careless REQ.",
       minimum=1, maximum=1_000_000),
    _s("max_query_bytes", _int, 8 * 1024 * 1024,
       "Most bytes of stored events one REQ answers with, shared evenly by its filters; each filter "
       "returns its newest events up to its share (page older ones with `until`). Bounds the memory "
       "one careless or hostile REQ costs: max_filters x max_limit events could be gigabytes.",
       minimum=64 * 1024, maximum=1024 * 1024 * 1024),
    _s("query_timeout", _float, 3.0,
       "Seconds one REQ or COUNT may spend in the database before it is abandoned (CLOSED "
       "`error:`). Keeps one expensive filter from holding a reader thread for everyone. 0 disables.",
       minimum=0, maximum=3600),
    _s("negentropy_max_records", _int, 1_000_000,
       "Most events one NIP-77 negentropy session may reconcile (strfry's maxSyncEvents default): a "
       "NEG-OPEN whose filter selects more is refused with NEG-ERR `blocked: too many records`. Each "
       "record held costs 40 bytes for as long as its session is open (a million: 40 MB).",
       minimum=1, maximum=100_000_000),
    _s("negentropy_max_sessions", _int, 2,
       "NIP-77 negentropy sessions one connection may have open at once (a sync uses one).",
       minimum=1, maximum=1000),
    _s("negentropy_idle_timeout", _float, 60.0,
       "Seconds a NIP-77 negentropy session may go without a message before it is closed (NEG-ERR "
       "`closed:`), its memory freed.", minimum=1, maximum=86400),
    _s("search_kinds", _kinds, (1, 30023),
       "Kinds whose content NIP-50 `search` finds (full-text index; other kinds never match a search): "
       "short notes and long-form articles by default. Indexing costs ingest time and disk for each "
       "event of these kinds. `appliance serve` indexes a kind added here (and drops one removed) at "
       "start; `appliance search reindex` rebuilds the whole index.", metavar="KINDS"),
    _s("max_filter_values", _int, 1000,
       "Values allowed in one filter list (ids, authors, kinds, a tag).", minimum=1, maximum=100000),
    _s("max_event_tags", _int, 2000, "Tags allowed on one event.", minimum=1, maximum=100000),
    _s("max_content_length", _int, 65536, "Largest event content accepted, in bytes.", minimum=1,
       maximum=16 * 1024 * 1024),
    _s("created_at_past", _int, 94608000,
       "How far in the past (seconds) an event's created_at may lie: 3 years by default. 0 means no bound.",
       minimum=0),
    _s("created_at_future", _int, 900,
       "How far in the future (seconds) an event's created_at may lie: 15 minutes covers clock skew.", minimum=0),
    _s("event_rate", _int, 100,
       "Sustained EVENT messages per second allowed per connection (token bucket). 0 disables.", minimum=0),
    _s("event_burst", _int, 1000, "Burst size of the per-connection EVENT token bucket.", minimum=1),
    _s("req_rate", _int, 20,
       "Sustained REQ/COUNT messages per second allowed per connection. 0 disables.", minimum=0),
    _s("req_burst", _int, 100, "Burst size of the per-connection REQ/COUNT token bucket.", minimum=1),
    _s("ip_event_rate", _int, 200,
       "Sustained EVENT messages per second allowed per client address, all its connections together "
       "(reconnecting or opening more connections buys no new budget). Twice the per-connection rate: "
       "a second device behind the same NAT publishes freely. 0 disables.", minimum=0),
    _s("ip_event_burst", _int, 2000, "Burst size of the per-address EVENT token bucket.", minimum=1),
    _s("ip_req_rate", _int, 40,
       "Sustained REQ/COUNT messages per second allowed per client address, all its connections "
       "together. A client paging through history waits for each answer and is slowed to this pace, "
       "never refused; one that pipelines past it gets CLOSED `rate-limited:`. 0 disables.", minimum=0),
    _s("ip_req_burst", _int, 200, "Burst size of the per-address REQ/COUNT token bucket.", minimum=1),
    _s("receive_rate", _int, 1024 * 1024,
       "Bytes per second read from one connection, and from one client address (all its connections "
       "together). A faster sender is read no faster (TCP backpressure): nothing is refused, a flood of "
       "large frames just waits in its own socket. 1 MiB/s is thousands of ordinary events. 0 disables.",
       minimum=0),
    _s("receive_burst", _int, 16 * 1024 * 1024,
       "Bytes read at full speed before receive_rate applies (per connection and per address): a "
       "client uploading a backlog of events is not slowed until it has sent this much.", minimum=1),
    _s("flood_backoff", _int, 300,
       "Longest wait, in seconds, before an address whose connection was closed for flooding (too many "
       "refused messages) may connect again: 2 s after the first close, doubling with each repeat "
       "within the hour; meanwhile its connection attempts get HTTP 429 with Retry-After. 0 disables.",
       minimum=0, maximum=86400),
    _s("loopback_exempt", _bool, True,
       "Spare loopback addresses (this machine, when no trusted proxy forwards a client address) "
       "from the per-address limits: ip_* budgets, max_connections_per_ip and flood_backoff. On by "
       "default so that a local proxy which forwards no X-Forwarded-For does not put every client "
       "into one budget; turn it off when local users are not trusted. Per-connection limits apply "
       "regardless."),
    _s("auth_window", _int, 600,
       "Seconds an AUTH event's created_at may differ from now (NIP-42 suggests about ten minutes).", minimum=1),
    _s("storage", _storage, "sqlite",
       "Where the appliance keeps its data: 'sqlite' (a database file in data_dir: the embedded default, "
       "the fast path for one box) or a PostgreSQL URL, postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
       "(libpq's URL form; ?host=/run/postgresql for a Unix socket), for a community past one box. The "
       "database must be empty or the appliance's own (`appliance migrate-to-postgres URL` copies a SQLite "
       "data dir into an empty one). The key file stays in data_dir. The URL is a secret: never logged, "
       "its password redacted wherever it is shown.", metavar="sqlite|URL", secret=True),
    _s("sync_mode", _str, "full",
       "SQLite durability: 'full' fsyncs every group commit (survives power loss), 'normal' survives "
       "process crashes only but is faster on slow disks.", choices=("full", "normal")),
    _s("write_batch", _int, 500,
       "Most writes grouped into one commit. Larger batches amortise fsync; 500 keeps OK latency low. "
       "Under load (16 or more writes waiting) the writer waits up to 10 ms for more while they keep "
       "coming, so one commit carries them.",
       minimum=1, maximum=100000),
    _s("max_output_buffer_total", _int, 256 * 1024 * 1024,
       "Most bytes of answers queued for clients that have not read them yet, all connections together. "
       "Past it, the connections with the most unread output are dropped first (a client that stops "
       "reading cannot make the process grow without bound); each connection also stops being served "
       "new answers while it has more than max_query_bytes unread. 256 MiB keeps a 1 GB machine safe.",
       minimum=1024 * 1024, maximum=64 * 1024 * 1024 * 1024),
    _s("reader_threads", _int, 4,
       "REQ/COUNT queries running at once (each on its own reader thread and connection). Connections "
       "share them fairly, in 10 ms time slices: an expensive query pauses while others wait, so more "
       "than about twice the cores buys nothing.", minimum=1, maximum=64),
    _s("purge_interval", _int, 60,
       "Seconds between sweeps that delete expired (NIP-40) events.", minimum=1),
    _s("lease_workers", _int, 1,
       "Processes that check NIP-PL leases (signature, NIP-44, schema, filter grammar) beside the "
       "event loop. 1 uses the second core of a small box; 0 checks them on the loop.",
       minimum=0, maximum=64),
    _s("wake_workers", _int, 64,
       "NIP-PL wakes sent at once (concurrent HTTP/2 streams over the provider connections). APNs "
       "serves hundreds of streams per connection; 64 keeps a burst moving without piling requests "
       "onto a slow provider.", minimum=1, maximum=1000),
    _s("wake_min_interval", _float, 2.0,
       "Per-endpoint rate cap, in seconds: at least this long between two wakes (or retries) sent to one device. "
       "Matches in between join the next wake, which carries the highest class among them, so a chat "
       "burst wakes a phone once or twice rather than once per message. 0 disables the cap.",
       minimum=0, maximum=3600),
    _s("wake_max_attempts", _int, 10,
       "Attempts per wake on transient provider failures (429, 500, 503, no answer) before it is "
       "dead-lettered. With the default backoff ten attempts span about 15 minutes.",
       minimum=1, maximum=100),
    _s("wake_retry_delay", _float, 2.0,
       "Seconds before the first retry of a wake; each later retry waits twice as long (with jitter, "
       "at most 10 minutes), or longer when the provider asks (Retry-After).", minimum=0.01, maximum=3600),
    _s("wake_useful_age", _int, 3600,
       "Seconds a wake stays worth sending: older ones are dead-lettered, and APNs is told "
       "(apns-expiration) not to hold one longer. An hour-old wake no longer tells anyone anything.",
       minimum=60, maximum=7 * 86400),
    _s("wake_visibility_timeout", _float, 60.0,
       "Seconds after which the claim of a wake a crashed process was sending lapses and the wake is "
       "claimed again (same apns-id), so a crash between sending and recording loses nothing. A "
       "running process extends the claims it still holds, however slow the provider.",
       minimum=1, maximum=3600),
    _s("delivery_log_retention", _int, 7 * 86400,
       "Seconds delivery-log rows (one per attempt) and finished wake jobs are kept: a week covers "
       "looking into last week's \"I got no notification\".", minimum=3600, maximum=366 * 86400,
       editable=True),
    _s("ws_compression", _bool, True,
       "Offer permessage-deflate to websocket clients. Saves bandwidth on metered links; costs CPU "
       "(about 2-3 ms per 50-event REQ on a small VM). Turn off on a CPU-bound box."),
    _s("max_connections_per_ip", _int, 64,
       "Open connections allowed from one client address (loopback exempt, see loopback_exempt; "
       "behind a trusted proxy, the address it forwards). Enough for a household behind one NAT with "
       "several clients each; low enough that one machine cannot hold every socket. 0 disables.", minimum=0, maximum=1_000_000),
    _s("trusted_proxies", _networks, "",
       "Proxies whose X-Forwarded-For header names the real client (comma-separated addresses or "
       "CIDR networks). Loopback is always trusted: a TLS proxy on the same box. Never list an "
       "address clients can connect from directly: they could claim any address.", metavar="ADDRS"),
    _s("gateway_listen", _str, "",
       "Serve the APNs gateway routes (the [gateway] table) on their own host:port instead of the "
       "main listener. Empty: they share the main listener, routed by the gateway's public_url host "
       "and path.", metavar="HOST:PORT"),
    _s("admin_listen", _listen, "",
       "Where the admin dashboard listens. Empty: under /admin on the relay's own address. HOST:PORT: "
       "only there, on its own listener (for example 127.0.0.1:7778, or a VPN address), and not on the "
       "relay's. off: no dashboard.", metavar="HOST:PORT"),
    _s("admin_session_ttl", _int, 43200,
       "Seconds a dashboard sign-in lasts (12 hours: a working day, then sign in again).",
       minimum=300, maximum=30 * 86400, editable=True),
    _s("admin_pubkeys", _pubkeys, (),
       "Pubkeys (64 hex, separated by commas) allowed to use the NIP-86 management API with NIP-98 "
       "auth. Empty: the API refuses every call.", metavar="PUBKEYS", editable=True),
    _s("metrics_token", _str, "",
       "Bearer token a Prometheus scraper sends to read /admin/metrics without a dashboard sign-in. "
       "Empty: metrics need a signed-in session (or the dashboard's own listener, see admin_listen)."),
    _s("log_level", _str, "info", "Logging level.", choices=("debug", "info", "warning", "error")),
    _s("log_client_addresses", _bool, False,
       "Write client addresses into log lines at info level and above (the line for each accepted websocket, a "
       "failed dashboard sign-in). Off by default: the log keeps no record of who connected; turn it on for "
       "a while to trace abuse."),
    _s("push_draft_transports", _bool, False,
       "Advertise and deliver the draft push transports beyond NIP-PL v1: app profiles whose transport "
       "is fcm (Firebase Cloud Messaging HTTP v1) or unifiedpush (Web Push to a distributor). Off by "
       "default: such profiles are left out of the NIP-11 push descriptor (a lease naming one is refused "
       "as an unknown app profile) and no transport is built for them. Their constant messages are this "
       "appliance's own (docs/spec-notes.md), not yet the spec's; every page that shows them says draft."),
    _s("marmot_draft_multi_device", _bool, False,
       "Allow `appliance marmot` to run the draft Marmot multi-device join (pairing payload, kind 452 "
       "admin authorization, External Commit with the join PSK). Off by default: the draft's bytes are "
       "not final and upstream may withdraw it; every output it produces is labelled draft. The "
       "per-command flag --draft-multi-device turns it on for one run."),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


@dataclass
class Settings:
    """Resolved settings: attribute access by setting name, plus the config file's extra tables."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)
    origins: list[dict[str, Any]] = field(default_factory=list)
    config_path: Path | None = None
    #: the `[push]` table: NIP-PL push configuration of the default origin (empty = disabled)
    push: dict[str, Any] = field(default_factory=dict)
    #: the `[gateway]` table: the optional APNs gateway (checked by appliance.gateway.config)
    gateway: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Plain attributes: settings are read on hot paths (every EVENT checks its limits).
        for name, value in self.values.items():
            setattr(self, name, value)

    @property
    def data_path(self) -> Path:
        return Path(self.values["data_dir"])

    def apply_stored(self, stored: Mapping[str, Any]) -> None:
        """Values saved from the dashboard, for editable settings the configuration leaves at their
        default (an unknown or no longer valid saved value is ignored)."""
        for name, raw in stored.items():
            setting = BY_NAME.get(name)
            if setting is None or not setting.editable or self.sources.get(name, "default") not in (
                    "default", "dashboard"):
                continue
            try:
                value = setting.coerce(raw)
            except ConfigError:
                continue
            self.values[name] = value
            self.sources[name] = "dashboard"
            setattr(self, name, value)

    def clear_stored(self, name: str) -> None:
        """A dashboard value removed: back to the default."""
        if self.sources.get(name) == "dashboard":
            setting = BY_NAME[name]
            self.values[name] = setting.default
            self.sources[name] = "default"
            setattr(self, name, setting.default)

    @property
    def effective_public_url(self) -> str:
        if self.values["public_url"]:
            return self.values["public_url"]
        host = self.values["host"]
        if host in {"0.0.0.0", "::", ""}:
            host = "127.0.0.1"
        return f"ws://{host}:{self.values['port']}"


def load(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_path: str | Path | None = None,
) -> Settings:
    """Resolve every setting: flag > APPLIANCE_* env > TOML file > default."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    if config_path is None and environ.get(ENV_PREFIX + "CONFIG"):
        config_path = environ[ENV_PREFIX + "CONFIG"]
    file_values: dict[str, Any] = {}
    origins: list[dict[str, Any]] = []
    push: dict[str, Any] = {}
    gateway: dict[str, Any] = {}
    path = Path(config_path) if config_path else None
    if path is not None:
        try:
            with path.open("rb") as fh:
                file_values = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError("config", str(path), "the config file does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("config", str(path), f"not valid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError("config", str(path), "not valid TOML: the file is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError("config", str(path), f"cannot read the config file: {exc.strerror}") from None
        origins = file_values.pop("origins", [])
        if not isinstance(origins, list) or not all(isinstance(o, dict) for o in origins):
            raise ConfigError("origins", origins, "use [[origins]] tables")
        push = file_values.pop("push", {})
        if not isinstance(push, dict):
            raise ConfigError("push", push, "use a [push] table")
        gateway = file_values.pop("gateway", {})
        if not isinstance(gateway, dict):
            raise ConfigError("gateway", gateway, "use a [gateway] table")
        unknown = sorted(set(file_values) - set(BY_NAME))
        if unknown:
            raise ConfigError(unknown[0], file_values[unknown[0]],
                              "unknown setting in the config file; `appliance config sample` lists them all")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        if setting.name in flags:
            raw, source = flags[setting.name], "flag"
        elif setting.env in environ:
            raw, source = environ[setting.env], "env"
        elif setting.name in file_values:
            raw, source = file_values[setting.name], "file"
        else:
            values[setting.name] = setting.default
            sources[setting.name] = "default"
            continue
        values[setting.name] = setting.coerce(raw)
        sources[setting.name] = source
    _check_cross(values)
    return Settings(values=values, sources=sources, origins=origins, config_path=path, push=push, gateway=gateway)


def _check_cross(values: dict[str, Any]) -> None:
    if values["default_limit"] > values["max_limit"]:
        raise ConfigError("default_limit", values["default_limit"],
                          f"must not exceed max_limit ({values['max_limit']}); lower default_limit too")
    pk = values["relay_pubkey"]
    if pk.lower().startswith("nsec1"):
        raise ConfigError("relay_pubkey", pk, "an nsec is a secret key: give the pubkey (64 lowercase hex), "
                          "and keep the nsec private")
    if pk and (len(pk) != 64 or any(c not in "0123456789abcdef" for c in pk)):
        raise ConfigError("relay_pubkey", pk, "expected 64 lowercase hex characters (a pubkey, not an npub)")


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_literal(v) for v in value) + "]"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def sample_config() -> str:
    """A commented sample config file listing every setting with its default."""
    lines = [
        "# appliance configuration (TOML).",
        "# Precedence: command-line flag > APPLIANCE_* environment variable > this file > default.",
        "# Every line below is commented out and shows the default.",
        "",
    ]
    for s in SETTINGS:
        import textwrap

        for chunk in textwrap.wrap(s.help, 96):
            lines.append(f"# {chunk}")
        extra = f" ({s.env}, {s.flag})"
        lines.append(f"#{extra}")
        lines.append(f"# {s.name} = {_toml_literal(s.default)}")
        lines.append("")
    lines += [
        "# Extra communities served by this process. Each origin has its own events, NIP-11",
        "# document, access policy, groups and members. Requests are routed by Host header.",
        "# [[origins]]",
        '# origin = "wss://chat.example.org"        # canonical origin string',
        '# hosts = ["chat.example.org"]              # Host names routed here',
        '# path = "/"                                # optional path prefix',
        '# name = "Example chat"',
        '# description = ""',
        '# access_policy = "members"                 # public | members',
        '# allow = ["<64-hex pubkey>"]               # members / allowed writers',
        '# block = []                                # never allowed',
        '# push = { app_profiles = [{ id = "com.example.app/ios", transport = "apns" }], push_kinds = [9, 1059] }',
        "",
        "# NIP-PL push executor of the default origin (omit the table to disable push). Executor keys",
        "# are generated on first start; rotate them with `appliance keys rotate ORIGIN`.",
        "# [push]",
        "# Only id and transport are advertised; the rest of an apns profile is its delivery credentials",
        "# (all five of topic, team_id, key_id, key_file, environment, or none: then wakes wait as",
        "# configuration faults). apns_url and ca_file optionally point it at another APNs host. Or,",
        "# instead of credentials, gateway_url delivers through an APNs gateway (this appliance's",
        "# [gateway] or a remote one): lease endpoints are then its grants, wakes are NIP-98 signed.",
        '# app_profiles = [{ id = "com.example.app/ios", transport = "apns", topic = "com.example.app",',
        '#                   team_id = "TEAM123456", key_id = "ABC123DEFG",',
        '#                   key_file = "/etc/appliance/AuthKey_ABC123DEFG.p8", environment = "production" },',
        '#                 { id = "buzz-ios-production", transport = "apns", gateway_url = "https://push.example.org" },',
        '#                 { id = "com.example.app/android", transport = "fcm" }]  # fcm: DRAFT, see below',
        "# push_kinds = [9, 1059, 7]                  # kinds a lease may subscribe to",
        "# urgent_kinds = []                          # subset of push_kinds allowing class urgent",
        '# h_grammar = "uuid-v4-lowercase"',
        '# class_support = { apns = ["silent", "default", "time_sensitive", "urgent"] }  # default: all',
        "# allowed_skew = 900                         # clock skew allowance (seconds), not advertised",
        "# [push.limitation]                          # overrides of the spec's defaults",
        "# max_lease_ttl = 2592000",
        "# max_leases_per_pubkey = 16",
        "# DRAFT transports beyond NIP-PL v1 (fcm, unifiedpush): their profiles are advertised and",
        "# delivered only with push_draft_transports = true; their constant messages are this",
        "# appliance's own (docs/spec-notes.md), not yet the spec's.",
        "# A unifiedpush profile (DRAFT) sends Web Push (RFC 8030/8291/8292) to the distributor URL a lease",
        "# names (https://host/path#p256dh=...&auth=...); vapid_subject, the contact every VAPID token names,",
        "# is required. allow_hosts lets those hosts be http:// and resolve to private or loopback",
        "# addresses (a distributor on your own network; never otherwise); host_rate and host_burst cap",
        "# requests per push host; ca_file trusts another CA for push hosts.",
        '# { id = "org.example.app/up", transport = "unifiedpush", vapid_subject = "mailto:ops@example.org",',
        '#   allow_hosts = [], host_rate = 10, host_burst = 20 }',
        "",
        "# The optional APNs gateway (NIP-PL Public APNs Gateway Profile) in this process: App Attest",
        "# enrollment, relay delegations and sealed endpoint grants, deliveries over NIP-98. Its routes",
        "# (/v1/...) are served under public_url's path on the main listener (routed by its Host), or",
        "# on gateway_listen. Relays use it with an app profile like",
        '# { id = "buzz-ios-production", transport = "apns", gateway_url = "https://push.example.org" }.',
        "# [gateway]",
        "# enabled = true",
        '# public_url = "https://push.example.org"   # audience of every transcript; default http://HOST:PORT',
        '# app_attest_root_ca = "/path/root.pem"     # default: Apple App Attestation Root CA (bundled)',
        "# max_installation_lifetime = 7776000       # 90 days",
        "# max_grant_lifetime = 2592000              # 30 days, the default max_lease_ttl",
        "# endpoint_quota_window = 10                # seconds: at most endpoint_quota_max attempts",
        "# endpoint_quota_max = 10                   # per endpoint per window, never refunded",
        "# [[gateway.profiles]]",
        '# id = "buzz-ios-production"                # or buzz-ios-sandbox',
        '# app_id = "TEAMID.com.example.app"         # App Attest app id: <App ID prefix>.<bundle id>',
        '# environment = "production"                # sandbox for buzz-ios-sandbox',
        '# topic = "com.example.app"                 # the bundle id of app_id',
        '# team_id = "TEAM123456"',
        '# key_id = "ABC123DEFG"',
        '# key_file = "/path/AuthKey.p8"',
        '# apns_url = "https://..."                  # optional override of Apple\'s host',
        '# ca_file = "/path/ca.pem"                  # optional extra CA bundle for that URL',
        "",
    ]
    return "\n".join(lines)


#: The unit of each numeric setting, shown beside its value (the dashboard, `config show`): a
#: setting with no entry is text, a switch or a choice.
UNITS: dict[str, str] = {
    "port": "TCP port", "max_message_length": "bytes", "max_subscriptions": "subscriptions per connection",
    "max_filters": "filters per REQ or COUNT", "max_limit": "events per filter", "default_limit": "events per filter",
    "max_query_bytes": "bytes per REQ", "query_timeout": "seconds", "max_filter_values": "values per filter list",
    "max_event_tags": "tags per event", "max_content_length": "bytes", "created_at_past": "seconds",
    "created_at_future": "seconds", "event_rate": "EVENTs per second per connection",
    "event_burst": "EVENTs (per connection)", "req_rate": "REQs/COUNTs per second per connection",
    "req_burst": "REQs/COUNTs (per connection)", "ip_event_rate": "EVENTs per second per address",
    "ip_event_burst": "EVENTs (per address)", "ip_req_rate": "REQs/COUNTs per second per address",
    "ip_req_burst": "REQs/COUNTs (per address)", "receive_rate": "bytes per second", "receive_burst": "bytes",
    "flood_backoff": "seconds", "auth_window": "seconds", "write_batch": "writes per commit",
    "reader_threads": "threads", "purge_interval": "seconds", "lease_workers": "processes",
    "wake_workers": "wakes at once", "wake_min_interval": "seconds", "wake_max_attempts": "attempts",
    "wake_retry_delay": "seconds", "wake_useful_age": "seconds", "wake_visibility_timeout": "seconds",
    "delivery_log_retention": "seconds", "max_connections_per_ip": "connections per address",
    "admin_session_ttl": "seconds",
}


def summary(setting: Setting) -> str:
    """A setting's help in one line: its first sentence, with its unit."""
    first = setting.help.split(". ")[0].rstrip(".") + "."
    unit = UNITS.get(setting.name)
    return f"{first} Unit: {unit}." if unit else first
