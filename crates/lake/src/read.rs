//! Reading published data: rows of a dataset at a version, SQL over every dataset, the difference
//! between two versions by key, and a table's version history with Tidegate's commit metadata.
//! Everything goes through DataFusion over the Delta log, so only committed files are ever read.

use std::collections::BTreeMap;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::TableReference;
use datafusion::prelude::SessionContext;
use deltalake_core::DeltaTable;
use futures::TryStreamExt as _;
use serde::{Deserialize, Serialize};

use crate::df;
use crate::error::{Error, Result};
use crate::layout::PartitionColumn;
use crate::table::{Lake, table_schema};

/// The most sample rows a diff reports per category.
pub const DIFF_SAMPLE_ROWS: usize = 5;

/// One commit of a dataset's table, newest first in [`Lake::history`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Commit {
    /// The table version this commit made.
    pub version: u64,
    /// When the commit was made, in milliseconds since the Unix epoch, if the commit records it.
    pub timestamp_ms: Option<i64>,
    /// Delta's operation name (`WRITE`, `CREATE TABLE`, `RESTORE`).
    pub operation: Option<String>,
    /// The commit metadata Tidegate wrote (`tidegate.release_id`, `tidegate.run_id`, ...).
    pub metadata: BTreeMap<String, serde_json::Value>,
}

/// What changed between two versions of a dataset, by key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diff {
    /// The dataset compared.
    pub dataset: String,
    /// The table version diffed from (the "before" side).
    pub from_version: u64,
    /// The table version diffed to (the "after" side).
    pub to_version: u64,
    /// Rows whose key is in `to_version` only.
    pub n_added: u64,
    /// Rows whose key is in `from_version` only.
    pub n_removed: u64,
    /// Rows whose key is in both versions with some other column distinct.
    pub n_changed: u64,
    /// Up to [`DIFF_SAMPLE_ROWS`] added rows, as JSON objects.
    pub added: Vec<serde_json::Value>,
    /// Up to [`DIFF_SAMPLE_ROWS`] removed rows, as JSON objects (as in `from_version`).
    pub removed: Vec<serde_json::Value>,
    /// Up to [`DIFF_SAMPLE_ROWS`] changed rows, as JSON objects (as in `to_version`).
    pub changed: Vec<serde_json::Value>,
}

impl Lake {
    /// The rows of a dataset at `version` (latest when `None`), optionally only some partitions.
    pub async fn read(
        &self,
        dataset: &str,
        partitions: Option<&[String]>,
        version: Option<u64>,
    ) -> Result<Vec<RecordBatch>> {
        let table = self.load_at(dataset, version).await?;
        let schema = table_schema(&table)?;
        scan(&table, partitions, &schema).await
    }

    /// [`Lake::read`], at most `limit` rows: the scan stops once it has them, so a reader asking
    /// for a page of a large dataset never holds the whole of it.
    pub async fn read_at_most(
        &self,
        dataset: &str,
        partitions: Option<&[String]>,
        version: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RecordBatch>> {
        let table = self.load_at(dataset, version).await?;
        let schema = table_schema(&table)?;
        let filter = match partitions {
            Some([]) => return Ok(Vec::new()),
            Some(keys) => PartitionColumn::of_table(&table)?.sql_in(keys)?,
            None => "true".to_owned(),
        };
        let ctx = df::session();
        register_table(&ctx, "t", &table).await?;
        let batches = df::query(&ctx, &format!("SELECT * FROM t WHERE {filter} LIMIT {limit}")).await?;
        df::conform(batches, &schema)
    }

    /// Runs a read-only query with every dataset registered as a table under its own name (latest
    /// version), within this handle's [`crate::QueryLimits`]. A statement that would write or
    /// read a file is refused ([`Error::ReadOnlyQuery`]).
    pub async fn sql(&self, query: &str) -> Result<Vec<RecordBatch>> {
        let session = df::UserSession::new(self.limits)?;
        for name in self.datasets().await? {
            if let Some(table) = self.try_load(&name).await? {
                register_table(session.ctx(), &name, &table).await?;
            }
        }
        df::user_query(&session, query).await
    }

    /// The names of the datasets that have a table in the lake, sorted.
    pub async fn datasets(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for name in self.child_names().await? {
            let valid = !name.starts_with(['.', '_']) && crate::table::check_segment("dataset", &name).is_ok();
            if valid && self.table_exists(&name).await? {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// The latest table version of a dataset, or `None` if it has no table yet.
    pub async fn table_version(&self, dataset: &str) -> Result<Option<u64>> {
        Ok(self.try_load(dataset).await?.and_then(|t| t.version()))
    }

    /// Every commit of a dataset's table, newest first, with Tidegate's commit metadata.
    pub async fn history(&self, dataset: &str) -> Result<Vec<Commit>> {
        let table = self.load(dataset).await?;
        let latest = table.version().unwrap_or_default();
        let infos: Vec<_> = table.history(None).try_collect().await?;
        let mut commits = Vec::with_capacity(infos.len());
        for (idx, info) in infos.into_iter().enumerate() {
            let metadata = info
                .info
                .iter()
                .filter(|(k, _)| k.starts_with("tidegate."))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            commits.push(Commit {
                // The history is contiguous and newest first, so the index counts back.
                version: latest.saturating_sub(idx as u64),
                timestamp_ms: info.timestamp,
                operation: info.operation,
                metadata,
            });
        }
        Ok(commits)
    }

    /// Rows added, removed and changed by `keys` between two versions of a dataset.
    pub async fn diff(&self, dataset: &str, keys: &[String], from: u64, to: u64) -> Result<Diff> {
        let before = self.load_at(dataset, Some(from)).await?;
        let after = self.load_at(dataset, Some(to)).await?;
        let schema = table_schema(&after)?;
        for key in keys {
            if schema.field_with_name(key).is_err() {
                return Err(Error::SchemaMismatch {
                    dataset: dataset.to_owned(),
                    location: crate::error::FileLocation::Table,
                    column: key.clone(),
                    detail: "named as a diff key but not in the dataset schema".to_owned(),
                });
            }
        }
        let ctx = df::session();
        register_table(&ctx, "a", &before).await?;
        register_table(&ctx, "b", &after).await?;
        let on: Vec<String> = keys.iter().map(|k| format!("a.{c} = b.{c}", c = df::ident(k))).collect();
        let on = on.join(" AND ");
        let differs: Vec<String> = schema
            .fields()
            .iter()
            .filter(|f| !keys.contains(f.name()))
            .map(|f| format!("(a.{c} IS DISTINCT FROM b.{c})", c = df::ident(f.name())))
            .collect();
        let changed_where = if differs.is_empty() { "false".to_owned() } else { differs.join(" OR ") };
        let added = format!("FROM b LEFT ANTI JOIN a ON {on}");
        let removed = format!("FROM a LEFT ANTI JOIN b ON {on}");
        let changed = format!("FROM a JOIN b ON {on} WHERE {changed_where}");
        let count = |from: &str| format!("SELECT count(*) {from}");
        let sample = |what: &str, from: &str| format!("SELECT {what}.* {from} LIMIT {DIFF_SAMPLE_ROWS}");
        Ok(Diff {
            dataset: dataset.to_owned(),
            from_version: from,
            to_version: to,
            n_added: df::first_u64(&df::query(&ctx, &count(&added)).await?, 0)?,
            n_removed: df::first_u64(&df::query(&ctx, &count(&removed)).await?, 0)?,
            n_changed: df::first_u64(&df::query(&ctx, &count(&changed)).await?, 0)?,
            added: df::sample_rows(&df::query(&ctx, &sample("b", &added)).await?, DIFF_SAMPLE_ROWS)?,
            removed: df::sample_rows(&df::query(&ctx, &sample("a", &removed)).await?, DIFF_SAMPLE_ROWS)?,
            changed: df::sample_rows(&df::query(&ctx, &sample("b", &changed)).await?, DIFF_SAMPLE_ROWS)?,
        })
    }
}

/// Registers a loaded table (at its loaded version) under `name`.
pub(crate) async fn register_table(ctx: &SessionContext, name: &str, table: &DeltaTable) -> Result<()> {
    table.update_datafusion_session(&ctx.state())?;
    let provider = table.table_provider().await?;
    ctx.register_table(TableReference::bare(name), provider)?;
    Ok(())
}

/// The rows of a loaded table, optionally only some partitions, cast to `schema`.
pub(crate) async fn scan(
    table: &DeltaTable,
    partitions: Option<&[String]>,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let filter = match partitions {
        Some([]) => return Ok(Vec::new()),
        Some(keys) => PartitionColumn::of_table(table)?.sql_in(keys)?,
        None => "true".to_owned(),
    };
    scan_where(table, &filter, schema).await
}

/// The rows of a loaded table matching `filter` (a condition written by Tidegate), cast to `schema`.
pub(crate) async fn scan_where(table: &DeltaTable, filter: &str, schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    let ctx = df::session();
    register_table(&ctx, "t", table).await?;
    let batches = df::query(&ctx, &format!("SELECT * FROM t WHERE {filter}")).await?;
    df::conform(batches, schema)
}

/// The distinct values of `key_schema`'s columns in some partitions of a loaded table.
pub(crate) async fn scan_keys(
    table: &DeltaTable,
    partitions: &[String],
    key_schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = key_schema.fields().iter().map(|f| f.name().clone()).collect();
    let ctx = df::session();
    register_table(&ctx, "t", table).await?;
    let sql = format!(
        "SELECT DISTINCT {} FROM t WHERE {}",
        df::ident_list(&names),
        PartitionColumn::of_table(table)?.sql_in(partitions)?
    );
    df::conform(df::query(&ctx, &sql).await?, key_schema)
}
