//! Issue 19, fault injection: the process aborts at every named crash point of a step's life
//! (for each write mode) and of a backfill's publish and rollback, then a rerun recovers. After
//! recovery each step identity is committed once, readers see what a crash-free run gives,
//! reconcile finds no difference and the journal verifies with one `published` entry per step.
//! The crash points are listed in docs/internals.md (engine, "Crash points").

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{abort_at, commits_per_app_id, comparison_of, table, token_of};

/// A step's crash points, in the order its life passes them.
const STEP_POINTS: &[&str] = &[
    "after-stage-output",
    "after-checks",
    "after-record-staged",
    "before-commit",
    "after-commit",
    "after-record-release",
];

/// One task writing two rows per day into `out` with the write mode `WRITE`; two days, so two
/// steps. The short lease lets a rerun take over a crashed attempt's step within two seconds.
const STEP_SPEC: &str = r#"
[project]
name = "faults_test"
lease_ttl_s = 2
heartbeat_s = 1

[datasets.out]
partitioning = { grain = "day", start = "2024-01-01" }
write = WRITE
columns = [{ name = "id", type = "int64", nullable = false }, { name = "day", type = "string" }]

[tasks.extract]
command = ["sh", "-c", "printf 'id,day\n1,%s\n2,%s\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/out.csv\""]
outputs = ["out"]
timeout_s = 60
"#;

/// One attempt at a time, so `@1` is the first step's passage through a point.
const RUN: &[&str] = &[
    "run",
    "extract",
    "--from",
    "2024-01-01",
    "--to",
    "2024-01-02",
    "--idempotency-key",
    "faults",
    "--workers",
    "1",
    "--json",
];

/// The write modes and the `write` value that exercises each.
const MODES: &[(&str, &str)] = &[
    ("replace", r#"{ mode = "replace" }"#),
    ("merge", r#"{ mode = "merge", keys = ["id", "day"] }"#),
    ("snapshot", r#"{ mode = "snapshot" }"#),
    ("append", r#"{ mode = "append", dedup_key = ["id", "day"] }"#),
];

fn tidegate(dir: &Path, user: &str) -> Command {
    let mut cmd = crate::common::tidegate(dir);
    if user == "bo" {
        cmd.env("TIDEGATE_TOKEN", token_of(dir, "bo"));
    }
    cmd
}

fn ok(dir: &Path, user: &str, args: &[&str]) -> String {
    let out = tidegate(dir, user).args(args).output().expect("the tidegate binary runs");
    assert!(
        out.status.success(),
        "tidegate {args:?} in {}:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn json(dir: &Path, args: &[&str]) -> (i32, Value) {
    crate::common::json(dir, args)
}

fn step_workspace(write: &str) -> TestWorkspace {
    TestWorkspace::new(STEP_SPEC.replace("WRITE", write))
}

/// What readers see in `dataset`, every column, in a fixed order.
fn rows(dir: &Path, dataset: &str) -> String {
    ok(dir, "reader", &["sql", &format!("SELECT * FROM {dataset} ORDER BY 1, 2, 3"), "--csv"])
}

/// The invariants a recovered workspace keeps, `case` naming it in failures: each step identity
/// committed once and as many committed as `expected_commits` allows, the rows of
/// `expected_rows`, no difference for reconcile, and a journal that verifies with one
/// `published` entry per published step. Returns how many step identities were committed and how
/// many steps the journal says were published.
fn assert_recovered(
    ws: &Path,
    case: &str,
    datasets: &[&str],
    expected_rows: &[String],
    expected_commits: RangeInclusive<usize>,
) -> (usize, usize) {
    let mut n_commits = 0;
    for (dataset, expected) in datasets.iter().zip(expected_rows) {
        for (app, n) in commits_per_app_id(&table(ws, dataset)) {
            assert_eq!(n, 1, "{case}: {dataset}: {app} was committed {n} times");
            n_commits += 1;
        }
        assert_eq!(&rows(ws, dataset), expected, "{case}: {dataset} differs from a crash-free run");
    }
    assert!(expected_commits.contains(&n_commits), "{case}: {n_commits} step identities committed");
    let (code, report) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{case}: reconcile: {report}");
    for list in ["unknown_versions", "missing_versions", "missing_files"] {
        assert_eq!(report[list], Value::Array(vec![]), "{case}: {list}: {report}");
    }
    let published = published_per_step(ws, case);
    assert!(published.values().all(|n| *n == 1), "{case}: published entries per step: {published:?}");
    (n_commits, published.len())
}

/// Step id -> `published` journal entries, after asserting that the journal verifies.
fn published_per_step(ws: &Path, case: &str) -> BTreeMap<String, usize> {
    let (code, history) = json(ws, &["history", "--json", "--limit", "100000"]);
    assert_eq!(code, 0, "{case}: history: {history}");
    assert_eq!(history["chain"]["break_at"], Value::Null, "{case}");
    let mut published: BTreeMap<String, usize> = BTreeMap::new();
    for list in ["intended", "happened", "visible"] {
        for entry in history[list].as_array().expect("list") {
            if entry["kind"] == "published" {
                *published.entry(entry["step_id"].as_str().expect("a step").to_owned()).or_default() += 1;
            }
        }
    }
    published
}

/// What a crash-free run of a mode's spec publishes: the rows, and how many step identities.
fn crash_free(write: &str) -> (String, usize) {
    let dir = step_workspace(write);
    ok(dir.path(), "ana", RUN);
    let n = commits_per_app_id(&table(dir.path(), "out")).len();
    (rows(dir.path(), "out"), n)
}

/// Runs `RUN` crashing at each of `crashes` in turn (each rerun crashing at the next), then once
/// without a failpoint, and checks the invariants against the crash-free result.
fn crash_and_recover(mode: &str, write: &str, crashes: &[&str], expected: &(String, usize)) {
    let dir = step_workspace(write);
    let ws = dir.path();
    let case = format!("{mode} crashed at {}", crashes.join(" then "));
    for point in crashes {
        abort_at(ws, point, RUN);
    }
    let (code, report) = json(ws, RUN);
    assert_eq!((code, &report["status"]), (0, &Value::from("succeeded")), "{case}: {report}");
    // A snapshot replaces the whole table: when the crash holds the first day's step back (its
    // lease must expire) the second day's publishes first and the first day's older snapshot is
    // superseded, not published. Readers still see what a crash-free run gives.
    let fewest = if mode == "snapshot" { 1 } else { expected.1 };
    let (n_commits, n_published) =
        assert_recovered(ws, &case, &["out"], std::slice::from_ref(&expected.0), fewest..=expected.1);
    assert_eq!(n_published, n_commits, "{case}: every step committed is published in the journal");
}

/// Every case of one mode, in parallel threads (each in its own workspace).
fn every_case(mode: &str, cases: &[Vec<&str>]) {
    let write = MODES.iter().find(|(m, _)| *m == mode).expect("a mode").1;
    let expected = crash_free(write);
    std::thread::scope(|s| {
        for crashes in cases {
            let expected = &expected;
            s.spawn(move || crash_and_recover(mode, write, crashes, expected));
        }
    });
}

fn each_step_point() -> Vec<Vec<&'static str>> {
    STEP_POINTS.iter().map(|p| vec![*p]).collect()
}

#[test]
fn a_replace_write_recovers_from_a_crash_at_every_step_point() {
    every_case("replace", &each_step_point());
}

#[test]
fn a_merge_write_recovers_from_a_crash_at_every_step_point() {
    every_case("merge", &each_step_point());
}

#[test]
fn a_snapshot_write_recovers_from_a_crash_at_every_step_point() {
    every_case("snapshot", &each_step_point());
}

#[test]
fn an_append_write_recovers_from_a_crash_at_every_step_point() {
    every_case("append", &each_step_point());
}

/// The recovery run crashes too, at a later point of the step it resumes (or of the next step).
#[test]
fn a_crash_during_recovery_is_recovered_in_turn() {
    let cases = vec![
        vec!["after-stage-output", "after-commit"],
        vec!["after-checks", "after-record-staged"],
        vec!["after-record-staged", "before-commit"],
        vec!["after-commit", "after-commit"],
        vec!["after-commit", "after-record-release"],
    ];
    every_case("replace", &cases);
    every_case("append", &cases[3..]);
}

/// Two days of `raw` (two rows each, `v` read from the file `level` in the workspace) and their
/// sums in `summary`: a backfill of `extract` with its downstream commits two datasets.
const BACKFILL_SPEC: &str = r#"
[project]
name = "faults_backfill_test"
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
command = ["sh", "-c", "v=$(cat level); printf 'id,day,v\n1,%s,%s\n2,%s,%s\n' \"$TIDEGATE_PARTITION\" \"$v\" \"$TIDEGATE_PARTITION\" \"$v\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 60

[tasks.summarize]
sql = "SELECT day, SUM(v) AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
timeout_s = 60
"#;

const BACKFILL_DATASETS: &[&str] = &["raw", "summary"];

/// Publishes the two days of a workspace with [`BACKFILL_SPEC`] at level 10, then stages a backfill
/// of `extract` and its downstream at level 20 and has a second person approve it. Returns the
/// backfill's id.
fn approved_backfill(ws: &Path) -> String {
    std::fs::write(ws.join("level"), "10").expect("level");
    ok(ws, "ana", &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    std::fs::write(ws.join("level"), "20").expect("level");
    let mut plan = vec!["backfill", "plan", "extract", "--from", "2024-01-01", "--to", "2024-01-02"];
    plan.extend(["--reprocess", "all", "--reason", "the feed was re-delivered", "--include-downstream", "--json"]);
    let (_, planned) = json(ws, &plan);
    let id = planned["id"].as_str().expect("a backfill id").to_owned();
    ok(ws, "ana", &["backfill", "start", &id]);
    ok(ws, "ana", &["backfill", "compare", &id]);
    ok(ws, "bo", &["backfill", "approve", &id, "--comparison", &comparison_of(ws, &id)]);
    id
}

fn read_all(ws: &Path) -> Vec<String> {
    BACKFILL_DATASETS.iter().map(|d| rows(ws, d)).collect()
}

/// Asserts that each dataset reads either as `old` or as `new`, never a mixture of the two.
fn assert_old_or_new(ws: &Path, case: &str, old: &[String], new: &[String]) {
    for (i, now) in read_all(ws).iter().enumerate() {
        assert!(now == &old[i] || now == &new[i], "{case}: {} mixes old and new:\n{now}", BACKFILL_DATASETS[i]);
    }
}

/// The backfill's status and its release ids.
fn backfill_status(ws: &Path, id: &str) -> Value {
    json(ws, &["backfill", "status", id, "--json"]).1
}

/// The kinds of the releases the store recorded for backfill `id`, sorted.
fn releases_of(ws: &Path, id: &str) -> Vec<String> {
    crate::common::state(ws).texts("SELECT kind FROM releases WHERE backfill_id = ?1 ORDER BY kind", &[id])
}

/// Publish crash points, with `@N` counting the two datasets' commits; a list of two is a crash
/// during recovery (a dataset committed before is replayed without a commit, so `@1` of the
/// second is the other dataset's commit).
const PUBLISH_CASES: &[&[&str]] = &[
    &["before-backfill-commit@1"],
    &["after-backfill-commit@1"],
    &["before-backfill-commit@2"],
    &["after-backfill-commit@2"],
    &["after-backfill-commits"],
    &["after-backfill-record"],
    &["after-backfill-commit@1", "after-backfill-commit@1"],
    &["before-backfill-commit@2", "after-backfill-commits"],
];

/// Rollback crash points: after the first dataset's restore commit, after the last. A crash
/// during recovery is left out: a crashed rollback holds its dataset's maintenance lock until the
/// lock's lease expires (`LOCK_TTL_S`, a minute), so each crash costs the rerun that minute.
const ROLLBACK_POINTS: &[&str] = &["after-rollback-commit@1", "after-rollback-commit@2"];

/// What a crash-free backfill gives, made once for the tests that need it.
struct Reference {
    /// The rows of each dataset before the backfill (level 10).
    old: Vec<String>,
    /// The rows of each dataset after it (level 20).
    new: Vec<String>,
    /// The step identities the commits carry.
    n_commits: usize,
    /// The steps the journal says were published.
    n_published: usize,
}

fn backfill_reference() -> &'static Reference {
    static REFERENCE: OnceLock<Reference> = OnceLock::new();
    REFERENCE.get_or_init(crash_free_backfill)
}

/// A crash-free backfill published and rolled back.
fn crash_free_backfill() -> Reference {
    let dir = TestWorkspace::new(BACKFILL_SPEC);
    let ws = dir.path();
    let id = approved_backfill(ws);
    let old = read_all(ws);
    ok(ws, "ana", &["backfill", "publish", &id]);
    let new = read_all(ws);
    let n: usize = BACKFILL_DATASETS.iter().map(|d| commits_per_app_id(&table(ws, d)).len()).sum();
    ok(ws, "ana", &["backfill", "rollback", &id]);
    assert_eq!(read_all(ws), old, "a crash-free rollback brings back the old rows");
    Reference { old, new, n_commits: n, n_published: published_per_step(ws, "crash-free").len() }
}

fn publish_case(crashes: &[&str], reference: &Reference) {
    let Reference { old, new, n_commits: n, n_published } = reference;
    let dir = TestWorkspace::new(BACKFILL_SPEC);
    let ws = dir.path();
    let id = approved_backfill(ws);
    let case = format!("backfill publish crashed at {}", crashes.join(" then "));
    for point in crashes {
        abort_at(ws, point, &["backfill", "publish", &id]);
        assert_old_or_new(ws, &case, old, new);
    }
    ok(ws, "ana", &["backfill", "publish", &id]);
    let recovered = assert_recovered(ws, &case, BACKFILL_DATASETS, new, *n..=*n);
    assert_eq!(recovered.1, *n_published, "{case}: steps published");
    let status = backfill_status(ws, &id);
    assert_eq!(status["status"], "published", "{case}: {status}");
    assert_eq!(releases_of(ws, &id), ["publish"], "{case}: exactly one release");
}

fn rollback_case(point: &str, reference: &Reference) {
    let Reference { old, new, n_commits: n, n_published } = reference;
    let dir = TestWorkspace::new(BACKFILL_SPEC);
    let ws = dir.path();
    let id = approved_backfill(ws);
    ok(ws, "ana", &["backfill", "publish", &id]);
    let case = format!("backfill rollback crashed at {point}");
    abort_at(ws, point, &["backfill", "rollback", &id]);
    assert_old_or_new(ws, &case, old, new);
    ok(ws, "ana", &["backfill", "rollback", &id]);
    let recovered = assert_recovered(ws, &case, BACKFILL_DATASETS, old, *n..=*n);
    assert_eq!(recovered.1, *n_published, "{case}: steps published");
    let status = backfill_status(ws, &id);
    assert_eq!(status["status"], "rolled_back", "{case}: {status}");
    assert_eq!(releases_of(ws, &id), ["publish", "rollback"], "{case}: exactly one rollback release");
}

#[test]
fn a_backfill_publish_recovers_from_a_crash_at_every_point_to_exactly_one_release() {
    let reference = backfill_reference();
    std::thread::scope(|s| {
        for crashes in PUBLISH_CASES {
            s.spawn(move || publish_case(crashes, reference));
        }
    });
}

#[test]
fn a_backfill_rollback_recovers_from_a_crash_after_each_restore_commit() {
    let reference = backfill_reference();
    std::thread::scope(|s| {
        for point in ROLLBACK_POINTS {
            s.spawn(move || rollback_case(point, reference));
        }
    });
}
