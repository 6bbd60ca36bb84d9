//! Invariant 11 (crash anywhere, resume) and invariant 2 (idempotent effects), tried the hard way:
//! a real `tidegate run` is killed with SIGKILL at many different moments and run again, and then
//! the Delta logs are read directly to prove every step was committed exactly once.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Iterations in the test suite; `scripts/soak-kill.sh` runs the same loop for longer.
const ITERATIONS: u64 = 50;

const SPEC: &str = r#"
[project]
name = "crash_test"
lease_ttl_s = 3
heartbeat_s = 1

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64", nullable = false }, { name = "day", type = "string" }]

[datasets.summary]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.extract]
command = ["sh", "-c", "sleep 0.05; printf 'id,day\n1,%s\n2,%s\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 60

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
timeout_s = 60
"#;

fn tidegate(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidegate"));
    cmd.current_dir(dir).env_remove("TIDEGATE_TOKEN");
    cmd
}

/// appId -> number of commits carrying it, for one table.
fn commits_per_app_id(table: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(table.join("_delta_log")) else { return counts };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        for line in std::fs::read_to_string(&path).expect("read commit").lines() {
            let action: Value = serde_json::from_str(line).expect("commit lines are JSON");
            if let Some(app_id) = action["txn"]["appId"].as_str() {
                *counts.entry(app_id.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

#[test]
fn killing_a_run_at_any_moment_and_rerunning_publishes_every_step_exactly_once() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("tidegate.toml"), SPEC).expect("write spec");
    for i in 0..ITERATIONS {
        let key = format!("crash-{i}");
        let day = format!("2024-01-{:02}", 1 + i % 28);
        let args = ["run", "summarize", "--partition", &day, "--idempotency-key", &key, "--json"];
        let mut child =
            tidegate(dir.path()).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
        // Spread the kill over the run's life: before planning, mid-attempt, mid-publication, after.
        std::thread::sleep(Duration::from_millis((i * 37) % 700));
        let _ = child.kill();
        let _ = child.wait();
        let out = tidegate(dir.path()).args(args).output().expect("rerun");
        assert!(out.status.success(), "iteration {i}: rerun failed: {}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout).expect("json report");
        assert_eq!(report["status"], "succeeded", "iteration {i}: {report}");
    }

    // Every step of every run is published, and each step's identity appears in exactly one commit.
    let db = rusqlite::Connection::open(dir.path().join(".tidegate/state.db")).expect("state db");
    let (n_steps, n_published): (i64, i64) = db
        .query_row("SELECT COUNT(*), SUM(CASE WHEN status = 'published' THEN 1 ELSE 0 END) FROM steps", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .expect("count steps");
    assert_eq!(n_steps, n_published, "every step ends published");
    assert_eq!(
        n_steps,
        i64::try_from(ITERATIONS * 2).expect("small"),
        "one run of two steps per iteration, never a second run"
    );
    let lake = dir.path().join(".tidegate/lake");
    let mut app_ids = BTreeMap::new();
    for table in ["raw", "summary"] {
        for (app, n) in commits_per_app_id(&lake.join(table)) {
            assert_eq!(n, 1, "{table}: step {app} was committed {n} times");
            app_ids.insert(app, n);
        }
    }
    assert_eq!(app_ids.len(), usize::try_from(n_steps).expect("small"), "one commit per published step");

    let history = tidegate(dir.path()).args(["history", "--json", "--limit", "1"]).output().expect("history");
    assert!(history.status.success(), "the journal chain verifies: {}", String::from_utf8_lossy(&history.stderr));
}
