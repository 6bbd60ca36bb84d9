//! `tidegate vacuum`: after four releases of one partition, vacuum with `--retain-releases 2`
//! deletes only the first release's file; rolling back to each retained release still works, a
//! rollback that needs a vacuumed version is refused without committing, and the staged output of
//! a step that is waiting to publish survives. Vacuum and rollback hold the dataset's maintenance
//! lock: one waits for the other, and gives up naming the holder.

use crate::common::*;
use serde_json::{Value, json as j};
use tidegate_testkit::TestWorkspace;

const SPEC: &str = r#"
[project]
name = "vacuum_test"

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.make]
command = ["sh", "-c", "printf 'id,v\n1,%s\n' \"$TIDEGATE_PARAM_V\" > \"$TIDEGATE_OUTPUT_DIR/n.csv\""]
outputs = ["nums"]
params = { v = "10" }
"#;

fn value_of_day1(ws: &std::path::Path) -> String {
    ok(ws, &["sql", "SELECT v FROM nums WHERE tg_partition = '2024-01-01'", "--csv"])
}

fn path_of(add: &Value) -> String {
    add["path"].as_str().expect("path").to_owned()
}

/// The vacuum entries of the journal, oldest first (`history` verifies the chain first).
fn vacuum_entries(ws: &std::path::Path) -> Vec<Value> {
    let (code, history) = json(ws, &["history", "--limit", "10000", "--json"]);
    assert_eq!(code, 0, "{history}");
    let happened = history["happened"].as_array().expect("happened").clone();
    happened.into_iter().filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("vacuum"))).collect()
}

#[test]
fn vacuum_keeps_every_retained_release_restorable() {
    if backend::is_shared() {
        // It plants a file in a staging folder and ages it; an S3 server sets its own times.
        println!("skipped on S3: the test ages a file it plants in the lake folder");
        return;
    }
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    let nums = table(ws, "nums");
    // Four releases of 2024-01-01 (table versions 1 to 4), each with a new value.
    for v in ["10", "20", "30", "40"] {
        dir.set_spec(SPEC.replace("v = \"10\"", &format!("v = \"{v}\"")));
        ok(ws, &["run", "make", "--partition", "2024-01-01", "--json"]);
    }
    assert_eq!(latest_version(&nums), 4);
    let file_of = |version: u64| path_of(&adds(&nums, version)[0]);
    let size_of_v1 = adds(&nums, 1)[0]["size"].as_u64().expect("size");
    // A step staged and waiting to publish (its process died), and a file nobody owns.
    abort_at(ws, "after-stage", &["run", "make", "--partition", "2024-01-02", "--json"]);
    let published: Vec<String> = (1..=4).map(file_of).collect();
    let waiting: Vec<String> = staged_files(&nums).into_iter().filter(|f| !published.contains(f)).collect();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    std::fs::create_dir_all(nums.join("staging/dead-1")).expect("mkdir");
    std::fs::write(nums.join("staging/dead-1/part-0.parquet"), b"junk").expect("write");
    make_old(&nums.join("staging/dead-1/part-0.parquet"));
    let log_before = std::fs::read_dir(nums.join("_delta_log")).expect("log").count();

    // Retaining the two newest releases keeps versions 2, 3 (before each) and 4 (current).
    let (code, dry) = json(ws, &["vacuum", "--retain-releases", "2", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{dry}");
    assert_eq!(dry["dry_run"], true);
    let report = &dry["datasets"][0];
    assert_eq!(report["dataset"], "nums");
    assert_eq!(report["kept_versions"], j!([2, 3, 4]), "{dry}");
    assert_eq!(report["deleted"], j!([file_of(1)]), "{dry}");
    assert_eq!(report["n_left_unpublished"], 2, "the waiting step's file and the junk are reconcile's: {dry}");
    assert_eq!(dry["n_bytes_deleted"], size_of_v1);
    assert!(nums.join(file_of(1)).exists(), "a dry run deletes nothing");
    assert!(vacuum_entries(ws).is_empty(), "a dry run journals nothing");

    let (code, done) = json(ws, &["vacuum", "--retain-releases", "2", "--json"]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["datasets"][0]["deleted"], j!([file_of(1)]));
    assert_eq!((done["n_files_deleted"].as_u64(), done["n_bytes_deleted"].as_u64()), (Some(1), Some(size_of_v1)));
    assert!(!nums.join(file_of(1)).exists());
    for kept in (2..=4).map(file_of).chain(waiting.iter().cloned()) {
        assert!(nums.join(&kept).exists(), "{kept} must survive");
    }
    assert!(nums.join("staging/dead-1/part-0.parquet").exists(), "unpublished files are left to reconcile");
    assert_eq!(std::fs::read_dir(nums.join("_delta_log")).expect("log").count(), log_before, "log untouched");
    assert_eq!(value_of_day1(ws), "v\n40\n");
    // The journal says what vacuum was about to delete before it deleted anything, then what it
    // deleted and kept.
    let entries = vacuum_entries(ws);
    let kinds: Vec<&str> = entries.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds, ["vacuum_started", "vacuumed"], "{entries:?}");
    for entry in &entries {
        assert_eq!(entry["payload"]["dataset"], "nums");
        assert_eq!(entry["payload"]["deleted"], j!([file_of(1)]));
        assert_eq!(entry["payload"]["kept_versions"], j!([2, 3, 4]));
        assert_eq!(entry["payload"]["n_bytes_deleted"], size_of_v1);
    }
    assert_eq!(entries[0]["correlation_id"], entries[1]["correlation_id"], "{entries:?}");

    // Undoing each retained release works: it restores the version before it.
    let release_3 = release_of(&nums, 3);
    let release_4 = release_of(&nums, 4);
    ok(ws, &["rollback", "nums", "--to-release", &release_4]);
    assert_eq!(value_of_day1(ws), "v\n30\n");
    ok(ws, &["rollback", "nums", "--to-release", &release_3]);
    assert_eq!(value_of_day1(ws), "v\n20\n");
    // Undoing the second release needs version 1, whose file is gone: refused, nothing committed.
    let before = latest_version(&nums);
    let out = tidegate(ws).args(["rollback", "nums", "--to-release", &release_of(&nums, 2)]).output().expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("version 1 references") && stderr.contains("which vacuum removed"), "{stderr}");
    assert_eq!(latest_version(&nums), before, "a refused rollback commits nothing");
    assert_eq!(value_of_day1(ws), "v\n20\n");

    // The store and the lake agree after all this; reconcile reports the junk (no attempt of this
    // store wrote it) and deletes it once named, and the waiting step's file stays.
    let (code, reconciled) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{reconciled}");
    assert_eq!(reconciled["deleted"], j!([]));
    assert_eq!(reconciled["not_owned"][0]["path"], "staging/dead-1/part-0.parquet", "{reconciled}");
    let (code, deleted) = json(ws, &["reconcile", "--delete", "nums/staging/dead-1/part-0.parquet", "--json"]);
    assert_eq!(code, 0, "{deleted}");
    assert_eq!(deleted["deleted"], j!(["nums/staging/dead-1/part-0.parquet"]));
    assert!(nums.join(&waiting[0]).exists());

    // --older-than 0s keeps no release: only the current version's file stays.
    let (code, all) = json(ws, &["vacuum", "--older-than", "0s", "--json"]);
    assert_eq!(code, 0, "{all}");
    let mut gone = vec![file_of(3), file_of(4)];
    gone.sort();
    assert_eq!(all["datasets"][0]["deleted"], j!(gone), "{all}");
    assert_eq!(value_of_day1(ws), "v\n20\n");
    assert!(nums.join(&waiting[0]).exists());
}

#[test]
fn vacuum_refuses_bad_arguments() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    for (args, expected) in [
        (&["vacuum", "--retain-releases", "0"][..], "0 is not in 1.."),
        (&["vacuum", "--retain-releases", "1", "--older-than", "1d"][..], "cannot be used with"),
        (&["vacuum", "--older-than", "30"][..], "\"30\" is not a duration (time unit needed"),
        (&["vacuum", "nosuch"][..], "no dataset named \"nosuch\""),
    ] {
        let out = tidegate(ws).args(args).output().expect("runs");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // Nothing published yet: nothing to do, and the summary says so.
    let text = ok(ws, &["vacuum", "--dry-run"]);
    assert!(text.contains("Total: would delete 0 files, 0 B (dry run: nothing was deleted)"), "{text}");
}

/// Puts a maintenance lock on `dataset` as another process would, expiring `expires_in_s` from now.
fn hold_lock(ws: &std::path::Path, dataset: &str, owner: &str, purpose: &str, expires_in_s: i64) {
    let at = |s: i64| {
        (chrono::Utc::now() + chrono::Duration::seconds(s)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    state(ws).execute(
        "INSERT INTO dataset_locks (dataset, owner, purpose, acquired_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        &[dataset, owner, purpose, &at(-5), &at(expires_in_s)],
    );
}

fn locks_held(ws: &std::path::Path) -> i64 {
    state(ws).int("SELECT COUNT(*) FROM dataset_locks", &[])
}

#[test]
fn rollback_and_vacuum_wait_for_the_dataset_lock_and_name_its_holder() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    let nums = table(ws, "nums");
    for v in ["10", "20"] {
        dir.set_spec(SPEC.replace("v = \"10\"", &format!("v = \"{v}\"")));
        ok(ws, &["run", "make", "--partition", "2024-01-01", "--json"]);
    }
    assert_eq!(locks_held(ws), 0, "a run takes no maintenance lock");

    // A vacuum in another process holds the lock: rollback and vacuum give up after --lock-wait,
    // naming it, and change nothing.
    hold_lock(ws, "nums", "ops (pid 4242)", "vacuum", 3_600);
    for args in [&["rollback", "nums", "--lock-wait", "1"][..], &["vacuum", "--older-than", "0s", "--lock-wait", "1"]] {
        let started = std::time::Instant::now();
        let out = tidegate(ws).args(args).output().expect("runs");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("nums: ops (pid 4242) holds its maintenance lock to vacuum")
                && stderr.contains("--lock-wait"),
            "{args:?}: {stderr}"
        );
        assert!(started.elapsed() >= std::time::Duration::from_secs(1), "it waited before giving up");
    }
    assert_eq!(latest_version(&nums), 2, "nothing committed");
    assert_eq!(value_of_day1(ws), "v\n20\n");
    assert!(adds(&nums, 1).iter().all(|a| nums.join(path_of(a)).exists()), "nothing vacuumed");

    // The holder finishes while a rollback waits: the rollback goes ahead, then gives the lock up.
    let db = state(ws);
    // The holder lets go once the rollback says it waits (however long the rollback takes to start).
    let err_path = ws.join("rollback.stderr");
    let rollback = tidegate(ws)
        .args(["rollback", "nums", "--lock-wait", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_path).expect("a file for stderr"))
        .spawn()
        .expect("runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    while !std::fs::read_to_string(&err_path).unwrap_or_default().contains("Waiting up to 30s") {
        assert!(std::time::Instant::now() < deadline, "the rollback never said it waits");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    db.execute("DELETE FROM dataset_locks", &[]);
    let out = rollback.wait_with_output().expect("the rollback ends");
    let stderr = std::fs::read_to_string(&err_path).expect("its stderr");
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Waiting up to 30s for vacuum to finish (nums is locked by ops (pid 4242))"), "{stderr}");
    assert_eq!(value_of_day1(ws), "v\n10\n");
    assert_eq!(locks_held(ws), 0, "released when done");

    // A holder that died: its lock expired, and the next command takes it over (journaled).
    hold_lock(ws, "nums", "ops (pid 4243)", "rollback", -1);
    ok(ws, &["vacuum", "--older-than", "0s", "--lock-wait", "0"]);
    assert_eq!(locks_held(ws), 0);
    let (code, history) = json(ws, &["history", "--limit", "10000", "--json"]);
    assert_eq!(code, 0, "{history}");
    let locks: Vec<(String, Value)> = history["happened"]
        .as_array()
        .expect("happened")
        .iter()
        .filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("dataset_")))
        .map(|e| (e["kind"].as_str().unwrap_or_default().to_owned(), e["payload"]["previous_owner"].clone()))
        .collect();
    assert_eq!(
        locks,
        [
            ("dataset_locked".to_owned(), Value::Null),
            ("dataset_unlocked".to_owned(), Value::Null),
            ("dataset_locked".to_owned(), j!("ops (pid 4243)")),
            ("dataset_unlocked".to_owned(), Value::Null),
        ],
        "{history}"
    );
}
