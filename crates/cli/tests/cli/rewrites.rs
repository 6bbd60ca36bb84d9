//! History is rewritten only under review (issue 32, item 3; decision 0020): a run that would
//! replace partitions published by other code is refused, naming them and the backfill that
//! replaces them; new partitions run with new code; `rewrites = "free"` allows it and the journal
//! says so; a run queued before an edit does not publish the edited code; `backfill start` runs
//! only its own backfill; a rewrite policy on an external dataset is a clear error.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, json, ok, table, tidegate};

/// The summary SQL as first written, and as edited (another code version).
const SQL_V1: &str = "SELECT day, COUNT(*) AS n FROM raw GROUP BY day";
const SQL_V2: &str = "SELECT day, COUNT(*) * 10 AS n FROM raw GROUP BY day";

fn workspace(summary_policy: Option<&str>) -> TestWorkspace {
    let mut spec = format!("[project]\nname = \"rewrites\"\n{EXTRACT_SUMMARIZE}");
    if let Some(policy) = summary_policy {
        spec = spec.replacen(
            "[datasets.summary]\npartitioning = { grain = \"day\", start = \"2024-01-01\" }\n",
            &format!("[datasets.summary]\npartitioning = {{ grain = \"day\", start = \"2024-01-01\" }}\nrewrites = \"{policy}\"\n"),
            1,
        );
        assert!(spec.contains("rewrites ="), "the policy is in the spec");
    }
    TestWorkspace::new(spec)
}

/// Edits the summary task's SQL: a new code version for `summarize`.
fn edit_sql(dir: &TestWorkspace) {
    let spec = dir.spec();
    assert!(spec.contains(SQL_V1));
    dir.set_spec(spec.replace(SQL_V1, SQL_V2));
}

/// The published summary, day by day: `(day, n)`.
fn summary(ws: &Path) -> Vec<(String, i64)> {
    let (code, rows) = json(ws, &["sql", "SELECT day, n FROM summary ORDER BY day", "--json"]);
    assert_eq!(code, 0, "{rows}");
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["day"].as_str().expect("day").to_owned(), r["n"].as_i64().expect("n")))
        .collect()
}

fn days(from: u32, to: u32, n: i64) -> Vec<(String, i64)> {
    (from..=to).map(|d| (format!("2024-01-{d:02}"), n)).collect()
}

fn run_status(ws: &Path, run_id: &str) -> String {
    let (_, status) = json(ws, &["status", "--limit", "100", "--json"]);
    let runs = status["runs"].as_array().expect("runs");
    let run = runs.iter().find(|r| r["id"] == run_id).unwrap_or_else(|| panic!("run {run_id} in {status}"));
    run["status"].as_str().expect("status").to_owned()
}

/// Executes the queue (with a run of its own), which ends with the refused steps' failures.
fn drain_queue(ws: &Path) {
    let out =
        tidegate(ws).args(["run", "extract", "--partition", "2024-01-09", "--drain-queue"]).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "the drain saw a refused step fail: {stdout}");
    assert!(stdout.contains("failed"), "{stdout}");
}

#[test]
fn a_run_with_changed_code_over_published_partitions_is_refused_and_changes_nothing() {
    let dir = workspace(None);
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-04"]);
    assert_eq!(summary(ws), days(1, 4, 2));
    let version = crate::common::latest_version(&table(ws, "summary"));
    edit_sql(&dir);

    let out =
        tidegate(ws).args(["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-05"]).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(stderr.contains("would replace published history"), "{stderr}");
    assert!(stderr.contains("partitions 2024-01-01..2024-01-04 (4) of summary (task summarize)"), "{stderr}");
    assert!(
        stderr.contains("tidegate backfill plan summarize --from 2024-01-01 --to 2024-01-04 --reprocess all"),
        "the backfill that replaces them under review: {stderr}"
    );
    assert!(stderr.contains("rewrites = \"free\""), "and the policy that would allow it: {stderr}");
    // Nothing published changed: not the four days, and not the fifth either (the run is refused whole).
    assert_eq!(summary(ws), days(1, 4, 2));
    assert_eq!(crate::common::latest_version(&table(ws, "summary")), version, "no commit");
    // A queued run is refused the same way, and so is one over the HTTP API (the same operation).
    let out = tidegate(ws).args(["submit", "summarize", "--partition", "2024-01-02"]).output().expect("runs");
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn new_partitions_run_with_new_code_without_review() {
    let dir = workspace(None);
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    edit_sql(&dir);
    let (code, done) = json(ws, &["run", "summarize", "--from", "2024-01-03", "--to", "2024-01-04", "--json"]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["status"], "succeeded", "{done}");
    let mut expected = days(1, 2, 2);
    expected.extend(days(3, 4, 20));
    assert_eq!(summary(ws), expected, "history kept, new days with the new code");
    // The upstream (unchanged code) is republished freely: the same code version is no rewrite.
    ok(ws, &["run", "extract", "--from", "2024-01-01", "--to", "2024-01-04"]);
}

#[test]
fn a_dataset_declared_free_is_rewritten_and_the_journal_says_so() {
    let dir = workspace(Some("free"));
    let ws = dir.path();
    let validated = ok(ws, &["validate"]);
    assert!(validated.contains("summary: rewrites = \"free\""), "validate names the policy: {validated}");
    let (_, report) = json(ws, &["validate", "--json"]);
    assert_eq!(report["free_rewrites"], serde_json::json!(["summary"]), "{report}");

    ok(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    edit_sql(&dir);
    let (code, done) = json(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(summary(ws), days(1, 2, 20), "rewritten without review");

    let (code, story) = json(ws, &["history", "summary:2024-01-02", "--json"]);
    assert_eq!(code, 0, "{story}");
    let text = story.to_string();
    assert!(text.contains("free_rewrite"), "the journal records the free rewrite: {text}");
    assert!(text.contains("rewrites = \\\"free\\\" in [datasets.summary]"), "{text}");
}

#[test]
fn a_run_queued_before_an_edit_does_not_publish_the_edited_code() {
    let dir = workspace(None);
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--partition", "2024-01-03"]);
    let (_, queued) = json(ws, &["submit", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    let queued_id = queued["run"]["id"].as_str().expect("the queued run's id").to_owned();
    edit_sql(&dir);

    // Executed after the edit (by a run that drains the queue): its summarize steps are refused,
    // and the drain reports their failure.
    drain_queue(ws);
    assert_eq!(run_status(ws, &queued_id), "failed", "refused steps fail their run");
    assert_eq!(summary(ws), days(3, 3, 2), "neither the edited code nor anything else published for 01..02");
    let (code, steps) = json(ws, &["history", &queued_id, "--json"]);
    assert_eq!(code, 0, "{steps}");
    let text = steps.to_string();
    assert!(text.contains("task summarize's code changed since this step was planned"), "{text}");
    assert!(text.contains("tidegate backfill plan summarize"), "{text}");
}

#[test]
fn publication_checks_again_what_was_published_since_the_run_was_submitted() {
    let dir = workspace(None);
    let ws = dir.path();
    // Queued with v1 over a day nobody published yet: nothing to refuse at submission.
    let (_, queued) = json(ws, &["submit", "summarize", "--partition", "2024-01-05", "--json"]);
    let queued_id = queued["run"]["id"].as_str().expect("the queued run's id").to_owned();
    // Meanwhile v2 publishes that day (a new partition for it), and the SQL goes back to v1.
    let v1 = dir.spec();
    edit_sql(&dir);
    ok(ws, &["run", "summarize", "--partition", "2024-01-05"]);
    dir.set_spec(v1);
    // The queued run's code is the workspace's again, so it runs; its publication would replace
    // v2's output without review, and is refused at that last moment.
    drain_queue(ws);
    assert_eq!(run_status(ws, &queued_id), "failed");
    assert_eq!(summary(ws), days(5, 5, 20), "v2's output stays");
    let (_, story) = json(ws, &["history", &queued_id, "--json"]);
    let text = story.to_string();
    assert!(text.contains("refused at publication: partition 2024-01-05 of summary"), "{text}");
}

#[test]
fn a_declared_file_edited_after_submission_is_a_code_change_too() {
    // The task's code is its argv and the files it declares: here a script on disk.
    let spec = r#"
[project]
name = "rewrites"

[datasets.rows]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.write_rows]
command = ["sh", "rows.sh"]
files = ["rows.sh"]
outputs = ["rows"]
"#;
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let script = |n: u32| format!("printf 'n\\n{n}\\n' > \"$TIDEGATE_OUTPUT_DIR/rows.csv\"\n");
    dir.write("rows.sh", script(1));
    let (_, queued) = json(ws, &["submit", "write_rows", "--partition", "2024-01-01", "--json"]);
    let queued_id = queued["run"]["id"].as_str().expect("the queued run's id").to_owned();
    dir.write("rows.sh", script(2));
    let drain = ["run", "write_rows", "--partition", "2024-01-05", "--drain-queue"];
    let out = tidegate(ws).args(drain).output().expect("runs");
    assert_eq!(out.status.code(), Some(1), "the drain saw the refused step fail: {out:?}");
    assert_eq!(run_status(ws, &queued_id), "failed", "the edited script did not run under the old submission");
    let (_, story) = json(ws, &["history", &queued_id, "--json"]);
    assert!(story.to_string().contains("task write_rows's code changed"), "{story}");
    // Run now, the edited script publishes the new day; edited again, it may not replace it.
    ok(ws, &["run", "write_rows", "--partition", "2024-01-01"]);
    dir.write("rows.sh", script(3));
    let out = tidegate(ws).args(["run", "write_rows", "--partition", "2024-01-01"]).output().expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("would replace published history"), "{out:?}");
}

#[test]
fn backfill_start_runs_only_its_own_backfill() {
    let dir = workspace(None);
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    // The README's order: a run submitted, then the SQL edited, then a backfill of the edit.
    let (_, queued) = json(ws, &["submit", "extract", "--partition", "2024-01-05", "--json"]);
    let queued_id = queued["run"]["id"].as_str().expect("the queued run's id").to_owned();
    edit_sql(&dir);
    let (code, planned) = json(
        ws,
        &[
            "backfill",
            "plan",
            "summarize",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-02",
            "--reprocess",
            "all",
            "--reason",
            "count times ten",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{planned}");
    let id = planned["id"].as_str().expect("backfill id").to_owned();
    let (code, started) = json(ws, &["backfill", "start", &id, "--json"]);
    assert_eq!(code, 0, "{started}");
    assert_eq!(started["status"], "staged", "{started}");
    assert_eq!(run_status(ws, &queued_id), "queued", "the unrelated run waits for its own execution");
    // The comparison shows the edit: the live history was not replaced behind the backfill's back.
    let (code, compared) = json(ws, &["backfill", "compare", &id, "--json"]);
    assert_eq!(code, 0, "{compared}");
    let totals: &Value = &compared["datasets"][0]["totals"];
    assert_eq!((totals["n_added"].as_u64(), totals["n_removed"].as_u64()), (Some(2), Some(2)), "{compared}");
    assert_eq!(summary(ws), days(1, 2, 2), "published history untouched until approved");

    // Approved by a second person and published, the backfill's code is what those days hold:
    // running them again with it is no rewrite.
    approve_and_publish(ws, &id);
    assert_eq!(summary(ws), days(1, 2, 20));
    let (code, again) = json(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    assert_eq!((code, again["status"].as_str()), (0, Some("succeeded")), "{again}");
}

/// Approves backfill `id` as a second person (bo) and publishes it.
fn approve_and_publish(ws: &Path, id: &str) {
    let approve = ["backfill", "approve", id, "--comparison", &crate::common::comparison_of(ws, id)];
    let out = crate::common::tidegate_as(ws, Some("bo")).args(approve).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    ok(ws, &["backfill", "publish", id]);
}

#[test]
fn after_a_backfill_is_rolled_back_its_code_may_not_replace_the_restored_history() {
    let dir = workspace(None);
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    edit_sql(&dir);
    let plan = ["backfill", "plan", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--reprocess", "all"];
    let (code, planned) = json(ws, &[&plan[..], &["--reason", "times ten", "--json"]].concat());
    assert_eq!(code, 0, "{planned}");
    let id = planned["id"].as_str().expect("backfill id").to_owned();
    ok(ws, &["backfill", "start", &id]);
    ok(ws, &["backfill", "compare", &id]);
    approve_and_publish(ws, &id);
    ok(ws, &["backfill", "rollback", &id]);
    assert_eq!(summary(ws), days(1, 2, 2), "the first code's history is back");
    // What the days hold is the first code's output again (the rollback says which version it
    // restored): the edited code may not replace it without review.
    let out =
        tidegate(ws).args(["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("partitions 2024-01-01, 2024-01-02 of summary (task summarize)"), "{stderr}");
    assert_eq!(summary(ws), days(1, 2, 2));
}

#[test]
fn a_rewrite_policy_on_an_external_dataset_is_a_clear_error() {
    let spec = format!(
        "[project]\nname = \"rewrites\"\n\n[external.feed]\npartitioning = {{ grain = \"day\", start = \"2024-01-01\" }}\n\
         rewrites = \"free\"\n{EXTRACT_SUMMARIZE}"
    );
    let dir = TestWorkspace::new(spec);
    let out = tidegate(dir.path()).args(["validate"]).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("tidegate.toml:6:13: external.feed.rewrites:"), "file:line:col and the setting: {stderr}");
    assert!(stderr.contains("an external dataset is produced outside the workspace"), "{stderr}");
}
