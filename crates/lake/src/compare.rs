//! Backfill review: what a backfill's staged versions would change in a dataset, partition by
//! partition, against a published version; and how much data a set of partitions holds (the blast
//! radius of rewriting them). The comparison is set-based SQL in one DataFusion session, grouped by
//! the partition column, and its output is deterministic because callers hash it to bind an
//! approval to exactly what was reviewed. Each column is compared in a type that holds both
//! sides' values (`layout`), so a backfill that changes a column's type shows what it changes.

mod layout;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{Array, AsArray as _, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef, UInt64Type};
use datafusion::prelude::{SessionConfig, SessionContext};
use deltalake_core::DeltaTable;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_core::spec::model::{Dataset, DatasetKind, ReviewFlags, WriteMode};

use crate::df;
use crate::error::{Error, FileLocation, Result};
use crate::layout::PartitionColumn;
use crate::read;
use crate::stage::{StagedFile, StagedVersion, schema_hash};
use crate::table::{Lake, active_files, table_schema};
use layout::{Layout, holds};

/// How a null value of a slice column is reported in [`SliceDelta::value`].
pub const NULL_SLICE_VALUE: &str = "(null)";

/// The most values of one slice column reported per partition: those with the most differing
/// rows, so a high-cardinality slice column cannot make the comparison unbounded.
pub const MAX_SLICE_VALUES: usize = 100;

/// What to compare and how to report it.
#[derive(Debug, Clone, Copy)]
pub struct CompareSpec<'a> {
    /// The dataset whose staged versions are compared; its kind says whether it is a snapshot.
    pub dataset: &'a Dataset,
    /// The columns identifying a row; empty compares whole rows as multisets.
    pub keys: &'a [String],
    /// Columns the differences are broken down by.
    pub slice_columns: &'a [String],
    /// When a partition is flagged (see [`ReviewFlags`]): its row count, its changed rows, a
    /// numeric column's mean or a column's null rate past a limit, or a schema change.
    pub flags: ReviewFlags,
    /// The most sample rows reported per partition and kind (added, removed, changed).
    pub sample_rows: usize,
}

/// The difference a backfill would make to a dataset, partition by partition (sorted by key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Comparison {
    /// The name of the compared dataset.
    pub dataset: String,
    /// The version compared against; `None` when nothing was published, so every row is added.
    pub published_version: Option<u64>,
    /// The key columns rows were matched by; empty when whole rows were compared as multisets.
    pub keys: Vec<String>,
    /// The limits the partitions were flagged by: part of what a reviewer saw, so part of the
    /// comparison an approval binds.
    #[serde(default)]
    pub flags: ReviewFlags,
    /// How the staged schema differs from the published one, e.g. `adds column score`; empty
    /// when they are the same (or nothing was published).
    #[serde(default)]
    pub schema_changes: Vec<String>,
    /// One entry per staged partition, sorted by partition key.
    pub partitions: Vec<PartitionComparison>,
    /// The counts summed over `partitions`.
    pub totals: ComparisonTotals,
}

/// The sums over every compared partition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ComparisonTotals {
    /// Published rows of the compared partitions.
    pub rows_before: u64,
    /// Staged rows of the compared partitions.
    pub rows_after: u64,
    /// Rows the backfill would add (see [`PartitionComparison::n_added`]).
    pub n_added: u64,
    /// Rows the backfill would remove (see [`PartitionComparison::n_removed`]).
    pub n_removed: u64,
    /// Rows the backfill would change (see [`PartitionComparison::n_changed`]).
    pub n_changed: u64,
    /// The number of partitions with at least one flag.
    pub n_flagged: u64,
}

/// One partition: the published rows ("before") against the staged rows ("after").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartitionComparison {
    /// The partition key (the value of the partition column).
    pub partition: String,
    /// Rows of this partition in the published version (for a snapshot, every published row).
    pub rows_before: u64,
    /// Rows of this partition in the staged versions.
    pub rows_after: u64,
    /// Rows whose key is only staged (without keys: rows staged more often than published).
    pub n_added: u64,
    /// Rows whose key is only published (without keys: rows published more often than staged).
    pub n_removed: u64,
    /// Keys present on both sides with some other column distinct (always 0 without keys).
    pub n_changed: u64,
    /// Every column except the keys and the partition column, sorted by name.
    pub columns: Vec<ColumnDelta>,
    /// Sorted by column, then value.
    pub slices: Vec<SliceDelta>,
    /// `{"key": {..}, "before": {..}, "after": {..}}` (before and after without the keys),
    /// ordered by key. Null values are left out of the objects.
    pub sample_changed: Vec<Value>,
    /// Whole staged rows, ordered by key (without keys: by every column).
    pub sample_added: Vec<Value>,
    /// Whole published rows, ordered like `sample_added`.
    pub sample_removed: Vec<Value>,
    /// Why the partition deserves a closer look, e.g. `rows changed 12.5% > 5%`.
    pub flagged: Vec<String>,
}

/// How one column moved in one partition. The numbers are `None` for non-numeric columns and for
/// a side with no non-null value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ColumnDelta {
    /// The column's name.
    pub column: String,
    /// `int64 -> float64` when the backfill changed the column's type (its values are then
    /// compared in a type that holds both); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_change: Option<String>,
    /// The sum of the column's published values in the partition.
    pub sum_before: Option<f64>,
    /// The sum of the column's staged values in the partition.
    pub sum_after: Option<f64>,
    /// The smallest published value.
    pub min_before: Option<f64>,
    /// The smallest staged value.
    pub min_after: Option<f64>,
    /// The largest published value.
    pub max_before: Option<f64>,
    /// The largest staged value.
    pub max_after: Option<f64>,
    /// The mean of the published non-null values.
    pub mean_before: Option<f64>,
    /// The mean of the staged non-null values.
    pub mean_after: Option<f64>,
    /// The share of null values among the published rows, 0 to 1 (0 when there are none).
    pub null_rate_before: f64,
    /// The share of null values among the staged rows, 0 to 1 (0 when there are none).
    pub null_rate_after: f64,
}

/// The rows of one partition with one value of a slice column. A changed row counts under its
/// staged value, a removed row under its published value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SliceDelta {
    /// The slice column.
    pub column: String,
    /// The value as text, [`NULL_SLICE_VALUE`] for null.
    pub value: String,
    /// Published rows of the partition with this value.
    pub rows_before: u64,
    /// Staged rows of the partition with this value.
    pub rows_after: u64,
    /// Added rows with this (staged) value.
    pub n_added: u64,
    /// Removed rows with this (published) value.
    pub n_removed: u64,
    /// Changed rows whose staged value is this one.
    pub n_changed: u64,
}

/// How much data one partition of a table holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartitionSize {
    /// The partition key.
    pub partition: String,
    /// Rows in the partition's active files, from their statistics or counted by reading them.
    pub n_rows: u64,
    /// The total size of the partition's active files, in bytes.
    pub n_bytes: u64,
    /// The number of active files in the partition.
    pub n_files: u64,
}

impl Lake {
    /// Compares staged versions (a backfill's output, possibly several covering different
    /// partitions of one dataset) with the published table at `published_version` (`None`: the
    /// dataset has nothing published, so every row is added), partition by partition. Every
    /// staged partition is compared, an empty one showing all its published rows removed.
    pub async fn compare(
        &self,
        spec: &CompareSpec<'_>,
        published_version: Option<u64>,
        staged: &[StagedVersion],
    ) -> Result<Comparison> {
        let name = &spec.dataset.name;
        let partitions = staged_partitions(name, staged)?;
        let mut comparison = Comparison {
            dataset: name.clone(),
            published_version,
            keys: spec.keys.to_vec(),
            flags: spec.flags,
            schema_changes: Vec::new(),
            partitions: Vec::new(),
            totals: ComparisonTotals::default(),
        };
        if partitions.is_empty() {
            return Ok(comparison);
        }
        let table = self.load(name).await?;
        let column = PartitionColumn::of_table(&table)?;
        let published = match published_version {
            Some(version) => Some(self.load_at(name, Some(version)).await?),
            None => None,
        };
        let before = published.as_ref().map(table_schema).transpose()?;
        let after = self.staged_rows_schema(&table, spec.dataset, staged).await?;
        let layout = Layout::new(name, &table_schema(&table)?, before.as_ref(), &after, spec, &column.name)?;

        let ctx = single_partition_session();
        // Partition -> how the schema it was staged with differs from the published one.
        let mut schema_flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
        match (&published, &before) {
            (Some(published), Some(before)) => {
                for (version, change) in self.schema_changes(&table, spec.dataset, before, staged).await? {
                    for key in version.partition_keys() {
                        schema_flags.entry(key).or_default().push(format!("schema changed: {change}"));
                    }
                    if !comparison.schema_changes.contains(&change) {
                        comparison.schema_changes.push(change);
                    }
                }
                self.register_published(&ctx, spec.dataset, published, before, &column, &partitions).await?;
            }
            _ => {
                let only_partition = Arc::new(Schema::new(vec![after.field_with_name(&column.name)?.clone()]));
                df::register_batches(&ctx, "published_rows", &only_partition, Vec::new())?;
            }
        }
        let rows = self.rows_after(&table, published.as_ref(), spec.dataset, staged, &after).await?;
        df::register_batches(&ctx, "staged_rows", &after, rows)?;
        for sql in [
            format!("CREATE VIEW published AS {}", layout.side_sql(Side::Before, "published_rows")),
            format!("CREATE VIEW staged AS {}", layout.side_sql(Side::After, "staged_rows")),
            format!("CREATE VIEW changes AS {}", layout.changes_sql()),
            format!("CREATE TABLE differing AS {}", layout.differing_sql()),
        ] {
            df::query(&ctx, &sql).await?;
        }

        // Keyed by each partition's value as query results print it (`2024-01-29` for `2024-W05`).
        let shown = column.shown(&partitions)?;
        let mut by_partition: BTreeMap<String, PartitionComparison> =
            partitions.iter().zip(shown).map(|(p, shown)| (shown, layout.empty(p))).collect();
        layout.add_column_stats(&ctx, "published", &mut by_partition, Side::Before).await?;
        layout.add_column_stats(&ctx, "staged", &mut by_partition, Side::After).await?;
        add_counts(&ctx, &mut by_partition).await?;
        for idx in 0..layout.slices.len() {
            layout.add_slices(&ctx, idx, &mut by_partition).await?;
        }
        if spec.sample_rows > 0 {
            layout.add_samples(&ctx, spec.sample_rows, &mut by_partition).await?;
        }
        for (_, mut partition) in by_partition {
            partition.flagged = flags(&partition, &spec.flags);
            if spec.flags.schema_change {
                partition.flagged.extend(schema_flags.remove(&partition.partition).unwrap_or_default());
            }
            comparison.totals.add(&partition);
            comparison.partitions.push(partition);
        }
        Ok(comparison)
    }

    /// The rows after publication in the staged partitions, in `after`: for a merge or an append
    /// (which keep published rows) what publishing each staged version onto `published` leaves;
    /// otherwise, or with nothing published, the staged rows.
    async fn rows_after(
        &self,
        table: &DeltaTable,
        published: Option<&DeltaTable>,
        dataset: &Dataset,
        staged: &[StagedVersion],
        after: &SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        match published {
            Some(published) if crate::modes::keeps_published_rows(dataset) => {
                let mut rows = Vec::new();
                for version in staged {
                    rows.extend(crate::modes::published_after(self, published, dataset, version, after).await?);
                }
                Ok(rows)
            }
            _ => {
                let files: Vec<StagedFile> = staged.iter().flat_map(|s| s.files.iter().cloned()).collect();
                self.read_staged(table, &dataset.name, &files, after).await
            }
        }
    }

    /// The schema the staged rows are compared in: each column in the type it was staged with,
    /// read from the staged files' own footers (never cast to the table's type: a widened column
    /// keeps its new values), the partition column as the table has it. Versions staged with
    /// different types of a column are read in the type that holds both.
    async fn staged_rows_schema(
        &self,
        table: &DeltaTable,
        dataset: &Dataset,
        staged: &[StagedVersion],
    ) -> Result<SchemaRef> {
        let partition = PartitionColumn::of_table(table)?.name;
        let mut fields: Vec<Field> = Vec::new();
        for version in staged {
            let Some(file) = version.files.first() else { continue };
            let written = crate::evolution::file_schema(table, &dataset.name, file).await?;
            for field in written.fields().iter().filter(|f| *f.name() != partition) {
                let Some(known) = fields.iter_mut().find(|f| f.name() == field.name()) else {
                    fields.push(Field::new(field.name(), field.data_type().clone(), true));
                    continue;
                };
                match (holds(known.data_type(), field.data_type()), holds(field.data_type(), known.data_type())) {
                    (true, _) => {}
                    (false, true) => *known = Field::new(field.name(), field.data_type().clone(), true),
                    (false, false) => {
                        return Err(Error::SchemaMismatch {
                            dataset: dataset.name.clone(),
                            location: FileLocation::Table,
                            column: field.name().clone(),
                            detail: format!(
                                "the backfill's partitions were staged with different types of it ({} and {}); start \
                                 the backfill again so every partition is staged under one spec",
                                crate::evolution::type_name(known.data_type()),
                                crate::evolution::type_name(field.data_type())
                            ),
                        });
                    }
                }
            }
        }
        fields.push(table_schema(table)?.field_with_name(&partition)?.clone());
        Ok(Arc::new(Schema::new(fields)))
    }

    /// Each staged version whose schema differs from `published`, with how: column by column,
    /// with types, when its schema can be rebuilt from the dataset's spec (and its files); by
    /// column names otherwise.
    async fn schema_changes<'a>(
        &self,
        table: &DeltaTable,
        dataset: &Dataset,
        published: &SchemaRef,
        staged: &'a [StagedVersion],
    ) -> Result<Vec<(&'a StagedVersion, String)>> {
        let partition = PartitionColumn::of_table(table)?.name;
        let mut changes = Vec::new();
        for version in staged.iter().filter(|v| v.schema_hash != schema_hash(published)) {
            let rebuilt = crate::evolution::staged_schema(table, dataset, version).await?;
            let change = if schema_hash(&rebuilt) == version.schema_hash {
                crate::evolution::diff(published, &rebuilt).to_string()
            } else {
                schema_change(published, version, &partition)
            };
            changes.push((version, change));
        }
        Ok(changes)
    }

    /// Registers the published rows the staged partitions replace as `published_rows`, in the
    /// published version's own schema: those partitions' rows or, for a snapshot (the whole
    /// dataset), every row, shown under the staged partition's key.
    async fn register_published(
        &self,
        ctx: &SessionContext,
        dataset: &Dataset,
        published: &DeltaTable,
        schema: &SchemaRef,
        column: &PartitionColumn,
        partitions: &[String],
    ) -> Result<()> {
        match (&dataset.kind, partitions) {
            // A snapshot is the whole dataset: the new one replaces every published row,
            // whichever partition (week, month) the current snapshot was taken for.
            (DatasetKind::Managed { write: WriteMode::Snapshot }, [key]) => {
                let idx = schema.index_of(&column.name)?;
                let rows = read::scan(published, None, schema).await?;
                let rows = rows
                    .into_iter()
                    .map(|batch| {
                        let mut columns = batch.columns().to_vec();
                        columns[idx] = column.repeated(key, batch.num_rows())?;
                        Ok(RecordBatch::try_new(schema.clone(), columns)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                df::register_batches(ctx, "published_rows", schema, rows)
            }
            _ => {
                read::register_table(ctx, "published_table", published).await?;
                let sql = format!(
                    "CREATE VIEW published_rows AS SELECT * FROM published_table WHERE {}",
                    column.sql_in(partitions)?
                );
                df::query(ctx, &sql).await.map(|_| ())
            }
        }
    }

    /// Rows, bytes and files of some partitions in the dataset's latest version, sorted by
    /// partition; an empty `partitions` means every partition the table holds. A partition with
    /// no data, or a dataset with no table yet, has zeros.
    pub async fn partition_sizes(&self, dataset: &str, partitions: &[String]) -> Result<Vec<PartitionSize>> {
        let size = |p: &String| PartitionSize { partition: p.clone(), n_rows: 0, n_bytes: 0, n_files: 0 };
        let mut sizes: BTreeMap<String, PartitionSize> = partitions.iter().map(|p| (p.clone(), size(p))).collect();
        let Some(table) = self.try_load(dataset).await? else { return Ok(sizes.into_values().collect()) };
        let column = PartitionColumn::of_table(&table)?;
        let wanted = (!partitions.is_empty()).then_some(partitions);
        // Partitions with a file whose statistics lack a row count are counted by reading them.
        let mut uncounted = BTreeSet::new();
        for add in active_files(&table, wanted).await? {
            let value = add.partition_values.get(&column.name).cloned().flatten();
            let Some(key) = value.map(|v| column.key_of(&v).unwrap_or(v)) else { continue };
            let entry = sizes.entry(key.clone()).or_insert_with(|| size(&key));
            entry.n_files += 1;
            entry.n_bytes += u64::try_from(add.size).unwrap_or_default();
            match stats_rows(add.stats.as_deref()) {
                Some(n) => entry.n_rows += n,
                None => {
                    uncounted.insert(key);
                }
            }
        }
        if !uncounted.is_empty() {
            let keys: Vec<String> = uncounted.into_iter().collect();
            let ctx = df::session();
            read::register_table(&ctx, "t", &table).await?;
            let p = df::ident(&column.name);
            let sql = format!("SELECT {p}, count(*) FROM t WHERE {} GROUP BY {p}", column.sql_in(&keys)?);
            let counted = df::query(&ctx, &sql).await?;
            for key in &keys {
                if let Some(entry) = sizes.get_mut(key) {
                    entry.n_rows = 0;
                }
            }
            for batch in &counted {
                for (value, n) in texts(batch, 0)?.into_iter().zip(counts(batch, 1)?) {
                    let key = value.map(|v| column.key_of(&v).unwrap_or(v));
                    if let Some(entry) = key.and_then(|k| sizes.get_mut(&k)) {
                        entry.n_rows = n;
                    }
                }
            }
        }
        Ok(sizes.into_values().collect())
    }
}

/// A session that runs every plan as one partition, so floating-point sums add the rows in the
/// same order on every call and the comparison (which callers hash) never changes between runs.
fn single_partition_session() -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1))
}

/// Which side of the comparison a statistic describes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    Before,
    After,
}

impl ComparisonTotals {
    /// Counts one partition in.
    fn add(&mut self, partition: &PartitionComparison) {
        self.rows_before += partition.rows_before;
        self.rows_after += partition.rows_after;
        self.n_added += partition.n_added;
        self.n_removed += partition.n_removed;
        self.n_changed += partition.n_changed;
        self.n_flagged += u64::from(!partition.flagged.is_empty());
    }
}

/// The partition keys `staged` (versions of `dataset`) covers, sorted; a version of another
/// dataset is a bug.
fn staged_partitions(dataset: &str, staged: &[StagedVersion]) -> Result<Vec<String>> {
    let mut keys = BTreeSet::new();
    for version in staged {
        if version.dataset != dataset {
            return Err(Error::internal(format!(
                "comparing dataset {dataset:?} with a version staged for {:?}",
                version.dataset
            )));
        }
        keys.extend(version.partition_keys());
    }
    Ok(keys.into_iter().collect())
}

/// Fills the added, removed and changed counts from the `differing` table.
async fn add_counts(ctx: &SessionContext, by_partition: &mut BTreeMap<String, PartitionComparison>) -> Result<()> {
    let sql = "SELECT p, status, sum(n) FROM differing GROUP BY p, status";
    for batch in &df::query(ctx, sql).await? {
        let rows = texts(batch, 0)?.into_iter().zip(texts(batch, 1)?).zip(counts(batch, 2)?);
        for ((key, status), n) in rows {
            let Some(partition) = key.and_then(|k| by_partition.get_mut(&k)) else { continue };
            match status.as_deref() {
                Some("added") => partition.n_added = n,
                Some("removed") => partition.n_removed = n,
                Some("changed") => partition.n_changed = n,
                other => return Err(Error::internal(format!("unexpected change status {other:?}"))),
            }
        }
    }
    Ok(())
}

/// Why a partition deserves a closer look, by the statistics `limits` sets: its row count, its
/// rows added, removed and changed together (percent of the published rows), a numeric column's
/// mean (percent of the published mean), a column's null rate (a rise, in percentage points). A
/// partition with no published rows has nothing to move from, so none of these flag it.
fn flags(partition: &PartitionComparison, limits: &ReviewFlags) -> Vec<String> {
    let mut out = Vec::new();
    if partition.rows_before == 0 {
        return out;
    }
    let (before, after) = (partition.rows_before, partition.rows_after);
    #[allow(clippy::cast_precision_loss, reason = "row counts far below 2^52 are exact as f64")]
    let pct_of_before = |n: u64| n as f64 * 100.0 / before as f64;
    if let Some(limit) = limits.row_count_pct {
        let moved_pct = pct_of_before(before.abs_diff(after));
        if moved_pct > limit {
            let verb = if after > before { "rose" } else { "fell" };
            out.push(format!("row count {verb} {moved_pct:.1}% ({before} -> {after}) > {limit}%"));
        }
    }
    if let Some(limit) = limits.rows_changed_pct {
        let rows_pct = pct_of_before(partition.n_added + partition.n_removed + partition.n_changed);
        if rows_pct > limit {
            out.push(format!("rows changed {rows_pct:.1}% > {limit}%"));
        }
    }
    for column in &partition.columns {
        if let (Some(limit), Some(before), Some(after)) = (limits.mean_pct, column.mean_before, column.mean_after) {
            let moved_pct = if before == 0.0 {
                if after == 0.0 { 0.0 } else { f64::INFINITY }
            } else {
                (after - before).abs() * 100.0 / before.abs()
            };
            if moved_pct > limit {
                let (before, after) = (short_number(before), short_number(after));
                out.push(format!("mean of {} moved {moved_pct:.1}% ({before} -> {after}) > {limit}%", column.column));
            }
        }
        let rise = (column.null_rate_after - column.null_rate_before) * 100.0;
        if let Some(limit) = limits.null_rise_points
            && after > 0
            && rise > limit
        {
            out.push(format!(
                "null rate of {} rose {rise:.1} points ({:.1}% -> {:.1}%) > {limit}",
                column.column,
                column.null_rate_before * 100.0,
                column.null_rate_after * 100.0
            ));
        }
    }
    out
}

/// How the schema `version` was staged with differs from `published`, by column name (the
/// partition column aside): `adds column a, drops column b`, or a change of types or nullability.
fn schema_change(published: &SchemaRef, version: &StagedVersion, partition: &str) -> String {
    let published: BTreeSet<&str> =
        published.fields().iter().map(|f| f.name().as_str()).filter(|n| *n != partition).collect();
    let staged: BTreeSet<&str> = version.columns.iter().map(|c| c.name.as_str()).filter(|n| *n != partition).collect();
    let mut parts: Vec<String> = Vec::new();
    let list = |names: Vec<&&str>| names.iter().map(|n| (**n).to_owned()).collect::<Vec<_>>().join(", ");
    let added: Vec<&&str> = staged.difference(&published).collect();
    if !added.is_empty() {
        parts.push(format!("adds {} {}", if added.len() == 1 { "column" } else { "columns" }, list(added)));
    }
    let dropped: Vec<&&str> = published.difference(&staged).collect();
    if !dropped.is_empty() {
        parts.push(format!("drops {} {}", if dropped.len() == 1 { "column" } else { "columns" }, list(dropped)));
    }
    if parts.is_empty() {
        parts.push("column types or nullability changed".to_owned());
    }
    parts.join(", ")
}

/// `numRecords` from a Delta stats JSON, if the writer recorded it.
fn stats_rows(stats: Option<&str>) -> Option<u64> {
    let value: Value = serde_json::from_str(stats?).ok()?;
    value.get("numRecords")?.as_u64()
}

/// Column `idx` of a query result as text.
fn texts(batch: &RecordBatch, idx: usize) -> Result<Vec<Option<String>>> {
    let column = cast(batch.column(idx), &DataType::Utf8)?;
    Ok(column.as_string::<i32>().iter().map(|v| v.map(str::to_owned)).collect())
}

/// Column `idx` of a query result as counts (null as 0).
fn counts(batch: &RecordBatch, idx: usize) -> Result<Vec<u64>> {
    let column = cast(batch.column(idx), &DataType::UInt64)?;
    let column = column.as_primitive::<UInt64Type>();
    Ok((0..column.len()).map(|i| if column.is_null(i) { 0 } else { column.value(i) }).collect())
}

/// Column `idx` of a query result as numbers.
fn numbers(batch: &RecordBatch, idx: usize) -> Result<Vec<Option<f64>>> {
    let column = cast(batch.column(idx), &DataType::Float64)?;
    Ok(column.as_primitive::<Float64Type>().iter().collect())
}

/// A number for a message: integers as they are, others to four significant decimals.
fn short_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 { format!("{x:.0}") } else { format!("{x:.4}") }
}
