//! Exact de-duplication of appends (decision 0017): each `dedup_key` is published once within a
//! partition and the `dedup_lookback` partitions either side of it, whatever the grouping of
//! publications into commits. A delivery is taken partition by partition in time order, each
//! partition checked against the table and against the rows planned before it (earlier
//! partitions of the same delivery, earlier items of the same commit), so one shared commit
//! publishes what one commit per partition, in order, would. Within a partition, rows of one key
//! must be identical or told apart by `order_by`; a tie is refused, naming the key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake_core::DeltaTable;
use tidegate_core::partition::{Partition, TimeAxis};
use tidegate_core::spec::model::{Dataset, Partitioning, WriteMode};

use crate::df;
use crate::error::{Error, Result};
use crate::layout::PartitionColumn;
use crate::modes::{indices, reject_null_keys, with_dataset};
use crate::read;
use crate::stage::{StagedFile, StagedVersion};
use crate::table::Lake;

/// An append dataset's de-duplication settings.
pub(crate) struct Append<'a> {
    dataset: &'a Dataset,
    key: &'a [String],
    lookback: u32,
    order_by: Option<&'a str>,
}

/// What an append publishes of a staged version.
pub(crate) struct Fresh {
    /// The rows to publish, in the table schema, partition by partition in time order.
    pub rows: Vec<RecordBatch>,
    /// Staged rows left out: duplicates of a row published or planned nearby, or of one kept in
    /// the delivery.
    pub n_dropped: u64,
    /// The key columns and the partition column of `rows`, for the items planned after it.
    pub keys: Vec<RecordBatch>,
}

impl<'a> Append<'a> {
    /// The settings of `dataset`, which must be an append.
    pub(crate) fn of(dataset: &'a Dataset) -> Result<Self> {
        match crate::modes::write_mode(dataset)? {
            WriteMode::Append { dedup_key, dedup_lookback, order_by } => {
                Ok(Append { dataset, key: dedup_key, lookback: *dedup_lookback, order_by: order_by.as_deref() })
            }
            _ => Err(Error::internal(format!("dataset {} is not an append", dataset.name))),
        }
    }

    /// The rows of `staged` to publish onto `table` (the version just loaded), in `schema`.
    /// `pending` holds the [`Fresh::keys`] of rows planned before it for the same commit.
    pub(crate) async fn fresh_rows(
        &self,
        lake: &Lake,
        table: &DeltaTable,
        staged: &StagedVersion,
        schema: &SchemaRef,
        pending: &[RecordBatch],
    ) -> Result<Fresh> {
        let name = &self.dataset.name;
        let column = PartitionColumn::of_table(table)?;
        let key_idx = indices(schema, self.key).map_err(|e| with_dataset(e, name))?;
        if let Some(o) = self.order_by {
            indices(schema, &[o.to_owned()]).map_err(|e| with_dataset(e, name))?;
        }
        let mut noted_idx = key_idx;
        noted_idx.push(schema.index_of(&column.name).map_err(|_| Error::internal("no partition column in schema"))?);
        let noted_schema: SchemaRef = Arc::new(schema.project(&noted_idx)?);
        let partitions = in_time_order(&staged.partitions);
        let windows: Vec<Vec<String>> = partitions.iter().map(|p| self.window(p)).collect();
        let searched: Vec<String> =
            windows.iter().flatten().cloned().collect::<BTreeSet<String>>().into_iter().collect();
        // What is held already: the table's keys around the delivery, and the commit's so far.
        let mut held = read::scan_keys(table, &searched, &noted_schema).await?;
        held.extend(pending.iter().cloned());
        let mut by_partition: BTreeMap<&str, Vec<StagedFile>> = BTreeMap::new();
        for file in &staged.files {
            by_partition.entry(file.partition.as_str()).or_default().push(file.clone());
        }
        let (mut rows, mut keys, mut n_dropped) = (Vec::new(), Vec::new(), 0_u64);
        for (partition, window) in partitions.iter().zip(&windows) {
            let Some(files) = by_partition.get(partition.key.as_str()) else { continue };
            let source = lake.read_staged(table, name, files, schema).await?;
            reject_null_keys(name, self.key, &source)?;
            reject_append_ties(name, self.key, self.order_by, &column.name, schema, source.clone()).await?;
            let n_source = df::n_rows(&source);
            let fresh = self.fresh_in_partition(schema, source, &noted_schema, &held, &column.sql_in(window)?).await?;
            n_dropped += n_source.saturating_sub(df::n_rows(&fresh));
            let noted = fresh.iter().map(|b| b.project(&noted_idx)).collect::<Result<Vec<_>, _>>()?;
            held.extend(noted.iter().cloned());
            keys.extend(noted);
            rows.extend(fresh);
        }
        Ok(Fresh { rows, n_dropped, keys })
    }

    /// One partition's rows to publish: the first row of each key (by `order_by`, greatest
    /// first, then as delivered; the ties that would make that matter were refused) whose key
    /// `held` does not hold in the partition's window (`in_window`, a predicate).
    async fn fresh_in_partition(
        &self,
        schema: &SchemaRef,
        source: Vec<RecordBatch>,
        noted_schema: &SchemaRef,
        held: &[RecordBatch],
        in_window: &str,
    ) -> Result<Vec<RecordBatch>> {
        let (ordered_schema, ordered) = with_ordinal(schema, source)?;
        let ctx = df::session();
        df::register_batches(&ctx, "staged", &ordered_schema, ordered)?;
        df::register_batches(&ctx, "held", noted_schema, held.to_vec())?;
        let on: Vec<String> = self.key.iter().map(|k| format!("s.{c} = h.{c}", c = df::ident(k))).collect();
        let order = match self.order_by {
            Some(o) => format!("{} DESC NULLS LAST, {}", df::ident(o), df::ident(ORDINAL)),
            None => df::ident(ORDINAL),
        };
        let sql = format!(
            "WITH ranked AS (\
               SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {order}) AS \"__tg_rank\" FROM staged), \
             firsts AS (SELECT * FROM ranked WHERE \"__tg_rank\" = 1), \
             near AS (SELECT {keys} FROM held WHERE {in_window}) \
             SELECT s.* FROM firsts s LEFT ANTI JOIN near h ON {on} ORDER BY s.{ord}",
            keys = df::ident_list(self.key),
            on = on.join(" AND "),
            ord = df::ident(ORDINAL),
        );
        df::conform(df::query(&ctx, &sql).await?, schema)
    }

    /// The partitions a key of `partition` is looked for in: its own, and the `lookback` time
    /// partitions before and after it (none before the axis starts; static partitions have no
    /// order, so no lookback).
    fn window(&self, partition: &Partition) -> Vec<String> {
        let mut keys = vec![partition.key.clone()];
        if let (Partitioning::Time { grain, start, time_zone }, Some(interval)) =
            (&self.dataset.partitioning, partition.interval)
        {
            let axis = TimeAxis::new(*grain, *start, *time_zone);
            for back in 1..=i32::try_from(self.lookback).unwrap_or(i32::MAX) {
                let later = axis.shift(interval.start, back);
                keys.push(axis.key(later));
                let earlier = axis.shift(interval.start, -back);
                if earlier >= axis.first {
                    keys.push(axis.key(earlier));
                }
            }
        }
        keys
    }
}

/// `partitions` in time order (static keys in key order).
fn in_time_order(partitions: &[Partition]) -> Vec<Partition> {
    let mut out = partitions.to_vec();
    out.sort_by(|a, b| (a.interval.map(|i| i.start), &a.key).cmp(&(b.interval.map(|i| i.start), &b.key)));
    out.dedup_by(|a, b| a.key == b.key);
    out
}

/// The column that numbers a delivery's rows in order.
const ORDINAL: &str = "__tg_ordinal";

/// `rows` with [`ORDINAL`] appended: 0, 1, 2, ... across the batches in order.
fn with_ordinal(schema: &SchemaRef, rows: Vec<RecordBatch>) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let mut fields: Vec<arrow::datatypes::FieldRef> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(ORDINAL, arrow::datatypes::DataType::UInt64, false)));
    let ordered: SchemaRef = Arc::new(Schema::new(fields));
    let mut next = 0_u64;
    let mut out = Vec::with_capacity(rows.len());
    for batch in rows {
        let n = batch.num_rows() as u64;
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(arrow::array::UInt64Array::from_iter_values(next..next + n)));
        next += n;
        out.push(RecordBatch::try_new(ordered.clone(), columns)?);
    }
    Ok((ordered, out))
}

/// Refuses an append delivery in which one partition holds different rows for one `dedup_key`
/// and `order_by` does not pick one (no `order_by`, or different rows sharing its greatest
/// value), naming the key (the first such key and partition, so every retry names the same): which row survived would otherwise depend on the order the task wrote
/// them in. Identical rows are not a tie (they collapse to one). `partition` is the partition
/// column's name (rows of one key in different partitions are not a tie: the earliest partition
/// keeps the key).
pub(crate) async fn reject_append_ties(
    dataset: &str,
    key: &[String],
    order_by: Option<&str>,
    partition: &str,
    schema: &SchemaRef,
    rows: Vec<RecordBatch>,
) -> Result<()> {
    indices(schema, key).map_err(|e| with_dataset(e, dataset))?;
    if let Some(o) = order_by {
        indices(schema, &[o.to_owned()]).map_err(|e| with_dataset(e, dataset))?;
    }
    let ctx = df::session();
    df::register_batches(&ctx, "staged", schema, rows)?;
    let mut group: Vec<String> = key.to_vec();
    if schema.index_of(partition).is_ok() {
        group.push(partition.to_owned());
    }
    let g = df::ident_list(&group);
    let duplicated = df::query(&ctx, &format!("SELECT 1 FROM staged GROUP BY {g} HAVING count(*) > 1 LIMIT 1")).await?;
    if df::n_rows(&duplicated) == 0 {
        return Ok(());
    }
    let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let cols = df::ident_list(&columns);
    let top = match order_by {
        Some(o) => format!(
            "SELECT {cols} FROM (SELECT {cols}, rank() OVER (PARTITION BY {g} ORDER BY {o} DESC NULLS LAST) \
             AS \"__tg_rank\" FROM staged) WHERE \"__tg_rank\" = 1",
            o = df::ident(o)
        ),
        None => format!("SELECT {cols} FROM staged"),
    };
    let sql = format!(
        "SELECT {k}, CAST({p} AS VARCHAR) AS p, count(*) AS n FROM (SELECT DISTINCT * FROM ({top})) \
         GROUP BY {g} HAVING count(*) > 1 ORDER BY {g} LIMIT 1",
        k = df::ident_list(key),
        p = if group.len() > key.len() { df::ident(partition) } else { "NULL".to_owned() },
    );
    let tied = df::query(&ctx, &sql).await?;
    if df::n_rows(&tied) == 0 {
        return Ok(());
    }
    let mut parts = Vec::with_capacity(key.len());
    for (i, k) in key.iter().enumerate() {
        let value = df::first_value(&tied, i)?.unwrap_or_else(|| "null".to_owned());
        parts.push(format!("{k}={value}"));
    }
    Err(Error::AppendTie {
        dataset: dataset.to_owned(),
        key: format!("({})", parts.join(", ")),
        partition: df::first_value(&tied, key.len())?.unwrap_or_default(),
        n_rows: df::first_u64(&tied, key.len() + 1)?,
        why: match order_by {
            Some(o) => format!(
                "they share the greatest order_by value ({o}); make {o} tell them apart, or deliver one row per key"
            ),
            None => "the dataset declares no order_by; declare write.order_by to pick the row to keep, or deliver \
                     one row per key"
                .to_owned(),
        },
    })
}
