//! Rolling back: a run or a release undone as a unit ([`unit`]), or a dataset restored to an
//! explicit earlier version (here): an earlier version's files (and, for the whole table, its
//! schema and properties) restored in a new, journaled commit. Nothing is deleted.

pub(crate) mod restore;
pub mod unit;

pub use unit::{DatasetUndo, UndoRequest, Undone, Unit, undo};

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_lake::Advance;
use tidegate_store::{JournalMeta, ReleaseItem, ReleaseKind, ReleaseRecord, Store};

use crate::actor::{Access, require};
use crate::lock::DatasetLockGuard;
use crate::workspace::{Workspace, open_lake, runtime};

/// What to roll back.
#[derive(Debug, Clone)]
pub struct RollbackRequest {
    /// The dataset.
    pub dataset: String,
    /// Undo this release: restore the table version that preceded it.
    pub to_release: Option<String>,
    /// Restore exactly this table version.
    pub to_version: Option<u64>,
    /// Only these partitions' files (empty: the whole table, schema and properties included).
    pub partitions: Vec<String>,
    /// Why, for the journal.
    pub reason: String,
    /// How long to wait for another holder of the dataset's maintenance lock.
    pub lock_wait: Duration,
}

/// A rollback done.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = DatasetRolledBack))]
pub struct RolledBack {
    /// The dataset.
    pub dataset: String,
    /// The version whose files it restored.
    pub restored_version: u64,
    /// The new version that restores them.
    pub new_version: u64,
    /// The rollback's release.
    pub release_id: String,
    /// True when this call recorded a rollback a killed one had committed, and rolled back nothing.
    pub adopted: bool,
}

/// Restores `request.dataset` to an earlier version in a new commit, under the dataset's
/// maintenance lock, and records it as a release of kind rollback.
pub fn rollback(
    ws: &Workspace,
    store: &Arc<dyn Store>,
    actor: &Actor,
    request: &RollbackRequest,
) -> Result<RolledBack> {
    require(actor, Access::ChangeTables)?;
    crate::input::require_reason(&request.reason)?;
    let Some(dataset) = ws.spec.datasets.get(&request.dataset) else {
        crate::refuse!(NotFound, "no dataset named {:?} in {}", request.dataset, ws.spec.file);
    };
    // Before anything is read or committed: a key the partitioning cannot have would restore
    // nothing and still record a release.
    if let Err(e) = tidegate_core::plan::partitions_of(dataset, &request.partitions) {
        crate::refuse!(Invalid, "{e}; nothing was restored");
    }
    crate::notify::start(ws, store.as_ref());
    let mut release_id = format!("rollback-{}", uuid::Uuid::now_v7());
    let mut partitions = request.partitions.clone();
    let mut adopted = false;
    let (target, new_version) = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        // Held until the commit: vacuum must not delete the files this rollback adds back
        // between its check that they exist and the commit.
        let _lock =
            DatasetLockGuard::acquire(store, &ws.clock, actor, &request.dataset, "rollback", request.lock_wait).await?;
        // Before anything loads the table: a broken commit is named, not misread.
        lake.check_commits(&request.dataset).await?;
        // A rollback killed between its commit and its record: record that one first. Rolling
        // back again over it would undo it (the default target is the version before the newest)
        // and leave its commit unknown to the store for ever.
        if let Some(made) = lake.newest_rollback(&request.dataset).await?
            && store.release(&made.release_id)?.is_none()
        {
            release_id = made.release_id;
            partitions = made.partitions.unwrap_or_default();
            adopted = true;
            return anyhow::Ok((made.to_version, made.version));
        }
        let Some(current) = lake.table_version(&request.dataset).await? else {
            crate::refuse!(Conflict, "{} has no published version", request.dataset);
        };
        // The version restored, and the one undone (whose files the table must still hold when
        // the restore commits); an explicit version is a restore, not an undo.
        let (target, undoing) = match (&request.to_release, request.to_version) {
            (_, Some(v)) => (v, None),
            (Some(r), None) => {
                let rel = store.release(&crate::ids::release(store.as_ref(), r)?)?;
                let Some(rel) = rel else { crate::refuse!(NotFound, "no release {r:?}") };
                let r = &rel.id;
                let Some(item) = rel.items.iter().find(|i| i.dataset == request.dataset) else {
                    crate::refuse!(Invalid, "release {r} did not publish {}", request.dataset);
                };
                let committed =
                    u64::try_from(item.delta_version).context("a release records a negative table version")?;
                let before =
                    committed.checked_sub(1).context("the release created the table; there is nothing before it")?;
                (before, Some(committed))
            }
            (None, None) => match current.checked_sub(1) {
                Some(previous) => (previous, Some(current)),
                None => crate::refuse!(Conflict, "the table has a single version; there is nothing to restore"),
            },
        };
        if target >= current {
            crate::refuse!(
                Invalid,
                "dataset {:?}: version {target} is not older than its current version {current}; nothing was restored",
                request.dataset
            );
        }
        let parts = (!request.partitions.is_empty()).then_some(request.partitions.as_slice());
        let anchor = crate::anchor::head(ws, store.as_ref())?;
        let new_version = lake.rollback(&request.dataset, target, parts, &release_id, anchor.as_ref(), undoing).await?;
        anyhow::Ok((target, new_version))
    })?;
    // Pointer readers see the restored version too.
    runtime()?.block_on(async {
        let advance = Advance {
            release: release_id.clone(),
            run_id: None,
            backfill_id: None,
            at: ws.now(),
            tables: [(request.dataset.clone(), new_version)].into(),
        };
        open_lake(ws).await?.advance_pointer(advance).await.context("moving the release pointer")
    })?;
    if partitions.is_empty() {
        partitions.push("*".to_owned());
    }
    let record = ReleaseRecord {
        id: release_id.clone(),
        kind: ReleaseKind::Rollback,
        run_id: None,
        backfill_id: None,
        restores_release_id: request.to_release.clone(),
        created_by: actor.name.clone(),
        created_at: ws.now(),
        items: partitions
            .iter()
            .map(|p| ReleaseItem {
                dataset: request.dataset.clone(),
                partition: p.clone(),
                version_id: None,
                delta_version: i64::try_from(new_version).unwrap_or(i64::MAX),
                restored_delta_version: i64::try_from(target).ok(),
                unchanged: false,
            })
            .collect(),
    };
    let reason = if adopted {
        format!(
            "recorded the rollback to version {target} that a killed `tidegate rollback` committed as version \
             {new_version}; this run ({}) rolled nothing back",
            request.reason
        )
    } else {
        format!("{} (restored table version {target})", request.reason)
    };
    let meta = JournalMeta::of(actor, release_id.clone(), reason, ws.now());
    store.record_release(&record, &[], &meta)?;
    crate::notify::deliver(ws, store.as_ref());
    Ok(RolledBack { dataset: request.dataset.clone(), restored_version: target, new_version, release_id, adopted })
}
