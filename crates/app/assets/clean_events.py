"""Example command task: cleans one day of raw events.

Tidegate runs this from argv (never through a shell) with the step's context in the environment:
  TIDEGATE_PARTITION       the partition key, e.g. 2024-01-05
  TIDEGATE_INTERVAL_START  the interval start, RFC 3339, e.g. 2024-01-05T00:00:00Z
  TIDEGATE_INTERVAL_END    the interval end (exclusive)
  TIDEGATE_OUTPUT_DIR      where to leave Parquet, CSV or JSON-lines files for staging
  TIDEGATE_ATTEMPT         1 for the first attempt, 2 for the first retry, ...
Exit codes: 0 success, 75 try again later (transient), 65 bad data (not retried).
"""

import csv
import hashlib
import os
import sys


def main() -> int:
    day = os.environ.get("TIDEGATE_PARTITION")
    out_dir = os.environ.get("TIDEGATE_OUTPUT_DIR")
    if not day or not out_dir:
        print("run me through `tidegate run`: TIDEGATE_PARTITION and TIDEGATE_OUTPUT_DIR are not set", file=sys.stderr)
        return 78
    rows = []
    # Deterministic sample data: the same day always yields the same events.
    for i in range(24):
        digest = hashlib.blake2b(f"{day}/{i}".encode(), digest_size=8).digest()
        user = f"user_{digest[0] % 7}"
        event_type = ["view", "click", "purchase"][digest[1] % 3]
        rows.append({"event_id": f"{day}-{i:03d}", "user_id": user, "event_type": event_type,
                     "ts": f"{day}T{i:02d}:00:00Z"})
    with open(os.path.join(out_dir, "events.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"cleaned {len(rows)} events for {day}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
