#!/usr/bin/env bash
# A PostgreSQL cluster of the benchmarks' own on port 5433, with pg_stat_statements loaded, so that
# scripts/bench-machines.sh can print statements, commits and WAL flushes per step (issue 35)
# without restarting the server the tests use. Debian's postgresql-common; run as root.
#
#   scripts/bench-pg.sh            create (once) and start it; prints the PG_URL to use
#   scripts/bench-pg.sh stop       stop it
set -euo pipefail
VER=$(ls /etc/postgresql | sort -n | tail -1)
if [ "${1:-}" = stop ]; then pg_ctlcluster --skip-systemctl-redirect "$VER" bench stop; exit 0; fi
if ! pg_lsclusters -h | awk '{print $2}' | grep -qx bench; then
  pg_createcluster "$VER" bench -p 5433 -- --auth=trust > /dev/null
  {
    echo "shared_preload_libraries = 'pg_stat_statements'"
    echo "pg_stat_statements.track = all"
    echo "max_connections = 200"
  } >> "/etc/postgresql/$VER/bench/postgresql.conf"
fi
pg_ctlcluster --skip-systemctl-redirect "$VER" bench start 2>/dev/null || true
psql -h 127.0.0.1 -p 5433 -U postgres -XAtq -c "SELECT 1 FROM pg_database WHERE datname = 'bench'" | grep -q 1 \
  || psql -h 127.0.0.1 -p 5433 -U postgres -Xq -c "CREATE DATABASE bench"
psql -h 127.0.0.1 -p 5433 -U postgres -Xq -d bench -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
echo "PG_URL=postgres://postgres@127.0.0.1:5433/bench"
