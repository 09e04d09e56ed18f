"""The settings table: documented everywhere, precedence flag > env > file > default, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from appliance.cli import build_parser
from appliance.errors import ConfigError
from appliance.settings import BY_NAME, SETTINGS, load, sample_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(data_dir=None) -> dict:
    from tests.pg import process_env

    return process_env(data_dir=data_dir)


def _serve_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["serve"].format_help()


def test_every_setting_is_documented():
    sample = sample_config()
    help_text = _serve_help()
    assert len(SETTINGS) == len(BY_NAME)
    for s in SETTINGS:
        assert s.help.strip(), f"{s.name} has no help text"
        assert f"# {s.name} = " in sample, f"{s.name} missing from the sample config"
        assert s.env in sample
        assert s.flag in help_text, f"{s.flag} missing from `appliance serve --help`"
        assert s.env in help_text


def test_sample_config_is_valid_toml_and_loads_to_defaults(tmp_path):
    sample = sample_config()
    assert tomllib.loads(sample) == {}  # everything is commented out
    # Uncommenting every `# name = value` line gives a file that loads and equals the defaults.
    # (Only the flat part: the [[origins]] example further down has its own keys.)
    flat = sample.split("[[origins]]")[0]
    lines = [line[2:] for line in flat.splitlines() if line.startswith("# ") and line[2:].split(" = ")[0] in BY_NAME]
    data = tomllib.loads("\n".join(lines))
    assert set(data) == set(BY_NAME)
    cfg = tmp_path / "all.toml"
    cfg.write_text("\n".join(lines))
    settings = load(config_path=cfg, environ={})
    assert settings.values == {s.name: s.default for s in SETTINGS}
    assert set(settings.sources.values()) == {"file"}


def test_defaults_without_anything():
    settings = load(environ={})
    for s in SETTINGS:
        assert settings.values[s.name] == s.default
        assert settings.sources[s.name] == "default"


def test_precedence_flag_env_file_default(tmp_path):
    cfg = tmp_path / "appliance.toml"
    cfg.write_text("max_subscriptions = 11\nmax_filters = 12\nreq_rate = 13\n")
    env = {"APPLIANCE_MAX_SUBSCRIPTIONS": "21", "APPLIANCE_MAX_FILTERS": "22"}
    flags = {"max_subscriptions": "31"}
    s = load(flags=flags, environ=env, config_path=cfg)
    assert (s.max_subscriptions, s.sources["max_subscriptions"]) == (31, "flag")
    assert (s.max_filters, s.sources["max_filters"]) == (22, "env")
    assert (s.req_rate, s.sources["req_rate"]) == (13, "file")
    assert (s.event_rate, s.sources["event_rate"]) == (BY_NAME["event_rate"].default, "default")
    # The config file may also come from APPLIANCE_CONFIG.
    s2 = load(environ={"APPLIANCE_CONFIG": str(cfg)})
    assert s2.req_rate == 13 and s2.config_path == cfg


def test_precedence_through_the_cli(tmp_path):
    cfg = tmp_path / "appliance.toml"
    cfg.write_text('relay_name = "from-file"\nmax_limit = 900\ndefault_limit = 100\n')
    env = _env() | {"APPLIANCE_RELAY_NAME": "from-env", "APPLIANCE_MAX_LIMIT": "800"}
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "config", "show", "--config", str(cfg), "--max-limit", "700"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" = ", 1) for line in out.stdout.splitlines())
    assert lines["max_limit"] == "700    # from flag"
    assert lines["relay_name"] == '"from-env"    # from env'
    assert lines["default_limit"] == "100    # from file"
    assert lines["port"] == "7777    # from default"


@pytest.mark.parametrize(
    "source, name, value, hint",
    [
        ("flag", "port", "abc", "whole number"),
        ("env", "port", "70000", "at most 65535"),
        ("file", "max_limit", 0, "at least 1"),
        ("flag", "access_policy", "x", "public, members"),
        ("env", "auth_required", "maybe", "true or false"),
        ("file", "sync_mode", "fast", "full, normal"),
        ("flag", "public_url", "http://example.org", "ws://"),
        ("file", "relay_pubkey", "npub1xyz", "hex"),
    ],
)
def test_invalid_values_name_setting_value_and_hint(tmp_path, source, name, value, hint):
    flags, environ, cfg = {}, {}, None
    if source == "flag":
        flags[name] = value
    elif source == "env":
        environ[BY_NAME[name].env] = value
    else:
        cfg = tmp_path / "bad.toml"
        cfg.write_text(f"{name} = {value!r}\n".replace("'", '"'))
    with pytest.raises(ConfigError) as info:
        load(flags=flags, environ=environ, config_path=cfg)
    message = str(info.value)
    assert repr(name) in message and str(value) in message and hint in message, message


def test_unknown_key_and_bad_file(tmp_path):
    cfg = tmp_path / "typo.toml"
    cfg.write_text("max_subscription = 5\n")
    with pytest.raises(ConfigError) as info:
        load(config_path=cfg, environ={})
    assert "max_subscription" in str(info.value) and "config sample" in str(info.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("port = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(config_path=broken, environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load(config_path=tmp_path / "missing.toml", environ={})


def test_cross_setting_check():
    with pytest.raises(ConfigError) as info:
        load(flags={"max_limit": "10", "default_limit": "20"}, environ={})
    assert "default_limit" in str(info.value) and "max_limit" in str(info.value)


@pytest.mark.parametrize(
    "args, env, expected",
    [
        (["--port", "abc"], {}, ["'port'", "'abc'", "whole number"]),
        ([], {"APPLIANCE_MAX_LIMIT": "0"}, ["'max_limit'", "'0'", "at least 1"]),
        (["--access-policy", "x"], {}, ["'access_policy'", "'x'", "public, members"]),
    ],
)
def test_serve_refuses_to_start(tmp_path, args, env, expected):
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--data-dir", str(tmp_path / "data"), *args],
        capture_output=True, text=True, env=_env(tmp_path / "data") | env, cwd=ROOT, timeout=60,
    )
    assert out.returncode != 0
    for part in expected:
        assert part in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "data").exists()  # nothing was created


def test_serve_refuses_unknown_config_key(tmp_path):
    cfg = tmp_path / "appliance.toml"
    cfg.write_text('acces_policy = "members"\n')
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "--config", str(cfg), "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, env=_env(tmp_path / "d"), cwd=ROOT, timeout=60,
    )
    assert out.returncode != 0
    assert "acces_policy" in out.stderr and "unknown setting" in out.stderr


def _secret_like() -> dict[str, str]:
    from appliance.nostr.keys import generate_secret
    from appliance.nostr.nip19 import encode_key

    secret = generate_secret()
    return {"nsec": encode_key(bytes.fromhex(secret), "nsec"), "HEX": secret.upper(), "hex": secret}


@pytest.mark.parametrize("source", ["flag", "env", "file"])
@pytest.mark.parametrize("name, form", [("admin_pubkeys", "nsec"), ("relay_pubkey", "nsec"),
                                        ("relay_pubkey", "HEX"), ("admin_pubkeys", "hex-beside-an-npub")])
def test_a_secret_key_given_for_a_pubkey_is_never_repeated(tmp_path, source, name, form):
    """An nsec (or a secret key in hex) pasted where a pubkey goes: the error names the setting and
    says why, and stderr (the service's journal) never holds the key, whole or in part."""
    keys = _secret_like()
    secret = keys["nsec"] if form == "nsec" else keys["HEX"] if form == "HEX" else keys["hex"]
    value = secret if form != "hex-beside-an-npub" else f"{secret},npub1notapubkey"
    args, env = [], {}
    setting = BY_NAME[name]
    if source == "flag":
        args = [setting.flag, value]
    elif source == "env":
        env = {setting.env: value}
    else:
        cfg = tmp_path / "appliance.toml"
        cfg.write_text(f"{name} = " + (f'"{value}"\n' if name == "relay_pubkey" else
                                       "[" + ", ".join(f'"{v}"' for v in value.split(",")) + "]\n"))
        args = ["--config", str(cfg)]
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--data-dir", str(tmp_path / "data"), *args],
        capture_output=True, text=True, env=_env(tmp_path / "data") | env, cwd=ROOT, timeout=60,
    )
    assert out.returncode == 2 and f"setting {name!r}" in out.stderr, out.stderr
    assert "not shown" in out.stderr and "Traceback" not in out.stderr, out.stderr
    hex_form = keys["hex"]
    for part in (secret, secret[5:25], secret[-20:], hex_form[:20], hex_form[-20:]):
        assert part.lower() not in out.stderr.lower(), out.stderr
    if form == "nsec":
        assert "an nsec is a secret key" in out.stderr, out.stderr


def test_errors_never_repeat_what_looks_like_a_secret_key():
    from appliance.commands.moderation import _hex64

    keys = _secret_like()
    for value in (keys["nsec"], keys["HEX"], [keys["hex"], "x"], {"k": keys["nsec"]}, "ncryptsec1qgg9947rlpvqu"):
        for error in (ConfigError("any_setting", value, "a hint"), ConfigError(f"x {value}", 1, f"hint {value}")):
            text = str(error)
            assert "not shown: it looks like a secret key" in text, text
            assert all(k.lower() not in text.lower() for k in keys.values()) and "9947rlpvqu" not in text, text
    with pytest.raises(ConfigError) as info:  # a CLI or NIP-86 moderation call given an nsec
        _hex64(keys["nsec"], "pubkey")
    assert keys["nsec"] not in str(info.value) and info.value.value != keys["nsec"]
    # Other values are still repeated, so the message says what was wrong.
    assert "'npub1xyz'" in str(ConfigError("relay_pubkey", "npub1xyz", "a hint"))
