"""`appliance emulator apns [--listen HOST:PORT] [--dir DIR]`: a local APNs to point a profile at.

It runs the HTTP/2 + TLS APNs emulator (`appliance.testing.apns_emulator`, the one the tests and
benchmarks use), trusting one .p8 signing key it generates in DIR. It prints the app profile
settings that point a profile at it (`apns_url`, `ca_file`, `team_id`, `key_id`, `key_file`,
`environment`), each on a line of its own, then one line per request it answers. With the same DIR
again, the key, the team and key ids and the certificate are reused, so a profile keeps working
across restarts. Without DIR the files live in a temporary directory removed at exit.
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
