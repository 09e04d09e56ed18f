"""`appliance doctor [--online]`: check an installation without changing it; a pass/fail list.

Checks, in order: the configuration resolves; every origin and push descriptor is valid; the
gateway table (when enabled); the data directory is writable; the database passes SQLite's
quick_check and has a schema this version knows (on PostgreSQL: the server answers, the schema
version is the latest migration, every table and column is there, the rows every store holds are,
and the server's settings suit the appliance: `_postgres`); the clock is sane; the key file exists, is private
(0600, owned by this user) and unwraps every key the database holds; every APNs credential set
parses and signs a provider token, wherever it was configured (the config file, or the dashboard:
a .p8 kept wrapped in the database is unwrapped). `--online` also reaches each profile's APNs host
(or its `apns_url`): a TLS handshake offering h2, then the HTTP/2 connection preface, which the
host must answer with its SETTINGS frame. Exits 1 when any check fails, 0 otherwise.

Nothing is written: the database is opened read-only (on PostgreSQL: one READ ONLY transaction,
rolled back), and the writability probe removes its file. The PostgreSQL URL is a secret: every line
shows it without its password.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from appliance.errors import ApplianceError, ConfigError
from appliance.push.config import CREDENTIAL_FIELDS
from appliance.settings import Settings, load
from appliance.store.backend import database_errors
from appliance.store.dsn import error_text, is_postgres, redact
from appliance.store.events import newest_created_at
from appliance.store.instance import read_instance, running_pid
from appliance.store.interface import Connection
from appliance.store.keyfile import KEYFILE_NAME, KeyFile
from appliance.store.schema import SCHEMA_VERSION
from appliance.store.sqlite import DB_FILENAME, open_checked

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# No clock this program runs on can honestly be earlier than this (the year it was written).
CLOCK_FLOOR = 1735689600  # 2025-01-01T00:00:00Z
# Seconds the --online probe waits for a TLS handshake with an APNs host.
DEFAULT_PROBE_TIMEOUT = 5.0


DB_ERRORS = database_errors()


@dataclass(frozen=True)
class Check:
    status: str  # PASS | FAIL | SKIP
    name: str
    detail: str


def add_parser(parser: argparse.ArgumentParser, add_setting_flags: Callable) -> None:
    parser.add_argument("--online", action="store_true",
                        help="Also reach each profile's APNs host (or apns_url): TLS, then an HTTP/2 preface.")
    add_setting_flags(parser)


def run(args: argparse.Namespace, flags: dict, config_path: str | None) -> int:
    checks = list(diagnose(flags, config_path, online=args.online))
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{c.status}  {c.name.ljust(width)}  {c.detail}", flush=True)
    failed = [c for c in checks if c.status == FAIL]
    if failed:
        print(f"appliance doctor: {len(failed)} of {len(checks)} checks failed")
        return 1
    print(f"appliance doctor: no problem found ({len(checks)} checks)")
    return 0


def diagnose(flags: dict, config_path: str | None, *, online: bool = False,
             probe_timeout: float = DEFAULT_PROBE_TIMEOUT) -> Iterator[Check]:
    """Every check's result, in order (configuration first: nothing else runs without it)."""
    try:
        settings = load(flags=flags, config_path=config_path)
    except ApplianceError as exc:
        yield Check(FAIL, "configuration", str(exc))
        return
    where = f"config file {settings.config_path}" if settings.config_path else "no config file"
    changed = sum(1 for s in settings.sources.values() if s != "default")
    yield Check(PASS, "configuration", f"{where}; {changed} setting(s) not at their default")
    from appliance.commands import follow_running

    follow_running(settings)  # a running appliance's real address, in every URL below
    conn, db_checks = _open_database(settings)
    if conn is not None:
        from appliance.store.admin import stored_settings

        try:
            settings.apply_stored(stored_settings(conn))  # what the dashboard saved, as `serve` reads it
        except DB_ERRORS:
            pass
    try:
        origins: list = []
        yield from _origins(settings, conn, origins)
        yield from _gateway(settings)
        yield _unless_unreadable("data directory", _data_dir, settings)
        yield from db_checks
        yield _clock(settings, conn)
        yield _unless_unreadable("key file", _keyfile, settings, conn)
        credentials = list(_credential_sets(settings, origins))
        stored = _stored_keys(settings, conn)
        yield from _credentials(credentials, stored)
        yield from _fcm_credentials(settings, origins, stored)
        if online:
            yield from _probes(credentials, probe_timeout)
    finally:
        if conn is not None:
            conn.close()


# -- origins and descriptors -----------------------------------------------------------------------

def _origins(settings: Settings, conn: Connection | None, seen: list) -> Iterator[Check]:
    """The origins' checks; every origin that parsed is added to `seen`."""
    from appliance.origin_config import default_origin, default_origin_id, served_default_origin
    from appliance.origins import Origin, load_origins
    from appliance.push.config import build_descriptor, check_push_config, check_push_fits_relay

    origins = []

    def default():
        # As `serve` makes it: what the dashboard saved (push, credentials) included.
        base = default_origin(settings)
        if conn is None:
            return base
        try:
            return served_default_origin(conn, settings)
        except DB_ERRORS:
            return base

    makers = [("default origin", settings.effective_public_url, default)]
    for i, o in enumerate(settings.origins):
        makers.append((f"origins[{i}]", str(o.get("origin", f"origins[{i}]")),
                       lambda o=o, i=i: Origin.from_mapping(o, where=f"origins[{i}]", check_push=check_push_config)))
    failed = False
    for where, url, make in makers:
        try:
            origins.append((where, make()))
        except ApplianceError as exc:
            failed = True
            is_push = isinstance(exc, ConfigError) and "push" in exc.name
            yield Check(FAIL, f"descriptor {url}" if is_push else f"origin {url}", str(exc))
    if failed:
        return
    stored = []
    if conn is not None:
        try:
            # The stored default origin is rewritten from the settings at start: checked as such.
            default_id = default_origin_id(conn)
            stored = [o for o in load_origins(conn) if o.id != default_id]
        except (ApplianceError, *DB_ERRORS) as exc:
            yield Check(FAIL, "origins", f"the stored origins do not load: {_safe(exc, settings)}")
            return
    declared = {o.origin for _w, o in origins}
    origins += [(f"stored {o.origin}", o) for o in stored if o.origin not in declared]
    ids = {o.origin: o.id for o in stored}
    seen.extend(origins)
    yield Check(PASS, "origins", f"{len(origins)} origin(s): " + ", ".join(o.origin for _w, o in origins))
    for where, origin in origins:
        if not origin.push:
            continue
        name = f"descriptor {origin.origin}"
        try:
            check_push_fits_relay(origin.push, where, settings.max_content_length)
            keys = _executor_keys(conn, origin.id or ids.get(origin.origin))
            desc = build_descriptor(origin.origin, origin.push, keys, drafts=settings.push_draft_transports)
        except ApplianceError as exc:
            yield Check(FAIL, name, str(exc))
            continue
        hidden = len(origin.push.get("app_profiles", [])) - len(desc.app_profiles)
        off = f"; {hidden} draft profile(s) not advertised: push_draft_transports is off" if hidden else ""
        yield Check(PASS, name, f"valid ({len(desc.app_profiles)} app profile(s), push_kinds "
                    f"{list(desc.push_kinds)}, {len(keys)} executor key(s){off})")


def _executor_keys(conn: Connection | None, origin_id: int | None) -> tuple:
    """The keys the descriptor would advertise now; a stand-in key when none exists yet (the
    first start makes one)."""
    from appliance.nostr.keys import generate_secret, public_key
    from appliance.push import keys as keystore
    from appliance.push.descriptor import ExecutorKey

    now = int(time.time())
    if conn is not None and origin_id is not None:
        advertised = keystore.advertised(keystore.list_keys(conn, origin_id), now)
        if advertised:
            return advertised
    return (ExecutorKey(keystore.new_key_id(now), public_key(generate_secret()), current=True),)


def _gateway(settings: Settings) -> Iterator[Check]:
    from appliance.gateway.config import gateway_config

    try:
        config = gateway_config(settings)
    except ApplianceError as exc:
        yield Check(FAIL, "gateway", str(exc))
        return
    if config.enabled:
        yield Check(PASS, "gateway", f"enabled at {config.display_url} with {len(config.profiles)} profile(s)")


# -- the data directory, database, clock and key file -----------------------------------------------

def _unreadable(exc: OSError) -> str:
    """Why a file of the data directory could not be read: most often the doctor run as another
    user than the service's."""
    where = f"{exc.filename}: " if exc.filename else ""
    return (f"cannot read {where}{exc.strerror or exc}: run the doctor as the data directory's owner "
            "(the service's user) or as root")


def _unless_unreadable(name: str, check: Callable[..., Check], *args) -> Check:
    try:
        return check(*args)
    except OSError as exc:
        return Check(FAIL, name, _unreadable(exc))


def _data_dir(settings: Settings) -> Check:
    path = settings.data_path
    target = path if path.exists() else next((p for p in path.parents if p.exists()), Path("."))
    if not target.is_dir():
        return Check(FAIL, "data directory", f"{target} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".doctor-") as fh:
            fh.write(b"x")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return Check(FAIL, "data directory", f"cannot write in {target}: {exc.strerror or exc}")
    stat = os.statvfs(target)
    free = stat.f_bavail * stat.f_frsize
    state = "exists" if path.exists() else "will be created at first start"
    pid = running_pid(path) if path.exists() else None
    serving = "" if pid is None else f"; served now by pid {pid}" if pid else "; served now"
    running = read_instance(path) if pid else None
    if running and running.get("listen"):
        serving += " on " + ", ".join(running["listen"])
    if free < 100 * 1024 * 1024:
        return Check(FAIL, "data directory", f"{path.resolve()} {state}, writable, but only "
                     f"{free // (1024 * 1024)} MiB free")
    return Check(PASS, "data directory", f"{path.resolve()} {state}, writable, {free / 2**30:.1f} GiB free{serving}")


def _open_database(settings: Settings) -> tuple[object | None, list[Check]]:
    """A read-only connection to the store for the checks that read it (None when there is none
    to read, or it is not fit to be read), and the database's own checks."""
    if is_postgres(settings.storage):
        return _postgres(settings)
    path = settings.data_path / DB_FILENAME
    try:
        present = path.exists()
    except OSError as exc:
        return None, [Check(FAIL, "database", _unreadable(exc))]
    if not present:
        return None, [Check(SKIP, "database", f"no database yet at {path} (created at first start)")]
    try:
        conn, result, version = open_checked(path, busy_timeout_ms=5000)
    except DB_ERRORS as exc:
        return None, [Check(FAIL, "database", f"{path} cannot be read as SQLite: {exc}")]
    if result != ["ok"]:
        conn.close()
        return None, [Check(FAIL, "database", f"quick_check: {'; '.join(result[:3])} (restore from a backup)")]
    if version > SCHEMA_VERSION:
        conn.close()
        return None, [Check(FAIL, "database", f"schema version {version} is newer than this appliance knows "
                            f"({SCHEMA_VERSION}): upgrade the appliance")]
    size = path.stat().st_size
    note = "" if version == SCHEMA_VERSION else f", migrated to {SCHEMA_VERSION} at next start"
    check = Check(PASS, "database", f"quick_check ok, schema version {version}{note}, {size / 2**20:.1f} MiB")
    if version < SCHEMA_VERSION:
        conn.close()  # older tables: the origin and key checks would read a shape this code does not know
        return None, [check]
    return conn, [check]


def _safe(exc: BaseException, settings: Settings) -> str:
    """An error's text, with the storage URL's password taken out should the driver echo it."""
    if not is_postgres(settings.storage):
        return str(exc)
    return error_text(exc, settings.storage)


def _postgres(settings: Settings) -> tuple[object | None, list[Check]]:
    """A PostgreSQL store: `database` (the server answers; schema version), `database tables`
    (every table and column of this version), `database rows` (the rows every store holds) and
    `database settings` (the server's, for this appliance). The connection is handed on only when
    the schema is this version's and whole."""
    from appliance.store import pg_check

    where = redact(settings.storage)
    try:
        conn = pg_check.connect(settings.storage)
    except DB_ERRORS as exc:
        return None, [Check(FAIL, "database", f"cannot connect to {where}: {_safe(exc, settings)}")]
    keep = False
    try:
        try:
            found = pg_check.inspect(conn)
        except DB_ERRORS as exc:
            return None, [Check(FAIL, "database", f"{where} answers but cannot be read: {_safe(exc, settings)}")]
        checks = [_server_settings(settings, found.server)]
        size = f"{found.server.size / 2**20:.1f} MiB"
        latest = pg_check.SCHEMA_VERSION
        version = found.schema_version
        head = f"{where}: PostgreSQL {found.server.version}"
        if version is None:
            if found.columns:
                return None, [Check(FAIL, "database", f"{head}; the database holds tables this appliance did not "
                                    "create (no schema_version): give the appliance a database of its own"), *checks]
            return None, [Check(SKIP, "database", f"{head}; an empty database (the schema is made at first "
                                "start)"), *checks]
        if found.version_rows != 1:
            return None, [Check(FAIL, "database", f"{head}; schema_version holds {found.version_rows} rows, not "
                                "one: the schema was changed by hand (restore from a backup)"), *checks]
        if version > latest:
            return None, [Check(FAIL, "database", f"{head}; schema version {version} is newer than this appliance "
                                f"knows ({latest}): upgrade the appliance"), *checks]
        if version < latest:
            return None, [Check(PASS, "database", f"{head}; schema version {version}, migrated to {latest} at "
                                f"next start; {size}"), *checks]
        checks.insert(0, Check(PASS, "database", f"{head}; schema version {version} (the latest); {size}"))
        want = pg_check.expected_columns()
        problems = []
        for table, columns in want.items():
            got = found.columns.get(table)
            if got is None:
                problems.append(f"table {table} is missing")
            elif got != columns:
                lost = [c for c in columns if c not in got]
                problems.append(f"table {table} lacks column(s) {', '.join(lost)}" if lost else
                                f"table {table} has columns {', '.join(got)}, expected {', '.join(columns)}")
        extra = sorted(set(found.columns) - set(want))
        if extra:
            problems.append(f"table(s) this appliance did not create: {', '.join(extra)}")
        if problems:
            checks.insert(1, Check(FAIL, "database tables", "; ".join(problems[:4]) + " (restore from a backup)"))
            return None, checks
        checks.insert(1, Check(PASS, "database tables", f"all {len(want)} tables with their columns"))
        try:
            missing = pg_check.missing_rows(conn)
        except DB_ERRORS as exc:
            missing = [f"unreadable ({_safe(exc, settings)})"]
        if missing:
            checks.insert(2, Check(FAIL, "database rows", f"missing: {', '.join(missing)} (restore from a backup)"))
            return None, checks
        checks.insert(2, Check(PASS, "database rows", "schema_version, meta config_generation, admin_auth present"))
        keep = True
        return conn, checks
    finally:
        if not keep:
            conn.close()


def _server_settings(settings: Settings, server) -> Check:
    """The server's settings against what the appliance needs of them."""
    from appliance.store import pg_check

    name = "database settings"
    if server.version_num < pg_check.MIN_SERVER_VERSION:
        return Check(FAIL, name, f"PostgreSQL {server.version} is older than 13: upgrade the database server")
    if server.encoding.upper() not in ("UTF8", "UTF-8"):
        return Check(FAIL, name, f"the database's encoding is {server.encoding}, not UTF8: events are UTF-8 text; "
                     "create the database with --encoding UTF8")
    if server.in_recovery or server.read_only:
        why = "a standby (read-only replica)" if server.in_recovery else "read-only (default_transaction_read_only)"
        return Check(FAIL, name, f"the database is {why}: point storage at the primary")
    need = pg_check.connections_per_node(settings.reader_threads)
    usable = server.max_connections - server.reserved
    if usable < need:
        return Check(FAIL, name, f"max_connections {server.max_connections} leaves {usable} for the appliance, but "
                     f"one node opens up to {need}: raise max_connections")
    durable = server.fsync and server.synchronous_commit != "off"
    if settings.sync_mode == "full" and not durable:
        off = "fsync" if not server.fsync else "synchronous_commit"
        return Check(FAIL, name, f"{off} is off on the database server, but sync_mode = \"full\" promises that an "
                     f"acknowledged event survives a crash: turn {off} on, or set sync_mode = \"normal\"")
    nodes = usable // need
    fsync = "on" if server.fsync else "off (a crash of the machine may corrupt the database: a throwaway cluster only)"
    return Check(PASS, name, f"encoding UTF8, primary, fsync {fsync}, synchronous_commit "
                 f"{server.synchronous_commit}; {server.connections} of {server.max_connections} connections in "
                 f"use, room for {nodes} node(s) of up to {need}")


def _clock(settings: Settings, conn: Connection | None) -> Check:
    now = int(time.time())
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    if now < CLOCK_FLOOR:
        return Check(FAIL, "clock", f"the system clock says {stamp}, before this program was written: set the "
                     "time (NTP); signatures, AUTH and leases are checked against it")
    if conn is not None:
        try:
            newest = newest_created_at(conn)
        except DB_ERRORS:
            newest = None
        if newest is not None and newest > now + settings.created_at_future:
            return Check(FAIL, "clock", f"the system clock says {stamp}, but the database holds an event from "
                         f"{newest - now} s later than that: the clock went back (check NTP)")
    return Check(PASS, "clock", f"{stamp} (UTC)")


def _keyfile(settings: Settings, conn: Connection | None) -> Check:
    from appliance.commands.backup import check_keyfile

    path = settings.data_path / KEYFILE_NAME
    if not path.exists():
        if conn is not None and _holds_keys(conn):
            return Check(FAIL, "key file", f"{path} is missing but the database holds keys wrapped by it: "
                         "restore appliance.key from the backup made with this database")
        return Check(SKIP, "key file", f"no key file yet at {path} (created at first start, 0600)")
    st = path.stat()
    mode = st.st_mode & 0o777
    if mode & 0o077:
        return Check(FAIL, "key file", f"{path} has mode {mode:04o}: others can read the master key; "
                     f"run chmod 600 {path}")
    owner = st.st_uid
    if owner != os.geteuid() and os.geteuid() != 0:
        return Check(FAIL, "key file", f"{path} belongs to uid {owner}, not to this user ({os.geteuid()}): "
                     "run the doctor as the service's user (or as root)")
    if owner != settings.data_path.stat().st_uid:
        return Check(FAIL, "key file", f"{path} belongs to uid {owner}, the data directory to uid "
                     f"{settings.data_path.stat().st_uid}: the service runs as the directory's owner; chown it")
    try:
        key = KeyFile.read(path)
        checked = check_keyfile(conn, key) if conn is not None else 0
    except ApplianceError as exc:
        return Check(FAIL, "key file", f"{exc}")
    except DB_ERRORS as exc:
        return Check(FAIL, "key file", f"the wrapped keys cannot be read: {_safe(exc, settings)}")
    return Check(PASS, "key file", f"{path} mode 0600, unwraps all {checked} wrapped key(s)")


def _holds_keys(conn: Connection) -> bool:
    from appliance.store.keyfile import holds_wrapped_keys

    try:
        return holds_wrapped_keys(conn)
    except DB_ERRORS:
        return False


# -- APNs credentials ---------------------------------------------------------------------------

def _credential_sets(settings: Settings, origins: list) -> Iterator[tuple[str, str, dict]]:
    """(label, setting path, app profile) for every app profile that may carry APNs credentials: the origins'
    (configuration and database) and the gateway's."""
    for where, origin in origins:
        push = origin.push or {}
        for i, profile in enumerate(push.get("app_profiles", []) or []):
            if isinstance(profile, dict) and profile.get("transport") == "apns":
                yield f"{origin.origin} {profile.get('id')}", f"push.app_profiles[{i}]", profile
    gateway = settings.gateway if isinstance(settings.gateway, dict) else {}
    if gateway.get("enabled") is True and isinstance(gateway.get("profiles"), list):
        # The raw tables: a key that does not load fails the gateway check and is named here too.
        for i, p in enumerate(gateway["profiles"]):
            if isinstance(p, dict):
                fields = {k: v for k, v in p.items() if k in CREDENTIAL_FIELDS or k == "id"}
                yield f"gateway {p.get('id')}", f"gateway.profiles[{i}]", {**fields, "transport": "apns"}


def _stored_keys(settings: Settings, conn: Connection | None) -> dict[str, bytes] | None:
    """The .p8 keys uploaded through the dashboard (fingerprint -> PEM); None when they cannot
    be read (no database, or a key file that does not unwrap them: the key file check says why)."""
    from appliance.store.credentials import load_apns_keys

    path = settings.data_path / KEYFILE_NAME
    try:
        if conn is None or not path.exists():
            return None
        return load_apns_keys(conn, KeyFile.read(path))
    except (ApplianceError, *DB_ERRORS, OSError):
        return None


def _credentials(sets: list[tuple[str, str, dict]], stored: dict[str, bytes] | None) -> Iterator[Check]:
    """Each credential set loads (the executor's own rules: `push.config.delivery_profile`) and
    signs a provider token."""
    from appliance.push.config import delivery_profile

    found = False
    for label, where, p in sets:
        name = f"apns credentials {label}"
        if "key_stored" in p and stored is None:
            found = True
            yield Check(SKIP, name, f"key {p['key_stored']} is kept in the database: unreadable here (see the "
                        "database and key file checks)")
            continue
        try:
            profile = delivery_profile(p, where, stored or {})
            if profile is None:
                continue  # no credentials (a gateway_url profile, or none given): nothing to check
            found = True
            profile.key.sign_token(int(time.time()))
            profile.ssl_context()
        except (ValueError, OSError, ApplianceError) as exc:  # CredentialError is a ValueError
            found = True
            yield Check(FAIL, name, str(exc))
            continue
        source = p.get("key_file") or f"{p.get('key_stored')} (stored)"
        yield Check(PASS, name, f"key {p.get('key_id')} of team {p.get('team_id')} ({source}) signs a provider "
                    f"token; topic {p.get('topic')}, {p.get('environment')}")
    if not found:
        yield Check(SKIP, "apns credentials", "no APNs credentials configured")


def _fcm_credentials(settings: Settings, origins: list, stored: dict[str, bytes] | None) -> Iterator[Check]:
    """Each fcm profile (a draft transport) loads its service account and signs a grant; skipped
    while push_draft_transports is off."""
    from appliance.push.config import kind_profile

    for _where, origin in origins:
        for i, p in enumerate((origin.push or {}).get("app_profiles", []) or []):
            if not isinstance(p, dict) or p.get("transport") != "fcm":
                continue
            name = f"fcm credentials {origin.origin} {p.get('id')} (draft)"
            if not settings.push_draft_transports:
                yield Check(SKIP, name, "push_draft_transports is off: not advertised, nothing delivered")
                continue
            if "service_account_stored" in p and stored is None:
                yield Check(SKIP, name, f"service account {p['service_account_stored']} is kept in the database: "
                            "unreadable here (see the database and key file checks)")
                continue
            try:
                profile = kind_profile(p, f"push.app_profiles[{i}]", stored or {})
                if profile is None:
                    # As an APNs profile without credentials: allowed, its wakes wait (an alert says so).
                    yield Check(SKIP, name, "no service account: its wakes wait as configuration faults")
                    continue
                profile.account.sign_grant(int(time.time()), profile.token_uri)
            except (ValueError, OSError, ApplianceError) as exc:
                yield Check(FAIL, name, str(exc))
                continue
            yield Check(PASS, name, f"service account {profile.account.client_email} ({profile.source}) signs a "
                        f"grant; project {profile.project_id}, token endpoint {profile.token_uri}")


def _apns_url(p: dict) -> str:
    from appliance.transports.apns import APNS_HOSTS

    return (p.get("apns_url") or APNS_HOSTS.get(p.get("environment", ""), "")).rstrip("/")


def _ssl_context(p: dict) -> ssl.SSLContext:
    import certifi

    from appliance.transports.apns import load_ca_file

    ctx = ssl.create_default_context(cafile=certifi.where())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if p.get("ca_file"):
        load_ca_file(ctx, p["ca_file"])
    ctx.set_alpn_protocols(["h2"])
    return ctx


# RFC 9113 3.4: the client connection preface, then our (empty) SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS, _H2_GOAWAY = 0x4, 0x7


def _http2_preface(tls: ssl.SSLSocket) -> str | None:
    """Send the HTTP/2 connection preface; None when the server's first frame is its SETTINGS
    (RFC 9113 3.4: what an HTTP/2 server sends first), else what came instead. Then a GOAWAY."""
    tls.sendall(_H2_PREFACE)
    head = b""
    while len(head) < 9:
        chunk = tls.recv(9 - len(head))
        if not chunk:
            return "the connection closed" if not head else "the connection closed mid-frame"
        head += chunk
    length, ftype, stream = int.from_bytes(head[:3], "big"), head[3], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
    if ftype != _H2_SETTINGS or stream != 0 or length % 6:
        shown = head.decode("latin-1") if all(32 <= b < 127 for b in head) else head.hex()
        return f"its first bytes were {shown!r}, not a SETTINGS frame"
    try:  # a polite end: GOAWAY, last stream 0, NO_ERROR
        tls.sendall(b"\x00\x00\x08" + bytes([_H2_GOAWAY]) + b"\x00" + b"\x00" * 4 + b"\x00" * 8)
    except OSError:
        pass
    return None


def _probes(sets: list[tuple[str, str, dict]], timeout: float) -> Iterator[Check]:
    from urllib.parse import urlsplit

    seen: set[str] = set()
    if not sets:
        yield Check(SKIP, "apns reachable", "no APNs host configured")
        return
    for _label, _where, p in sets:
        url = _apns_url(p)
        if not url or url in seen:
            continue
        seen.add(url)
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 443
        name = f"apns reachable {host}:{port}"
        started = time.monotonic()
        try:
            ctx = _ssl_context(p)
            with socket.create_connection((host, port), timeout=timeout) as raw:
                with ctx.wrap_socket(raw, server_hostname=host) as tls:
                    alpn, version = tls.selected_alpn_protocol(), tls.version()
                    problem = _http2_preface(tls) if alpn == "h2" else None
        except (OSError, ValueError, ssl.SSLError) as exc:
            yield Check(FAIL, name, f"no TLS connection: {exc}")
            continue
        ms = (time.monotonic() - started) * 1000
        if alpn != "h2":
            yield Check(FAIL, name, f"{version} but the server did not offer HTTP/2 (ALPN {alpn!r})")
            continue
        if problem:
            yield Check(FAIL, name, f"{version}, but no HTTP/2 server answered the preface: {problem}")
            continue
        yield Check(PASS, name, f"{version}, HTTP/2 (its SETTINGS answered our preface), {ms:.0f} ms")


__all__ = ["diagnose", "Check", "PASS", "FAIL", "SKIP", "ConfigError"]
