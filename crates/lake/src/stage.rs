//! Staging: a step's output (record batches from SQL, or the Parquet, CSV and JSON-lines files a
//! command left behind) is cast to the dataset schema and written as Parquet in its partitions'
//! folders, `<table>/<column>=<value>/part-<staging_id>-<uuid>.snappy.parquet` (written under
//! `staging/<staging_id>/` first, then moved), with no commit, so no Delta reader can see it. The
//! returned [`StagedVersion`] is what the engine stores and later hands to checks and publication.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufReader, Seek as _};
use std::path::Path as FsPath;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray as _, RecordBatch, UInt32Array, new_null_array};
use arrow::compute::{CastOptions, cast_with_options, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use deltalake_core::DeltaTable;
use deltalake_core::kernel::Add;
use deltalake_core::writer::DeltaWriter as _;
use deltalake_core::writer::record_batch::RecordBatchWriter;
use object_store::ObjectStoreExt as _;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use tidegate_core::partition::Partition;
use tidegate_core::spec::model::{Dataset, DatasetKind, WriteMode};
use url::Url;

use crate::column_names::check_new_columns;
use crate::convert::{Spelling, convert};
use crate::df;
use crate::error::{Error, FileLocation, Result};
use crate::evolution::{staged_schema, staging_schema, target_schema};
use crate::layout::{PartitionColumn, file_name};
use crate::modes;
use crate::table::{Lake, STAGING_DIR, check_segment, file_schema, table_schema};

/// The most files one command may leave in its output folder, so a runaway job cannot make
/// staging list millions of entries.
pub const MAX_INPUT_FILES: usize = 10_000;

/// Rows per batch when reading CSV and JSON-lines files.
const READ_BATCH_ROWS: usize = 8_192;

/// The immutable output of one step for one dataset: staged files plus what the store records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagedVersion {
    /// The dataset the files were staged for.
    pub dataset: String,
    /// The attempt-unique id the files are staged under (in their names, `part-<staging_id>-*`).
    pub staging_id: String,
    /// The partitions this version covers; a partition with no rows is published empty.
    pub partitions: Vec<Partition>,
    /// The staged Parquet files, each holding rows of one partition.
    pub files: Vec<StagedFile>,
    /// Rows across all files.
    pub n_rows: u64,
    /// blake3 of the table schema (names, types, nullability), hex.
    pub schema_hash: String,
    /// blake3 over the sorted hashes of every row: equal for equal contents, whatever the file
    /// layout or row order.
    pub checksum: String,
    /// Statistics of every column of the table schema, in schema order.
    pub columns: Vec<ColumnStats>,
}

impl StagedVersion {
    /// The keys of the partitions this version covers.
    pub fn partition_keys(&self) -> Vec<String> {
        self.partitions.iter().map(|p| p.key.clone()).collect()
    }
}

/// One staged Parquet file, with what is needed to add it to the Delta log later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedFile {
    /// Path relative to the table root as the object store and the Delta log spell it, e.g.
    /// `day=2024-01-05/part-<staging id>-<uuid>.snappy.parquet`.
    pub path: String,
    /// The key of the one partition whose rows the file holds.
    pub partition: String,
    /// The file's size in bytes.
    pub size_bytes: i64,
    /// Rows in the file.
    pub n_rows: u64,
    /// When the file was written, in milliseconds since the Unix epoch (the Add action's time).
    pub modification_time_ms: i64,
    /// Delta statistics JSON as the writer produced it (min, max, null counts).
    pub delta_stats: Option<String>,
}

impl StagedFile {
    /// The Add action that publishes this file into a table partitioned by `column`.
    pub(crate) fn to_add(&self, column: &PartitionColumn) -> Result<Add> {
        Ok(Add {
            path: self.path.clone(),
            partition_values: [(column.name.clone(), Some(column.value(&self.partition)?))].into_iter().collect(),
            size: self.size_bytes,
            modification_time: self.modification_time_ms,
            data_change: true,
            stats: self.delta_stats.clone(),
            tags: None,
            deletion_vector: None,
            base_row_id: None,
            default_row_commit_version: None,
            clustering_provider: None,
        })
    }
}

/// Per-column statistics of a staged version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// The column's name.
    pub name: String,
    /// Null values in the column, across every staged row.
    pub null_count: u64,
    /// The smallest value as text (None when every value is null or the type has no order).
    pub min: Option<String>,
    /// The largest value as text (None when every value is null or the type has no order).
    pub max: Option<String>,
}

impl Lake {
    /// Stages the rows of a SQL task for `partitions`. Rows without the partition column are given
    /// the step's partition (there must then be exactly one); rows with it are checked against
    /// `partitions` (a value may be the key, `2024-W05`, or the column's value, `2024-01-29`).
    pub async fn stage_batches(
        &self,
        dataset: &Dataset,
        staging_id: &str,
        partitions: &[Partition],
        batches: Vec<RecordBatch>,
    ) -> Result<StagedVersion> {
        check_segment("staging id", staging_id)?;
        check_partitions(dataset, partitions)?;
        if dataset.columns.is_empty() {
            // The rows' names become the table's: each must be one a Delta table can hold.
            let table = self.try_load(&dataset.name).await?.as_ref().map(table_schema).transpose()?;
            let data: Vec<_> = batches.iter().map(|b| (FileLocation::Batches, b.schema())).collect();
            check_new_columns(dataset, table.as_deref(), &data)?;
        }
        let first = batches.first().map(|b| b.schema());
        let table = self.ensure_table(dataset, first.as_ref()).await?;
        let data: Vec<SchemaRef> = batches.iter().map(RecordBatch::schema).collect();
        let schema = staging_schema(dataset, &table_schema(&table)?, &data)?;
        let column = PartitionColumn::of_table(&table)?;
        let keys: Vec<String> = partitions.iter().map(|p| p.key.clone()).collect();
        let mut rows = Vec::with_capacity(batches.len());
        for batch in batches {
            let location = FileLocation::Batches;
            rows.push(conform_batch(&dataset.name, &location, Spelling::Typed, &schema, &column, &keys, batch)?);
        }
        self.stage_rows(dataset, &table, staging_id, partitions, &schema, rows).await
    }

    /// Stages the files a command left in `dir`: `*.parquet`, `*.csv` (with a header row) and
    /// `*.jsonl`/`*.ndjson`/`*.json` (one object per line). Hidden entries (`.` or `_`) are
    /// ignored; any other file, and anything that is not a regular file (a symlink, a folder, a
    /// FIFO), is an error naming it, so an output is never silently dropped.
    pub async fn stage_files(
        &self,
        dataset: &Dataset,
        staging_id: &str,
        partitions: &[Partition],
        dir: &FsPath,
    ) -> Result<StagedVersion> {
        let files = list_input_files(&dataset.name, dir)?;
        self.stage_paths(dataset, staging_id, partitions, &files).await
    }

    /// The files a command left in `dir` that [`Lake::stage_files`] would stage (Parquet, CSV and
    /// JSON-lines files; names starting with `.` or `_` are ignored), sorted.
    pub fn output_files(&self, dataset: &Dataset, dir: &FsPath) -> Result<Vec<std::path::PathBuf>> {
        list_input_files(&dataset.name, dir)
    }

    /// Stages exactly `files` (as [`Lake::stage_files`] stages a folder): what a checkpointing
    /// task's granule covers.
    pub async fn stage_paths(
        &self,
        dataset: &Dataset,
        staging_id: &str,
        partitions: &[Partition],
        files: &[std::path::PathBuf],
    ) -> Result<StagedVersion> {
        check_segment("staging id", staging_id)?;
        check_partitions(dataset, partitions)?;
        for file in files {
            let meta = std::fs::symlink_metadata(file).map_err(|e| unreadable(&dataset.name, file, e))?;
            check_regular(&dataset.name, file, meta.file_type())?;
            input_format(&dataset.name, file)?;
        }
        let (first_schema, data) = self.input_schemas(dataset, files).await?;
        let table = self.ensure_table(dataset, first_schema.as_ref()).await?;
        let schema = staging_schema(dataset, &table_schema(&table)?, &data)?;
        let column = PartitionColumn::of_table(&table)?;
        let keys: Vec<String> = partitions.iter().map(|p| p.key.clone()).collect();
        let mut rows = Vec::new();
        for file in files {
            let location = FileLocation::File(file.display().to_string());
            // CSV is all text; JSON and Parquet values carry their types.
            let spelling = match input_format(&dataset.name, file)? {
                InputFormat::Csv => Spelling::Text,
                InputFormat::JsonLines | InputFormat::Parquet => Spelling::Typed,
            };
            let mut offset = 0;
            for batch in read_input_file(&dataset.name, file)? {
                let n_rows = batch.num_rows() as u64;
                let conformed = conform_batch(&dataset.name, &location, spelling, &schema, &column, &keys, batch);
                rows.push(conformed.map_err(|e| place_in_file(e, file, offset))?);
                offset += n_rows;
            }
        }
        self.stage_rows(dataset, &table, staging_id, partitions, &schema, rows).await
    }

    /// The schemas of a step's output files, read before the table is made or grown: the first
    /// file's whole schema when the dataset has no table yet (the table is made from it), and, for
    /// a dataset without declared columns (which takes new columns from its files' headers), each
    /// file's head. Every column name such a dataset would take must be one its table can hold.
    async fn input_schemas(
        &self,
        dataset: &Dataset,
        files: &[std::path::PathBuf],
    ) -> Result<(Option<SchemaRef>, Vec<SchemaRef>)> {
        let existing = self.try_load(&dataset.name).await?;
        let first = match files.first() {
            Some(file) if existing.is_none() => Some(native_schema(&dataset.name, file)?),
            _ => None,
        };
        if !dataset.columns.is_empty() {
            return Ok((first, Vec::new()));
        }
        let located = |file: &FsPath| FileLocation::File(file.display().to_string());
        let mut data = Vec::with_capacity(files.len() + 1);
        if let (Some(schema), Some(file)) = (&first, files.first()) {
            data.push((located(file), schema.clone()));
        }
        for file in files {
            data.push((located(file), native_schema_of_head(&dataset.name, file)?));
        }
        let table = existing.as_ref().map(table_schema).transpose()?;
        check_new_columns(dataset, table.as_deref(), &data)?;
        let heads = data.into_iter().skip(usize::from(first.is_some())).map(|(_, schema)| schema).collect();
        Ok((first, heads))
    }

    /// One staged version made of several staged parts of one step (the granules a checkpointing
    /// task staged as it went, in this attempt or an earlier one, and what it wrote after the last
    /// checkpoint): the files of all, summarised afresh so that the row count, checksum and
    /// statistics describe the whole, as if it had been staged at once.
    pub async fn combine_staged(
        &self,
        dataset: &Dataset,
        staging_id: &str,
        partitions: &[Partition],
        parts: &[StagedVersion],
    ) -> Result<StagedVersion> {
        check_segment("staging id", staging_id)?;
        check_partitions(dataset, partitions)?;
        let table = self.ensure_table(dataset, None).await?;
        let schema = match parts.first() {
            Some(part) => staged_schema(&table, dataset, part).await?,
            None => target_schema(dataset, &table_schema(&table)?)?,
        };
        let hash = schema_hash(&schema);
        if let Some(part) = parts.iter().find(|p| p.schema_hash != hash || p.dataset != dataset.name) {
            return Err(Error::internal(format!(
                "staged part {} of {} was staged for another schema or dataset than the table's; stage the step again",
                part.staging_id, dataset.name
            )));
        }
        let files: Vec<StagedFile> = parts.iter().flat_map(|p| p.files.iter().cloned()).collect();
        let rows = self.read_staged(&table, &dataset.name, &files, &schema).await?;
        if let DatasetKind::Managed { write: WriteMode::Merge { keys, order_by, .. } } = &dataset.kind {
            modes::reject_ties(&dataset.name, keys, order_by.as_deref(), &schema, rows.clone()).await?;
        }
        if let DatasetKind::Managed { write: WriteMode::Append { dedup_key, order_by, .. } } = &dataset.kind {
            modes::reject_null_keys(&dataset.name, dedup_key, &rows)?;
            let column = PartitionColumn::of_table(&table)?;
            let order_by = order_by.as_deref();
            crate::dedup::reject_append_ties(&dataset.name, dedup_key, order_by, &column.name, &schema, rows.clone())
                .await?;
        }
        let summary = summarize(&schema, rows).await?;
        Ok(StagedVersion {
            dataset: dataset.name.clone(),
            staging_id: staging_id.to_owned(),
            partitions: partitions.to_vec(),
            files,
            n_rows: summary.n_rows,
            schema_hash: hash,
            checksum: summary.checksum,
            columns: summary.columns,
        })
    }

    /// Validates conformed rows, writes them and summarises them.
    async fn stage_rows(
        &self,
        dataset: &Dataset,
        table: &DeltaTable,
        staging_id: &str,
        partitions: &[Partition],
        schema: &SchemaRef,
        rows: Vec<RecordBatch>,
    ) -> Result<StagedVersion> {
        // Invariant 7: a merge source with tied duplicates is rejected before any file is written.
        if let DatasetKind::Managed { write: WriteMode::Merge { keys, order_by, .. } } = &dataset.kind {
            modes::reject_ties(&dataset.name, keys, order_by.as_deref(), schema, rows.clone()).await?;
        }
        // A row without an identity cannot be de-duplicated, and which of two different rows of
        // one key to keep is not the task's output order to decide: refused before any file is
        // written.
        if let DatasetKind::Managed { write: WriteMode::Append { dedup_key, order_by, .. } } = &dataset.kind {
            modes::reject_null_keys(&dataset.name, dedup_key, &rows)?;
            let column = PartitionColumn::of_table(table)?;
            let order_by = order_by.as_deref();
            crate::dedup::reject_append_ties(&dataset.name, dedup_key, order_by, &column.name, schema, rows.clone())
                .await?;
        }
        let keys: Vec<String> = partitions.iter().map(|p| p.key.clone()).collect();
        let files = self.write_files(table, &dataset.name, staging_id, schema, &keys, &rows).await?;
        let summary = summarize(schema, rows).await?;
        Ok(StagedVersion {
            dataset: dataset.name.clone(),
            staging_id: staging_id.to_owned(),
            partitions: partitions.to_vec(),
            files,
            n_rows: summary.n_rows,
            schema_hash: schema_hash(schema),
            checksum: summary.checksum,
            columns: summary.columns,
        })
    }

    /// Writes `rows` (already conformed to `schema`) as one Parquet file per non-empty partition
    /// in the partition's folder, named with `staging_id`, without committing, and describes the
    /// files. Each is written under `staging/<staging_id>/write-<uuid>/` and then moved into its
    /// folder, so a file is provably the attempt's wherever a crash leaves it.
    pub(crate) async fn write_files(
        &self,
        table: &DeltaTable,
        dataset: &str,
        staging_id: &str,
        schema: &SchemaRef,
        keys: &[String],
        rows: &[RecordBatch],
    ) -> Result<Vec<StagedFile>> {
        // Nothing to write: no folder, no writer (an empty output stages no file).
        if rows.iter().all(|b| b.num_rows() == 0) {
            return Ok(Vec::new());
        }
        let column = PartitionColumn::of_table(table)?;
        let prefix = format!("{STAGING_DIR}/{staging_id}/write-{}", uuid::Uuid::now_v7().simple());
        let prefix = prefix.as_str();
        let url: Url = table
            .table_url()
            .join(&format!("{prefix}/"))
            .map_err(|e| Error::internal(format!("staging URL for {prefix}: {e}")))?;
        // The local object store refuses a root that does not exist yet.
        self.ensure_folder(dataset, Some(prefix)).await?;
        let parts: Vec<(String, Vec<RecordBatch>)> = keys
            .iter()
            .cloned()
            .zip(split_by_partition(rows, schema, &column, keys)?)
            .filter(|(_, batches)| !batches.is_empty())
            .collect();
        // Parquet encoding is the bulk of a large write (a merge rewrites whole partitions): the
        // partitions are shared out between writers on the runtime's threads, in key order, each
        // writer taking at least WRITER_MIN_ROWS rows so small outputs keep to one writer.
        let n_rows: usize = rows.iter().map(RecordBatch::num_rows).sum();
        let parallelism = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let n_writers = parallelism.min(parts.len()).min(n_rows / WRITER_MIN_ROWS).max(1);
        let files_schema = file_schema(schema, &column.name);
        let mut writers = Vec::with_capacity(n_writers);
        for group in share_out(parts, n_writers) {
            let (url, schema, prefix) = (url.clone(), files_schema.clone(), prefix.to_owned());
            writers.push(tokio::spawn(write_partitions(url, schema, prefix, group)));
        }
        let mut files = Vec::new();
        let mut writers = writers.into_iter();
        while let Some(writer) = writers.next() {
            let written = writer.await.map_err(|e| Error::internal(format!("a Parquet writer stopped: {e}")));
            match written.and_then(|w| w) {
                Ok(written) => files.extend(written),
                Err(e) => {
                    // The rest would only leave more files for reconciliation to remove.
                    writers.for_each(|w| w.abort());
                    return Err(e);
                }
            }
        }
        // Into the partitions' folders, named with the staging id.
        let store = table.object_store();
        for file in &mut files {
            let written = file.path.rsplit('/').next().unwrap_or_default();
            let to = object_store::path::Path::from(format!(
                "{}/{}",
                column.folder(&file.partition)?,
                file_name(staging_id, written)
            ));
            store.rename(&crate::layout::object_path(file.path.as_str()), &to).await?;
            file.path = to.to_string();
        }
        if let Some(root) = self.root() {
            // The emptied write folder (and the attempt's, when nothing else is in it).
            let dir = root.join(dataset).join(prefix);
            let _ = tokio::fs::remove_dir(&dir).await;
            if let Some(parent) = dir.parent() {
                let _ = tokio::fs::remove_dir(parent).await;
            }
        }
        Ok(files)
    }

    /// Reads the rows of staged files back, with their partition column, in the table schema.
    pub(crate) async fn read_staged(
        &self,
        table: &DeltaTable,
        dataset: &str,
        files: &[StagedFile],
        schema: &SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        let store = table.object_store();
        let column = PartitionColumn::of_table(table)?;
        let mut out = Vec::new();
        for file in files {
            let bytes = match store.get(&crate::layout::object_path(file.path.as_str())).await {
                Ok(result) => result.bytes().await?,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(Error::MissingStagedFile { dataset: dataset.to_owned(), path: file.path.clone() });
                }
                Err(e) => return Err(e.into()),
            };
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
            for batch in reader {
                let batch = batch?;
                let n = batch.num_rows();
                let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
                for field in schema.fields() {
                    if *field.name() == column.name {
                        columns.push(column.repeated(&file.partition, n)?);
                    } else {
                        let column = batch
                            .column_by_name(field.name())
                            .cloned()
                            .unwrap_or_else(|| new_null_array(field.data_type(), n));
                        columns.push(column);
                    }
                }
                let merged = RecordBatch::try_new(
                    Arc::new(Schema::new(
                        schema
                            .fields()
                            .iter()
                            .zip(&columns)
                            .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), true))
                            .collect::<Vec<_>>(),
                    )),
                    columns,
                )?;
                out.extend(df::conform(vec![merged], schema)?);
            }
        }
        Ok(out)
    }
}

/// Checks the partitions a step was given: at least one, and keys usable as partition values.
fn check_partitions(dataset: &Dataset, partitions: &[Partition]) -> Result<()> {
    if partitions.is_empty() {
        return Err(Error::InvalidName {
            what: "partition list",
            value: dataset.name.clone(),
            reason: "a step stages at least one partition".to_owned(),
        });
    }
    for p in partitions {
        if p.key.is_empty() || p.key.len() > 128 || p.key.chars().any(|c| c.is_control()) {
            return Err(Error::InvalidName {
                what: "partition key",
                value: p.key.clone(),
                reason: "must be 1 to 128 printable characters".to_owned(),
            });
        }
    }
    Ok(())
}

/// Rows per Parquet writer below which a write is not shared out between threads.
const WRITER_MIN_ROWS: usize = 250_000;

/// Writes each partition's rows (without the partition column) as Parquet files under
/// `<url>` with one writer, flushing after each partition so every file holds one partition.
async fn write_partitions(
    url: Url,
    files_schema: SchemaRef,
    prefix: String,
    parts: Vec<(String, Vec<RecordBatch>)>,
) -> Result<Vec<StagedFile>> {
    let mut writer = RecordBatchWriter::try_new(url.as_str(), files_schema, None, None)?;
    let mut files = Vec::new();
    for (key, batches) in parts {
        let n_rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        for batch in batches {
            writer.write(batch).await?;
        }
        let adds = writer.flush().await?;
        let single = adds.len() == 1;
        for add in adds {
            let file_rows = if single { n_rows } else { stats_rows(add.stats.as_deref())? };
            files.push(StagedFile {
                path: format!("{prefix}/{}", add.path.trim_start_matches('/')),
                partition: key.clone(),
                size_bytes: add.size,
                n_rows: file_rows,
                modification_time_ms: add.modification_time,
                delta_stats: add.stats,
            });
        }
    }
    Ok(files)
}

/// `parts` cut into at most `n` runs of consecutive partitions with about the same number of
/// rows each, in order.
fn share_out(parts: Vec<(String, Vec<RecordBatch>)>, n: usize) -> Vec<Vec<(String, Vec<RecordBatch>)>> {
    let total: usize = parts.iter().flat_map(|(_, b)| b).map(RecordBatch::num_rows).sum();
    let per_group = total.div_ceil(n.max(1)).max(1);
    let mut groups: Vec<Vec<(String, Vec<RecordBatch>)>> = Vec::with_capacity(n);
    let mut current = Vec::new();
    let mut in_current = 0;
    for part in parts {
        let rows: usize = part.1.iter().map(RecordBatch::num_rows).sum();
        if in_current > 0 && in_current + rows > per_group && groups.len() + 1 < n {
            groups.push(std::mem::take(&mut current));
            in_current = 0;
        }
        in_current += rows;
        current.push(part);
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

/// Splits conformed rows by their partition column, in one pass: for each of `keys`, its rows'
/// batches without the partition column. A row of a partition not in `keys` is a bug of the
/// caller (staging fills and validates the column; merge scans only those partitions).
fn split_by_partition(
    rows: &[RecordBatch],
    schema: &SchemaRef,
    column: &PartitionColumn,
    keys: &[String],
) -> Result<Vec<Vec<RecordBatch>>> {
    // Each key's value as text, as the conformed column prints it.
    let shown = column.shown(keys)?;
    let position: HashMap<&str, usize> = shown.iter().enumerate().map(|(i, k)| (k.as_str(), i)).collect();
    let columns = file_columns(schema, &column.name);
    let mut out: Vec<Vec<RecordBatch>> = vec![Vec::new(); keys.len()];
    for batch in rows {
        if batch.num_rows() == 0 {
            continue;
        }
        let given = batch
            .column_by_name(&column.name)
            .ok_or_else(|| Error::internal("conformed rows lack the partition column"))?;
        let text = cast_with_options(given, &DataType::Utf8, &CastOptions::default())?;
        let values = text.as_string::<i32>();
        let mut which: Vec<usize> = Vec::with_capacity(batch.num_rows());
        let mut last: Option<(&str, usize)> = None;
        for value in values {
            let value = value.ok_or_else(|| Error::internal("a conformed row has no partition"))?;
            let i = match last {
                Some((v, i)) if v == value => i,
                _ => {
                    let i = *position.get(value).ok_or_else(|| {
                        Error::internal(format!("a row of partition {value} is not among the partitions written"))
                    })?;
                    last = Some((value, i));
                    i
                }
            };
            which.push(i);
        }
        let projected = batch.project(&columns)?;
        if which.iter().all(|&i| i == which[0]) {
            out[which[0]].push(projected);
            continue;
        }
        let mut indices: Vec<Vec<u32>> = vec![Vec::new(); keys.len()];
        for (row, &i) in which.iter().enumerate() {
            indices[i].push(u32::try_from(row).map_err(|_| Error::internal("a batch of over 4 billion rows"))?);
        }
        for (i, idx) in indices.into_iter().enumerate().filter(|(_, idx)| !idx.is_empty()) {
            out[i].push(take_record_batch(&projected, &UInt32Array::from(idx))?);
        }
    }
    Ok(out)
}

/// Indices of every column except the partition column `partition`.
fn file_columns(schema: &SchemaRef, partition: &str) -> Vec<usize> {
    schema.fields().iter().enumerate().filter(|(_, f)| f.name() != partition).map(|(i, _)| i).collect()
}

/// `numRecords` from a Delta stats JSON.
fn stats_rows(stats: Option<&str>) -> Result<u64> {
    let value: serde_json::Value = serde_json::from_str(stats.unwrap_or("{}"))
        .map_err(|e| Error::internal(format!("writer produced invalid stats: {e}")))?;
    value
        .get("numRecords")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| Error::internal("writer produced stats without numRecords"))
}

/// Converts one batch to the table schema by column name ([`convert`]: only without loss), fills
/// or validates the partition column, and names the file, row and column of anything that does
/// not fit.
pub(crate) fn conform_batch(
    dataset: &str,
    location: &FileLocation,
    spelling: Spelling,
    schema: &SchemaRef,
    partition: &PartitionColumn,
    keys: &[String],
    batch: RecordBatch,
) -> Result<RecordBatch> {
    let mismatch_at = |at: Option<usize>, column: &str, detail: String| Error::SchemaMismatch {
        dataset: dataset.to_owned(),
        location: at.map_or_else(|| location.clone(), |row| location.at_row(row)),
        column: column.to_owned(),
        detail,
    };
    let mismatch = |column: &str, detail: String| mismatch_at(None, column, detail);
    let input = batch.schema();
    if let Some(extra) = input.fields().iter().find(|f| schema.field_with_name(f.name()).is_err()) {
        return Err(mismatch(extra.name(), not_in_schema(extra.name(), schema)));
    }
    let n = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let name = field.name();
        if *name == partition.name {
            columns.push(partition_column(dataset, location, partition, keys, batch.column_by_name(name), n)?);
            continue;
        }
        let column = match batch.column_by_name(name) {
            Some(c) => convert(c, field.data_type(), spelling)
                .map_err(|refused| mismatch_at(Some(refused.row), name, refused.detail(field.data_type())))?,
            None if field.is_nullable() => new_null_array(field.data_type(), n),
            None => return Err(mismatch(name, "missing, and the column is declared not null".into())),
        };
        if !field.is_nullable() && column.null_count() > 0 {
            let first = (0..column.len()).find(|&i| column.is_null(i));
            let detail = format!("{} null values in a column declared not null", column.null_count());
            return Err(mismatch_at(first, name, detail));
        }
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Why a column the rows carry is refused: the table has no column of that name. A column that
/// differs from one of the table's only in case is named, since names are matched exactly.
fn not_in_schema(name: &str, schema: &SchemaRef) -> String {
    let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let folded = name.to_lowercase();
    match known.iter().find(|k| k.to_lowercase() == folded) {
        Some(like) => format!(
            "not in the dataset schema; it differs from column \"{like}\" only in case, and column names are matched \
             exactly: write \"{like}\" (columns: {})",
            known.join(", ")
        ),
        None => format!("not in the dataset schema (columns: {})", known.join(", ")),
    }
}

/// The partition column of a batch, in the column's type: filled with the step's only partition
/// when absent, checked against the step's partitions when present (a value may be written as
/// the partition's key, `2024-W05`, or as the column's value, `2024-01-29`).
fn partition_column(
    dataset: &str,
    location: &FileLocation,
    column: &PartitionColumn,
    keys: &[String],
    given: Option<&ArrayRef>,
    n: usize,
) -> Result<ArrayRef> {
    let expected = || keys.join(", ");
    let Some(given) = given else {
        return match keys {
            [only] => column.repeated(only, n),
            _ => Err(Error::PartitionMismatch {
                dataset: dataset.to_owned(),
                location: location.clone(),
                value: format!("{} \"(none)\"", column.name),
                expected: format!(
                    "{}; rows must carry a {} column when a step stages several partitions",
                    expected(),
                    column.name
                ),
            }),
        };
    };
    let values = column.values(keys)?;
    let shown = cast_with_options(&values, &DataType::Utf8, &CastOptions::default())?;
    let mut position: HashMap<String, u32> = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        let i = u32::try_from(i).map_err(|_| Error::internal("over 4 billion partitions"))?;
        position.insert(key.clone(), i);
        position.insert(column.value(key)?, i);
        position.insert(shown.as_string::<i32>().value(i as usize).to_owned(), i);
    }
    // A typed value (a date, a timestamp in any zone) is read as the column's type first, on the
    // one conversion path every value takes.
    let typed = match given.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Dictionary(_, _) => given.clone(),
        _ => convert(given, &column.data_type(), Spelling::Typed).map_err(|refused| Error::SchemaMismatch {
            dataset: dataset.to_owned(),
            location: location.at_row(refused.row),
            column: column.name.clone(),
            detail: refused.detail(&column.data_type()),
        })?,
    };
    let strings = cast_with_options(&typed, &DataType::Utf8, &CastOptions::default())?;
    let mut indices = Vec::with_capacity(n);
    for (row, value) in strings.as_string::<i32>().iter().enumerate() {
        match value.and_then(|v| position.get(v)) {
            Some(i) => indices.push(*i),
            None => {
                return Err(Error::PartitionMismatch {
                    dataset: dataset.to_owned(),
                    location: location.at_row(row),
                    value: format!("{} {:?}", column.name, value.unwrap_or("null")),
                    expected: expected(),
                });
            }
        }
    }
    Ok(arrow::compute::take(&values, &UInt32Array::from(indices), None)?)
}

/// The kind of a command's output file, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InputFormat {
    Parquet,
    Csv,
    JsonLines,
}

fn input_format(dataset: &str, file: &FsPath) -> Result<InputFormat> {
    let ext = file.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    match ext.as_str() {
        "parquet" | "pq" => Ok(InputFormat::Parquet),
        "csv" => Ok(InputFormat::Csv),
        "jsonl" | "ndjson" | "json" => Ok(InputFormat::JsonLines),
        _ => Err(Error::UnreadableFile {
            dataset: dataset.to_owned(),
            file: file.display().to_string(),
            detail: "unknown extension; expected .parquet, .csv or .jsonl".to_owned(),
        }),
    }
}

/// Refuses an entry of an output folder that is not a regular file, saying what it is. Skipping
/// it would publish the partition without its rows; a link may point anywhere, and a FIFO would
/// block staging forever.
fn check_regular(dataset: &str, path: &FsPath, file_type: std::fs::FileType) -> Result<()> {
    use std::os::unix::fs::FileTypeExt as _;
    if file_type.is_file() {
        return Ok(());
    }
    let what = if file_type.is_symlink() {
        "a symbolic link; Tidegate stages only regular files the task wrote itself: copy the data instead"
    } else if file_type.is_dir() {
        "a folder; Tidegate stages only the files directly in the output folder: move them up, or start \
         the folder's name with '_' or '.' to keep it out of staging"
    } else if file_type.is_fifo() {
        "a named pipe (FIFO); write a regular file"
    } else {
        "neither a regular file nor a folder (a socket or a device); write a regular file"
    };
    Err(Error::UnreadableFile {
        dataset: dataset.to_owned(),
        file: path.display().to_string(),
        detail: format!("it is {what}"),
    })
}

/// The files of a command's output folder, sorted by name: every entry not hidden (`.` or `_`)
/// must be a regular file Tidegate can stage.
fn list_input_files(dataset: &str, dir: &FsPath) -> Result<Vec<std::path::PathBuf>> {
    let unreadable =
        |detail: String| Error::UnreadableFile { dataset: dataset.to_owned(), file: dir.display().to_string(), detail };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| unreadable(e.to_string()))? {
        let entry = entry.map_err(|e| unreadable(e.to_string()))?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(['.', '_']) {
            continue;
        }
        let file_type = entry.file_type().map_err(|e| unreadable(e.to_string()))?;
        check_regular(dataset, &entry.path(), file_type)?;
        files.push(entry.path());
        if files.len() > MAX_INPUT_FILES {
            return Err(unreadable(format!("more than {MAX_INPUT_FILES} output files")));
        }
    }
    files.sort();
    for file in &files {
        input_format(dataset, file)?;
    }
    Ok(files)
}

fn open(dataset: &str, file: &FsPath) -> Result<std::fs::File> {
    std::fs::File::open(file).map_err(|e| Error::UnreadableFile {
        dataset: dataset.to_owned(),
        file: file.display().to_string(),
        detail: e.to_string(),
    })
}

fn unreadable(dataset: &str, file: &FsPath, e: impl std::fmt::Display) -> Error {
    Error::UnreadableFile { dataset: dataset.to_owned(), file: file.display().to_string(), detail: e.to_string() }
}

/// The schema a file carries or implies, used when the first staged file defines the table.
fn native_schema(dataset: &str, file: &FsPath) -> Result<SchemaRef> {
    native_schema_from(dataset, file, None)
}

/// The rows that [`native_schema_of_head`] infers CSV and JSON-lines types from.
const SCHEMA_INFERENCE_ROWS: usize = 1_000;

/// [`native_schema`] from a text file's first [`SCHEMA_INFERENCE_ROWS`] rows: the columns a file
/// holds, and their likely types, without reading it whole.
fn native_schema_of_head(dataset: &str, file: &FsPath) -> Result<SchemaRef> {
    native_schema_from(dataset, file, Some(SCHEMA_INFERENCE_ROWS))
}

fn native_schema_from(dataset: &str, file: &FsPath, max_rows: Option<usize>) -> Result<SchemaRef> {
    let handle = open(dataset, file)?;
    match input_format(dataset, file)? {
        InputFormat::Parquet => Ok(ParquetRecordBatchReaderBuilder::try_new(handle)
            .map_err(|e| unreadable(dataset, file, e))?
            .schema()
            .clone()),
        InputFormat::Csv => {
            let format = arrow::csv::reader::Format::default().with_header(true);
            let (schema, _) = format.infer_schema(handle, max_rows).map_err(|e| unreadable(dataset, file, e))?;
            Ok(Arc::new(schema))
        }
        InputFormat::JsonLines => {
            let (schema, _) = arrow::json::reader::infer_json_schema_from_seekable(BufReader::new(handle), max_rows)
                .map_err(|e| unreadable(dataset, file, e))?;
            Ok(Arc::new(schema))
        }
    }
}

/// Reads a command's output file. CSV columns are read as text and JSON with its inferred types;
/// [`conform_batch`] then casts them to the table schema, naming the column that does not fit.
fn read_input_file(dataset: &str, file: &FsPath) -> Result<Vec<RecordBatch>> {
    let handle = open(dataset, file)?;
    let batches: std::result::Result<Vec<RecordBatch>, arrow::error::ArrowError> = match input_format(dataset, file)? {
        InputFormat::Parquet => ParquetRecordBatchReaderBuilder::try_new(handle)
            .map_err(|e| unreadable(dataset, file, e))?
            .build()
            .map_err(|e| unreadable(dataset, file, e))?
            .collect(),
        InputFormat::Csv => return read_csv(dataset, file, handle),
        InputFormat::JsonLines => {
            let mut reader = BufReader::new(handle);
            let (inferred, _) = arrow::json::reader::infer_json_schema_from_seekable(&mut reader, None)
                .map_err(|e| unreadable(dataset, file, e))?;
            arrow::json::ReaderBuilder::new(Arc::new(inferred))
                .with_batch_size(READ_BATCH_ROWS)
                .build(reader)
                .map_err(|e| unreadable(dataset, file, e))?
                .collect()
        }
    };
    batches.map_err(|e| unreadable(dataset, file, e))
}

/// Reads a CSV output with every column as text (the cast to the table type then reports the
/// column), refusing what the CSV reader would pass over: an empty file (a CSV file has at least
/// its header row), a column named twice, a quoted field that never closes. A header without rows
/// is read as an empty batch of its columns, so the header is checked like any other.
fn read_csv(dataset: &str, file: &FsPath, mut handle: std::fs::File) -> Result<Vec<RecordBatch>> {
    if handle.metadata()?.len() == 0 {
        return Err(unreadable(
            dataset,
            file,
            "the file is empty: a CSV output has at least its header row (write the header alone for a \
             partition with no rows)",
        ));
    }
    let scan = scan_csv(BufReader::new(&handle), None).map_err(|e| unreadable(dataset, file, e))?;
    if let Some(line) = scan.unterminated {
        return Err(unreadable(
            dataset,
            file,
            format!("line {line}: a quoted field opens there and its closing quote never comes"),
        ));
    }
    handle.rewind()?;
    let format = arrow::csv::reader::Format::default().with_header(true);
    let (header, _) = format.infer_schema(&mut handle, Some(0)).map_err(|e| unreadable(dataset, file, e))?;
    let mut seen = BTreeSet::new();
    if let Some(twice) = header.fields().iter().find(|f| !seen.insert(f.name().as_str())) {
        return Err(Error::SchemaMismatch {
            dataset: dataset.to_owned(),
            location: FileLocation::File(file.display().to_string()),
            column: twice.name().clone(),
            detail: "named twice in the header row".to_owned(),
        });
    }
    handle.rewind()?;
    let as_text: Vec<Field> = header.fields().iter().map(|f| Field::new(f.name(), DataType::Utf8, true)).collect();
    let as_text = Arc::new(Schema::new(as_text));
    let batches = arrow::csv::ReaderBuilder::new(as_text.clone())
        .with_header(true)
        .with_batch_size(READ_BATCH_ROWS)
        .build(handle)
        .map_err(|e| unreadable(dataset, file, e))?
        .collect::<std::result::Result<Vec<RecordBatch>, _>>()
        .map_err(|e| unreadable(dataset, file, e))?;
    Ok(if batches.is_empty() { vec![RecordBatch::new_empty(as_text)] } else { batches })
}

/// What one pass over a CSV file's bytes finds, quoting as RFC 4180 (and the CSV reader) does.
#[derive(Debug, Default, PartialEq, Eq)]
struct CsvScan {
    /// The line (1-based) where the wanted record starts, the header being record 0.
    record_line: Option<u64>,
    /// The line where a quoted field that never closes opens.
    unterminated: Option<u64>,
}

/// Scans CSV bytes for where record `wanted` starts (stopping there) and for an unclosed quote.
fn scan_csv(mut reader: impl std::io::BufRead, wanted: Option<u64>) -> std::io::Result<CsvScan> {
    let (mut line, mut records, mut opened) = (1_u64, 0_u64, 0_u64);
    let (mut field_start, mut quoted, mut quote_seen) = (true, false, false);
    if wanted == Some(0) {
        return Ok(CsvScan { record_line: Some(1), unterminated: None });
    }
    loop {
        let chunk = reader.fill_buf()?;
        let n = chunk.len();
        if n == 0 {
            break;
        }
        for &b in chunk {
            if quoted {
                if quote_seen {
                    // `""` is an escaped quote; a quote followed by anything else closed the field.
                    quote_seen = false;
                    if b == b'"' {
                        continue;
                    }
                    quoted = false;
                } else {
                    quote_seen = b == b'"';
                    line += u64::from(b == b'\n');
                    continue;
                }
            }
            match b {
                b'"' if field_start => (quoted, opened, field_start) = (true, line, false),
                b',' => field_start = true,
                b'\n' => {
                    (line, records, field_start) = (line + 1, records + 1, true);
                    if wanted == Some(records) {
                        return Ok(CsvScan { record_line: Some(line), unterminated: None });
                    }
                }
                b'\r' => {}
                _ => field_start = false,
            }
        }
        reader.consume(n);
    }
    Ok(CsvScan { record_line: None, unterminated: (quoted && !quote_seen).then_some(opened) })
}

/// Places an error found at a row of one batch read from `file` (the batch starting at row
/// `offset` of the file) in the file: at its line for a CSV file, at its row otherwise.
fn place_in_file(e: Error, file: &FsPath, offset: u64) -> Error {
    let place = |at: FileLocation| match at {
        FileLocation::Row { file: name, row } => {
            let row = offset + row;
            let is_csv = matches!(input_format("", file), Ok(InputFormat::Csv));
            let line = is_csv.then(|| csv_record_line(file, row + 1)).flatten();
            match line {
                Some(line) => FileLocation::Line { file: name, line },
                None => FileLocation::Row { file: name, row: row + 1 },
            }
        }
        other => other,
    };
    match e {
        Error::SchemaMismatch { dataset, location, column, detail } => {
            Error::SchemaMismatch { dataset, location: place(location), column, detail }
        }
        Error::PartitionMismatch { dataset, location, value, expected } => {
            Error::PartitionMismatch { dataset, location: place(location), value, expected }
        }
        other => other,
    }
}

/// The line where record `record` of a CSV file starts (the header is record 0), if it can be read.
fn csv_record_line(file: &FsPath, record: u64) -> Option<u64> {
    let handle = std::fs::File::open(file).ok()?;
    scan_csv(BufReader::new(handle), Some(record)).ok()?.record_line
}

/// What a staged version records about its rows.
pub(crate) struct Summary {
    pub n_rows: u64,
    pub checksum: String,
    pub columns: Vec<ColumnStats>,
}

/// Row count, content checksum and per-column statistics of conformed rows.
pub(crate) async fn summarize(schema: &SchemaRef, rows: Vec<RecordBatch>) -> Result<Summary> {
    let checksum = content_checksum(schema, &rows)?;
    // No rows, nothing to aggregate: the statistics of an empty version, without starting a
    // query (a task that produced nothing for a partition is common, and a query's set-up costs
    // more than the rest of staging such an output).
    if rows.iter().all(|b| b.num_rows() == 0) {
        let columns = schema
            .fields()
            .iter()
            .map(|f| ColumnStats { name: f.name().clone(), null_count: 0, min: None, max: None })
            .collect();
        return Ok(Summary { n_rows: 0, checksum, columns });
    }
    query_summary(schema, rows, checksum).await
}

/// Row count and per-column statistics of `rows`, by one aggregate query.
async fn query_summary(schema: &SchemaRef, rows: Vec<RecordBatch>, checksum: String) -> Result<Summary> {
    let ctx = df::session();
    df::register_batches(&ctx, "staged", schema, rows)?;
    let mut select = vec!["count(*)".to_owned()];
    for field in schema.fields() {
        let c = df::ident(field.name());
        select.push(format!("count({c})"));
        if has_order(field.data_type()) {
            select.push(format!("CAST(min({c}) AS VARCHAR)"));
            select.push(format!("CAST(max({c}) AS VARCHAR)"));
        } else {
            select.push("CAST(NULL AS VARCHAR)".to_owned());
            select.push("CAST(NULL AS VARCHAR)".to_owned());
        }
    }
    // Aliased: two columns without an order would otherwise both project `CAST(NULL AS ...)`,
    // which the planner refuses as duplicate names.
    let select: Vec<String> = select.iter().enumerate().map(|(i, e)| format!("{e} AS s{i}")).collect();
    let result = df::query(&ctx, &format!("SELECT {} FROM staged", select.join(", "))).await?;
    let n_rows = df::first_u64(&result, 0)?;
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        let base = 1 + 3 * i;
        let non_null = df::first_u64(&result, base)?;
        columns.push(ColumnStats {
            name: field.name().clone(),
            null_count: n_rows.saturating_sub(non_null),
            min: df::first_value(&result, base + 1)?,
            max: df::first_value(&result, base + 2)?,
        });
    }
    Ok(Summary { n_rows, checksum, columns })
}

fn has_order(data_type: &DataType) -> bool {
    !matches!(data_type, DataType::Binary | DataType::LargeBinary | DataType::BinaryView)
}

/// An order-independent content hash: each row is encoded with Arrow's row format and hashed,
/// and the sorted row hashes are hashed again.
pub(crate) fn content_checksum(schema: &SchemaRef, rows: &[RecordBatch]) -> Result<String> {
    let fields: Vec<SortField> = schema.fields().iter().map(|f| SortField::new(f.data_type().clone())).collect();
    let converter = RowConverter::new(fields)?;
    let mut row_hashes: Vec<[u8; 32]> = Vec::new();
    for batch in rows {
        let encoded = converter.convert_columns(batch.columns())?;
        for row in encoded.iter() {
            row_hashes.push(*blake3::hash(row.as_ref()).as_bytes());
        }
    }
    row_hashes.sort_unstable();
    let mut hasher = blake3::Hasher::new();
    hasher.update(&(row_hashes.len() as u64).to_le_bytes());
    for h in &row_hashes {
        hasher.update(h);
    }
    Ok(hasher.finalize().to_hex().to_string())
}

/// blake3 of the schema's names, types and nullability, hex.
pub fn schema_hash(schema: &SchemaRef) -> String {
    let mut hasher = blake3::Hasher::new();
    for field in schema.fields() {
        hasher.update(format!("{}\t{}\t{}\n", field.name(), field.data_type(), field.is_nullable()).as_bytes());
    }
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    fn rows(schema: &SchemaRef, values: &[(i64, &str)]) -> RecordBatch {
        let ids: Vec<i64> = values.iter().map(|(i, _)| *i).collect();
        let keys: Vec<&str> = values.iter().map(|(_, k)| *k).collect();
        RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(arrow::array::Int64Array::from(ids)), Arc::new(StringArray::from(keys))],
        )
        .expect("a batch")
    }

    fn ids(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<arrow::datatypes::Int64Type>().values().to_vec())
            .collect()
    }

    #[test]
    fn rows_are_split_by_partition_in_one_pass_keeping_their_order() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("tg_partition", DataType::Utf8, false),
        ]));
        let column =
            PartitionColumn { name: "tg_partition".to_owned(), kind: crate::layout::PartitionKind::Key, legacy: false };
        let keys = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let batches = vec![
            rows(&schema, &[(1, "b"), (2, "a"), (3, "b"), (4, "b")]),
            rows(&schema, &[(5, "a"), (6, "a")]),
            RecordBatch::new_empty(schema.clone()),
        ];
        let split = split_by_partition(&batches, &schema, &column, &keys).expect("splitting");
        assert_eq!(split.iter().map(|b| ids(b)).collect::<Vec<_>>(), vec![vec![2, 5, 6], vec![1, 3, 4], vec![]]);
        // The partition column stays out of the files.
        assert!(split.iter().flatten().all(|b| b.num_columns() == 1));
        // A row of a partition that is not being written is refused, not dropped.
        let stray = vec![rows(&schema, &[(7, "a"), (8, "z")])];
        assert!(split_by_partition(&stray, &schema, &column, &keys).is_err());

        // Shared out between writers: consecutive partitions, about even in rows, in key order.
        let parts: Vec<(String, Vec<RecordBatch>)> =
            ["a", "b", "c", "d"].iter().map(|k| (k.to_string(), vec![rows(&schema, &[(1, k), (2, k)])])).collect();
        let groups = share_out(parts.clone(), 2);
        let names: Vec<Vec<&str>> = groups.iter().map(|g| g.iter().map(|(k, _)| k.as_str()).collect()).collect();
        assert_eq!(names, vec![vec!["a", "b"], vec!["c", "d"]]);
        assert_eq!(share_out(parts.clone(), 1).len(), 1);
        assert_eq!(share_out(parts, 8).len(), 4);
    }

    #[test]
    fn a_csv_scan_finds_record_lines_and_unclosed_quotes() {
        let scan = |text: &str, wanted| scan_csv(text.as_bytes(), wanted).expect("scanning");
        let text = "a,b\n1,\"two\nlines\"\n2,\"say \"\"hi\"\"\"\n3,x\"y\n";
        assert_eq!(scan(text, Some(1)).record_line, Some(2));
        assert_eq!(scan(text, Some(2)).record_line, Some(4));
        assert_eq!(scan(text, Some(3)).record_line, Some(5));
        assert_eq!(scan(text, None), CsvScan::default());
        assert_eq!(scan("a,b\n1,\"open\n2,3\n", None).unterminated, Some(2));
        assert_eq!(scan("a,b\n1,\"closed\"", None).unterminated, None);
    }

    #[tokio::test]
    async fn an_empty_output_is_summarized_as_the_query_would() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Binary, true),
        ]));
        let empty = vec![RecordBatch::new_empty(schema.clone())];
        let fast = summarize(&schema, empty.clone()).await.expect("summarizing");
        let checksum = content_checksum(&schema, &empty).expect("checksum");
        let queried = query_summary(&schema, empty, checksum.clone()).await.expect("querying");
        assert_eq!(fast.n_rows, queried.n_rows);
        assert_eq!(fast.checksum, queried.checksum);
        assert_eq!(fast.columns, queried.columns);
        // Rows with two binary columns (no order: no min or max) summarize too.
        let two_binary: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Binary, true),
            Field::new("b", DataType::Binary, true),
        ]));
        let row = RecordBatch::try_new(
            two_binary.clone(),
            vec![
                Arc::new(arrow::array::BinaryArray::from(vec![Some(&b"x"[..])])),
                Arc::new(arrow::array::BinaryArray::from(vec![None::<&[u8]>])),
            ],
        )
        .expect("a batch");
        let summary = summarize(&two_binary, vec![row]).await.expect("summarizing binary columns");
        assert_eq!(summary.n_rows, 1);
        assert_eq!(summary.columns[1].null_count, 1);
        // No batch at all is the same empty version.
        let none = summarize(&schema, Vec::new()).await.expect("summarizing");
        assert_eq!((none.n_rows, none.checksum, none.columns), (0, checksum, queried.columns));
    }
}
