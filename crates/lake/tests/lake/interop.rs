//! Interoperability: a table Tidegate published is read by the Python `deltalake` package, which
//! must see the same rows (count and sum), the previous version, and Tidegate's commit metadata.
//! Skipped, with a message, when `deltalake` is not importable (CI installs it).

use std::process::Command;

use crate::common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::arrow::array::AsArray as _;
use tidegate_lake::arrow::datatypes::Int64Type;

const READER: &str = r#"
import json, os, sys
from deltalake import DeltaTable

path = sys.argv[1]
dt = DeltaTable(path)
table = dt.to_pyarrow_table()
values = table.column("value").to_pylist()
previous = DeltaTable(path, version=dt.version() - 1).to_pyarrow_table()
history = dt.history(1)[0]
print(json.dumps({
    "version": dt.version(),
    "rows": table.num_rows,
    "sum": sum(v for v in values if v is not None),
    "previous_rows": previous.num_rows,
    "partitions": sorted(set(table.column("tg_partition").to_pylist())),
    "release": history.get("tidegate.release_id"),
}))
sys.stdout.flush()
# deltalake 1.6.6 with pyarrow 26 sometimes aborts in interpreter teardown ("terminate called
# without an active exception") after all work is done; skip the teardown.
os._exit(0)
"#;

fn python_has_deltalake() -> bool {
    Command::new("python3").args(["-c", "import deltalake"]).output().map(|o| o.status.success()).unwrap_or(false)
}

#[tokio::test]
async fn python_deltalake_reads_what_tidegate_published() {
    if !python_has_deltalake() {
        tidegate_testkit::service_missing("python_deltalake_reads_what_tidegate_published", "Python deltalake");
        return;
    }
    let (dir, lake) = lake().await;
    let ds = dataset("shared", WriteMode::Replace, basic_columns());
    put(
        &lake,
        &ds,
        &[part("a"), part("b")],
        rows(&[(1, Some(1), Some("x")), (2, Some(2), None)], Some(&["a", "b"])),
        "v1",
    )
    .await;
    put(
        &lake,
        &ds,
        &[part("b"), part("c")],
        rows(&[(3, Some(30), Some("y")), (4, Some(40), Some("z")), (5, None, None)], Some(&["b", "c", "c"])),
        "v2",
    )
    .await;

    let ours = lake.read("shared", None, None).await.expect("read");
    let n_rows: usize = ours.iter().map(|b| b.num_rows()).sum();
    let sum: i64 = ours
        .iter()
        .map(|b| b.column_by_name("value").expect("value").as_primitive::<Int64Type>().iter().flatten().sum::<i64>())
        .sum();

    let script = dir.path().join("read_delta.py");
    std::fs::write(&script, READER).expect("script");
    let table_dir = lake.root().expect("a folder lake").join("shared");
    let output = Command::new("python3").arg(&script).arg(&table_dir).output().expect("run python");
    assert!(output.status.success(), "python failed: {}", String::from_utf8_lossy(&output.stderr));
    let theirs: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json from python");
    assert_eq!(theirs["rows"], n_rows as u64);
    assert_eq!(theirs["sum"], sum);
    assert_eq!(theirs["version"], lake.table_version("shared").await.expect("v").expect("exists"));
    assert_eq!(theirs["previous_rows"], 2);
    assert_eq!(theirs["partitions"], serde_json::json!(["a", "b", "c"]));
    assert_eq!(theirs["release"], "rel-v2");
}
