//! Invariant 9 (governed backfills), end to end with the real binary: plan, start, kill -9
//! midway, start again, compare, self-approval refused, approval by another person, publication,
//! readers see the new data, rollback, readers see exactly the old data. Plus the overlap
//! conflict, the throttle (asserted from the journal) and live work overtaking a backfill.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common;

const SPEC: &str = r#"
[project]
name = "backfill_test"
lease_ttl_s = 2
heartbeat_s = 1

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64", nullable = false }, { name = "day", type = "string" }, { name = "v", type = "int64" }]

[datasets.summary]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
consumers = ["dashboard"]

[datasets.report]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
consumers = ["finance"]

[tasks.extract]
command = ["sh", "-c", "sleep 0.2; printf 'id,day,v\n1,%s,10\n2,%s,20\n3,%s,30\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 60

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n, SUM(v) AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
timeout_s = 60

[tasks.publish_report]
sql = "SELECT day, total + 1 AS total_plus_one FROM summary"
inputs = ["summary"]
outputs = ["report"]
timeout_s = 60
"#;

const BUGGY: &str = "SUM(v) AS total FROM raw";
const FIXED: &str = "SUM(v) * 2 AS total FROM raw";

/// The backfills' requester: the OS account running the tests. Every other person is the
/// holder of a token the requester, as the workspace's admin, minted for them.
const REQUESTER: &str = "ana";

fn tidegate(dir: &Path, user: &str) -> Command {
    common::tidegate_as(dir, (user != REQUESTER).then_some(user))
}

fn run(dir: &Path, user: &str, args: &[&str]) -> Output {
    tidegate(dir, user).args(args).output().expect("the tidegate binary runs")
}

fn ok(dir: &Path, user: &str, args: &[&str]) -> String {
    let out = run(dir, user, args);
    assert!(
        out.status.success(),
        "tidegate {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn json(dir: &Path, user: &str, args: &[&str]) -> Value {
    let text = ok(dir, user, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {text}"))
}

fn read_summary(dir: &Path) -> Value {
    json(dir, "reader", &["sql", "SELECT tg_partition, n, total FROM summary ORDER BY tg_partition", "--json"])
}

fn read_report(dir: &Path) -> Value {
    json(dir, "reader", &["sql", "SELECT tg_partition, total_plus_one FROM report ORDER BY tg_partition", "--json"])
}

/// appId -> commits carrying it in one table's log.
fn commits_with(table: &Path, app_id: &str) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(table.join("_delta_log")).expect("a delta log").flatten() {
        if entry.path().extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).expect("commit");
        n += text.lines().filter(|l| l.contains(&format!("\"appId\":\"{app_id}\""))).count();
    }
    n
}

/// The most steps of `run_id` holding a lease at once, replayed from the journal.
fn max_concurrent(dir: &Path, run_id: &str) -> i64 {
    let kinds = common::state(dir).texts("SELECT kind FROM journal WHERE run_id = ?1 ORDER BY seq", &[run_id]);
    let (mut now, mut max) = (0i64, 0i64);
    for kind in kinds {
        match kind.as_str() {
            "claimed" => now += 1,
            "staged" | "attempt_failed" | "lease_expired" => now -= 1,
            _ => {}
        }
        max = max.max(now);
    }
    max
}

fn workspace() -> TestWorkspace {
    let dir = TestWorkspace::new(SPEC);
    ok(dir.path(), "ana", &["run", "publish_report", "--from", "2024-01-01", "--to", "2024-01-06", "--json"]);
    dir
}

fn fix_the_bug(dir: &Path) {
    let path = dir.join("tidegate.toml");
    let text = std::fs::read_to_string(&path).expect("spec");
    assert!(text.contains(BUGGY));
    std::fs::write(&path, text.replace(BUGGY, FIXED)).expect("spec");
}

#[test]
fn a_backfill_goes_from_plan_to_rollback_without_readers_seeing_anything_unapproved() {
    let dir = workspace();
    let ws = dir.path();
    let summary_before = read_summary(ws);
    let report_before = read_report(ws);
    assert_eq!(summary_before.as_array().map(Vec::len), Some(6));
    fix_the_bug(ws);

    let planned = json(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "summarize",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-06",
            "--reprocess",
            "all",
            "--include-downstream",
            "--max-active-runs",
            "2",
            "--reason",
            "total was half of the truth",
            "--json",
        ],
    );
    let id = planned["id"].as_str().expect("an id").to_owned();
    let radius = &planned["spec"]["blast_radius"]["datasets"];
    let names: Vec<&str> = radius.as_array().expect("datasets").iter().filter_map(|d| d["dataset"].as_str()).collect();
    assert_eq!(names, ["summary", "report"], "the target and its downstream, upstream first");
    assert_eq!(radius[1]["downstream"], true);
    assert_eq!(radius[1]["consumers"][0], "finance");
    assert_eq!(radius[0]["partitions"].as_array().map(Vec::len), Some(6));
    assert!(radius[0]["current_rows"].as_u64().unwrap_or(0) == 6, "{radius}");

    // An overlapping second backfill is refused, naming the first.
    let overlap = run(
        ws,
        "carl",
        &[
            "backfill",
            "plan",
            "summary",
            "--from",
            "2024-01-05",
            "--to",
            "2024-01-09",
            "--reprocess",
            "all",
            "--reason",
            "x",
        ],
    );
    assert!(!overlap.status.success());
    let message = String::from_utf8_lossy(&overlap.stderr);
    assert!(message.contains(&id) && message.contains("summary"), "{message}");

    // Start, kill -9 midway, start again: it resumes the same run.
    let mut child = tidegate(ws, "ana")
        .args(["backfill", "start", &id, "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(250));
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    assert_eq!(read_summary(ws), summary_before, "nothing is visible while the backfill runs");
    let started = json(ws, "ana", &["backfill", "start", &id, "--json"]);
    assert_eq!(started["status"], "staged", "{started}");
    let run_id = started["run_id"].as_str().expect("run id").to_owned();
    assert!(max_concurrent(ws, &run_id) <= 2, "the throttle of 2 held");
    assert_eq!(read_summary(ws), summary_before, "staged output is invisible");
    assert_eq!(read_report(ws), report_before);

    // Comparison: every day's total changed; the downstream report changed too; rows unchanged.
    let review = json(ws, "ana", &["backfill", "compare", &id, "--json"]);
    let summary = &review["datasets"][0];
    assert_eq!(summary["dataset"], "summary");
    assert_eq!(summary["totals"]["rows_before"], 6);
    assert_eq!(summary["totals"]["rows_after"], 6);
    let changed =
        summary["totals"]["n_changed"].as_u64().unwrap_or(0) + summary["totals"]["n_added"].as_u64().unwrap_or(0);
    assert!(changed >= 6, "every day's total changed: {summary}");
    assert_eq!(review["datasets"][1]["dataset"], "report");

    // Approval: not by the requester; then by someone else.
    let own = run(ws, "ana", &["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)]);
    assert!(!own.status.success(), "self-approval must be refused");
    assert!(String::from_utf8_lossy(&own.stderr).contains("cannot also approve"));
    let publish_early = run(ws, "ana", &["backfill", "publish", &id]);
    assert!(!publish_early.status.success(), "nothing publishes before approval");
    ok(ws, "bo", &["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)]);

    ok(ws, "ana", &["backfill", "publish", &id]);
    let summary_after = read_summary(ws);
    for (before, after) in
        summary_before.as_array().into_iter().flatten().zip(summary_after.as_array().into_iter().flatten())
    {
        assert_eq!(after["total"].as_i64(), before["total"].as_i64().map(|t| t * 2), "{after}");
    }
    assert_ne!(read_report(ws), report_before, "the downstream dataset was published too");
    let table = common::table(ws, "summary");
    assert_eq!(commits_with(&table, &format!("tidegate:backfill:{id}:summary")), 1, "one atomic commit");

    // Publishing again is refused by status, and changes nothing.
    assert!(!run(ws, "ana", &["backfill", "publish", &id]).status.success());

    ok(ws, "ana", &["backfill", "rollback", &id]);
    assert_eq!(read_summary(ws), summary_before, "rollback restores exactly the previous data");
    assert_eq!(read_report(ws), report_before);
    let status = json(ws, "ana", &["backfill", "status", &id, "--json"]);
    assert_eq!(status["status"], "rolled_back");
    assert_eq!(status["approval"]["by"], "bo");

    // The journal's chain verifies after all of it.
    let history = json(ws, "ana", &["history", "--json"]);
    assert!(history["chain"]["break_at"].is_null(), "{}", history["chain"]);
}

#[test]
fn a_changed_spec_or_changed_data_voids_the_approval() {
    let dir = workspace();
    let ws = dir.path();
    fix_the_bug(ws);
    // So that a live run may publish the fixed code under the backfill (decision 0020: by
    // default it would be refused, as a rewrite of history without review).
    let spec = std::fs::read_to_string(ws.join("tidegate.toml")).expect("spec");
    let free = spec.replacen("consumers = [\"dashboard\"]\n", "consumers = [\"dashboard\"]\nrewrites = \"free\"\n", 1);
    assert_ne!(spec, free);
    std::fs::write(ws.join("tidegate.toml"), free).expect("spec");
    let planned = json(
        ws,
        "ana",
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
            "fix",
            "--json",
        ],
    );
    let id = planned["id"].as_str().expect("id").to_owned();
    ok(ws, "ana", &["backfill", "start", &id]);
    ok(ws, "ana", &["backfill", "compare", &id]);
    ok(ws, "bo", &["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)]);
    // Someone publishes new data underneath the approved backfill.
    ok(ws, "ana", &["run", "summarize", "--partition", "2024-01-02", "--only", "--json"]);
    let out = run(ws, "ana", &["backfill", "publish", &id]);
    assert!(!out.status.success(), "a stale approval must not publish");
    assert!(String::from_utf8_lossy(&out.stderr).contains("changed since backfill"));
    let status = json(ws, "ana", &["backfill", "status", &id, "--json"]);
    assert_eq!(status["status"], "staged", "the approval was withdrawn");
    assert!(status["approval"].is_null());

    // Editing tidegate.toml after planning blocks every further step.
    let path = ws.join("tidegate.toml");
    let text = std::fs::read_to_string(&path).expect("spec");
    std::fs::write(&path, format!("{text}\n# an edit\n")).expect("spec");
    let out = run(ws, "bo", &["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("changed since backfill"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn live_work_submitted_during_a_backfill_finishes_first() {
    let dir = workspace();
    let ws = dir.path();
    let planned = json(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "extract",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-06",
            "--reprocess",
            "all",
            "--max-active-runs",
            "1",
            "--reason",
            "re-extract",
            "--json",
        ],
    );
    let id = planned["id"].as_str().expect("id").to_owned();
    let backfill = tidegate(ws, "ana")
        .args(["backfill", "start", &id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(400));
    // The live run follows while the backfill's process holds the scheduler role.
    let live = json(ws, "ana", &["run", "extract", "--partition", "2024-01-20", "--json"]);
    assert_eq!(live["status"], "succeeded", "{live}");
    let out = backfill.wait_with_output().expect("backfill finished");
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["status"], "staged");

    let db = common::state(ws);
    let seq_of = |sql: &str, arg: &str| -> i64 { db.int(sql, &[arg]) };
    let live_published = seq_of(
        "SELECT MAX(seq) FROM journal WHERE run_id = ?1 AND kind = 'published'",
        live["run_id"].as_str().expect("id"),
    );
    let backfill_last = seq_of(
        "SELECT MAX(seq) FROM journal WHERE run_id = ?1 AND kind = 'staged'",
        report["run_id"].as_str().expect("id"),
    );
    assert!(live_published < backfill_last, "the live run published before the backfill's last step");
    assert!(max_concurrent(ws, report["run_id"].as_str().expect("id")) <= 1, "max_active_runs 1 held");
}

#[test]
fn pause_resume_and_cancel_steer_a_backfill_and_cancel_frees_its_partitions() {
    let dir = workspace();
    let ws = dir.path();
    let plan = |reason: &str| -> Output {
        run(
            ws,
            "ana",
            &[
                "backfill",
                "plan",
                "summarize",
                "--from",
                "2024-01-01",
                "--to",
                "2024-01-03",
                "--reprocess",
                "all",
                "--reason",
                reason,
                "--json",
            ],
        )
    };
    let first = plan("first");
    assert!(first.status.success());
    let id = serde_json::from_slice::<Value>(&first.stdout).expect("json")["id"].as_str().expect("id").to_owned();

    ok(ws, "ana", &["backfill", "pause", &id]);
    let refused = run(ws, "ana", &["backfill", "start", &id]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("resume"), "a paused backfill says how to resume");
    let resumed = json(ws, "ana", &["backfill", "resume", &id, "--json"]);
    assert_eq!(resumed["status"], "staged", "{resumed}");

    assert!(!plan("overlapping").status.success(), "the staged backfill still holds its partitions");
    ok(ws, "ana", &["backfill", "cancel", &id, "--reason", "wrong range"]);
    let status = json(ws, "ana", &["backfill", "status", &id, "--json"]);
    assert_eq!(status["status"], "cancelled");
    assert_eq!(status["steps"]["cancelled"], 3, "{status}");
    let cancelled_approval = ["backfill", "approve", &id, "--comparison", "000000000000"];
    assert!(!run(ws, "bo", &cancelled_approval).status.success(), "a cancelled backfill cannot be approved");
    assert!(plan("second try").status.success(), "cancelling freed the partitions");
}

/// Issue 5: the `tidegate init` example supports the whole flow as it stands, as the README's
/// tutorial shows it.
#[test]
fn the_init_example_supports_a_backfill_from_plan_to_rollback() {
    let dir = tempfile::tempdir().expect("tmp");
    let ws = dir.path();
    ok(ws, "ana", &["init", "."]);
    ok(ws, "ana", &["run", "daily_stats", "--from", "2024-01-01", "--to", "2024-01-03", "--json"]);
    let query = ["sql", "SELECT day, event_type, n_users FROM daily_stats ORDER BY 1, 2", "--json"];
    let before = json(ws, "reader", &query);
    let path = ws.join("tidegate.toml");
    let text = std::fs::read_to_string(&path).expect("spec");
    assert!(text.contains("COUNT(DISTINCT user_id) AS n_users"), "the README's edit applies to the example");
    std::fs::write(&path, text.replace("COUNT(DISTINCT user_id) AS n_users", "COUNT(DISTINCT event_id) AS n_users"))
        .expect("spec");
    let planned = json(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "daily_stats",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-03",
            "--reprocess",
            "all",
            "--reason",
            "count events",
            "--json",
        ],
    );
    let id = planned["id"].as_str().expect("id").to_owned();
    ok(ws, "ana", &["backfill", "start", &id]);
    let review = json(ws, "ana", &["backfill", "compare", &id, "--json"]);
    assert!(review["datasets"][0]["totals"]["n_changed"].as_u64().unwrap_or(0) > 0, "{review}");
    ok(ws, "reviewer", &["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)]);
    ok(ws, "ana", &["backfill", "publish", &id]);
    assert_ne!(json(ws, "reader", &query), before);
    ok(ws, "ana", &["backfill", "rollback", &id]);
    assert_eq!(json(ws, "reader", &query), before);
}

#[test]
fn reprocess_missing_plans_only_partitions_never_published() {
    let dir = workspace();
    let ws = dir.path();
    let planned = json(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "extract",
            "--from",
            "2024-01-05",
            "--to",
            "2024-01-09",
            "--reprocess",
            "missing",
            "--reason",
            "fill the gap",
            "--json",
        ],
    );
    let partitions: Vec<&str> =
        planned["spec"]["steps"].as_array().expect("steps").iter().filter_map(|s| s["partition"].as_str()).collect();
    assert_eq!(partitions, ["2024-01-07", "2024-01-08", "2024-01-09"], "days 1-6 are published already");
    let nothing = run(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "extract",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-03",
            "--reprocess",
            "missing-and-errored",
            "--reason",
            "x",
        ],
    );
    assert!(!nothing.status.success());
    assert!(
        String::from_utf8_lossy(&nothing.stderr).contains("nothing to backfill"),
        "{}",
        String::from_utf8_lossy(&nothing.stderr)
    );
}

/// Issue 32, item 9: Airflow's three reprocess behaviours. Days 1, 2 and 4 published, day 3
/// failed, days 5 and 6 never built.
#[test]
fn reprocess_modes_plan_what_airflow_readers_expect() {
    let spec = r#"
[project]
name = "reprocess_test"

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.extract]
command = ["sh", "-c", "if [ $TIDEGATE_PARTITION = 2024-01-03 ]; then echo 'bad day' >&2; exit 65; fi; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
"#;
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let out = run(ws, "ana", &["run", "extract", "--from", "2024-01-01", "--to", "2024-01-04", "--json"]);
    assert!(!out.status.success(), "day 3 fails: {}", String::from_utf8_lossy(&out.stdout));
    let planned = |reprocess: &str| -> Vec<String> {
        let args =
            ["backfill", "plan", "extract", "--from", "2024-01-01", "--to", "2024-01-06", "--reprocess", reprocess];
        let planned = json(ws, "ana", &[&args[..], &["--reason", "refill", "--json"]].concat());
        let id = planned["id"].as_str().expect("id").to_owned();
        // Each plan is cancelled so the next one does not overlap it.
        ok(ws, "ana", &["backfill", "cancel", &id]);
        assert_eq!(planned["spec"]["reprocess"], reprocess, "{planned}");
        let steps = planned["spec"]["steps"].as_array().expect("steps");
        steps.iter().filter_map(|s| s["partition"].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(planned("missing"), ["2024-01-05", "2024-01-06"], "never built; the failed day is errored, not missing");
    assert_eq!(planned("missing-and-errored"), ["2024-01-03", "2024-01-05", "2024-01-06"]);
    assert_eq!(planned("all"), ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-06"]);

    let old = run(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "extract",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-06",
            "--reprocess",
            "failed",
            "--reason",
            "x",
        ],
    );
    let stderr = String::from_utf8_lossy(&old.stderr);
    assert!(!old.status.success() && stderr.contains("missing-and-errored"), "the new spelling is named: {stderr}");
    let help = ok(ws, "ana", &["backfill", "plan", "--help"]);
    assert!(help.contains("missing-and-errored") && help.contains("Missing and Errored Runs"), "{help}");
}

#[test]
fn a_command_task_that_would_read_staged_output_is_refused_at_plan_time() {
    let spec = format!(
        "{SPEC}\n[datasets.export]\npartitioning = {{ grain = \"day\", start = \"2024-01-01\" }}\nwrite = {{ mode = \"replace\" }}\ncolumns = [{{ name = \"id\", type = \"int64\" }}]\n\n[tasks.export_report]\ncommand = [\"true\"]\ninputs = [\"report\"]\noutputs = [\"export\"]\n"
    );
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let out = run(
        ws,
        "ana",
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
            "--include-downstream",
            "--reason",
            "x",
        ],
    );
    assert!(!out.status.success());
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("export_report") && message.contains("staged output"), "{message}");
    // Without the downstream closure the same backfill is fine.
    ok(
        ws,
        "ana",
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
            "x",
        ],
    );
}

/// `summarize` made to report 85% more than the published total: every day's mean moves 85%.
const MOVED_85: &str = "SUM(v) * 185 / 100 AS total FROM raw";

/// Rewrites `summarize` as `query` and sets `summary`'s review_flags to `flags` (if any).
fn edit_summary(dir: &Path, query: &str, flags: Option<&str>) {
    let path = dir.join("tidegate.toml");
    let mut text = std::fs::read_to_string(&path).expect("spec").replace(BUGGY, query);
    if let Some(flags) = flags {
        text = text
            .replace("consumers = [\"dashboard\"]", &format!("consumers = [\"dashboard\"]\nreview_flags = {flags}"));
    }
    std::fs::write(&path, text).expect("spec");
}

/// Plans and stages a backfill of `summary` for six days; returns its id.
fn staged_summary_backfill(ws: &Path) -> String {
    let args = [
        "backfill",
        "plan",
        "summarize",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-06",
        "--reprocess",
        "all",
        "--reason",
        "recount",
        "--json",
    ];
    let planned = json(ws, "ana", &args);
    let id = planned["id"].as_str().expect("an id").to_owned();
    let started = json(ws, "ana", &["backfill", "start", &id, "--json"]);
    assert_eq!(started["status"], "staged", "{started}");
    id
}

/// The flag messages of every partition of the first compared dataset.
fn flags_of(review: &Value) -> Vec<Vec<String>> {
    let partitions = review["datasets"][0]["partitions"].as_array().cloned().unwrap_or_default();
    partitions
        .iter()
        .map(|p| p["flagged"].as_array().into_iter().flatten().filter_map(|f| f.as_str().map(str::to_owned)).collect())
        .collect()
}

/// The DOM headless Chromium builds from an HTML file; `None` (after `service_missing`) when
/// Chromium is not installed.
fn chromium_dom(test: &str, page: &Path) -> Option<String> {
    let Some(chromium) = ["chromium", "chromium-browser"].into_iter().find(|c| {
        Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    }) else {
        tidegate_testkit::service_missing(test, "Debian's chromium (apt-get install chromium)");
        return None;
    };
    let profile = tempfile::tempdir().expect("a profile folder");
    let out = Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .output()
        .expect("chromium runs");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).expect("utf-8 DOM"))
}

#[test]
fn a_mean_moved_85_percent_is_flagged_with_no_flags_given_and_the_page_shows_it_in_chromium() {
    let dir = workspace();
    let ws = dir.path();
    edit_summary(ws, MOVED_85, None);
    let id = staged_summary_backfill(ws);
    let page = ws.join("review.html");
    let page_arg = page.display().to_string();
    let review = json(ws, "ana", &["backfill", "compare", &id, "--html", &page_arg, "--json"]);
    assert_eq!(review["datasets"][0]["totals"]["n_flagged"], 6, "{}", review["datasets"][0]["totals"]);
    for flags in flags_of(&review) {
        assert_eq!(flags, ["mean of total moved 85.0% (60 -> 111) > 10%"]);
    }

    let html = std::fs::read_to_string(&page).expect("the page was written");
    let Some(dom) = chromium_dom("a_mean_moved_85_percent_is_flagged", &page) else { return };
    assert!(dom.contains("6 of 6 partitions flagged"), "the verdict: {dom}");
    assert_eq!(dom.matches("<tr class=\"flag\">").count(), 6, "one flagged row per partition");
    assert!(dom.contains("mean of total moved 85.0% (60 -&gt; 111) &gt; 10%"), "the flag, escaped");
    assert!(dom.contains("id=\"blast-radius\"") && dom.contains("dashboard"), "blast radius and consumers");
    assert_eq!(dom.matches("<details>").count(), 6, "each partition's details folded");
    assert!(dom.contains("<td>111</td>") && !dom.contains("111.0000"), "integers as integers");
    assert!(dom.contains("<table class=\"sample\">"), "samples as tables");
    assert!(!html.to_lowercase().contains("<script") && !dom.to_lowercase().contains("<script"), "no scripts");
    assert!(!html.contains("http://") && !html.contains("https://"), "no external assets");
}

#[test]
fn an_unchanged_backfill_flags_nothing() {
    let dir = workspace();
    let ws = dir.path();
    let id = staged_summary_backfill(ws);
    let page = ws.join("review.html");
    let page_arg = page.display().to_string();
    let review = json(ws, "ana", &["backfill", "compare", &id, "--html", &page_arg, "--json"]);
    assert_eq!(review["datasets"][0]["totals"]["n_flagged"], 0);
    assert!(flags_of(&review).iter().all(Vec::is_empty), "{review}");
    let html = std::fs::read_to_string(&page).expect("the page was written");
    assert!(html.contains("No partition flagged (6 compared)"), "{html}");
}

#[test]
fn flag_limits_from_the_spec_and_the_command_line_take_effect_and_the_approval_holds() {
    let dir = workspace();
    let ws = dir.path();
    edit_summary(ws, MOVED_85, Some("{ mean_pct = 90, row_count_pct = \"off\" }"));
    let id = staged_summary_backfill(ws);

    // tidegate.toml's 90% lets an 85% move through.
    let review = json(ws, "ana", &["backfill", "compare", &id, "--json"]);
    assert_eq!(review["datasets"][0]["totals"]["n_flagged"], 0, "{review}");
    assert_eq!(review["datasets"][0]["flags"]["mean_pct"], 90.0);
    assert!(review["datasets"][0]["flags"]["row_count_pct"].is_null());

    // The command line wins over the spec, and the comparison it recorded is what an approval
    // binds: approving recomputes it under the same limits.
    let review = json(ws, "ana", &["backfill", "compare", &id, "--flag-mean-pct", "50", "--json"]);
    assert_eq!(review["datasets"][0]["totals"]["n_flagged"], 6);
    for flags in flags_of(&review) {
        assert_eq!(flags, ["mean of total moved 85.0% (60 -> 111) > 50%"]);
    }
    ok(ws, "bo", &["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)]);
    ok(ws, "ana", &["backfill", "publish", &id]);

    let bad = run(ws, "ana", &["backfill", "compare", &id, "--flag-mean-pct=-3"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("at least 0"), "{}", String::from_utf8_lossy(&bad.stderr));
}
