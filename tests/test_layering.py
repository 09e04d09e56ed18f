"""Dependencies point one way: cli -> admin -> commands -> app -> relay | push | gateway -> transports | origins -> store -> nostr.

`app` composes what sits beside it below: `endpoints` (and its `landing` page), `origin_config` and
`upkeep` (the reload and purge loops); `banner` reads what `app` built.

Peers never import each other (the relay and the push executor meet only in `app.py`); the pure
protocol package imports nothing else of ours. The rule is import-linter's contracts in
pyproject.toml ([tool.importlinter]): a layers contract for the picture (every top-level part must
be placed in it) and, for each part, a protected contract naming the only parts that may import it.
`lint-imports` checks them here, so `make test` fails on an import that breaks the rule. What the
contracts cannot say (no SQL outside the store) is checked below by reading the source.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "appliance"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter over the `appliance` package under `root`, with `root`'s pyproject.toml."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}  # its report: unwrapped, no colour codes
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")], cwd=root,
                          capture_output=True, text=True, timeout=120, env=env)


def test_the_layering_contracts_hold():
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout, out.stdout


def test_the_contracts_catch_a_forbidden_import_and_an_unplaced_part(tmp_path):
    """On a copy of the package: the store importing the dashboard, the relay importing the push
    executor's peer (the gateway), and a new top-level part nobody placed each break a contract."""
    shutil.copytree(PACKAGE, tmp_path / "appliance", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "appliance" / "store" / "leases.py", "a") as f:
        f.write("\nfrom appliance.admin import web  # noqa\n")
    with open(tmp_path / "appliance" / "relay" / "nip11.py", "a") as f:
        f.write("\nimport appliance.gateway  # noqa\n")
    (tmp_path / "appliance" / "newpart.py").write_text("")
    out = lint_imports(tmp_path)
    assert out.returncode != 0
    assert "appliance.store.leases -> appliance.admin.web" in out.stdout, out.stdout
    assert "appliance.relay.nip11 -> appliance.gateway" in out.stdout, out.stdout
    assert "appliance.newpart" in out.stdout, out.stdout
    # The layers (an import upwards, a part not placed), who may import the dashboard, the gateway.
    assert "3 broken" in out.stdout, out.stdout


def part_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


MODULES = sorted(PACKAGE.rglob("*.py"))


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


# Each database driver is imported by its backend's module only (the other PostgreSQL modules take
# psycopg from postgres.py): everything else reaches a database through appliance.store.interface.
DRIVERS = {
    "apsw": {"store/sqlite.py"},
    "sqlite3": set(),
    "psycopg": {"store/postgres.py"},
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
