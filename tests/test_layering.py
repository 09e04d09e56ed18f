"""Dependencies point one way: cli -> admin -> commands -> app -> relay | push | gateway -> transports | origins -> store -> nostr.

`app` composes what sits beside it below: `endpoints` (and its `landing` page) and `origin_config`;
`banner` reads what `app` built.

Peers never import each other (the relay and the push executor meet only in `app.py`); the pure
protocol package imports nothing else of ours. A new import that breaks this fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "appliance"

# Which of our top-level parts each part may import (besides itself).
ALLOWED = {
    "nostr": set(),
    "errors": set(),
    "settings": {"errors"},
    "store": {"nostr", "errors"},
    "marmot": {"nostr", "errors"},
    "origins": {"errors", "store"},
    # The HTTP/1.1 and websocket front: asyncio protocols on public APIs, nothing else of ours.
    "front": set(),
    "relay": {"nostr", "errors", "store", "origins", "settings", "front", "__init__"},
    "transports": {"errors", "nostr"},
    "push": {"nostr", "errors", "store", "origins", "settings", "transports"},
    "gateway": {"nostr", "errors", "store", "transports"},
    "testing": {"nostr", "errors", "gateway", "transports"},
    # The composition root and what it composes: the configured origins, the relay's endpoints and
    # landing page; the start banner reads what it built.
    "origin_config": {"errors", "store", "origins", "settings", "push"},
    "landing": {"origins", "__init__"},
    "endpoints": {"origins", "settings", "relay", "landing", "front"},
    "app": {"nostr", "errors", "store", "origins", "settings", "relay", "push", "gateway", "transports", "front",
            "origin_config", "endpoints", "__init__"},
    "banner": {"settings", "relay", "app", "__init__"},
    "server": {"nostr", "errors", "store", "origins", "settings", "relay", "app", "endpoints", "gateway", "front",
               "__init__"},
    # `appliance emulator apns` and `appliance push try` run the APNs emulator of `testing`.
    "commands": {"nostr", "errors", "store", "origins", "settings", "relay", "push", "gateway", "app", "marmot",
                 "transports", "testing", "origin_config"},
    "bench": {"nostr", "errors", "store", "origins", "settings", "relay", "push", "app", "gateway", "testing",
              "marmot", "transports", "origin_config"},
    # The dashboard drives the appliance through the same functions as the CLI (`commands`).
    "admin": {"nostr", "errors", "store", "origins", "settings", "relay", "push", "gateway", "transports", "app", "front",
              "commands",
              "__init__"},
    "cli": {"nostr", "errors", "store", "origins", "settings", "relay", "push", "gateway", "app", "banner", "server",
            "commands", "admin", "bench", "__init__"},
    "__main__": {"cli"},
    "__init__": set(),
}


def part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_parts(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    parts: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != "appliance":
                names = [node.module]
            else:  # `from appliance import x`: a submodule, or a name of the package root
                names = [f"appliance.{a.name}" if (PACKAGE / a.name).exists() or (PACKAGE / f"{a.name}.py").exists()
                         else "appliance" for a in node.names]
        for name in names:
            bits = name.split(".")
            if bits[0] == "appliance":
                parts.add(bits[1] if len(bits) > 1 else "__init__")
    return parts


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_nothing_below_the_dashboard_imports_it():
    """Only the CLI wires the dashboard in: no other part may know it exists."""
    for path in MODULES:
        part = part_of(path)
        if part not in ("admin", "cli"):
            assert "admin" not in imported_parts(path), f"{path.relative_to(PACKAGE)} imports the dashboard"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_respects_layers(path):
    part = part_of(path)
    assert part in ALLOWED, f"new top-level part {part!r}: add it to ALLOWED with its permitted imports"
    illegal = imported_parts(path) - ALLOWED[part] - {part}
    assert not illegal, f"{path.relative_to(PACKAGE)} ({part}) imports {sorted(illegal)}"


# SQL lives behind the store interface (appliance/store/), so each backend has one place to answer
# for: no statement outside it, not even a tool's that reads a database file.
SQL_START = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|REPLACE|WITH|DROP|ALTER|BEGIN|COMMIT|"
                       r"SAVEPOINT|RELEASE|ROLLBACK)\s")


def sql_literals(path: Path) -> list[tuple[int, str]]:
    return [(node.lineno, node.value[:60]) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_START.match(node.value)]


def test_sql_stays_in_the_store():
    outside = [(str(p.relative_to(PACKAGE)), *hit) for p in MODULES if part_of(p) != "store" for hit in sql_literals(p)]
    assert outside == []


def test_the_sql_check_sees_sql(tmp_path):
    """The check above would catch a statement written outside the store."""
    assert sql_literals(PACKAGE / "store" / "leases.py")
    stray = tmp_path / "stray.py"
    stray.write_text('rows = conn.execute("SELECT id FROM events WHERE kind = ?", (1,))\n')
    assert sql_literals(stray) == [(1, "SELECT id FROM events WHERE kind = ?")]


# Each database driver is imported by its backend's module only (and by backend.py, which picks
# one and names their errors; the other PostgreSQL modules take psycopg from postgres.py): everything else reaches a database through appliance.store.interface.
DRIVERS = {
    "apsw": {"store/sqlite.py", "store/backend.py"},
    "sqlite3": set(),
    "psycopg": {"store/postgres.py", "store/backend.py"},
    "psycopg_pool": {"store/postgres.py"},
}


def drivers_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & set(DRIVERS)


def test_drivers_stay_in_their_backends():
    stray = [(str(p.relative_to(PACKAGE)), d) for p in MODULES for d in sorted(drivers_imported(p))
             if str(p.relative_to(PACKAGE)) not in DRIVERS[d]]
    assert stray == []


def test_the_driver_check_sees_imports(tmp_path):
    stray = tmp_path / "stray.py"
    stray.write_text("def f():\n    import apsw\n    from psycopg import sql\n    import sqlite3 as lite\n")
    assert drivers_imported(stray) == {"apsw", "psycopg", "sqlite3"}


# Outside the store, code is typed against appliance.store.interface; a backend's store class is
# named only where that backend is made on purpose (a SQLite-only command or bench).
MAKES_A_BACKEND = {"commands/migrate.py", "bench/wakes.py"}


def test_callers_are_typed_against_the_store_interface():
    named = []
    for path in MODULES:
        rel = str(path.relative_to(PACKAGE))
        if part_of(path) == "store" or rel in MAKES_A_BACKEND:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("appliance.store.sqlite", "appliance.store.postgres"):
                named += [(rel, a.name) for a in node.names if a.name in ("SqliteStore", "PostgresStore", "PgConnection")]
    assert named == []
