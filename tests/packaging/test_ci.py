"""The two commands and CI, as a fresh machine sees them: `.ci/run` installs the tools the suite
needs that the machine lacks, runs the suite against the newest releases (reported, not gating)
and then the README's test command (the suite's two tiers on SQLite, then both on PostgreSQL); `make run` and
`make test` sync `.venv` with uv.lock only when it or `pyproject.toml` changed.

`.ci/run` runs here with a PATH of stand-ins (apt-get and make record their arguments) and a
stand-in root for the files it looks at or writes outside its checkout (CI_ROOT: PostgreSQL's
binaries, postgresql-common's createcluster.conf), so what it would install on a machine missing
each tool is seen without installing anything. The Makefile is asked with `make -n` (what it would
run) in a copy whose file times the test sets.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Tools .ci/run itself uses from PATH (besides bash, which runs it).
SCRIPT_TOOLS = ("dirname", "mktemp", "rm", "mkdir", "grep", "sed", "timeout")
# The README's test command, which .ci/run ends with.
TEST_COMMAND = "make test && make test-slow && make test-postgres"
# The npm lock files `make test` installs from (ts-mls; nostr-tools for NIP-77), each with its stamp.
LOCK_FILES = ("tests/marmot/interop/package-lock.json", "tests/relay/interop/package-lock.json")
# What .ci/run asks make for: the non-gating run against the newest releases first, then the README's.
MAKE_CALLS = ["make test-latest LATEST_TIMEOUT=30m", "make test", "make test-slow", "make test-postgres"]


def _readme_commands() -> list[str]:
    """The README's two commands: the first block of "Install, run, test"."""
    section = (ROOT / "README.md").read_text().split("## Install, run, test", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _run_ci(tmp_path: Path, present: dict[str, str | None], *, venv: bool = False,
            postgresql: bool = False, faketime: bool = False, apt_hook: str = "", make_hook: str = "") -> tuple[list[str], list[str]]:
    """Run .ci/run with only `present` tools on PATH (name -> real path, or None for a stand-in
    that succeeds), in a fresh clone (with a .venv already when `venv`), over a stand-in root
    (tmp_path/root, with PostgreSQL's initdb when `postgresql`, libfaketime when `faketime`). apt-get installs make's stand-in
    when asked for make, and runs `apt_hook` (shell, seeing its arguments); make's stand-in runs
    `make_hook` after recording its call. Returns (apt-get calls, make calls)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in SCRIPT_TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for name, real in present.items():
        if real:
            (bin_dir / name).symlink_to(real)
        else:
            _stub(bin_dir / name, "exit 0\n")
    _stub(tmp_path / "make", f'echo "make $*" >> {log}\n' + make_hook)
    _stub(bin_dir / "apt-get", f'echo "apt-get $*" >> {log}\n' + apt_hook +
          f'for p in "$@"; do [ "$p" = make ] && {shutil.which("cp")} {tmp_path / "make"} {bin_dir / "make"}; done; exit 0\n')
    if "make" in present:
        shutil.copy(tmp_path / "make", bin_dir / "make")
    clone = tmp_path / "clone"  # .ci/run works in its checkout: a fresh one
    (clone / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", clone / ".ci" / "run")
    if venv:
        (clone / ".venv" / "bin").mkdir(parents=True)
        _stub(clone / ".venv" / "bin" / "python", "exit 0\n")
    root = tmp_path / "root"
    root.mkdir()
    if postgresql:
        _stub(_mkdirs(root / "usr/lib/postgresql/15/bin") / "initdb", "exit 0\n")
    if faketime:
        (_mkdirs(root / "usr/lib/x86_64-linux-gnu/faketime") / "libfaketime.so.1").write_bytes(b"")
    out = subprocess.run([shutil.which("bash"), str(clone / ".ci" / "run")], capture_output=True, text=True, timeout=60,
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path), "CI_ROOT": str(root)})
    assert out.returncode == 0, out.stdout + out.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return [c for c in calls if c.startswith("apt-get")], [c for c in calls if c.startswith("make")]


def _mkdirs(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _installed(apt: list[str]) -> set[str]:
    return {word for call in apt if " install " in f" {call} " for word in call.split()[2:]
            if not word.startswith("-")}


def test_ci_runs_the_readme_test_command():
    run_cmd, test_cmd = _readme_commands()[:2]
    assert run_cmd == "make run" and test_cmd == TEST_COMMAND
    script = (ROOT / ".ci" / "run").read_text()
    assert script.rstrip().splitlines()[-1] == test_cmd


def test_ci_installs_what_a_bare_machine_lacks(tmp_path):
    """A machine with python3 (but no venv module), and none of make, npm, objdump, chromium or
    PostgreSQL's server."""
    python = tmp_path / "python3"
    _stub(python, 'case "$*" in *venv*) exit 1;; esac\nexit 0\n')  # Debian's python3 without python3-venv
    apt, make = _run_ci(tmp_path, {"python3": str(python)})
    wanted = {"python3-venv", "make", "npm", "binutils", "chromium", "faketime", "postgresql-common", "postgresql"}
    assert wanted <= _installed(apt), apt
    assert make == MAKE_CALLS


def test_ci_installs_postgresql_without_a_system_cluster(tmp_path):
    """postgresql-common first, then createcluster.conf says no main cluster, then postgresql (whose
    install would otherwise create and start one)."""
    root = tmp_path / "root"
    conf = root / "etc/postgresql-common/createcluster.conf"
    python = tmp_path / "python3"
    _stub(python, "exit 0\n")
    # postgresql-common's install writes its default configuration (a stand-in apt-get here).
    marker = tmp_path / "conf-at-postgresql"
    present = {"python3": str(python), "make": None, "npm": None, "objdump": None, "chromium": None}
    apt, make = _run_ci(tmp_path, present, venv=True, apt_hook=(
        f'case "$*" in *" postgresql-common"*) mkdir -p {conf.parent}; '
        f'printf "# Default values\\ncreate_main_cluster = true\\n" > {conf};; '
        f'*" postgresql"*) {shutil.which("cp")} {conf} {marker};; esac\n'))
    installs = [call for call in apt if " install " in f" {call} " and "postgresql" in call]
    assert [c.split()[-1] for c in installs] == ["postgresql-common", "postgresql"], apt
    assert "create_main_cluster = false" in marker.read_text().splitlines()
    assert "create_main_cluster = true" not in marker.read_text()
    assert make == MAKE_CALLS


def test_ci_installs_nothing_on_a_machine_that_has_it_all(tmp_path):
    tools = {name: shutil.which(name) for name in ("python3", "npm", "objdump")}
    if not all(tools.values()):
        pytest.skip(f"this machine lacks {[n for n, p in tools.items() if not p]}")
    apt, make = _run_ci(tmp_path, {**tools, "make": None, "chromium": None}, venv=True, postgresql=True,
                        faketime=True)
    assert apt == [] and make == MAKE_CALLS


def test_ci_survives_a_failing_latest_run(tmp_path):
    """`make test-latest` failing (as it does when killed at its time limit) prints one line and
    the gating runs still follow; the script's exit code is theirs alone."""
    python = tmp_path / "python3"
    _stub(python, "exit 0\n")
    present = {"python3": str(python), "make": None, "npm": None, "objdump": None, "chromium": None}
    apt, make = _run_ci(tmp_path, present, venv=True, postgresql=True,
                        make_hook='case "$1" in test-latest) exit 2;; esac\nexit 0\n')
    assert make == MAKE_CALLS
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.startswith("#")]
    latest = [line for line in commands if "make test-latest" in line]
    assert len(latest) == 1 and latest[0].startswith("timeout --kill-after=60 40m make test-latest")


# -- the Makefile: .venv only when uv.lock or pyproject.toml changed -------------------------------

def _dry(folder: Path, target: str) -> str:
    # A top-level make, also when the suite itself runs under `make test` (as .ci/run does): an
    # inherited MAKELEVEL/MAKEFLAGS would add "make[1]: Entering directory" lines to the output,
    # and an ARGS given to that make would reach the recipes checked here.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "ARGS")}
    out = subprocess.run(["make", "-n", target], cwd=folder, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The files the Makefile's rules depend on, in a temporary copy (times set by each test)."""
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    for rel in ("Makefile", "pyproject.toml", "uv.lock", "packaging/lockpin.py", "appliance/admin/assets.py", *LOCK_FILES):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def _set_up(folder: Path, when: float) -> None:
    """What a finished `make test` leaves behind, all of it dated `when`."""
    made = [".venv/bin/python", ".venv/.uv", ".venv/.installed", ".venv/.installed-test", ".venv/.mdk",
            "static/vendor/htmx.min.js", *(str(Path(lock).parent / "node_modules" / ".installed") for lock in LOCK_FILES)]
    for rel in made:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).touch()
    for rel in made:
        os.utime(folder / rel, (when, when))


def _syncs(dry: str) -> list[str]:
    return [line for line in dry.splitlines() if " sync " in line]


def test_make_sets_up_a_fresh_clone_first(checkout):
    """uv from the lock (hash-checked), then `uv sync --locked`: serving gets the runtime
    dependencies alone, the suite adds its extras, the build its own."""
    run = _dry(checkout, "run")
    assert "-m venv .venv" in run and "packaging/lockpin.py uv" in run and "--require-hashes" in run
    assert [s.split(" sync ", 1)[1].split() for s in _syncs(run)] == [
        ["--quiet", "--locked", "--inexact", "--python", ".venv/bin/python"]]
    assert "pip install -q -e" not in run and "--extra" not in run
    assert run.strip().splitlines()[-1].startswith(".venv/bin/appliance")
    test = _dry(checkout, "test")
    assert any(line.endswith("--locked --inexact --python .venv/bin/python --extra test") for line in _syncs(test))
    assert "admin fetch-assets" in test and "npm ci" in test
    assert test.strip().splitlines()[-1].startswith(".venv/bin/pytest")
    dist = _dry(checkout, "dist")
    assert any(line.endswith("--extra build") for line in _syncs(dist)) and "--extra test" not in dist


def test_make_does_nothing_but_the_command_when_nothing_changed(checkout):
    old = os.stat(checkout / "pyproject.toml").st_mtime
    for rel in ("pyproject.toml", "uv.lock", "packaging/lockpin.py", "appliance/admin/assets.py", *LOCK_FILES):
        os.utime(checkout / rel, (old - 100, old - 100))
    _set_up(checkout, old)
    assert [line.strip() for line in _dry(checkout, "run").splitlines()] == [".venv/bin/appliance"]
    assert [line.strip() for line in _dry(checkout, "test").splitlines()] == [
        ".venv/bin/pytest -q -n 3 --dist worksteal"]


@pytest.mark.parametrize("changed", ["pyproject.toml", "uv.lock"])
def test_make_syncs_again_when_the_lock_or_pyproject_changed(checkout, changed):
    old = os.stat(checkout / "pyproject.toml").st_mtime
    for rel in ("pyproject.toml", "uv.lock", "packaging/lockpin.py", "appliance/admin/assets.py", *LOCK_FILES):
        os.utime(checkout / rel, (old - 100, old - 100))
    _set_up(checkout, old - 50)
    os.utime(checkout / changed, (old, old))  # newer than the stamps
    run = _dry(checkout, "run").strip().splitlines()
    assert len(_syncs("\n".join(run))) == 1 and run[-1].startswith(".venv/bin/appliance")
    test = _dry(checkout, "test")
    assert any(line.endswith("--extra test") for line in _syncs(test))
    # uv itself is reinstalled only when the lock (which pins it) changed.
    assert ("lockpin.py uv" in test) == (changed == "uv.lock")


def test_every_script_the_makefile_runs_exists():
    """A recipe naming a moved script fails only when that target runs (test-latest's report line
    named packaging/latest_report.py, which never existed, and CI said "could not set up")."""
    text = (ROOT / "Makefile").read_text()
    recipes = "\n".join(line for line in text.splitlines() if line.startswith("\t"))
    scripts = set(re.findall(r"(?<![\w$(/.-])((?:[\w-]+/)+[\w-]+\.(?:py|sh))\b", recipes))
    assert any(s.endswith("/latest_report.py") for s in scripts)  # the pattern finds what it is for
    assert [s for s in sorted(scripts) if not (ROOT / s).is_file()] == []
