//! Invariant 8's safe default, with a test clock (`tick --now`): after simulated downtime, catch-up
//! off runs only the newest interval and reports the rest as debt; catch-up on runs them all.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

fn spec(catchup: &str) -> String {
    format!(
        r#"
[project]
name = "catchup_test"

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.extract]
command = ["sh", "-c", "printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
schedule = "@daily"
catchup = {catchup}
"#
    )
}

fn tidegate(dir: &Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(args)
        .current_dir(dir)
        .env_remove("TIDEGATE_TOKEN")
        .output()
        .expect("runs");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

fn published(dir: &Path) -> Vec<String> {
    let rows = tidegate(dir, &["sql", "SELECT DISTINCT tg_partition AS p FROM raw ORDER BY p", "--json"]);
    rows.as_array().expect("rows").iter().filter_map(|r| r["p"].as_str().map(str::to_owned)).collect()
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_array().expect("array").iter().filter_map(Value::as_str).collect()
}

/// Days 1-3 published, then the scheduler is down until 2024-01-08 00:05.
fn after_downtime(catchup: &str) -> (TestWorkspace, Value) {
    let dir = TestWorkspace::new(spec(catchup));
    tidegate(dir.path(), &["run", "extract", "--from", "2024-01-01", "--to", "2024-01-03", "--json"]);
    let tick = tidegate(dir.path(), &["tick", "--now", "2024-01-08T00:05:00Z", "--json"]);
    (dir, tick)
}

#[test]
fn catch_up_off_runs_only_the_newest_interval_and_reports_the_rest_as_debt() {
    let (dir, tick) = after_downtime("{ enabled = false }");
    let d = &tick["decisions"][0];
    assert_eq!(keys(&d["due"]), ["2024-01-04", "2024-01-05", "2024-01-06", "2024-01-07"]);
    assert_eq!(keys(&d["run"]), ["2024-01-07"]);
    assert_eq!(keys(&d["debt"]), ["2024-01-04", "2024-01-05", "2024-01-06"]);
    assert_eq!(published(dir.path()), ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-07"]);

    let status = tidegate(dir.path(), &["status", "--now", "2024-01-08T00:06:00Z", "--json"]);
    let missed = &status["debt"]["missed"][0];
    assert_eq!(missed["task"], "extract");
    assert_eq!(keys(&missed["debt"]), ["2024-01-04", "2024-01-05", "2024-01-06"], "{status}");

    // Ticking again at the same instant creates nothing new.
    let again = tidegate(dir.path(), &["tick", "--now", "2024-01-08T00:05:00Z", "--json"]);
    assert_eq!(again["runs"].as_array().map(Vec::len), Some(0), "{again}");
}

#[test]
fn catch_up_on_runs_every_missed_interval_below_live_work() {
    let (dir, tick) = after_downtime("{ enabled = true, max_active_runs = 2 }");
    let d = &tick["decisions"][0];
    assert_eq!(keys(&d["run"]), ["2024-01-07", "2024-01-06", "2024-01-05", "2024-01-04"], "newest first");
    assert!(d["debt"].as_array().is_some_and(Vec::is_empty));
    assert_eq!(
        tick["runs"].as_array().map(Vec::len),
        Some(2),
        "a live run for the newest, a catch-up run for the rest"
    );
    assert_eq!(published(dir.path()).len(), 7);
    let status = tidegate(dir.path(), &["status", "--json"]);
    let triggers: Vec<&str> =
        status["runs"].as_array().expect("runs").iter().filter_map(|r| r["request"]["trigger"].as_str()).collect();
    assert!(triggers.contains(&"catchup") && triggers.contains(&"schedule"), "{triggers:?}");
}

#[test]
fn catch_up_skips_intervals_a_wider_run_already_covers_and_journals_them_as_superseded() {
    let dir = TestWorkspace::new(spec("{ enabled = true, max_active_runs = 2 }"));
    tidegate(dir.path(), &["run", "extract", "--partition", "2024-01-01", "--json"]);
    // An operator queued a wider manual run over part of the downtime before the scheduler came back.
    let manual = tidegate(dir.path(), &["submit", "extract", "--from", "2024-01-02", "--to", "2024-01-04", "--json"]);
    let manual_id = manual["run"]["id"].as_str().expect("run id").to_owned();

    let tick = tidegate(dir.path(), &["tick", "--now", "2024-01-07T00:05:00Z", "--json"]);
    let superseded: Vec<(&str, &str)> = tick["superseded"]
        .as_array()
        .expect("superseded")
        .iter()
        .map(|s| (s["partition"].as_str().unwrap_or_default(), s["by_run"].as_str().unwrap_or_default()))
        .collect();
    let by = manual_id.as_str();
    assert_eq!(superseded, [("2024-01-04", by), ("2024-01-03", by), ("2024-01-02", by)], "{tick}");

    // Every day published once: the covered ones by the manual run, the rest by the tick's runs.
    assert_eq!(
        published(dir.path()),
        ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-06"]
    );
    let db = rusqlite::Connection::open(dir.path().join(".tidegate/state.db")).expect("db");
    let n: i64 = db
        .query_row("SELECT COUNT(*) FROM journal WHERE kind = 'interval_superseded' AND run_id = ?1", [by], |r| {
            r.get(0)
        })
        .expect("count");
    assert_eq!(n, 3);
    let twice: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM (SELECT partition_key FROM steps WHERE status = 'published' GROUP BY partition_key HAVING COUNT(*) > 1)",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(twice, 0, "no interval was built twice");
}
