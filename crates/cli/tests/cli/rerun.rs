//! `tidegate rerun RUN --failed` (issue 34, item 6): a run where one partition's task fails
//! (a marker file stands for a source not ready), the cause fixed, then a new run, linked to the
//! old one both ways in the journal, runs the failed steps and only those; with --downstream, the
//! steps downstream of them too, for the same partitions.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;
use tidegate_testkit::delta::commits_per_app_id;

use crate::common::{json, ok, table, tidegate};

/// `extract` fails for 2024-01-02 while the marker file exists; `summarize` reads what it writes.
fn workspace() -> (TestWorkspace, PathBuf) {
    let dir = TestWorkspace::new("[project]\nname = \"rerun\"\n");
    let marker = dir.path().join("source-not-ready");
    std::fs::write(&marker, "").expect("the marker");
    let spec = format!(
        r#"[project]
name = "rerun"

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64", nullable = false }}, {{ name = "day", type = "string" }}]

[datasets.summary]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.extract]
command = ["sh", "-c", "if [ \"$TIDEGATE_PARTITION\" = 2024-01-02 ] && [ -f '{marker}' ]; then echo 'the source is not ready' >&2; exit 3; fi; printf 'id,day\n1,%s\n' \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
retry = {{ attempts = 1 }}

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
"#,
        marker = marker.display()
    );
    dir.set_spec(spec);
    (dir, marker)
}

/// How many commits each partition's steps made to `dataset`, by partition key.
fn commits(ws: &Path, dataset: &str) -> Vec<usize> {
    commits_per_app_id(&table(ws, dataset)).into_values().collect()
}

/// The run that `run ARGS --json` made, which must fail.
fn failed_run(ws: &Path, args: &[&str]) -> String {
    let (code, outcome) = json(ws, &[args, &["--json"]].concat());
    assert_eq!(code, 1, "one step fails: {outcome}");
    outcome["run_id"].as_str().expect("a run id").to_owned()
}

/// The entries of `history SUBJECT --json` of `kind`.
fn entries(ws: &Path, subject: &str, kind: &str) -> Vec<Value> {
    let (_, history) = json(ws, &["history", subject, "--json"]);
    let all = ["intended", "happened", "visible"]
        .iter()
        .flat_map(|part| history[part].as_array().cloned().unwrap_or_default());
    all.filter(|e| e["kind"] == kind).collect()
}

#[test]
fn rerun_failed_publishes_the_failed_steps_and_only_those_linked_to_the_old_run() {
    let (dir, marker) = workspace();
    let ws = dir.path();
    let old = failed_run(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-03"]);
    assert_eq!(commits(ws, "summary").len(), 2, "two days published, one failed");

    std::fs::remove_file(&marker).expect("the cause fixed");
    // The run is named by the first characters of its id, as every command takes one.
    let (code, rerun) = json(ws, &["rerun", &old[..13], "--failed", "--reason", "source fixed", "--json"]);
    assert_eq!(code, 0, "{rerun}");
    assert_eq!(rerun["summary"]["published"], 2, "extract@2024-01-02 and the summarize step it failed: {rerun}");
    let new = rerun["run_id"].as_str().expect("the new run").to_owned();
    assert_ne!(new, old);
    // Each partition of each dataset committed once: nothing that published ran again.
    assert_eq!(commits(ws, "raw"), [1, 1, 1]);
    assert_eq!(commits(ws, "summary"), [1, 1, 1]);

    // The link, both ways: the old run's history names the new run; the new run names the old.
    let link = entries(ws, &old, "rerun_requested");
    assert_eq!(link.len(), 1, "{link:?}");
    assert!(link[0]["reason"].as_str().expect("a reason").contains(&new), "{link:?}");
    let created = entries(ws, &new, "run_created");
    let reason = created[0]["reason"].as_str().expect("a reason");
    assert!(reason.contains(&old) && reason.contains("source fixed"), "{reason}");
    let shown = ok(ws, &["history", &old]);
    assert!(shown.contains("rerun_requested") && shown.contains(&new), "{shown}");

    // A run with no failed step: a clear refusal, nothing created.
    let refused = tidegate(ws).args(["rerun", &new, "--failed"]).output().expect("runs");
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains(&format!("run {new} has no failed step (2 published)")), "{said}");
    // --failed is what a rerun reruns: it is asked for, not assumed.
    let bare = tidegate(ws).args(["rerun", &new]).output().expect("runs");
    assert_eq!(bare.status.code(), Some(2), "{}", String::from_utf8_lossy(&bare.stderr));
}

#[test]
fn rerun_failed_downstream_also_rebuilds_the_downstream_partitions() {
    let (dir, marker) = workspace();
    let ws = dir.path();
    // Only `extract` runs: nothing downstream is in the old run.
    let old = failed_run(ws, &["run", "extract", "--from", "2024-01-01", "--to", "2024-01-03"]);
    std::fs::remove_file(&marker).expect("the cause fixed");

    let (code, rerun) = json(ws, &["rerun", &old, "--failed", "--downstream", "--json"]);
    assert_eq!(code, 0, "{rerun}");
    assert_eq!(rerun["summary"]["published"], 2, "extract and summarize for 2024-01-02: {rerun}");
    assert_eq!(commits(ws, "raw"), [1, 1, 1]);
    let (_, days) = json(ws, &["sql", "SELECT day FROM summary ORDER BY day", "--json"]);
    assert_eq!(days, serde_json::json!([{ "day": "2024-01-02" }]), "the failed partition's downstream only");
}
