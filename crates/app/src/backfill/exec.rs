//! Running a frozen backfill into staging, throttled below live work, and watching or steering it
//! (status, pause, resume, cancel). Starting again after a crash resumes the same run.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::state::{RunStatus, StepEvent, StepStatus};
use tidegate_store::{
    BackfillRecord, BackfillStatus, JournalMeta, Priority, RunRequest, StepEventRecord, StepRecord, Store, Trigger,
};

use super::{FrozenSpec, ensure_spec_unchanged, load, meta};
use crate::actor::{Access, require};
use crate::logs::StepFailure;
use crate::workspace::Workspace;

/// How a start found the backfill.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Begun {
    /// It had already finished running: starting again changes nothing (a script retrying
    /// `start` after a crash gets the outcome, not an error).
    AlreadyRan {
        /// Where it stands.
        report: Box<Report>,
    },
    /// It is running as `run_id`: drain that run (`crate::run::execute`), then [`settle`].
    Running {
        /// The backfill.
        id: String,
        /// Its run.
        run_id: String,
        /// Its steps.
        n_steps: usize,
        /// Its throttle's limit on steps at once.
        max_active: u32,
    },
}

/// Starts (or, with `resume`, resumes) a planned backfill: creates its run on the first start
/// (under an idempotency key derived from the backfill, so a start that crashed finds the same
/// run) and marks it running. Its steps stop at staged, validated output.
pub fn start(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str, resume: bool) -> Result<Begun> {
    require(actor, Access::ChangeBackfill)?;
    let id = &crate::ids::backfill(store, id)?;
    let (record, spec) = load(store, id)?;
    ensure_spec_unchanged(ws, &record, &spec)?;
    let expect: &[BackfillStatus] = if resume {
        &[BackfillStatus::Paused, BackfillStatus::Running]
    } else {
        &[BackfillStatus::Planned, BackfillStatus::Running]
    };
    let already_ran = matches!(
        record.status,
        BackfillStatus::Staged | BackfillStatus::Approved | BackfillStatus::Published | BackfillStatus::RolledBack
    );
    if already_ran {
        // Starting a backfill that already finished running is a no-op (a script retrying
        // `start` after a crash gets the outcome, not an error).
        return Ok(Begun::AlreadyRan { report: Box::new(Report::of(ws, store, &record)?) });
    }
    if !expect.contains(&record.status) {
        let hint = match record.status {
            BackfillStatus::Paused => "; resume it with `tidegate backfill resume`",
            BackfillStatus::Planned => "; start it with `tidegate backfill start`",
            BackfillStatus::Staged => "; review it with `tidegate backfill compare`",
            _ => "",
        };
        crate::refuse!(Conflict, "backfill {} is {}{hint}", record.id, record.status);
    }
    let run_id = ensure_run(ws, store, &record, &spec)?;
    let verb = if resume { "backfill_resumed" } else { "backfill_started" };
    let rid = run_id.clone();
    store.update_backfill(
        &record.id,
        expect,
        verb,
        &move |b: &mut BackfillRecord| {
            b.status = BackfillStatus::Running;
            b.run_id = Some(rid.clone());
            Ok(())
        },
        &meta(ws, actor, format!("{} by operator", verb.trim_start_matches("backfill_")), &record.id),
    )?;
    Ok(Begun::Running { id: record.id, run_id, n_steps: spec.steps.len(), max_active: spec.throttle.max_active })
}

/// The backfill's run, created on first start under an idempotency key derived from the backfill
/// id, so that a start that crashed after creating it finds the same run.
fn ensure_run(ws: &Workspace, store: &dyn Store, record: &BackfillRecord, spec: &FrozenSpec) -> Result<String> {
    if let Some(run_id) = &record.run_id {
        return Ok(run_id.clone());
    }
    let request = RunRequest {
        target: spec.target.clone(),
        partitions: vec![format!("{}..{}", spec.from, spec.to)],
        scope: if spec.include_downstream { "only+downstream" } else { "only" }.to_owned(),
        trigger: Trigger::Backfill,
        priority: Priority::Backfill,
        requester: spec.requester.clone(),
        spec_hash: spec.workspace_spec_hash.clone(),
        params: BTreeMap::new(),
        backfill_id: Some(record.id.clone()),
        idempotency_key: Some(format!("backfill:{}", record.id)),
    };
    let meta = JournalMeta {
        via: None,
        actor: spec.requester.clone(),
        correlation_id: record.id.clone(),
        reason: format!("backfill {}: {}", record.id, spec.reason),
        at: ws.now(),
    };
    Ok(store.submit_run(&request, &spec.steps, &meta)?.run.id)
}

/// Moves a running backfill to staged or failed once its run settled, and reports where it stands.
pub fn settle(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str) -> Result<Report> {
    require(actor, Access::ChangeBackfill)?;
    let record = settled(ws, store, actor, &crate::ids::backfill(store, id)?)?;
    Report::of(ws, store, &record)
}

fn settled(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str) -> Result<BackfillRecord> {
    let record = store.backfill(id)?.context("the backfill vanished")?;
    let Some(run_id) = &record.run_id else { return Ok(record) };
    let run = store.run(run_id)?.context("the backfill's run vanished")?;
    let (next, kind, reason) = match run.status {
        RunStatus::AwaitingApproval | RunStatus::Succeeded => {
            (BackfillStatus::Staged, "backfill_staged", "every step is staged and validated".to_owned())
        }
        RunStatus::Failed => {
            let failed = store.steps(run_id)?.into_iter().filter(|s| s.status() == StepStatus::Failed).count();
            (
                BackfillStatus::Failed,
                "backfill_failed",
                format!("{} failed; nothing was published", crate::human::count(failed, "step", "steps")),
            )
        }
        _ => return Ok(record),
    };
    if record.status != BackfillStatus::Running {
        return Ok(record);
    }
    Ok(store.update_backfill(
        id,
        &[BackfillStatus::Running],
        kind,
        &move |b: &mut BackfillRecord| {
            b.status = next;
            Ok(())
        },
        &meta(ws, actor, reason, id),
    )?)
}

/// Pauses a backfill: no new step of it starts; running attempts finish.
pub fn pause(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    id: &str,
    reason: Option<&str>,
) -> Result<BackfillRecord> {
    require(actor, Access::ChangeBackfill)?;
    let reason = reason.unwrap_or("paused by operator").to_owned();
    // A prefix becomes the whole id; an unknown id is answered as every backfill command answers it.
    let (record, _) = load(store, id)?;
    let id = record.id.as_str();
    Ok(store.update_backfill(
        id,
        &[BackfillStatus::Running, BackfillStatus::Planned],
        "backfill_paused",
        &|b: &mut BackfillRecord| {
            b.status = BackfillStatus::Paused;
            Ok(())
        },
        &meta(ws, actor, reason, id),
    )?)
}

/// A backfill cancelled, with how many of its unfinished steps were cancelled.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = BackfillCancelled))]
pub struct Cancelled {
    /// The backfill as it now stands.
    #[serde(flatten)]
    pub record: BackfillRecord,
    /// Its steps that had not finished.
    pub n_steps_cancelled: usize,
    /// Of those, the steps an attempt was running for: the process running each stops it within a
    /// few seconds, killing every process of its task.
    #[serde(default)]
    pub n_attempts_stopping: usize,
}

/// Cancels a backfill and its unfinished steps. Nothing it staged is published.
pub fn cancel(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str, reason: Option<&str>) -> Result<Cancelled> {
    require(actor, Access::ChangeBackfill)?;
    let reason = reason.unwrap_or("cancelled by operator").to_owned();
    // A prefix becomes the whole id; an unknown id is answered as every backfill command answers it.
    let (record, _) = load(store, id)?;
    let id = record.id.as_str();
    let record = store.update_backfill(
        id,
        &[
            BackfillStatus::Planned,
            BackfillStatus::Running,
            BackfillStatus::Paused,
            BackfillStatus::Staged,
            BackfillStatus::Approved,
        ],
        "backfill_cancelled",
        // Checked in the transaction that cancels: a publication that recorded its release id
        // goes on to commit, so cancelling it would say "nothing was published" of published rows.
        &|b: &mut BackfillRecord| {
            if let Some(release) = &b.release_id {
                return Err(tidegate_store::Error::Conflict(super::release::publishing(&b.id, release)));
            }
            b.status = BackfillStatus::Cancelled;
            Ok(())
        },
        &meta(ws, actor, reason.clone(), id),
    )?;
    let (mut n_cancelled, mut n_attempts_stopping) = (0, 0);
    if let Some(run_id) = &record.run_id {
        let unfinished: Vec<_> = store.steps(run_id)?.into_iter().filter(|s| !s.status().is_terminal()).collect();
        n_attempts_stopping = unfinished.iter().filter(|s| s.status().holds_lease()).count();
        let events: Vec<StepEventRecord> = unfinished
            .into_iter()
            .map(|s| StepEventRecord {
                step_id: s.id,
                event: StepEvent::Cancelled { reason: reason.clone() },
                meta: meta(ws, actor, reason.clone(), id),
            })
            .collect();
        n_cancelled = events.len();
        store.commit(&events)?;
    }
    crate::lineage::export(ws, store);
    crate::notify::deliver(ws, store);
    Ok(Cancelled { record, n_steps_cancelled: n_cancelled, n_attempts_stopping })
}

/// What `status` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Report {
    /// The backfill.
    pub id: String,
    /// Where it is in its life.
    pub status: BackfillStatus,
    /// Why it was planned.
    pub reason: String,
    /// Who planned it.
    pub requester: String,
    /// Its frozen spec's hash.
    pub spec_hash: String,
    /// Its run, once started.
    pub run_id: Option<String>,
    /// Its steps.
    pub n_steps: usize,
    /// Steps per status.
    pub steps: BTreeMap<String, usize>,
    /// Steps settled (finished, or staged and waiting for approval).
    pub n_done: usize,
    /// Seconds since its run started (until its last step settled, once it stopped moving).
    pub elapsed_s: Option<f64>,
    /// Steps settled per second.
    pub steps_per_s: Option<f64>,
    /// Seconds left at that pace, while it moves.
    pub eta_s: Option<f64>,
    /// Its failed steps.
    pub failures: Vec<StepFailure>,
    /// The hash of its recorded comparison, once compared: what an approval names.
    pub comparison_hash: Option<String>,
    /// Its approval, once given.
    pub approval: Option<tidegate_store::Approval>,
    /// Its release, once published.
    pub release_id: Option<String>,
    /// The command to run next.
    pub next: String,
}

impl Report {
    /// Where `record` stands, from its run's steps.
    pub fn of(ws: &Workspace, store: &dyn Store, record: &BackfillRecord) -> Result<Report> {
        let now = ws.now();
        let spec: FrozenSpec = serde_json::from_value(record.spec.clone())?;
        let steps: Vec<StepRecord> = match &record.run_id {
            Some(run_id) => store.steps(run_id)?,
            None => Vec::new(),
        };
        let mut tally: BTreeMap<String, usize> = BTreeMap::new();
        for s in &steps {
            *tally.entry(s.status().to_string()).or_default() += 1;
        }
        let done = |s: &StepRecord| s.status().is_terminal() || s.status() == StepStatus::AwaitingApproval;
        let n_done = steps.iter().filter(|s| done(s)).count();
        let started = match &record.run_id {
            Some(run_id) => store.run(run_id)?.map(|r| r.created_at),
            None => None,
        };
        let last = steps.iter().filter(|s| done(s)).map(|s| s.updated_at).max();
        let still_moving = matches!(record.status, BackfillStatus::Running | BackfillStatus::Paused);
        let elapsed_s = started.map(|t| {
            let end = if still_moving { now } else { last.unwrap_or(t) };
            #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
            let s = (end - t).num_milliseconds().max(0) as f64 / 1000.0;
            s
        });
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let steps_per_s = elapsed_s.filter(|e| *e > 0.0 && n_done > 0).map(|e| n_done as f64 / e);
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let eta_s =
            steps_per_s.filter(|_| still_moving).map(|r| (spec.steps.len() - n_done.min(spec.steps.len())) as f64 / r);
        let failures = crate::logs::failures_of(ws, &steps);
        let id = &record.id;
        let next = match record.status {
            BackfillStatus::Planned => format!("tidegate backfill start {id}"),
            BackfillStatus::Running => format!("tidegate backfill status {id} --watch"),
            BackfillStatus::Paused => format!("tidegate backfill resume {id}"),
            BackfillStatus::Staged => match &record.comparison_hash {
                Some(hash) => format!(
                    "review `tidegate backfill compare {id} --html review.html`; then, as another person: \
                     tidegate backfill approve {id} --comparison {}",
                    super::short(hash)
                ),
                None => format!("tidegate backfill compare {id}"),
            },
            BackfillStatus::Approved => format!("tidegate backfill publish {id}"),
            BackfillStatus::Published => format!("tidegate backfill rollback {id}   (if it must be undone)"),
            BackfillStatus::Failed => format!("tidegate history {}", record.run_id.clone().unwrap_or_default()),
            BackfillStatus::RolledBack | BackfillStatus::Cancelled => "nothing".to_owned(),
        };
        Ok(Report {
            id: record.id.clone(),
            status: record.status,
            reason: record.reason.clone(),
            requester: record.requester.clone(),
            spec_hash: record.spec_hash.clone(),
            run_id: record.run_id.clone(),
            n_steps: spec.steps.len(),
            steps: tally,
            n_done,
            elapsed_s,
            steps_per_s,
            eta_s,
            failures,
            comparison_hash: record.comparison_hash.clone(),
            approval: record.approval.clone(),
            release_id: record.release_id.clone(),
            next,
        })
    }
}

/// Where a backfill stands.
pub fn status(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str) -> Result<Report> {
    require(actor, Access::ReadBackfills)?;
    let (record, _) = load(store, id)?;
    Report::of(ws, store, &record)
}

/// The newest `limit` backfills.
pub fn list(store: &dyn Store, actor: &Actor, limit: u32) -> Result<Vec<BackfillRecord>> {
    require(actor, Access::ReadBackfills)?;
    Ok(store.backfills(limit)?)
}
