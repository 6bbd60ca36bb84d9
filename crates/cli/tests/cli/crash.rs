//! Invariant 11 (crash anywhere, resume) and invariant 2 (idempotent effects), tried the hard way:
//! a real `tidegate run` is killed with SIGKILL at many different moments and run again, and then
//! the Delta logs are read directly to prove every step was committed exactly once. Meanwhile a
//! reader no one here wrote (Python `deltalake`) reads both tables over and over: it must never see
//! a partition half written, doubled or disagreeing with its summary (invariant 1: no partial reads).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{commits_per_app_id, tidegate};

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

/// Reads `raw` and `summary` at their latest versions until `stop` exists, then prints how many
/// reads it made and every violation it saw: a partition of `raw` without exactly its two rows, a
/// `summary` partition that is not one row counting two, or a read that failed.
const READER: &str = r#"
import json, os, sys, time
from collections import Counter

lake, stop = Lake(sys.argv[1]), sys.argv[2]
reads, violations = 0, []
parent = os.getppid()  # a test that panicked never writes `stop`: end with it

def table(name):
    if not lake.exists(f"{name}/_delta_log"):
        return None
    return lake.table(name).to_pyarrow_table()

def check():
    global reads
    try:
        raw, summary = table("raw"), table("summary")
    except Exception as e:
        # A table folder whose first commit is not written yet is not a table yet.
        if "No snapshot or version 0 found" not in str(e):
            violations.append("read failed: %r" % e)
        return
    if raw is not None:
        reads += 1
        for day, n in Counter(raw.column("tg_partition").to_pylist()).items():
            if n != 2:
                violations.append("raw %s: %d rows" % (day, n))
    if summary is not None:
        reads += 1
        counts = Counter(summary.column("tg_partition").to_pylist())
        for day, n in zip(summary.column("tg_partition").to_pylist(), summary.column("n").to_pylist()):
            if counts[day] != 1 or n != 2:
                violations.append("summary %s: %d rows, n = %s" % (day, counts[day], n))

while not os.path.exists(stop) and len(violations) < 20 and os.getppid() == parent:
    check()
    # On S3 each check lists and reads both tables' logs: fewer of them keep the one-threaded
    # test server free for the runs under test.
    time.sleep(0.2 if lake.options else 0.02)
print(json.dumps({"reads": reads, "violations": violations}))
sys.stdout.flush()
os._exit(0)
"#;

fn python_has_deltalake() -> bool {
    Command::new("python3").args(["-c", "import deltalake"]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn killing_a_run_at_any_moment_and_rerunning_publishes_every_step_exactly_once() {
    let dir = TestWorkspace::new(SPEC);
    let lake = crate::common::lake(dir.path());
    let stop = dir.path().join("reader.stop");
    let reader = if python_has_deltalake() {
        dir.write("reader.py", format!("{}{READER}", crate::common::PYTHON_LAKE));
        let reader = Command::new("python3")
            .arg(dir.path().join("reader.py"))
            .arg(&lake)
            .arg(&stop)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Python reader");
        Some(reader)
    } else {
        tidegate_testkit::service_missing("the concurrent reader of the kill test", "Python deltalake");
        None
    };
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
    let counts = crate::common::state(dir.path())
        .rows("SELECT COUNT(*), SUM(CASE WHEN status = 'published' THEN 1 ELSE 0 END) FROM steps", &[]);
    let (n_steps, n_published) = (counts[0][0].int(), counts[0][1].int());
    assert_eq!(n_steps, n_published, "every step ends published");
    assert_eq!(
        n_steps,
        i64::try_from(ITERATIONS * 2).expect("small"),
        "one run of two steps per iteration, never a second run"
    );
    let mut app_ids = BTreeMap::new();
    for table in ["raw", "summary"] {
        for (app, n) in commits_per_app_id(&crate::common::table(dir.path(), table)) {
            assert_eq!(n, 1, "{table}: step {app} was committed {n} times");
            app_ids.insert(app, n);
        }
    }
    assert_eq!(app_ids.len(), usize::try_from(n_steps).expect("small"), "one commit per published step");

    if let Some(reader) = reader {
        std::fs::write(&stop, "").expect("stop the reader");
        let out = reader.wait_with_output().expect("the reader ends");
        let report: Value = serde_json::from_slice(&out.stdout).expect("the reader's report is JSON");
        assert_eq!(report["violations"], Value::Array(vec![]), "the reader saw partial or doubled partitions");
        assert!(report["reads"].as_u64().is_some_and(|n| n > 0), "the reader read the tables: {report}");
        println!("concurrent reader: {} reads, none partial", report["reads"]);
    }

    let history = tidegate(dir.path()).args(["history", "--json", "--limit", "1"]).output().expect("history");
    assert!(history.status.success(), "the journal chain verifies: {}", String::from_utf8_lossy(&history.stderr));
}
