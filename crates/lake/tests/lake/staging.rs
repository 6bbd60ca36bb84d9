//! Staging command output (Parquet, CSV, JSON lines), schema errors that name the file and the
//! column, the staged version record, and reconciliation of abandoned staging files.

use std::sync::Arc;

use crate::common::*;
use tidegate_core::spec::model::WriteMode;
use tidegate_lake::{Deletion, Error, FileLocation, Owner, Scope};

fn write_parquet(path: &std::path::Path, batch: &tidegate_lake::arrow::array::RecordBatch) {
    let file = std::fs::File::create(path).expect("create parquet");
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
    writer.write(batch).expect("write");
    writer.close().expect("close");
}

#[tokio::test]
async fn command_output_in_three_formats_is_cast_to_the_dataset_schema() {
    let (dir, lake) = lake().await;
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    // Parquet with int32 ids (widened to int64), CSV with text, JSON lines with numbers.
    let narrow = batch(vec![
        ("id", Arc::new(tidegate_lake::arrow::array::Int32Array::from(vec![1])) as _),
        ("name", strs(&["parquet"])),
    ]);
    write_parquet(&out.join("a.parquet"), &narrow);
    std::fs::write(out.join("b.csv"), "id,value,name\n2,20,csv\n3,,\n").expect("csv");
    std::fs::write(out.join("c.jsonl"), "{\"id\": 4, \"value\": 40, \"name\": \"json\"}\n").expect("jsonl");
    std::fs::write(out.join(".hidden"), "ignored").expect("hidden");

    let ds = dataset("cmd", WriteMode::Replace, basic_columns());
    let staged = lake.stage_files(&ds, "cmd-1", &[part("p")], &out).await.expect("stage");
    assert_eq!(staged.n_rows, 4);
    assert_eq!(staged.partitions[0].key, "p");
    let id = staged.columns.iter().find(|c| c.name == "id").expect("id stats");
    assert_eq!((id.min.as_deref(), id.max.as_deref(), id.null_count), (Some("1"), Some("4"), 0));
    let value = staged.columns.iter().find(|c| c.name == "value").expect("value stats");
    assert_eq!(value.null_count, 2);

    lake.publish(&release("r", &ds, staged, "cmd-step")).await.expect("publish");
    assert_eq!(
        read_all(&lake, "cmd").await,
        vec![
            "id=1|value=null|name=parquet|tg_partition=p",
            "id=2|value=20|name=csv|tg_partition=p",
            "id=3|value=null|name=null|tg_partition=p",
            "id=4|value=40|name=json|tg_partition=p",
        ]
    );
}

#[tokio::test]
async fn a_value_that_does_not_fit_names_the_file_and_the_column() {
    let (dir, lake) = lake().await;
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out dir");
    std::fs::write(out.join("bad.csv"), "id,value\n1,12\n2,twelve\n").expect("csv");
    let ds = dataset("typed", WriteMode::Replace, basic_columns());
    let err = lake.stage_files(&ds, "s", &[part("p")], &out).await.expect_err("bad value");
    match &err {
        Error::SchemaMismatch { location: FileLocation::Line { file, line }, column, .. } => {
            assert!(file.ends_with("bad.csv"), "{file}");
            assert_eq!(*line, 3, "the line of the value that does not fit");
            assert_eq!(column, "value");
        }
        other => panic!("unexpected error: {other}"),
    }
    let text = err.to_string();
    assert!(text.contains("bad.csv") && text.contains("\"value\""), "{text}");

    std::fs::write(out.join("bad.csv"), "id,colour\n1,red\n").expect("csv");
    let err = lake.stage_files(&ds, "s", &[part("p")], &out).await.expect_err("extra column");
    assert!(matches!(&err, Error::SchemaMismatch { column, .. } if column == "colour"), "{err}");

    std::fs::write(out.join("bad.csv"), "value\n1\n").expect("csv");
    let err = lake.stage_files(&ds, "s", &[part("p")], &out).await.expect_err("missing id");
    assert!(matches!(&err, Error::SchemaMismatch { column, .. } if column == "id"), "{err}");
}

#[tokio::test]
async fn rows_for_a_partition_the_step_does_not_write_are_refused() {
    let (_dir, lake) = lake().await;
    let ds = dataset("parts", WriteMode::Replace, basic_columns());
    let err = lake
        .stage_batches(&ds, "s", &[part("a")], vec![rows(&[(1, None, None)], Some(&["b"]))])
        .await
        .expect_err("wrong partition");
    assert!(matches!(&err, Error::PartitionMismatch { value, .. } if value == "tg_partition \"b\""), "{err}");
    let err = lake
        .stage_batches(&ds, "s", &[part("a"), part("b")], vec![rows(&[(1, None, None)], None)])
        .await
        .expect_err("ambiguous partition");
    assert!(err.to_string().contains("must carry a tg_partition"), "{err}");
}

#[tokio::test]
async fn without_declared_columns_the_first_data_defines_the_schema() {
    let (_dir, lake) = lake().await;
    let ds = dataset("free", WriteMode::Replace, vec![]);
    put(&lake, &ds, &[part("p")], batch(vec![("k", strs(&["x"])), ("n", floats(&[1.5]))]), "f1").await;
    assert_eq!(read_all(&lake, "free").await, vec!["k=x|n=1.5|tg_partition=p"]);
    let err = lake
        .stage_batches(&ds, "f2", &[part("p")], vec![batch(vec![("k", strs(&["x"])), ("n", strs(&["oops"]))])])
        .await
        .expect_err("now the table schema is the contract");
    assert!(matches!(&err, Error::SchemaMismatch { column, .. } if column == "n"), "{err}");
}

#[tokio::test]
async fn equal_contents_have_equal_checksums_whatever_the_row_order() {
    let (_dir, lake) = lake().await;
    let ds = dataset("sums", WriteMode::Replace, basic_columns());
    let a = lake
        .stage_batches(&ds, "a", &[part("p")], vec![rows(&[(1, Some(1), None), (2, Some(2), None)], None)])
        .await
        .expect("stage");
    let b = lake
        .stage_batches(
            &ds,
            "b",
            &[part("p")],
            vec![rows(&[(2, Some(2), None)], None), rows(&[(1, Some(1), None)], None)],
        )
        .await
        .expect("stage");
    let c = lake
        .stage_batches(&ds, "c", &[part("p")], vec![rows(&[(2, Some(3), None), (1, Some(1), None)], None)])
        .await
        .expect("stage");
    assert_eq!(a.checksum, b.checksum);
    assert_ne!(a.checksum, c.checksum);
    assert_eq!(a.schema_hash, c.schema_hash);
}

/// Who owns the staging ids of [`reconcile_deletes_only_unreferenced_files_of_finished_attempts`],
/// as a store would say.
fn owner(id: &str) -> Result<Owner, Error> {
    Ok(match id {
        "live" => Owner::Live,
        "dead" | "late" | "elsewhere" => Owner::Finished,
        _ => Owner::Unknown,
    })
}

#[tokio::test]
async fn reconcile_deletes_only_unreferenced_files_of_finished_attempts() {
    let (dir, lake) = lake().await;
    let ds = dataset("rec", WriteMode::Replace, basic_columns());
    put(&lake, &ds, &[part("p")], rows(&[(1, None, None)], None), "published").await;
    // Replaced later: still referenced by version 1, so rollback can use it.
    put(&lake, &ds, &[part("p")], rows(&[(2, None, None)], None), "published-2").await;
    let stage = |id: &'static str, n: i64| {
        let (lake, ds) = (lake.clone(), ds.clone());
        async move { lake.stage_batches(&ds, id, &[part("p")], vec![rows(&[(n, None, None)], None)]).await }
    };
    let live = stage("live", 3).await.expect("stage");
    let dead = stage("dead", 4).await.expect("stage");
    let foreign = stage("foreign", 6).await.expect("stage");
    // A table the workspace does not write, with a finished attempt's file in it all the same.
    let other = dataset("other", WriteMode::Replace, basic_columns());
    let elsewhere = lake
        .stage_batches(&other, "elsewhere", &[part("p")], vec![rows(&[(7, None, None)], None)])
        .await
        .expect("stage");

    // Another tool's file in the same partition folder (named as delta-rs names its files), and a
    // finished attempt's file where an earlier Tidegate (or a crash before the move) left it.
    let tools = "tg_partition=p/part-00000-6f1c2a1e-0b7e-4e55-9d9c-0a1b2c3d4e5f-c000.snappy.parquet";
    let old_layout = "staging/dead/part-00000-0b7e.snappy.parquet";
    for file in [tools, old_layout] {
        dir.write(&format!("rec/{file}"), b"not a file of this table's log").await;
    }
    let in_rec = |path: &str| format!("rec/{path}");
    // Every staged file sits in its partition's folder, its name carrying the staging id.
    assert!(dead.files[0].path.starts_with("tg_partition=p/part-dead-"), "{}", dead.files[0].path);

    // A file staged moments ago by an attempt its store calls finished is abandoned all the same:
    // the store is asked after the listing, so no file's age is trusted.
    let late = stage("late", 5).await.expect("stage");

    let scope = Scope { datasets: ["rec".to_owned()].into(), held: Default::default() };
    let report = lake.reconcile(&scope, owner, Deletion::Abandoned).await.expect("reconcile");
    let mut deleted = vec![format!("rec/{old_layout}"), format!("rec/{}", dead.files[0].path)];
    deleted.extend(late.files.iter().map(|f| format!("rec/{}", f.path)));
    deleted.sort();
    assert_eq!(report.deleted, deleted);
    assert_eq!(report.n_kept_known, live.files.len());
    assert_eq!(report.n_kept_referenced, 2);
    let not_owned: Vec<&str> = report.not_owned.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(not_owned, [tools, foreign.files[0].path.as_str()], "another tool's, another store's: reported");
    assert!(dir.exists(&in_rec(tools)).await, "another tool's file is left alone");
    let left: Vec<&str> = report.tables_left_alone.iter().map(|t| t.dataset.as_str()).collect();
    assert_eq!(left, ["other"]);
    assert!(!dir.exists(&in_rec(&late.files[0].path)).await);
    assert!(dir.exists(&in_rec(&foreign.files[0].path)).await);
    assert!(dir.exists(&format!("other/{}", elsewhere.files[0].path)).await);
    // Nothing is left for the next reconcile.
    let report = lake.reconcile(&scope, owner, Deletion::Abandoned).await.expect("reconcile");
    assert_eq!(report.deleted, Vec::<String>::new());
    assert!(dir.exists(&in_rec(&live.files[0].path)).await);
    assert!(!dir.exists(&in_rec(&dead.files[0].path)).await);
    // Named, the reported file goes; a file the report does not list cannot be named.
    let published = lake.rollback("rec", 1, None, "rb", None, None).await.expect("rollback");
    assert!(published > 2);
    let named = [format!("rec/{}", foreign.files[0].path)];
    let report = lake.reconcile(&scope, owner, Deletion::Named(&named)).await.expect("delete named");
    assert_eq!(report.deleted, named);
    assert!(!dir.exists(&in_rec(&foreign.files[0].path)).await);
    let kept = [format!("rec/{}", live.files[0].path)];
    let err = lake.reconcile(&scope, owner, Deletion::Named(&kept)).await.expect_err("not reported");
    assert!(matches!(err, Error::NotReported { .. }), "{err}");
    assert!(dir.exists(&in_rec(&live.files[0].path)).await);
    // Rolling back to the first version worked: its file was kept.
    assert_eq!(read_all(&lake, "rec").await, vec!["id=1|value=null|name=null|tg_partition=p"]);
}

/// Regression: two steps staging the first data of a dataset at once both created the table, the
/// loser as version 1 (a second CREATE TABLE), so version 1 held no rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_stagings_create_the_table_once() {
    let (_dir, lake) = lake().await;
    for i in 0..N_CREATE_RACES {
        let ds = dataset(&format!("race{i}"), WriteMode::Replace, basic_columns());
        let stage = |id: &'static str, key: &'static str| {
            let (lake, ds) = (lake.clone(), ds.clone());
            tokio::spawn(async move {
                lake.stage_batches(&ds, id, &[part(key)], vec![rows(&[(1, None, None)], None)]).await
            })
        };
        let (a, b) = (stage("a", "p"), stage("b", "q"));
        a.await.expect("join").expect("stage a");
        b.await.expect("join").expect("stage b");
        let history = lake.history(&ds.name).await.expect("history");
        let creates = history.iter().filter(|c| c.operation.as_deref() == Some("CREATE TABLE")).count();
        assert_eq!((creates, history.len()), (1, 1), "race {i}: {history:?}");
    }
}

/// Attempts at the creation race; each is a fresh table.
const N_CREATE_RACES: usize = 20;

#[tokio::test]
async fn bad_names_are_refused() {
    let (_dir, lake) = lake().await;
    let ds = dataset("_hidden", WriteMode::Replace, basic_columns());
    let err =
        lake.stage_batches(&ds, "s", &[part("p")], vec![rows(&[(1, None, None)], None)]).await.expect_err("hidden");
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
    let ds = dataset("ok", WriteMode::Replace, basic_columns());
    let err = lake
        .stage_batches(&ds, "../up", &[part("p")], vec![rows(&[(1, None, None)], None)])
        .await
        .expect_err("traversal");
    assert!(matches!(err, Error::InvalidName { what: "staging id", .. }), "{err}");
}
