#!/usr/bin/env bash
# Workload W(N) of ../shared/peers, on Tidegate: a backfill of N daily partitions of three chained
# no-op command tasks (extract -> transform -> load), with a same-run baseline of xargs -P2 running
# the same 3N commands. Prints one RESULT line per measurement, the median of REPEATS runs.
#
#   scripts/bench-w.sh N [true|python] [REPEATS]
#
# Needs a release build: cargo build --release --locked
set -euo pipefail
N=${1:-30}
KIND=${2:-true}
REPEATS=${3:-5}
BIN=${TIDEGATE_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/tidegate}
case "$KIND" in
  true) ARGV='["true"]'; CMD=(true) ;;
  python) ARGV='["python3", "-c", "pass"]'; CMD=(python3 -c pass) ;;
  *) echo "KIND must be true or python" >&2; exit 2 ;;
esac
LAST=$(date -u -d "2024-01-01 + $((N - 1)) days" +%F)

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# Tasks that write no file publish an empty partition: the orchestration cost is what is measured.
spec() {
  cat <<EOF
[project]
name = "bench_w"
[pools.default]
slots = 16
EOF
  for d in raw mid out; do
    printf '[datasets.%s]\npartitioning = { grain = "day", start = "2024-01-01" }\nwrite = { mode = "replace" }\ncolumns = [{ name = "x", type = "int64" }]\n' "$d"
  done
  printf '[tasks.extract]\ncommand = %s\noutputs = ["raw"]\n' "$ARGV"
  printf '[tasks.transform]\ncommand = %s\ninputs = ["raw"]\noutputs = ["mid"]\n' "$ARGV"
  printf '[tasks.load]\ncommand = %s\ninputs = ["mid"]\noutputs = ["out"]\n' "$ARGV"
}

tg_times=()
xargs_times=()
for _ in $(seq 1 "$REPEATS"); do
  ws=$(mktemp -d)
  spec > "$ws/tidegate.toml"
  start=$(date +%s.%N)
  "$BIN" -C "$ws" run load --from 2024-01-01 --to "$LAST" --workers 16 --json > "$ws/result.json"
  end=$(date +%s.%N)
  tg_times+=("$(echo "$end - $start" | bc -l)")
  grep -q '"failed": 0' "$ws/result.json" || { echo "a tidegate run failed: $(cat "$ws/result.json")" >&2; exit 1; }
  rm -rf "$ws"

  start=$(date +%s.%N)
  seq 1 $((3 * N)) | xargs -P2 -I{} "${CMD[@]}"
  end=$(date +%s.%N)
  xargs_times+=("$(echo "$end - $start" | bc -l)")
done
tg=$(printf '%s\n' "${tg_times[@]}" | median)
xa=$(printf '%s\n' "${xargs_times[@]}" | median)
tasks=$((3 * N))
printf 'RESULT system=tidegate kind=%s N=%s tasks=%s wall_s=%.3f tasks_per_s=%.1f\n' "$KIND" "$N" "$tasks" "$tg" "$(echo "$tasks / $tg" | bc -l)"
printf 'RESULT system=xargs-P2 kind=%s N=%s tasks=%s wall_s=%.3f tasks_per_s=%.1f\n' "$KIND" "$N" "$tasks" "$xa" "$(echo "$tasks / $xa" | bc -l)"
