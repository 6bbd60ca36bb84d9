//! A run is a unit (issue 21, item 5): `run` executes its own run, `cancel` stops one, and
//! `rollback` undoes a whole run or release, saying first what it will restore. Failures are
//! visible (item 6): `run` prints each failure's reason and log, and `logs` shows what attempts
//! printed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;
use tidegate_testkit::delta::commits_per_app_id;

use crate::common::{EXTRACT_SUMMARIZE, json, ok, table, tidegate};

fn workspace() -> TestWorkspace {
    TestWorkspace::new(format!("[project]\nname = \"runs\"\n{EXTRACT_SUMMARIZE}"))
}

/// `SELECT COUNT(*)` of a published dataset.
fn count(ws: &Path, dataset: &str) -> u64 {
    let (code, rows) = json(ws, &["sql", &format!("SELECT COUNT(*) AS n FROM {dataset}"), "--json"]);
    assert_eq!(code, 0, "{rows}");
    rows[0]["n"].as_u64().expect("a count")
}

fn run_status(ws: &Path, run_id: &str) -> String {
    let (_, status) = json(ws, &["status", "--limit", "100", "--json"]);
    let runs = status["runs"].as_array().expect("runs");
    let run = runs.iter().find(|r| r["id"] == run_id).unwrap_or_else(|| panic!("run {run_id} in {status}"));
    run["status"].as_str().expect("status").to_owned()
}

#[test]
fn run_executes_its_own_run_and_leaves_the_queue_to_serve() {
    let dir = workspace();
    let ws = dir.path();
    // The README's order: submit, then run the same range. Each day is published once.
    let (_, queued) = json(ws, &["submit", "extract", "--from", "2024-01-01", "--to", "2024-01-03", "--json"]);
    let queued_id = queued["run"]["id"].as_str().expect("the queued run's id").to_owned();
    let (code, done) = json(ws, &["run", "extract", "--from", "2024-01-01", "--to", "2024-01-03", "--json"]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["summary"]["published"], 3, "{done}");
    assert_eq!(run_status(ws, &queued_id), "queued", "the queued run waits for serve");
    let once: Vec<usize> = commits_per_app_id(&table(ws, "raw")).into_values().collect();
    assert_eq!(once, [1, 1, 1], "each day published once");

    // Asked to, a run executes the queue too.
    let (code, both) = json(ws, &["run", "extract", "--partition", "2024-01-04", "--drain-queue", "--json"]);
    assert_eq!(code, 0, "{both}");
    assert_eq!(run_status(ws, &queued_id), "succeeded");
}

#[test]
fn cancel_stops_a_queued_run_and_refuses_what_it_cannot_cancel() {
    let dir = workspace();
    let ws = dir.path();
    let (_, queued) = json(ws, &["submit", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    let id = queued["run"]["id"].as_str().expect("id").to_owned();
    let (code, cancelled) = json(ws, &["cancel", &id, "--reason", "wrong range", "--json"]);
    assert_eq!(code, 0, "{cancelled}");
    assert_eq!(cancelled["n_steps_cancelled"], 4, "two days of extract and summarize: {cancelled}");
    assert_eq!(run_status(ws, &id), "cancelled");
    // A drain of everything does not run it.
    ok(ws, &["run", "extract", "--partition", "2024-01-09", "--drain-queue"]);
    assert_eq!(run_status(ws, &id), "cancelled");
    let again = tidegate(ws).args(["cancel", &id]).output().expect("runs");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already cancelled"), "{again:?}");
    let history = ok(ws, &["history", &id, "--json"]);
    assert!(history.contains("wrong range"), "the reason is journaled");
}

#[test]
fn rollback_undoes_a_whole_run_and_says_first_what_it_restores() {
    let dir = workspace();
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    let before = (count(ws, "raw"), count(ws, "summary"));
    // A second run over three days: one new, two republished.
    let second = ok(ws, &["run", "summarize", "--from", "2024-01-02", "--to", "2024-01-04", "--json"]);
    let second: Value = serde_json::from_str(&second).expect("json");
    let run_id = second["run_id"].as_str().expect("run id").to_owned();
    assert_eq!(count(ws, "raw"), 8);

    // The dry run names the run and every partition, and changes nothing.
    let plan = ok(ws, &["rollback", "summary", "--dry-run"]);
    assert!(plan.contains(&format!("Rolling back run {run_id}")), "{plan}");
    assert!(plan.contains("partitions 2024-01-02..2024-01-04 (3)"), "{plan}");
    assert!(plan.contains("Dry run: nothing was restored."), "{plan}");
    assert_eq!(count(ws, "raw"), 8);

    // The whole run, in every dataset it wrote, as one release.
    let (code, undone) = json(ws, &["rollback", "--run", &run_id, "--json"]);
    assert_eq!(code, 0, "{undone}");
    let datasets: Vec<&str> =
        undone["datasets"].as_array().expect("datasets").iter().map(|d| d["dataset"].as_str().expect("name")).collect();
    assert_eq!(datasets, ["summary", "raw"], "downstream first: {undone}");
    assert_eq!((count(ws, "raw"), count(ws, "summary")), before, "what readers saw before the run");
    let again = tidegate(ws).args(["rollback", "--run", &run_id]).output().expect("runs");
    assert!(String::from_utf8_lossy(&again.stderr).contains("was already rolled back"), "{again:?}");
    let (code, reconciled) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "the store records every rollback commit: {reconciled}");
}

#[test]
fn a_rollback_never_clobbers_a_partition_a_later_run_changed() {
    let dir = workspace();
    let ws = dir.path();
    ok(ws, &["run", "extract", "--partition", "2024-01-01"]);
    let first = ok(ws, &["run", "extract", "--from", "2024-01-02", "--to", "2024-01-03", "--json"]);
    let first: Value = serde_json::from_str(&first).expect("json");
    let first_id = first["run_id"].as_str().expect("id").to_owned();
    // A later run republishes one of the first run's days.
    ok(ws, &["run", "extract", "--partition", "2024-01-03"]);
    let out = tidegate(ws).args(["rollback", "--run", &first_id]).output().expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was changed after the unit by release"), "{err}");
    assert_eq!(count(ws, "raw"), 6, "nothing was restored");
    // Undo the later run first; then the first run's undo goes through.
    ok(ws, &["rollback", "raw"]);
    ok(ws, &["rollback", "raw"]);
    assert_eq!(count(ws, "raw"), 2, "only the first day is left");
}

#[test]
fn failures_are_printed_with_their_reason_and_log_and_logs_shows_them() {
    let spec = r#"
[project]
name = "failing"

[datasets.out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.flaky]
command = ["sh", "-c", "echo starting $TIDEGATE_PARTITION; echo 'the upstream API said no' >&2; exit 3"]
outputs = ["out"]
retry = { attempts = 2, backoff_base_ms = 10, backoff_max_ms = 20 }
"#;
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let out = tidegate(ws).args(["run", "flaky", "--partition", "2024-01-05"]).output().expect("runs");
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("flaky@2024-01-05 failed after"), "{stdout}");
    assert!(stdout.contains("the upstream API said no"), "the reason: {stdout}");
    assert!(stdout.contains("log: ") && stdout.contains(".stderr.log"), "the log: {stdout}");

    let logs = ok(ws, &["logs", "flaky", "2024-01-05"]);
    assert!(logs.contains("starting 2024-01-05"), "stdout shown: {logs}");
    assert!(logs.contains("the upstream API said no"), "stderr shown: {logs}");
    let (code, listed) = json(ws, &["logs", "flaky", "2024-01-05", "--json"]);
    assert_eq!(code, 0);
    let attempts: Vec<u64> =
        listed.as_array().expect("attempts").iter().map(|a| a["attempt"].as_u64().expect("n")).collect();
    assert!(!attempts.is_empty() && attempts.windows(2).all(|w| w[0] < w[1]), "{listed}");
    let only_stderr = ok(ws, &["logs", "flaky", "2024-01-05", "--attempt", "1", "--stderr"]);
    assert!(only_stderr.contains("the upstream API said no") && !only_stderr.contains("starting"), "{only_stderr}");
    let missing = tidegate(ws).args(["logs", "flaky", "2024-01-05", "--attempt", "9"]).output().expect("runs");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no attempt 9"), "{missing:?}");
}

#[test]
fn logs_follow_prints_output_as_the_attempt_writes_it() {
    let spec = r#"
[project]
name = "slow"

[datasets.out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

columns = [{ name = "x", type = "int64" }]

[tasks.slow]
command = ["sh", "-c", "echo first; sleep 2; echo second"]
outputs = ["out"]
"#;
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let running = tidegate(ws)
        .args(["run", "slow", "--partition", "2024-01-01"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Wait for the attempt's log to appear, then follow it.
    let logs_dir = ws.join(".tidegate/logs");
    for _ in 0..100 {
        if std::fs::read_dir(&logs_dir).is_ok_and(|mut d| d.next().is_some()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let followed = ok(ws, &["logs", "slow", "2024-01-01", "--stdout", "--follow"]);
    assert!(followed.contains("first") && followed.contains("second"), "{followed}");
    assert!(running.wait_with_output().expect("run finished").status.success());
}

#[test]
fn a_log_longer_than_logs_shows_ends_with_its_end_and_says_where_the_rest_is() {
    let spec = r#"
[project]
name = "chatty"

[datasets.out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.chatty]
command = ["sh", "-c", "yes 'a line of progress' | head -c 2200000; echo; echo 'THE REAL ERROR'; exit 3"]
outputs = ["out"]
"#;
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    assert!(
        !tidegate(ws).args(["run", "chatty", "--partition", "2024-01-01"]).output().expect("runs").status.success()
    );
    let logs = ok(ws, &["logs", "chatty", "2024-01-01", "--stdout"]);
    assert!(logs.contains("THE REAL ERROR"), "the end of the log, where the failure is, is shown");
    let flat = logs[..400.min(logs.len())].split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("(the last 1.0 MiB of 2.1 MiB; the whole log is /"), "{flat}");
    assert!(logs.len() < 1_200_000, "about 1 MiB shown, not the whole log");
}

/// A tidegate older than its store (another machine was upgraded first and migrated it) refuses
/// to run on it and says who must act, rather than writing rows whose meaning it does not know.
#[test]
fn a_tidegate_older_than_its_store_refuses_to_run_and_says_to_upgrade() {
    let dir = TestWorkspace::new(format!("[project]\nname = \"older\"\n{EXTRACT_SUMMARIZE}"));
    let ws = dir.path();
    ok(ws, &["run", "extract", "--partition", "2024-01-01"]);
    crate::common::state(ws).execute(
        "INSERT INTO schema_migrations (version, name, applied_at) \
         VALUES (9999, 'from_a_newer_tidegate', '2030-01-01T00:00:00.000Z')",
        &[],
    );
    for args in [&["status"][..], &["run", "extract", "--partition", "2024-01-02"]] {
        let out = tidegate(ws).args(args).output().expect("tidegate runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} ran on a newer store: {stderr}");
        assert!(stderr.contains("migrated by a newer Tidegate"), "{args:?}: {stderr}");
        assert!(stderr.contains("migration 9999 (from_a_newer_tidegate)") && stderr.contains("run the newer tidegate"));
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_eq!(commits_per_app_id(&table(ws, "raw")).len(), 1, "nothing more was published");
}
