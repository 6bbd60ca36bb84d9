//! Pauses (issue 34): an operator holds back a task's schedule, a task, a pool, or all catch-up
//! or backfill traffic, with a reason, and resumes it later. A paused schedule's tick plans
//! nothing for it (`schedule::decide` leaves its intervals owed); a paused task's, pool's or
//! class's ready steps are not claimed by the scheduler (they stay ready); attempts running when
//! the pause began finish. Both pausing and resuming are journaled (`paused`, `resumed`).

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::pause::{Pausable, PausedClass};
use tidegate_core::state::StepStatus;
use tidegate_store::{ActiveStep, JournalMeta, PauseOutcome, PauseRecord, Priority, Store};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// A request to pause or resume something, as the HTTP API takes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// What: `schedule:TASK`, `task:TASK`, `pool:NAME`, `class:catchup` or `class:backfill`.
    pub what: String,
    /// Why, in words: the journal keeps it.
    pub reason: String,
}

/// A pause in force and what it holds back now.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PauseLine {
    /// The pause.
    #[serde(flatten)]
    pub record: PauseRecord,
    /// Ready steps it holds back (a schedule's pause: the owed intervals its tick does not plan).
    pub held_back: u64,
}

/// Reads and checks what to pause against the workspace's spec: an unknown task or pool, or a
/// schedule pause of a task without a schedule, is refused as invalid.
pub fn parse_what(ws: &Workspace, what: &str) -> Result<Pausable> {
    let parsed: Pausable = match what.trim().parse() {
        Ok(p) => p,
        Err(e) => crate::refuse!(Invalid, "{e}"),
    };
    let known = |kind: &str, names: Vec<&String>| -> Result<()> {
        let list = names.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
        crate::refuse!(Invalid, "{what:?}: no {kind} of that name in tidegate.toml (the {kind}s: {list})")
    };
    match &parsed {
        Pausable::Schedule(task) => match ws.spec.tasks.get(task) {
            Some(t) if t.schedule.is_some() => {}
            Some(_) => crate::refuse!(Invalid, "{what:?}: task {task} has no schedule to pause (pause task:{task})"),
            None => known("task", ws.spec.tasks.keys().collect())?,
        },
        Pausable::Task(task) if !ws.spec.tasks.contains_key(task) => known("task", ws.spec.tasks.keys().collect())?,
        Pausable::Pool(pool) if !ws.spec.pools.contains_key(pool) => known("pool", ws.spec.pools.keys().collect())?,
        _ => {}
    }
    Ok(parsed)
}

fn meta(ws: &Workspace, actor: &Actor, reason: &str, what: &Pausable) -> JournalMeta {
    JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: format!("pause-{what}"),
        reason: reason.trim().to_owned(),
        at: ws.now(),
    }
}

/// Pauses `what` for `reason`; refused when it is paused already (naming who paused it, when
/// and why).
pub fn pause(ws: &Workspace, store: &dyn Store, actor: &Actor, what: &str, reason: &str) -> Result<PauseRecord> {
    require(actor, Access::RunWork)?;
    crate::input::require_reason(reason)?;
    let what = parse_what(ws, what)?;
    match store.pause(&what.to_string(), &meta(ws, actor, reason, &what))? {
        PauseOutcome::Paused(record) => Ok(record),
        PauseOutcome::Already(held) => crate::refuse!(
            Conflict,
            "{what} is paused already, by {} since {} ({}); resume it first to pause it again",
            held.actor,
            held.paused_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            held.reason
        ),
    }
}

/// Resumes `what` for `reason`: the pause it ended. Refused when `what` is not paused.
pub fn resume(ws: &Workspace, store: &dyn Store, actor: &Actor, what: &str, reason: &str) -> Result<PauseRecord> {
    require(actor, Access::RunWork)?;
    crate::input::require_reason(reason)?;
    // Only the syntax is checked: a pause of a task since removed from the spec can be ended.
    let parsed: Pausable = match what.trim().parse() {
        Ok(p) => p,
        Err(e) => crate::refuse!(Invalid, "{e}"),
    };
    match store.resume(&parsed.to_string(), &meta(ws, actor, reason, &parsed))? {
        Some(record) => Ok(record),
        None => {
            let paused: Vec<String> = store.pauses()?.into_iter().map(|p| p.what).collect();
            let now = if paused.is_empty() {
                "nothing is paused".to_owned()
            } else {
                format!("paused: {}", paused.join(", "))
            };
            crate::refuse!(Conflict, "{parsed} is not paused ({now})")
        }
    }
}

/// The pauses in force, oldest first, each with what it holds back now.
pub fn list(ws: &Workspace, store: &dyn Store, actor: &Actor) -> Result<Vec<PauseLine>> {
    require(actor, Access::Read)?;
    let pauses = store.pauses()?;
    if pauses.is_empty() {
        return Ok(Vec::new());
    }
    let active = store.active_steps()?;
    let schedules = if pauses.iter().any(|p| p.what.starts_with("schedule:")) {
        crate::schedule::decide(&ws.spec, store, ws.now())?
    } else {
        Vec::new()
    };
    Ok(lines(pauses, &active, &schedules))
}

/// Each pause with what it holds back among the `active` steps (a schedule's pause: its owed
/// intervals, from the tick's `decisions`).
pub fn lines(
    pauses: Vec<PauseRecord>,
    active: &[ActiveStep],
    decisions: &[crate::schedule::TaskDecision],
) -> Vec<PauseLine> {
    pauses
        .into_iter()
        .map(|record| {
            let held_back = match record.what.parse::<Pausable>() {
                Ok(Pausable::Schedule(task)) => decisions.iter().find(|d| d.task == task).map_or(0, |d| d.n_due),
                Ok(what) => held_by(active, &what),
                Err(_) => 0,
            };
            PauseLine { record, held_back }
        })
        .collect()
}

/// How many of the ready `active` steps `what` holds back.
fn held_by(active: &[ActiveStep], what: &Pausable) -> u64 {
    let held = |a: &&ActiveStep| match what {
        Pausable::Schedule(_) => false,
        Pausable::Task(t) => &a.step.task == t,
        Pausable::Pool(p) => &a.step.pool == p,
        Pausable::Class(PausedClass::Catchup) => a.priority == Priority::Catchup,
        Pausable::Class(PausedClass::Backfill) => a.priority == Priority::Backfill,
    };
    active.iter().filter(|a| a.step.status() == StepStatus::Ready).filter(held).count() as u64
}
