//! Rollback and reconciliation. A rollback is a new commit that makes the active file set (of the
//! whole table or some partitions) exactly what it was at an earlier version; the old files still
//! exist because nothing here deletes a file any version references. Reconciliation deletes staged
//! files that no version references and no live attempt owns.

use std::collections::{BTreeSet, HashSet};

use deltalake_core::kernel::{Action, Transaction};
use deltalake_core::protocol::DeltaOperation;
use futures::TryStreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::publish::{MAX_COMMIT_ATTEMPTS, commit};
use crate::table::{Lake, STAGING_DIR, active_files, remove_of};

/// What [`Lake::reconcile`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    /// `<dataset>/<path>` of every deleted staging file.
    pub deleted: Vec<String>,
    /// Staging files kept because a table version references them.
    pub n_kept_referenced: usize,
    /// Staging files kept because their staging id is still known to the store.
    pub n_kept_known: usize,
}

impl Lake {
    /// Makes the active files of `dataset` (only `partitions`, if given) exactly those of
    /// `to_version`, in a new commit recording `release_id`. Returns the new table version.
    pub async fn rollback(
        &self,
        dataset: &str,
        to_version: u64,
        partitions: Option<&[String]>,
        release_id: &str,
    ) -> Result<u64> {
        let metadata = vec![
            ("tidegate.operation".to_owned(), Value::from("rollback")),
            ("tidegate.release_id".to_owned(), Value::from(release_id)),
            ("tidegate.rollback_to_version".to_owned(), Value::from(to_version)),
        ];
        self.restore_to(dataset, to_version, partitions, metadata, None).await
    }

    /// Restores the whole table to `version` (the failure path of a release). Returns the new
    /// table version.
    pub async fn restore_previous(&self, dataset: &str, version: u64) -> Result<u64> {
        let metadata = vec![
            ("tidegate.operation".to_owned(), Value::from("restore")),
            ("tidegate.rollback_to_version".to_owned(), Value::from(version)),
        ];
        self.restore_to(dataset, version, None, metadata, None).await
    }

    /// The commit behind rollback and restore: remove what is active now and not at
    /// `to_version`, add back what was active then and is not now.
    pub(crate) async fn restore_to(
        &self,
        dataset: &str,
        to_version: u64,
        partitions: Option<&[String]>,
        metadata: Vec<(String, Value)>,
        txn: Option<Transaction>,
    ) -> Result<u64> {
        let target = self.load_at(dataset, Some(to_version)).await?;
        let wanted = active_files(&target, partitions).await?;
        let wanted_paths: HashSet<&str> = wanted.iter().map(|a| a.path.as_str()).collect();
        for _ in 0..MAX_COMMIT_ATTEMPTS {
            let table = self.load(dataset).await?;
            let current = active_files(&table, partitions).await?;
            let current_paths: HashSet<&str> = current.iter().map(|a| a.path.as_str()).collect();
            let mut actions: Vec<Action> = current
                .iter()
                .filter(|a| !wanted_paths.contains(a.path.as_str()))
                .map(|a| Action::Remove(remove_of(a)))
                .collect();
            actions.extend(
                wanted.iter().filter(|a| !current_paths.contains(a.path.as_str())).map(|a| Action::Add(a.clone())),
            );
            let operation = DeltaOperation::Restore { version: Some(to_version), datetime: None };
            if let Some(version) =
                commit(&table, actions, txn.clone().into_iter().collect(), metadata.clone(), operation).await?
            {
                return Ok(version);
            }
        }
        Err(Error::Conflict { dataset: dataset.to_owned(), n_attempts: MAX_COMMIT_ATTEMPTS })
    }

    /// Deletes staged files, in every dataset, that no table version references and whose staging
    /// id is not in `known_staging_ids` (pass every id the store has not abandoned, including
    /// attempts still running).
    pub async fn reconcile(&self, known_staging_ids: &[String]) -> Result<Reconciliation> {
        let known: HashSet<&str> = known_staging_ids.iter().map(String::as_str).collect();
        let mut report = Reconciliation::default();
        for dataset in self.datasets().await? {
            let Some(table) = self.try_load(&dataset).await? else { continue };
            let store = table.object_store();
            let referenced = referenced_paths(&table).await?;
            let staged: Vec<_> = store.list(Some(&Path::from(STAGING_DIR))).try_collect().await?;
            for meta in staged {
                let path = meta.location.to_string();
                let staging_id = path.split('/').nth(1).unwrap_or_default();
                if referenced.contains(&path) {
                    report.n_kept_referenced += 1;
                } else if known.contains(staging_id) {
                    report.n_kept_known += 1;
                } else {
                    store.delete(&meta.location).await?;
                    report.deleted.push(format!("{dataset}/{path}"));
                }
            }
        }
        report.deleted.sort();
        Ok(report)
    }
}

/// Every file path any retained table version adds: the active files (which covers commits folded
/// into a checkpoint) plus every `add` in the JSON commits.
async fn referenced_paths(table: &deltalake_core::DeltaTable) -> Result<BTreeSet<String>> {
    let mut paths: BTreeSet<String> = active_files(table, None).await?.into_iter().map(|a| a.path).collect();
    let store = table.object_store();
    let entries: Vec<_> = store.list(Some(&Path::from("_delta_log"))).try_collect().await?;
    for meta in entries {
        if !meta.location.as_ref().ends_with(".json") {
            continue;
        }
        let bytes = store.get(&meta.location).await?.bytes().await?;
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let action: Value = serde_json::from_slice(line)
                .map_err(|e| Error::internal(format!("unreadable Delta log entry {}: {e}", meta.location)))?;
            if let Some(path) = action.pointer("/add/path").and_then(Value::as_str) {
                paths.insert(path.to_owned());
            }
        }
    }
    Ok(paths)
}
