//! Tables kept loaded between uses, and the step identities their logs record.
//!
//! Loading a Delta table replays its log from the last checkpoint and materialises every active
//! file; looking up one application transaction (`txn`) replays the log again, and a miss (a step
//! not published yet, the common case) reads all of it. Done afresh for every staging, check and
//! publication, that made each step's cost grow with the size of the table. The cache keeps each
//! table loaded and brings it up to date incrementally (only commits newer than the cached
//! version are read), and keeps the `txn` map of the cached version beside it, advanced from the
//! same new commits.
//!
//! The cache never weakens the replay guard (invariant 2): a publication still checks the `txn`
//! map of the version it commits on top of, and the commit can only land at exactly the next
//! version (no automatic retries), so a commit made by anyone else in between, in this process or
//! another, makes it conflict, reload and check again. Anything the cache cannot read with
//! certainty (a multi-part or missing checkpoint, a missing commit, a retention rule on
//! transactions) leaves the map unknown, and lookups fall back to delta-rs' own log replay.
//!
//! A table deleted and created again at the same location (by hand, or by a test) is not the
//! table the cache holds, even where its versions look the same. The cache notes the identity of
//! the commit file at its version (the store's entity tag, else its time and size) and checks it
//! before trusting the cached state; a different or missing file makes it load the table afresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, AsArray as _};
use arrow::datatypes::Int64Type;
use deltalake_core::DeltaTable;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;

use crate::error::Result;

/// One dataset's table as last loaded, with the `txn` versions its log holds at that version.
#[derive(Debug, Clone)]
pub(crate) struct Cached {
    pub table: DeltaTable,
    /// Application id to its latest `txn` version at `table`'s version; `None` when unknown.
    pub txns: Option<Arc<HashMap<String, i64>>>,
    /// The identity of the log's commit file at `table`'s version ([`commit_tag`]); `None`
    /// until it is first looked at.
    pub tag: Option<String>,
}

impl Cached {
    /// This table brought up to date: after two existence checks when nothing was committed
    /// since (delta-rs would list the log to find out), else from the newer commits only, with
    /// the `txn` map advanced from them. `None` when the log cannot be followed (the table was
    /// replaced under us): the caller loads it afresh.
    pub(crate) async fn caught_up(mut self) -> Result<Option<Cached>> {
        let before = self.table.version();
        if let Some(v) = before {
            match commit_tag(&self.table).await? {
                Some(tag) if self.tag.as_ref().is_none_or(|seen| *seen == tag) => self.tag = Some(tag),
                // Not the commit the cached state was read from: the table was replaced.
                _ => return Ok(None),
            }
            if !commit_exists(&self.table, v + 1).await? {
                return Ok(Some(self));
            }
        }
        if self.table.update_incremental(None).await.is_err() || self.table.version() < before {
            return Ok(None);
        }
        let after = self.table.version();
        if after != before {
            self.tag = commit_tag(&self.table).await?;
            self.txns = match (self.txns.take(), before, after) {
                (Some(txns), Some(from), Some(to)) => {
                    let mut txns = Arc::unwrap_or_clone(txns);
                    advance_txns(&self.table, &mut txns, from + 1, to).await.map(|()| Arc::new(txns))
                }
                // Unknown so far (say a checkpoint newer than the first load appeared in
                // between): read it again now that the table is up to date.
                _ => read_txns(&self.table).await.map(Arc::new),
            };
        }
        Ok(Some(self))
    }
}

/// The identity of the log's commit file at `table`'s version: the store's entity tag (for a
/// local folder, from the file's inode, time and size), else its time and size; `None` when the
/// table has no version or the log no such commit.
pub(crate) async fn commit_tag(table: &DeltaTable) -> Result<Option<String>> {
    let Some(version) = table.version() else { return Ok(None) };
    match table.object_store().head(&Path::from(format!("_delta_log/{version:020}.json"))).await {
        Ok(meta) => Ok(Some(match meta.e_tag {
            Some(tag) => tag,
            None => format!("{}-{}", meta.last_modified.timestamp_nanos_opt().unwrap_or_default(), meta.size),
        })),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether the table's log holds commit `version`.
async fn commit_exists(table: &DeltaTable, version: u64) -> Result<bool> {
    match table.object_store().head(&Path::from(format!("_delta_log/{version:020}.json"))).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The tables of one lake handle (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct TableCache {
    tables: Mutex<HashMap<String, Cached>>,
}

impl TableCache {
    pub(crate) fn get(&self, dataset: &str) -> Option<Cached> {
        self.lock().get(dataset).cloned()
    }

    /// Keeps `cached` unless the cache already holds a newer version of the table (two tasks of
    /// one process may bring it up to date at once).
    pub(crate) fn put(&self, dataset: &str, cached: Cached) {
        let mut tables = self.lock();
        let newer_held = tables.get(dataset).is_some_and(|held| held.table.version() > cached.table.version());
        if !newer_held {
            tables.insert(dataset.to_owned(), cached);
        }
    }

    /// Keeps the table as a commit of this handle left it, `before` plus the commit: the `txn` map
    /// of `before`'s version (if known) plus the commit's own transactions, and the identity of
    /// the commit file just written.
    pub(crate) async fn after_commit(
        &self,
        dataset: &str,
        before: &DeltaTable,
        after: DeltaTable,
        txns: &[(String, i64)],
    ) {
        let map = self.txns_at(dataset, before.version()).map(|known| {
            let mut map = Arc::unwrap_or_clone(known);
            map.extend(txns.iter().cloned());
            Arc::new(map)
        });
        // Unknown (looked at by the next catch-up) if the store cannot say now.
        let tag = commit_tag(&after).await.ok().flatten();
        self.put(dataset, Cached { table: after, txns: map, tag });
    }

    pub(crate) fn forget(&self, dataset: &str) {
        self.lock().remove(dataset);
    }

    /// The `txn` map of `dataset` at exactly `version`, if the cache knows it.
    pub(crate) fn txns_at(&self, dataset: &str, version: Option<u64>) -> Option<Arc<HashMap<String, i64>>> {
        let tables = self.lock();
        let held = tables.get(dataset)?;
        if held.table.version() != version {
            return None;
        }
        held.txns.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        // A panic while holding the lock cannot leave the map half-written (every change is one
        // insert or remove), so a poisoned lock is still usable.
        self.tables.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The `txn` map of a freshly loaded table: the last checkpoint's `txn` actions, then every
/// commit after it. `None` when the log cannot be read that way with certainty.
pub(crate) async fn read_txns(table: &DeltaTable) -> Option<HashMap<String, i64>> {
    let version = table.version()?;
    if has_txn_retention(table) {
        return None;
    }
    let store = table.object_store();
    let mut txns = HashMap::new();
    let after = match last_checkpoint(table).await? {
        Some(checkpoint) if checkpoint <= version => {
            let path = Path::from(format!("_delta_log/{checkpoint:020}.checkpoint.parquet"));
            let bytes = store.get(&path).await.ok()?.bytes().await.ok()?;
            checkpoint_txns(bytes, &mut txns)?;
            checkpoint + 1
        }
        // A checkpoint newer than the loaded version: the caller loaded a moment too early.
        Some(_) => return None,
        None => 0,
    };
    advance_txns(table, &mut txns, after, version).await?;
    Some(txns)
}

/// Adds the `txn` actions of commits `from..=to` to `txns`; `None` if any commit is missing.
pub(crate) async fn advance_txns(
    table: &DeltaTable,
    txns: &mut HashMap<String, i64>,
    from: u64,
    to: u64,
) -> Option<()> {
    let log = table.log_store();
    for version in from..=to {
        let bytes = log.read_commit_entry(version).await.ok()??;
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let action: serde_json::Value = serde_json::from_slice(line).ok()?;
            if let Some(txn) = action.get("txn") {
                let app_id = txn.get("appId")?.as_str()?;
                let v = txn.get("version")?.as_i64()?;
                txns.insert(app_id.to_owned(), v);
            }
        }
    }
    Some(())
}

/// Whether the table expires old transactions (then only delta-rs' own lookup applies the rule).
pub(crate) fn has_txn_retention(table: &DeltaTable) -> bool {
    table
        .snapshot()
        .map(|s| s.metadata().configuration().contains_key("delta.setTransactionRetentionDuration"))
        .unwrap_or(true)
}

/// The version of the table's last single-part checkpoint: `Ok(None)` (as `Some(None)`) when the
/// table has none; `None` when `_last_checkpoint` names a kind this module does not read.
async fn last_checkpoint(table: &DeltaTable) -> Option<Option<u64>> {
    let store = table.object_store();
    let bytes = match store.get(&Path::from("_delta_log/_last_checkpoint")).await {
        Ok(found) => found.bytes().await.ok()?,
        Err(object_store::Error::NotFound { .. }) => return Some(None),
        Err(_) => return None,
    };
    let hint: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    if hint.get("parts").is_some_and(|p| !p.is_null()) || hint.get("v2Checkpoint").is_some_and(|p| !p.is_null()) {
        return None;
    }
    Some(Some(hint.get("version")?.as_u64()?))
}

/// Reads the `txn` column of a classic checkpoint into `txns`.
fn checkpoint_txns<R: parquet::file::reader::ChunkReader + 'static>(
    bytes: R,
    txns: &mut HashMap<String, i64>,
) -> Option<()> {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).ok()?;
    let Ok(root) = builder.schema().index_of("txn") else {
        // A checkpoint with no `txn` column holds no transactions.
        return Some(());
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [root]);
    for batch in builder.with_projection(mask).build().ok()? {
        let batch = batch.ok()?;
        let txn = batch.column_by_name("txn")?.as_struct_opt()?;
        let app_ids = arrow::compute::cast(txn.column_by_name("appId")?, &arrow::datatypes::DataType::Utf8).ok()?;
        let app_ids = app_ids.as_string_opt::<i32>()?;
        let versions = txn.column_by_name("version")?.as_primitive_opt::<Int64Type>()?;
        for row in 0..txn.len() {
            if txn.is_null(row) || app_ids.is_null(row) || versions.is_null(row) {
                continue;
            }
            txns.insert(app_ids.value(row).to_owned(), versions.value(row));
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use deltalake_core::kernel::{DataType, PrimitiveType, StructField, Transaction};
    use deltalake_core::protocol::{DeltaOperation, SaveMode};
    use deltalake_core::{DeltaTableBuilder, TableProperty};

    use super::*;

    async fn kernel_lookup(table: &DeltaTable, app_id: &str) -> Option<i64> {
        table.snapshot().expect("loaded").transaction_version(table.log_store().as_ref(), app_id).await.expect("replay")
    }

    /// 23 commits, each with one `txn` (app-3 three times), crossing the checkpoints after versions 9 and 19:
    /// the map read from the last checkpoint and the commits after it, and the map advanced
    /// commit by commit from an early version, both equal delta-rs' own lookup for every id.
    #[tokio::test]
    async fn the_map_from_checkpoint_and_commits_agrees_with_delta_rs() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = url::Url::from_directory_path(dir.path()).expect("a file url");
        let table = DeltaTableBuilder::from_url(url.clone())
            .expect("builder")
            .build()
            .expect("table")
            .create()
            .with_columns([StructField::new("id", DataType::Primitive(PrimitiveType::Long), true)])
            .with_configuration_property(TableProperty::CheckpointInterval, Some("10"))
            .await
            .expect("create");
        let mut early = table.clone();
        let mut advanced = read_txns(&early).await.expect("a map at version 0");
        // A third way: the map a handle keeps by adding its own commits' transactions.
        let cache = TableCache::default();
        cache.put("t", Cached { table: table.clone(), txns: Some(Arc::new(advanced.clone())), tag: None });
        let mut table = table;
        let ids: Vec<String> = (0..22).map(|i| format!("app-{}", if i % 7 == 3 { 3 } else { i })).collect();
        for (i, id) in ids.iter().enumerate() {
            let txn = Transaction::new(id.clone(), i64::try_from(i).expect("small") + 100);
            let operation = DeltaOperation::Write { mode: SaveMode::Append, partition_by: None, predicate: None };
            let pair = (txn.app_id.clone(), txn.version);
            let after = crate::publish::commit(&table, Vec::new(), vec![txn], Vec::new(), operation)
                .await
                .expect("commit")
                .expect("no conflict");
            cache.after_commit("t", &table, after.clone(), &[pair]).await;
            table = after;
            assert_eq!(table.version(), Some(u64::try_from(i).expect("small") + 1));
        }
        // delta-rs writes a checkpoint after every tenth commit, counting version 0: at 9 and 19.
        let log: Vec<_> = std::fs::read_dir(dir.path().join("_delta_log"))
            .expect("log")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(dir.path().join("_delta_log/00000000000000000019.checkpoint.parquet").exists(), "{log:?}");

        let fresh = DeltaTableBuilder::from_url(url).expect("builder").load().await.expect("load");
        let from_checkpoint = read_txns(&fresh).await.expect("a map read from the checkpoint");
        let from = early.version().expect("loaded") + 1;
        early.update_incremental(None).await.expect("update");
        advance_txns(&early, &mut advanced, from, early.version().expect("loaded")).await.expect("advanced");
        assert_eq!(from_checkpoint, advanced);
        let kept = cache.txns_at("t", table.version()).expect("the map kept across commits");
        assert_eq!(*kept, from_checkpoint);
        assert_eq!(from_checkpoint.len(), 20, "22 commits, app-3 three times");
        assert_eq!(from_checkpoint["app-3"], 117, "the newest txn of an id wins");
        for id in ids.iter().chain([&"never-published".to_owned()]) {
            assert_eq!(from_checkpoint.get(id).copied(), kernel_lookup(&fresh, id).await, "{id}");
        }
    }
}
