//! Running a small pipeline end to end, then reading, querying and rolling back what it
//! published, as a user would from the shell.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

const SPEC: &str = r#"
[project]
name = "data_test"

[datasets.nums]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[datasets.totals]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.make]
command = ["sh", "-c", "printf 'id,v\n1,10\n2,%s\n' \"$TIDEGATE_PARAM_SECOND\" > \"$TIDEGATE_OUTPUT_DIR/n.csv\""]
outputs = ["nums"]
params = { second = "20" }

[tasks.total]
sql = "SELECT SUM(v) AS total FROM nums"
inputs = ["nums"]
outputs = ["totals"]
"#;

fn tidegate(dir: &Path, args: &[&str]) -> String {
    let out = crate::common::tidegate(dir).args(args).output().expect("runs");
    assert!(out.status.success(), "tidegate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn run_then_read_query_and_roll_back() {
    let dir = TestWorkspace::new(SPEC);
    tidegate(dir.path(), &["run", "total", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    let rows: Value =
        serde_json::from_str(&tidegate(dir.path(), &["read", "totals", "--partition", "2024-01-02", "--json"]))
            .expect("json");
    assert_eq!(rows[0]["total"], 30);
    let csv = tidegate(dir.path(), &["sql", "SELECT tg_partition, total FROM totals ORDER BY 1", "--csv"]);
    assert_eq!(csv, "tg_partition,total\n2024-01-01,30\n2024-01-02,30\n");

    // Change the task's parameter, publish again, then roll the change back.
    let changed = SPEC.replace("second = \"20\"", "second = \"50\"");
    dir.set_spec(changed);
    tidegate(dir.path(), &["run", "total", "--partition", "2024-01-02", "--json"]);
    let after: Value =
        serde_json::from_str(&tidegate(dir.path(), &["read", "totals", "--partition", "2024-01-02", "--json"]))
            .expect("json");
    assert_eq!(after[0]["total"], 60);
    // Undoes the newest run that published totals: the second one, which changed 2024-01-02 only.
    let rolled: Value = serde_json::from_str(&tidegate(dir.path(), &["rollback", "totals", "--json"])).expect("json");
    let restored = &rolled["datasets"][0];
    assert_eq!(restored["partitions"], serde_json::json!(["2024-01-02"]), "{rolled}");
    assert!(restored["new_version"].as_u64() > restored["to_version"].as_u64(), "{rolled}");
    let restored: Value =
        serde_json::from_str(&tidegate(dir.path(), &["read", "totals", "--partition", "2024-01-02", "--json"]))
            .expect("json");
    assert_eq!(restored[0]["total"], 30, "rollback restores exactly the previous rows");
    let old: Value =
        serde_json::from_str(&tidegate(dir.path(), &["read", "totals", "--version", "1", "--json"])).expect("json");
    // Version 1 is the first publication: one day, or both when the two steps were validated in
    // the same tick and shared a commit; either way only rows of the first run.
    let old = old.as_array().expect("rows");
    assert!((1..=2).contains(&old.len()), "{old:?}");
    assert!(old.iter().all(|r| r["total"] == 30), "{old:?}");
    let history = tidegate(dir.path(), &["history", "--json"]);
    assert!(history.contains("release_restored"), "the rollback is journaled");
}
