#!/usr/bin/env bash
# One benchmark session for issue 4, as BENCHMARKS.md reports it: W(N) on Tidegate (with the
# xargs -P2 baseline) and on the peers (../shared/peers, or $PEERS), then `tidegate-bench engine`.
# Needs a release build (cargo build --release --locked). Run it on an otherwise idle machine.
set -u
cd "$(dirname "$0")/.."
P=${PEERS:-../shared/peers}
B=target/release/tidegate-bench
log() { echo "== $(date -u +%T) $*"; }
log machine; nproc; uptime; git log --oneline -1
log "W tidegate 30 true";   scripts/bench-w.sh 30 true 5
log "W tidegate 30 python"; scripts/bench-w.sh 30 python 5
log "W tidegate 200 true";  scripts/bench-w.sh 200 true 3
log "W tidegate 200 python"; scripts/bench-w.sh 200 python 3
log "airflow 30 python pg"; bash $P/airflow_backfill.sh 30 python postgres 16 2>&1 | grep -E 'RESULT|INSTALL|rror' | tail -5
log "airflow 30 bash pg";   bash $P/airflow_backfill.sh 30 bash postgres 16 2>&1 | grep -E 'RESULT|rror' | tail -5
log "airflow 200 python pg"; bash $P/airflow_backfill.sh 200 python postgres 16 2>&1 | grep -E 'RESULT|rror' | tail -5
log "dagster 30 python inproc"; bash $P/dagster_backfill.sh 30 python inproc 16 2>&1 | grep -E 'RESULT|INSTALL|rror' | tail -5
log "dagster 30 bash inproc"; bash $P/dagster_backfill.sh 30 bash inproc 16 2>&1 | grep -E 'RESULT|rror' | tail -5
log "W tidegate 30 true (again, after the peers)"; scripts/bench-w.sh 30 true 5
log "W tidegate 30 python (again)"; scripts/bench-w.sh 30 python 5
log "engine main"; $B engine --repeats 5 --b1-steps 10000 --b1-runs 10 --b4-steps 1000 --b5-tasks 1000
log "engine b1 100k"; $B engine --only b1 --repeats 1 --b1-steps 100000 --b1-runs 100
log "engine b4 10k (stopped after 400 s)"; timeout 400 $B engine --only b4 --repeats 1 --b4-steps 10000
log "engine b5 5000"; $B engine --only b5 --repeats 1
log done; uptime
