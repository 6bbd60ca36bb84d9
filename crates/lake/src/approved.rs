//! Publication of a reviewed release (a backfill): each dataset is committed only on a table whose
//! commits since the version the approved comparison read left the release's partitions alone.
//!
//! The check runs on the very version the commit is built on, and the commit can land only at
//! the next version (`publish::commit` allows delta-rs no retries), so a commit that lands
//! between the check and the commit takes that version first: ours fails, the table is loaded
//! again and the commits since approval are checked again. No live publication can be replaced
//! by a backfill that was approved before it existed.

use std::collections::{BTreeMap, BTreeSet};

use deltalake_core::DeltaTable;
use serde_json::Value;
use tidegate_core::spec::model::WriteMode;

use crate::error::{Error, Result};
use crate::layout::PartitionColumn;
use crate::modes;
use crate::publish::{Publication, Release, ReleaseItem, app_id, loaded_version};
use crate::table::Lake;

/// The table version a dataset's comparison was approved against; `None` when the dataset had no
/// table then (every commit of the table is newer than the approval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ApprovedAt(pub Option<u64>);

impl Lake {
    /// Publishes a release whose comparison was approved against the table versions in `approved`
    /// (dataset -> version; `None`: no table yet), as [`Lake::publish`] does, except that a
    /// dataset whose partitions some commit changed since that version is refused with
    /// [`Error::MovedSinceApproval`] (for a snapshot dataset, any commit of data). Every dataset is
    /// checked before the first commit, so a move seen then publishes nothing; a move that lands
    /// while the release is being committed is caught at that dataset's commit, and the datasets
    /// already committed are restored ([`Error::ReleaseFailed`]).
    pub async fn publish_approved(
        &self,
        release: &Release,
        approved: &BTreeMap<String, Option<u64>>,
    ) -> Result<Publication> {
        let approved_at = |item: &ReleaseItem| {
            approved.get(&item.dataset.name).map(|v| ApprovedAt(*v)).ok_or_else(|| {
                Error::internal(format!(
                    "release {} has no approved version of {}",
                    release.release_id, item.dataset.name
                ))
            })
        };
        let mut checked = Vec::with_capacity(release.items.len());
        let (mut any_replayed, mut first_move) = (false, None);
        for item in &release.items {
            let at = approved_at(item)?;
            let table = self.load(&item.dataset.name).await?;
            if self.already_published(&table, item).await? {
                any_replayed = true;
            } else if let Err(e) = self.ensure_unmoved(&table, item, at).await {
                first_move.get_or_insert(e);
            }
            checked.push(at);
        }
        // With a dataset committed by an earlier attempt, publication goes on to the refusal,
        // which restores that dataset too.
        if let Some(e) = first_move
            && !any_replayed
        {
            return Err(e);
        }
        self.publish_checked(release, Some(&checked)).await
    }

    /// Whether the item's step identity already has its commit in `table` (a replay).
    async fn already_published(&self, table: &DeltaTable, item: &ReleaseItem) -> Result<bool> {
        let recorded = self.txn_version(&item.dataset.name, table, &app_id(&item.step_identity)).await?;
        Ok(recorded.is_some_and(|v| u64::try_from(v).is_ok()))
    }

    /// Refuses if a commit after `approved` up to the loaded version of `table` touched the item's
    /// partitions (any partition, for a snapshot).
    pub(crate) async fn ensure_unmoved(
        &self,
        table: &DeltaTable,
        item: &ReleaseItem,
        approved: ApprovedAt,
    ) -> Result<()> {
        let found = loaded_version(table)?;
        let whole_table = matches!(modes::write_mode(&item.dataset), Ok(WriteMode::Snapshot));
        let partitions: BTreeSet<String> = item.staged.partition_keys().into_iter().collect();
        let name = &item.dataset.name;
        // A table now older than the approved version was replaced since: nothing can be ruled out.
        let moved = if approved.0.is_some_and(|v| v > found) {
            partitions
        } else {
            moved_partitions(name, table, approved.0, found, &partitions, whole_table).await?
        };
        if moved.is_empty() {
            return Ok(());
        }
        Err(Error::MovedSinceApproval {
            dataset: item.dataset.name.clone(),
            partitions: moved.into_iter().collect(),
            approved_version: approved.0,
            found_version: found,
        })
    }
}

/// The partitions among `partitions` that a commit after `since` up to `to` added or removed
/// files in; with `whole_table`, every partition any such commit touched. A file without a
/// partition value, or a commit that can no longer be read, counts as touching all of them: a
/// move that cannot be ruled out is a move.
pub(crate) async fn moved_partitions(
    dataset: &str,
    table: &DeltaTable,
    since: Option<u64>,
    to: u64,
    partitions: &BTreeSet<String>,
    whole_table: bool,
) -> Result<BTreeSet<String>> {
    let log = table.log_store();
    let column = PartitionColumn::of_table(table)?;
    let mut moved = BTreeSet::new();
    for version in since.map_or(0, |v| v + 1)..=to {
        let Some(bytes) = log.read_commit_entry(version).await? else {
            moved.extend(partitions.iter().cloned());
            continue;
        };
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let action: Value = serde_json::from_slice(line)
                .map_err(|e| Error::internal(format!("commit {version} of {dataset} is not JSON lines: {e}")))?;
            for file in ["add", "remove"].into_iter().filter_map(|kind| action.get(kind)) {
                let value = file["partitionValues"][column.name.as_str()].as_str();
                let key = value.map(|v| column.key_of(v).unwrap_or_else(|| v.to_owned()));
                match key.as_deref() {
                    Some(key) if whole_table => {
                        moved.insert(key.to_owned());
                    }
                    Some(key) if partitions.contains(key) => {
                        moved.insert(key.to_owned());
                    }
                    Some(_) => {}
                    None => moved.extend(partitions.iter().cloned()),
                }
            }
        }
    }
    Ok(moved)
}
