//! Staleness (invariant 14): a visible partition is stale when an input partition it read has
//! changed since (republished, rebuilt by a backfill, rolled back), or its task's code changed.
//! Computed when asked, from what the store recorded ([`Store::visible_builds`]): nothing is
//! written on the publishing path, so tracking it costs a run nothing. Report only: rebuilding is
//! `tidegate run TARGET --stale` or a backfill with `--reprocess stale`, under the review rule of
//! history rewrites.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::Result;
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_core::spec::{DatasetKind, Spec, WriteMode};
use tidegate_store::{Store, VisiblePartition};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// A partition whose content was built from inputs (or code) that have changed since.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StalePartition {
    /// The dataset.
    pub dataset: String,
    /// The partition.
    pub partition: String,
    /// The task that builds it.
    pub task: String,
    /// The step whose output is visible.
    pub built_by_step: String,
    /// Why it is stale, one line each.
    pub reasons: Vec<Reason>,
}

/// One reason a partition is stale.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// An input partition it read changed after the version it read.
    Input {
        /// The input dataset.
        dataset: String,
        /// Its partition that changed (`None`: the input is read whole, `latest`).
        partition: Option<String>,
        /// The table version read (`None`: the input had no table then).
        read_version: Option<i64>,
        /// The table version at which the input's content changed since.
        changed_at_version: i64,
    },
    /// The task's code changed since the partition was built (its command or SQL, or a declared
    /// file). Rebuilding it replaces history with other code: a governed backfill.
    Code {
        /// The code version that built it.
        built_with: String,
        /// The task's code version now.
        now: String,
    },
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Input { dataset, partition, read_version, changed_at_version } => {
                let what = partition.as_ref().map_or_else(|| dataset.clone(), |p| format!("{dataset}:{p}"));
                let read =
                    read_version.map_or_else(|| "before it had a table".to_owned(), |v| format!("at version {v}"));
                write!(f, "{what} read {read}, changed at version {changed_at_version}")
            }
            Reason::Code { built_with, now } => write!(
                f,
                "built by code version {}, the task's code is now {}",
                tidegate_engine::code::short(built_with),
                tidegate_engine::code::short(now)
            ),
        }
    }
}

/// Every stale partition of the datasets the workspace writes (`dataset`: only that one), in
/// dataset and partition order.
pub fn stale(ws: &Workspace, store: &dyn Store, actor: &Actor, dataset: Option<&str>) -> Result<Vec<StalePartition>> {
    require(actor, Access::Read)?;
    stale_in(ws, store, dataset)
}

/// [`stale`] without the role check, for operations that already made it.
pub(crate) fn stale_in(ws: &Workspace, store: &dyn Store, only: Option<&str>) -> Result<Vec<StalePartition>> {
    Ok(judge(ws, store, only)?.stale)
}

/// What [`judge`] found: the stale partitions, and the partitions visible now of every dataset it
/// read (the ones it judged and their inputs), so a caller that also needs what is published
/// does not replay the same release items again.
pub(crate) struct Judged {
    /// The stale partitions.
    pub(crate) stale: Vec<StalePartition>,
    /// The visible partitions of each dataset read, in partition order
    /// ([`VisiblePartition::find`] looks one up).
    pub(crate) visible: BTreeMap<String, Arc<Vec<VisiblePartition>>>,
}

/// The stale partitions of every dataset Tidegate writes (or only `only`), and what is visible.
/// Reads each dataset's visible builds once, as the store shares them (nothing is copied): the
/// judgement is a pass over the visible partitions with a binary search per input partition.
pub(crate) fn judge(ws: &Workspace, store: &dyn Store, only: Option<&str>) -> Result<Judged> {
    let spec: &Spec = &ws.spec;
    // Every task's code now; a task whose declared file cannot be read is not judged on code.
    let code_now: BTreeMap<String, String> = spec
        .tasks
        .keys()
        .filter_map(|t| Some((t.clone(), tidegate_engine::code::version_of(spec, &ws.root, t)?.ok()?)))
        .collect();
    let mut visible: BTreeMap<String, Arc<Vec<VisiblePartition>>> = BTreeMap::new();
    let mut load = |name: &str| -> Result<Arc<Vec<VisiblePartition>>> {
        if let Some(parts) = visible.get(name) {
            return Ok(Arc::clone(parts));
        }
        let parts = store.visible_builds(name)?;
        visible.insert(name.to_owned(), Arc::clone(&parts));
        Ok(parts)
    };
    let mut out = Vec::new();
    for (name, ds) in &spec.datasets {
        if !matches!(ds.kind, DatasetKind::Managed { .. }) || only.is_some_and(|o| o != name) {
            continue;
        }
        let parts = load(name)?;
        // A snapshot dataset's newest partition (the last, in partition order) is the dataset;
        // an older one is history that a rebuild would only supersede.
        let partitions: &[VisiblePartition] = match ds.kind {
            DatasetKind::Managed { write: WriteMode::Snapshot } => &parts[parts.len().saturating_sub(1)..],
            _ => &parts,
        };
        // The managed inputs' visible partitions, once per dataset judged.
        let mut inputs_now: BTreeMap<&str, Arc<Vec<VisiblePartition>>> = BTreeMap::new();
        for part in partitions {
            let Some(build) = &part.build else { continue };
            let mut reasons = Vec::new();
            if let (Some(built_with), Some(now)) = (&build.code_version, code_now.get(&build.task))
                && built_with != now
            {
                reasons.push(Reason::Code { built_with: built_with.clone(), now: now.clone() });
            }
            for input in &build.inputs {
                let Some(input_ds) = spec.datasets.get(&input.dataset) else { continue };
                // A source outside the workspace has no releases to compare with.
                if !matches!(input_ds.kind, DatasetKind::Managed { .. }) {
                    continue;
                }
                let now = match inputs_now.get(input.dataset.as_str()) {
                    Some(now) => now,
                    None => inputs_now.entry(input.dataset.as_str()).or_insert(load(&input.dataset)?),
                };
                let fresh = |p: &VisiblePartition| {
                    // Read staged inside the same backfill: fresh while that output is visible.
                    if p.build.as_ref().is_some_and(|b| input.staged_steps.contains(&b.step_id)) {
                        return true;
                    }
                    // The content read (at the pinned version) is the content visible now: a
                    // rollback that brought back what was read is no change.
                    p.content_at(input.version) == Some(p.origin_version)
                };
                if input.partitions.is_empty() {
                    if let Some(p) = now.iter().filter(|p| !fresh(p)).max_by_key(|p| p.since_version) {
                        reasons.push(Reason::Input {
                            dataset: input.dataset.clone(),
                            partition: None,
                            read_version: input.version,
                            changed_at_version: p.since_version,
                        });
                    }
                    continue;
                }
                for key in &input.partitions {
                    if let Some(p) = VisiblePartition::find(now, key).filter(|p| !fresh(p)) {
                        reasons.push(Reason::Input {
                            dataset: input.dataset.clone(),
                            partition: Some(key.clone()),
                            read_version: input.version,
                            changed_at_version: p.since_version,
                        });
                    }
                }
            }
            if !reasons.is_empty() {
                out.push(StalePartition {
                    dataset: name.clone(),
                    partition: part.partition.clone(),
                    task: build.task.clone(),
                    built_by_step: build.step_id.clone(),
                    reasons,
                });
            }
        }
    }
    Ok(Judged { stale: out, visible })
}

/// The stale partitions of `task`'s datasets, as the keys a run selects.
pub fn stale_keys(ws: &Workspace, store: &dyn Store, task: &str) -> Result<Vec<String>> {
    let Some(t) = ws.spec.tasks.get(task) else { return Ok(Vec::new()) };
    let mut keys = BTreeSet::new();
    for d in &t.outputs {
        keys.extend(stale_in(ws, store, Some(d))?.into_iter().map(|s| s.partition));
    }
    Ok(keys.into_iter().collect())
}
