"""`appliance marmot ...`: Marmot groups and the draft multi-device join, from files and pipes.

Every command prints exactly one JSON document on stdout. Failures print
`{"error": CODE, "message": TEXT}` (and the message on stderr) and exit with status 2. Secrets
(private keys, exporter outputs, PSKs) are never printed unless a command is asked to with
`--show-secrets`. State lives in the directory named by `--state DIR` (see marmot_state.py).

The multi-device commands are a draft (shared/spec/marmot-multi-device.md): they run only with
`--draft-multi-device` or the `marmot_draft_multi_device` setting, and every output they produce
carries a `"draft"` label.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from appliance.errors import ApplianceError, ConfigError
from appliance.marmot import components as comp
from appliance.marmot import pairing as pair
from appliance.marmot import proofs, transport
from appliance.marmot.errors import DraftDisabled, MarmotError
from appliance.marmot.extensions import EncryptedDeviceName, MultiDeviceExtension
from appliance.nostr.event import InvalidEvent, parse_event
from appliance.nostr.nip19 import Nip19Error, parse_secret
from appliance.settings import load

from .marmot_state import StateDir

DRAFT_LABEL = "marmot-multi-device draft: bytes are not final and must not be used for interop"

_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
# The fields in which commands print binary objects (inspect finds the object in any of them).
BLOB_FIELDS = ("extension_data", "proof", "envelope", "group_info", "component_data", "data")


class Failed(ApplianceError):
    """A command failure with a machine-readable code (printed as the JSON error document)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- input helpers ---------------------------------------------------------------------------------

def read_text(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise Failed("input.unreadable", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise Failed("input.unreadable", f"{path} is not UTF-8 text") from None


def load_identity(path: str | None) -> str:
    """The account's secret key (64 hex or nsec) from FILE, as 64 lowercase hex."""
    if not path:
        raise Failed("identity.missing", "this command needs --identity FILE (the account's secret key)")
    try:
        return parse_secret(read_text(path))
    except Nip19Error as exc:
        raise Failed("identity.invalid", f"{path}: {exc}") from None


def decode_blob(text: str, what: str) -> bytes:
    """Bytes written as hex or as standard base64 (whitespace around them ignored)."""
    text = text.strip()
    if _HEX.fullmatch(text):
        return bytes.fromhex(text)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Failed("input.encoding", f"{what} is neither hex nor base64") from None


def read_blob(path: str, what: str, field: str | None = None) -> bytes:
    """An object's bytes from FILE: hex, base64, or the JSON document a command printed (`field`)."""
    text = read_text(path)
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except ValueError:
            raise Failed("input.json", f"{path} is not valid JSON") from None
        fields = [field] if field else [f for f in BLOB_FIELDS if isinstance(doc, dict) and f in doc]
        if not fields or not isinstance(doc, dict) or not isinstance(doc.get(fields[0]), str):
            raise Failed("input.json", f"{path}: expected a JSON document with a {field or BLOB_FIELDS[0]!r} field")
        return decode_blob(doc[fields[0]], what)
    return decode_blob(stripped, what)


def read_json(path: str, what: str) -> Any:
    try:
        return json.loads(read_text(path))
    except ValueError:
        raise Failed("input.json", f"{path}: {what} is not valid JSON") from None


def read_event(path: str, what: str = "event"):
    try:
        return parse_event(read_json(path, what))
    except InvalidEvent as exc:
        raise Failed("input.event", f"{path}: {what}: {exc.reason}") from None


# -- output --------------------------------------------------------------------------------------

def emit(doc: dict[str, Any], draft: bool = False) -> int:
    if draft:
        doc = {"draft": DRAFT_LABEL, **doc}
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return 0


# -- the commands ----------------------------------------------------------------------------------

COMMANDS: dict[str, tuple[Callable, bool]] = {}  # name -> (handler, is a draft command)


def command(name: str, draft: bool = False):
    def register(fn):
        COMMANDS[name] = (fn, draft)
        return fn
    return register


@command("pairing-key", draft=True)
def cmd_pairing_key(args, state: StateDir) -> int:
    """New device: a fresh X25519 pairing key; its public half goes to the existing device."""
    key = pair.PairingKey.generate()
    expires = key.created_at + pair.MAX_PAIRING_VALIDITY + pair.CLOCK_SKEW
    state.write("pairing/keys", key.public.hex(),
                {"private": key.private.hex(), "created_at": key.created_at, "expires_at": expires})
    return emit({"pairing_key": key.public.hex(), "expires_at": expires}, draft=True)


@command("encrypt-device-label", draft=True)
def cmd_encrypt_label(args, state) -> int:
    secret = load_identity(args.identity)
    if args.label is None:
        raise Failed("usage", "encrypt-device-label needs --label TEXT")
    ext = EncryptedDeviceName.seal(secret, args.label)
    return emit({"extension_type": "0xf2ef", "name": "marmot.encrypted-device-name.v1",
                 "extension_data": ext.encode().hex()}, draft=True)


@command("decrypt-device-label", draft=True)
def cmd_decrypt_label(args, state) -> int:
    secret = load_identity(args.identity)
    if not args.input:
        raise Failed("usage", "decrypt-device-label needs --input FILE (the extension data)")
    ext = EncryptedDeviceName.decode(read_blob(args.input, "device label", "extension_data"))
    return emit({"label": ext.open(secret)}, draft=True)


def inspect_bytes(kind: str, data: bytes) -> dict[str, Any]:
    """Readable JSON for one Marmot-owned binary object."""
    if kind == "proof":
        return {"type": "MarmotAuthorizationProof", **proofs.MarmotAuthorizationProof.decode(data).to_json()}
    if kind == "pairing-envelope":
        return {"type": "MarmotPairingEnvelopeV1", **pair.peek_envelope(data)}
    if kind == "admin-policy":
        return {"type": "component", **comp.AdminPolicy.decode(data).to_json()}
    if kind == "nostr-routing":
        return {"type": "component", **comp.NostrRouting.decode(data).to_json()}
    if kind == "multi-device-extension":
        return {"type": "extension", **MultiDeviceExtension.decode(data).to_json()}
    if kind == "device-label":
        return {"type": "extension", **EncryptedDeviceName.decode(data).to_json()}
    raise Failed("usage", f"cannot inspect {kind!r}")


def inspect_event(obj: Any) -> dict[str, Any]:
    """Readable JSON for a Marmot transport event or rumor (what can be seen without secrets)."""
    if not isinstance(obj, dict):
        raise Failed("input.json", "expected a JSON object")
    kind = obj.get("kind")
    if kind == transport.WELCOME_RUMOR_KIND:
        w = transport.parse_welcome_rumor(obj)
        return {"type": "welcome-rumor", "kind": 444, "sender": w.sender, "key_package_event": w.key_package_event_id,
                "relays": w.relays, "welcome_bytes": len(w.welcome)}
    try:
        ev = parse_event(obj)
    except InvalidEvent as exc:
        raise Failed("input.event", exc.reason) from None
    if ev.kind == transport.GROUP_MESSAGE_KIND:
        h = transport.check_group_message(ev)
        return {"type": "group-message", "kind": 445, "h": h, "one_time_pubkey": ev.pubkey,
                "ciphertext_bytes": len(base64.b64decode(ev.content)) - transport.NONCE_LEN}
    if ev.kind in (transport.KEY_PACKAGE_KIND, transport.LEGACY_KEY_PACKAGE_KIND):
        kp = transport.parse_key_package_event(ev)
        return {"type": "key-package-event", "kind": ev.kind, "author": ev.pubkey, "d": kp.d, "ref": kp.ref,
                "ciphersuite": kp.ciphersuite, "relays": kp.relays, "key_package_bytes": len(kp.key_package)}
    if ev.kind == transport.KEY_PACKAGE_RELAYS_KIND:
        return {"type": "key-package-relays", "kind": ev.kind, "author": ev.pubkey,
                "relays": transport.parse_key_package_relays(ev)}
    if ev.kind == 1059:
        return {"type": "gift-wrap", "kind": 1059, "recipients": [t[1] for t in ev.tags if t[0] == "p" and len(t) > 1],
                "one_time_pubkey": ev.pubkey}
    raise Failed("input.event", f"kind {ev.kind} is not a Marmot transport event")


@command("inspect")
def cmd_inspect(args, state) -> int:
    if not args.input:
        raise Failed("usage", "inspect needs --input FILE (or - for stdin)")
    if args.as_type:
        return emit(inspect_bytes(args.as_type, read_blob(args.input, args.as_type)))
    text = read_text(args.input).strip()
    if text.startswith("{"):
        return emit(inspect_event(read_json(args.input, "object") if args.input != "-" else json.loads(text)))
    data = decode_blob(text, "input")
    # Without --as, recognise what can be recognised by shape alone.
    if len(data) == proofs.PROOF_LEN:
        return emit(inspect_bytes("proof", data))
    if data[:2] == b"\x00\x01" and len(data) >= 2 + 32 + 32 + 12 + 17:
        try:
            return emit(inspect_bytes("pairing-envelope", data))
        except MarmotError:
            pass
    raise Failed("usage", "cannot tell what this is; name it with --as")


# -- argument parsing and dispatch -----------------------------------------------------------------

INSPECT_TYPES = ("proof", "pairing-envelope", "admin-policy", "nostr-routing", "multi-device-extension",
                 "device-label")


def add_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="marmot_command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser, state: bool = True, identity: bool = True) -> None:
        if state:
            p.add_argument("--state", metavar="DIR", required=True, help="This device's Marmot state directory.")
        if identity:
            p.add_argument("--identity", metavar="FILE",
                           help="File holding the account's secret key (64 hex or nsec).")
        p.add_argument("--draft-multi-device", action="store_true",
                       help="Allow the draft multi-device commands for this run (setting marmot_draft_multi_device).")
        p.add_argument("--config", metavar="FILE", help="TOML config file (also APPLIANCE_CONFIG).")
        p.add_argument("--show-secrets", action="store_true", help="Also print secret values.")

    p = sub.add_parser("pairing-key", help="[draft] New device: make a fresh X25519 pairing key.")
    common(p, identity=False)
    p = sub.add_parser("encrypt-device-label", help="[draft] Encrypt a device label to the account's own key.")
    common(p, state=False)
    p.add_argument("--label", metavar="TEXT")
    p = sub.add_parser("decrypt-device-label", help="[draft] Decrypt a device label extension.")
    common(p, state=False)
    p.add_argument("--input", metavar="FILE")
    p = sub.add_parser("inspect", help="Show a Marmot object (event, rumor, proof, envelope, component) as JSON.")
    common(p, state=False, identity=False)
    p.add_argument("--input", metavar="FILE", help="The object: a JSON event/rumor, or hex/base64 bytes; - reads stdin.")
    p.add_argument("--as", dest="as_type", choices=INSPECT_TYPES, help="What the bytes are.")


def run(args: argparse.Namespace) -> int:
    handler, draft = COMMANDS[args.marmot_command]
    try:
        settings = load(flags={"marmot_draft_multi_device": True if args.draft_multi_device else None},
                        config_path=args.config)
        if draft and not settings.marmot_draft_multi_device:
            raise DraftDisabled(f"`{args.marmot_command}` is part of the draft multi-device join: pass "
                                "--draft-multi-device or set marmot_draft_multi_device = true")
        state = StateDir(args.state) if getattr(args, "state", None) else None
        if state is not None:
            state.purge_expired()
        return handler(args, state)
    except Failed as exc:
        return _fail(exc.code, exc.message)
    except MarmotError as exc:
        return _fail(exc.code, exc.reason)
    except ConfigError as exc:
        return _fail("config", str(exc))


def _fail(code: str, message: str) -> int:
    sys.stdout.write(json.dumps({"error": code, "message": message}) + "\n")
    print(f"appliance marmot: {message}", file=sys.stderr)
    return 2

