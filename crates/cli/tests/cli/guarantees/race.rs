//! Issue 19, item 2: `backfill publish` racing a live `run` of the same partitions. An approved
//! backfill must never publish over data that a live run published after the approval, whether
//! the live commit lands before `publish` starts or while it is between its check and its commit.
//! The race is made deterministic with the `pause:before-backfill-commit` failpoint: `publish`
//! waits there, with its dataset already verified, until the test has made the live commit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{commits_per_app_id, comparison_of, latest_version, table};

/// `extract` writes two rows per day whose `v` is whatever the file `LEVEL` holds when it runs,
/// so the backfill's rows (level 20) and a later live run's (level 30) are told apart without
/// touching `tidegate.toml` (which would block the backfill). The scheduler lease is short, so a
/// live run takes the role over from a paused `publish` within seconds.
const SPEC: &str = r#"
[project]
name = "race_test"
lease_ttl_s = 2
heartbeat_s = 1

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64", nullable = false }, { name = "day", type = "string" }, { name = "v", type = "int64" }]

[datasets.summary]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.extract]
command = ["sh", "-c", "v=$(cat 'LEVEL'); printf 'id,day,v\n1,%s,%s\n2,%s,%s\n' \"$TIDEGATE_PARTITION\" \"$v\" \"$TIDEGATE_PARTITION\" \"$v\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 60

[tasks.summarize]
sql = "SELECT day, SUM(v) AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
timeout_s = 60
"#;

/// The failpoint `publish` pauses at: its dataset verified, its Delta commit about to be made.
const PAUSE: &str = "before-backfill-commit";

/// The longest the test waits for a paused `publish` to reach its failpoint.
const PAUSE_WAIT: Duration = Duration::from_secs(120);

/// `tidegate` run by `user`: the reviewer `bo` with a token minted for him, everyone else as the
/// OS account running the tests.
fn tidegate(dir: &Path, user: &str) -> Command {
    let mut cmd = crate::common::tidegate(dir);
    if user == "bo" {
        cmd.env("TIDEGATE_TOKEN", crate::common::token_of(dir, "bo"));
    }
    cmd
}

fn ok(dir: &Path, user: &str, args: &[&str]) -> String {
    let out = tidegate(dir, user).args(args).output().expect("the tidegate binary runs");
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

fn set_level(dir: &Path, level: u32) {
    std::fs::write(dir.join("level"), level.to_string()).expect("level file");
}

/// (day, v) of every row readers see in `raw`.
fn read_raw(dir: &Path) -> Vec<(String, i64)> {
    let rows = json(dir, "reader", &["sql", "SELECT tg_partition, v FROM raw ORDER BY tg_partition, id", "--json"]);
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["tg_partition"].as_str().expect("partition").to_owned(), r["v"].as_i64().expect("v")))
        .collect()
}

fn read_summary(dir: &Path) -> Value {
    json(dir, "reader", &["sql", "SELECT tg_partition, total FROM summary ORDER BY tg_partition", "--json"])
}

fn rows(days: &[(&str, i64)]) -> Vec<(String, i64)> {
    days.iter().flat_map(|(d, v)| [((*d).to_owned(), *v), ((*d).to_owned(), *v)]).collect()
}

/// A workspace with [`SPEC`], whose `extract` reads its level from the file `level` in it.
fn workspace() -> TestWorkspace {
    let ws = TestWorkspace::new("");
    ws.set_spec(SPEC.replace("LEVEL", &ws.path().join("level").display().to_string()));
    ws
}

/// Publishes a [`workspace`]'s two days at level 10, then stages a backfill of `target` over both
/// days at level 20, compares it, and has someone other than its requester approve it. Returns
/// the backfill's id.
fn approved_backfill(dir: &Path, target: &str, downstream: bool) -> String {
    set_level(dir, 10);
    ok(dir, "ana", &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    set_level(dir, 20);
    let mut plan = vec!["backfill", "plan", target, "--from", "2024-01-01", "--to", "2024-01-02"];
    plan.extend(["--reprocess", "all", "--reason", "the feed was re-delivered", "--json"]);
    if downstream {
        plan.push("--include-downstream");
    }
    let id = json(dir, "ana", &plan)["id"].as_str().expect("a backfill id").to_owned();
    ok(dir, "ana", &["backfill", "start", &id]);
    ok(dir, "ana", &["backfill", "compare", &id]);
    ok(dir, "bo", &["backfill", "approve", &id, "--comparison", &comparison_of(dir, &id)]);
    id
}

/// A live run of `task` for 2024-01-01 only, at level 30; returns the run's JSON report.
fn live_run(dir: &Path, task: &str) -> Value {
    set_level(dir, 30);
    let live = json(dir, "carl", &["run", task, "--partition", "2024-01-01", "--only", "--json"]);
    assert_eq!(live["status"], "succeeded", "{live}");
    live
}

/// Starts `backfill publish ID` armed to pause at `point` (e.g. `before-backfill-commit@2`),
/// and returns once it is paused there.
fn publish_paused(dir: &Path, id: &str, point: &str) -> Child {
    let mut child = tidegate(dir, "ana")
        .env("TIDEGATE_FAILPOINT", format!("pause:{point}"))
        .env("TIDEGATE_FAILPOINT_DIR", dir)
        .args(["backfill", "publish", id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn publish");
    let paused = dir.join(format!("{PAUSE}.paused"));
    let give_up = Instant::now() + PAUSE_WAIT;
    while !paused.exists() {
        if let Some(status) = child.try_wait().expect("publish is ours to wait for") {
            let out = child.wait_with_output().expect("output");
            panic!("publish ended ({status}) before its commit:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        assert!(Instant::now() < give_up, "publish never reached {point}");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn resume(dir: &Path, child: Child) -> Output {
    std::fs::write(dir.join(format!("{PAUSE}.resume")), "").expect("resume file");
    child.wait_with_output().expect("publish finishes")
}

/// The journal's reasons for `kind`, oldest first.
fn journal_reasons(dir: &Path, kind: &str) -> Vec<String> {
    crate::common::state(dir).texts("SELECT reason FROM journal WHERE kind = ?1 ORDER BY seq", &[kind])
}

/// What a refusal must say: the dataset, the partition and both table versions.
fn assert_names_the_move(message: &str, dataset: &str, approved: u64, found: u64) {
    for needle in [dataset.to_owned(), "2024-01-01".to_owned(), format!("version {approved}"), found.to_string()] {
        assert!(message.contains(&needle), "the refusal should name {needle:?}:\n{message}");
    }
    assert!(!message.contains("2024-01-02"), "only the partition that moved is named:\n{message}");
}

fn assert_approval_withdrawn(dir: &Path, id: &str, dataset: &str) {
    let status = json(dir, "ana", &["backfill", "status", id, "--json"]);
    assert_eq!(status["status"], "staged", "the approval was withdrawn: {status}");
    assert!(status["approval"].is_null(), "{status}");
    let reasons = journal_reasons(dir, "backfill_approval_invalidated");
    assert!(
        reasons.iter().any(|r| r.contains(dataset) && r.contains("2024-01-01")),
        "the journal says which partition moved: {reasons:?}"
    );
}

fn raw_table(dir: &Path) -> PathBuf {
    table(dir, "raw")
}

#[test]
fn a_live_run_published_after_approval_makes_backfill_publish_refuse_naming_the_partition() {
    let dir = workspace();
    let ws = dir.path();
    let id = approved_backfill(ws, "extract", false);
    let approved = latest_version(&raw_table(ws));
    live_run(ws, "extract");
    let found = latest_version(&raw_table(ws));
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 30), ("2024-01-02", 10)]));

    let out = tidegate(ws, "ana").args(["backfill", "publish", &id]).output().expect("runs");
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a stale approval must not publish:\n{message}");
    assert_names_the_move(&message, "raw", approved, found);
    assert_approval_withdrawn(ws, &id, "raw");
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 30), ("2024-01-02", 10)]), "the live rows stay");
    assert_eq!(latest_version(&raw_table(ws)), found, "nothing was committed");
}

#[test]
fn a_live_run_committing_while_backfill_publish_is_at_its_commit_is_not_overwritten() {
    let dir = workspace();
    let ws = dir.path();
    let id = approved_backfill(ws, "extract", false);
    let approved = latest_version(&raw_table(ws));

    // `publish` has checked the approval and verified raw; it is about to commit. A live run
    // takes the scheduler role over (the paused process does not renew it) and publishes
    // 2024-01-01 first.
    let publish = publish_paused(ws, &id, PAUSE);
    live_run(ws, "extract");
    let found = latest_version(&raw_table(ws));
    assert_eq!(found, approved + 1, "the live run committed while publish was paused");
    let out = resume(ws, publish);
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the backfill must not publish over the live commit:\n{message}");
    assert_names_the_move(&message, "raw", approved, found);

    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 30), ("2024-01-02", 10)]), "readers see the live rows");
    let raw = raw_table(ws);
    assert_eq!(latest_version(&raw), found, "no commit after the live one");
    let app_id = format!("tidegate:backfill:{id}:raw");
    assert_eq!(commits_per_app_id(&raw).get(&app_id), None, "no commit carries the backfill");
    assert_approval_withdrawn(ws, &id, "raw");
}

#[test]
fn a_multi_dataset_backfill_refused_after_its_first_commit_restores_it_and_publishes_nothing_more() {
    let dir = workspace();
    let ws = dir.path();
    let raw_before = rows(&[("2024-01-01", 10), ("2024-01-02", 10)]);
    let id = approved_backfill(ws, "extract", true);
    assert_eq!(read_raw(ws), raw_before);
    let summary_table = table(ws, "summary");
    let approved = latest_version(&summary_table);

    // raw is committed; summary, the second dataset, is verified and about to commit when a
    // live run publishes summary's 2024-01-01.
    let publish = publish_paused(ws, &id, &format!("{PAUSE}@2"));
    live_run(ws, "summarize");
    let found = latest_version(&summary_table);
    let live_summary = read_summary(ws);
    let out = resume(ws, publish);
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the backfill must not publish over the live commit:\n{message}");
    assert_names_the_move(&message, "summary", approved, found);
    assert!(message.contains("restored"), "it says raw's commit was undone:\n{message}");

    assert_eq!(read_summary(ws), live_summary, "readers see the live summary");
    assert_eq!(latest_version(&summary_table), found, "nothing was committed to summary after the live run");
    assert_eq!(read_raw(ws), raw_before, "raw's commit of the backfill was undone");
    assert_approval_withdrawn(ws, &id, "summary");
}

// Issue 31, items 3 and 4: an undo never drops newer rows, and the state a command decided on is
// re-verified where it acts.

#[test]
fn backfill_rollback_refuses_to_restore_a_partition_a_newer_live_run_republished() {
    let dir = workspace();
    let ws = dir.path();
    let id = approved_backfill(ws, "extract", false);
    ok(ws, "ana", &["backfill", "publish", &id]);
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 20), ("2024-01-02", 20)]));
    // A live run republishes 2024-01-01 after the backfill: its rows are the newest.
    live_run(ws, "extract");
    let after_live = latest_version(&raw_table(ws));

    let out = tidegate(ws, "ana").args(["backfill", "rollback", &id, "--reason", "undo"]).output().expect("runs");
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "undoing the backfill would drop the live rows:\n{message}");
    assert!(message.contains("raw") && message.contains("release"), "it names the dataset and the release:\n{message}");
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 30), ("2024-01-02", 20)]), "the newer rows stay");
    assert_eq!(latest_version(&raw_table(ws)), after_live, "nothing was committed");
    let status = json(ws, "ana", &["backfill", "status", &id, "--json"]);
    assert_eq!(status["status"], "published", "{status}");

    // Once the live run is undone, the backfill's partitions are its own again and it rolls back.
    let live_release = crate::common::state(ws)
        .texts("SELECT id FROM releases WHERE backfill_id IS NULL AND kind = 'publish' ORDER BY created_at DESC", &[])
        [0]
    .clone();
    ok(ws, "ana", &["rollback", "--release", &live_release, "--reason", "the live run was wrong"]);
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 20), ("2024-01-02", 20)]));
    ok(ws, "ana", &["backfill", "rollback", &id, "--reason", "undo"]);
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 10), ("2024-01-02", 10)]), "the rows before the backfill");
}

#[test]
fn backfill_cancel_and_compare_refuse_while_publish_holds_its_release_and_publish_completes() {
    let dir = workspace();
    let ws = dir.path();
    let id = approved_backfill(ws, "extract", false);
    let publish = publish_paused(ws, &id, PAUSE);

    // `publish` recorded its release and is about to commit: neither a cancel (which would say
    // nothing was published) nor a new comparison (withdrawing the approval) may slip in.
    let cancel = tidegate(ws, "ana").args(["backfill", "cancel", &id, "--reason", "changed my mind"]).output();
    let cancel = cancel.expect("runs");
    let message = String::from_utf8_lossy(&cancel.stderr);
    assert!(!cancel.status.success(), "a cancel while publishing must be refused:\n{message}");
    assert!(message.contains("being published"), "{message}");
    let compare = tidegate(ws, "ana").args(["backfill", "compare", &id]).output().expect("runs");
    let message = String::from_utf8_lossy(&compare.stderr);
    assert!(!compare.status.success(), "a new comparison while publishing must be refused:\n{message}");
    assert!(message.contains("being published"), "{message}");

    let out = resume(ws, publish);
    assert!(out.status.success(), "publish finishes: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 20), ("2024-01-02", 20)]));
    let status = json(ws, "ana", &["backfill", "status", &id, "--json"]);
    assert_eq!(status["status"], "published", "the record matches the rows readers see: {status}");
    ok(ws, "ana", &["backfill", "rollback", &id, "--reason", "undo"]);
    assert_eq!(read_raw(ws), rows(&[("2024-01-01", 10), ("2024-01-02", 10)]));
}

#[test]
fn an_approval_binds_the_comparison_the_approver_named_not_one_made_since() {
    let dir = workspace();
    let ws = dir.path();
    set_level(ws, 10);
    ok(ws, "ana", &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    set_level(ws, 20);
    let plan = ["backfill", "plan", "extract", "--from", "2024-01-01", "--to", "2024-01-02", "--reprocess", "all"];
    let id = json(ws, "ana", &[&plan[..], &["--reason", "re-delivered", "--json"]].concat())["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    ok(ws, "ana", &["backfill", "start", &id]);
    // The approver reviews a comparison that flags the change...
    let reviewed = json(ws, "ana", &["backfill", "compare", &id, "--json"]);
    let reviewed_hash = reviewed["comparison_hash"].as_str().expect("a hash").to_owned();
    assert!(reviewed["datasets"][0]["totals"]["n_flagged"].as_u64() > Some(0), "{reviewed}");
    // ...then the requester compares again with the flags loosened, before the approval.
    let loosened = json(ws, "ana", &["backfill", "compare", &id, "--flag-change-pct", "100000", "--json"]);
    assert_ne!(loosened["comparison_hash"], reviewed["comparison_hash"]);

    let out = tidegate(ws, "bo")
        .args(["backfill", "approve", &id, "--comparison", &reviewed_hash[..12]])
        .output()
        .expect("runs");
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the approval must not bind a comparison the approver never saw:\n{message}");
    assert!(message.contains(&reviewed_hash[..12]) && message.contains("no longer"), "{message}");
    let status = json(ws, "ana", &["backfill", "status", &id, "--json"]);
    assert_eq!(status["status"], "staged", "nothing was approved: {status}");
    // Without naming a comparison there is no approval either.
    let out = tidegate(ws, "bo").args(["backfill", "approve", &id]).output().expect("runs");
    assert!(!out.status.success(), "an approval names its comparison");
    // Naming the current one, after reviewing it, approves it.
    let current = loosened["comparison_hash"].as_str().expect("a hash");
    ok(ws, "bo", &["backfill", "approve", &id, "--comparison", current]);
    let status = json(ws, "ana", &["backfill", "status", &id, "--json"]);
    assert_eq!(status["approval"]["comparison_hash"], current, "{status}");
}
