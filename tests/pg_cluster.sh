#!/usr/bin/env bash
# Run a command beside a throwaway PostgreSQL cluster: Debian's initdb/pg_ctl (package postgresql),
# a temporary directory, a Unix socket only (no TCP port), owned by an unprivileged user (postgres
# when run as root: initdb refuses root). The command sees APPLIANCE_TEST_PG, the URL of the
# cluster's maintenance database; the cluster is stopped and removed whatever the command's outcome.
#   tests/pg_cluster.sh .venv/bin/pytest -q --storage=postgresql
set -euo pipefail
bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "pg_cluster: no PostgreSQL server found (apt-get install postgresql)" >&2
  exit 2
fi
dir="$(mktemp -d /tmp/appliance-pg.XXXXXX)"
run=()
if [ "$(id -u)" = 0 ]; then
  chown postgres "$dir"
  run=(runuser -u postgres --)
fi
stop() {
  "${run[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT
"${run[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 2; }
# Throwaway: no fsync (the suite's durability tests are about the appliance's acknowledgements,
# which PostgreSQL gives at commit either way); enough connections for the servers a test starts.
"${run[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
  -o "-k $dir -c listen_addresses='' -c fsync=off -c max_connections=300" start >/dev/null
export APPLIANCE_TEST_PG="postgresql://postgres@/postgres?host=$dir"
set +e
"$@"
rc=$?
set -e
exit $rc
