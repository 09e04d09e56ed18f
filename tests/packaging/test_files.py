"""The deploy files stay in step with the program: the README shows the shipped systemd unit,
and the Dockerfile builds with the spec the smoke test proves and checks the real health route."""

from __future__ import annotations

import re
from pathlib import Path

from appliance.admin.web import BASE
from appliance.settings import BY_NAME

ROOT = Path(__file__).resolve().parents[2]


def test_readme_shows_the_shipped_systemd_unit():
    unit = (ROOT / "packaging" / "appliance.service").read_text()
    readme = (ROOT / "README.md").read_text()
    assert f"```ini\n{unit}```" in readme
    for hardening in ("DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes", "PrivateTmp=yes"):
        assert hardening in unit
    # Every APPLIANCE_* variable it sets is a real setting.
    for name in re.findall(r"APPLIANCE_([A-Z_]+)=", unit):
        assert name.lower() in BY_NAME


def test_dockerfile_mirrors_the_smoke_test():
    docker = (ROOT / "Dockerfile").read_text()
    smoke = (ROOT / "tests" / "packaging" / "test_smoke.py").read_text()
    # The image builds with `make dist`, whose recipe builds the spec the smoke test proves.
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^RUN make dist$", docker, re.M)
    assert "packaging/appliance.spec" in makefile and '"packaging" / "appliance.spec"' in smoke
    assert "appliance admin fetch-assets" in makefile  # the spec refuses to build without verified htmx
    health = re.search(r"HEALTHCHECK .*\n\s+CMD curl -fsS \"http://127\.0\.0\.1:\$\{APPLIANCE_PORT\}(\S+)\"", docker)
    assert health and health.group(1) == f"{BASE}/health"
    assert f'"{BASE}/health"' in smoke  # the smoke test asks the same route
    env = dict(re.findall(r"(APPLIANCE_[A-Z_]+)=(\S+)", docker.split("FROM debian")[1]))
    assert env["APPLIANCE_HOST"] == "0.0.0.0" and env["APPLIANCE_DATA_DIR"] == "/data"
    for name in env:
        assert name.removeprefix("APPLIANCE_").lower() in BY_NAME
    assert re.search(r"^USER appliance$", docker, re.M) and re.search(r"^VOLUME /data$", docker, re.M)
    # The README's `docker run` sets real settings only.
    readme = (ROOT / "README.md").read_text()
    run = re.search(r"^docker run .*?(?<!\\)\n", readme, re.M | re.S).group(0)
    names = re.findall(r"-e APPLIANCE_([A-Z_]+)=", run)
    assert "PUBLIC_URL" in names and "TRUSTED_PROXIES" in names
    for name in names:
        assert name.lower() in BY_NAME


def test_the_systemd_unit_starts_without_an_apns_key():
    """systemd refuses to start a unit whose LoadCredential= names an absolute path that does not
    exist (status 243/CREDENTIALS): most installations have no .p8 file (no push, a gateway, or a key
    uploaded through the dashboard), so the shipped line is commented out, ready to enable."""
    unit = (ROOT / "packaging" / "appliance.service").read_text()
    active = [line for line in unit.splitlines() if line.startswith("LoadCredential")]
    assert active == [], active
    assert "#LoadCredential=apns.p8:/etc/appliance/AuthKey.p8" in unit.replace("# LoadCredential", "#LoadCredential")
