//! Undoing a run or a release as a unit: every partition it published, in every dataset it
//! wrote, restored to what readers saw just before it, recorded as one rollback release. The plan
//! is computed first and can be shown without acting (`dry_run`); a partition that another
//! release changed after the unit is never clobbered: the undo is refused, naming that release.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::spec::model::{DatasetKind, WriteMode};
use tidegate_store::{JournalMeta, ReleaseItem, ReleaseKind, ReleaseRecord, Store};

use super::restore::{Target, Undoing, restore_all};
use crate::actor::{Access, require};
use crate::workspace::{Workspace, open_lake, runtime};

/// How many of a dataset's newest releases an undo reads to find a unit's releases and what
/// changed after them.
const RELEASES_SCANNED: u32 = 10_000;
/// The partition a release item names when it restored a whole table.
const WHOLE_TABLE: &str = "*";

/// What to undo as one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// Everything a run published.
    Run(String),
    /// Everything one release published.
    Release(String),
    /// The newest run that published this dataset and is not undone yet, in this dataset.
    LatestRun(String),
}

/// An undo to plan and, unless `dry_run`, perform.
#[derive(Debug, Clone)]
pub struct UndoRequest {
    /// The run or release.
    pub unit: Unit,
    /// Only these datasets (empty: every dataset the unit published).
    pub datasets: Vec<String>,
    /// Why, for the journal.
    pub reason: String,
    /// How long to wait for another holder of a dataset's maintenance lock.
    pub lock_wait: Duration,
    /// Plan only: say what would be restored, change nothing.
    pub dry_run: bool,
}

/// One dataset's part of an undo.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetUndo {
    /// The dataset.
    pub dataset: String,
    /// The partitions the unit published in it.
    pub partitions: Vec<String>,
    /// The table version readers saw just before the unit's first commit to it.
    pub to_version: u64,
    /// The table version of the unit's last commit to it: its partitions must still hold that
    /// version's files when the undo commits (a newer release over them refuses it).
    pub undoes_version: u64,
    /// True when the whole table (schema and properties included) is restored: every commit since
    /// `to_version` is the unit's, or the dataset is a snapshot.
    pub whole_table: bool,
    /// The new table version, once restored.
    pub new_version: Option<u64>,
}

/// An undo, planned or done.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Undone {
    /// The run undone, when the unit was a run's.
    pub run_id: Option<String>,
    /// The releases undone, oldest first.
    pub releases: Vec<String>,
    /// Each dataset restored (or to restore), downstream first.
    pub datasets: Vec<DatasetUndo>,
    /// The rollback release that records the undo.
    pub release_id: String,
    /// True when nothing was changed.
    pub dry_run: bool,
}

/// Plans the undo of `request.unit` and, unless it is a dry run, restores each dataset (downstream
/// first, under its maintenance lock, holding the scheduler role so nothing publishes meanwhile)
/// and records one rollback release. Running it again after a crash finishes the same undo.
pub fn undo(ws: &Workspace, store: &Arc<dyn Store>, actor: &Actor, request: &UndoRequest) -> Result<Undone> {
    require(actor, Access::ChangeTables)?;
    crate::input::require_reason(&request.reason)?;
    let request = &request.with_whole_ids(store.as_ref())?;
    let mut plan = plan(ws, store.as_ref(), request)?;
    if request.dry_run {
        return Ok(plan);
    }
    crate::notify::start(ws, store.as_ref());
    restore(ws, store, actor, &mut plan, request.lock_wait)?;
    record(ws, store.as_ref(), actor, &plan, &request.reason)?;
    crate::notify::deliver(ws, store.as_ref());
    Ok(plan)
}

/// What undoing `request.unit` restores, without changing anything.
fn plan(ws: &Workspace, store: &dyn Store, request: &UndoRequest) -> Result<Undone> {
    let scope = datasets_in_scope(ws, request)?;
    let mut releases: BTreeMap<String, Vec<ReleaseRecord>> = BTreeMap::new();
    for name in &scope {
        releases.insert(name.clone(), store.releases(Some(name), RELEASES_SCANNED)?);
    }
    let (run_id, unit) = resolve(store, &request.unit, &releases)?;
    let release_id = match (&request.unit, &run_id) {
        (Unit::Release(id), _) => format!("rb-{id}"),
        (_, Some(run)) => format!("rb-{run}"),
        (_, None) => format!("rb-{}", unit.iter().next().context("a unit has a release")?),
    };
    if let Some(done) = store.release(&release_id)? {
        crate::refuse!(
            Conflict,
            "{} was already rolled back (release {}, {} by {}); nothing was restored",
            describe(&request.unit),
            done.id,
            done.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
            done.created_by
        );
    }
    let current = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        let mut current = BTreeMap::new();
        for name in &scope {
            current.insert(name.clone(), lake.table_version(name).await?);
        }
        anyhow::Ok(current)
    })?;
    let mut datasets = Vec::new();
    for name in &scope {
        let all = &releases[name];
        if let Some(d) = dataset_undo(ws, name, all, &unit, current[name])? {
            datasets.push(d);
        }
    }
    if datasets.is_empty() {
        crate::refuse!(
            Conflict,
            "{} published nothing in {}; nothing was restored",
            describe(&request.unit),
            scope.join(", ")
        );
    }
    sort_downstream_first(ws, &mut datasets);
    Ok(Undone { run_id, releases: unit.into_iter().collect(), datasets, release_id, dry_run: request.dry_run })
}

/// The datasets an undo may touch: those asked for (each must exist), else every managed one.
fn datasets_in_scope(ws: &Workspace, request: &UndoRequest) -> Result<Vec<String>> {
    let mut names = request.datasets.clone();
    if let Unit::LatestRun(d) = &request.unit
        && names.is_empty()
    {
        names.push(d.clone());
    }
    for name in &names {
        if !ws.spec.datasets.contains_key(name) {
            crate::refuse!(NotFound, "no dataset named {name:?} in {}", ws.spec.file);
        }
    }
    if names.is_empty() {
        names = ws
            .spec
            .datasets
            .iter()
            .filter(|(_, d)| matches!(d.kind, DatasetKind::Managed { .. }))
            .map(|(n, _)| n.clone())
            .collect();
    }
    Ok(names)
}

/// The unit's run (if any) and the ids of its publish releases.
fn resolve(
    store: &dyn Store,
    unit: &Unit,
    releases: &BTreeMap<String, Vec<ReleaseRecord>>,
) -> Result<(Option<String>, BTreeSet<String>)> {
    let all = || releases.values().flatten();
    let of_run = |run: &str| -> BTreeSet<String> {
        all()
            .filter(|r| r.kind == ReleaseKind::Publish && r.run_id.as_deref() == Some(run))
            .map(|r| r.id.clone())
            .collect()
    };
    match unit {
        Unit::Release(id) => {
            let Some(release) = store.release(id)? else { crate::refuse!(NotFound, "no release {id:?}") };
            if release.kind != ReleaseKind::Publish {
                crate::refuse!(
                    Conflict,
                    "release {id} is itself a rollback; restore a version with `tidegate rollback DATASET --to-version N`"
                );
            }
            Ok((release.run_id, BTreeSet::from([id.clone()])))
        }
        Unit::Run(id) => {
            crate::run::find(store, id)?;
            Ok((Some(id.clone()), of_run(id)))
        }
        Unit::LatestRun(dataset) => {
            let undone: BTreeSet<&str> = all()
                .filter(|r| r.kind == ReleaseKind::Rollback)
                .flat_map(|r| r.restores_release_id.iter().map(String::as_str))
                .collect();
            let undone_runs: BTreeSet<&str> =
                all().filter(|r| r.kind == ReleaseKind::Rollback).filter_map(|r| r.run_id.as_deref()).collect();
            let newest = releases[dataset]
                .iter()
                .filter(|r| r.kind == ReleaseKind::Publish && !undone.contains(r.id.as_str()))
                .find(|r| r.run_id.as_deref().is_none_or(|run| !undone_runs.contains(run)))
                .with_context(|| format!("{dataset} has no published release left to roll back"))?;
            match &newest.run_id {
                Some(run) => Ok((Some(run.clone()), of_run(run))),
                None => Ok((None, BTreeSet::from([newest.id.clone()]))),
            }
        }
    }
}

/// What undoing `unit` restores in `dataset`, or `None` when the unit did not publish it. Refused
/// when another release changed one of its partitions after the unit's first commit.
fn dataset_undo(
    ws: &Workspace,
    dataset: &str,
    releases: &[ReleaseRecord],
    unit: &BTreeSet<String>,
    current: Option<u64>,
) -> Result<Option<DatasetUndo>> {
    let items: Vec<&ReleaseItem> = releases
        .iter()
        .filter(|r| unit.contains(&r.id))
        .flat_map(|r| &r.items)
        .filter(|i| i.dataset == dataset)
        .collect();
    let Some(first) = items.iter().map(|i| i.delta_version).min() else { return Ok(None) };
    let Ok(to_version) = u64::try_from(first - 1) else {
        crate::refuse!(
            Conflict,
            "the unit created {dataset} (its first table version); there is no earlier version to restore. Vacuum \
             cannot remove a table: to empty it, publish empty partitions with a governed backfill"
        );
    };
    let partitions: BTreeSet<String> = items.iter().map(|i| i.partition.clone()).collect();
    let last = items.iter().map(|i| i.delta_version).max().unwrap_or(first);
    refuse_if_changed_after(releases, dataset, &partitions, first - 1, last, unit)?;
    let own: BTreeSet<i64> = items.iter().map(|i| i.delta_version).collect();
    let only_the_units_since =
        current.is_some_and(|c| (to_version + 1..=c).all(|v| i64::try_from(v).is_ok_and(|v| own.contains(&v))));
    let snapshot = matches!(
        ws.spec.datasets.get(dataset).map(|d| &d.kind),
        Some(DatasetKind::Managed { write: WriteMode::Snapshot })
    );
    Ok(Some(DatasetUndo {
        dataset: dataset.to_owned(),
        partitions: partitions.into_iter().collect(),
        to_version,
        undoes_version: u64::try_from(last).context("a release records a negative table version")?,
        whole_table: only_the_units_since || snapshot,
        new_version: None,
    }))
}

/// Refuses an undo of `unit` in `dataset` when a release not in it changed one of `partitions`
/// after `before` (the version the undo restores) and was not itself undone since `last` (the
/// unit's last commit): undoing the unit would drop that release's rows. The lake checks the same
/// again on the version the restore commits on ([`tidegate_lake::Lake::rollback`]'s `undoing`).
pub(crate) fn refuse_if_changed_after(
    releases: &[ReleaseRecord],
    dataset: &str,
    partitions: &BTreeSet<String>,
    before: i64,
    last: i64,
    unit: &BTreeSet<String>,
) -> Result<()> {
    let cancelled = undone_after(releases, dataset, last);
    let later: Vec<&ReleaseRecord> = releases
        .iter()
        .filter(|r| !unit.contains(&r.id) && !cancelled.contains(r.id.as_str()))
        .filter(|r| {
            r.items.iter().any(|i| {
                i.dataset == dataset
                    && i.delta_version > before
                    && (i.partition == WHOLE_TABLE || partitions.contains(&i.partition))
            })
        })
        .collect();
    if let Some(r) = later.first() {
        crate::refuse!(
            Conflict,
            "{dataset} was changed after the unit by release {} ({}{}), in a partition the unit published; undoing the \
             unit would undo that too. Roll that back first, or restore versions explicitly with `tidegate rollback \
             {dataset} --to-version N`",
            r.id,
            r.run_id.as_deref().map_or_else(|| "no run".to_owned(), |run| format!("run {run}")),
            if later.len() > 1 { format!(", and {} more", later.len() - 1) } else { String::new() }
        );
    }
    Ok(())
}

/// Releases after version `after` of `dataset` that cancel out: a rollback release and every
/// release it undid, when all of those were committed after `after` and it restored a version at
/// or after `after` (so readers see again what they saw at `after`).
fn undone_after<'r>(releases: &'r [ReleaseRecord], dataset: &str, after: i64) -> BTreeSet<&'r str> {
    let first_in = |r: &ReleaseRecord| r.items.iter().filter(|i| i.dataset == dataset).map(|i| i.delta_version).min();
    let mut out = BTreeSet::new();
    for rollback in releases.iter().filter(|r| r.kind == ReleaseKind::Rollback) {
        let undid: Vec<&ReleaseRecord> = releases
            .iter()
            .filter(|p| p.kind == ReleaseKind::Publish)
            .filter(|p| match (&rollback.run_id, &rollback.restores_release_id) {
                (Some(run), _) => p.run_id.as_ref() == Some(run),
                (None, Some(id)) => &p.id == id,
                (None, None) => false,
            })
            .collect();
        let restored_at_or_after = undid.iter().filter_map(|p| first_in(p)).min().is_some_and(|v| v > after);
        if !undid.is_empty() && restored_at_or_after {
            out.insert(rollback.id.as_str());
            out.extend(undid.iter().map(|p| p.id.as_str()));
        }
    }
    out
}

/// Orders datasets downstream first: a dataset is restored before the ones its task reads.
fn sort_downstream_first(ws: &Workspace, datasets: &mut [DatasetUndo]) {
    let depth = |name: &str| -> usize {
        let mut depth = 0;
        let mut frontier = vec![name.to_owned()];
        while !frontier.is_empty() && depth <= ws.spec.datasets.len() {
            let next: Vec<String> = ws
                .spec
                .tasks
                .values()
                .filter(|t| t.outputs.iter().any(|o| frontier.contains(o)))
                .flat_map(|t| t.inputs.iter().map(|i| i.dataset.clone()))
                .collect();
            frontier = next;
            depth += 1;
        }
        depth
    };
    datasets.sort_by_key(|d| std::cmp::Reverse(depth(&d.dataset)));
}

/// Restores each planned dataset; fills in the new versions.
fn restore(
    ws: &Workspace,
    store: &Arc<dyn Store>,
    actor: &Actor,
    plan: &mut Undone,
    lock_wait: Duration,
) -> Result<()> {
    let targets: Vec<Target<'_>> = plan
        .datasets
        .iter()
        .map(|d| Target {
            dataset: &d.dataset,
            to_version: d.to_version,
            partitions: (!d.whole_table).then_some(d.partitions.as_slice()),
            undoing: d.undoes_version,
        })
        .collect();
    let undoing = Undoing { release_id: &plan.release_id, run_id: plan.run_id.as_deref(), backfill_id: None };
    let new_versions = restore_all(ws, store, actor, &undoing, &targets, lock_wait)?;
    for (d, v) in plan.datasets.iter_mut().zip(new_versions) {
        d.new_version = Some(v);
    }
    Ok(())
}

/// Records the undo as one rollback release.
fn record(ws: &Workspace, store: &dyn Store, actor: &Actor, plan: &Undone, reason: &str) -> Result<()> {
    let items = plan
        .datasets
        .iter()
        .flat_map(|d| {
            let version = d.new_version.and_then(|v| i64::try_from(v).ok()).unwrap_or(i64::MAX);
            let restored = i64::try_from(d.to_version).ok();
            let whole = [WHOLE_TABLE.to_owned()];
            let parts: &[String] = if d.whole_table { &whole } else { &d.partitions };
            parts
                .iter()
                .map(move |p| ReleaseItem {
                    dataset: d.dataset.clone(),
                    partition: p.clone(),
                    version_id: None,
                    delta_version: version,
                    restored_delta_version: restored,
                    unchanged: false,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let rr = ReleaseRecord {
        id: plan.release_id.clone(),
        kind: ReleaseKind::Rollback,
        run_id: plan.run_id.clone(),
        backfill_id: None,
        restores_release_id: plan.releases.first().cloned(),
        created_by: actor.name.clone(),
        created_at: ws.now(),
        items,
    };
    let what = plan.run_id.as_ref().map_or_else(|| plan.releases.join(", "), |r| format!("run {r}"));
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: plan.release_id.clone(),
        reason: format!("{reason} (undoing {what})"),
        at: ws.now(),
    };
    store.record_release(&rr, &[], &meta)?;
    Ok(())
}

impl UndoRequest {
    /// The request with its run or release named by its whole id (a person may give a prefix).
    fn with_whole_ids(&self, store: &dyn Store) -> Result<UndoRequest> {
        let unit = match &self.unit {
            Unit::Run(id) => Unit::Run(crate::ids::run(store, id)?),
            Unit::Release(id) => Unit::Release(crate::ids::release(store, id)?),
            Unit::LatestRun(dataset) => Unit::LatestRun(dataset.clone()),
        };
        Ok(UndoRequest { unit, ..self.clone() })
    }
}

/// The unit in words.
fn describe(unit: &Unit) -> String {
    match unit {
        Unit::Run(r) => format!("run {r}"),
        Unit::Release(r) => format!("release {r}"),
        Unit::LatestRun(d) => format!("the newest run of {d}"),
    }
}
