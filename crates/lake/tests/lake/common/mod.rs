//! Helpers shared by the lake's integration tests: a lake (in a temp folder in `lake`, under an S3
//! prefix of its own in `lake_shared`), its files reached as either holds them, dataset specs,
//! small batches, and rows rendered as sorted text so versions can be compared exactly.
#![allow(dead_code)] // not every helper is used by every module

use std::sync::Arc;

use chrono::{TimeZone as _, Utc};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use tidegate_core::partition::{Interval, Partition};
use tidegate_core::spec::model::{
    Check, CheckRule, Column, Dataset, DatasetKind, Loc, Partitioning, ReviewFlags, WriteMode,
};
use tidegate_lake::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use tidegate_lake::arrow::datatypes::{DataType, Field, Schema};
use tidegate_lake::arrow::util::display::{ArrayFormatter, FormatOptions};
use tidegate_lake::{Lake, Release, ReleaseItem, StagedVersion};

/// Where a test's lake is, and a scratch folder of the test's own (kept until dropped).
pub struct Place {
    dir: tempfile::TempDir,
    /// The lake's URL: `<scratch>/lake`, or `s3://<bucket>/<prefix>` in `lake_shared`.
    pub url: String,
}

impl Place {
    /// The scratch folder (never the lake's, even on a folder lake).
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The object store holding the lake, and the lake's root in it.
    fn files(&self) -> (Arc<dyn ObjectStore>, ObjectPath) {
        match self.url.strip_prefix("s3://") {
            Some(rest) => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                let store = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .expect("an S3 client from the AWS_* variables");
                (Arc::new(store), ObjectPath::from(prefix))
            }
            None => {
                std::fs::create_dir_all(&self.url).expect("the lake folder");
                let store = object_store::local::LocalFileSystem::new_with_prefix(&self.url).expect("a folder store");
                (Arc::new(store), ObjectPath::from(""))
            }
        }
    }

    fn at(root: &ObjectPath, rel: &str) -> ObjectPath {
        rel.split('/').fold(root.clone(), |path, part| path.join(part))
    }

    /// Whether the lake holds a file at `rel` (a path under its root).
    pub async fn exists(&self, rel: &str) -> bool {
        let (store, root) = self.files();
        match store.head(&Self::at(&root, rel)).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => panic!("looking for {rel}: {e}"),
        }
    }

    /// The lake's file at `rel`.
    pub async fn read(&self, rel: &str) -> Vec<u8> {
        let (store, root) = self.files();
        let got = store.get(&Self::at(&root, rel)).await.unwrap_or_else(|e| panic!("reading {rel}: {e}"));
        got.bytes().await.expect("the bytes").to_vec()
    }

    /// Writes `bytes` at `rel` in the lake, past Tidegate (another tool, or a person).
    pub async fn write(&self, rel: &str, bytes: &[u8]) {
        let (store, root) = self.files();
        store.put(&Self::at(&root, rel), bytes.to_vec().into()).await.unwrap_or_else(|e| panic!("writing {rel}: {e}"));
    }

    /// Deletes the lake's file at `rel`, past Tidegate.
    pub async fn remove(&self, rel: &str) {
        let (store, root) = self.files();
        store.delete(&Self::at(&root, rel)).await.unwrap_or_else(|e| panic!("deleting {rel}: {e}"));
    }

    /// The paths (under the lake's root) of every file below `rel`, sorted.
    pub async fn list(&self, rel: &str) -> Vec<String> {
        use futures::TryStreamExt as _;
        let (store, root) = self.files();
        let listed: Vec<_> = store.list(Some(&Self::at(&root, rel))).try_collect().await.expect("listing");
        let mut paths: Vec<String> = listed
            .into_iter()
            .map(|meta| {
                let parts: Vec<_> = meta.location.prefix_match(&root).expect("under the root").collect();
                parts.iter().map(|p| p.as_ref()).collect::<Vec<_>>().join("/")
            })
            .collect();
        paths.sort();
        paths
    }
}

/// A fresh lake for one test: a temp folder in `lake`, an S3 prefix of its own in `lake_shared`
/// (`TIDEGATE_TEST_S3_URL` and the `AWS_*` variables, set by `.ci/run`; without them the folder,
/// after saying so, and a failure under CI).
pub async fn lake() -> (Place, Lake) {
    if !crate::SHARED {
        return folder_lake().await;
    }
    let Some(base) = std::env::var("TIDEGATE_TEST_S3_URL").ok().filter(|v| !v.is_empty()) else {
        tidegate_testkit::service_missing("the lake suite on S3", "TIDEGATE_TEST_S3_URL (and AWS_* for the client)");
        return folder_lake().await;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("{}/lake-{}", base.trim_end_matches('/'), uuid::Uuid::now_v7());
    let lake = Lake::open(&url).await.expect("open the s3 lake");
    (Place { dir, url }, lake)
}

/// A lake in a fresh temp folder, for a test about the folder itself or one that hands the
/// table's folder to another reader or writer.
pub async fn folder_lake() -> (Place, Lake) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = dir.path().join("lake").to_str().expect("utf-8 path").to_owned();
    let lake = Lake::open(&url).await.expect("open lake");
    (Place { dir, url }, lake)
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
        rewrites: tidegate_core::spec::Rewrites::Review,
        stale: tidegate_core::spec::StalePolicy::Report,
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
