"""Command line: `appliance` alone serves with embedded defaults; subcommands manage and measure."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Sequence

from appliance import version_line
from appliance.errors import ApplianceError
from appliance.settings import SETTINGS, Settings, load, sample_config


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the problem and where to read more, not the usage block."""

    def error(self, message: str):
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.required:
                name = argparse._get_action_name(action)
                if name and "required" in message and name in message:
                    what = (action.metavar or "command").lower()
                    message = f"missing {what}: one of {', '.join(action.choices)}"
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# The settings a command that opens the data directory lists in its --help: where the data is. The
# other settings belong to `serve` (and `config show`); a command still takes them from the config
# file and APPLIANCE_*, and as flags too (hidden from its --help), as it always did.
DATA_SETTINGS = ("data_dir", "storage")
ALL_SETTINGS = tuple(s.name for s in SETTINGS)


def _short_help(s) -> str:
    first = s.help.split(". ")[0].rstrip(".")
    return f"{first}. [env {s.env}; default {s.default!r}]"


def _add_setting_flags(parser: argparse.ArgumentParser, uses: Sequence[str] = ()) -> None:
    """--config and the settings: `uses` (with DATA_SETTINGS) listed in --help, the others hidden."""
    parser.add_argument("--config", metavar="FILE", help="TOML config file (also APPLIANCE_CONFIG).")
    full = set(uses) >= set(ALL_SETTINGS)
    shown = set(ALL_SETTINGS) if full else set(DATA_SETTINGS) | set(uses)
    title = "settings (flag > APPLIANCE_* env > config file > default)" if full else \
        "settings (these and the others of `appliance serve --help`: flag > APPLIANCE_* env > config file > default)"
    group = parser.add_argument_group(title)
    for s in SETTINGS:
        if s.name in shown:
            group.add_argument(s.flag, dest=s.name, metavar=s.metavar, default=None,
                               help=f"{s.help} [env {s.env}; default {s.default!r}]" if full else _short_help(s))
        else:
            parser.add_argument(s.flag, dest=s.name, metavar=s.metavar, default=None, help=argparse.SUPPRESS)


def _settings_using(*uses: str):
    """`_add_setting_flags` listing `uses` too (for a command module's `add_parser`)."""
    return lambda parser: _add_setting_flags(parser, uses)


def _server_setting_flags(parser: argparse.ArgumentParser) -> None:
    _add_setting_flags(parser, ALL_SETTINGS)


def warn_unknown_env(environ=None) -> None:
    """One warning line per APPLIANCE_* variable that names no setting (a typo is otherwise silently
    ignored), with the nearest setting's variable."""
    import difflib
    import os

    from appliance.settings import KNOWN_ENV, ENV_PREFIX

    environ = os.environ if environ is None else environ
    names = [s.env for s in SETTINGS]
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in names or var in KNOWN_ENV or var.startswith(ENV_PREFIX + "TEST_"):
            continue
        near = difflib.get_close_matches(var, names, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}?" if near else "`appliance config sample` lists the settings"
        print(f"appliance: warning: {var} is not a setting and is ignored; {hint}", file=sys.stderr)


def _settings(args: argparse.Namespace) -> Settings:
    flags = {s.name: getattr(args, s.name, None) for s in SETTINGS}
    return load(flags=flags, config_path=getattr(args, "config", None))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="appliance",
        description="A self-hosted Nostr relay with a NIP-PL push executor, in one process. "
        "With no command it serves (same as `appliance serve`).",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="Run the relay (the default command).",
                           description="Run the relay until interrupted.")
    _server_setting_flags(serve)

    config = sub.add_parser("config", help="Show the resolved configuration or print a sample.",
                            description="Configuration tools.")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    config_sub.add_parser("sample", help="Print a commented sample config file with every setting.",
                          description="Print a commented sample config file listing every setting and its default.")
    check = config_sub.add_parser("show", help="Print the resolved settings and where each came from.",
                                  description="Resolve settings (flag > env > file > default) and print them.")
    _server_setting_flags(check)

    origins = sub.add_parser("origins", help="List, add, edit or remove origins (communities).",
                             description="Manage the communities this process serves.")
    from appliance.commands import origins as origins_cli

    origins_cli.add_parser(origins, _settings_using("public_url"))

    groups = sub.add_parser("groups", help="Create NIP-29 groups; manage admins and members.",
                            description="Manage the groups of an origin.")
    from appliance.commands import groups as groups_cli

    groups_cli.add_parser(groups, _settings_using("public_url"))

    keys = sub.add_parser("keys", help="List or rotate NIP-PL executor encryption keys.",
                          description="Manage the push executor keys of an origin.")
    from appliance.commands import keys as keys_cli

    keys_cli.add_parser(keys, _settings_using("public_url"))

    marmot = sub.add_parser("marmot", help="Marmot (MLS over Nostr) groups and the draft multi-device join.",
                            description="Marmot tooling: key packages, groups, messages and the draft "
                            "multi-device join, from files and pipes. Each command prints one JSON document.")
    from appliance.commands import marmot as marmot_cli

    marmot_cli.add_parser(marmot)

    gateway = sub.add_parser("gateway", help="Manage the APNs gateway's grant-sealing keys.",
                             description="The optional APNs gateway ([gateway] table).")
    from appliance.commands import gateway as gateway_cli

    gateway_cli.add_parser(gateway, _add_setting_flags)

    admin = sub.add_parser("admin", help="The admin dashboard: reset the password, fetch its assets.",
                           description="Manage the admin dashboard.")
    from appliance.admin import command as admin_cli

    admin_cli.add_parser(admin, _settings_using("public_url", "admin_listen"))

    from appliance.commands import backup as backup_cli
    from appliance.commands import doctor as doctor_cli

    backup = sub.add_parser("backup", help="Copy the database (while serving) and its key file to PATH.",
                            description="Write a consistent copy of the database while the appliance runs "
                            "(SQLite's online backup API), with the key file beside it. Keep the two together. "
                            "On PostgreSQL it writes nothing: it prints the pg_dump command to run instead, and "
                            "exits 2.")
    restore = sub.add_parser("restore", help="Replace the data with a backup (refused while serving).",
                             description="Restore a backup made by `appliance backup`: refused while an "
                             "appliance serves the data directory; the backup and its key file are checked "
                             "before anything is replaced, and the replaced files are moved aside.")
    backup_cli.add_parser(backup, restore, _add_setting_flags)
    doctor = sub.add_parser("doctor", help="Check the installation: a pass/fail list (exit 1 on a failure).",
                            description="Check the configuration, descriptors, data directory, database, "
                            "clock, key file and APNs credentials without changing anything.")
    doctor_cli.add_parser(doctor, _settings_using("public_url"))

    migrate = sub.add_parser("migrate-to-postgres", help="Copy the SQLite store into an empty PostgreSQL database.",
                             description="Copy this data directory's SQLite store into an empty PostgreSQL "
                             "database, keys included, verify the row counts per table and print them. Refused "
                             "while an appliance serves the data directory, and for a target that is not empty.")
    from appliance.commands import migrate as migrate_cli

    migrate_cli.add_parser(migrate, _add_setting_flags)

    push = sub.add_parser("push", help="Try push: test leases, test wakes, a two-minute demo.",
                          description="Push (NIP-PL) from the command line: make a test device's lease, send a "
                          "test wake, or try the whole path on a temporary data directory.")
    from appliance.commands import push as push_cli

    push_cli.add_parser(push, _settings_using("public_url"))

    emulator = sub.add_parser("emulator", help="Local stand-ins to try push with: APNs and FCM (draft) emulators.",
                              description="Local stand-ins for the services push delivers to.")
    from appliance.commands import emulator as emulator_cli

    emulator_cli.add_parser(emulator)

    from appliance.commands import sync as sync_cli

    sync_cli.add_parser(sub, _add_setting_flags)

    from appliance.commands import transfer as transfer_cli

    transfer_cli.add_parsers(sub, _add_setting_flags)
    from appliance.commands import search as search_cli

    search_cli.add_parser(sub, _add_setting_flags)

    bench = sub.add_parser("bench", help="Measure this machine: relay ingest and query speed.",
                           description="Benchmarks that start a relay on a temporary data dir.")
    from appliance import bench as bench_mod

    bench_mod.add_parser(bench)
    _add_version(parser)
    return parser


class _Version(argparse.Action):
    """`--version`: the version and the git revision, worked out only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "Print the version and the git revision it was built from, and exit.")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def _add_version(parser: argparse.ArgumentParser) -> None:
    """`--version` on every (sub)command, as `--help` is."""
    if not any("--version" in a.option_strings for a in parser._actions):
        parser.add_argument("--version", action=_Version)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _add_version(sub)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # the reader went away (`appliance config show | head -1`): not an error
        from appliance.commands.transfer import quiet_stdout

        quiet_stdout()
        return 0


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["serve", *argv]
    warn_unknown_env()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return serve(_settings(args))
        if args.command == "config":
            if args.config_command == "sample":
                sys.stdout.write(sample_config())
                return 0
            settings = _settings(args)
            from appliance.commands import read_stored_settings

            # What the dashboard saved, where the configuration leaves a setting at its default.
            settings.apply_stored(read_stored_settings(settings))
            for s in SETTINGS:
                value = settings.values[s.name]
                if s.name == "storage":
                    from appliance.store.dsn import redact

                    value = redact(value)
                print(f"{s.name} = {json.dumps(value)}    # from {settings.sources[s.name]}")
            return 0
        if args.command == "origins":
            from appliance.commands import origins as origins_cli

            return origins_cli.run(args, _settings(args))
        if args.command == "groups":
            from appliance.commands import groups as groups_cli

            return groups_cli.run(args, _settings(args))
        if args.command == "keys":
            from appliance.commands import keys as keys_cli

            return keys_cli.run(args, _settings(args))
        if args.command == "marmot":
            from appliance.commands import marmot as marmot_cli

            return marmot_cli.run(args)
        if args.command == "gateway":
            from appliance.commands import gateway as gateway_cli

            return gateway_cli.run(args, _settings(args))
        if args.command == "admin":
            from appliance.admin import command as admin_cli

            return admin_cli.run(args, _settings(args))
        if args.command == "backup":
            from appliance.commands import backup as backup_cli

            return backup_cli.run_backup(args, _settings(args))
        if args.command == "restore":
            from appliance.commands import backup as backup_cli

            return backup_cli.run_restore(args, _settings(args))
        if args.command == "doctor":
            from appliance.commands import doctor as doctor_cli

            # The doctor resolves the settings itself: a configuration error is one of its findings.
            flags = {s.name: getattr(args, s.name, None) for s in SETTINGS}
            return doctor_cli.run(args, flags, getattr(args, "config", None))
        if args.command == "migrate-to-postgres":
            from appliance.commands import migrate as migrate_cli

            return migrate_cli.run(args, _settings(args))
        if args.command == "push":
            from appliance.commands import push as push_cli

            if args.push_command == "try":  # its own temporary data directory: no settings of the operator's
                from appliance.commands import push_try

                return push_try.run(args)
            return push_cli.run(args, _settings(args))
        if args.command == "emulator":
            from appliance.commands import emulator as emulator_cli

            return emulator_cli.run(args)
        if args.command == "sync":
            from appliance.commands import sync as sync_cli

            return sync_cli.run(args, _settings(args))

        if args.command in ("export", "import", "delete"):
            from appliance.commands import transfer as transfer_cli

            run = {"export": transfer_cli.run_export, "import": transfer_cli.run_import,
                   "delete": transfer_cli.run_delete}[args.command]
            return run(args, _settings(args))
        if args.command == "search":
            from appliance.commands import search as search_cli

            return search_cli.run(args, _settings(args))
        if args.command == "bench":
            from appliance import bench as bench_mod

            return bench_mod.run(args)
    except ApplianceError as exc:
        print(f"appliance: {exc}", file=sys.stderr)
        return 2
    except PermissionError as exc:  # most often a command run without sudo on a service's files
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"appliance: {where}{exc.strerror or exc}: run this as the data directory's owner (the service's "
              "user) or as root", file=sys.stderr)
        return 2
    parser.print_help()
    return 2


# Third-party protocol libraries whose debug (and httpx's info) lines carry request paths and header
# values: APNs device tokens (`:path /3/device/<token>`), provider tokens and NIP-98 Authorization
# headers. Secrets are never logged, at any --log-level.
QUIET_LOGGERS = ("hpack", "h2", "httpcore", "httpx")


def configure_logging(level: str) -> None:
    """stdlib logging at `level`. Client addresses are the front's to leave out or keep
    (`log_client_addresses`, see appliance.front.http)."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def serve(settings: Settings, *, ready: Any = None) -> int:
    """Serve until interrupted (SIGTERM/SIGINT: pending OKs are sent and websockets closed first)."""
    from appliance.admin import install
    from appliance.app import build
    from appliance.banner import startup_banner
    from appliance.server import build_server, tune_malloc

    from appliance.store.instance import InstanceLock, clear_instance

    configure_logging(settings.log_level)
    tune_malloc()
    # Every listening address first: one taken stops the start before anything is printed, created
    # or minted (no data directory, no setup token).
    sockets = bind_listeners(settings)
    try:
        # Held until the process ends: a second server, or `appliance restore`, is refused meanwhile.
        lock = InstanceLock(settings.data_path).acquire()
        app = build(settings)
    except BaseException:
        for sock in sockets.values():
            sock.close()
        raise
    app.instance_lock = lock
    app.sockets = sockets
    try:
        install(app)
    except BaseException:
        app.relay.close()
        if app.push is not None:
            app.push.close()
        app.store.close()
        raise
    record_instance(settings, app)
    for line in startup_banner(settings, app):
        print(line, flush=True)
    try:
        if app.gateway is not None and app.gateway.config.listen:
            from appliance.server import run_with_gateway_listener

            return run_with_gateway_listener(settings, app)
        # 0 after a graceful stop (SIGTERM, SIGINT); a second signal ends the process at once.
        return build_server(settings, app).run(sockets=[sockets["relay"]])
    finally:
        clear_instance(settings.data_path)


def bind_listeners(settings: Settings) -> dict:
    """The relay's socket (and admin_listen's, gateway_listen's), bound but not listening yet;
    `settings.port` becomes the port bound (port 0: a free one). An address in use is one line
    naming it, and the appliance holding it when this data directory's instance record says so."""
    from appliance.gateway.config import gateway_config, parse_listen
    from appliance.server import ListenError, bind_listener
    from appliance.store.instance import read_instance

    wanted = [("relay", settings.host, settings.port)]
    if settings.admin_listen and settings.admin_listen != "off":
        host, _, port = settings.admin_listen.rpartition(":")
        wanted.append(("admin", host.strip("[]"), int(port)))
    gateway = gateway_config(settings)
    if gateway.enabled and gateway.listen:
        wanted.append(("gateway", *parse_listen(gateway.listen, "gateway_listen")))
    sockets: dict = {}
    for role, host, port in wanted:
        try:
            sockets[role] = bind_listener(host, port)
        except ListenError as exc:
            for sock in sockets.values():
                sock.close()
            notes = [] if role == "relay" else [f"{role}_listen"]
            running = read_instance(settings.data_path) if exc.in_use else None
            if running and any(a.rpartition(":")[2] == str(port) for key in ("listen", "admin_listen", "gateway_listen")
                               for a in _as_list(running.get(key))):
                notes.append(f"another appliance runs here, pid {running['pid']}")
            raise ApplianceError(str(exc) + (f" ({'; '.join(notes)})" if notes else "")) from None
    bound = sockets["relay"].getsockname()[1]
    if bound != settings.port:
        settings.values["port"] = settings.port = bound
    return sockets


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value] if value else []


def record_instance(settings: Settings, app: Any) -> None:
    """`<data_dir>/instance.json`: this process, where it listens and its URLs, for the commands
    run beside it (they trust it only while this process holds the data directory's lock)."""
    import time

    from appliance import __version__
    from appliance.admin import admin_base_url
    from appliance.store.instance import write_instance

    def shown(sock) -> str:
        host, port = sock.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    listen = [shown(app.sockets["relay"])]
    info = {"version": __version__, "started_at": int(time.time()), "listen": listen,
            "relay_url": settings.effective_public_url, "admin_url": admin_base_url(settings)}
    if "admin" in app.sockets:
        info["admin_listen"] = shown(app.sockets["admin"])
    if "gateway" in app.sockets:
        info["gateway_listen"] = shown(app.sockets["gateway"])
    write_instance(settings.data_path, info)
