//! Helpers shared by the lake's integration tests: a lake in a temp folder, dataset specs, small
//! batches, and rows rendered as sorted text so versions can be compared exactly.
#![allow(dead_code)] // not every helper is used by every module

use std::sync::Arc;

use chrono::{TimeZone as _, Utc};
use tidegate_core::partition::{Interval, Partition};
use tidegate_core::spec::model::{
    Check, CheckRule, Column, Dataset, DatasetKind, Loc, Partitioning, ReviewFlags, WriteMode,
};
use tidegate_lake::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use tidegate_lake::arrow::datatypes::{DataType, Field, Schema};
use tidegate_lake::arrow::util::display::{ArrayFormatter, FormatOptions};
use tidegate_lake::{Lake, Release, ReleaseItem, StagedVersion};

/// A lake in a fresh temp folder (kept alive by the returned guard).
pub async fn lake() -> (tempfile::TempDir, Lake) {
    let dir = tempfile::tempdir().expect("temp dir");
    let lake = Lake::open(dir.path().join("lake").to_str().expect("utf-8 path")).await.expect("open lake");
    (dir, lake)
}

/// A column of the schema contract.
pub fn col(name: &str, data_type: &str, nullable: bool) -> Column {
    Column { name: name.to_owned(), data_type: data_type.to_owned(), nullable }
}

/// A managed dataset with static partitions.
pub fn dataset(name: &str, write: WriteMode, columns: Vec<Column>) -> Dataset {
    Dataset {
        name: name.to_owned(),
        loc: Loc::default(),
        partitioning: Partitioning::Static { keys: vec![] },
        partition_column: "tg_partition".to_owned(),
        kind: DatasetKind::Managed { write },
        consumers: vec![],
        slice_columns: vec![],
        columns,
        checks: vec![],
        review_flags: ReviewFlags::DEFAULT,
    }
}

/// The usual test contract: `id` int64 not null, `value` int64, `name` string.
pub fn basic_columns() -> Vec<Column> {
    vec![col("id", "int64", false), col("value", "int64", true), col("name", "string", true)]
}

pub fn with_checks(mut dataset: Dataset, checks: Vec<(&str, CheckRule)>) -> Dataset {
    dataset.checks =
        checks.into_iter().map(|(name, rule)| Check { name: name.to_owned(), blocking: true, rule }).collect();
    dataset
}

/// A static partition.
pub fn part(key: &str) -> Partition {
    Partition { key: key.to_owned(), interval: None }
}

/// A day partition `[day, day + 1)` keyed `YYYY-MM-DD`.
pub fn day(y: i32, m: u32, d: u32) -> Partition {
    let start = Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).single().expect("valid date");
    Partition {
        key: start.format("%Y-%m-%d").to_string(),
        interval: Some(Interval { start, end: start + chrono::Duration::days(1) }),
    }
}

/// Rows of (id, value, name) with an optional partition column.
pub fn rows(rows: &[(i64, Option<i64>, Option<&str>)], partition: Option<&[&str]>) -> RecordBatch {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("value", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())),
        Arc::new(Int64Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>())),
        Arc::new(StringArray::from(rows.iter().map(|r| r.2).collect::<Vec<_>>())),
    ];
    if let Some(keys) = partition {
        fields.push(Field::new("tg_partition", DataType::Utf8, true));
        columns.push(Arc::new(StringArray::from(keys.to_vec())));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("valid batch")
}

/// A batch from named columns.
pub fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter(columns).expect("valid batch")
}

pub fn ints(values: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(values.to_vec()))
}

pub fn floats(values: &[f64]) -> ArrayRef {
    Arc::new(Float64Array::from(values.to_vec()))
}

pub fn strs(values: &[&str]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

pub fn bools(values: &[bool]) -> ArrayRef {
    Arc::new(BooleanArray::from(values.to_vec()))
}

/// Every row as `col=value|...` text, sorted, so two reads compare exactly.
pub fn render(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for batch in batches {
        let schema = batch.schema();
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|c| {
                ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default().with_null("null")).expect("formatter")
            })
            .collect();
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = schema
                .fields()
                .iter()
                .zip(&formatters)
                .map(|(f, fmt)| format!("{}={}", f.name(), fmt.value(row)))
                .collect();
            out.push(cells.join("|"));
        }
    }
    out.sort();
    out
}

/// The dataset's rows at the latest version, rendered.
pub async fn read_all(lake: &Lake, dataset: &str) -> Vec<String> {
    render(&lake.read(dataset, None, None).await.expect("read"))
}

/// A one-item release.
pub fn release(id: &str, dataset: &Dataset, staged: StagedVersion, step: &str) -> Release {
    Release {
        release_id: id.to_owned(),
        run_id: format!("run-{id}"),
        spec_hash: "spec-hash".to_owned(),
        items: vec![ReleaseItem { dataset: dataset.clone(), staged, step_identity: step.to_owned() }],
        anchor: None,
    }
}

/// Stages `batch` for `partitions` and publishes it under `step`; returns the table version.
pub async fn put(
    lake: &Lake,
    dataset: &Dataset,
    partitions: &[tidegate_core::partition::Partition],
    batch: RecordBatch,
    step: &str,
) -> u64 {
    let staged = lake.stage_batches(dataset, &format!("stg-{step}"), partitions, vec![batch]).await.expect("stage");
    let publication = lake.publish(&release(&format!("rel-{step}"), dataset, staged, step)).await.expect("publish");
    publication.items[0].table_version
}
