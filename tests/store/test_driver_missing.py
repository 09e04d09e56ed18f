"""The PostgreSQL driver is an optional extra: without it, a PostgreSQL `storage` gets one line that
names the extra, and the SQLite store serves as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from appliance.store.interface import POSTGRES_DRIVER_MISSING

ROOT = Path(__file__).resolve().parents[2]

# A Python where `import psycopg` fails as it does when the extra is not installed.
WITHOUT_PSYCOPG = "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_PSYCOPG + code], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_a_postgresql_storage_without_the_driver_names_the_extra(tmp_path):
    for command in ("serve", "doctor"):
        out = run("from appliance.cli import main\n"
                  f"sys.exit(main([{command!r}, '--storage', 'postgresql://u:hunter2@127.0.0.1:1/x', "
                  f"'--data-dir', {str(tmp_path / command)!r}]))")
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert lines[-1] == f"appliance: {POSTGRES_DRIVER_MISSING}", (command, out.stderr)
        assert "pip install 'appliance[postgresql]'" in lines[-1]
        assert "hunter2" not in out.stderr + out.stdout
        assert "Traceback" not in out.stderr


def test_the_sqlite_store_needs_no_postgresql_driver(tmp_path):
    out = run("from pathlib import Path\n"
              "from appliance.store.backend import make_store\n"
              "from appliance.store import meta\n"
              "from appliance.store.events import event_counts\n"
              f"store = make_store('sqlite', Path({str(tmp_path)!r})).open()\n"
              "try:\n"
              "    store.write_sync(meta.health_probe(1.0))\n"
              "    print(store.read_sync(event_counts) == {}, sys.modules['psycopg'] is not None)\n"
              "finally:\n"
              "    store.close()\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
