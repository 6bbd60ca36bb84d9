//! Deterministic crashes at the two dangerous points of publication (invariants 1, 2 and 11):
//! `TIDEGATE_FAILPOINT=after-stage` aborts once a step's output is staged and validated but not
//! committed, `after-commit` once the Delta commit is made but before the store records the
//! release. Each time, a rerun must finish the work with every step committed exactly once, no row
//! duplicated or lost, reconcile finding the store and the lake in agreement, and the journal
//! verifying with one `published` entry per step.

use std::collections::BTreeMap;

use crate::common::*;
use serde_json::Value;
use tidegate_testkit::TestWorkspace;

fn spec() -> String {
    format!("[project]\nname = \"failpoint_test\"\nlease_ttl_s = 3\nheartbeat_s = 1\n{EXTRACT_SUMMARIZE}")
}

/// One attempt at a time. A publication carries the steps validated since the last one (one
/// commit per dataset, one `txn` per step), so how many steps the crash catches in flight depends
/// on timing; the checks below hold for any grouping.
const RUN: &[&str] = &[
    "run",
    "summarize",
    "--from",
    "2024-01-01",
    "--to",
    "2024-01-03",
    "--idempotency-key",
    "fp",
    "--workers",
    "1",
    "--json",
];
/// Three days, two tasks.
const N_STEPS: usize = 6;
/// The failpoints fire at the third publication, when at least two steps are already published.
const NTH: usize = 3;

#[test]
fn a_crash_between_staging_and_commit_is_resumed_without_duplicates() {
    check("after-stage", false);
}

#[test]
fn a_crash_between_commit_and_record_is_resumed_without_duplicates() {
    check("after-commit", true);
}

/// Crashes `tidegate run` at `point` and reruns it; `committed` says whether the crash comes
/// after the crashed publication's Delta commits (which the store then does not know).
fn check(point: &str, committed: bool) {
    let dir = TestWorkspace::new(spec());
    let ws = dir.path();
    abort_at(ws, &format!("{point}@{NTH}"), RUN);

    // What the crash left: the releases of two publications or more, recorded, plus after a
    // commit the crashed publication's steps, committed but unrecorded.
    let n_commits: usize =
        ["raw", "summary"].iter().map(|d| commits_per_app_id(&table(ws, d)).values().sum::<usize>()).sum();
    let n_recorded = n_releases(ws);
    assert!(n_recorded >= NTH - 1, "{point}: {n_recorded} releases recorded before the crash");
    assert!(n_commits >= n_recorded, "{point}: every recorded release has its commit");
    let n_unrecorded = n_commits - n_recorded;
    assert_eq!(n_unrecorded > 0, committed, "{point}: {n_commits} step commits, {n_recorded} recorded");
    let (code, before) = json(ws, &["reconcile", "--json"]);
    let unknown = before["unknown_versions"].as_array().expect("list");
    // A commit the store does not know names its releases (several when steps shared it).
    let unknown_ids: Vec<&Value> =
        unknown.iter().flat_map(|v| v["release_ids"].as_array().expect("a list").iter()).collect();
    assert_eq!(unknown_ids.len(), n_unrecorded, "{point}: {before}");
    assert!(unknown_ids.iter().all(|r| r.as_str().is_some_and(|r| r.starts_with("rel-"))), "{before}");
    assert_eq!(code, if n_unrecorded == 0 { 0 } else { 2 }, "{point}: {before}");
    assert_eq!(before["missing_files"], Value::Array(vec![]), "{point}: staged output survives the crash");

    let (code, report) = json(ws, RUN);
    assert_eq!((code, &report["status"]), (0, &Value::from("succeeded")), "{point}: {report}");

    // Each step's identity is in exactly one commit, and every step is published.
    let mut app_ids = BTreeMap::new();
    for dataset in ["raw", "summary"] {
        for (app, n) in commits_per_app_id(&table(ws, dataset)) {
            assert_eq!(n, 1, "{point}: {dataset}: {app} was committed {n} times");
            app_ids.insert(app, n);
        }
    }
    assert_eq!(app_ids.len(), N_STEPS, "{point}: one commit per step");
    assert_eq!(n_releases(ws), N_STEPS, "{point}: one release per step");

    // No published row is duplicated or lost.
    let raw = ok(ws, &["sql", "SELECT tg_partition, id, day FROM raw ORDER BY 1, 2", "--csv"]);
    assert_eq!(
        raw,
        "tg_partition,id,day\n2024-01-01,1,2024-01-01\n2024-01-01,2,2024-01-01\n2024-01-02,1,2024-01-02\n\
         2024-01-02,2,2024-01-02\n2024-01-03,1,2024-01-03\n2024-01-03,2,2024-01-03\n",
        "{point}"
    );
    let summary = ok(ws, &["sql", "SELECT tg_partition, n FROM summary ORDER BY 1", "--csv"]);
    assert_eq!(summary, "tg_partition,n\n2024-01-01,2\n2024-01-02,2\n2024-01-03,2\n", "{point}");

    // Declared and observed agree; abandoned staging (attempts cut short) is gone after one pass.
    let (code, after) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{point}: {after}");
    for list in ["unknown_versions", "missing_versions", "missing_files"] {
        assert_eq!(after[list], Value::Array(vec![]), "{point}: {list}: {after}");
    }
    let (_, again) = json(ws, &["reconcile", "--json"]);
    assert_eq!(again["deleted"], Value::Array(vec![]), "{point}: {again}");
    // Every file left in the tables is one a commit references.
    let (_, vacuum) = json(ws, &["vacuum", "--dry-run", "--json"]);
    for dataset in vacuum["datasets"].as_array().expect("list") {
        assert_eq!(dataset["n_left_unpublished"], 0, "{point}: {dataset}");
        assert_eq!(dataset["deleted"], Value::Array(vec![]), "{point}: {dataset}");
    }

    // The journal verifies and says each step was published once.
    let (code, history) = json(ws, &["history", "--json", "--limit", "100000"]);
    assert_eq!(code, 0, "{point}: {history}");
    assert_eq!(history["chain"]["break_at"], Value::Null, "{point}");
    let mut published: BTreeMap<String, usize> = BTreeMap::new();
    for list in ["intended", "happened", "visible"] {
        for entry in history[list].as_array().expect("list") {
            if entry["kind"] == "published" {
                *published.entry(entry["step_id"].as_str().expect("a step").to_owned()).or_default() += 1;
            }
        }
    }
    assert_eq!(published.len(), N_STEPS, "{point}: {published:?}");
    assert!(published.values().all(|n| *n == 1), "{point}: {published:?}");
}

fn n_releases(ws: &std::path::Path) -> usize {
    let n = crate::common::state(ws).int("SELECT COUNT(*) FROM releases", &[]);
    usize::try_from(n).expect("small")
}
