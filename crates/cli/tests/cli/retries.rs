//! Invariant 5 (errors are classified), with real processes: deterministic failures are attempted
//! once, transient ones retried with backoff until they succeed, and a pool that fails every
//! attempt stops retrying once its retry budget is spent.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

fn run(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = crate::common::tidegate(dir).args(args).arg("--json").output().expect("runs");
    let code = out.status.code().unwrap_or(-1);
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no JSON on stdout; stderr:\n{}", String::from_utf8_lossy(&out.stderr)));
    (code, json)
}

fn attempts(dir: &Path) -> Vec<(String, i64, Option<String>)> {
    crate::common::state(dir)
        .rows("SELECT s.partition_key, a.attempt, a.reason FROM attempts a JOIN steps s ON s.id = a.step_id ORDER BY 1, 2", &[])
        .into_iter()
        .map(|row| (row[0].text().expect("a partition"), row[1].int(), row[2].text()))
        .collect()
}

fn spec(command: &str, pool: &str, retry: &str) -> String {
    format!(
        r#"
[project]
name = "retry_test"

{pool}

[datasets.out]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.flaky]
command = ["sh", "-c", "{command}"]
outputs = ["out"]
retry = {retry}
"#
    )
}

const WRITE: &str = "printf 'id\\\\n1\\\\n' > \\\"$TIDEGATE_OUTPUT_DIR/o.csv\\\"";

#[test]
fn a_deterministic_failure_is_attempted_once() {
    let dir = TestWorkspace::new(spec(
        "echo 'bad input row 7' >&2; exit 65",
        "",
        "{ attempts = 5, backoff_base_ms = 10, backoff_max_ms = 20 }",
    ));
    let (code, report) = run(dir.path(), &["run", "flaky", "--partition", "2024-01-01"]);
    assert_eq!(code, 1);
    assert_eq!(report["status"], "failed");
    let a = attempts(dir.path());
    assert_eq!(a.len(), 1, "{a:?}");
    let reason = a[0].2.clone().unwrap_or_default();
    assert!(reason.contains("exited with code 65") && reason.contains("bad input row 7"), "{reason}");
}

#[test]
fn two_transient_failures_then_success_on_attempt_3() {
    let command = format!("if [ \\\"$TIDEGATE_ATTEMPT\\\" -lt 3 ]; then exit 75; fi; {WRITE}");
    let dir = TestWorkspace::new(spec(&command, "", "{ attempts = 3, backoff_base_ms = 10, backoff_max_ms = 50 }"));
    let (code, report) = run(dir.path(), &["run", "flaky", "--partition", "2024-01-01"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["published"], 1);
    assert_eq!(report["summary"]["retried"], 2);
    let a = attempts(dir.path());
    assert_eq!(a.iter().map(|x| x.1).collect::<Vec<_>>(), [1, 2, 3]);
}

#[test]
fn a_pool_failing_every_attempt_stops_at_its_retry_budget() {
    let pool = "[pools.default]\nslots = 2\nretry_budget_ratio = 0.1\nretry_budget_burst = 1";
    let dir = TestWorkspace::new(spec("exit 75", pool, "{ attempts = 5, backoff_base_ms = 10, backoff_max_ms = 20 }"));
    let (code, report) = run(dir.path(), &["run", "flaky", "--from", "2024-01-01", "--to", "2024-01-10"]);
    assert_eq!(code, 1);
    let a = attempts(dir.path());
    let first = a.iter().filter(|x| x.1 == 1).count();
    let retries = a.len() - first;
    assert_eq!(first, 10);
    // At most the burst plus the ratio's share of first attempts, far below 10 x 4 possible retries.
    assert!((1..=2).contains(&retries), "{retries} retries: {a:?}");
    assert_eq!(report["summary"]["failed"], 10);
    let denied = crate::common::state(dir.path()).int("SELECT COUNT(*) FROM journal WHERE kind = 'retry_denied'", &[]);
    assert_eq!(denied, 10, "every step ends with a journaled retry denial naming the spent budget");

    // `status` shows the spent budget from the scheduler's last gauge, and an empty backlog.
    let (code, status) = run(dir.path(), &["status"]);
    assert_eq!(code, 0, "{status}");
    let gauge = &status["debt"]["scheduler"];
    assert_eq!(gauge["pools"]["default"]["retry_budget_left"], 0, "{gauge}");
    assert_eq!(gauge["pools"]["default"]["retry_budget_burst"], 1, "{gauge}");
    assert_eq!(gauge["backlog"], 0, "{gauge}");
}

/// Backpressure protects a struggling dependency from load; a deterministic failure (bad input,
/// bad config) says nothing about load, so a task failing that way on every partition must not
/// slow its pool down. (It used to: the rate halved down to its floor of one start per 20 s, and
/// 1,000 such steps would have taken hours to fail.)
#[test]
fn deterministic_failures_do_not_trip_backpressure() {
    let pool = "[pools.default]\nslots = 2";
    let dir = TestWorkspace::new(spec("exit 65", pool, "{ attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }"));
    let (code, report) = run(dir.path(), &["run", "flaky", "--from", "2024-01-01", "--to", "2024-01-30"]);
    assert_eq!(code, 1);
    assert_eq!(report["summary"]["failed"], 30, "{report}");
    let (code, status) = run(dir.path(), &["status"]);
    assert_eq!(code, 0, "{status}");
    let gauge = &status["debt"]["scheduler"];
    assert!(gauge["pools"]["default"]["rate_per_s"].is_null(), "the pool's rate was cut: {gauge}");
}
