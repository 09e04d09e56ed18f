"""The appliance stands on other libraries' public APIs only: no import of a private module or name
(uvicorn's protocol classes, hpack's tables and Huffman internals), no reaching into another
library's objects through `__self__`, no checks of class names. A routine upgrade of a dependency
must not break the relay through an internal it relied on."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "appliance").rglob("*.py"), *(ROOT / "tests").rglob("*.py")])

# Modules that are another library's internals although their names have no underscore.
PRIVATE_MODULES = ("uvicorn.protocols", "uvicorn.lifespan", "uvicorn.loops", "uvicorn.middleware", "hpack.huffman",
                   "hpack.huffman_constants", "hpack.huffman_table", "hpack.table", "hpack.hpack", "h11._",
                   "starlette._", "websockets.legacy")
PRIVATE_NAMES = {"HeaderTable", "HuffmanEncoder", "HttpToolsProtocol", "WebSocketsSansIOProtocol", "H11Protocol"}
THIRD_PARTY = ("uvicorn", "starlette", "websockets", "hpack", "h11", "h2", "httpx", "httpcore", "anyio")


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.lineno, node.module, alias.name


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_imports_or_class_name_checks(path):
    text = path.read_text()
    tree = ast.parse(text)
    found = []
    for line, module, name in _imports(tree):
        if not module.startswith(THIRD_PARTY):
            continue
        parts = module.split(".")
        if any(p.startswith("_") for p in parts) or module.startswith(PRIVATE_MODULES):
            found.append(f"{line}: {module}")
        if name is not None and (name.startswith("_") or name in PRIVATE_NAMES):
            found.append(f"{line}: {module}.{name}")
    if path.is_relative_to(ROOT / "appliance"):
        for node in ast.walk(tree):
            # Reaching the server's protocol object through a bound method, or telling classes apart
            # by their names: both break silently when the other library changes.
            if isinstance(node, ast.Attribute) and node.attr in ("__self__", "__mro__"):
                found.append(f"{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Compare) and any(isinstance(side, ast.Attribute) and side.attr == "__name__"
                                                     for side in (node.left, *node.comparators)):
                found.append(f"{node.lineno}: a class name compared")
    assert not found, found


def test_the_server_runs_without_uvicorn():
    """The relay's server, the dashboard's own listener and the gateway's are the appliance's own
    front: serving imports no uvicorn at all."""
    code = ("import sys\n"
            "import appliance.cli, appliance.server, appliance.app, appliance.admin, appliance.admin.web\n"
            "import appliance.front, appliance.gateway.http\n"
            "print(sorted(m for m in sys.modules if m == 'uvicorn' or m.startswith('uvicorn.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


# websockets' sans-I/O ServerProtocol as its reference documents it (websockets.server.ServerProtocol
# and the Protocol methods it inherits). Its other attributes (`extensions`, `parser_exc`, `reader`,
# ...) are implementation details, free to change in any release.
DOCUMENTED_SERVER_PROTOCOL = {
    "accept", "select_subprotocol", "reject", "send_response", "receive_data", "receive_eof",
    "send_continuation", "send_text", "send_binary", "send_close", "send_ping", "send_pong", "fail",
    "events_received", "data_to_send", "close_expected", "id", "logger", "state", "handshake_exc",
    "close_code", "close_reason", "close_exc",
}
# Where the front holds a ServerProtocol: module -> the names (and `self.` attributes) it is bound to.
PROTOCOL_HOLDERS = {"appliance/front/websocket.py": ("conn", "self.conn"),
                    "appliance/front/http.py": ("protocol", "self._protocol")}


@pytest.mark.parametrize("module", sorted(PROTOCOL_HOLDERS))
def test_the_front_uses_only_the_documented_protocol_api(module):
    """The websocket front reads nothing of websockets' protocol object but what its reference
    documents (before: `conn.extensions` to tell whether permessage-deflate was on, and
    `conn.parser_exc` to tell a failed connection)."""
    holders = PROTOCOL_HOLDERS[module]
    tree = ast.parse((ROOT / module).read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            name = (value.id if isinstance(value, ast.Name)
                    else f"self.{value.attr}" if isinstance(value, ast.Attribute)
                    and isinstance(value.value, ast.Name) and value.value.id == "self" else None)
            if name in holders:
                used.add((node.lineno, node.attr))
    assert used, "no use of the protocol found: PROTOCOL_HOLDERS is stale"
    assert not [(line, attr) for line, attr in used if attr not in DOCUMENTED_SERVER_PROTOCOL], sorted(used)
