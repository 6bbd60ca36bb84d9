//! The scheduler's decisions: for every scheduled task, an interval of its dataset is due at the
//! first time the task's schedule fires at or after the interval's end, in the dataset's zone
//! (`core::schedule`); the intervals due since the newest published partition are owed. Those due
//! at the latest fire time are live work; older ones were missed, and catch-up (off by default)
//! decides whether they are left as debt or run, newest first, at most `max_active_runs` at once
//! (the engine enforces the bound when it claims steps). `tidegate tick` makes one pass;
//! `tidegate serve` makes one per period.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_core::partition::Partition;
use tidegate_core::plan::{self, Plan, Request, Selection};
use tidegate_core::schedule::{DueInterval, FireTimes, catch_up, due_by};
use tidegate_core::spec::{Spec, Task};
use tidegate_lake::Lake;
use tidegate_store::{Decision, JournalMeta, Priority, RunRequest, Store, Trigger};

use crate::actor::{Access, require};
use crate::submit;
use crate::workspace::Workspace;

/// How far back a tick looks for a task's newest published partition.
const LOOKBACK: i32 = 400;

/// One scheduled task's decision.
#[derive(Debug, Clone, Serialize)]
pub struct TaskDecision {
    /// The task.
    pub task: String,
    /// Whether its catch-up is on.
    pub catchup: bool,
    /// The newest published partition of its dataset before the tick.
    pub newest_published: Option<String>,
    /// The intervals owed: due by the tick (the schedule fired after they ended) and after its
    /// newest published partition, oldest first.
    pub due: Vec<String>,
    /// The ones this tick runs, newest first: the live ones, then the missed ones catch-up runs.
    pub run: Vec<String>,
    /// The live ones among them: due at the schedule's latest fire time (run as a schedule run).
    pub live: Vec<String>,
    /// The ones left as debt.
    pub debt: Vec<String>,
    /// Older missed intervals: unpublished, between published ones (debt left by earlier ticks).
    pub gaps: Vec<String>,
}

/// A due interval not run because an unfinished run of another trigger already covers it (a
/// wider manual run or backfill over the downtime): journaled as `interval_superseded`.
#[derive(Debug, Clone, Serialize)]
pub struct Superseded {
    /// The task.
    pub task: String,
    /// The interval's partition.
    pub partition: String,
    /// The run that covers it.
    pub by_run: String,
}

/// What a tick started.
#[derive(Debug, Default)]
pub struct Started {
    /// The runs submitted.
    pub runs: Vec<String>,
    /// Intervals not run because a run already covers them.
    pub superseded: Vec<Superseded>,
}

/// Decides every scheduled task's due intervals at `now`.
pub async fn decide(spec: &Spec, lake: &Lake, now: DateTime<Utc>) -> Result<Vec<TaskDecision>> {
    let mut out = Vec::new();
    for task in spec.tasks.values().filter(|t| t.schedule.is_some()) {
        let Some(decision) = decide_task(spec, lake, task, now).await? else { continue };
        out.push(decision);
    }
    Ok(out)
}

async fn decide_task(spec: &Spec, lake: &Lake, task: &Task, now: DateTime<Utc>) -> Result<Option<TaskDecision>> {
    let Some(dataset) = task.outputs.first() else { return Ok(None) };
    let Some(axis) = plan::axis_of(&spec.datasets[dataset]) else { return Ok(None) };
    let Some(schedule) = &task.schedule else { return Ok(None) };
    let fires = FireTimes::new(schedule, axis.zone)?;
    let candidates = due_by(&axis, &fires, now, LOOKBACK)?;
    if candidates.is_empty() {
        return Ok(None);
    }
    let keys: Vec<String> = candidates.iter().map(|d| d.partition.key.clone()).collect();
    let sizes = lake.partition_sizes(dataset, &keys).await?;
    let published: BTreeSet<&str> = sizes.iter().filter(|s| s.n_files > 0).map(|s| s.partition.as_str()).collect();
    let is_published = |d: &DueInterval| published.contains(d.partition.key.as_str());
    let newest = candidates.iter().rposition(is_published);
    let due = match newest {
        Some(i) => candidates[i + 1..].to_vec(),
        // Never published: the schedule starts now, with what its latest fire time made due.
        None => {
            let latest = candidates.last().map(|d| d.due_at);
            candidates.iter().filter(|d| Some(d.due_at) == latest).cloned().collect()
        }
    };
    let oldest = candidates.iter().position(is_published);
    let gaps: Vec<String> = match (oldest, newest) {
        (Some(a), Some(b)) => {
            candidates[a..b].iter().filter(|d| !is_published(d)).map(|d| d.partition.key.clone()).collect()
        }
        _ => Vec::new(),
    };
    let decision = catch_up(&due, task.catchup);
    let keys = |ps: &[Partition]| ps.iter().map(|p| p.key.clone()).collect::<Vec<_>>();
    Ok(Some(TaskDecision {
        task: task.name.clone(),
        catchup: task.catchup.enabled,
        newest_published: newest.map(|i| candidates[i].partition.key.clone()),
        due: due.iter().map(|d| d.partition.key.clone()).collect(),
        run: decision.run().map(|p| p.key.clone()).collect(),
        live: keys(&decision.live),
        debt: keys(&decision.debt),
        gaps,
    }))
}

/// One pass of the scheduler at `now`: what each scheduled task is owed, and the runs started for
/// it (none when `dry_run`).
#[derive(Debug, Serialize)]
pub struct Tick {
    /// The instant the tick evaluated the schedules at.
    pub now: DateTime<Utc>,
    /// Each scheduled task's decision.
    pub decisions: Vec<TaskDecision>,
    /// The runs it submitted.
    pub runs: Vec<String>,
    /// Due intervals not run because an unfinished run covers them.
    pub superseded: Vec<Superseded>,
}

/// Evaluates the schedules at `now` and, unless `dry_run`, submits the runs that are due (see
/// [`start_due`]); executing them is the caller's next step.
pub fn tick(ws: &Workspace, store: &dyn Store, actor: &Actor, now: DateTime<Utc>, dry_run: bool) -> Result<Tick> {
    require(actor, Access::RunWork)?;
    let decisions = crate::workspace::runtime()?.block_on(async {
        let lake = crate::workspace::open_lake(ws).await?;
        decide(&ws.spec, &lake, now).await
    })?;
    let Started { runs, superseded } =
        if dry_run { Started::default() } else { start_due(ws, store, actor, &decisions, now)? };
    Ok(Tick { now, decisions, runs, superseded })
}

/// Submits the runs the decisions start: each task's live intervals (due at its latest fire
/// time) as a schedule run (live priority), the missed ones of tasks with catch-up on as a
/// catch-up run. An interval that an unfinished run already covers (a wider manual run or a
/// backfill submitted over the downtime) is not run again: it is journaled as superseded by that
/// run.
pub fn start_due(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    decisions: &[TaskDecision],
    now: DateTime<Utc>,
) -> Result<Started> {
    require(actor, Access::RunWork)?;
    let mut covered: BTreeMap<(String, String), String> = BTreeMap::new();
    for a in store.active_steps()? {
        covered.entry((a.step.task.clone(), a.step.partition.clone())).or_insert(a.step.run_id.clone());
    }
    let mut superseded = Vec::new();
    let decisions: Vec<TaskDecision> = decisions
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d.run.retain(|p| match covered.get(&(d.task.clone(), p.clone())) {
                Some(run) => {
                    superseded.push(Superseded { task: d.task.clone(), partition: p.clone(), by_run: run.clone() });
                    false
                }
                None => true,
            });
            d
        })
        .collect();
    for s in &superseded {
        let decision = Decision {
            kind: "interval_superseded".to_owned(),
            run_id: Some(s.by_run.clone()),
            task: Some(s.task.clone()),
            partition: Some(s.partition.clone()),
            payload: serde_json::json!({ "by_run": s.by_run, "tick": now }),
        };
        let meta = JournalMeta {
            via: Some(actor.via()),
            actor: actor.name.clone(),
            correlation_id: format!("tick-{}", now.timestamp()),
            reason: format!(
                "{}@{} is already covered by unfinished run {}; not run again",
                s.task, s.partition, s.by_run
            ),
            at: ws.now(),
        };
        store.record_decision(&decision, &meta)?;
    }
    let mut runs = Vec::new();
    for (trigger, priority) in [(Trigger::Schedule, Priority::Live), (Trigger::Catchup, Priority::Catchup)] {
        runs.extend(submit_due(ws, store, actor, &decisions, trigger, priority, now)?);
    }
    Ok(Started { runs, superseded })
}

/// Submits one run holding every (task, partition) the decisions start under `trigger`.
fn submit_due(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    decisions: &[TaskDecision],
    trigger: Trigger,
    priority: Priority,
    now: DateTime<Utc>,
) -> Result<Option<String>> {
    let wanted: BTreeMap<String, Vec<String>> = decisions
        .iter()
        .map(|d| {
            let keys = match trigger {
                Trigger::Schedule => d.run.iter().filter(|k| d.live.contains(k)).cloned().collect(),
                _ => d.run.iter().filter(|k| !d.live.contains(k)).cloned().collect(),
            };
            (d.task.clone(), keys)
        })
        .filter(|(_, keys): &(String, Vec<String>)| !keys.is_empty())
        .collect();
    if wanted.is_empty() {
        return Ok(None);
    }
    let plan = combined_plan(&ws.spec, &wanted)?;
    let steps = submit::new_steps(ws, &plan, &BTreeMap::new(), false)?;
    let Some(steps) = without_rewrites(ws, store, actor, steps, now)? else { return Ok(None) };
    let partitions: Vec<String> = steps.iter().map(|s| s.name.clone()).collect();
    let request = RunRequest {
        target: wanted.keys().cloned().collect::<Vec<_>>().join(","),
        partitions,
        scope: "upstream".to_owned(),
        trigger,
        priority,
        requester: "scheduler".to_owned(),
        spec_hash: ws.spec.hash.clone(),
        params: BTreeMap::new(),
        backfill_id: None,
        // One tick per instant: ticking twice at the same `now` creates nothing new.
        idempotency_key: Some(format!("tick:{}:{}", format!("{trigger:?}").to_lowercase(), now.to_rfc3339())),
    };
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: format!("tick-{}", now.timestamp()),
        reason: format!("{} tick at {now}", format!("{trigger:?}").to_lowercase()),
        at: ws.now(),
    };
    Ok(Some(store.submit_run(&request, &steps, &meta)?.run.id))
}

/// One plan for many (task, partitions): each planned with its upstream, then cut down to the
/// wanted pairs, keeping the links between them.
fn combined_plan(spec: &Spec, wanted: &BTreeMap<String, Vec<String>>) -> Result<Plan> {
    let wanted_names: BTreeSet<String> =
        wanted.iter().flat_map(|(t, keys)| keys.iter().map(move |k| format!("{t}@{k}"))).collect();
    let mut steps = BTreeMap::new();
    for (task, keys) in wanted {
        let request = Request {
            spec,
            target: task,
            selection: Selection::Keys(keys.clone()),
            include_upstream: true,
            include_downstream: false,
        };
        for step in plan::plan(&request)?.steps {
            if wanted_names.contains(&step.name) {
                steps.insert(step.name.clone(), step);
            }
        }
    }
    let mut steps: Vec<_> = steps.into_values().collect();
    for s in &mut steps {
        s.upstream.retain(|u| wanted_names.contains(u));
    }
    Ok(Plan { target: wanted.keys().cloned().collect::<Vec<_>>().join(","), steps })
}

/// The steps of a tick's run less those that would replace partitions another code version
/// published in a dataset under review (decision 0020): left out, journaled as
/// `rewrite_refused` with the backfill that replaces them, and no longer waited for by the rest.
/// `None` when nothing is left.
fn without_rewrites(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    mut steps: Vec<tidegate_store::NewStep>,
    now: DateTime<Utc>,
) -> Result<Option<Vec<tidegate_store::NewStep>>> {
    let rewrites = crate::rewrites::under_review(&ws.spec, store, &steps)?;
    if !rewrites.is_empty() {
        let refused: BTreeSet<String> = rewrites.iter().map(|r| format!("{}@{}", r.task, r.partition)).collect();
        let reason = crate::rewrites::refuse(&rewrites).err().map(|e| e.to_string()).unwrap_or_default();
        let decision = Decision {
            kind: "rewrite_refused".to_owned(),
            run_id: None,
            task: None,
            partition: None,
            payload: serde_json::json!({ "steps": refused, "rewrites": rewrites }),
        };
        let meta = JournalMeta {
            via: Some(actor.via()),
            actor: actor.name.clone(),
            correlation_id: format!("tick-{}", now.timestamp()),
            reason,
            at: ws.now(),
        };
        store.record_decision(&decision, &meta)?;
        steps.retain(|s| !refused.contains(&s.name));
        for s in &mut steps {
            s.upstream.retain(|u| !refused.contains(u));
        }
    }
    Ok(if steps.is_empty() { None } else { Some(steps) })
}
