//! Schema evolution on real tables: a nullable column added by any publication (every partitioned
//! write mode), changes readers cannot follow in place (widen, drop) published only by a release
//! that replaces every file, rollbacks across a schema change, and readers no one here wrote
//! (Python `deltalake`, pandas, Polars, DuckDB) reading both sides of the change.

use std::process::Command;
use std::sync::Arc;

use tidegate_core::spec::model::{Column, Dataset, WriteMode};
use tidegate_lake::arrow::array::{Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use tidegate_lake::arrow::datatypes::{DataType, Field, Schema};
use tidegate_lake::{Error, Lake, SCHEMA_CHANGE_KEY};

use crate::common::*;

/// Rows of (id, value, name) with a `score` column too.
fn scored(rows: &[(i64, i64, f64)], partition: Option<&[&str]>) -> RecordBatch {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("value", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
    ];
    let mut columns: Vec<Arc<dyn tidegate_lake::arrow::array::Array>> = vec![
        Arc::new(Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
        Arc::new(Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
        Arc::new(StringArray::from(rows.iter().map(|_| "n").collect::<Vec<_>>())),
        Arc::new(Float64Array::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
    ];
    if let Some(keys) = partition {
        fields.push(Field::new("tg_partition", DataType::Utf8, true));
        columns.push(Arc::new(StringArray::from(keys.to_vec())));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("valid batch")
}

fn with_columns(ds: &Dataset, columns: Vec<Column>) -> Dataset {
    let mut ds = ds.clone();
    ds.columns = columns;
    ds
}

fn plus_score() -> Vec<Column> {
    let mut columns = basic_columns();
    columns.push(col("score", "float64", true));
    columns
}

async fn stage_and_publish(
    lake: &Lake,
    ds: &Dataset,
    keys: &[&str],
    batch: RecordBatch,
    step: &str,
) -> Result<u64, Error> {
    let partitions: Vec<_> = keys.iter().map(|k| part(k)).collect();
    let staged = lake.stage_batches(ds, &format!("stg-{step}"), &partitions, vec![batch]).await?;
    let publication = lake.publish(&release(&format!("rel-{step}"), ds, staged, step)).await?;
    Ok(publication.items[0].table_version)
}

async fn columns_at(lake: &Lake, dataset: &str, version: Option<u64>) -> Vec<String> {
    let batches = lake.read(dataset, None, version).await.expect("read");
    batches.first().map(|b| b.schema().fields().iter().map(|f| f.name().clone()).collect()).unwrap_or_default()
}

#[tokio::test]
async fn a_nullable_column_is_added_by_any_publication_of_every_partitioned_mode() {
    let merge = WriteMode::Merge { keys: vec!["id".to_owned()], order_by: None, delete_marker: None };
    let append = WriteMode::Append { dedup_key: vec!["id".to_owned()], dedup_lookback: 0, order_by: None };
    for (name, write) in [("replaced", WriteMode::Replace), ("appended", append), ("merged", merge)] {
        let (_dir, lake) = lake().await;
        let before = dataset(name, write, basic_columns());
        let v1 = put(&lake, &before, &[part("a")], rows(&[(1, Some(10), Some("n"))], None), "a1").await;

        // The spec gains a nullable column; the next publication (of another partition, and of
        // the same one) carries it.
        let after = with_columns(&before, plus_score());
        let v2 = stage_and_publish(&lake, &after, &["b"], scored(&[(2, 20, 0.5)], None), "b1").await.expect("adds");
        assert_eq!(v2, v1 + 1, "{name}: one commit, data and schema together");
        assert_eq!(
            read_all(&lake, name).await,
            vec![
                "id=1|value=10|name=n|score=null|tg_partition=a".to_owned(),
                "id=2|value=20|name=n|score=0.5|tg_partition=b".to_owned(),
            ],
            "{name}: rows published before the column read it as null"
        );
        let history = lake.history(name).await.expect("history");
        assert_eq!(
            history[0].metadata.get(SCHEMA_CHANGE_KEY).and_then(|v| v.as_str()),
            Some("column score added (float64, nullable)"),
            "{name}: the commit says how the schema changed"
        );
        assert!(!history[1].metadata.contains_key(SCHEMA_CHANGE_KEY), "{name}");
        assert_eq!(columns_at(&lake, name, Some(v1)).await, ["id", "value", "name", "tg_partition"], "{name}");

        // A second publication in the new schema changes nothing more of it.
        let v3 = stage_and_publish(&lake, &after, &["a"], scored(&[(3, 30, 1.5)], None), "a2").await.expect("same");
        assert!(!lake.history(name).await.expect("history")[0].metadata.contains_key(SCHEMA_CHANGE_KEY));
        assert!(read_all(&lake, name).await.contains(&"id=3|value=30|name=n|score=1.5|tg_partition=a".to_owned()));
        assert_eq!(v3, v2 + 1);

        // A publication staged in the old schema after the change is refused as staged for
        // another schema (the engine stages it again); the table is untouched.
        let staged_old =
            lake.stage_batches(&before, "stg-old", &[part("c")], vec![rows(&[(9, None, None)], None)]).await;
        match staged_old {
            // Staging in the old spec now means dropping `score`: staged, then refused below.
            Ok(staged) => {
                let err = lake.publish(&release("rel-old", &before, staged, "c1")).await.expect_err("refused");
                assert!(err.to_string().contains("column score dropped"), "{name}: {err}");
            }
            Err(e) => panic!("{name}: staging in the old spec failed: {e}"),
        }
        assert_eq!(lake.table_version(name).await.expect("version"), Some(v3), "{name}: nothing committed");
    }
}

#[tokio::test]
async fn changes_readers_cannot_follow_are_published_only_by_a_release_that_replaces_every_file() {
    let (_dir, lake) = lake().await;
    let narrow = vec![col("id", "int64", false), col("value", "int32", true), col("name", "string", true)];
    let before = dataset("widened", WriteMode::Replace, narrow);
    let int32_rows = |ids: &[i64], key: &str| {
        batch(vec![
            ("id", ints(ids)),
            ("value", Arc::new(Int32Array::from(ids.iter().map(|i| *i as i32 * 10).collect::<Vec<_>>())) as _),
            ("name", strs(&vec!["n"; ids.len()])),
            ("tg_partition", strs(&vec![key; ids.len()])),
        ])
    };
    let v_a = stage_and_publish(&lake, &before, &["a"], int32_rows(&[1, 2], "a"), "a1").await.expect("a");
    let v_b = stage_and_publish(&lake, &before, &["b"], int32_rows(&[3], "b"), "b1").await.expect("b");

    // `value` widened to int64: a publication of one partition would leave int32 files under an
    // int64 schema, which Delta readers without type widening cannot read. Refused, naming the
    // column and the way; nothing committed.
    let after = with_columns(&before, basic_columns());
    let err = stage_and_publish(&lake, &after, &["a"], rows(&[(1, Some(11), Some("n"))], None), "a2")
        .await
        .expect_err("a partial rewrite is refused");
    assert!(matches!(err, Error::SchemaNeedsRewrite { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("column value widened from int32 to int64"), "{text}");
    assert!(text.contains("tidegate backfill plan"), "names the way: {text}");
    assert_eq!(lake.table_version("widened").await.expect("version"), Some(v_b));

    // A release that replaces every partition publishes it: one commit, every file rewritten.
    let both =
        rows(&[(1, Some(11), Some("n")), (2, Some(21), Some("n")), (3, Some(31), Some("n"))], Some(&["a", "a", "b"]));
    let v_all = stage_and_publish(&lake, &after, &["a", "b"], both, "all").await.expect("a full rewrite");
    assert_eq!(v_all, v_b + 1);
    let latest = lake.read("widened", None, None).await.expect("read");
    assert_eq!(latest[0].schema().field_with_name("value").expect("value").data_type(), &DataType::Int64);
    assert_eq!(read_all(&lake, "widened").await.len(), 3);
    let history = lake.history("widened").await.expect("history");
    assert_eq!(
        history[0].metadata.get(SCHEMA_CHANGE_KEY).and_then(|v| v.as_str()),
        Some("column value widened from int32 to int64")
    );
    // The versions before still read in their own schema.
    let old = lake.read("widened", None, Some(v_a)).await.expect("old");
    assert_eq!(old[0].schema().field_with_name("value").expect("value").data_type(), &DataType::Int32);

    // Rolling back one partition to before the change would put int32 files in the int64 table:
    // refused, naming the version and the column; the whole table restores the old schema.
    let err = lake.rollback("widened", v_b, Some(&["a".to_owned()]), "rb-a", None, None).await.expect_err("refused");
    assert!(matches!(err, Error::SchemaChangedSince { version, .. } if version == v_b), "{err:?}");
    assert!(err.to_string().contains("column value widened from int32 to int64"), "{err}");
    let restored = lake.rollback("widened", v_b, None, "rb-all", None, None).await.expect("whole table");
    let now = lake.read("widened", None, Some(restored)).await.expect("read");
    assert_eq!(now[0].schema().field_with_name("value").expect("value").data_type(), &DataType::Int32);
    assert_eq!(
        read_all(&lake, "widened").await,
        render(&lake.read("widened", None, Some(v_b)).await.expect("read v_b")),
        "the table is what readers saw at version {v_b}"
    );

    // Dropping a column is the same kind of change: refused for one partition.
    let dropped = with_columns(&before, vec![col("id", "int64", false), col("value", "int32", true)]);
    let only_ids = batch(vec![("id", ints(&[4])), ("value", Arc::new(Int32Array::from(vec![40])) as _)]);
    let err = stage_and_publish(&lake, &dropped, &["b"], only_ids, "b2").await.expect_err("a drop is refused");
    assert!(err.to_string().contains("column name dropped (or renamed)"), "{err}");
}

#[tokio::test]
async fn rolling_back_some_partitions_across_an_added_column_keeps_the_column() {
    let (_dir, lake) = lake().await;
    let before = dataset("grown", WriteMode::Replace, basic_columns());
    let v1 = put(&lake, &before, &[part("a")], rows(&[(1, Some(10), Some("n"))], None), "a1").await;
    let after = with_columns(&before, plus_score());
    stage_and_publish(&lake, &after, &["b"], scored(&[(2, 20, 0.5)], None), "b1").await.expect("b");
    stage_and_publish(&lake, &after, &["a"], scored(&[(3, 30, 1.5)], None), "a2").await.expect("a again");

    // Partition a back to version v1 (before the column): its old file fits the grown table
    // (the column reads as null) and b keeps its scores.
    lake.rollback("grown", v1, Some(&["a".to_owned()]), "rb-a", None, None).await.expect("partition rollback");
    assert_eq!(
        read_all(&lake, "grown").await,
        vec![
            "id=1|value=10|name=n|score=null|tg_partition=a".to_owned(),
            "id=2|value=20|name=n|score=0.5|tg_partition=b".to_owned(),
        ]
    );
    // The whole table back to v1 restores the schema readers saw then.
    lake.rollback("grown", v1, None, "rb-all", None, None).await.expect("whole rollback");
    assert_eq!(columns_at(&lake, "grown", None).await, ["id", "value", "name", "tg_partition"]);
}

/// Prints, for the latest version and version argv[2], the columns and the nulls of `score`
/// as each reader sees them. DuckDB counts nulls as `count(*) - count(score)`: a `score IS NULL`
/// filter is pushed into the pyarrow dataset, which drops the files written before the column
/// existed (pyarrow 26 does the same on tables delta-rs itself evolved; docs/reading-tables.md).
const READERS: &str = r#"
import json, os, sys
import duckdb, polars as pl
from deltalake import DeltaTable

path, previous = sys.argv[1], int(sys.argv[2])
def report(version):
    t = DeltaTable(path) if version is None else DeltaTable(path, version=version)
    arrow = t.to_pyarrow_table()
    pandas = t.to_pandas()
    polars = pl.read_delta(path) if version is None else pl.read_delta(path, version=version)
    con = duckdb.connect()
    con.register("t", t.to_pyarrow_dataset())
    duck_columns = [d[0] for d in con.execute("SELECT * FROM t LIMIT 0").description]
    nulls = lambda cols, n: n if "score" in cols else None
    out = {
        "deltalake": [sorted(arrow.column_names), nulls(arrow.column_names, arrow.column("score").null_count if "score" in arrow.column_names else 0), arrow.num_rows],
        "pandas": [sorted(pandas.columns), nulls(list(pandas.columns), int(pandas["score"].isna().sum()) if "score" in pandas.columns else 0), len(pandas)],
        "polars": [sorted(polars.columns), nulls(polars.columns, polars["score"].null_count() if "score" in polars.columns else 0), polars.height],
        "duckdb": [sorted(duck_columns), nulls(duck_columns, con.execute('SELECT count(*) - count(score) FROM t').fetchone()[0] if "score" in duck_columns else 0), con.execute("SELECT count(*) FROM t").fetchone()[0]],
    }
    con.close()
    return out
print(json.dumps({"latest": report(None), "previous": report(previous)}))
sys.stdout.flush()
os._exit(0)
"#;

#[tokio::test]
async fn readers_no_one_here_wrote_see_an_added_column_as_null_in_older_rows_and_absent_before() {
    let has_readers = Command::new("python3")
        .args(["-c", "import deltalake, polars, pandas, duckdb"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_readers {
        tidegate_testkit::service_missing(
            "the schema evolution readers test",
            "Python deltalake, polars, pandas, duckdb",
        );
        return;
    }
    for (name, write) in [
        ("replaced", WriteMode::Replace),
        ("appended", WriteMode::Append { dedup_key: vec!["id".to_owned()], dedup_lookback: 0, order_by: None }),
        ("merged", WriteMode::Merge { keys: vec!["id".to_owned()], order_by: None, delete_marker: None }),
    ] {
        // The Python readers are handed the table's folder.
        let (dir, lake) = folder_lake().await;
        let before = dataset(name, write, basic_columns());
        let v1 = put(&lake, &before, &[part("a")], rows(&[(1, Some(10), None), (2, Some(20), None)], None), "a1").await;
        let after = with_columns(&before, plus_score());
        stage_and_publish(&lake, &after, &["b"], scored(&[(3, 30, 0.5)], None), "b1").await.expect("adds");

        let script = dir.path().join("readers.py");
        std::fs::write(&script, READERS).expect("script");
        let table = lake.root().expect("a folder lake").join(name);
        let output = Command::new("python3").arg(&script).arg(&table).arg(v1.to_string()).output().expect("python");
        assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        for reader in ["deltalake", "pandas", "polars", "duckdb"] {
            assert_eq!(
                report["latest"][reader],
                serde_json::json!([["id", "name", "score", "tg_partition", "value"], 2, 3]),
                "{name}, {reader}, latest: the older rows' score is null"
            );
            assert_eq!(
                report["previous"][reader],
                serde_json::json!([["id", "name", "tg_partition", "value"], null, 2]),
                "{name}, {reader}, version {v1}: no score column yet"
            );
        }
    }
}

#[tokio::test]
async fn a_dataset_without_declared_columns_takes_new_columns_from_its_data() {
    let (dir, lake) = lake().await;
    let ds = dataset("inferred", WriteMode::Replace, Vec::new());
    let v1 = put(&lake, &ds, &[part("a")], rows(&[(1, Some(10), Some("n"))], None), "a1").await;

    // A SQL task's new output column (rows) and a command's (a CSV file) are added as nullable.
    stage_and_publish(&lake, &ds, &["b"], scored(&[(2, 20, 0.5)], None), "b1").await.expect("a new column");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("output folder");
    std::fs::write(out.join("rows.csv"), "id,value,name,score,source\n3,30,n,1.5,vendor\n").expect("csv");
    let staged = lake.stage_files(&ds, "stg-c1", &[part("c")], &out).await.expect("stage the CSV");
    lake.publish(&release("rel-c1", &ds, staged, "c1")).await.expect("publish the CSV");
    assert_eq!(
        read_all(&lake, "inferred").await,
        vec![
            "id=1|value=10|name=n|tg_partition=a|score=null|source=null".to_owned(),
            "id=2|value=20|name=n|tg_partition=b|score=0.5|source=null".to_owned(),
            "id=3|value=30|name=n|tg_partition=c|score=1.5|source=vendor".to_owned(),
        ]
    );
    let history = lake.history("inferred").await.expect("history");
    assert_eq!(
        history[0].metadata.get(SCHEMA_CHANGE_KEY).and_then(|v| v.as_str()),
        Some("column source added (string, nullable)")
    );

    // Data without a column the table has is published with the column null, schema unchanged.
    let before = lake.table_version("inferred").await.expect("version");
    stage_and_publish(&lake, &ds, &["a"], rows(&[(4, Some(40), None)], None), "a2").await.expect("fewer columns");
    assert!(!lake.history("inferred").await.expect("history")[0].metadata.contains_key(SCHEMA_CHANGE_KEY));
    assert!(
        read_all(&lake, "inferred")
            .await
            .contains(&"id=4|value=40|name=null|tg_partition=a|score=null|source=null".to_owned())
    );
    assert!(lake.table_version("inferred").await.expect("version") > before);
    assert_eq!(columns_at(&lake, "inferred", Some(v1)).await, ["id", "value", "name", "tg_partition"]);
}
