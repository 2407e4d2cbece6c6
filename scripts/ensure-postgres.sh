#!/usr/bin/env bash
# Start the machine's PostgreSQL when it is down; the store and API tests run against it.
set -euo pipefail
host=${RAILOVER_TEST_PG_HOST:-127.0.0.1}
port=${RAILOVER_TEST_PG_PORT:-5432}
if pg_isready -q -h "$host" -p "$port" 2>/dev/null; then exit 0; fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  ver=$(ls /etc/postgresql | sort -V | tail -n 1)
  echo "PostgreSQL is down on $host:$port; starting cluster $ver/main" >&2
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
fi
for _ in $(seq 1 30); do
  pg_isready -q -h "$host" -p "$port" && exit 0
  sleep 1
done
echo "PostgreSQL is not reachable on $host:$port; the store tests need it" >&2
exit 1
