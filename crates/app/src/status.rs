//! What the workspace is doing and owes: recent runs, queues per priority class, missed
//! schedule intervals, freshness and the scheduler's last gauge.

use std::collections::BTreeMap;

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::plan;
use tidegate_core::state::StepStatus;
use tidegate_store::{RunRecord, Store};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// A run and its steps counted by status.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunStatusLine {
    /// The run.
    #[serde(flatten)]
    pub run: RunRecord,
    /// Steps per status.
    pub steps: BTreeMap<String, u32>,
}

impl RunStatusLine {
    /// `run` with its steps counted by status (counted by the store, no step read).
    pub fn of(store: &dyn Store, run: RunRecord) -> Result<RunStatusLine> {
        let steps = store.run_step_counts(&run.id)?;
        Ok(RunStatusLine { run, steps })
    }
}

/// The workspace's recent runs and what it owes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Status {
    /// The project's name.
    pub project: String,
    /// Where the state store is, its secrets hidden (`tidegate_store::Location`).
    pub state: String,
    /// The newest runs, newest first.
    pub runs: Vec<RunStatusLine>,
    /// Queues, missed intervals, freshness and the scheduler's gauge.
    pub debt: Debt,
}

/// What is owed: queued work per priority class, missed schedule intervals, and how stale each
/// scheduled dataset is.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Debt {
    /// Per priority class (live, catchup, backfill): steps ready and running, and how long the
    /// oldest ready step has waited.
    pub queues: BTreeMap<String, Queue>,
    /// Per scheduled task: intervals that ended and were not run (catch-up off leaves them here).
    pub missed: Vec<Missed>,
    /// Per scheduled task's dataset: the newest published partition (as the store recorded it)
    /// and how far behind now its end is.
    pub freshness: Vec<Freshness>,
    /// The scheduler's last gauge (pools with their retry budget left, backlog, throughput,
    /// backlog ETA, live workers), with its age; absent before any scheduler ran.
    pub scheduler: Option<serde_json::Value>,
    /// Per task with steps in `waiting_for_source`: how many, for how long, and which sources.
    #[serde(default)]
    pub waiting_for_source: Vec<SourceWait>,
    /// Per dataset with stale partitions (built on inputs that changed since): how many
    /// (`tidegate stale` lists them and why).
    #[serde(default)]
    pub stale: Vec<StaleCount>,
    /// The pauses in force (`tidegate pause`), each with what it holds back now.
    #[serde(default)]
    pub paused: Vec<crate::pause::PauseLine>,
}

/// A dataset's stale partitions, counted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StaleCount {
    /// The dataset.
    pub dataset: String,
    /// Its stale partitions.
    pub partitions: u64,
    /// The oldest of them.
    pub first: String,
}

/// A task's steps waiting for their external sources to arrive.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SourceWait {
    /// The task.
    pub task: String,
    /// Its steps waiting.
    pub steps: u64,
    /// The oldest partition waiting.
    pub oldest_partition: String,
    /// How long the longest-waiting one has waited, in seconds.
    pub longest_s: f64,
    /// The external datasets the task reads that declare a readiness check.
    pub sources: Vec<String>,
}

/// A gauge older than this is from a drain that has ended (an idle scheduler does not write it).
const GAUGE_STALE_S: f64 = 10.0;

/// A scheduled task's missed intervals: gaps between published partitions, then the due
/// intervals a tick would leave as debt, counted exactly and listed up to a bound.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Missed {
    /// The task.
    pub task: String,
    /// How many intervals were missed.
    pub n_missed: u64,
    /// The newest of them ([`crate::schedule::LISTED_MAX`] at most), oldest first.
    pub debt: Vec<String>,
    /// The oldest missed interval.
    pub oldest: Option<String>,
    /// The interval the next tick would run.
    pub next: Option<String>,
}

/// One priority class's queue.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Queue {
    /// Steps ready to start.
    pub ready: usize,
    /// Steps holding a lease.
    pub running: usize,
    /// How long the oldest ready step has waited.
    pub oldest_ready_age_s: Option<f64>,
}

/// How stale a scheduled task's dataset is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Freshness {
    /// The task.
    pub task: String,
    /// Its dataset's newest published partition.
    pub newest_published: Option<String>,
    /// How far behind `now` that partition's end is, in seconds.
    pub lag_s: Option<f64>,
}

/// The newest `limit` runs with their steps counted by status, and the debt at `now`.
pub fn status(ws: &Workspace, store: &dyn Store, actor: &Actor, limit: u32, now: DateTime<Utc>) -> Result<Status> {
    require(actor, Access::Read)?;
    let mut runs = Vec::new();
    for run in store.runs(limit)? {
        runs.push(RunStatusLine::of(store, run)?);
    }
    let debt = debt(ws, store, actor, now)?;
    Ok(Status { project: ws.spec.project.name.clone(), state: ws.state.to_string(), runs, debt })
}

/// Queues per priority class, missed intervals, freshness and the scheduler's last gauge at `now`.
pub fn debt(ws: &Workspace, store: &dyn Store, actor: &Actor, now: DateTime<Utc>) -> Result<Debt> {
    require(actor, Access::Read)?;
    let mut queues: BTreeMap<String, Queue> = BTreeMap::new();
    let mut waits: BTreeMap<String, SourceWait> = BTreeMap::new();
    let active = store.active_steps()?;
    for a in &active {
        if a.step.status() == StepStatus::WaitingForSource {
            #[allow(clippy::cast_precision_loss, reason = "a duration far below 2^52 ms, exact as f64")]
            let waited = (now - a.step.updated_at).num_milliseconds().max(0) as f64 / 1000.0;
            let w = waits.entry(a.step.task.clone()).or_insert_with(|| SourceWait {
                task: a.step.task.clone(),
                steps: 0,
                oldest_partition: a.step.partition.clone(),
                longest_s: 0.0,
                sources: sources_of(ws, &a.step.task),
            });
            w.steps += 1;
            if waited >= w.longest_s {
                w.longest_s = waited;
                w.oldest_partition = a.step.partition.clone();
            }
        }
        let q = queues.entry(format!("{:?}", a.priority).to_lowercase()).or_default();
        match a.step.status() {
            StepStatus::Ready => {
                q.ready += 1;
                #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
                let age = (now - a.step.updated_at).num_milliseconds().max(0) as f64 / 1000.0;
                q.oldest_ready_age_s = Some(q.oldest_ready_age_s.map_or(age, |o| o.max(age)));
            }
            s if s.holds_lease() => q.running += 1,
            _ => {}
        }
    }
    let decisions = crate::schedule::decide(&ws.spec, store, now)?;
    let paused = crate::pause::lines(store.pauses()?, &active, &decisions);
    let freshness = decisions
        .iter()
        .map(|d| {
            let task = &ws.spec.tasks[&d.task];
            let axis = task.outputs.first().and_then(|o| plan::axis_of(&ws.spec.datasets[o]));
            let end = d
                .newest_published
                .as_ref()
                .and_then(|k| axis.as_ref().and_then(|a| a.parse_key(k).ok().map(|t| a.shift(t, 1))));
            #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
            let lag_s = end.map(|e| (now - e).num_milliseconds().max(0) as f64 / 1000.0);
            Freshness { task: d.task.clone(), newest_published: d.newest_published.clone(), lag_s }
        })
        .collect();
    let missed = decisions
        .into_iter()
        .map(|d| {
            let mut debt: Vec<String> = d.gaps.into_iter().chain(d.debt).collect();
            let n_older = debt.len().saturating_sub(crate::schedule::LISTED_MAX);
            let debt = debt.split_off(n_older);
            Missed {
                task: d.task,
                n_missed: d.n_gaps + d.n_debt,
                debt,
                oldest: d.oldest_missed,
                next: d.run.first().cloned(),
            }
        })
        .filter(|m| m.n_missed > 0)
        .collect();
    let scheduler =
        store.metrics()?.into_iter().find(|(name, _, _)| name == tidegate_engine::executor::SCHEDULER_GAUGE).map(
            |(_, mut value, at)| {
                #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
                let age_s = (now - at).num_milliseconds().max(0) as f64 / 1000.0;
                if let Some(object) = value.as_object_mut() {
                    object.insert("updated_at".to_owned(), serde_json::json!(at));
                    object.insert("age_s".to_owned(), serde_json::json!(age_s));
                    object.insert("stale".to_owned(), serde_json::json!(age_s > GAUGE_STALE_S));
                }
                value
            },
        );
    let mut stale: BTreeMap<String, StaleCount> = BTreeMap::new();
    for s in crate::stale::stale_in(ws, store, None)? {
        let c = stale.entry(s.dataset.clone()).or_insert_with(|| StaleCount {
            dataset: s.dataset.clone(),
            partitions: 0,
            first: s.partition.clone(),
        });
        c.partitions += 1;
    }
    Ok(Debt {
        queues,
        missed,
        freshness,
        scheduler,
        waiting_for_source: waits.into_values().collect(),
        stale: stale.into_values().collect(),
        paused,
    })
}

/// The external datasets `task` reads whose arrival is looked at.
fn sources_of(ws: &Workspace, task: &str) -> Vec<String> {
    let Some(task) = ws.spec.tasks.get(task) else { return Vec::new() };
    task.inputs
        .iter()
        .filter(|i| {
            ws.spec.datasets.get(&i.dataset).is_some_and(|d| {
                matches!(&d.kind, tidegate_core::spec::DatasetKind::External { ready, .. }
                    if ready.check != tidegate_core::spec::ReadyCheck::None)
            })
        })
        .map(|i| i.dataset.clone())
        .collect()
}
