//! The scheduler's decisions: for every scheduled task, an interval of its dataset is due at the
//! first time the task's schedule fires at or after the interval's end, in the dataset's zone
//! (`core::schedule`); the intervals due since the newest published partition (as the store
//! recorded it, decision 0018) are owed, counted by arithmetic on the schedule for an outage of
//! any length. Those due at the latest fire time are live work; older ones were missed, and
//! catch-up (off by default) decides whether they are left as debt or run, newest first, at most
//! `max_active_runs` at once (the engine enforces the bound when it claims steps). `tidegate
//! tick` makes one pass; `tidegate serve` makes one per period.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_core::partition::{Partition, TimeAxis};
use tidegate_core::plan::{self, Plan, Request, Selection};
use tidegate_core::schedule::{DueInterval, FireTimes, catch_up, owed};
use tidegate_core::spec::{Spec, Task};
use tidegate_store::{Decision, JournalMeta, Priority, RunRequest, Store, Trigger};

use crate::actor::{Access, require};
use crate::submit;
use crate::workspace::Workspace;

/// The most intervals a decision lists in each of `due`, `debt` and `gaps` (the newest ones,
/// beside their exact counts), and so the most missed intervals one tick runs with catch-up on:
/// older ones stay debt, counted and shown.
pub const LISTED_MAX: usize = 400;

/// One scheduled task's decision. Counts are exact for an outage of any length; the lists
/// beside them hold the newest [`LISTED_MAX`] at most, oldest first.
#[derive(Debug, Clone, Serialize)]
pub struct TaskDecision {
    /// The task.
    pub task: String,
    /// Whether its catch-up is on.
    pub catchup: bool,
    /// The newest published partition of its dataset before the tick (among those due), as the
    /// store recorded it: an empty publication counts.
    pub newest_published: Option<String>,
    /// How many intervals are owed: due by the tick (the schedule fired after they ended) and
    /// after its newest published partition.
    pub n_due: u64,
    /// The newest of them.
    pub due: Vec<String>,
    /// The ones this tick runs, newest first: the live ones, then the missed ones catch-up runs.
    pub run: Vec<String>,
    /// The live ones among them: due at the schedule's latest fire time (run as a schedule run).
    pub live: Vec<String>,
    /// How many owed intervals are left as debt.
    pub n_debt: u64,
    /// The newest of them.
    pub debt: Vec<String>,
    /// How many older missed intervals there are: unpublished, between published ones (debt left
    /// by earlier ticks).
    pub n_gaps: u64,
    /// The newest of them.
    pub gaps: Vec<String>,
    /// The oldest missed interval (a gap, else the oldest debt).
    pub oldest_missed: Option<String>,
    /// Why the tick plans nothing for it: its schedule is paused (`tidegate pause
    /// schedule:TASK`), with who paused it and why; its owed intervals stay debt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
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

/// A sensor task's (`schedule = "on_arrival"`) partitions at one tick.
#[derive(Debug, Clone, Serialize)]
pub struct Arrival {
    /// The task.
    pub task: String,
    /// Partitions not yet published whose sources arrived: started by this tick.
    pub started: Vec<String>,
    /// Partitions not yet published (and not running) whose sources have not arrived.
    pub waiting: Vec<String>,
}

/// What a tick started.
#[derive(Debug, Default)]
pub struct Started {
    /// The runs submitted.
    pub runs: Vec<String>,
    /// Intervals not run because a run already covers them.
    pub superseded: Vec<Superseded>,
    /// The sensor tasks' partitions, started or still waiting for their sources.
    pub arrivals: Vec<Arrival>,
    /// Per task, the stale partitions of its `stale = "rebuild"` datasets a run was submitted for.
    pub stale_rebuilds: BTreeMap<String, Vec<String>>,
}

/// Decides every scheduled task's due intervals at `now`, from what the store recorded as
/// published (decision 0018): one read of the published partitions per dataset, then arithmetic
/// on the schedule.
pub fn decide(spec: &Spec, store: &dyn Store, now: DateTime<Utc>) -> Result<Vec<TaskDecision>> {
    let mut published: BTreeMap<&str, BTreeSet<DateTime<Utc>>> = BTreeMap::new();
    let mut out = Vec::new();
    let paused = store.pauses()?;
    for task in spec.tasks.values().filter(|t| t.schedule.is_some()) {
        let Some(dataset) = task.outputs.first() else { continue };
        let Some(axis) = plan::axis_of(&spec.datasets[dataset]) else { continue };
        if !published.contains_key(dataset.as_str()) {
            // A key the axis cannot read (a whole-table rollback's `*`) names no interval.
            let starts = store.published_partitions(dataset)?.iter().filter_map(|k| axis.parse_key(k).ok()).collect();
            published.insert(dataset, starts);
        }
        let Some(mut decision) = decide_task(task, &axis, &published[dataset.as_str()], now)? else { continue };
        if let Some(p) = paused.iter().find(|p| p.what == format!("schedule:{}", task.name)) {
            // A paused schedule plans nothing: what it would run stays owed, as debt.
            decision.paused = Some(format!("schedule paused by {}: {}", p.actor, p.reason));
            decision.run.clear();
            decision.live.clear();
            decision.n_debt = decision.n_due;
            decision.debt.clone_from(&decision.due);
            if decision.oldest_missed.is_none() {
                decision.oldest_missed = decision.due.first().cloned();
            }
        }
        out.push(decision);
    }
    Ok(out)
}

fn decide_task(
    task: &Task,
    axis: &TimeAxis,
    published: &BTreeSet<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<Option<TaskDecision>> {
    let Some(schedule) = &task.schedule else { return Ok(None) };
    let fires = FireTimes::new(schedule, axis.zone)?;
    let Some(owed) = owed(axis, &fires, now, published) else { return Ok(None) };
    let listed: Vec<DueInterval> = owed.due_newest(axis, &fires, LISTED_MAX).into_iter().rev().collect();
    let decision = catch_up(&listed, task.catchup);
    let n_run = decision.live.len() + decision.catchup.len();
    let n_debt = owed.n_due.saturating_sub(n_run as u64);
    let keys = |ps: &[Partition]| ps.iter().map(|p| p.key.clone()).collect::<Vec<_>>();
    let debt = if decision.debt.is_empty() && n_debt > 0 {
        // Catch-up ran the newest it may; the older owed intervals stay debt.
        let older = owed.due_newest(axis, &fires, n_run + LISTED_MAX);
        older.into_iter().skip(n_run).rev().map(|d| d.partition.key).collect()
    } else {
        keys(&decision.debt)
    };
    let gaps: Vec<String> = owed.gaps_newest(axis, published, LISTED_MAX).into_iter().rev().map(|p| p.key).collect();
    let oldest_missed = match owed.oldest_gap(axis, published) {
        Some(gap) => Some(gap.key),
        None if n_debt > 0 => owed.newest_published.map(|p| axis.key(axis.shift(p, 1))),
        None => None,
    };
    Ok(Some(TaskDecision {
        task: task.name.clone(),
        catchup: task.catchup.enabled,
        newest_published: owed.newest_published.map(|p| axis.key(p)),
        n_due: owed.n_due,
        due: listed.iter().map(|d| d.partition.key.clone()).collect(),
        run: decision.run().map(|p| p.key.clone()).collect(),
        live: keys(&decision.live),
        n_debt,
        debt,
        n_gaps: owed.n_gaps,
        gaps,
        oldest_missed,
        paused: None,
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
    /// The sensor tasks' partitions, started or still waiting for their sources.
    pub arrivals: Vec<Arrival>,
    /// Per task, the stale partitions of its `stale = "rebuild"` datasets this tick rebuilds.
    pub stale_rebuilds: BTreeMap<String, Vec<String>>,
}

/// Evaluates the schedules at `now` and, unless `dry_run`, submits the runs that are due (see
/// [`start_due`]); executing them is the caller's next step.
pub fn tick(ws: &Workspace, store: &dyn Store, actor: &Actor, now: DateTime<Utc>, dry_run: bool) -> Result<Tick> {
    require(actor, Access::RunWork)?;
    let decisions = decide(&ws.spec, store, now)?;
    let Started { runs, superseded, arrivals, stale_rebuilds } = if dry_run {
        let covered = covered(store)?;
        Started {
            arrivals: arrivals(ws, store, &covered, now)?,
            stale_rebuilds: stale_rebuilds(ws, store, &covered)?,
            ..Started::default()
        }
    } else {
        start_due(ws, store, actor, &decisions, now)?
    };
    Ok(Tick { now, decisions, runs, superseded, arrivals, stale_rebuilds })
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
    let covered = covered(store)?;
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
    let mut arrivals = arrivals(ws, store, &covered, now)?;
    // A sensor task whose schedule is paused starts nothing either: its arrived partitions wait.
    let paused: BTreeSet<String> =
        store.pauses()?.into_iter().filter_map(|p| p.what.strip_prefix("schedule:").map(str::to_owned)).collect();
    for a in arrivals.iter_mut().filter(|a| paused.contains(&a.task)) {
        let started = std::mem::take(&mut a.started);
        a.waiting.extend(started);
    }
    let arrived: BTreeMap<String, Vec<String>> =
        arrivals.iter().filter(|a| !a.started.is_empty()).map(|a| (a.task.clone(), a.started.clone())).collect();
    runs.extend(submit_wanted(ws, store, actor, &arrived, Trigger::Schedule, Priority::Live, now, "arrival")?);
    // Below live work; a rebuild with other code is left out (journaled `rewrite_refused`).
    let stale_rebuilds = stale_rebuilds(ws, store, &covered)?;
    runs.extend(submit_wanted(ws, store, actor, &stale_rebuilds, Trigger::Catchup, Priority::Catchup, now, "stale")?);
    Ok(Started { runs, superseded, arrivals, stale_rebuilds })
}

/// Per task writing a `stale = "rebuild"` dataset, its stale partitions that no unfinished run
/// covers already.
fn stale_rebuilds(
    ws: &Workspace,
    store: &dyn Store,
    covered: &BTreeMap<(String, String), String>,
) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let eager = ws.spec.datasets.iter().filter(|(_, d)| d.stale == tidegate_core::spec::StalePolicy::Rebuild);
    for (name, _) in eager {
        for s in crate::stale::stale_in(ws, store, Some(name))? {
            // A partition stale by code is a rewrite: reported, and left to a governed backfill.
            let by_inputs_only = s.reasons.iter().all(|r| matches!(r, crate::stale::Reason::Input { .. }));
            if by_inputs_only && !covered.contains_key(&(s.task.clone(), s.partition.clone())) {
                let keys = out.entry(s.task).or_default();
                if !keys.contains(&s.partition) {
                    keys.push(s.partition);
                }
            }
        }
    }
    Ok(out)
}

/// The (task, partition) pairs that unfinished runs cover, with the run covering each.
fn covered(store: &dyn Store) -> Result<BTreeMap<(String, String), String>> {
    let mut covered: BTreeMap<(String, String), String> = BTreeMap::new();
    for a in store.active_steps()? {
        covered.entry((a.step.task.clone(), a.step.partition.clone())).or_insert(a.step.run_id.clone());
    }
    Ok(covered)
}

/// For each sensor task (`schedule = "on_arrival"`), its partitions not published and not being
/// run (the newest [`LISTED_MAX`] intervals that have ended, or every static key), split into
/// those whose external sources have arrived and those still waiting. A partition whose source
/// arrives late, after newer ones, is started when it does.
fn arrivals(
    ws: &Workspace,
    store: &dyn Store,
    covered: &BTreeMap<(String, String), String>,
    now: DateTime<Utc>,
) -> Result<Vec<Arrival>> {
    let mut out = Vec::new();
    for task in ws.spec.tasks.values().filter(|t| t.on_arrival) {
        let Some(dataset) = task.outputs.first() else { continue };
        let published = store.published_partitions(dataset)?;
        let keys: Vec<String> = match plan::axis_of(&ws.spec.datasets[dataset]) {
            Some(axis) => {
                let newest_ended = axis.shift(axis.floor(now), -1);
                (0..LISTED_MAX)
                    .map(|i| axis.shift(newest_ended, -i32::try_from(i).unwrap_or(i32::MAX)))
                    .take_while(|start| *start >= axis.first)
                    .map(|start| axis.key(start))
                    .collect()
            }
            None => {
                plan::select_partitions(&ws.spec, task, &Selection::AllStatic)?.into_iter().map(|p| p.key).collect()
            }
        };
        let open: Vec<String> = keys
            .into_iter()
            .filter(|k| !published.contains(k) && !covered.contains_key(&(task.name.clone(), k.clone())))
            .collect();
        if open.is_empty() {
            out.push(Arrival { task: task.name.clone(), started: Vec::new(), waiting: Vec::new() });
            continue;
        }
        let request = Request {
            spec: &ws.spec,
            target: &task.name,
            selection: Selection::Keys(open),
            include_upstream: false,
            include_downstream: false,
        };
        let steps = plan::plan(&request)?.steps;
        let (spec, root) = (ws.spec.clone(), ws.root.clone());
        let looks = block_on_anywhere(async move {
            let mut seen = Vec::new();
            for step in steps {
                let inputs: Vec<(String, Vec<String>)> =
                    step.inputs.iter().map(|i| (i.dataset.clone(), i.partitions.clone())).collect();
                let ready = tidegate_engine::source::first_not_ready(&spec, &root, &inputs).await.is_none();
                seen.push((step.partition.key, ready));
            }
            seen
        })?;
        // Oldest first, as every list of partitions (keys of one axis sort in time order).
        let (mut started, mut waiting): (Vec<_>, Vec<_>) = looks.into_iter().partition(|(_, ready)| *ready);
        started.sort();
        waiting.sort();
        out.push(Arrival {
            task: task.name.clone(),
            started: started.into_iter().map(|(k, _)| k).collect(),
            waiting: waiting.into_iter().map(|(k, _)| k).collect(),
        });
    }
    Ok(out)
}

/// Runs `future` to completion from synchronous code, inside a runtime (a `serve` tick) or not.
fn block_on_anywhere<T: Send + 'static>(future: impl std::future::Future<Output = T> + Send + 'static) -> Result<T> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => Ok(tokio::task::block_in_place(|| handle.block_on(future))),
        Err(_) => Ok(crate::workspace::runtime()?.block_on(future)),
    }
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
    let label = format!("{trigger:?}").to_lowercase();
    submit_wanted(ws, store, actor, &wanted, trigger, priority, now, &label)
}

/// Submits one run holding every (task, partition) of `wanted`; `label` makes its idempotency
/// key one per tick instant and kind of start.
#[allow(clippy::too_many_arguments, reason = "one call site per kind of start; each argument is named there")]
fn submit_wanted(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    wanted: &BTreeMap<String, Vec<String>>,
    trigger: Trigger,
    priority: Priority,
    now: DateTime<Utc>,
    label: &str,
) -> Result<Option<String>> {
    if wanted.is_empty() {
        return Ok(None);
    }
    let plan = combined_plan(&ws.spec, wanted)?;
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
        idempotency_key: Some(format!("tick:{label}:{}", now.to_rfc3339())),
    };
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: format!("tick-{}", now.timestamp()),
        reason: format!("{label} tick at {now}"),
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
