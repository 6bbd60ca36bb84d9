//! A rollback restores what readers saw at the version it goes back to: its files, and its schema
//! and table metadata (properties, description), as delta-rs and the Python `deltalake` package
//! read them back after another writer evolved the table.

use std::collections::HashMap;
use std::process::Command;

use deltalake_core::kernel::{DataType, StructField};
use deltalake_core::operations::update_table_metadata::TableMetadataUpdate;
use deltalake_core::{DeltaTable, DeltaTableBuilder};
use tidegate_core::spec::model::WriteMode;
use url::Url;

use crate::common::*;

/// Prints the schema, properties and description of a table's latest version and of version
/// `argv[2]`, as JSON.
const READER: &str = r#"
import json, os, sys
from deltalake import DeltaTable

def describe(dt):
    meta = dt.metadata()
    return {"schema": json.loads(dt.schema().to_json()), "configuration": meta.configuration,
            "description": meta.description}

path = sys.argv[1]
print(json.dumps({"now": describe(DeltaTable(path)),
                  "then": describe(DeltaTable(path, version=int(sys.argv[2])))}))
sys.stdout.flush()
# deltalake 1.6.6 with pyarrow 26 sometimes aborts in interpreter teardown; skip the teardown.
os._exit(0)
"#;

async fn load(url: &Url, version: Option<u64>) -> DeltaTable {
    let builder = DeltaTableBuilder::from_url(url.clone()).expect("table url");
    let builder = match version {
        Some(v) => builder.with_version(v),
        None => builder,
    };
    builder.load().await.expect("load table")
}

#[tokio::test]
async fn a_rollback_restores_the_schema_and_properties_of_its_version() {
    // Another writer (delta-rs itself) is handed the table's folder.
    let (dir, lake) = folder_lake().await;
    let ds = dataset("evolving", WriteMode::Replace, basic_columns());
    let v1 = put(&lake, &ds, &[part("a")], rows(&[(1, Some(1), Some("x"))], None), "v1").await;
    let table_dir = lake.root().expect("a folder lake").join("evolving");
    let url = Url::from_directory_path(&table_dir).expect("table url");

    // Another writer evolves the table: a nullable column, a property and a description.
    let table = load(&url, None).await;
    let table = table.add_columns().with_fields([StructField::new("extra", DataType::LONG, true)]).await.expect("add");
    let owner = HashMap::from([("owner".to_owned(), "analytics".to_owned())]);
    let table = table.set_tbl_properties().with_properties(owner).with_raise_if_not_exists(false).await.expect("set");
    let describe = TableMetadataUpdate { name: None, description: Some("evolved".to_owned()) };
    table.update_table_metadata().with_update(describe).await.expect("describe");
    let then = load(&url, Some(v1)).await;
    let evolved = load(&url, None).await;
    let then_state = then.snapshot().expect("state");
    assert_ne!(evolved.snapshot().expect("state").metadata(), then_state.metadata(), "the test must change something");

    let restored = lake.rollback("evolving", v1, None, "rb", None, None).await.expect("rollback");
    let now = load(&url, None).await;
    let now_state = now.snapshot().expect("state");
    assert_eq!(lake.table_version("evolving").await.expect("version"), Some(restored));
    assert_eq!(now_state.schema(), then_state.schema(), "the schema of version {v1}");
    assert_eq!(now_state.metadata().configuration(), then_state.metadata().configuration());
    assert_eq!(now_state.metadata().description(), then_state.metadata().description());
    assert_eq!(read_all(&lake, "evolving").await, vec!["id=1|value=1|name=x|tg_partition=a"]);

    if !python_has_deltalake() {
        tidegate_testkit::service_missing("the Python reader of the rollback test", "Python deltalake");
        return;
    }
    let script = dir.path().join("describe_delta.py");
    std::fs::write(&script, READER).expect("script");
    let output = Command::new("python3").arg(&script).arg(&table_dir).arg(v1.to_string()).output().expect("run python");
    assert!(output.status.success(), "python failed: {}", String::from_utf8_lossy(&output.stderr));
    let read: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json from python");
    assert_eq!(read["now"], read["then"], "Python reads version {v1}'s schema and metadata: {read}");
    let fields = read["now"]["schema"]["fields"].as_array().expect("fields");
    assert!(fields.iter().all(|f| f["name"] != "extra"), "{read}");
}

fn python_has_deltalake() -> bool {
    Command::new("python3").args(["-c", "import deltalake"]).output().map(|o| o.status.success()).unwrap_or(false)
}

#[tokio::test]
async fn a_commit_cut_short_stops_rollback_reconcile_and_vacuum() {
    let (dir, lake) = lake().await;
    let ds = dataset("cut", WriteMode::Replace, basic_columns());
    let v1 = put(&lake, &ds, &[part("a")], rows(&[(1, Some(1), Some("x"))], None), "v1").await;
    let v2 = put(&lake, &ds, &[part("a")], rows(&[(2, Some(2), Some("y"))], None), "v2").await;
    // The newest commit loses its end mid-line (a copy cut short): its first lines still parse.
    let commit = format!("cut/_delta_log/{v2:020}.json");
    let text = dir.read(&commit).await;
    dir.write(&commit, &text[..text.len() - 10]).await;

    let is_unreadable = |err: &tidegate_lake::Error| {
        matches!(err, tidegate_lake::Error::UnreadableCommit { dataset, file, .. }
            if dataset == "cut" && file.ends_with(&format!("_delta_log/{v2:020}.json")))
    };
    let err = lake.rollback("cut", v1, None, "rb", None, None).await.expect_err("rollback refused");
    assert!(is_unreadable(&err), "{err}");
    let scope = tidegate_lake::Scope { datasets: ["cut".to_owned()].into(), held: Default::default() };
    let owner = |_: &str| Ok(tidegate_lake::Owner::Finished);
    let err = lake.reconcile(&scope, owner, tidegate_lake::Deletion::Abandoned).await.expect_err("reconcile refused");
    assert!(is_unreadable(&err), "{err}");
    let err = lake.vacuum("cut", &[v1].into(), &[], false).await.expect_err("vacuum refused");
    assert!(is_unreadable(&err), "{err}");
    assert!(err.to_string().contains("not valid JSON at line"), "{err}");
}
