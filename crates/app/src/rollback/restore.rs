//! The restore every undo shares, a run's or release's ([`super::unit`]) and a backfill's
//! (`backfill::release::rollback`): under the scheduler role (no publication lands between two
//! datasets' restores), each dataset restored in order under its lock (vacuum must not delete the
//! files it adds back between its check and its commit), its commit anchored to the journal's
//! head; then, once every dataset committed, the release pointer moved, so that readers through
//! it see the undo whole or not at all. A dataset that fails stops the rest: the ones restored
//! stay restored (each is its own commit) and rerunning the undo finishes it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tidegate_core::actor::Actor;
use tidegate_engine::executor::acquire_scheduler_role;
use tidegate_lake::Advance;
use tidegate_store::Store;

use crate::lock::DatasetLockGuard;
use crate::workspace::{Workspace, open_lake, runtime};

/// One dataset to restore.
#[derive(Debug, Clone)]
pub(crate) struct Target<'a> {
    /// The dataset.
    pub(crate) dataset: &'a str,
    /// The table version whose files it gets back.
    pub(crate) to_version: u64,
    /// Only these partitions; `None` for the whole table (schema and properties too).
    pub(crate) partitions: Option<&'a [String]>,
    /// The table version whose commit this undoes: the partitions must still hold exactly its
    /// files when the restore commits, or the undo is refused naming them (a newer release
    /// published over them).
    pub(crate) undoing: u64,
}

/// The release the restores are recorded under, for the commits and the pointer.
#[derive(Debug, Clone)]
pub(crate) struct Undoing<'a> {
    /// The rollback release's id (each dataset's commit names it, so a rerun finds it).
    pub(crate) release_id: &'a str,
    /// The run undone, if one is.
    pub(crate) run_id: Option<&'a str>,
    /// The backfill undone, if one is.
    pub(crate) backfill_id: Option<&'a str>,
}

/// Restores `targets` in order and moves the release pointer; returns each one's new table
/// version, in `targets`' order.
pub(crate) fn restore_all(
    ws: &Workspace,
    store: &Arc<dyn Store>,
    actor: &Actor,
    undoing: &Undoing<'_>,
    targets: &[Target<'_>],
    lock_wait: Duration,
) -> Result<Vec<u64>> {
    let owner = format!("rollback-{}-{}", undoing.release_id, std::process::id());
    runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        acquire_scheduler_role(store, &owner, ws.clock.as_ref(), ws.spec.project.lease_ttl_s).await?;
        let result = restore_each(ws, store, actor, &lake, undoing, targets, lock_wait).await;
        let _ = store.release_scheduler(&owner);
        result
    })
}

async fn restore_each(
    ws: &Workspace,
    store: &Arc<dyn Store>,
    actor: &Actor,
    lake: &tidegate_lake::Lake,
    undoing: &Undoing<'_>,
    targets: &[Target<'_>],
    lock_wait: Duration,
) -> Result<Vec<u64>> {
    let mut new_versions = Vec::with_capacity(targets.len());
    for t in targets {
        let _lock = DatasetLockGuard::acquire(store, &ws.clock, actor, t.dataset, "rollback", lock_wait).await?;
        let anchor = crate::anchor::head(ws, store.as_ref())?;
        let new_version = lake
            .rollback(t.dataset, t.to_version, t.partitions, undoing.release_id, anchor.as_ref(), Some(t.undoing))
            .await
            .with_context(|| format!("restoring {} to version {}", t.dataset, t.to_version))?;
        new_versions.push(new_version);
    }
    let advance = Advance {
        release: undoing.release_id.to_owned(),
        run_id: undoing.run_id.map(str::to_owned),
        backfill_id: undoing.backfill_id.map(str::to_owned),
        at: ws.now(),
        tables: targets.iter().zip(&new_versions).map(|(t, v)| (t.dataset.to_owned(), *v)).collect(),
    };
    lake.advance_pointer(advance).await.context("moving the release pointer (rolling back again retries it)")?;
    Ok(new_versions)
}
