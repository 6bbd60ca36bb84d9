//! Invariant 4 end to end, with real processes: a long task reports progress on its checkpoint
//! file; each granule's output is staged before its checkpoint is stored; a retried attempt
//! resumes from the last checkpoint and carries the staged granules forward, so the published
//! partition holds every granule exactly once.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

/// Writes hours 0..6 as one CSV granule each, checkpointing after each. Attempt 1 dies (exit 75)
/// after hour 2's checkpoint and a half-written hour 3; attempt 2 resumes after the last
/// checkpoint, writes the rest and leaves hour 5 to the final staging (no checkpoint line).
const TASK: &str = r#"
import json, os, sys
out = os.environ["TIDEGATE_OUTPUT_DIR"]
attempt = int(os.environ["TIDEGATE_ATTEMPT"])
resume = os.environ.get("TIDEGATE_RESUME_FROM")
with open(f"seen_resume_{attempt}", "w") as f:  # in the workspace: a staged attempt's folder is removed
    f.write(resume or "none")
start = int(resume.split("=")[1]) + 1 if resume else 0
with open(os.environ["TIDEGATE_CHECKPOINT_FILE"], "a") as cp:
    for hour in range(start, 6):
        if attempt == 1 and hour == 3:
            with open(os.path.join(out, f"h{hour}.csv"), "w") as f:
                f.write("hour,value\n3,")  # half-written: must never be published
            sys.exit(75)
        with open(os.path.join(out, f"h{hour}.csv"), "w") as f:
            f.write(f"hour,value\n{hour},{hour * 10}\n")
        if hour < 5:
            cp.write(json.dumps({"granule": f"hour-{hour}", "position": f"hour={hour}", "files": [f"h{hour}.csv"], "rows": 1}) + "\n")
            cp.flush()
"#;

/// Attempt 1 writes and checkpoints hour 0, then dies (exit 75); attempt 2 resumes, writes hour
/// 1 and exits without a checkpoint line of its own.
const RESUMED_WITHOUT_LINES: &str = r#"
import json, os, sys
out = os.environ["TIDEGATE_OUTPUT_DIR"]
if os.environ.get("TIDEGATE_RESUME_FROM"):
    with open(os.path.join(out, "h1.csv"), "w") as f:
        f.write("hour,value\n1,10\n")
    sys.exit(0)
with open(os.path.join(out, "h0.csv"), "w") as f:
    f.write("hour,value\n0,0\n")
with open(os.environ["TIDEGATE_CHECKPOINT_FILE"], "a") as cp:
    cp.write(json.dumps({"granule": "hour-0", "position": "hour=0", "files": ["h0.csv"], "rows": 1}) + "\n")
sys.exit(75)
"#;

fn spec(script: &Path) -> String {
    format!(
        r#"
[project]
name = "checkpoint_test"

[datasets.hourly]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "hour", type = "int64" }}, {{ name = "value", type = "int64" }}]

[tasks.load]
command = ["python3", "{}"]
outputs = ["hourly"]
retry = {{ attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }}
"#,
        script.display()
    )
}

/// A workspace whose one task runs `script`, kept in it as `task.py`: the spec names the script by
/// its path, so it is written once the script is.
fn workspace(script: &str) -> TestWorkspace {
    let ws = TestWorkspace::new("");
    ws.write("task.py", script);
    ws.set_spec(spec(&ws.path().join("task.py")));
    ws
}

fn tidegate(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = crate::common::tidegate(dir).args(args).output().expect("runs");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("no JSON on stdout: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), json)
}

/// The published `(hour, value)` rows, in hour order.
fn published_hours(dir: &Path) -> Vec<(i64, i64)> {
    let (code, rows) = tidegate(dir, &["sql", "SELECT hour, value FROM hourly ORDER BY hour", "--json"]);
    assert_eq!(code, 0, "{rows}");
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["hour"].as_i64().expect("hour"), r["value"].as_i64().expect("value")))
        .collect()
}

#[test]
fn a_retried_task_resumes_from_its_last_checkpoint_and_publishes_every_granule_once() {
    let dir = workspace(TASK);

    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["published"], 1, "{report}");
    assert_eq!(report["summary"]["retried"], 1, "{report}");

    // Attempt 2 was told where attempt 1 stopped.
    let attempts = dir.path().join(".tidegate/attempts");
    assert_eq!(std::fs::read_to_string(dir.path().join("seen_resume_1")).expect("attempt 1"), "none");
    assert_eq!(std::fs::read_to_string(dir.path().join("seen_resume_2")).expect("attempt 2"), "hour=2");
    // The failed attempt keeps its output folder (its half-written hour 3 included), for whoever
    // investigates; the staged one's was removed, its rows being in the lake.
    let kept: Vec<PathBuf> =
        std::fs::read_dir(&attempts).expect("attempts").map(|e| e.expect("entry").path()).collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].to_string_lossy().ends_with(".attempt-1"), "{kept:?}");
    assert!(kept[0].join("h3.csv").exists());

    // Every hour exactly once: granules 0-2 staged by attempt 1, 3-4 by attempt 2's checkpoints,
    // 5 by the final staging; the half-written hour 3 of attempt 1 is nowhere.
    let got = published_hours(dir.path());
    assert_eq!(got, (0..6).map(|h| (h, h * 10)).collect::<Vec<_>>());

    // The journal holds one `checkpointed` entry per granule, each before its attempt ended, and
    // its chain verifies.
    let (code, journal) = tidegate(dir.path(), &["history", "--limit", "1000", "--json"]);
    assert_eq!(code, 0, "{journal}");
    assert!(journal["chain"]["break_at"].is_null(), "{}", journal["chain"]);
    let granules: Vec<String> = journal["happened"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["kind"] == "checkpointed")
        .map(|e| e["payload"]["checkpoint"]["granule"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(granules, ["hour-0", "hour-1", "hour-2", "hour-3", "hour-4"]);
}

#[test]
fn a_malformed_checkpoint_line_fails_the_attempt_deterministically_with_its_line_number() {
    let dir = workspace(
        "import os\nopen(os.environ['TIDEGATE_CHECKPOINT_FILE'], 'a').write('{\"granule\": \"g\"}\\nnot json\\n')\n",
    );
    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["summary"]["retried"], 0, "a deterministic failure is not retried: {report}");
    let reasons = crate::common::state(dir.path()).texts("SELECT reason FROM attempts", &[]);
    let [reason] = &reasons[..] else { panic!("one attempt: {reasons:?}") };
    assert!(
        reason.contains("checkpoint file") && reason.contains("line 1") && reason.contains("missing field"),
        "{reason}"
    );
}

/// An attempt that writes no checkpoint line still carries forward the granules an earlier
/// attempt checkpointed: the published partition holds both hours.
#[test]
fn a_resumed_attempt_without_checkpoint_lines_still_publishes_the_earlier_granules() {
    let dir = workspace(RESUMED_WITHOUT_LINES);

    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["published"], 1, "{report}");
    assert_eq!(report["summary"]["retried"], 1, "{report}");
    let got = published_hours(dir.path());
    assert_eq!(got, [(0, 0), (1, 10)]);
}

/// The reported case (issue 32, item 7): 30 offsets read in batches of 10, each batch written to
/// its own CSV file. In attempt 1 the task reports the third batch's checkpoint while the file
/// holds 7 of its 10 rows, then dies (exit 75) before writing the rest. Resumed past offset 29,
/// the retry had nothing left to do: 27 of 30 rows were published and the run was green.
/// `DECLARE_ROWS` is replaced by `True` in the variant that says how many rows each batch holds.
const EARLY_CHECKPOINT: &str = r#"
import json, os, sys
DECLARE_ROWS = False
out = os.environ["TIDEGATE_OUTPUT_DIR"]
attempt = int(os.environ["TIDEGATE_ATTEMPT"])
resume = os.environ.get("TIDEGATE_RESUME_FROM")
first = int(resume.split("=")[1]) + 1 if resume else 0
with open(os.environ["TIDEGATE_CHECKPOINT_FILE"], "a") as cp:
    for start in range(first, 30, 10):
        name = f"batch-{start // 10}.csv"
        with open(os.path.join(out, name), "w") as f:
            f.write("hour,value\n")
            for offset in range(start, start + 10):
                if attempt == 1 and offset == start + 7 and start == 20:
                    # The checkpoint goes out while the batch is still being written...
                    line = {"granule": name, "position": f"offset={start + 9}", "files": [name]}
                    if DECLARE_ROWS:
                        line["rows"] = 10
                    cp.write(json.dumps(line) + "\n")
                    cp.flush()
                    f.flush()
                    sys.exit(75)  # ...and the task dies before the last 3 rows.
                f.write(f"{offset},{offset * 10}\n")
        line = {"granule": name, "position": f"offset={start + 9}", "files": [name]}
        if DECLARE_ROWS:
            line["rows"] = 10
        cp.write(json.dumps(line) + "\n")
        cp.flush()
"#;

/// How many rows `hourly` publishes, as `tidegate sql` answers (or why it cannot).
fn published_count(dir: &Path) -> String {
    let out = crate::common::tidegate(dir).args(["sql", "SELECT count(*) AS n FROM hourly", "--json"]).output();
    out.map_or_else(
        |e| e.to_string(),
        |o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

/// The reason of the step's last attempt, as the store recorded it.
fn last_reason(dir: &Path) -> String {
    let reasons = crate::common::state(dir).texts("SELECT reason FROM attempts ORDER BY attempt", &[]);
    reasons.last().cloned().unwrap_or_else(|| panic!("no attempt recorded a reason: {reasons:?}"))
}

/// Issue 32, item 7, as reported: a checkpoint line that declares no row count cannot be checked
/// against what was staged, so it is refused, naming the field to add; nothing is published.
#[test]
fn a_checkpoint_that_does_not_declare_its_rows_is_refused_and_nothing_is_published() {
    let dir = workspace(EARLY_CHECKPOINT);
    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 1, "refused, not green with {} rows: {report}", published_count(dir.path()));
    assert_eq!(report["summary"]["published"], 0, "{report}");
    let reason = last_reason(dir.path());
    assert!(reason.contains("line 1") && reason.contains("missing field `rows`"), "{reason}");
}

/// Issue 32, item 7, with the row count declared: the third batch's checkpoint declares 10 rows
/// while its file holds 7. The checkpoint is refused and the attempt fails deterministically,
/// naming the granule, the file and both counts: no row is lost behind a green run.
#[test]
fn a_checkpoint_whose_files_hold_fewer_rows_than_it_declares_is_refused() {
    let dir = workspace(&EARLY_CHECKPOINT.replace("DECLARE_ROWS = False", "DECLARE_ROWS = True"));
    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["summary"]["published"], 0, "{report}");
    assert_eq!(report["summary"]["retried"], 0, "a checkpoint that lies is the task's bug, not retried: {report}");
    let reason = last_reason(dir.path());
    assert!(
        reason.contains("line 3")
            && reason.contains("\"batch-2.csv\"")
            && reason.contains("declares 10 rows")
            && reason.contains("hold 7"),
        "{reason}"
    );
    // The two honest granules before it stay recorded; the lie is not.
    let granules = crate::common::state(dir.path()).texts("SELECT granule FROM checkpoints ORDER BY granule", &[]);
    assert_eq!(granules, ["batch-0.csv", "batch-1.csv"]);
}

/// The class of item 7: a granule's rows must be exactly what its checkpoint staged. A file named
/// by a second granule would be staged twice (its rows published twice); refused, naming both.
#[test]
fn a_file_covered_by_one_granule_cannot_be_named_by_another() {
    let dir = workspace(
        r#"
import json, os
out, cp = os.environ["TIDEGATE_OUTPUT_DIR"], open(os.environ["TIDEGATE_CHECKPOINT_FILE"], "a")
with open(os.path.join(out, "a.csv"), "w") as f:
    f.write("hour,value\n0,0\n1,10\n")
cp.write(json.dumps({"granule": "g1", "position": "1", "files": ["a.csv"], "rows": 2}) + "\n")
cp.flush()
with open(os.path.join(out, "a.csv"), "a") as f:
    f.write("2,20\n")
cp.write(json.dumps({"granule": "g2", "position": "2", "files": ["a.csv"], "rows": 3}) + "\n")
"#,
    );
    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 1, "{report}");
    let reason = last_reason(dir.path());
    // Read once the task exited, both lines name the file as it ended: 3 rows, not the 2 that
    // g1 declares; read while it ran, g1 holds and g2 names a file g1 covers.
    assert!(
        reason.contains("is already covered by granule \"g1\"") || reason.contains("declares 2 rows but its files"),
        "{reason}"
    );
}

/// The class of item 7: a task that appends to a file after its checkpoint staged it, and exits
/// 0, would lose the appended rows (the covered file is left out of the final staging). The
/// attempt fails instead, naming the file and the granule.
#[test]
fn a_file_that_changes_after_its_checkpoint_fails_the_attempt() {
    let dir = workspace(
        r#"
import json, os, time
out = os.environ["TIDEGATE_OUTPUT_DIR"]
with open(os.path.join(out, "a.csv"), "w") as f:
    f.write("hour,value\n0,0\n1,10\n")
with open(os.environ["TIDEGATE_CHECKPOINT_FILE"], "a") as cp:
    cp.write(json.dumps({"granule": "g1", "position": "1", "files": ["a.csv"], "rows": 2}) + "\n")
time.sleep(1.5)  # the checkpoint file is read every 200 ms: g1 is staged by now
with open(os.path.join(out, "a.csv"), "a") as f:
    f.write("2,20\n")
"#,
    );
    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["summary"]["published"], 0, "{report}");
    let reason = last_reason(dir.path());
    // A machine too slow to read the line within 1.5 s stages the file with 3 rows: refused too.
    assert!(
        reason.contains("\"a.csv\" changed after checkpoint \"g1\" staged it")
            || reason.contains("declares 2 rows but its files"),
        "{reason}"
    );
}

/// The class of item 7: reporting a granule again replaces it, so the files only its earlier
/// report named are no longer covered; they are staged with what followed the last checkpoint
/// instead of being left out as covered (which lost their rows).
#[test]
fn a_granule_reported_again_no_longer_covers_the_files_it_named_before() {
    let dir = workspace(
        r#"
import json, os
out, cp = os.environ["TIDEGATE_OUTPUT_DIR"], open(os.environ["TIDEGATE_CHECKPOINT_FILE"], "a")
with open(os.path.join(out, "a.csv"), "w") as f:
    f.write("hour,value\n0,0\n")
cp.write(json.dumps({"granule": "g", "position": "0", "files": ["a.csv"], "rows": 1}) + "\n")
cp.flush()
with open(os.path.join(out, "b.csv"), "w") as f:
    f.write("hour,value\n1,10\n")
cp.write(json.dumps({"granule": "g", "position": "1", "files": ["b.csv"], "rows": 1}) + "\n")
"#,
    );
    let (code, report) = tidegate(dir.path(), &["run", "load", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(published_hours(dir.path()), [(0, 0), (1, 10)]);
}
