//! Vacuum: deleting the data files no kept release needs, so that `rollback` of every kept
//! release still works and nothing a running step reads goes away.

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_lake::{Lake, Vacuum};
use tidegate_store::{ActiveStep, Decision, JournalMeta, ReleaseRecord, Store};

use crate::actor::{Access, require};
use crate::lock::DatasetLockGuard;
use crate::reconcile::live_staging_ids;
use crate::workspace::{Workspace, open_lake, runtime};

/// Releases per dataset kept when neither --retain-releases nor --older-than is given.
pub const DEFAULT_RETAIN_RELEASES: u32 = 10;

/// The most deleted paths one journal entry lists; the count is always complete.
pub const MAX_PATHS_JOURNALED: usize = 1_000;

/// The most releases of one dataset read to decide what --older-than keeps.
pub const MAX_RELEASES_SCANNED: u32 = 100_000;

/// What to vacuum.
#[derive(Debug, Clone)]
pub struct VacuumRequest {
    /// The datasets (empty: every dataset in the spec that has a table).
    pub datasets: Vec<String>,
    /// Which releases keep their versions.
    pub keep: Keep,
    /// Report what would be deleted; delete nothing, journal nothing, take no lock.
    pub dry_run: bool,
    /// How long to wait for another holder of a dataset's maintenance lock.
    pub lock_wait: std::time::Duration,
}

/// What a vacuum deleted (or, dry, would delete).
#[derive(Debug, Clone, Serialize)]
pub struct VacuumReport {
    /// True when nothing was deleted.
    pub dry_run: bool,
    /// Files deleted, over every dataset.
    pub n_files_deleted: usize,
    /// Their bytes.
    pub n_bytes_deleted: u64,
    /// Each dataset's vacuum.
    pub datasets: Vec<Vacuum>,
}

/// Deletes the data files that neither the current version, nor the versions kept releases need,
/// nor the versions the current release pointer names, nor input versions unfinished steps pinned
/// reference: each dataset under its maintenance lock,
/// journaled before (`vacuum_started`) and after (`vacuumed` or `vacuum_failed`).
pub fn vacuum(ws: &Workspace, store: &Arc<dyn Store>, actor: &Actor, args: &VacuumRequest) -> Result<VacuumReport> {
    require(actor, Access::ChangeTables)?;
    for name in &args.datasets {
        if !ws.spec.datasets.contains_key(name) {
            crate::refuse!(NotFound, "no dataset named {name:?} in {}", ws.spec.file);
        }
    }
    let names: Vec<String> =
        if args.datasets.is_empty() { ws.spec.datasets.keys().cloned().collect() } else { args.datasets.clone() };
    let active = store.active_steps()?;
    let protected = live_staging_ids(store.as_ref(), &active)?;
    let keep = args.keep;
    let datasets = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        // The versions to keep come from the store's releases: a store the lake contradicts (cut
        // back, replaced) would have vacuum delete what kept releases need.
        if !args.dry_run {
            // Before anything loads a table: a broken commit is named, not misread.
            for name in &names {
                lake.check_commits(name).await?;
            }
            crate::anchor::refuse_unvouched(ws, store.as_ref(), &lake, "vacuum").await?;
        }
        let pointer = lake.pointer().await?;
        let mut reports = Vec::new();
        for name in &names {
            // Before anything loads the table: a broken commit is named, not misread.
            lake.check_commits(name).await?;
            if lake.table_version(name).await?.is_none() {
                continue;
            }
            let mut versions = kept_versions(store.as_ref(), name, keep)?;
            // Invariant 3: a retry reads exactly the versions its step pinned, so they stay whole.
            versions.extend(pinned_versions(&active, name));
            // Readers of whole releases read the versions the current release pointer names.
            versions.extend(pointer.as_ref().and_then(|p| p.tables.get(name)).copied());
            let report = if args.dry_run {
                lake.vacuum(name, &versions, &protected, true).await?
            } else {
                let lock = DatasetLockGuard::acquire(store, &ws.clock, actor, name, "vacuum", args.lock_wait).await?;
                // One correlation id joins the intent, the outcome and a failure.
                let journal = VacuumJournal {
                    ws,
                    store: store.as_ref(),
                    actor,
                    dataset: name,
                    correlation_id: format!("vacuum-{}", uuid::Uuid::now_v7()),
                };
                let result = vacuum_journaled(&lake, &journal, &versions, &protected, &lock).await;
                if let Err(e) = &result {
                    let payload = serde_json::json!({ "kept_versions": versions });
                    journal.write("vacuum_failed", format!("vacuum of {name} failed: {e:#}"), payload)?;
                }
                result?
            };
            reports.push(report);
        }
        anyhow::Ok(reports)
    })?;
    let report = VacuumReport {
        dry_run: args.dry_run,
        n_files_deleted: datasets.iter().map(|d| d.deleted.len()).sum(),
        n_bytes_deleted: datasets.iter().map(|d| d.n_bytes_deleted).sum(),
        datasets,
    };
    Ok(report)
}

/// Vacuums one dataset under its lock, journaling the intent (`vacuum_started`, with the files it
/// is about to delete) before deleting anything and the outcome (`vacuumed`) after, so a vacuum
/// that dies part-way leaves an entry saying what it meant to delete.
async fn vacuum_journaled(
    lake: &Lake,
    journal: &VacuumJournal<'_>,
    versions: &BTreeSet<u64>,
    protected: &[String],
    lock: &DatasetLockGuard,
) -> Result<Vacuum> {
    let dataset = journal.dataset;
    for attempt in 1..=tidegate_lake::MAX_COMMIT_ATTEMPTS {
        let plan =
            lake.plan_vacuum(dataset, versions, protected).await.with_context(|| format!("vacuuming {dataset}"))?;
        lock.ensure_held()?;
        let planned = &plan.report;
        // Nothing to delete needs no intent; the outcome below still records that vacuum ran.
        if !planned.deleted.is_empty() {
            let reason = format!(
                "deleting {} no kept version of {dataset} references (plan {attempt}, against version {})",
                crate::human::count(planned.deleted.len(), "file", "files"),
                planned.current_version
            );
            journal.write("vacuum_started", reason, summary(planned, attempt))?;
        }
        let Some(done) = lake.execute_vacuum(plan).await.with_context(|| format!("vacuuming {dataset}"))? else {
            // A commit landed after the plan was made: plan again against it.
            continue;
        };
        let reason = format!(
            "deleted {} no kept version of {dataset} references",
            crate::human::count(done.deleted.len(), "file", "files")
        );
        journal.write("vacuumed", reason, summary(&done, attempt))?;
        return Ok(done);
    }
    crate::refuse!(
        Conflict,
        "vacuuming {dataset}: the table changed under every one of {} plans; try again when publications pause",
        tidegate_lake::MAX_COMMIT_ATTEMPTS
    )
}

/// What the journal keeps of a vacuum report (from plan `attempt`): everything but the path list
/// past [`MAX_PATHS_JOURNALED`] (the counts stay complete).
fn summary(v: &Vacuum, attempt: u32) -> serde_json::Value {
    serde_json::json!({
        "attempt": attempt,
        "current_version": v.current_version,
        "kept_versions": v.kept_versions,
        "n_files_deleted": v.deleted.len(),
        "n_bytes_deleted": v.n_bytes_deleted,
        "deleted": v.deleted.iter().take(MAX_PATHS_JOURNALED).collect::<Vec<_>>(),
        "n_deleted_not_listed": v.deleted.len().saturating_sub(MAX_PATHS_JOURNALED),
    })
}

/// Where one dataset's vacuum writes its journal entries, all under one correlation id.
struct VacuumJournal<'a> {
    ws: &'a Workspace,
    store: &'a dyn Store,
    actor: &'a Actor,
    dataset: &'a str,
    correlation_id: String,
}

impl VacuumJournal<'_> {
    fn write(&self, kind: &str, reason: String, mut payload: serde_json::Value) -> Result<()> {
        let dataset = self.dataset;
        payload["dataset"] = serde_json::json!(dataset);
        let decision = Decision { kind: kind.to_owned(), run_id: None, task: None, partition: None, payload };
        let meta = JournalMeta {
            via: Some(self.actor.via()),
            actor: self.actor.name.clone(),
            correlation_id: self.correlation_id.clone(),
            reason,
            at: self.ws.now(),
        };
        self.store.record_decision(&decision, &meta).with_context(|| format!("journaling the vacuum of {dataset}"))?;
        Ok(())
    }
}

/// Which releases a vacuum keeps.
#[derive(Debug, Clone, Copy)]
pub enum Keep {
    /// The N newest releases of each dataset.
    Newest(u32),
    /// Every release made since then.
    Since(DateTime<Utc>),
}

impl Keep {
    /// The releases made within `age` before `now` when given, else the `newest` N of each dataset
    /// ([`DEFAULT_RETAIN_RELEASES`] unless given).
    pub fn of(age: Option<chrono::Duration>, newest: Option<u32>, now: DateTime<Utc>) -> Keep {
        match age {
            Some(age) => Keep::Since(now - age),
            None => Keep::Newest(newest.unwrap_or(DEFAULT_RETAIN_RELEASES)),
        }
    }
}

/// The table versions of `dataset` that kept releases need: each kept release's version and the
/// one before it (the target of `rollback --to-release`).
fn kept_versions(store: &dyn Store, dataset: &str, keep: Keep) -> Result<BTreeSet<u64>> {
    let releases: Vec<ReleaseRecord> = match keep {
        Keep::Newest(n) => store.releases(Some(dataset), n)?,
        Keep::Since(cutoff) => {
            let all = store.releases(Some(dataset), MAX_RELEASES_SCANNED)?;
            if all.len() == MAX_RELEASES_SCANNED as usize && all.last().is_some_and(|r| r.created_at >= cutoff) {
                crate::refuse!(
                    Invalid,
                    "{dataset} has more than {MAX_RELEASES_SCANNED} releases newer than the cutoff; use a shorter \
                     --older-than or --retain-releases"
                );
            }
            all.into_iter().filter(|r| r.created_at >= cutoff).collect()
        }
    };
    let mut versions = BTreeSet::new();
    for item in releases.iter().flat_map(|r| &r.items).filter(|i| i.dataset == dataset) {
        let version = u64::try_from(item.delta_version).context("a release records a negative table version")?;
        versions.insert(version);
        if let Some(before) = version.checked_sub(1) {
            versions.insert(before);
        }
    }
    Ok(versions)
}

/// The versions of `dataset` that unfinished steps pinned as inputs.
fn pinned_versions<'a>(active: &'a [ActiveStep], dataset: &'a str) -> impl Iterator<Item = u64> + 'a {
    active
        .iter()
        .flat_map(|a| &a.step.inputs)
        .filter(move |input| input.dataset == dataset)
        .filter_map(|input| input.version.and_then(|v| u64::try_from(v).ok()))
}
