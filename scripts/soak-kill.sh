#!/usr/bin/env bash
# Longer soak of the kill -9 test: runs the crash test (`cli` test binary, `crash::`) repeatedly (each run is 50 kills,
# with Python deltalake reading both tables throughout; each round prints how many reads it made,
# none of which may see a partition half written or doubled).
# Usage: scripts/soak-kill.sh [ROUNDS]   (default 20 rounds = 1,000 kills)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
for i in $(seq 1 "$rounds"); do
  echo "== round $i of $rounds"
  cargo test --quiet --workspace --test cli crash:: -- --nocapture
done
