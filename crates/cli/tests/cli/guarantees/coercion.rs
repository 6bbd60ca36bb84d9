//! Published data holds what the task wrote (issue 31, items 2 and 13b). A command task's JSON
//! line `{"id": 7.9}` was published as 7 in an `int64` column; a CSV header that renamed `id` to
//! `ID` (no declared columns) failed only at publication, with "internal error: ... Duplicate field
//! name (case-insensitive)". Each must fail its step at staging, once (the failure is the data's,
//! so it is not retried), naming the file, the column and what does not fit, and publish nothing.
//! On SQLite and a folder, and on PostgreSQL and S3 (`cli_shared`).

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{latest_version, ok, table, tidegate};

/// `rows` declares an int64 `id`; `events` declares nothing (its first data is its schema). Each
/// task copies the workspace's `out.jsonl` or `out.csv` into its output, retried were it transient.
const SPEC: &str = r#"
[project]
name = "coercion"

[datasets.rows]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64", nullable = false }]

[tasks.produce]
command = ["sh", "-c", "cp out.jsonl \"$TIDEGATE_OUTPUT_DIR/out.jsonl\""]
outputs = ["rows"]
retry = { attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }

[datasets.events]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.record]
command = ["sh", "-c", "cp out.csv \"$TIDEGATE_OUTPUT_DIR/out.csv\""]
outputs = ["events"]
retry = { attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }
"#;

/// Runs `target` for `day` and returns the run's report.
fn run(dir: &Path, target: &str, day: &str) -> Value {
    let out = tidegate(dir).args(["run", target, "--partition", day, "--json"]).output().expect("runs");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", String::from_utf8_lossy(&out.stderr)))
}

/// The journaled reasons of run `run_id`'s failed attempts.
fn failures(dir: &Path, run_id: &str) -> Vec<String> {
    let history: Value = serde_json::from_str(&ok(dir, &["history", run_id, "--json"])).expect("history JSON");
    let happened = history["happened"].as_array().cloned().unwrap_or_default();
    let failed = happened.iter().filter(|e| e["kind"] == "attempt_failed");
    failed.map(|e| e["reason"].as_str().unwrap_or_default().to_owned()).collect()
}

/// Runs `target` for `day` expecting one failed attempt whose reason says all of `says` and
/// nothing of a bug, with `dataset`'s table unchanged.
fn assert_refused(dir: &Path, target: &str, day: &str, dataset: &str, says: &[&str]) {
    let before = latest_version(&table(dir, dataset));
    let report = run(dir, target, day);
    assert_eq!(
        (report["summary"]["failed"].as_u64(), report["summary"]["retried"].as_u64()),
        (Some(1), Some(0)),
        "{report}"
    );
    let reasons = failures(dir, report["run_id"].as_str().expect("a run id"));
    assert_eq!(reasons.len(), 1, "one attempt: {reasons:?}");
    let reason = &reasons[0];
    for said in says {
        assert!(reason.contains(said), "the reason does not say {said:?}: {reason}");
    }
    assert!(!reason.to_lowercase().contains("internal error"), "{reason}");
    assert_eq!(latest_version(&table(dir, dataset)), before, "nothing is published");
}

/// The ids `dataset` holds for `day`, as `tidegate read` shows them.
fn ids(dir: &Path, dataset: &str, day: &str) -> Vec<Value> {
    let rows: Value = serde_json::from_str(&ok(dir, &["read", dataset, "--partition", day, "--json"])).expect("rows");
    rows.as_array().expect("an array").iter().map(|r| r["id"].clone()).collect()
}

#[test]
fn a_float_with_a_fraction_is_refused_for_an_int64_column_and_nothing_is_published() {
    let dir = TestWorkspace::new(SPEC);
    let out = dir.path().join("out.jsonl");
    std::fs::write(&out, "{\"id\": 7}\n{\"id\": 8.0}\n").expect("out.jsonl");
    run(dir.path(), "produce", "2024-01-01");
    // 8.0 is the whole number 8: a conversion that loses nothing still works.
    assert_eq!(ids(dir.path(), "rows", "2024-01-01"), [7, 8]);

    std::fs::write(&out, "{\"id\": 7}\n{\"id\": 7.9}\n").expect("out.jsonl");
    let says = ["out.jsonl", "row 2", "column \"id\"", "7.9", "int64", "not a whole number"];
    assert_refused(dir.path(), "produce", "2024-01-01", "rows", &says);
    assert_eq!(ids(dir.path(), "rows", "2024-01-01"), [7, 8], "the published rows are the earlier ones");
}

#[test]
fn a_header_that_renames_a_column_by_case_is_refused_at_staging() {
    let dir = TestWorkspace::new(SPEC);
    let out = dir.path().join("out.csv");
    std::fs::write(&out, "id,v\n1,a\n").expect("out.csv");
    run(dir.path(), "record", "2024-01-01");
    assert_eq!(ids(dir.path(), "events", "2024-01-01"), [1]);

    std::fs::write(&out, "ID,v\n2,b\n").expect("out.csv");
    let says = ["out.csv", "column \"ID\"", "the table's column \"id\"", "only in case"];
    assert_refused(dir.path(), "record", "2024-01-02", "events", &says);
    assert_eq!(ids(dir.path(), "events", "2024-01-01"), [1]);
}
