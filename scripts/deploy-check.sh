#!/usr/bin/env bash
# Follows docs/deploy.md on this machine: a PostgreSQL database and role, an S3 bucket (moto at
# $AWS_ENDPOINT_URL), the env file, then the systemd units' ExecStart lines (read from
# deploy/systemd/, so the page and the units are what is tested) run as background processes: a
# scheduler and two workers, each in a folder of its own holding the pipeline. A run is submitted
# from a fourth folder, published once per partition, its logs read from there; then the upgrade
# steps (stop workers, stop scheduler, start scheduler, start workers) and a second run.
#
#   scripts/deploy-check.sh            # needs postgres on 127.0.0.1:5432 (trust), moto on :5055
#
# TIDEGATE_BIN picks the binary (default target/debug/tidegate, as the README's build makes).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TIDEGATE_BIN:-$ROOT/target/debug/tidegate}
PG=${PGHOST_URL:-postgres://postgres@127.0.0.1:5432}
S3=${AWS_ENDPOINT_URL:-http://127.0.0.1:5055}
RUN_ID=$(date +%s)
DB="tidegate_deploy_$RUN_ID"
BUCKET="tidegate-deploy-$RUN_ID"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  psql "$PG/postgres" -q -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
  psql "$PG/postgres" -q -c "DROP ROLE IF EXISTS tidegate_$RUN_ID" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
say() { printf '== %s\n' "$*"; }

say "1. PostgreSQL and the bucket"
psql "$PG/postgres" -q -c "CREATE ROLE tidegate_$RUN_ID LOGIN PASSWORD 'deploy-check'"
psql "$PG/postgres" -q -c "CREATE DATABASE $DB OWNER tidegate_$RUN_ID"
curl -sf -X PUT "$S3/$BUCKET" > /dev/null

say "2. every machine: the pipeline and the env file"
"$BIN" init "$WORK/pipeline" > /dev/null
cat > "$WORK/tidegate.env" <<EOF
TIDEGATE_STATE=postgres://tidegate_$RUN_ID:deploy-check@127.0.0.1:5432/$DB
TIDEGATE_LAKE=s3://$BUCKET/product-features
AWS_REGION=us-east-1
AWS_ACCESS_KEY_ID=test
AWS_SECRET_ACCESS_KEY=test
AWS_ENDPOINT_URL=$S3
AWS_ALLOW_HTTP=true
EOF
for m in scheduler worker-1 worker-2 laptop; do
  mkdir -p "$WORK/$m"
  cp -r "$WORK/pipeline/." "$WORK/$m/"
done
set -a; . "$WORK/tidegate.env"; set +a

# The unit's ExecStart, with the binary, the instance and the folders of this check.
exec_start() {
  local unit=$1 instance=$2
  grep '^ExecStart=' "$ROOT/deploy/systemd/$unit" | sed -e 's/^ExecStart=//' \
    -e "s|/usr/local/bin/tidegate|$BIN|" -e "s|%H|$(hostname)|g" -e "s|%i|$instance|g" \
    -e "s|/var/lib/tidegate/|$WORK/var/|g"
}
start() {
  local folder=$1 unit=$2 instance=${3:-}
  # shellcheck disable=SC2046
  (cd "$WORK/$folder" && exec $(exec_start "$unit" "$instance")) >> "$WORK/$folder.log" 2>&1 &
  PIDS+=($!)
}
start_all() {
  say "3. the scheduler: $(exec_start tidegate-scheduler.service '')"
  start scheduler tidegate-scheduler.service
  sleep 2
  say "4. workers: $(exec_start 'tidegate-worker@.service' 1)"
  start worker-1 'tidegate-worker@.service' 1
  start worker-2 'tidegate-worker@.service' 2
}
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait "${PIDS[@]}" 2>/dev/null || true
  PIDS=()
}
run_and_check() {
  local from=$1 to=$2
  say "5. using it from another folder: submit $from..$to"
  local run
  run=$(cd "$WORK/laptop" && "$BIN" submit daily_stats --from "$from" --to "$to" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["run"]["id"])')
  for _ in $(seq 1 120); do
    status=$(cd "$WORK/laptop" && "$BIN" status --json | python3 -c "import json,sys; print(next((r['run']['status'] if 'run' in r else r['status']) for r in json.load(sys.stdin)['runs'] if (r.get('run') or r)['id'] == '$run'))")
    [ "$status" = succeeded ] && break
    [ "$status" = failed ] && { echo "run $run failed"; cat "$WORK"/*.log; exit 1; }
    sleep 1
  done
  [ "$status" = succeeded ] || { echo "run $run did not finish: $status"; cat "$WORK"/*.log; exit 1; }
  (cd "$WORK/laptop" && "$BIN" logs clean_events "$from" --stdout > "$WORK/logs.txt")
  [ -s "$WORK/logs.txt" ] || { echo "no logs read from the laptop"; exit 1; }
  (cd "$WORK/laptop" && "$BIN" sql "SELECT COUNT(DISTINCT day) AS days FROM daily_stats" --json)
}

start_all
run_and_check 2024-01-01 2024-01-03
say "6. upgrading: stop workers and scheduler, start the scheduler (migrations apply), then the workers"
stop_all
start_all
run_and_check 2024-01-04 2024-01-05
say "every step of docs/deploy.md worked: runs published from the laptop, logs read there, after an upgrade too"
