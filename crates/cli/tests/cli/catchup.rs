//! Invariant 8's safe default, with a test clock (`tick --now`): after simulated downtime, catch-up
//! off runs only the newest interval and reports the rest as debt; catch-up on runs them all,
//! newest first and at most `max_active_runs` at once (read back from the journal of real
//! processes). A cron schedule decides when an interval is due: at its first fire time after the
//! interval ends, in the dataset's zone.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common;

/// The task's command: one row into its output.
const WRITE_ONE_ROW: &str = r#"["sh", "-c", "printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]"#;

fn spec(catchup: &str) -> String {
    spec_with(WRITE_ONE_ROW, "@daily", catchup)
}

fn spec_with(command: &str, schedule: &str, catchup: &str) -> String {
    format!(
        r#"
[project]
name = "catchup_test"

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.extract]
command = {command}
outputs = ["raw"]
schedule = "{schedule}"
catchup = {catchup}
"#
    )
}

fn tidegate(dir: &Path, args: &[&str]) -> Value {
    let out = common::tidegate(dir).args(args).output().expect("runs");
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
    let db = common::state(dir.path());
    let n = db.int("SELECT COUNT(*) FROM journal WHERE kind = 'interval_superseded' AND run_id = ?1", &[by]);
    assert_eq!(n, 3);
    let twice = db.int(
        "SELECT COUNT(*) FROM (SELECT partition_key FROM steps WHERE status = 'published' GROUP BY partition_key HAVING COUNT(*) > 1) AS twice",
        &[],
    );
    assert_eq!(twice, 0, "no interval was built twice");
}

/// Replays the journal in order: the partitions in the order they were first claimed, and the
/// most intervals active at once (from a step's claim until it settles).
fn journal_concurrency(dir: &Path, task: &str) -> (Vec<String>, usize) {
    let entries = common::state(dir)
        .rows("SELECT kind, partition_key, to_status FROM journal WHERE task = ?1 ORDER BY seq", &[task])
        .into_iter()
        .map(|row| (row[0].text().expect("a kind"), row[1].text(), row[2].text()));
    let settled = ["published", "failed", "upstream_failed", "skipped", "superseded", "cancelled", "awaiting_approval"];
    let (mut order, mut active, mut most) = (Vec::new(), std::collections::BTreeSet::new(), 0);
    for (kind, partition, to_status) in entries {
        let Some(partition) = partition else { continue };
        if kind == "claimed" {
            if !order.contains(&partition) {
                order.push(partition.clone());
            }
            active.insert(partition);
            most = most.max(active.len());
        } else if to_status.as_deref().is_some_and(|s| settled.contains(&s)) {
            active.remove(&partition);
        }
    }
    (order, most)
}

#[test]
fn catch_up_runs_at_most_max_active_runs_intervals_at_once_newest_first() {
    // Each attempt is a real process that takes 0.3 s; `tick` runs up to 4 at once (its default
    // --workers and the default pool's slots), so only max_active_runs = 2 can hold them to 2.
    let command = r#"["sh", "-c", "sleep 0.3; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]"#;
    let dir = TestWorkspace::new(spec_with(command, "@daily", "{ enabled = true, max_active_runs = 2 }"));
    tidegate(dir.path(), &["run", "extract", "--partition", "2024-01-01", "--json"]);
    let tick = tidegate(dir.path(), &["tick", "--now", "2024-01-11T00:05:00Z", "--json"]);
    let newest_first: Vec<String> = (2..=10).rev().map(|d| format!("2024-01-{d:02}")).collect();
    assert_eq!(keys(&tick["decisions"][0]["run"]), newest_first, "{tick}");
    assert_eq!(published(dir.path()).len(), 10);

    let (order, most) = journal_concurrency(dir.path(), "extract");
    assert_eq!(most, 2, "the journal shows max_active_runs intervals active at once, never more");
    // The first claim was the manual run's day 1. The live day starts in the tick's first turn,
    // possibly in one transaction with the newest missed day (catch-up goes first while below its
    // guaranteed share of the pool); the missed days start newest first.
    let missed: Vec<&String> = order[1..].iter().filter(|p| *p != "2024-01-10").collect();
    assert_eq!(missed, newest_first[1..].iter().collect::<Vec<_>>(), "newest first: {order:?}");
    assert!(order[1..3].contains(&"2024-01-10".to_owned()), "the live day starts first: {order:?}");
}

#[test]
fn a_cron_schedule_makes_a_day_due_at_its_fire_time_not_when_the_day_ends() {
    // The example spec's schedule: the day before is due at 04:30 UTC (the dataset has no zone).
    let dir = TestWorkspace::new(spec_with(WRITE_ONE_ROW, "30 4 * * *", "{ enabled = false }"));
    tidegate(dir.path(), &["run", "extract", "--from", "2024-01-01", "--to", "2024-01-03", "--json"]);

    // Day 4 has ended, but the schedule has not fired since: nothing is due, nothing runs.
    let early = tidegate(dir.path(), &["tick", "--now", "2024-01-05T00:01:00Z", "--json"]);
    let d = &early["decisions"][0];
    assert!(d["due"].as_array().is_some_and(Vec::is_empty), "{early}");
    assert_eq!(early["runs"].as_array().map(Vec::len), Some(0), "{early}");
    let status = tidegate(dir.path(), &["status", "--now", "2024-01-05T00:01:00Z", "--json"]);
    assert!(status["debt"]["missed"].as_array().is_some_and(Vec::is_empty), "{status}");

    // At 04:30 it fires: day 4 is due and runs.
    let at_fire = tidegate(dir.path(), &["tick", "--now", "2024-01-05T04:30:00Z", "--json"]);
    assert_eq!(keys(&at_fire["decisions"][0]["run"]), ["2024-01-04"], "{at_fire}");
    assert_eq!(published(dir.path()).last().map(String::as_str), Some("2024-01-04"));

    // Down until 00:01 on the 9th: days 5-7 fired while nothing ticked, day 8 has not yet. With
    // catch-up off the newest due day runs and the two before it are debt.
    let after = tidegate(dir.path(), &["tick", "--now", "2024-01-09T00:01:00Z", "--json"]);
    let d = &after["decisions"][0];
    assert_eq!(keys(&d["due"]), ["2024-01-05", "2024-01-06", "2024-01-07"], "{after}");
    assert_eq!(keys(&d["run"]), ["2024-01-07"]);
    assert_eq!(keys(&d["debt"]), ["2024-01-05", "2024-01-06"]);
    let status = tidegate(dir.path(), &["status", "--now", "2024-01-09T00:02:00Z", "--json"]);
    assert_eq!(keys(&status["debt"]["missed"][0]["debt"]), ["2024-01-05", "2024-01-06"], "{status}");
}

#[test]
fn a_cron_schedule_fires_on_the_clocks_of_the_datasets_zone_across_spring_forward() {
    // New York days; 2024-03-10 is 23 hours long (02:00 EST jumps to 03:00 EDT), so its 04:30 the
    // next morning is 08:30 UTC, where the day before it was 09:30 UTC.
    let text = spec_with(WRITE_ONE_ROW, "30 4 * * *", "{ enabled = false }")
        .replace(r#"start = "2024-01-01" }"#, r#"start = "2024-03-01", time_zone = "America/New_York" }"#);
    let dir = TestWorkspace::new(text);
    tidegate(dir.path(), &["run", "extract", "--from", "2024-03-08", "--to", "2024-03-09", "--json"]);
    let before = tidegate(dir.path(), &["tick", "--now", "2024-03-11T08:29:00Z", "--dry-run", "--json"]);
    assert!(before["decisions"][0]["due"].as_array().is_some_and(Vec::is_empty), "{before}");
    let at = tidegate(dir.path(), &["tick", "--now", "2024-03-11T08:30:00Z", "--json"]);
    assert_eq!(keys(&at["decisions"][0]["run"]), ["2024-03-10"], "{at}");
    assert_eq!(published(dir.path()).last().map(String::as_str), Some("2024-03-10"));
}
