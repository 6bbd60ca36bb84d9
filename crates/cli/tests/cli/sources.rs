//! Invariant 13, source readiness: a step whose external source partition has not arrived does
//! not start; it waits in `waiting_for_source` (journaled, shown by `status`), runs once the
//! partition arrives, and fails after `ready_timeout_s` naming the source, the partition and what
//! was seen. Nothing is published from a missing source. On a folder and on S3 (`cli_shared`).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::backend::{source_root, write_source_file};
use crate::common::tidegate;

/// Writes one row naming its day and the folder it was handed for its source.
const TASK: &str = r#"
import os
day = os.environ["TIDEGATE_PARTITION"]
path = os.environ.get("TIDEGATE_INPUT_RAW_PATH", "")
with open(os.path.join(os.environ["TIDEGATE_OUTPUT_DIR"], "out.csv"), "w") as f:
    f.write("day,source\n" + day + "," + path + "\n")
"#;

fn workspace(ready: &str) -> TestWorkspace {
    let ws = TestWorkspace::new("");
    ws.write("task.py", TASK);
    let root = source_root(ws.path());
    ws.set_spec(format!(
        r#"
[project]
name = "sources_test"

[external.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
location = "{root}/landing/{{date}}"
ready_poll_s = 1
{ready}

[datasets.loaded]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "day", type = "string" }}, {{ name = "source", type = "string" }}]

[tasks.load]
command = ["python3", "{task}"]
inputs = [{{ dataset = "raw", mapping = "same" }}]
outputs = ["loaded"]
retry = {{ attempts = 1 }}
"#,
        task = ws.path().join("task.py").display()
    ));
    ws
}

fn json(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = tidegate(dir).args(args).output().expect("runs");
    let value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("no JSON on stdout: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), value)
}

fn start_run(dir: &Path) -> Child {
    tidegate(dir)
        .args(["run", "load", "--from", "2024-01-01", "--to", "2024-01-02", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts")
}

fn finish(child: Child) -> (i32, Value) {
    let out = child.wait_with_output().expect("ends");
    let value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("no JSON on stdout: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), value)
}

/// The journal's entries of `kind`.
fn journaled(dir: &Path, kind: &str) -> Vec<Value> {
    let (code, journal) = json(dir, &["history", "--limit", "1000", "--json"]);
    assert_eq!(code, 0, "{journal}");
    journal["happened"].as_array().expect("entries").iter().filter(|e| e["kind"] == kind).cloned().collect()
}

/// The published `(day, source)` rows.
fn published(dir: &Path) -> Vec<(String, String)> {
    let out =
        tidegate(dir).args(["sql", "SELECT day, source FROM loaded ORDER BY day", "--json"]).output().expect("runs");
    if !out.status.success() {
        return Vec::new(); // no table yet
    }
    let rows: Value = serde_json::from_slice(&out.stdout).expect("rows as JSON");
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["day"].as_str().unwrap_or("").to_owned(), r["source"].as_str().unwrap_or("").to_owned()))
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < until, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_step_waits_for_its_source_partition_and_runs_once_it_arrives() {
    let ws = workspace("");
    let dir = ws.path();
    write_source_file(dir, "landing/2024-01-01/part-0.csv", b"id\n1\n");
    let run = start_run(dir);

    // Day 2 has not arrived: its step waits, said so by `status` (and in the journal, read once
    // the run has ended: `history` verifies the lake against the store, which a publication in
    // flight has not caught up with yet), and day 1 is published meanwhile. On main the run
    // published both days at once.
    let waiting_now = || {
        let (code, status) = json(dir, &["status", "--json"]);
        code == 0 && status["runs"][0]["steps"]["waiting_for_source"].as_u64() == Some(1)
    };
    wait_for("day 2 to wait for its source", Duration::from_secs(60), waiting_now);
    let (code, status) = json(dir, &["status", "--json"]);
    assert_eq!(code, 0, "{status}");
    let waits = &status["debt"]["waiting_for_source"];
    assert_eq!(waits[0]["task"], "load", "status does not show the wait: {status}");
    assert_eq!(waits[0]["steps"], 1, "{status}");
    assert_eq!(waits[0]["oldest_partition"], "2024-01-02", "{status}");
    assert_eq!(waits[0]["sources"], serde_json::json!(["raw"]), "{status}");
    wait_for("day 1 to be published", Duration::from_secs(60), || published(dir).len() == 1);

    // A marker or hidden file is not the data arriving.
    write_source_file(dir, "landing/2024-01-02/_SUCCESS.tmp", b"");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(published(dir).len(), 1);

    write_source_file(dir, "landing/2024-01-02/part-0.csv", b"id\n2\n");
    let (code, report) = finish(run);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["published"], 2, "{report}");
    let waiting = journaled(dir, "source_waiting");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let reason = waiting[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("source raw partition 2024-01-02") && reason.contains("no file yet at"), "{reason}");
    let rows = published(dir);
    assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["2024-01-01", "2024-01-02"]);
    // The task was handed the folder of its partition.
    let root = source_root(dir);
    assert_eq!(rows[1].1, format!("{root}/landing/2024-01-02"), "{rows:?}");
}

#[test]
fn a_source_that_never_arrives_fails_its_step_after_its_timeout_and_publishes_nothing_from_it() {
    let ws = workspace("ready_timeout_s = 2");
    let dir = ws.path();
    write_source_file(dir, "landing/2024-01-01/part-0.csv", b"id\n1\n");
    let (code, report) = finish(start_run(dir));
    assert_eq!(code, 1, "{report}");
    let failures = report["failures"].as_array().expect("failures");
    assert_eq!(failures.len(), 1, "{report}");
    assert_eq!(failures[0]["step"], "load@2024-01-02", "{report}");
    let reason = failures[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("source raw partition 2024-01-02")
            && reason.contains("no file yet at")
            && reason.contains("ready_timeout_s = 2"),
        "{reason}"
    );
    assert_eq!(published(dir).iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["2024-01-01"]);
}

#[test]
fn a_readiness_command_decides_and_one_that_hangs_is_cut_short() {
    // Ready when `arrived/<day>` exists in the workspace; what it prints last is the reason shown.
    let check = r#"ready = { command = ["sh", "-c", "test -e arrived/$TIDEGATE_PARTITION || { echo upstream export not finished >&2; exit 1; }"] }
ready_timeout_s = 3"#;
    let ws = workspace(check);
    let dir = ws.path();
    std::fs::create_dir_all(dir.join("arrived")).expect("mkdir");
    std::fs::write(dir.join("arrived/2024-01-01"), "").expect("flag");
    let (code, report) = finish(start_run(dir));
    assert_eq!(code, 1, "{report}");
    let reason = report["failures"][0]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("partition 2024-01-02") && reason.contains("upstream export not finished"), "{reason}");
    assert_eq!(published(dir).iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["2024-01-01"]);

    // A command that never answers is killed at its own timeout and counts as not ready.
    let hangs = r#"ready = { command = ["sleep", "3600.4713"], command_timeout_s = 1 }
ready_timeout_s = 2"#;
    let ws = workspace(hangs);
    let started = Instant::now();
    let (code, report) = finish(start_run(ws.path()));
    assert_eq!(code, 1, "{report}");
    let reason = report["failures"][0]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("did not answer within 1 s"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    let left = std::process::Command::new("pgrep").args(["-f", "3600.4713"]).output().expect("pgrep");
    assert!(left.stdout.is_empty(), "a readiness command outlived its timeout");
}

/// Writes day `day` (a row) into the Delta table at `uri`, partitioned by `day`, with Python's
/// `deltalake`: a source that another system publishes as a table.
fn publish_source_day(uri: &str, day: &str) {
    let script = r#"
import os, sys
import pyarrow as pa
from deltalake import write_deltalake
opts = {k: v for k, v in {
    "AWS_ENDPOINT_URL": os.environ.get("AWS_ENDPOINT_URL"), "AWS_REGION": os.environ.get("AWS_REGION"),
    "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID"), "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY"),
    "AWS_ALLOW_HTTP": "true", "conditional_put": "etag"}.items() if v}
uri, day = sys.argv[1], sys.argv[2]
table = pa.table({"id": [1], "day": [day]})
write_deltalake(uri, table, mode="append", partition_by=["day"], storage_options=opts if uri.startswith("s3") else None)
"#;
    let out = std::process::Command::new("python3").args(["-c", script, uri, day]).output().expect("python3");
    if !out.status.success() {
        tidegate_testkit::service_missing("Python deltalake", &String::from_utf8_lossy(&out.stderr));
    }
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_delta_table_source_is_ready_when_its_partition_has_data_and_its_version_is_pinned() {
    let ws = TestWorkspace::new("");
    let dir = ws.path();
    let uri = format!("{}/source_table", source_root(dir));
    publish_source_day(&uri, "2024-01-01");
    ws.write(
        "task.py",
        r#"
import os
with open(os.path.join(os.environ["TIDEGATE_OUTPUT_DIR"], "out.csv"), "w") as f:
    f.write("day,source\n" + os.environ["TIDEGATE_PARTITION"] + "," + os.environ["TIDEGATE_INPUT_RAW_URI"] + "@" + os.environ["TIDEGATE_INPUT_RAW_VERSION"] + "\n")
"#,
    );
    ws.set_spec(format!(
        r#"
[project]
name = "sources_test"

[external.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
location = "{uri}"
ready_poll_s = 1
ready_timeout_s = 2

[datasets.loaded]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "day", type = "string" }}, {{ name = "source", type = "string" }}]

[tasks.load]
command = ["python3", "{task}"]
inputs = [{{ dataset = "raw", mapping = "same" }}]
outputs = ["loaded"]
retry = {{ attempts = 1 }}
"#,
        task = dir.join("task.py").display()
    ));
    let (code, report) = finish(start_run(dir));
    assert_eq!(code, 1, "{report}");
    let reason = report["failures"][0]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("partition 2024-01-02") && reason.contains("has no data file in partition"), "{reason}");
    // Day 1 read the source's own table at its version, not <lake>/raw.
    assert_eq!(published(dir), [("2024-01-01".to_owned(), format!("{uri}@0"))]);
}

#[test]
fn a_source_that_flips_between_ready_and_not_starts_its_step_once() {
    // The check answers no, yes, no, yes, ... (a counter per partition in the workspace); the
    // task counts its starts. Readiness is decided once, when the step leaves waiting.
    let flips = r#"ready = { command = ["sh", "-c", "n=$(cat flips-$TIDEGATE_PARTITION 2>/dev/null || echo 0); echo $((n + 1)) > flips-$TIDEGATE_PARTITION; [ $((n % 2)) -eq 1 ] || { echo not this time >&2; exit 1; }"] }"#;
    let ws = workspace(flips);
    let dir = ws.path();
    let counting = format!(
        "import os\nopen(os.path.join({:?}, 'starts-' + os.environ['TIDEGATE_PARTITION']), 'a').write('x')\n{TASK}",
        dir.display().to_string()
    );
    ws.write("task.py", &counting);
    let (code, report) = finish(start_run(dir));
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["published"], 2, "{report}");
    for day in ["2024-01-01", "2024-01-02"] {
        let starts = std::fs::read_to_string(dir.join(format!("starts-{day}"))).expect("the task ran");
        assert_eq!(starts, "x", "{day} started {} times", starts.len());
        let looks: u32 =
            std::fs::read_to_string(dir.join(format!("flips-{day}"))).expect("looked").trim().parse().expect("n");
        assert!(looks >= 2, "{day} was looked at {looks} times");
    }
    assert_eq!(journaled(dir, "deps_met").len(), 2);
    assert_eq!(journaled(dir, "source_waiting").len(), 2);
}

#[test]
fn an_on_arrival_schedule_starts_each_partition_when_its_source_arrives() {
    let ws = workspace("");
    let dir = ws.path();
    let spec = std::fs::read_to_string(dir.join("tidegate.toml")).expect("spec");
    ws.set_spec(spec.replace("outputs = [\"loaded\"]", "outputs = [\"loaded\"]\nschedule = \"on_arrival\""));
    // Days 1 and 3 have arrived, day 2 has not; day 4 has not ended at the first tick.
    for day in ["2024-01-01", "2024-01-03", "2024-01-04"] {
        write_source_file(dir, &format!("landing/{day}/part-0.csv"), b"id\n1\n");
    }
    let tick = |now: &str| {
        let (code, report) = json(dir, &["tick", "--now", now, "--json"]);
        assert_eq!(code, 0, "{report}");
        let arrival = report["arrivals"].as_array().and_then(|a| a.first()).cloned().expect("the sensor task");
        let keys = |field: &str| -> Vec<String> {
            arrival[field].as_array().expect(field).iter().map(|k| k.as_str().unwrap_or("").to_owned()).collect()
        };
        (keys("started"), keys("waiting"))
    };
    let (started, waiting) = tick("2024-01-04T06:00:00Z");
    assert_eq!(
        (started, waiting),
        (vec!["2024-01-01".to_owned(), "2024-01-03".to_owned()], vec!["2024-01-02".to_owned()])
    );
    let days = |rows: Vec<(String, String)>| rows.into_iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(days(published(dir)), ["2024-01-01", "2024-01-03"]);

    // Day 2 arrives late: the next tick starts it, and nothing else (day 4 has now ended too).
    write_source_file(dir, "landing/2024-01-02/part-0.csv", b"id\n2\n");
    let (started, waiting) = tick("2024-01-05T06:00:00Z");
    assert_eq!((started, waiting), (vec!["2024-01-02".to_owned(), "2024-01-04".to_owned()], Vec::<String>::new()));
    assert_eq!(days(published(dir)), ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"]);
    // Published partitions are never started again.
    assert_eq!(tick("2024-01-05T07:00:00Z"), (Vec::new(), Vec::new()));
}
