"""The command line: --version, --help for every subcommand, the sample config."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib

import pytest

from appliance import __version__
from appliance.cli import build_parser
from appliance.settings import SETTINGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    from tests.pg import process_env

    return subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True,
                          env=process_env(args), cwd=ROOT, timeout=timeout)


def _command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every (sub)command path of the parser, e.g. ('config', 'sample')."""
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*prefix, name))
    return paths


COMMANDS = _command_paths(build_parser())


def test_version():
    """The version and the git revision: from git in a checkout (the standalone build embeds it)."""
    out = _run("--version")
    assert out.returncode == 0
    rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    line = out.stdout.strip()
    assert line.startswith(f"appliance {__version__} (git ") and line.endswith(")"), line
    shown = line[len(f"appliance {__version__} (git "):-1].removesuffix("-dirty")
    assert len(shown) == 12 and rev.startswith(shown)


def test_version_embedded_by_a_build(tmp_path):
    """A build's REVISION file wins over git (the binary has no checkout to ask)."""
    import shutil

    pkg = tmp_path / "appliance"
    shutil.copytree(os.path.join(ROOT, "appliance"), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "REVISION").write_text("0123456789ab\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    out = subprocess.run([sys.executable, "-c", "import appliance; print(appliance.version_line())"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert out.stdout.strip() == f"appliance {__version__} (git 0123456789ab)", out.stderr


def test_command_tree_is_complete():
    names = {path[0] for path in COMMANDS if path}
    assert {"serve", "config", "origins", "bench"} <= names
    assert ("config", "sample") in COMMANDS and ("bench", "relay") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "appliance")
def test_help_for_every_subcommand(path):
    parser = build_parser()
    with pytest.raises(SystemExit) as info:
        parser.parse_args([*path, "--help"])
    assert info.value.code == 0


@pytest.mark.parametrize("path", [(), ("serve",), ("config", "sample"), ("bench", "relay")],
                         ids=lambda p: " ".join(p) or "appliance")
def test_help_in_a_real_process(path):
    out = _run(*path, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: appliance")


def test_config_sample_is_toml_and_mentions_every_setting():
    out = _run("config", "sample")
    assert out.returncode == 0, out.stderr
    assert tomllib.loads(out.stdout) == {}  # valid TOML; every line is a comment
    for s in SETTINGS:
        assert f"# {s.name} = " in out.stdout
        assert s.env in out.stdout and s.flag in out.stdout


def test_unknown_command_fails():
    out = _run("frobnicate")
    assert out.returncode != 0
    assert "invalid choice" in out.stderr


def test_bench_without_what_fails():
    out = _run("bench")
    assert out.returncode != 0
    assert "relay" in out.stderr
