"""A PostgreSQL cluster for the tests of several nodes, which need one whatever backend the rest of
the suite runs on: $APPLIANCE_TEST_PG when it names one, else a throwaway cluster of this
machine's PostgreSQL binaries (/usr/lib/postgresql/*/bin) on a Unix socket in a temp dir, started
once per test session (as the `postgres` user when the suite runs as root: PostgreSQL refuses
root). Without binaries or a URL, those tests are skipped and say why."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if Path(d, "initdb").exists() and Path(d, "pg_ctl").exists():
            return Path(d)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found and Path(found).with_name("initdb").exists() else None


class Cluster:
    """A running cluster: `admin_url` names its maintenance database."""

    def __init__(self, admin_url: str, stop=None):
        self.admin_url = admin_url
        self._stop = stop
        self._created: list[str] = []

    def url(self, database: str) -> str:
        head, _, query = self.admin_url.partition("?")
        return f"{head.rsplit('/', 1)[0]}/{database}" + (f"?{query}" if query else "")

    def new_database(self) -> str:
        """A fresh empty database (the appliance migrates it on first open)."""
        import psycopg

        name = "appliance_nodes_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
        self._created.append(name)
        return self.url(name)

    def close(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                for name in self._created:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            pass
        if self._stop is not None:
            self._stop()


def start_cluster() -> Cluster:
    """The cluster the tests use, or pytest.skip with the reason."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("several nodes need PostgreSQL: psycopg is not installed")
    url = os.environ.get("APPLIANCE_TEST_PG")
    if url:
        return Cluster(url)
    bindir = _bindir()
    if bindir is None:
        pytest.skip("several nodes need PostgreSQL: no PostgreSQL binaries here (apt-get install postgresql, "
                    "or set APPLIANCE_TEST_PG to a cluster's maintenance database URL)")
    base = Path(tempfile.mkdtemp(prefix="appliance-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("several nodes need PostgreSQL: running as root and there is no `postgres` user to run it as")
        for p in (base, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        base.chmod(0o755)
        run_as = ["runuser", "-u", "postgres", "--"]

    def run(*args: str) -> None:
        subprocess.run([*run_as, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=120)

    run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C")
    run(str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(base / "log"), "-o",
        f"-k {sock} -c listen_addresses= -c max_connections=100 -c fsync=off", "start")

    def stop() -> None:
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        shutil.rmtree(base, ignore_errors=True)

    return Cluster(f"postgresql://postgres@/postgres?host={sock}", stop)
