#!/usr/bin/env bash
# Tidegate as several machines (issue 23), measured on this one. Prints RESULT lines.
#
#   scripts/bench-machines.sh w N [REPEATS]     W(N) of ../shared/peers (a backfill of N days of three
#                                               chained no-op tasks) on PostgreSQL + S3: one `serve
#                                               --workers 0` and two `tidegate worker`s, each in a
#                                               folder of its own; wall time from `submit` to the
#                                               last step published, median of REPEATS.
#                                               W_LAKE=folder: a lake folder instead of S3.
#                                               S3_COUNT=1: S3 requests per task counted for
#                                               each process (through socat relays; needs socat).
#   scripts/bench-machines.sh load STEPS [kill] 2 schedulers (`serve`, one active, one standby) and
#                                               $WORKERS workers (default 4) of $SLOTS slots each
#                                               (default 4; the pool has every worker's slots) drain
#                                               STEPS no-op steps (10 independent tasks) on
#                                               PostgreSQL and a lake folder: steps per second;
#                                               dispatch latency p50/p99 (a slot freed anywhere in
#                                               the cluster, a `staged`, to the next `claimed`: every
#                                               step is ready from the submit on, so a claim waits
#                                               only for a free slot); slot wait p50/p99 (the same,
#                                               per worker); staged to published p50/p99; attempts
#                                               per worker; and duplicates (Delta commits per step
#                                               identity > 1, published events per step > 1). All
#                                               latencies come from the journal's own events.
#                                               With `kill`, the active scheduler is killed with
#                                               kill -9 when half the steps have published.
#
# With pg_stat_statements in the database at $PG_URL (shared_preload_libraries and CREATE EXTENSION;
# scripts/bench-pg.sh starts such a cluster on port 5433), every mode also prints a PROFILE line:
# statements, transactions (committed, and rolled back: a serializable write run again) and WAL
# flushes per step, and the top statements by time and by calls.
#
# Needs a release build (cargo build --release --locked), PostgreSQL at $PG_URL (default the test
# server), and for `w` an S3 server at $AWS_ENDPOINT_URL with bucket $S3_BUCKET (default moto on
# 5055 and tidegate-test, as .ci/run starts them).
set -euo pipefail
MODE=${1:?w N [REPEATS] | load STEPS [kill]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TIDEGATE_BIN:-$ROOT/target/release/tidegate}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/test}
export AWS_ENDPOINT_URL=${AWS_ENDPOINT_URL:-http://127.0.0.1:5055} AWS_ALLOW_HTTP=true AWS_REGION=${AWS_REGION:-us-east-1}
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}
S3_BUCKET=${S3_BUCKET:-tidegate-test}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# Seconds since the epoch, from bash itself (no process started: the poller below must not eat
# the CPU it measures).
now() { echo "$EPOCHREALTIME"; }
psql_q() { psql "$PG_URL" -XAtq -c "$1"; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# A fresh schema and its URL; every process gets it through TIDEGATE_STATE.
new_schema() {
  local name="tg_bench_$(date +%s%N)"
  psql_q "CREATE SCHEMA $name" > /dev/null
  echo "$name"
}
schema_url() { echo "${PG_URL}?options=-c%20search_path%3D$1"; }
in_schema() { psql "$(schema_url "$1")" -XAtq -c "$2"; }

# Waits until every step of the schema is published; fails after $2 seconds. One psql session
# kept open (a coprocess) answers every 50 ms poll: starting a psql, a date and a bc per poll took
# half a core of this two-core machine, and made the cluster measurably slower.
wait_drained() {
  local schema=$1 within=$2 total=$3 deadline n
  deadline=$(( ${EPOCHREALTIME%.*} + within ))
  coproc POLL { psql "$(schema_url "$schema")" -XAtq; }
  while true; do
    echo "SELECT COUNT(*) FROM steps WHERE status = 'published';" >&"${POLL[1]}"
    read -r n <&"${POLL[0]}" || n=0
    [ "$n" -ge "$total" ] && break
    if [ "${EPOCHREALTIME%.*}" -ge "$deadline" ]; then
      echo "only $n of $total steps published after ${within}s" >&2
      exec {POLL[1]}>&-
      return 1
    fi
    sleep 0.05
  done
  exec {POLL[1]}>&-
  wait "$POLL_PID" 2>/dev/null || true
}

# The database's own account of the work (issue 35: "measure every step of the way"), when
# pg_stat_statements is there: `profile_reset` before the work, `profile_report STEPS` after.
PROFILE=0
profile_reset() {
  if [ "$(psql_q "SELECT COUNT(*) FROM pg_extension WHERE extname = 'pg_stat_statements'" 2>/dev/null)" = 1 ]; then
    PROFILE=1
    psql_q "SELECT pg_stat_statements_reset(); SELECT pg_stat_reset(); SELECT pg_stat_reset_shared('wal');" > /dev/null
    sleep 0.6 # pg_stat_database is flushed by each backend at most every 500 ms
  fi
}
profile_report() {
  [ "$PROFILE" = 1 ] || return 0
  local steps=$1
  sleep 0.6
  # The bench's own queries (the drain poller, this report) are left out; nothing else runs.
  local mine="query NOT ILIKE '%pg_stat%' AND query NOT ILIKE 'SELECT COUNT(*) FROM steps WHERE status%' AND query NOT ILIKE '%FROM workers%' AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
  psql_q "SELECT format('PROFILE statements_per_step=%s commits_per_step=%s rollbacks_per_step=%s wal_flushes_per_step=%s rows_per_step=%s exec_ms_per_step=%s',
      round(s.calls / $steps.0, 1), round(d.xact_commit / $steps.0, 1), round(d.xact_rollback / $steps.0, 3), round(w.wal_sync / $steps.0, 2), round(s.rows / $steps.0, 1), round(s.ms::numeric / $steps, 2))
    FROM (SELECT SUM(calls) AS calls, SUM(rows) AS rows, SUM(total_exec_time) AS ms FROM pg_stat_statements WHERE $mine) s,
         (SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()) d, pg_stat_wal w"
  echo "top statements by time (ms per step, calls per step, statement):" >&2
  psql_q "SELECT round(total_exec_time::numeric / $steps, 3) || E'\t' || round(calls / $steps.0, 2) || E'\t' || left(regexp_replace(query, '\s+', ' ', 'g'), 140)
    FROM pg_stat_statements WHERE $mine ORDER BY total_exec_time DESC LIMIT 12" >&2
  echo "top statements by calls:" >&2
  psql_q "SELECT round(calls / $steps.0, 2) || E'\t' || left(regexp_replace(query, '\s+', ' ', 'g'), 140)
    FROM pg_stat_statements WHERE $mine ORDER BY calls DESC LIMIT 20" >&2
}

# CPU seconds of the machine (all processes: Tidegate's, their commands', PostgreSQL's), from
# /proc/stat, and of each Tidegate process with the commands it ran (`cpu_of PID`), so that the
# figure says what the work cost and where.
machine_cpu() { awk '/^cpu /{printf "%.2f", ($2+$3+$4+$7+$8)/100}' /proc/stat; }
cpu_of() { awk '{printf "%.2f", ($14+$15+$16+$17)/100}' "/proc/$1/stat" 2>/dev/null || echo "?"; }

# Attempts per worker, as `name:count,...`: a cluster benchmark shows whether the claims spread.
per_worker() {
  in_schema "$1" "SELECT string_agg(worker || ':' || n, ',' ORDER BY worker) FROM (SELECT worker, COUNT(*) AS n FROM attempts GROUP BY worker) w"
}

case "$MODE" in
w)
  N=${2:-200}
  REPEATS=${3:-3}
  LAST=$(date -u -d "2024-01-01 + $((N - 1)) days" +%F)
  times=()
  for _ in $(seq 1 "$REPEATS"); do
    schema=$(new_schema)
    # W_LAKE=folder puts the lake in a local folder, to tell the store's share from the S3 server's.
    if [ "${W_LAKE:-s3}" = folder ]; then lake=$(mktemp -d)/lake; else lake="s3://$S3_BUCKET/bench-w-$schema"; fi
    export TIDEGATE_STATE TIDEGATE_LAKE
    TIDEGATE_STATE=$(schema_url "$schema") TIDEGATE_LAKE=$lake
    tmp=$(mktemp -d)
    for m in scheduler one two; do
      mkdir -p "$tmp/$m"
      {
        printf '[project]\nname = "bench_w"\n'
        # The two workers' 16 slots, not the default pool's 4, bound what runs at once.
        printf '[pools.default]\nslots = 16\n'
        for d in raw mid out; do
          printf '[datasets.%s]\npartitioning = { grain = "day", start = "2024-01-01" }\nwrite = { mode = "replace" }\ncolumns = [{ name = "x", type = "int64" }]\n' "$d"
        done
        printf '[tasks.extract]\ncommand = ["true"]\noutputs = ["raw"]\n'
        printf '[tasks.transform]\ncommand = ["true"]\ninputs = ["raw"]\noutputs = ["mid"]\n'
        printf '[tasks.load]\ncommand = ["true"]\ninputs = ["mid"]\noutputs = ["out"]\n'
      } > "$tmp/$m/tidegate.toml"
    done
    # S3_COUNT=1: each role reaches the S3 server through a socat relay of its own that logs the
    # traffic, so the requests per task are counted per role (the relays cost some CPU: time the
    # runs without it).
    declare -A endpoint=([scheduler]=$AWS_ENDPOINT_URL [one]=$AWS_ENDPOINT_URL [two]=$AWS_ENDPOINT_URL)
    if [ "${S3_COUNT:-0}" = 1 ] && [ "${W_LAKE:-s3}" != folder ]; then
      target=${AWS_ENDPOINT_URL#http://}
      port=5190
      for m in scheduler one two; do
        port=$((port + 1))
        socat -v "TCP-LISTEN:$port,fork,reuseaddr,bind=127.0.0.1" "TCP:$target" 2> "$tmp/$m.s3" & PIDS+=($!)
        endpoint[$m]=http://127.0.0.1:$port
      done
      sleep 0.5
    fi
    AWS_ENDPOINT_URL=${endpoint[scheduler]} "$BIN" -C "$tmp/scheduler" serve --workers 0 --tick-every-s 60 2> "$tmp/serve.log" & PIDS+=($!)
    for w in one two; do
      AWS_ENDPOINT_URL=${endpoint[$w]} "$BIN" -C "$tmp/$w" worker --name "$w" --slots 8 --work-dir "$tmp/$w/work" 2> "$tmp/$w.log" & PIDS+=($!)
    done
    until [ "$(in_schema "$schema" "SELECT COUNT(*) FROM workers" 2>/dev/null || echo 0)" -ge 2 ]; do sleep 0.1; done
    sleep 1
    profile_reset
    start=$(now)
    "$BIN" -C "$tmp/scheduler" submit load --from 2024-01-01 --to "$LAST" > /dev/null
    wait_drained "$schema" 600 $((3 * N))
    end=$(now)
    times+=("$(echo "$end - $start" | bc -l)")
    profile_report $((3 * N))
    dups=$(in_schema "$schema" "SELECT COUNT(*) FROM (SELECT step_id FROM journal WHERE kind = 'published' GROUP BY step_id HAVING COUNT(*) > 1) d")
    echo "attempts per worker: $(per_worker "$schema")" >&2
    if [ -f "$tmp/scheduler.s3" ]; then
      for m in scheduler one two; do
        # Request lines of the traffic towards the server, by method and by the object's kind.
        echo "S3 requests of $m per task: $(grep -aoE '^(GET|HEAD|PUT|POST|DELETE) [^ ]+ HTTP/1\.1' "$tmp/$m.s3" | sed -E 's/ HTTP\/1\.1$//' | sed -E 's/\?.*//; s#^([A-Z]+) .*(_delta_log/[0-9]+\.json|_delta_log/_last_checkpoint|_delta_log/[0-9.]+checkpoint[^/]*|_tidegate/[a-z]+|\.parquet)$#\1 \2#; s#_delta_log/[0-9]+\.json#commit#; s#^([A-Z]+) /[^ ]*$#\1 listing-or-other#' | sort | uniq -c | awk -v n=$((3 * N)) '{printf "%s %s %.2f, ", $2, $3, $1 / n}')" >&2
      done
    fi
    [ "$dups" = 0 ] || { echo "$dups steps published twice" >&2; exit 1; }
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait "${PIDS[@]}" 2>/dev/null || true
    PIDS=()
    psql_q "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE" > /dev/null
    rm -rf "$tmp"
  done
  t=$(printf '%s\n' "${times[@]}" | median)
  printf "RESULT system=tidegate-postgres-%s scheduler=1 workers=2x8 N=%s tasks=%s wall_s=%.3f tasks_per_s=%.1f runs=%s\n" \
    "${W_LAKE:-s3}" "$N" $((3 * N)) "$t" "$(echo "3 * $N / $t" | bc -l)" "${times[*]}"
  ;;
load)
  STEPS=${2:-100000}
  KILL=${3:-}
  WORKERS=${WORKERS:-4}
  SLOTS=${SLOTS:-4}
  TASKS=10
  DAYS=$((STEPS / TASKS))
  LAST=$(date -u -d "1990-01-01 + $((DAYS - 1)) days" +%F)
  schema=$(new_schema)
  tmp=$(mktemp -d)
  export TIDEGATE_STATE TIDEGATE_LAKE
  TIDEGATE_STATE=$(schema_url "$schema") TIDEGATE_LAKE=$tmp/lake
  WS=$(seq -f 'w%g' 1 "$WORKERS")
  for m in a b $WS; do
    mkdir -p "$tmp/$m"
    {
      printf '[project]\nname = "bench_load"\nlease_ttl_s = 10\nheartbeat_s = 2\n'
      # The cluster's slots, not the default pool's 4, bound what runs at once.
      printf '[pools.default]\nslots = %s\n' $((WORKERS * SLOTS))
      for t in $(seq 1 $TASKS); do
        printf '[datasets.d%s]\npartitioning = { grain = "day", start = "1990-01-01" }\nwrite = { mode = "replace" }\ncolumns = [{ name = "x", type = "int64" }]\n' "$t"
        printf '[tasks.t%s]\ncommand = ["true"]\noutputs = ["d%s"]\n' "$t" "$t"
      done
    } > "$tmp/$m/tidegate.toml"
  done
  "$BIN" -C "$tmp/a" serve --workers 0 --tick-every-s 60 2> "$tmp/a.log" & A=$!; PIDS+=($A)
  sleep 1
  "$BIN" -C "$tmp/b" serve --workers 0 --tick-every-s 60 2> "$tmp/b.log" & B=$!; PIDS+=($B)
  NAMES=(a b)
  for w in $WS; do
    "$BIN" -C "$tmp/$w" worker --name "$w" --slots "$SLOTS" --work-dir "$tmp/$w/work" 2> "$tmp/$w.log" & PIDS+=($!)
    NAMES+=("$w")
  done
  until [ "$(in_schema "$schema" "SELECT COUNT(*) FROM workers" 2>/dev/null || echo 0)" -ge "$WORKERS" ]; do sleep 0.1; done
  profile_reset
  cpu0=$(machine_cpu)
  declare -A proc0
  for i in "${!PIDS[@]}"; do proc0[$i]=$(cpu_of "${PIDS[$i]}"); done
  start=$(now)
  for t in $(seq 1 $TASKS); do
    "$BIN" -C "$tmp/a" submit "t$t" --from 1990-01-01 --to "$LAST" > /dev/null
  done
  submitted=$(now)
  killed=none
  if [ "$KILL" = kill ]; then
    wait_drained "$schema" 3600 $((STEPS / 2))
    # The active scheduler is the one whose pid is in the newest scheduler_acquired owner.
    owner=$(in_schema "$schema" "SELECT payload::json->>'owner' FROM journal WHERE kind = 'scheduler_acquired' ORDER BY seq DESC LIMIT 1")
    if [[ "$owner" == *"-$A-"* ]]; then killed=a; kill -9 "$A"; else killed=b; kill -9 "$B"; fi
    killed_at=$(now)
  fi
  wait_drained "$schema" 7200 "$STEPS"
  end=$(now)
  wall=$(echo "$end - $start" | bc -l)
  cpu_total=$(echo "$(machine_cpu) - $cpu0" | bc -l)
  cpu_procs=""
  for i in "${!PIDS[@]}"; do
    c=$(cpu_of "${PIDS[$i]}")
    [ "$c" = "?" ] || cpu_procs+="${NAMES[$i]}:$(printf '%.1f' "$(echo "$c - ${proc0[$i]}" | bc -l)"),"
  done
  printf 'CPU machine_s=%.1f machine_ms_per_step=%.2f busy=%.0f%% per_process_s=%s\n' "$cpu_total" \
    "$(echo "1000 * $cpu_total / $STEPS" | bc -l)" "$(echo "100 * $cpu_total / ($wall * $(nproc))" | bc -l)" "${cpu_procs%,}"
  profile_report "$STEPS"
  # Latencies, all from the journal's events (the attempts' `ended_at` is written at publication,
  # so it would measure publication to next claim):
  # - dispatch: each `staged` frees a slot somewhere in the cluster (the worker reported); paired
  #   in time order with the first `claimed` after it not yet paired, that is the slot's refill.
  #   Every step is ready from the submit on, so a claim waits only for a slot.
  # - slot wait: the same per worker (a worker's `staged` to its own next `claimed`).
  # - staged to published: per step.
  latency=$(in_schema "$schema" "COPY (SELECT a.worker, j.kind, j.at, j.step_id FROM journal j JOIN attempts a ON a.step_id = j.step_id AND a.worker IS NOT NULL WHERE j.kind IN ('staged', 'claimed', 'published')) TO STDOUT" | python3 -c '
import sys, bisect
from datetime import datetime
by, cluster, staged_at, published_at = {}, {"staged": [], "claimed": []}, {}, {}
for line in sys.stdin:
    w, kind, at, step = line.rstrip("\n").split("\t")
    t = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
    if kind == "published":
        published_at[step] = t
        continue
    if kind == "staged":
        staged_at[step] = t
    by.setdefault(w, {"staged": [], "claimed": []})[kind].append(t)
    cluster[kind].append(t)
def refills(ev):
    # Pair the k-th staged with the first claim after it not yet paired: the slot it freed.
    staged, claimed = sorted(ev["staged"]), sorted(ev["claimed"])
    out, j = [], 0
    for e in staged:
        j = max(j, bisect.bisect_left(claimed, e))
        if j < len(claimed):
            out.append(claimed[j] - e)
            j += 1
    return out
def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))] * 1000 if xs else float("nan")
slot = [g for ev in by.values() for g in refills(ev)]
dispatch = refills(cluster)
publish = [published_at[s] - staged_at[s] for s in staged_at if s in published_at]
print("%.1f %.1f %.1f %.1f %d %.1f %.1f" % (q(dispatch, .5), q(dispatch, .99), q(slot, .5), q(slot, .99), len(slot), q(publish, .5), q(publish, .99)))
')
  read -r d50 d99 p50 p99 n_gaps pub50 pub99 <<< "$latency"
  dup_published=$(in_schema "$schema" "SELECT COUNT(*) FROM (SELECT step_id FROM journal WHERE kind = 'published' GROUP BY step_id HAVING COUNT(*) > 1) d")
  dup_commits=$(python3 - "$tmp/lake" <<'EOF'
import json, os, sys, collections
lake = sys.argv[1]
dups = 0
for table in os.listdir(lake):
    log = os.path.join(lake, table, "_delta_log")
    if not os.path.isdir(log):
        continue
    counts = collections.Counter()
    for name in os.listdir(log):
        if name.endswith(".json") and not name.startswith("_"):
            with open(os.path.join(log, name)) as f:
                for line in f:
                    app = json.loads(line).get("txn", {}).get("appId")
                    if app:
                        counts[app] += 1
    dups += sum(1 for n in counts.values() if n > 1)
print(dups)
EOF
)
  commits=$(find "$tmp/lake" -path '*_delta_log/*.json' | wc -l)
  printf 'RESULT system=tidegate-postgres schedulers=2 workers=%sx%s steps=%s killed=%s wall_s=%.1f steps_per_s=%.1f submit_s=%.1f dispatch_p50_ms=%s dispatch_p99_ms=%s slot_wait_p50_ms=%s slot_wait_p99_ms=%s slots_measured=%s staged_to_published_p50_ms=%s staged_to_published_p99_ms=%s attempts_per_worker=%s dup_published=%s dup_commits=%s delta_commits=%s\n' \
    "$WORKERS" "$SLOTS" "$STEPS" "$killed" "$wall" "$(echo "$STEPS / $wall" | bc -l)" "$(echo "$submitted - $start" | bc -l)" "$d50" "$d99" "$p50" "$p99" "$n_gaps" "$pub50" "$pub99" "$(per_worker "$schema")" "$dup_published" "$dup_commits" "$commits"
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
  psql_q "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE" > /dev/null
  rm -rf "$tmp"
  ;;
*)
  echo "usage: $0 w N [REPEATS] | load STEPS [kill]" >&2
  exit 2
  ;;
esac
