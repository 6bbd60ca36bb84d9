//! Vacuum: delete the data files that no table version a rollback may still target references.
//!
//! Which versions those are is the caller's decision (the CLI derives them from the store's
//! releases); the current version is always kept. The set of files to keep is computed by loading
//! the table at every kept version and taking its active files, rather than with delta-rs'
//! `VacuumBuilder`, which decides by the age of a file's removal and so cannot promise that a
//! chosen older version stays complete. A file is deleted only if some commit in the log once
//! added it: files no commit ever referenced are staged output, which reconciliation owns, and
//! `_delta_log` and other hidden paths are never looked at.

use std::collections::{BTreeSet, HashSet};

use futures::TryStreamExt as _;
use object_store::ObjectStoreExt as _;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::publish::{MAX_COMMIT_ATTEMPTS, loaded_version};
use crate::rollback::staging_id_of;
use crate::table::{Lake, active_files};

/// What [`Lake::vacuum`] removed (or, on a dry run, would remove) from one dataset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vacuum {
    /// The dataset vacuumed.
    pub dataset: String,
    /// The table version the plan was made against (always kept).
    pub current_version: u64,
    /// Every version whose files were kept, ascending.
    pub kept_versions: Vec<u64>,
    /// Paths (relative to the table root) of the deleted files, sorted.
    pub deleted: Vec<String>,
    /// The total size of the deleted files, in bytes.
    pub n_bytes_deleted: u64,
    /// Files kept because a kept version references them or an unfinished attempt owns them.
    pub n_kept_referenced: usize,
    /// Files no commit ever added (staged output): left to reconciliation.
    pub n_left_unpublished: usize,
    /// True when nothing was deleted because the caller asked for a dry run.
    pub dry_run: bool,
}

/// A vacuum decided and not yet carried out: what [`Lake::execute_vacuum`] will delete, made
/// against one table version. The caller can journal it (the intent) before anything goes.
#[derive(Debug, Clone)]
pub struct VacuumPlan {
    /// The report the deletion will produce (`dry_run` true until it is executed).
    pub report: Vacuum,
}

impl Lake {
    /// Deletes the files of `dataset` that some commit once added and that neither the current
    /// version nor any of `keep_versions` references. Files staged under one of
    /// `protected_staging_ids` (attempts that may still publish) are never deleted. With
    /// `dry_run`, returns the same report and deletes nothing. [`Lake::plan_vacuum`] and
    /// [`Lake::execute_vacuum`] are its two halves, for a caller that records the plan first.
    ///
    /// A kept version that can no longer be loaded is an error rather than a guess: vacuum cannot
    /// know which files it needs.
    pub async fn vacuum(
        &self,
        dataset: &str,
        keep_versions: &BTreeSet<u64>,
        protected_staging_ids: &[String],
        dry_run: bool,
    ) -> Result<Vacuum> {
        for _ in 0..MAX_COMMIT_ATTEMPTS {
            let plan = self.plan_vacuum(dataset, keep_versions, protected_staging_ids).await?;
            if dry_run {
                return Ok(plan.report);
            }
            if let Some(done) = self.execute_vacuum(plan).await? {
                return Ok(done);
            }
        }
        Err(Error::Conflict { dataset: dataset.to_owned(), n_attempts: MAX_COMMIT_ATTEMPTS })
    }

    /// Decides what a vacuum of `dataset` deletes, against its current version; deletes nothing.
    pub async fn plan_vacuum(
        &self,
        dataset: &str,
        keep_versions: &BTreeSet<u64>,
        protected_staging_ids: &[String],
    ) -> Result<VacuumPlan> {
        let protected: HashSet<&str> = protected_staging_ids.iter().map(String::as_str).collect();
        // Read strictly before delta-rs loads it: an unreadable commit stops the vacuum first.
        let Some((table, ever_added)) = self.load_referenced(dataset).await? else {
            return Err(Error::UnknownDataset { dataset: dataset.to_owned() });
        };
        let current = loaded_version(&table)?;
        let plan = self.files_to_delete(dataset, &table, current, keep_versions, &protected, &ever_added).await?;
        Ok(VacuumPlan {
            report: Vacuum {
                dataset: dataset.to_owned(),
                current_version: current,
                kept_versions: plan.kept_versions,
                n_bytes_deleted: plan.candidates.iter().map(|(_, size)| size).sum(),
                deleted: plan.candidates.into_iter().map(|(path, _)| path).collect(),
                n_kept_referenced: plan.n_kept_referenced,
                n_left_unpublished: plan.n_left_unpublished,
                dry_run: true,
            },
        })
    }

    /// Deletes what `plan` lists, if the table is still at the version the plan was made
    /// against; `None` (nothing deleted) when a commit landed since, which may reference files
    /// the plan did not see as needed (a rollback re-adding old files): plan again.
    pub async fn execute_vacuum(&self, plan: VacuumPlan) -> Result<Option<Vacuum>> {
        let mut report = plan.report;
        let table = self.load(&report.dataset).await?;
        if table.version() != Some(report.current_version) {
            return Ok(None);
        }
        let store = table.object_store();
        for path in &report.deleted {
            match store.delete(&crate::layout::object_path(path.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        report.dry_run = false;
        Ok(Some(report))
    }

    async fn files_to_delete(
        &self,
        dataset: &str,
        table: &deltalake_core::DeltaTable,
        current: u64,
        keep_versions: &BTreeSet<u64>,
        protected: &HashSet<&str>,
        ever_added: &BTreeSet<String>,
    ) -> Result<Plan> {
        let mut kept_versions: BTreeSet<u64> = keep_versions.iter().copied().filter(|v| *v < current).collect();
        kept_versions.insert(current);
        let mut needed: HashSet<String> = HashSet::new();
        for version in &kept_versions {
            let at = if *version == current { table.clone() } else { self.load_at(dataset, Some(*version)).await? };
            needed.extend(active_files(&at, None).await?.into_iter().map(|a| a.path));
        }
        let store = table.object_store();
        let listed: Vec<_> = store.list(None).try_collect().await?;
        let mut plan = Plan { kept_versions: kept_versions.into_iter().collect(), ..Plan::default() };
        for meta in listed {
            let path = meta.location.to_string();
            if path.split('/').any(|segment| segment.starts_with(['_', '.'])) {
                continue;
            }
            if needed.contains(&path) {
                plan.n_kept_referenced += 1;
            } else if !ever_added.contains(&path) {
                plan.n_left_unpublished += 1;
            } else if staging_id_of(&path).is_some_and(|id| protected.contains(id)) {
                plan.n_kept_referenced += 1;
            } else {
                plan.candidates.push((path, meta.size));
            }
        }
        plan.candidates.sort();
        Ok(plan)
    }
}

#[derive(Debug, Default)]
struct Plan {
    kept_versions: Vec<u64>,
    /// `(path, size in bytes)` of every file to delete.
    candidates: Vec<(String, u64)>,
    n_kept_referenced: usize,
    n_left_unpublished: usize,
}
