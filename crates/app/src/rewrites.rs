//! History is rewritten only under review (decision 0020): a run whose steps would replace
//! partitions that another code version published is refused when it is submitted, naming the
//! partitions and the governed backfill that replaces them, unless the dataset declares
//! `rewrites = "free"`. The engine checks again at publication, the last moment.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use serde::Serialize;
use tidegate_core::spec::{Rewrites, Spec};
use tidegate_engine::code::short;
use tidegate_store::{NewStep, Store};

/// One partition a step would replace while another code version's output is published there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rewrite {
    /// The task the step runs.
    pub task: String,
    /// The dataset written.
    pub dataset: String,
    /// The partition.
    pub partition: String,
    /// The code version whose output is published there now.
    pub published: String,
    /// The code version the step was planned with.
    pub planned: String,
}

/// The partitions `steps` would rewrite in datasets whose policy is `rewrites = "review"` (the
/// default). A partition never published, published by the same code, or whose code version is
/// unknown (restored by a rollback, or published before code versions were recorded) is not one.
pub fn under_review(spec: &Spec, store: &dyn Store, steps: &[NewStep]) -> Result<Vec<Rewrite>> {
    let mut wanted: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for step in steps.iter().filter(|s| s.code_version.is_some()) {
        for d in reviewed_outputs(spec, &step.task) {
            wanted.entry(d).or_default().insert(step.partition.clone());
        }
    }
    let mut published = BTreeMap::new();
    for (dataset, partitions) in wanted {
        let partitions: Vec<String> = partitions.into_iter().collect();
        published.insert(dataset, store.published_code_versions(dataset, &partitions)?);
    }
    let mut out = Vec::new();
    for step in steps {
        let Some(planned) = &step.code_version else { continue };
        for d in reviewed_outputs(spec, &step.task) {
            let Some(Some(before)) = published.get(d).and_then(|p| p.get(&step.partition)) else { continue };
            if before != planned {
                out.push(Rewrite {
                    task: step.task.clone(),
                    dataset: d.to_owned(),
                    partition: step.partition.clone(),
                    published: before.clone(),
                    planned: planned.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// The outputs of `task` whose rewrites need review.
fn reviewed_outputs<'s>(spec: &'s Spec, task: &str) -> impl Iterator<Item = &'s str> {
    let outputs = spec.tasks.get(task).map(|t| t.outputs.as_slice()).unwrap_or_default();
    outputs
        .iter()
        .filter(|d| spec.datasets.get(d.as_str()).is_none_or(|d| d.rewrites == Rewrites::Review))
        .map(String::as_str)
}

/// One task's rewrites, for the message: its datasets, the code versions published, the partitions.
type TaskRewrites<'a> = (BTreeSet<&'a str>, BTreeSet<&'a str>, BTreeSet<String>);

/// Refuses a run that would rewrite `rewrites` (none: nothing to refuse), naming each task's
/// partitions, the code versions, and the backfill command that replaces them under review.
pub fn refuse(rewrites: &[Rewrite]) -> Result<()> {
    let Some(first) = rewrites.first() else { return Ok(()) };
    let mut by_task: BTreeMap<&str, TaskRewrites<'_>> = BTreeMap::new();
    for r in rewrites {
        let (datasets, published, partitions) = by_task.entry(&r.task).or_default();
        datasets.insert(&r.dataset);
        published.insert(short(&r.published));
        partitions.insert(r.partition.clone());
    }
    let mut lines = Vec::new();
    let mut commands = Vec::new();
    for (task, (datasets, published, partitions)) in &by_task {
        let partitions: Vec<String> = partitions.iter().cloned().collect();
        let planned = rewrites.iter().find(|r| r.task == *task).map_or("", |r| short(&r.planned));
        lines.push(format!(
            "  {} of {} (task {task}): published by code version {}, this run's is {planned}",
            crate::view::partition_list(&partitions),
            datasets.iter().copied().collect::<Vec<_>>().join(", "),
            published.iter().copied().collect::<Vec<_>>().join(", "),
        ));
        let (from, to) = (partitions.first().map_or("", String::as_str), partitions.last().map_or("", String::as_str));
        commands
            .push(format!("  tidegate backfill plan {task} --from {from} --to {to} --reprocess all --reason \"...\""));
    }
    crate::refuse!(
        Conflict,
        "refused: this run would replace published history with the output of other code, without review:\n{}\n\
         Replace it through a governed backfill (plan, compare, approve, publish):\n{}\n\
         or run only partitions not published yet. A dataset whose history needs no review (scratch data) can \
         declare rewrites = \"free\" in [datasets.{}].",
        lines.join("\n"),
        commands.join("\n"),
        first.dataset
    )
}
