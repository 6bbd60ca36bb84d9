//! `tidegate vacuum`: after four releases of one partition, vacuum with `--retain-releases 2`
//! deletes only the first release's file; rolling back to each retained release still works, a
//! rollback that needs a vacuumed version is refused without committing, and the staged output of
//! a step that is waiting to publish survives.

mod common;

use common::*;
use serde_json::{Value, json as j};

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
    let dir = tempfile::tempdir().expect("tmp");
    let ws = dir.path();
    let nums = table(ws, "nums");
    // Four releases of 2024-01-01 (table versions 1 to 4), each with a new value.
    for v in ["10", "20", "30", "40"] {
        std::fs::write(ws.join("tidegate.toml"), SPEC.replace("v = \"10\"", &format!("v = \"{v}\""))).expect("spec");
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
    // The journal says who deleted what, and what was kept.
    let entries = vacuum_entries(ws);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["kind"], "vacuumed");
    assert_eq!(entries[0]["payload"]["dataset"], "nums");
    assert_eq!(entries[0]["payload"]["deleted"], j!([file_of(1)]));
    assert_eq!(entries[0]["payload"]["kept_versions"], j!([2, 3, 4]));
    assert_eq!(entries[0]["payload"]["n_bytes_deleted"], size_of_v1);

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

    // The store and the lake agree after all this; reconcile removes the junk, not the waiting step.
    let (code, reconciled) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{reconciled}");
    assert_eq!(reconciled["deleted"], j!(["nums/staging/dead-1/part-0.parquet"]));
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
    let dir = tempfile::tempdir().expect("tmp");
    let ws = dir.path();
    std::fs::write(ws.join("tidegate.toml"), SPEC).expect("spec");
    for (args, expected) in [
        (&["vacuum", "--retain-releases", "0"][..], "0 is not in 1.."),
        (&["vacuum", "--retain-releases", "1", "--older-than", "1d"][..], "cannot be used with"),
        (&["vacuum", "--older-than", "30"][..], "must end in s, m, h, d or w"),
        (&["vacuum", "nosuch"][..], "no dataset named \"nosuch\""),
    ] {
        let out = tidegate(ws).args(args).output().expect("runs");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // Nothing published yet: nothing to do, and the summary says so.
    let text = ok(ws, &["vacuum", "--dry-run"]);
    assert!(text.contains("Total: would delete 0 file(s), 0 B (dry run: nothing was deleted)"), "{text}");
}
