//! Commands at their edges: `init` beside a user's files, a journal whose entries cannot be read,
//! an idempotency key replayed with other flags, a closed pipe, ranges and reasons that make no
//! sense, two `run`s on a new workspace, and a journal that records decisions rather than noise.

use std::io::Read as _;
use std::path::Path;
use std::process::{Output, Stdio};

use crate::common::{ok, tidegate};

fn run(dir: &Path, args: &[&str]) -> Output {
    tidegate(dir).args(args).output().expect("tidegate runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A workspace made by `tidegate init`.
fn example() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    ok(dir.path(), &["init", "."]);
    dir
}

#[test]
fn init_never_overwrites_a_users_files_and_names_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ws = dir.path();
    std::fs::create_dir_all(ws.join("tasks")).expect("tasks folder");
    std::fs::write(ws.join(".gitignore"), "target/\n").expect("gitignore");
    std::fs::write(ws.join("tasks/clean_events.py"), "print('my own script')\n").expect("script");
    let out = run(ws, &["init", "."]);
    assert!(!out.status.success(), "init must refuse: {}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("tasks/clean_events.py"), "names the file that exists: {err}");
    assert_eq!(std::fs::read_to_string(ws.join(".gitignore")).expect("read"), "target/\n");
    assert_eq!(std::fs::read_to_string(ws.join("tasks/clean_events.py")).expect("read"), "print('my own script')\n");
    assert!(!ws.join("tidegate.toml").exists(), "nothing is written when init refuses");
}

#[test]
fn init_beside_an_existing_gitignore_keeps_it_as_it_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ws = dir.path();
    std::fs::write(ws.join(".gitignore"), "target/\n").expect("gitignore");
    let out = run(ws, &["init", "."]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(ws.join(".gitignore")).expect("read"), "target/\n");
    assert!(stdout(&out).contains(".gitignore"), "says what it did not write: {}", stdout(&out));
    assert!(ws.join("tidegate.toml").exists());
    // A second init refuses and names every file that exists, overwriting none.
    let again = run(ws, &["init", ".", "--force"]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("tidegate.toml"), "{}", stderr(&again));
}

/// Replaces one column of one journal entry the way someone with write access to the file can:
/// drop the append-only triggers, then update.
fn tamper(ws: &Path, seq: i64, column: &str, value: &str) {
    let db = crate::common::state(ws);
    db.drop_journal_guard();
    db.execute(&format!("UPDATE journal SET {column} = ?1 WHERE seq = {seq}"), &[value]);
}

#[test]
fn an_unreadable_journal_entry_is_reported_as_tampering_with_its_number() {
    for (column, value) in [("payload", "{not json"), ("at", "yesterday"), ("seq", "three")] {
        let dir = example();
        let ws = dir.path();
        ok(ws, &["submit", "daily_stats", "--partition", "2024-01-02"]);
        tamper(ws, 3, column, value);
        for args in [&["history"][..], &["history", "--json"][..]] {
            let out = run(ws, args);
            assert_eq!(out.status.code(), Some(2), "{column}: {args:?} must say tampered: {}", stderr(&out));
            let text = format!("{}{}", stdout(&out), stderr(&out));
            assert!(text.contains("entry 3"), "{column}: names the entry: {text}");
        }
    }
}

#[test]
fn an_idempotency_key_replayed_with_other_scope_flags_is_refused() {
    let dir = example();
    let ws = dir.path();
    let base = ["submit", "daily_stats", "--partition", "2024-01-02", "--idempotency-key", "k"];
    ok(ws, &base);
    for extra in ["--only", "--downstream"] {
        let mut args = base.to_vec();
        args.push(extra);
        let out = run(ws, &args);
        assert!(!out.status.success(), "{extra}: the same key with another scope must not return the first run");
        assert!(stderr(&out).contains("scope"), "{extra}: names what differs: {}", stderr(&out));
    }
}

#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    let dir = example();
    let ws = dir.path();
    ok(ws, &["submit", "daily_stats", "--from", "2024-01-01", "--to", "2024-01-07"]);
    for args in [&["history"][..], &["plan", "daily_stats", "--from", "2024-01-01", "--to", "2024-01-07"][..]] {
        let mut child = tidegate(ws).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
        // The reader goes away before the command writes anything, as `| head -0` would.
        drop(child.stdout.take());
        let mut err = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
        let status = child.wait().expect("wait");
        assert_ne!(status.code(), Some(101), "{args:?} panicked: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} says nothing on a closed pipe: {err}");
    }
}

#[test]
fn a_reversed_range_is_explained_once() {
    let dir = example();
    let out = run(dir.path(), &["plan", "daily_stats", "--from", "2024-01-05", "--to", "2024-01-01"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.matches("is after").count(), 1, "said once: {err}");
}

#[test]
fn a_range_starting_before_the_dataset_is_refused_not_clipped() {
    let dir = example();
    let out = run(dir.path(), &["plan", "daily_stats", "--from", "2023-12-30", "--to", "2024-01-02", "--json"]);
    assert!(!out.status.success(), "clipped silently: {}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("2023-12-30") && err.contains("2024-01-01"), "names both: {err}");
}

#[test]
fn an_empty_reason_is_refused() {
    let dir = example();
    let ws = dir.path();
    ok(ws, &["run", "daily_stats", "--partition", "2024-01-01"]);
    let plan = [
        "backfill",
        "plan",
        "daily_stats",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-01",
        "--reprocess",
        "all",
        "--reason",
    ];
    for reason in ["", "   "] {
        let mut args = plan.to_vec();
        args.push(reason);
        let out = run(ws, &args);
        assert!(!out.status.success(), "backfill plan with reason {reason:?} was accepted");
        assert!(stderr(&out).contains("--reason"), "{}", stderr(&out));
        let out = run(ws, &["rollback", "daily_stats", "--reason", reason]);
        assert!(!out.status.success(), "rollback with reason {reason:?} was accepted");
        assert!(stderr(&out).contains("--reason"), "{}", stderr(&out));
    }
}

#[test]
fn two_runs_started_together_on_a_new_workspace_both_succeed() {
    for _ in 0..4 {
        let dir = example();
        let ws = dir.path();
        let args = ["run", "daily_stats", "--partition", "2024-01-01"];
        let a = tidegate(ws).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
        let b = tidegate(ws).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
        for child in [a, b] {
            let out = child.wait_with_output().expect("wait");
            assert!(out.status.success(), "{}", stderr(&out));
        }
    }
}

#[test]
fn the_downstream_of_one_partition_is_the_partitions_that_read_it() {
    let dir = example();
    let out = run(dir.path(), &["plan", "clean_events", "--partition", "2024-01-03", "--downstream", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let steps = plan["steps"].as_array().expect("steps");
    let names: Vec<&str> = steps.iter().filter_map(|s| s["name"].as_str()).collect();
    // events@2024-01-03 is read by daily_stats of that day and by the 7-day windows that cover it.
    assert!(names.contains(&"clean_events@2024-01-03"), "{names:?}");
    assert!(names.contains(&"daily_stats@2024-01-03"), "{names:?}");
    let windows: Vec<&&str> = names.iter().filter(|n| n.starts_with("user_counts@")).collect();
    assert_eq!(windows.len(), 7, "the windows ending 2024-01-03..2024-01-09 read it: {names:?}");
    assert!(steps.len() < 20, "{} steps", steps.len());
}

#[test]
fn a_rollback_rerun_after_a_crash_records_the_first_instead_of_undoing_it() {
    use crate::common::{abort_at, latest_version, table};
    let dir = example();
    let ws = dir.path();
    for day in ["2024-01-01", "2024-01-02"] {
        ok(ws, &["run", "daily_stats", "--partition", day]);
    }
    let events = table(ws, "events");
    let before = latest_version(&events);
    let read = |ws: &Path| ok(ws, &["sql", "SELECT COUNT(*) AS n FROM events", "--json"]);
    let published = read(ws);
    // Killed between the restore commit and the store's record of it.
    abort_at(ws, "after-rollback-commit", &["rollback", "events", "--reason", "bad delivery"]);
    assert_eq!(latest_version(&events), before + 1, "the restore commit was made");
    let rolled_back = read(ws);
    assert_ne!(rolled_back, published, "the crashed rollback changed what readers see");
    // The lock of the killed process expires; the rerun waits for it, then finishes the same
    // undo (its release id is the run's): it records the crashed commit instead of rolling back
    // over it (which would restore the bad version).
    let out = run(ws, &["rollback", "events", "--reason", "bad delivery", "--lock-wait", "120", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["datasets"][0]["new_version"], before + 1, "{report}");
    assert_eq!(latest_version(&events), before + 1, "no second restore commit");
    assert_eq!(read(ws), rolled_back, "readers still see the rolled-back data");
    let (code, reconciled) = crate::common::json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "the store records the crashed rollback's commit: {reconciled}");
}
