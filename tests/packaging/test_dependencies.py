"""Installs are pinned and complete: uv.lock holds every package at one version with its hashes,
every distribution the code imports is declared in pyproject.toml (the runtime code's among the
runtime dependencies), serving installs no test or build tool, and the licence file is the one
pyproject.toml names.

uv.lock is read with tomllib; what `make run` installs is asked of uv itself (`uv export`, the
resolution `uv sync` installs, offline), with the uv the Makefile installed from the lock.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# Tools of the suite and of the build, which serving must not install.
NOT_FOR_SERVING = {"pytest", "pytest-timeout", "hypothesis", "playwright", "pyinstaller", "nostr-sdk", "uv",
                   "import-linter", "grimp"}
# Imported but installed by something other than the lock, with the reason.
NOT_LOCKED = {
    "mdk": "mdk-python: ../shared/tools/install-mdk-python.sh installs it (its library needs patching on "
           "Debian 12's glibc); the MDK tests skip without it",
}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def _lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text())


def _declared(*extras: str) -> set[str]:
    """The distributions the dependencies and `extras` name (an extra may name another of ours:
    `appliance[postgresql]`)."""
    names = {_name(r) for r in PROJECT["dependencies"]}
    for extra in extras:
        for r in PROJECT["optional-dependencies"][extra]:
            if _name(r) == PROJECT["name"]:
                names |= _declared(*re.search(r"\[(.*)\]", r).group(1).replace(" ", "").split(","))
            else:
                names.add(_name(r))
    return names


def _postgresql_driver() -> set[str]:
    """The PostgreSQL store's driver: an extra (`pip install 'appliance[postgresql]'`), imported by
    appliance/store/postgres.py (which says which extra is missing) and store/backend.py only."""
    return {_name(r) for r in PROJECT["optional-dependencies"]["postgresql"]}


def _imported_modules(*folders: str) -> dict[str, set[str]]:
    """Top-level modules imported anywhere under `folders` (not the standard library's, not ours),
    each with the files importing it: import statements at any depth, `pytest.importorskip("m")`,
    and `python -m m` in subprocess argument lists."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr == "importorskip" and node.args and isinstance(node.args[0], ast.Constant)):
                    names = [node.args[0].value]
                elif isinstance(node, ast.List):  # [sys.executable, "-m", "PyInstaller", ...]
                    items = [ast.unparse(e) for e in node.elts]
                    names = [ast.literal_eval(items[i + 2]) for i in range(len(items) - 2)
                             if items[i] == "sys.executable" and items[i + 1] in ("'-m'", '"-m"')
                             and isinstance(node.elts[i + 2], ast.Constant)]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in ("appliance", "tests", "__future__"):
                        continue
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _distributions(modules: dict[str, set[str]]) -> dict[str, str]:
    """Module -> the distribution that installs it (in this environment, which `make test` synced
    with uv.lock's runtime dependencies and test extras)."""
    owners = md.packages_distributions()
    out = {}
    for module, files in modules.items():
        if module in NOT_LOCKED:
            continue
        dists = owners.get(module)
        assert dists, f"{module} (imported by {sorted(files)}) is installed by no distribution here"
        out[module] = _name(dists[0])
    return out


def _runtime_modules() -> dict[str, set[str]]:
    """What appliance/ imports, but the bench's comparison relay: `nostr_relay`, imported by
    appliance/bench/relay.py only when the bench extra is installed."""
    modules = _imported_modules("appliance")
    assert modules.pop("nostr_relay") == {"appliance/bench/relay.py"}
    assert "nostr-relay" in {_name(r) for r in PROJECT["optional-dependencies"]["bench"]}
    return modules


def test_the_runtime_code_imports_only_runtime_dependencies():
    """hpack, h2, certifi, markupsafe, uvloop...: whatever appliance/ imports is a runtime
    dependency (the bench's comparison relay is the bench extra's, the PostgreSQL driver the
    postgresql extra's)."""
    modules = _runtime_modules()
    missing = {m: d for m, d in _distributions(modules).items() if d not in _declared("postgresql")}
    assert not missing, f"imported by appliance/ but not in [project] dependencies: {missing}"
    driver = {m: files for m, files in modules.items() if _distributions({m: files})[m] in _postgresql_driver()}
    assert driver and all(files <= {"appliance/store/postgres.py", "appliance/store/backend.py"}
                          for files in driver.values()), driver


def test_the_suite_imports_only_declared_distributions():
    modules = _imported_modules("tests")
    missing = {m: d for m, d in _distributions(modules).items() if d not in _declared("test")}
    assert not missing, f"imported by tests/ but not declared (dependencies or the test extra): {missing}"


def test_the_build_imports_only_build_dependencies():
    tree = ast.parse((ROOT / "packaging" / "appliance.spec").read_text())
    tops = {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "PyInstaller" in tops and "pyinstaller" in _declared("build")


def test_the_lock_pins_every_declared_dependency_with_hashes():
    lock = _lock()
    packages = {p["name"]: p for p in lock["package"]}
    declared = _declared(*PROJECT["optional-dependencies"]) | {_name(r) for g in PYPROJECT["dependency-groups"].values() for r in g}
    assert declared <= packages.keys(), declared - packages.keys()
    for name, package in packages.items():
        if package["source"].get("editable") == ".":
            continue  # the project itself
        assert package["source"].get("registry") == "https://pypi.org/simple", (name, package["source"])
        files = package.get("wheels", []) + ([package["sdist"]] if "sdist" in package else [])
        assert files, f"{name}: no file locked"
        for f in files:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", f.get("hash", "")), (name, f)


def _uv() -> str:
    for candidate in (Path(sys.executable).with_name("uv"), ROOT / ".venv" / "bin" / "uv"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("uv")
    if not found:
        pytest.skip("no uv here (make installs it into .venv from uv.lock)")
    return found


def _uv_run(*args: str) -> str:
    out = subprocess.run([_uv(), *args, "--offline", "--directory", str(ROOT)], capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "UV_PYTHON_DOWNLOADS": "never"})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_lock_is_in_step_with_pyproject():
    """`uv sync --locked` (what make runs) refuses an out-of-date lock: CI would fail, not re-resolve."""
    _uv_run("lock", "--check")


def test_serving_installs_no_test_or_build_tool():
    """`make run`'s sync (no extra): every runtime import is there, no tool of the suite or the
    build is."""
    exported = _uv_run("export", "--locked", "--no-hashes", "--no-emit-project", "--format", "requirements-txt")
    serving = {_name(line) for line in exported.splitlines() if line and not line.startswith((" ", "#"))}
    assert not serving & NOT_FOR_SERVING, serving & NOT_FOR_SERVING
    runtime = set(_distributions(_runtime_modules()).values()) - _postgresql_driver()
    assert runtime <= serving, runtime - serving
    assert not serving & _postgresql_driver(), "the PostgreSQL driver is the postgresql extra's"
    with_tests = _uv_run("export", "--locked", "--no-hashes", "--no-emit-project", "--extra", "test",
                         "--format", "requirements-txt")
    assert {"pytest", "playwright", "hypothesis", "pyinstaller", "nostr-sdk"} <= {_name(l) for l in with_tests.splitlines()}


def test_uv_itself_comes_from_the_lock():
    """The Makefile and the Dockerfile install uv with pip in hash-checking mode from the line
    packaging/lockpin.py makes out of uv.lock."""
    out = subprocess.run([sys.executable, str(ROOT / "packaging" / "lockpin.py"), "uv"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    version = next(p["version"] for p in _lock()["package"] if p["name"] == "uv")
    assert out.startswith(f"uv=={version} \\\n") and out.count("--hash=sha256:") >= 10
    assert PYPROJECT["dependency-groups"]["lock"] == [f"uv=={version}"]


def test_the_dockerfile_builds_from_the_lock():
    docker = (ROOT / "Dockerfile").read_text()
    build = docker.split("FROM debian")[0]
    assert re.search(r"^COPY .*\buv\.lock\b", build, re.M)
    assert re.search(r"^RUN make dist\b", build, re.M)
    assert "pip install" not in build  # everything through the Makefile's locked, hash-checked path


def test_the_licence_file_is_the_one_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert text.splitlines()[0] == "MIT License"
    assert re.search(r"^Copyright \(c\) \d{4} the appliance authors$", text, re.M)
    assert "Permission is hereby granted, free of charge" in text and 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    # What the installed package says of itself (the metadata setuptools wrote from pyproject.toml).
    meta = md.metadata("appliance")
    assert meta["License-Expression"] == "MIT" and "LICENSE" in (meta.get_all("License-File") or [])
