//! Invariant 6 (fencing) with real processes: a `tidegate run` frozen with SIGSTOP past its lease
//! loses the step to another process; when it resumes, its late output is rejected by the store
//! (and journaled), and the step is published exactly once, by the other process.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{state, table, tidegate};

const SPEC: &str = r#"
[project]
name = "fencing_test"
lease_ttl_s = 2
heartbeat_s = 1

[datasets.slow]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.slow]
command = ["sh", "-c", "sleep 3; printf 'id,attempt\n1,%s\n' \"$TIDEGATE_ATTEMPT\" > \"$TIDEGATE_OUTPUT_DIR/out.csv\""]
outputs = ["slow"]
timeout_s = 60
"#;

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

#[test]
fn a_paused_worker_past_its_lease_cannot_publish() {
    let dir = TestWorkspace::new(SPEC);
    let args = ["run", "slow", "--partition", "2024-01-01", "--idempotency-key", "fence", "--json"];
    let first =
        tidegate(dir.path()).args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn first");

    // Wait until the first process's attempt is running, then freeze the process.
    let db = state(dir.path());
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.int_or_missing("SELECT COUNT(*) FROM attempts") <= 0 {
        assert!(Instant::now() < deadline, "the first attempt never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(first.id(), "-STOP");

    // A second process takes over once the lease and the scheduler role expire, and publishes.
    let second = tidegate(dir.path()).args(args).output().expect("second run");
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    let report: Value = serde_json::from_slice(&second.stdout).expect("json");
    assert_eq!(report["status"], "succeeded");
    assert_eq!(report["summary"]["published"], 1);

    // The first process resumes: its attempt's output arrives with a stale epoch.
    signal(first.id(), "-CONT");
    let out = first.wait_with_output().expect("first finishes");
    let first_report: Value = serde_json::from_slice(&out.stdout).expect("json from the first process");
    assert_eq!(first_report["summary"]["published"], 0, "the paused process published nothing");
    assert_eq!(first_report["summary"]["rejected"], 1, "its stale report was rejected");

    let rejected = db.texts("SELECT reason FROM journal WHERE kind = 'rejected'", &[]);
    assert!(rejected.len() == 1 && rejected[0].contains("fenced"), "the rejection is journaled: {rejected:?}");
    let step = db.rows("SELECT attempt, epoch FROM steps", &[]);
    assert_eq!((step[0][0].int(), step[0][1].int()), (2, 2));

    // Exactly one commit for the step, and the published row comes from attempt 2.
    let log = table(dir.path(), "slow").join("_delta_log");
    let commits_with_txn = std::fs::read_dir(&log)
        .expect("delta log")
        .flatten()
        .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("\"txn\"")))
        .count();
    assert_eq!(commits_with_txn, 1);
}
