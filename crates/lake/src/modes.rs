//! The four write modes, as plans: given the table as last loaded and a staged version, the Remove
//! and Add actions one commit needs. Merge and append compute their final files here with
//! DataFusion (delta-rs's merge builder commits at once, so it cannot be staged).

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use deltalake_core::DeltaTable;
use deltalake_core::kernel::{Action, Add};
use object_store::ObjectStoreExt as _;
use tidegate_core::spec::model::{Dataset, DatasetKind, WriteMode};

use crate::dedup::{Append, Fresh};
use crate::df;
use crate::error::{Error, Result};
use crate::layout::PartitionColumn;
use crate::read;
use crate::stage::{StagedFile, StagedVersion};
use crate::table::{Lake, active_files, check_layout, remove_of};

/// The actions of one publication commit and what they amount to.
#[derive(Debug)]
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    pub n_files_added: usize,
    pub n_files_removed: usize,
    pub n_rows_added: u64,
    /// The rows the commit replaces, for the commit's operation parameters.
    pub predicate: Option<String>,
    /// Files written while planning (merge, filtered append): abandoned if the commit loses.
    pub written: Vec<String>,
    /// Append only: the staged rows not published because their `dedup_key` was already in the
    /// delivery, the partition or the lookback.
    pub n_duplicates_dropped: Option<u64>,
    /// Merge with `order_by` only: the delivery's winning rows not published because the table
    /// already holds a newer row of their key (a greater `order_by`).
    pub n_late_rows_ignored: Option<u64>,
    /// Append only: the keys (and partition column) of the rows the commit adds, so that a later
    /// item of the same commit is de-duplicated against them as against the table.
    pub appended_keys: Vec<RecordBatch>,
}

/// The write mode of a dataset Tidegate manages.
pub(crate) fn write_mode(dataset: &Dataset) -> Result<&WriteMode> {
    match &dataset.kind {
        DatasetKind::Managed { write } => Ok(write),
        DatasetKind::External { .. } => Err(Error::InvalidName {
            what: "dataset",
            value: dataset.name.clone(),
            reason: "external datasets are read-only; Tidegate never publishes to them".to_owned(),
        }),
    }
}

/// Plans the commit that publishes `staged` onto `table` (the version just loaded).
/// `schema` is the one `staged` was written in: the table's, or the declared one the commit
/// evolves the table to (merged and filtered rows are written in it).
/// `pending` holds the [`Plan::appended_keys`] of the items planned before this one for the same
/// commit (empty for a commit of one item).
pub(crate) async fn plan(
    lake: &Lake,
    table: &DeltaTable,
    dataset: &Dataset,
    staged: &StagedVersion,
    schema: &SchemaRef,
    pending: &[RecordBatch],
) -> Result<Plan> {
    let keys = staged.partition_keys();
    write_mode(dataset)?;
    check_layout(dataset, table)?;
    let column = PartitionColumn::of_table(table)?;
    let predicate = Some(column.sql_in(&keys)?);
    match write_mode(dataset)? {
        WriteMode::Replace => {
            ensure_exist(table, &dataset.name, &staged.files).await?;
            let removed = active_files(table, Some(&keys)).await?;
            swap(&column, removed, &staged.files, predicate, Vec::new())
        }
        WriteMode::Snapshot => {
            ensure_exist(table, &dataset.name, &staged.files).await?;
            let removed = active_files(table, None).await?;
            // Snapshots of several partitions may finish in any order; the newest must stay.
            let published = removed
                .iter()
                .filter_map(|a| a.partition_values.get(&column.name).cloned().flatten())
                .filter_map(|v| column.key_of(&v))
                .max();
            let newest_staged = keys.iter().max();
            if let (Some(published), Some(staged)) = (published, newest_staged)
                && published > *staged
            {
                return Err(Error::SupersededSnapshot {
                    dataset: dataset.name.clone(),
                    staged: staged.clone(),
                    published,
                });
            }
            swap(&column, removed, &staged.files, None, Vec::new())
        }
        WriteMode::Merge { keys: merge_keys, order_by, delete_marker } => {
            let merge =
                Merge { keys: merge_keys, order_by: order_by.as_deref(), delete_marker: delete_marker.as_deref() };
            let (merged, n_late) = merge.rows(lake, table, dataset, staged, schema, &keys).await?;
            let files = lake.write_files(table, &dataset.name, &staged.staging_id, schema, &keys, &merged).await?;
            let removed = active_files(table, Some(&keys)).await?;
            let written = files.iter().map(|f| f.path.clone()).collect();
            let mut plan = swap(&column, removed, &files, predicate, written)?;
            plan.n_late_rows_ignored = n_late;
            Ok(plan)
        }
        WriteMode::Append { .. } => {
            let Fresh { rows: fresh, n_dropped, keys: appended_keys } =
                Append::of(dataset)?.fresh_rows(lake, table, staged, schema, pending).await?;
            // The common case adds every staged row: publish the staged files as they are.
            let mut plan = if n_dropped == 0 {
                ensure_exist(table, &dataset.name, &staged.files).await?;
                swap(&column, Vec::new(), &staged.files, None, Vec::new())?
            } else {
                let files = lake.write_files(table, &dataset.name, &staged.staging_id, schema, &keys, &fresh).await?;
                let written = files.iter().map(|f| f.path.clone()).collect();
                swap(&column, Vec::new(), &files, None, written)?
            };
            plan.n_duplicates_dropped = Some(n_dropped);
            plan.appended_keys = appended_keys;
            Ok(plan)
        }
    }
}

/// Whether a backfill review compares what publishing a staged version leaves in its partitions
/// (merge, append: the published rows are kept) rather than the staged rows alone (replace,
/// snapshot: the staged rows are the new contents).
pub(crate) fn keeps_published_rows(dataset: &Dataset) -> bool {
    matches!(write_mode(dataset), Ok(WriteMode::Merge { .. } | WriteMode::Append { .. }))
}

/// What publishing `staged` onto `table` (the dataset's table at some version) would leave in the
/// staged partitions, in `schema`: for a merge, the staged rows merged into the published ones
/// (late rows and late deletes change nothing); for an append, the published rows and the fresh
/// ones; for the other modes, the staged rows. A backfill review compares these with the
/// published rows, so it shows what the publication will do.
pub(crate) async fn published_after(
    lake: &Lake,
    table: &DeltaTable,
    dataset: &Dataset,
    staged: &StagedVersion,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    match write_mode(dataset)? {
        WriteMode::Merge { keys, order_by, delete_marker } => {
            let merge = Merge { keys, order_by: order_by.as_deref(), delete_marker: delete_marker.as_deref() };
            Ok(merge.rows(lake, table, dataset, staged, schema, &staged.partition_keys()).await?.0)
        }
        WriteMode::Append { .. } => {
            let mut rows = read::scan(table, Some(&staged.partition_keys()), schema).await?;
            rows.extend(Append::of(dataset)?.fresh_rows(lake, table, staged, schema, &[]).await?.rows);
            Ok(rows)
        }
        WriteMode::Replace | WriteMode::Snapshot => lake.read_staged(table, &dataset.name, &staged.files, schema).await,
    }
}

/// Remove `removed`, add `added` (files of the table partitioned by `column`).
fn swap(
    column: &PartitionColumn,
    removed: Vec<Add>,
    added: &[StagedFile],
    predicate: Option<String>,
    written: Vec<String>,
) -> Result<Plan> {
    let mut actions: Vec<Action> = removed.iter().map(|a| Action::Remove(remove_of(a))).collect();
    for file in added {
        actions.push(Action::Add(file.to_add(column)?));
    }
    Ok(Plan {
        n_files_added: added.len(),
        n_files_removed: removed.len(),
        n_rows_added: added.iter().map(|f| f.n_rows).sum(),
        actions,
        predicate,
        written,
        n_duplicates_dropped: None,
        n_late_rows_ignored: None,
        appended_keys: Vec::new(),
    })
}

/// Refuses a delivery with a null in a `dedup_key` column: a row without an identity cannot be
/// held once (decision in docs/spec-reference.md, `dedup_key`).
pub(crate) fn reject_null_keys(dataset: &str, dedup_key: &[String], rows: &[RecordBatch]) -> Result<()> {
    use arrow::array::Array as _;
    for key in dedup_key {
        let n_rows: u64 = rows.iter().filter_map(|b| b.column_by_name(key)).map(|c| c.null_count() as u64).sum();
        if n_rows > 0 {
            return Err(Error::NullDedupKey { dataset: dataset.to_owned(), column: key.clone(), n_rows });
        }
    }
    Ok(())
}

/// Refuses to publish a reference to a staged file that no longer exists: a commit that points
/// at a missing file would break every reader.
async fn ensure_exist(table: &DeltaTable, dataset: &str, files: &[StagedFile]) -> Result<()> {
    let store = table.object_store();
    for file in files {
        match store.head(&crate::layout::object_path(file.path.as_str())).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::MissingStagedFile { dataset: dataset.to_owned(), path: file.path.clone() });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Column indices of `names` in `schema`, or a schema error naming the missing one.
pub(crate) fn indices(schema: &Schema, names: &[String]) -> Result<Vec<usize>> {
    names
        .iter()
        .map(|n| {
            schema.index_of(n).map_err(|_| Error::SchemaMismatch {
                dataset: String::new(),
                location: crate::error::FileLocation::Table,
                column: n.clone(),
                detail: "named as a key but not in the dataset schema".to_owned(),
            })
        })
        .collect()
}

/// A keyed merge (DESIGN, "Writes and publication"; docs/spec-reference.md, `write`): for each key,
/// the row with the greatest `order_by` wins, whichever delivery it came in. A delivered row ties
/// with the table's row of the same `order_by` and wins (the later publication restates the key,
/// so a rerun with corrected code is applied); a null `order_by` is older than every value. A
/// winning tombstone deletes its key; a late one deletes nothing.
struct Merge<'a> {
    keys: &'a [String],
    order_by: Option<&'a str>,
    delete_marker: Option<&'a str>,
}

impl Merge<'_> {
    /// The merged contents of the staged partitions, and (with `order_by`) how many of the
    /// delivery's winning rows were ignored as late: the table holds a newer row of their key.
    async fn rows(
        &self,
        lake: &Lake,
        table: &DeltaTable,
        dataset: &Dataset,
        staged: &StagedVersion,
        schema: &SchemaRef,
        partitions: &[String],
    ) -> Result<(Vec<RecordBatch>, Option<u64>)> {
        let source = lake.read_staged(table, &dataset.name, &staged.files, schema).await?;
        let keys_unique = reject_ties(&dataset.name, self.keys, self.order_by, schema, source.clone()).await?;
        let published = read::scan(table, Some(partitions), schema).await?;
        let ctx = df::session();
        df::register_batches(&ctx, "published", schema, published)?;
        // With unique keys every staged row wins its delivery: no ranking (a sort of the whole source).
        let winners = if keys_unique {
            source
        } else {
            df::register_batches(&ctx, "staged", schema, source)?;
            df::conform(df::query(&ctx, &self.winners_sql(schema)).await?, schema)?
        };
        let n_winners = df::n_rows(&winners);
        df::register_batches(&ctx, "winners", schema, winners)?;
        let fresh = match self.order_by {
            Some(order_by) => df::conform(df::query(&ctx, &self.fresh_sql(order_by)).await?, schema)?,
            None => df::query(&ctx, "SELECT * FROM winners").await?,
        };
        let n_late = self.order_by.map(|_| n_winners.saturating_sub(df::n_rows(&fresh)));
        df::register_batches(&ctx, "fresh", schema, fresh)?;
        let merged = df::conform(df::query(&ctx, &self.merged_sql(schema)).await?, schema)?;
        Ok((merged, n_late))
    }

    /// `a.k1 = b.k1 AND ...` over the keys.
    fn on(&self, a: &str, b: &str) -> String {
        let on: Vec<String> = self.keys.iter().map(|k| format!("{a}.{c} = {b}.{c}", c = df::ident(k))).collect();
        on.join(" AND ")
    }

    /// The delivery's winning row per key: the first by `order_by`, descending, nulls last (the
    /// ties that would make it ambiguous were rejected by [`reject_ties`]).
    fn winners_sql(&self, schema: &SchemaRef) -> String {
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let cols = df::ident_list(&columns);
        let order = self.order_by.map(|o| format!(" ORDER BY {} DESC NULLS LAST", df::ident(o))).unwrap_or_default();
        format!(
            "SELECT {cols} FROM (\
               SELECT {cols}, row_number() OVER (PARTITION BY {keys}{order}) AS \"__tg_rank\" FROM staged) \
             WHERE \"__tg_rank\" = 1",
            keys = df::ident_list(self.keys),
        )
    }

    /// The winners the table holds no newer row for: a published row of the same key with a
    /// greater `order_by` (or any value where the winner's is null) makes the winner late.
    fn fresh_sql(&self, order_by: &str) -> String {
        let o = df::ident(order_by);
        format!(
            "SELECT w.* FROM winners w LEFT ANTI JOIN published p ON {on} \
               AND (p.{o} > w.{o} OR (w.{o} IS NULL AND p.{o} IS NOT NULL))",
            on = self.on("p", "w"),
        )
    }

    /// Published rows whose key no fresh row names, plus the fresh rows that are not tombstones.
    fn merged_sql(&self, schema: &SchemaRef) -> String {
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let keep = self
            .delete_marker
            .map(|d| format!(" WHERE NOT coalesce(CAST({} AS BOOLEAN), false)", df::ident(d)))
            .unwrap_or_default();
        format!(
            "SELECT p.* FROM published p LEFT ANTI JOIN fresh f ON {on} \
             UNION ALL SELECT {cols} FROM fresh{keep}",
            on = self.on("p", "f"),
            cols = df::ident_list(&columns),
        )
    }
}

/// Invariant 7: rejects a merge source in which some key has several rows and the ordering does
/// not pick one (no `order_by`, or equal highest `order_by` values), naming the key. Returns
/// whether every key is unique: one hash aggregate answers that, and only a source with
/// duplicates pays for ranking them.
pub(crate) async fn reject_ties(
    dataset: &str,
    keys: &[String],
    order_by: Option<&str>,
    schema: &SchemaRef,
    rows: Vec<RecordBatch>,
) -> Result<bool> {
    indices(schema, keys).map_err(|e| with_dataset(e, dataset))?;
    if let Some(o) = order_by {
        indices(schema, &[o.to_owned()]).map_err(|e| with_dataset(e, dataset))?;
    }
    let ctx = df::session();
    df::register_batches(&ctx, "staged", schema, rows)?;
    let k = df::ident_list(keys);
    let duplicates = format!("SELECT {k}, count(*) AS n FROM staged GROUP BY {k} HAVING count(*) > 1 LIMIT 1");
    let duplicated = df::query(&ctx, &duplicates).await?;
    if df::n_rows(&duplicated) == 0 {
        return Ok(true);
    }
    let tied = match order_by {
        Some(o) => {
            let sql = format!(
                "SELECT {k}, count(*) AS n FROM (\
               SELECT {k}, rank() OVER (PARTITION BY {k} ORDER BY {o} DESC NULLS LAST) AS r \
               FROM staged) \
             WHERE r = 1 GROUP BY {k} HAVING count(*) > 1 LIMIT 1",
                o = df::ident(o)
            );
            df::query(&ctx, &sql).await?
        }
        None => duplicated,
    };
    if df::n_rows(&tied) == 0 {
        return Ok(false);
    }
    let mut parts = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let value = df::first_value(&tied, i)?.unwrap_or_else(|| "null".to_owned());
        parts.push(format!("{key}={value}"));
    }
    Err(Error::TiedDuplicates {
        dataset: dataset.to_owned(),
        key: format!("({})", parts.join(", ")),
        n_rows: df::first_u64(&tied, keys.len())?,
        why: if order_by.is_some() {
            "they share the highest order_by value"
        } else {
            "the dataset declares no order_by"
        },
    })
}

/// `e` naming `dataset` when it is a schema mismatch found before the dataset was known.
pub(crate) fn with_dataset(e: Error, dataset: &str) -> Error {
    match e {
        Error::SchemaMismatch { location, column, detail, .. } => {
            Error::SchemaMismatch { dataset: dataset.to_owned(), location, column, detail }
        }
        other => other,
    }
}
