//! `tidegate reconcile` on a workspace where the store and the lake were made to disagree for
//! real: a staging file of an attempt the store never recorded, a commit written into the Delta
//! log by hand (a writer outside Tidegate), a published file deleted, and the staged files of a
//! step waiting to publish deleted. Reconcile cannot prove the stray file is its own, so it is
//! kept and reported like the differences; nothing is repaired.

use crate::common::*;
use serde_json::{Value, json as j};
use tidegate_testkit::TestWorkspace;

const SPEC: &str = r#"
[project]
name = "reconcile_test"

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.make]
command = ["sh", "-c", "printf 'id,v\n1,10\n2,20\n' > \"$TIDEGATE_OUTPUT_DIR/n.csv\""]
outputs = ["nums"]
"#;

/// The first `add` of a file for `partition` in the log.
fn add_of(table: &std::path::Path, partition: &str) -> Value {
    (0..=latest_version(table))
        .flat_map(|v| adds(table, v))
        .find(|a| a["partitionValues"]["tg_partition"] == partition)
        .unwrap_or_else(|| panic!("no file for {partition}"))
}

#[test]
fn reconcile_removes_abandoned_staging_and_reports_what_disagrees() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    ok(ws, &["run", "make", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    let nums = table(ws, "nums");
    // Two steps staging at once may both create the table, so count from the log.
    let published_version = latest_version(&nums);
    let foreign_version = published_version + 1;
    let (code, clean) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "a fresh workspace agrees with itself: {clean}");

    // A step of 2024-01-03 staged and validated, then the process died before committing.
    abort_at(ws, "after-stage", &["run", "make", "--partition", "2024-01-03", "--json"]);
    let published: Vec<String> = (0..=published_version)
        .flat_map(|v| adds(&nums, v))
        .map(|a| a["path"].as_str().expect("path").to_owned())
        .collect();
    let waiting: Vec<String> = staged_files(&nums).into_iter().filter(|f| !published.contains(f)).collect();
    assert_eq!(waiting.len(), 1, "the waiting step staged one file: {waiting:?}");
    // Its staged file disappears (an over-eager cleanup script, a lost disk).
    std::fs::remove_file(nums.join(&waiting[0])).expect("delete staged file");

    // A file under `staging/` that no attempt of this store wrote (another workspace's, a script's).
    let abandoned = "staging/abandoned-1/part-00000.snappy.parquet";
    std::fs::create_dir_all(nums.join("staging/abandoned-1")).expect("mkdir");
    std::fs::write(nums.join(abandoned), b"not even parquet").expect("write abandoned file");
    make_old(&nums.join(abandoned));

    // Someone deletes 2024-01-02 with another Delta writer: a version no release records.
    let day2 = add_of(&nums, "2024-01-02");
    let now_ms = 1_767_000_000_000_i64;
    let commit = [
        j!({"commitInfo": {"timestamp": now_ms, "operation": "DELETE",
            "operationParameters": {"predicate": "tg_partition = '2024-01-02'"}, "clientVersion": "by-hand"}}),
        j!({"remove": {"path": day2["path"], "deletionTimestamp": now_ms, "dataChange": true,
            "extendedFileMetadata": true, "partitionValues": day2["partitionValues"], "size": day2["size"]}}),
    ];
    let lines: Vec<String> = commit.iter().map(Value::to_string).collect();
    let log_file = nums.join(format!("_delta_log/{foreign_version:020}.json"));
    std::fs::write(log_file, lines.join("\n") + "\n").expect("commit");

    // And the file that release published for 2024-01-01, still the current one, is deleted.
    let day1 = add_of(&nums, "2024-01-01");
    let day1_path = day1["path"].as_str().expect("path").to_owned();
    std::fs::remove_file(nums.join(&day1_path)).expect("delete published file");

    let (code, report) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 2, "differences exit with status 2: {report}");
    assert_eq!(report["deleted"], j!([]), "{report}");
    assert_eq!(report["not_owned"][0]["path"], abandoned, "{report}");
    assert!(nums.join(abandoned).exists(), "not provably Tidegate's: kept");
    assert_eq!(
        report["unknown_versions"],
        j!([{"dataset": "nums", "version": foreign_version, "operation": "DELETE", "release_ids": []}]),
        "{report}"
    );
    assert_eq!(report["missing_versions"], j!([]), "{report}");
    let mut missing: Vec<(String, String)> = report["missing_files"]
        .as_array()
        .expect("list")
        .iter()
        .map(|m| {
            assert_eq!(m["dataset"], "nums");
            (m["path"].as_str().expect("path").to_owned(), m["needed_by"].as_str().expect("who").to_owned())
        })
        .collect();
    missing.sort();
    // `<column>=<value>/part-<staging id>-<uuid>.snappy.parquet`
    let name = waiting[0].rsplit('/').next().and_then(|n| n.strip_prefix("part-")).expect("part-<id>-<uuid>");
    let staging_id = name.rsplit_once('-').expect("<id>-<uuid>").0.to_owned();
    let mut expected = vec![
        (day1_path.clone(), format!("current version {foreign_version}")),
        (waiting[0].clone(), format!("staged version {staging_id}")),
    ];
    expected.sort();
    assert_eq!(missing, expected, "{report}");

    // Reported, not repaired: a second pass finds the same differences and deletes nothing more.
    let (code, again) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 2);
    assert_eq!(again["deleted"], j!([]));
    assert_eq!(again["unknown_versions"], report["unknown_versions"]);
    assert_eq!(again["missing_files"], report["missing_files"]);
    let out = tidegate(ws).arg("reconcile").output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let unknown = format!("unknown to the store: nums version {foreign_version} (DELETE) was not written by Tidegate");
    assert!(text.contains(&unknown), "{text}");
    let missing = format!("missing file: nums/{day1_path} (needed by current version {foreign_version})");
    assert!(text.contains(&missing), "{text}");
}

const FAILING_SPEC: &str = r#"
[project]
name = "reconcile_attempts_test"

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.make]
command = ["sh", "-c", """
printf 'id,v\n1,10\n' > "$TIDEGATE_OUTPUT_DIR/n.csv"
echo "made $TIDEGATE_PARTITION"
if [ "$TIDEGATE_PARTITION" = 2024-01-02 ]; then echo 'bad input' >&2; exit 65; fi
"""]
outputs = ["nums"]
"#;

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn reconcile_removes_what_finished_attempts_left_in_the_workspace() {
    let dir = TestWorkspace::new(FAILING_SPEC);
    let ws = dir.path();
    let out = tidegate(ws).args(["run", "make", "--from", "2024-01-01", "--to", "2024-01-02"]).output().expect("runs");
    assert!(!out.status.success(), "2024-01-02 fails deterministically");
    let (attempts, logs) = (ws.join(".tidegate/attempts"), ws.join(".tidegate/logs"));
    // The staged attempt's folder went at once; the failed one's stays, with what it wrote.
    let failed = names_in(&attempts);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(attempts.join(&failed[0]).join("n.csv").exists());
    let log_files = names_in(&logs);
    assert!(log_files.iter().any(|f| f == &format!("{}.stderr.log", failed[0])), "{log_files:?}");

    // An hour later: logs are kept for 30 days by default; the failed attempt's folder is not
    // needed any more.
    make_old(&attempts.join(&failed[0]));
    for f in &log_files {
        make_old(&logs.join(f));
    }
    let (code, report) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["attempts"]["folders_removed"], j!(failed), "{report}");
    assert_eq!(report["attempts"]["logs_removed"], j!([]), "{report}");
    assert_eq!(report["attempts"]["n_logs_kept"], log_files.len(), "{report}");
    assert!(names_in(&attempts).is_empty());
    assert_eq!(names_in(&logs), log_files);

    // A step still running keeps its files whatever --keep-logs says: the store lists it.
    let before_second_run = names_in(&logs);
    abort_at(ws, "after-stage", &["run", "make", "--partition", "2024-01-03"]);
    let waiting: Vec<String> = names_in(&logs).into_iter().filter(|f| !before_second_run.contains(f)).collect();
    assert!(!waiting.is_empty());
    for f in &waiting {
        make_old(&logs.join(f));
    }
    let (code, report) = json(ws, &["reconcile", "--keep-logs", "0s", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["attempts"]["logs_removed"], j!(log_files), "{report}");
    assert_eq!(names_in(&logs), waiting, "the waiting step's logs stay");
    // So do their copies in the lake; the finished attempts' copies go.
    let copies = table(ws, "_tidegate/logs");
    let removed: Vec<String> = serde_json::from_value(report["log_copies_removed"].clone()).expect("copies removed");
    assert_eq!(removed.len(), 3, "stdout of both attempts and stderr of the failed one: {report}");
    let kept: Vec<String> = names_in(&copies).iter().flat_map(|step| names_in(&copies.join(step))).collect();
    assert_eq!(kept, ["attempt-1.stdout.log"], "the waiting step's copy stays");
    let text = ok(ws, &["reconcile"]);
    assert!(text.contains("Removed 0 output folders and 0 log files of finished attempts (0 B)"), "{text}");

    let out = tidegate(ws).args(["reconcile", "--keep-logs", "forever"]).output().expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"forever\" is not a duration"),
        "bad durations are refused"
    );
}
