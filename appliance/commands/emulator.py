"""`appliance emulator apns|fcm [--listen HOST:PORT] [--dir DIR]`: a local APNs or FCM (draft) to
point a profile at.

It runs the HTTP/2 + TLS APNs emulator (`appliance.testing.apns_emulator`, the one the tests and
benchmarks use), trusting one .p8 signing key it generates in DIR. It prints the app profile
settings that point a profile at it (`apns_url`, `ca_file`, `team_id`, `key_id`, `key_file`,
`environment`), each on a line of its own, then one line per request it answers. With the same DIR
again, the key, the team and key ids and the certificate are reused, so a profile keeps working
across restarts. Without DIR the files live in a temporary directory removed at exit.

`appliance emulator fcm` runs the FCM emulator (`appliance.testing.fcm_emulator`: Google's token
endpoint and FCM HTTP v1 messages:send) and writes a service account key file it trusts into DIR;
it prints the settings of an fcm profile (`service_account_file`, `token_uri`, `fcm_url`,
`ca_file`). fcm is a draft transport: the appliance needs `push_draft_transports = true` too.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import hashlib
import json
import secrets
import shutil
import signal
import string
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import ApplianceError, ConfigError

# A port of Apple's own (APNs also listens on 2197), so a profile pointed here is easy to spot;
# the same address every run keeps a pasted profile working across restarts.
DEFAULT_LISTEN = "127.0.0.1:2197"
# FCM's emulator: one port for the token endpoint and messages:send.
FCM_LISTEN = "127.0.0.1:2198"
SERVICE_ACCOUNT_FILE = "service-account.json"
STATE_FILE = "emulator.json"
_ID_ALPHABET = string.ascii_uppercase + string.digits


class EmulatorError(ApplianceError):
    """The emulator cannot start (its address is taken, its directory unusable)."""


def add_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="emulator_command", metavar="WHAT", required=True)
    apns = sub.add_parser(
        "apns", help="A local APNs (HTTP/2 over TLS) to point an app profile at.",
        description="Run a local APNs provider API (HTTP/2 over TLS) that answers as Apple documents it. "
        "Prints the app profile settings that point a profile at it, then one line per request it "
        "answers. Stop it with Ctrl-C.")
    apns.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                      help=f"Address to listen on (default {DEFAULT_LISTEN}; port 0 picks a free one).")
    apns.add_argument("--dir", metavar="DIR",
                      help="Directory for its .p8 key, CA and certificate, kept and reused on the next run "
                      "(default: a temporary directory removed at exit).")
    apns.add_argument("--environment", default="production", choices=("production", "sandbox"),
                      help="The APNs environment it plays (default production).")
    fcm = sub.add_parser(
        "fcm", help="A local FCM HTTP v1 and OAuth token endpoint (HTTP/2 over TLS) for a draft fcm profile.",
        description="Run a local FCM HTTP v1 API with Google's OAuth2 token endpoint (HTTP/2 over TLS), "
        "answering as Google documents them. Writes a service account key file it trusts, prints the "
        "fcm app profile settings that point a profile at it, then one line per request. fcm is a "
        "DRAFT transport: set push_draft_transports = true in the appliance. Stop it with Ctrl-C.")
    fcm.add_argument("--listen", default=FCM_LISTEN, metavar="HOST:PORT",
                     help=f"Address to listen on (default {FCM_LISTEN}; port 0 picks a free one).")
    fcm.add_argument("--dir", metavar="DIR",
                     help="Directory for its service account key file, CA and certificate, kept and reused on "
                     "the next run (default: a temporary directory removed at exit).")
    fcm.add_argument("--project", default="appliance-emulator", metavar="PROJECT_ID",
                     help="The Firebase project id of its service account (default appliance-emulator).")


def parse_listen(text: str, name: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(name, text, "expected HOST:PORT, such as 127.0.0.1:2197")
    return host, int(port)


def token_fingerprint(token: str | None) -> str:
    """How a device token is named in the emulator's lines (never the token itself)."""
    if not token:
        return "-"
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def request_line(record) -> str:
    """One answered request: apns-id, topic, push type, priority, token fingerprint, body size, status."""
    stamp = time.strftime("%H:%M:%S", time.localtime(record.at))
    line = (f"{stamp} apns-id={record.apns_id or '-'} topic={record.header('apns-topic') or '-'} "
            f"push-type={record.header('apns-push-type') or '-'} priority={record.header('apns-priority') or '-'} "
            f"token={token_fingerprint(record.token)} body={len(record.body)} bytes status={record.status}")
    if record.reason:
        line += f" reason={record.reason}"
    return line


@dataclass
class Identity:
    """What a profile needs to sign provider tokens the emulator trusts."""

    team_id: str
    key_id: str
    key_file: Path


def _new_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(10))


def load_identity(directory: Path):
    """The signing key in `directory` (made on first use) and its public key."""
    from cryptography.hazmat.primitives import serialization

    from appliance.testing.tls import make_p8

    state_path = directory / STATE_FILE
    try:
        state = json.loads(state_path.read_text())
        ident = Identity(str(state["team_id"]), str(state["key_id"]), directory / str(state["key_file"]))
        key = serialization.load_pem_private_key(ident.key_file.read_bytes(), None)
        return ident, key.public_key()
    except (OSError, ValueError, KeyError, TypeError):
        pass
    team_id, key_id = _new_id(), _new_id()
    ident = Identity(team_id, key_id, directory / f"AuthKey_{key_id}.p8")
    key = make_p8(ident.key_file)
    state_path.write_text(json.dumps({"team_id": team_id, "key_id": key_id, "key_file": ident.key_file.name}) + "\n")
    return ident, key.public_key()


def profile_lines(url: str, ca_file: str, ident: Identity, environment: str) -> list[str]:
    """The app profile settings that point a profile at the emulator, one per line (TOML)."""
    values = {"apns_url": url, "ca_file": ca_file, "team_id": ident.team_id, "key_id": ident.key_id,
              "key_file": str(ident.key_file), "environment": environment}
    return [f"{k} = {json.dumps(v)}" for k, v in values.items()]


class Emulator:
    """The emulator with its key and certificate in a directory: `start()` on a running loop."""

    def __init__(self, directory: Path, environment: str = "production"):
        from appliance.testing.apns_emulator import ApnsEmulator

        self.directory = directory
        self.environment = environment
        self.api = ApnsEmulator(environment=environment, pki_dir=directory)
        self.api.keep_records = False  # a long run would hold every request in memory
        self.ident: Identity | None = None

    async def start(self, host: str, port: int) -> "Emulator":
        from appliance.testing.tls import existing_pki

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.directory.chmod(0o700)
            self.ident, public = load_identity(self.directory)
        except OSError as exc:
            raise EmulatorError(f"cannot use the directory {self.directory}: {exc.strerror or exc}") from None
        self.api.add_key(self.ident.team_id, self.ident.key_id, public)
        hosts = ("localhost", "127.0.0.1")
        if host not in hosts + ("0.0.0.0", "::", ""):
            hosts += (host,)
        self.api.tls_hosts = hosts
        self.api.pki = existing_pki(self.directory, hosts)
        try:
            await self.api.start(host, port)
        except OSError as exc:
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
            raise EmulatorError(f"cannot listen on {shown}: {why}") from None
        shown_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else (f"[{host}]" if ":" in host else host)
        self.url = f"https://{shown_host}:{self.api.port}"
        return self

    @property
    def ca_file(self) -> str:
        return self.api.ca_file

    def lines(self) -> list[str]:
        return profile_lines(self.url, self.ca_file, self.ident, self.environment)

    async def stop(self) -> None:
        await self.api.stop()


def run(args: argparse.Namespace) -> int:
    if args.emulator_command == "fcm":
        return run_fcm(args)
    host, port = parse_listen(args.listen)
    temporary = args.dir is None
    directory = Path(tempfile.mkdtemp(prefix="appliance-apns-")) if temporary else Path(args.dir).resolve()

    async def serve() -> None:
        emu = await Emulator(directory, args.environment).start(host, port)
        print(f"APNs emulator ({args.environment}) listening on {emu.url}; files in {directory}", flush=True)
        print("Point an app profile at it with these settings (and any topic):", flush=True)
        for line in emu.lines():
            print(line, flush=True)
        print("Requests, one line each (Ctrl-C stops):", flush=True)
        emu.api.on_record = lambda record: print(request_line(record), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await emu.stop()

    try:
        asyncio.run(serve())
    finally:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
    print("APNs emulator stopped", file=sys.stderr, flush=True)
    return 0


def fcm_request_line(record) -> str:
    """One answered FCM request: a grant, or a send with its token fingerprint, body size and status."""
    stamp = time.strftime("%H:%M:%S", time.localtime(record.at))
    if record.grant:
        return f"{stamp} grant status={record.status}" + (f" error={record.reason}" if record.reason else "")
    line = f"{stamp} send {record.path} token={token_fingerprint(record.token)} body={len(record.body)} bytes " \
           f"status={record.status}"
    return line + (f" error={record.reason}" if record.reason else "")


def load_service_account(directory: Path, project: str):
    """The RSA key of the service account kept in `directory` (None on first use)."""
    from cryptography.hazmat.primitives import serialization

    try:
        doc = json.loads((directory / SERVICE_ACCOUNT_FILE).read_text())
        if doc.get("project_id") != project:
            return None
        key = serialization.load_pem_private_key(doc["private_key"].encode(), None)
        return key, doc["private_key_id"], doc["client_email"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class FcmEmulatorRun:
    """The FCM emulator with its service account and certificate in a directory."""

    def __init__(self, directory: Path, project: str = "appliance-emulator"):
        from appliance.testing.fcm_emulator import FcmEmulator

        self.directory = directory
        self.project = project
        self.api = FcmEmulator(pki_dir=directory)
        self.api.keep_records = False
        self.sa_file = directory / SERVICE_ACCOUNT_FILE

    async def start(self, host: str, port: int) -> "FcmEmulatorRun":
        from appliance.testing.tls import existing_pki

        hosts = ("localhost", "127.0.0.1")
        if host not in hosts + ("0.0.0.0", "::", ""):
            hosts += (host,)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.directory.chmod(0o700)
            kept = load_service_account(self.directory, self.project)
        except OSError as exc:
            raise EmulatorError(f"cannot use the directory {self.directory}: {exc.strerror or exc}") from None
        self.api.tls_hosts = hosts
        self.api.pki = existing_pki(self.directory, hosts)
        try:
            await self.api.start(host, port)
        except OSError as exc:
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
            raise EmulatorError(f"cannot listen on {shown}: {why}") from None
        self.api.host_shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else (f"[{host}]" if ":" in host else host)
        # Written (again) once listening: the key file names the token endpoint, port included.
        opts = {} if kept is None else {"key": kept[0], "private_key_id": kept[1], "client_email": kept[2]}
        account = self.api.service_account(self.project, **opts)
        self.sa_file.write_text(json.dumps(account, indent=2) + "\n")
        self.sa_file.chmod(0o600)
        return self

    def lines(self) -> list[str]:
        values = {"service_account_file": str(self.sa_file), "token_uri": self.api.token_url,
                  "fcm_url": self.api.url, "ca_file": self.api.ca_file}
        return [f"{k} = {json.dumps(v)}" for k, v in values.items()]

    async def stop(self) -> None:
        await self.api.stop()


def run_fcm(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen)
    temporary = args.dir is None
    directory = Path(tempfile.mkdtemp(prefix="appliance-fcm-")) if temporary else Path(args.dir).resolve()

    async def serve() -> None:
        emu = await FcmEmulatorRun(directory, args.project).start(host, port)
        print(f"FCM emulator (draft transport; project {args.project}) listening on {emu.api.url}; files in "
              f"{directory}", flush=True)
        print('Point an app profile { id = "...", transport = "fcm", ... } at it with these settings '
              "(and push_draft_transports = true):", flush=True)
        for line in emu.lines():
            print(line, flush=True)
        print("Requests, one line each (Ctrl-C stops):", flush=True)
        emu.api.on_record = lambda record: print(fcm_request_line(record), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await emu.stop()

    try:
        asyncio.run(serve())
    finally:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
    print("FCM emulator stopped", file=sys.stderr, flush=True)
    return 0
