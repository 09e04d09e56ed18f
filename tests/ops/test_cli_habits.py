"""The command line's habits: each subcommand lists only its own options (the server settings belong
to `serve` and `config show`), lists are aligned tables with a header (`--json` for scripts), an
empty list says so, a missing argument is one line with a hint, and an unknown APPLIANCE_* variable
gets a warning with the nearest setting's name."""

from __future__ import annotations

import json

import pytest

from appliance.cli import build_parser
from appliance.settings import SETTINGS
from tests.conftest import Identity, Server
from tests.ops.helpers import PUSH_CONFIG, cli
from tests.test_cli import COMMANDS

SERVER_ONLY = [s.flag for s in SETTINGS if s.name not in ("data_dir", "storage", "public_url", "admin_listen")]


def _help(*path: str) -> str:
    out = cli(*path, "--help")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_backup_help_is_short_and_lists_its_own_options():
    text = _help("backup")
    assert len(text.splitlines()) < 40, text
    assert "--force" in text and "--data-dir" in text and "PATH" in text
    assert "--max-subscriptions" not in text and "--port" not in text


@pytest.mark.parametrize("path", [p for p in COMMANDS if p and p[0] not in ("serve", "bench", "marmot")
                                  and p != ("config", "show")], ids=" ".join)
def test_no_subcommand_lists_the_server_settings(path):
    parser = build_parser()
    for name in path:
        parser = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]
    text = parser.format_help()
    assert [flag for flag in SERVER_ONLY if f"{flag} " in text] == []


@pytest.mark.parametrize("path", [("serve",), ("config", "show")], ids=" ".join)
def test_serve_and_config_show_list_every_setting(path):
    text = _help(*path)
    for s in SETTINGS:
        assert s.flag in text, s.flag


def test_a_missing_argument_is_one_line_with_a_hint(tmp_path):
    out = cli("keys", "list", "--data-dir", tmp_path / "data")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "appliance keys list: the following arguments are required: origin (see appliance keys list --help)"]
    out = cli("push", "make-lease", "--data-dir", tmp_path / "data")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "--profile" in out.stderr
    assert not (tmp_path / "data").exists()


def test_an_unknown_environment_variable_gets_one_warning_with_a_suggestion(tmp_path):
    out = cli("config", "show", "--data-dir", tmp_path / "data",
              env={"APPLIANCE_MAX_SUBSCRIPTONS": "3", "APPLIANCE_MAX_LIMIT": "1000"})
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "appliance: warning: APPLIANCE_MAX_SUBSCRIPTONS is not a setting and is ignored; "
        "did you mean APPLIANCE_MAX_SUBSCRIPTIONS?"]
    assert 'max_limit = 1000    # from env' in out.stdout  # the known one applies


@pytest.mark.slow
def test_lists_are_tables_json_on_request_and_say_when_empty(tmp_path):
    config = tmp_path / "push.toml"
    config.write_text(PUSH_CONFIG)
    server = Server(tmp_path / "data", "--config", str(config)).start()
    try:
        origin = server.url
        data = ("--data-dir", server.data_dir)
        out = cli("origins", "list", *data)
        lines = out.stdout.splitlines()
        assert lines[0].split() == ["ID", "ORIGIN", "HOSTS", "PATH", "POLICY", "ALLOW", "BLOCK", "PUSH"], out.stdout
        assert lines[1].split()[:2] == ["1", origin]
        (row,) = [json.loads(line) for line in cli("origins", "list", *data, "--json").stdout.splitlines()]
        assert row["origin"] == origin and row["push"]["app_profiles"][0]["id"] == "com.example.app/ios"

        out = cli("keys", "list", origin, *data)
        header, *rows = out.stdout.splitlines()
        assert header.split()[:3] == ["ID", "STATE", "PUBKEY"] and len(rows) == 1 and " current " in rows[0]
        assert header.index("STATE") == rows[0].index("current")  # aligned under its header

        assert cli("groups", "list", origin, *data).stdout == "no groups\n"
        assert cli("groups", "list", origin, *data, "--json").stdout == ""
        admin = Identity()
        made = cli("groups", "create", origin, *data, "--name", "ops", "--admin", admin.pubkey)
        assert made.returncode == 0, made.stderr
        header, row = cli("groups", "list", origin, *data).stdout.splitlines()
        assert header.split() == ["ID", "NAME", "PRIVATE", "CLOSED", "MEMBERS"] and row.split()[1:] == ["ops", "no", "no", "1"]
        assert cli("gateway", "keys", "list", *data).stdout == "no grant keys\n"
    finally:
        server.stop()


@pytest.mark.slow
def test_block_takes_the_id_origins_list_shows_and_says_what_it_did(tmp_path):
    """`origins list` leads with an ID column; the list edits take that id as well as the URL, and
    say in one line what they did (not the whole origin, push settings and all, as JSON)."""
    server = Server(tmp_path / "data", config=PUSH_CONFIG).start()
    try:
        listed = cli("origins", "list", "--data-dir", server.data_dir)
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()[:2]
        assert header.split()[0] == "ID"
        origin_id = row.split()[0]
        mallory = Identity()
        out = cli("origins", "block", origin_id, mallory.pubkey, "--data-dir", server.data_dir)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"blocked {mallory.pubkey} at {server.url}", out.stdout
        out = cli("origins", "unblock", server.url, mallory.pubkey, "--data-dir", server.data_dir)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"unblocked {mallory.pubkey} at {server.url}", out.stdout
        listed = cli("origins", "list", "--json", "--data-dir", server.data_dir)
        assert json.loads(listed.stdout.splitlines()[0])["block"] == []
    finally:
        server.stop()


@pytest.mark.parametrize("args", [("config", "show"), ("origins", "list", "--json"), ("origins", "list")], ids=" ".join)
def test_a_reader_that_went_away_is_not_a_traceback(tmp_path, args):
    """`appliance config show | head -1`: the reader closes the pipe early; that is the reader's
    choice, not an error (exit 0, nothing on stderr), as `export` already does."""
    import os
    import subprocess
    import sys

    from tests.ops.helpers import ROOT
    from tests.pg import process_env

    assert cli("origins", "list", "--data-dir", tmp_path / "data").returncode == 0  # a data directory to read
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        out = subprocess.run([sys.executable, "-m", "appliance", *args, "--data-dir", str(tmp_path / "data")],
                             stdout=write_end, stderr=subprocess.PIPE, text=True, env=process_env(args), cwd=ROOT,
                             timeout=60)
    finally:
        os.close(write_end)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_a_missing_setting_is_called_missing_not_none(tmp_path):
    """A profile without `environment` is refused in plain words: the setting is missing (not
    "invalid value None", Python's word for nothing), and which ones are missing."""
    config = tmp_path / "appliance.toml"
    config.write_text('[push]\napp_profiles = [{ id = "com.example.app/ios", transport = "apns", topic = "t", '
                      'team_id = "TEAM123456", key_id = "ABC123DEFG", key_file = "/nonexistent/AuthKey.p8" }]\n'
                      "push_kinds = [9]\n")
    for args in (("serve", "--port", "0"), ("doctor",)):
        out = cli(*args, "--config", config, "--data-dir", tmp_path / "data", timeout=30)
        assert out.returncode in (1, 2), out.stdout + out.stderr
        text = out.stdout + out.stderr
        assert "None" not in text, text
        assert "setting '[push] app_profiles[0].environment': missing: " in text, text
        assert "missing: environment" in text, text
