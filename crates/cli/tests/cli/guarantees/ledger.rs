//! Issue 31, items 1 and 5: what readers see and what the journal says stay one story. A commit
//! changed after Tidegate wrote it stops every destructive command (it no longer says which files
//! are published), and a cancel finishes recording a publication that had already committed
//! instead of leaving its rows live outside the journal.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::*;

const SPEC: &str = r#"
[project]
name = "ledger_test"
lease_ttl_s = 3
heartbeat_s = 1

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.make]
command = ["sh", "-c", "printf 'id,v\n1,10\n2,20\n' > \"$TIDEGATE_OUTPUT_DIR/n.csv\""]
outputs = ["nums"]
"#;

/// The commit file of `version` under a table's folder.
fn commit_file(dataset: &str, version: u64) -> String {
    format!("{dataset}/_delta_log/{version:020}.json")
}

/// The data file paths the commit `version` of `dataset` adds.
fn added_paths(ws: &Path, dataset: &str, version: u64) -> Vec<String> {
    adds(&table(ws, dataset), version).iter().map(|a| a["path"].as_str().expect("a path").to_owned()).collect()
}

#[test]
fn a_commit_whose_add_line_was_removed_stops_reconcile_and_vacuum_and_nothing_is_deleted() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    for key in ["first", "second"] {
        ok(ws, &["run", "make", "--partition", "2024-01-01", "--idempotency-key", key, "--json"]);
    }
    let nums = table(ws, "nums");
    let second = latest_version(&nums);
    let published = added_paths(ws, "nums", second);
    assert_eq!(published.len(), 1, "the second publication adds one file");
    // Someone deletes the `add` line from the second commit: the file looks unreferenced.
    let rel = commit_file("nums", second);
    let text = backend::lake_file(ws, &rel).expect("the commit file");
    let kept: Vec<&str> = text.lines().filter(|l| !l.starts_with("{\"add\"")).collect();
    assert_eq!(kept.len() + 1, text.lines().count(), "one add line removed");
    backend::write_lake_file(ws, &rel, format!("{}\n", kept.join("\n")).as_bytes());

    for command in [&["reconcile", "--json"][..], &["vacuum", "--retain-releases", "1"][..]] {
        let out = tidegate(ws).args(command).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "tidegate {command:?} must stop at the altered commit:\n{stderr}");
        assert!(stderr.contains(&format!("{second:020}.json")), "it names the commit: {stderr}");
        assert!(stderr.contains("changed since Tidegate wrote it"), "it says what is wrong: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("internal error"), "{stderr}");
        let path = format!("nums/{}", published[0]);
        assert!(backend::lake_file_exists(ws, &path), "{command:?} deleted the only data file of a publication");
    }
}

#[test]
fn a_release_whose_commit_no_longer_names_it_is_reported_and_holds_its_dataset() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    ok(ws, &["run", "make", "--partition", "2024-01-01", "--idempotency-key", "first", "--json"]);
    let version = latest_version(&table(ws, "nums"));
    // The commit's metadata is rewritten by hand to name another release (its file actions
    // untouched): the store's release is no longer in the log.
    let rel = commit_file("nums", version);
    let text = backend::lake_file(ws, &rel).expect("the commit file");
    let release = release_of(&table(ws, "nums"), version);
    backend::write_lake_file(ws, &rel, text.replace(&release, "rel-someone-else").as_bytes());

    let (code, report) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 2, "a difference between the store and the lake: {report}");
    let mismatched = report["mismatched_releases"].as_array().expect("a list");
    assert_eq!(mismatched.len(), 1, "{report}");
    assert_eq!(mismatched[0]["release_id"], Value::from(release.as_str()));
    assert_eq!(mismatched[0]["found"], serde_json::json!(["rel-someone-else"]));
}

#[test]
fn cancel_after_a_crash_between_commit_and_record_records_the_publication() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    abort_at(ws, "after-commit", &["run", "make", "--partition", "2024-01-01", "--json"]);
    let nums = table(ws, "nums");
    let committed = latest_version(&nums);
    assert_eq!(commits_per_app_id(&nums).len(), 1, "the crash came after the Delta commit");
    let run_id = state(ws).texts("SELECT id FROM runs", &[])[0].clone();
    assert_eq!(state(ws).int("SELECT count(*) FROM releases", &[]), 0, "and before the store's record");

    let (code, cancelled) = json(ws, &["cancel", &run_id, "--reason", "stop it", "--json"]);
    assert_eq!(code, 0, "{cancelled}");
    let published = cancelled["published"].as_array().expect("the steps whose publication was finished");
    assert_eq!(published.len(), 1, "{cancelled}");
    assert_eq!(latest_version(&table(ws, "nums")), committed, "recording made no second commit");
    assert_eq!(state(ws).int("SELECT count(*) FROM releases", &[]), 1, "the publication is a release");

    // The store and the lake agree, the chain is intact, and the run can be undone as a unit.
    let (code, report) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{report}");
    let out = tidegate(ws).args(["history", &run_id]).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    ok(ws, &["rollback", "--run", &run_id, "--reason", "undo the cancelled run"]);
    let rows = ok(ws, &["sql", "SELECT count(*) AS n FROM nums", "--json"]);
    assert!(rows.contains("\"n\":0"), "the undo removed the cancelled run's rows: {rows}");
}

#[test]
fn a_cancel_between_a_publications_check_and_its_record_takes_the_commit_back() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    // The run's publication pauses with its step validated and its commit about to be made.
    let mut run = tidegate(ws)
        .env("TIDEGATE_FAILPOINT", "pause:before-commit")
        .env("TIDEGATE_FAILPOINT_DIR", ws)
        .args(["run", "make", "--partition", "2024-01-01", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn run");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !ws.join("before-commit.paused").exists() {
        assert!(run.try_wait().expect("ours").is_none(), "the run ended before its commit");
        assert!(std::time::Instant::now() < give_up, "the run never reached its commit");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let run_id = state(ws).texts("SELECT id FROM runs", &[])[0].clone();
    let (code, cancelled) = json(ws, &["cancel", &run_id, "--reason", "stop it", "--json"]);
    assert_eq!(code, 0, "{cancelled}");
    assert_eq!(cancelled["published"], serde_json::json!([]), "nothing had committed yet: {cancelled}");
    assert_eq!(cancelled["n_steps_cancelled"], 1, "{cancelled}");

    // The paused publication commits, its record is refused (the step is cancelled), and the
    // engine takes the commit back instead of leaving rows live outside the journal.
    std::fs::write(ws.join("before-commit.resume"), "").expect("resume file");
    let out = run.wait_with_output().expect("the run ends");
    let rows = ok(ws, &["sql", "SELECT count(*) AS n FROM nums", "--json"]);
    assert!(
        rows.contains("\"n\":0"),
        "the cancelled step's rows are not published: {rows}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let withdrawn = state(ws).int("SELECT count(*) FROM journal WHERE kind = 'publication_withdrawn'", &[]);
    assert_eq!(withdrawn, 1, "the journal says the commit was taken back");
    let (code, report) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "the store and the lake agree: {report}");
}
