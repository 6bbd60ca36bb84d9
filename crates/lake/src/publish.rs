//! Publication: one Delta commit per dataset, carrying an application transaction (`txn`) for the
//! step identity and commit metadata naming the run, step, spec hash and release. A replay is
//! detected from the `txn` before anything is written (delta-rs does not enforce it), conflicts
//! are retried against a freshly loaded table, and a release that fails part-way restores the
//! datasets it had already committed.

use deltalake_core::DeltaTable;
use deltalake_core::DeltaTableError;
use deltalake_core::kernel::Action;
use deltalake_core::kernel::Transaction;
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_core::spec::model::Dataset;

use crate::error::{Error, Result};
use crate::modes;
use crate::stage::StagedVersion;
use crate::table::{Lake, PARTITION_COLUMN};

/// How many times a commit is re-planned against a newer table before giving up with a
/// retryable [`Error::Conflict`].
pub const MAX_COMMIT_ATTEMPTS: u32 = 20;

/// The prefix of every application transaction id Tidegate writes: `tidegate:<step identity>`.
pub const APP_ID_PREFIX: &str = "tidegate:";

/// The `txn` version that marks a publication undone by a failed release's restore, so that the
/// release's retry publishes it again instead of taking it for a replay.
pub const TXN_UNDONE: i64 = -1;

/// A set of staged versions to make visible together, in dependency order.
#[derive(Debug, Clone)]
pub struct Release {
    pub release_id: String,
    pub run_id: String,
    pub spec_hash: String,
    pub items: Vec<ReleaseItem>,
}

/// One dataset's part of a release.
#[derive(Debug, Clone)]
pub struct ReleaseItem {
    pub dataset: Dataset,
    pub staged: StagedVersion,
    /// The step's stable identity (task, partition, run): the replay guard's key.
    pub step_identity: String,
}

/// What a release made visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub release_id: String,
    pub items: Vec<PublishedItem>,
}

/// One dataset's commit in a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedItem {
    pub dataset: String,
    pub step_identity: String,
    /// The table version that holds this step's effect.
    pub table_version: u64,
    /// The version before this commit (`None` for a replay, which committed nothing).
    pub previous_version: Option<u64>,
    /// True when the step had already been published: nothing was committed this time.
    pub already_published: bool,
    pub n_files_added: usize,
    pub n_files_removed: usize,
    pub n_rows_added: u64,
}

impl Lake {
    /// Publishes a release: one commit per item, in the given order. If an item fails after
    /// earlier ones were committed, those are restored (in reverse order) and the error says so.
    pub async fn publish(&self, release: &Release) -> Result<Publication> {
        let mut done: Vec<PublishedItem> = Vec::with_capacity(release.items.len());
        for item in &release.items {
            match self.publish_item(release, item).await {
                Ok(published) => done.push(published),
                Err(e) if done.iter().all(|p| p.already_published) => return Err(e),
                Err(e) => return Err(self.undo(release, &done, &item.dataset.name, e).await),
            }
        }
        Ok(Publication { release_id: release.release_id.clone(), items: done })
    }

    /// Restores every dataset this call committed, newest first, and wraps the failure.
    async fn undo(&self, release: &Release, done: &[PublishedItem], failed_dataset: &str, source: Error) -> Error {
        let mut restored = Vec::new();
        let mut not_restored = Vec::new();
        for item in done.iter().rev().filter(|p| !p.already_published) {
            let Some(previous) = item.previous_version else { continue };
            let metadata = vec![
                ("tidegate.operation".to_owned(), Value::from("restore")),
                ("tidegate.release_id".to_owned(), Value::from(release.release_id.clone())),
                ("tidegate.run_id".to_owned(), Value::from(release.run_id.clone())),
                ("tidegate.step".to_owned(), Value::from(item.step_identity.clone())),
                ("tidegate.reason".to_owned(), Value::from(format!("{failed_dataset} failed"))),
            ];
            let txn = Transaction::new(app_id(&item.step_identity), TXN_UNDONE);
            match self.restore_to(&item.dataset, previous, None, metadata, Some(txn)).await {
                Ok(version) => restored.push((item.dataset.clone(), version)),
                Err(_) => not_restored.push(item.dataset.clone()),
            }
        }
        Error::ReleaseFailed {
            release_id: release.release_id.clone(),
            dataset: failed_dataset.to_owned(),
            source: Box::new(source),
            restored,
            not_restored,
        }
    }

    /// Publishes one item: replay check, plan, commit; re-planned on a conflict.
    async fn publish_item(&self, release: &Release, item: &ReleaseItem) -> Result<PublishedItem> {
        let name = &item.dataset.name;
        if item.staged.dataset != *name {
            return Err(Error::internal(format!(
                "release item for {name} carries a version staged for {}",
                item.staged.dataset
            )));
        }
        let app_id = app_id(&item.step_identity);
        for _ in 0..MAX_COMMIT_ATTEMPTS {
            let table = self.load(name).await?;
            let version = loaded_version(&table)?;
            if let Some(recorded) = published_version(&table, &app_id).await? {
                return Ok(PublishedItem {
                    dataset: name.clone(),
                    step_identity: item.step_identity.clone(),
                    table_version: recorded,
                    previous_version: None,
                    already_published: true,
                    n_files_added: 0,
                    n_files_removed: 0,
                    n_rows_added: 0,
                });
            }
            let plan = modes::plan(self, &table, &item.dataset, &item.staged).await?;
            // The commit can only land at `version + 1` (no automatic retries), so the txn can
            // record the table version itself: a replay then knows where its effect is.
            let target =
                i64::try_from(version + 1).map_err(|_| Error::internal("table version does not fit a txn version"))?;
            let metadata = vec![
                ("tidegate.operation".to_owned(), Value::from("publish")),
                ("tidegate.release_id".to_owned(), Value::from(release.release_id.clone())),
                ("tidegate.run_id".to_owned(), Value::from(release.run_id.clone())),
                ("tidegate.step".to_owned(), Value::from(item.step_identity.clone())),
                ("tidegate.spec_hash".to_owned(), Value::from(release.spec_hash.clone())),
                ("tidegate.staging_id".to_owned(), Value::from(item.staged.staging_id.clone())),
            ];
            let operation = DeltaOperation::Write {
                mode: if plan.n_files_removed > 0 { SaveMode::Overwrite } else { SaveMode::Append },
                partition_by: Some(vec![PARTITION_COLUMN.to_owned()]),
                predicate: plan.predicate.clone(),
            };
            let txn = Transaction::new(&app_id, target);
            match commit(&table, plan.actions, Some(txn), metadata, operation).await? {
                Some(committed) => {
                    return Ok(PublishedItem {
                        dataset: name.clone(),
                        step_identity: item.step_identity.clone(),
                        table_version: committed,
                        previous_version: Some(version),
                        already_published: false,
                        n_files_added: plan.n_files_added,
                        n_files_removed: plan.n_files_removed,
                        n_rows_added: plan.n_rows_added,
                    });
                }
                None => discard(&table, &plan.written).await,
            }
        }
        Err(Error::Conflict { dataset: name.clone(), n_attempts: MAX_COMMIT_ATTEMPTS })
    }
}

/// The application transaction id of a step.
pub fn app_id(step_identity: &str) -> String {
    format!("{APP_ID_PREFIX}{step_identity}")
}

/// The version a loaded table is at.
pub(crate) fn loaded_version(table: &DeltaTable) -> Result<u64> {
    table.version().ok_or_else(|| Error::internal("a loaded table has no version"))
}

/// The table version recorded by the step's `txn`, if it is published (and not undone).
pub(crate) async fn published_version(table: &DeltaTable, app_id: &str) -> Result<Option<u64>> {
    let recorded = table.snapshot()?.transaction_version(table.log_store().as_ref(), app_id).await?;
    Ok(recorded.and_then(|v| u64::try_from(v).ok()))
}

/// Commits `actions` on top of exactly the loaded version. Returns `None` if another writer
/// committed first: the caller must reload and re-plan, since its removes may be stale.
pub(crate) async fn commit(
    table: &DeltaTable,
    actions: Vec<Action>,
    txn: Option<Transaction>,
    metadata: Vec<(String, Value)>,
    operation: DeltaOperation,
) -> Result<Option<u64>> {
    // No automatic retries: delta-rs would rebase the same actions onto a newer version, but our
    // Remove set and the txn version were computed for this one.
    let mut properties = CommitProperties::default().with_metadata(metadata).with_max_retries(0);
    if let Some(txn) = txn {
        properties = properties.with_application_transaction(txn);
    }
    let result = CommitBuilder::from(properties)
        .with_actions(actions)
        .build(Some(table.snapshot()?), table.log_store(), operation)
        .await;
    match result {
        Ok(finalized) => Ok(Some(finalized.version())),
        Err(e) if is_conflict(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn is_conflict(e: &DeltaTableError) -> bool {
    match e {
        DeltaTableError::VersionAlreadyExists(_) => true,
        DeltaTableError::Transaction { source } => matches!(
            source,
            TransactionError::VersionAlreadyExists(_)
                | TransactionError::MaxCommitAttempts(_)
                | TransactionError::CommitConflict(_)
        ),
        _ => false,
    }
}

/// Deletes files written for a plan whose commit lost; failures are left to reconciliation.
async fn discard(table: &DeltaTable, paths: &[String]) {
    let store = table.object_store();
    for path in paths {
        let _ = store.delete(&Path::from(path.as_str())).await;
    }
}
