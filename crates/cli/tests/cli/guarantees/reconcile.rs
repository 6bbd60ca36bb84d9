//! `reconcile`, `vacuum` and `rollback` delete only what Tidegate can prove is its own: staged
//! files of a finished attempt this workspace's store recorded, in a table the workspace writes.
//! Another workspace's tables and staged files in a shared lake, another tool's table, a user's
//! file under `staging/` are left alone and reported; an empty commit stops all three.

use std::path::{Path, PathBuf};

use crate::common::*;
use serde_json::{Value, json as j};
use tidegate_testkit::TestWorkspace;

/// A workspace writing `nums`, in a lake folder beside the workspace (`../lake`), so that a
/// second workspace can share it.
const OURS: &str = r#"
[project]
name = "ours"
lake = "../lake"
lease_ttl_s = 3
heartbeat_s = 1

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.make]
command = ["sh", "-c", "printf 'id,v\n1,10\n2,20\n' > \"$TIDEGATE_OUTPUT_DIR/n.csv\""]
outputs = ["nums"]
"#;

/// Another workspace on the same lake: it also writes `nums` (other days), and a table of its own.
const THEIRS: &str = r#"
[project]
name = "theirs"
lake = "../lake"
lease_ttl_s = 3
heartbeat_s = 1

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[datasets.their_table]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.make]
command = ["sh", "-c", "printf 'id,v\n1,10\n2,20\n' > \"$TIDEGATE_OUTPUT_DIR/n.csv\""]
outputs = ["nums"]

[tasks.fill]
command = ["sh", "-c", "printf 'id\n7\n' > \"$TIDEGATE_OUTPUT_DIR/t.csv\""]
outputs = ["their_table"]
"#;

/// Two workspace folders, `ours` and `theirs`, beside a shared `lake` folder.
struct Shared {
    _dir: tempfile::TempDir,
    ours: PathBuf,
    theirs: PathBuf,
    lake: PathBuf,
}

fn shared_lake() -> Shared {
    let dir = tempfile::tempdir().expect("tmp");
    let (ours, theirs, lake) = (dir.path().join("ours"), dir.path().join("theirs"), dir.path().join("lake"));
    for (ws, spec) in [(&ours, OURS), (&theirs, THEIRS)] {
        std::fs::create_dir_all(ws).expect("mkdir");
        std::fs::write(ws.join("tidegate.toml"), spec).expect("spec");
    }
    Shared { _dir: dir, ours, theirs, lake }
}

/// Ages every file under `table/staging`, so that only ownership (not recency) keeps it.
fn age_staging(table: &Path) {
    for file in staged_files(table) {
        make_old(&table.join(file));
    }
}

/// `DATASET/PATH` of every file `reconcile --json` reported as not provably Tidegate's, sorted.
fn not_owned(report: &Value) -> Vec<String> {
    let mut files: Vec<String> = report["not_owned"]
        .as_array()
        .unwrap_or_else(|| panic!("no not_owned list: {report}"))
        .iter()
        .map(|f| format!("{}/{}", f["dataset"].as_str().expect("dataset"), f["path"].as_str().expect("path")))
        .collect();
    files.sort();
    files
}

/// The datasets of the tables `reconcile --json` reported as left alone, sorted.
fn tables_left_alone(report: &Value) -> Vec<String> {
    let mut names: Vec<String> = report["tables_left_alone"]
        .as_array()
        .unwrap_or_else(|| panic!("no tables_left_alone list: {report}"))
        .iter()
        .map(|t| t["dataset"].as_str().expect("dataset").to_owned())
        .collect();
    names.sort();
    names
}

/// Runs `tidegate ARGS` in `dir` as `user` (the holder of a token minted for them) and returns its
/// stdout, failing the test if it fails.
fn ok_as(dir: &Path, user: &str, args: &[&str]) -> String {
    let out = tidegate(dir).env("TIDEGATE_TOKEN", token_of(dir, user)).args(args).output().expect("runs");
    assert!(out.status.success(), "tidegate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn reconcile_leaves_another_workspaces_tables_and_staged_files_alone() {
    let s = shared_lake();
    ok(&s.ours, &["run", "make", "--partition", "2024-01-01", "--json"]);
    let nums = s.lake.join("nums");
    let ours_published = staged_files(&nums);
    // The other workspace publishes its own table, then stages a backfill of it that waits for
    // approval, and stages a day of `nums` and dies before committing it.
    ok(&s.theirs, &["run", "fill", "--partition", "2024-01-01", "--json"]);
    let backfill = ["backfill", "plan", "fill", "--from", "2024-01-01", "--to", "2024-01-02", "--reprocess", "all"];
    let (code, planned) = json(&s.theirs, &[&backfill[..], &["--reason", "refill", "--json"]].concat());
    assert_eq!(code, 0, "{planned}");
    let id = planned["id"].as_str().expect("a backfill id").to_owned();
    let (code, started) = json(&s.theirs, &["backfill", "start", &id, "--json"]);
    assert_eq!((code, &started["status"]), (0, &j!("staged")), "{started}");
    abort_at(&s.theirs, "after-stage", &["run", "make", "--partition", "2024-01-09", "--idempotency-key", "n9"]);
    let their_table = s.lake.join("their_table");
    let theirs_in_nums: Vec<String> =
        staged_files(&nums).into_iter().filter(|f| !ours_published.contains(f)).map(|f| format!("nums/{f}")).collect();
    assert_eq!(theirs_in_nums.len(), 1, "{theirs_in_nums:?}");
    let their_files = staged_files(&their_table);
    assert_eq!(their_files.len(), 3, "one published, two awaiting approval: {their_files:?}");
    age_staging(&nums);
    age_staging(&their_table);

    let (code, report) = json(&s.ours, &["reconcile", "--json"]);
    assert_eq!(code, 0, "our store and our tables agree: {report}");
    assert_eq!(report["deleted"], j!([]), "{report}");
    assert_eq!(not_owned(&report), theirs_in_nums, "{report}");
    assert_eq!(tables_left_alone(&report), ["their_table"], "{report}");
    for file in theirs_in_nums.iter().map(|f| s.lake.join(f)).chain(their_files.iter().map(|f| their_table.join(f))) {
        assert!(file.exists(), "{} was deleted", file.display());
    }
    let text = ok(&s.ours, &["reconcile"]);
    assert!(text.contains(&format!("not provably Tidegate's: {}", theirs_in_nums[0])), "{text}");
    assert!(text.contains("left alone: table their_table"), "{text}");

    // The other workspace finishes its work: nothing it staged was lost.
    ok(&s.theirs, &["backfill", "compare", &id, "--json"]);
    ok_as(&s.theirs, "bo", &["backfill", "approve", &id, "--comparison", &comparison_of(&s.theirs, &id)]);
    ok(&s.theirs, &["backfill", "publish", &id]);
    let (code, done) =
        json(&s.theirs, &["run", "make", "--partition", "2024-01-09", "--idempotency-key", "n9", "--json"]);
    assert_eq!((code, &done["status"]), (0, &j!("succeeded")), "{done}");
    let rows = ok(&s.theirs, &["sql", "SELECT tg_partition, COUNT(*) AS n FROM nums GROUP BY 1 ORDER BY 1", "--csv"]);
    assert_eq!(rows, "tg_partition,n\n2024-01-01,2\n2024-01-09,2\n");
    let filled = ok(&s.theirs, &["sql", "SELECT tg_partition FROM their_table ORDER BY 1", "--csv"]);
    assert_eq!(filled, "tg_partition\n2024-01-01\n2024-01-02\n");
}

#[test]
fn reconcile_leaves_a_table_another_tool_wrote_alone() {
    let s = shared_lake();
    ok(&s.ours, &["run", "make", "--partition", "2024-01-01", "--json"]);
    // Another tool's Delta table in the same lake (here a copy of ours), which keeps its own
    // work in progress in a folder it also calls `staging`.
    let tool = s.lake.join("tool_table");
    copy_dir(&s.lake.join("nums"), &tool);
    let batch = tool.join("staging/batch-7/part-0.parquet");
    std::fs::create_dir_all(batch.parent().expect("parent")).expect("mkdir");
    std::fs::write(&batch, b"another tool's file").expect("write");
    // And a folder of plain Parquet files, not a table at all.
    std::fs::create_dir_all(s.lake.join("exports")).expect("mkdir");
    std::fs::write(s.lake.join("exports/2024.parquet"), b"an export").expect("write");
    age_staging(&tool);

    let (code, report) = json(&s.ours, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["deleted"], j!([]), "{report}");
    assert_eq!(tables_left_alone(&report), ["exports", "tool_table"], "{report}");
    assert!(batch.exists());
    assert!(s.lake.join("exports/2024.parquet").exists());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

#[test]
fn reconcile_leaves_user_files_in_a_staging_folder_alone_until_named() {
    let s = shared_lake();
    ok(&s.ours, &["run", "make", "--partition", "2024-01-01", "--json"]);
    let nums = s.lake.join("nums");
    let published = staged_files(&nums);
    assert_eq!(published.len(), 1, "{published:?}");
    // A user's notes: beside the attempts' folders, in a folder of their own, and inside the
    // folder of our own (finished) attempt.
    let attempt_dir = Path::new(&published[0]).parent().expect("staging/<id>").to_str().expect("utf-8").to_owned();
    let user_files =
        ["staging/README.txt".to_owned(), "staging/notes/todo.csv".to_owned(), format!("{attempt_dir}/why.txt")];
    for file in &user_files {
        std::fs::create_dir_all(nums.join(file).parent().expect("parent")).expect("mkdir");
        std::fs::write(nums.join(file), b"mine").expect("write");
    }
    age_staging(&nums);

    let (code, report) = json(&s.ours, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["deleted"], j!([]), "{report}");
    let mut expected: Vec<String> = user_files.iter().map(|f| format!("nums/{f}")).collect();
    expected.sort();
    assert_eq!(not_owned(&report), expected, "{report}");
    assert!(user_files.iter().all(|f| nums.join(f).exists()));

    // Named, a reported file goes, and nothing else does.
    let (code, deleted) = json(&s.ours, &["reconcile", "--delete", "nums/staging/notes/todo.csv", "--json"]);
    assert_eq!(code, 0, "{deleted}");
    assert_eq!(deleted["deleted"], j!(["nums/staging/notes/todo.csv"]), "{deleted}");
    assert!(!nums.join("staging/notes/todo.csv").exists());
    assert!(nums.join("staging/README.txt").exists());
    assert!(nums.join(format!("{attempt_dir}/why.txt")).exists());
    // A commit, a published file or a file reconcile does not report cannot be named.
    let refused = [
        "nums/_delta_log/00000000000000000000.json".to_owned(),
        format!("nums/{}", published[0]),
        "nums/staging/notes/todo.csv".to_owned(),
    ];
    for path in &refused {
        let out = tidegate(&s.ours)
            .args(["reconcile", "--delete", path, "--delete", "nums/staging/README.txt"])
            .output()
            .expect("runs");
        assert!(!out.status.success(), "--delete {path} must be refused");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(path.as_str()) && stderr.contains("not a file reconcile reports"), "{stderr}");
        assert!(nums.join("staging/README.txt").exists(), "a refused --delete deletes nothing");
    }
    assert!(nums.join("_delta_log/00000000000000000000.json").exists());
    assert!(nums.join(&published[0]).exists());
    assert_eq!(ok(&s.ours, &["sql", "SELECT COUNT(*) AS n FROM nums", "--csv"]), "n\n2\n");
}

/// Publishes two days in a fresh workspace of a shared lake, then damages the newest commit with
/// `damage`: reconcile, vacuum and rollback must all refuse, naming the table, the commit file and
/// `problem`, and delete nothing. Returns the workspace, the table, the newest version, the commit
/// file and the data files that version added.
fn refused_after(damage: fn(&[u8]) -> Vec<u8>, problem: &str) -> (Shared, PathBuf, u64, String, Vec<String>) {
    let s = shared_lake();
    ok(&s.ours, &["run", "make", "--partition", "2024-01-01", "--json"]);
    ok(&s.ours, &["run", "make", "--partition", "2024-01-02", "--json"]);
    let nums = s.lake.join("nums");
    let latest = latest_version(&nums);
    let files: Vec<String> = adds(&nums, latest).iter().map(|a| a["path"].as_str().expect("path").to_owned()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let commit_file = format!("_delta_log/{latest:020}.json");
    let bytes = std::fs::read(nums.join(&commit_file)).expect("read commit");
    std::fs::write(nums.join(&commit_file), damage(&bytes)).expect("damage");
    age_staging(&nums);

    let refusals = [
        vec!["reconcile"],
        vec!["reconcile", "--json"],
        vec!["vacuum", "--older-than", "0s"],
        vec!["rollback", "nums", "--to-version", "1"],
    ];
    for args in &refusals {
        let out = tidegate(&s.ours).args(args).output().expect("runs");
        assert_eq!(out.status.code(), Some(1), "{args:?} must fail: {}", String::from_utf8_lossy(&out.stdout));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let named = stderr.contains("\"nums\"") && stderr.contains(&commit_file) && stderr.contains(problem);
        assert!(named && stderr.contains("restore the file from a backup"), "{args:?}: {stderr}");
        assert!(nums.join(&files[0]).exists(), "{args:?} deleted the only data file of version {latest}");
    }
    (s, nums, latest, commit_file, files)
}

#[test]
fn destructive_commands_refuse_a_table_whose_latest_commit_is_empty() {
    // A disk that filled up, a copy that was cut short: the newest commit is empty.
    let (s, nums, latest, commit_file, files) = refused_after(|_| Vec::new(), "is empty");
    assert_eq!(latest_version(&nums), latest, "nothing was committed");

    // The commit cannot be recovered and is moved out of the log, as the error suggests: the table
    // ends at the version before it, the store reports the version it lacks, and the file the
    // lost commit added (a finished attempt's, now unreferenced) is reported, not deleted.
    std::fs::rename(nums.join(&commit_file), s.lake.join("lost.json")).expect("move the commit out");
    let (code, report) = json(&s.ours, &["reconcile", "--json"]);
    assert_eq!(code, 2, "{report}");
    assert_eq!(report["missing_versions"], j!([{"dataset": "nums", "version": latest}]), "{report}");
    assert_eq!(report["deleted"], j!([]), "{report}");
    assert_eq!(not_owned(&report), [format!("nums/{}", files[0])], "{report}");
    assert!(nums.join(&files[0]).exists());
}

#[test]
fn destructive_commands_refuse_a_commit_cut_mid_line() {
    let cut = |bytes: &[u8]| bytes[..bytes.len() - 20].to_vec();
    let (_s, nums, latest, _, _) = refused_after(cut, "not valid JSON at line");
    assert_eq!(latest_version(&nums), latest, "nothing was committed");
}

const CHECKED: &str = r#"
[project]
name = "checked"

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[[datasets.nums.checks]]
type = "row_count"
max = 1

[tasks.make]
command = ["sh", "-c", "printf 'id,v\n1,10\n2,20\n' > \"$TIDEGATE_OUTPUT_DIR/n.csv\""]
outputs = ["nums"]
"#;

#[test]
fn reconcile_still_removes_what_a_finished_attempt_of_this_store_staged() {
    let dir = TestWorkspace::new(CHECKED);
    let ws = dir.path();
    // Two rows where at most one is allowed: the attempt staged its file, the check failed, and
    // the step failed for good. Its file is ours and abandoned.
    let out = tidegate(ws).args(["run", "make", "--partition", "2024-01-01"]).output().expect("runs");
    assert!(!out.status.success(), "the check fails: {}", String::from_utf8_lossy(&out.stdout));
    let nums = table(ws, "nums");
    let staged = staged_files(&nums);
    assert_eq!(staged.len(), 1, "{staged:?}");
    age_staging(&nums);

    let (code, report) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["deleted"], j!([format!("nums/{}", staged[0])]), "{report}");
    assert_eq!(report["not_owned"], j!([]), "{report}");
    assert!(!nums.join(&staged[0]).exists());
}
