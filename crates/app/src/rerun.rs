//! Re-running a run's failed steps (Airflow's clear, Dagster's re-execute from failure): a new run
//! over the steps of an old one that failed or did not run because an upstream step failed, and
//! with `downstream` every step downstream of them in the spec, for the same partitions. The new
//! run is linked to the old one both ways: its request's params name the old run
//! ([`RERUN_OF_PARAM`]) and its creation is journaled with that reason, and the old run's journal
//! gets a [`RERUN_KIND`] entry naming the new one, so the history of either shows the link. The
//! new run is submitted as every run is (the schema and rewrites checks apply), and the scheduler
//! runs it.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::partition::Partition;
use tidegate_core::state::StepStatus;
use tidegate_store::{Decision, JournalMeta, RunRecord, RunRequest, StepRecord, Store, Trigger};

use crate::actor::{Access, require};
use crate::submit::Submitted;
use crate::workspace::Workspace;

/// The request param of a rerun that names the run it reruns.
pub const RERUN_OF_PARAM: &str = "rerun_of";

/// The kind of the journal entry on the old run that names its rerun.
pub const RERUN_KIND: &str = "rerun_requested";

/// The scope a rerun's request records (with `+downstream` when it widens downstream).
const RERUN_SCOPE: &str = "failed";

/// What to rerun.
#[derive(Debug, Clone)]
pub struct RerunRequest {
    /// The run: its id or a unique prefix of it.
    pub run: String,
    /// Also rerun every step downstream of the failed ones in the spec.
    pub downstream: bool,
    /// Why, for the journal.
    pub reason: String,
    /// A client key that makes the rerun safe to retry.
    pub idempotency_key: Option<String>,
}

/// A rerun, submitted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rerun {
    /// The run whose failed steps are rerun.
    pub rerun_of: String,
    /// The names (`task@partition`) of its steps that failed or whose upstream failed.
    pub failed: Vec<String>,
    /// The new run, queued (false `created`: found under its idempotency key).
    pub submitted: Submitted,
}

/// Submits a new run over the failed and upstream-failed steps of `request.run` (and, with
/// `downstream`, every step downstream of them), linked to it. Refused when the run has no such
/// step, when it is a backfill's (a backfill resumes through its own commands), or when one of
/// the steps' tasks is no longer in the spec.
pub fn rerun(ws: &Workspace, store: &dyn Store, actor: &Actor, request: &RerunRequest) -> Result<Rerun> {
    require(actor, Access::RunWork)?;
    crate::input::require_reason(&request.reason)?;
    let old = crate::run::find(store, &request.run)?;
    if let Some(backfill) = &old.request.backfill_id {
        crate::refuse!(
            Conflict,
            "run {} is backfill {backfill}'s; its failed steps run again with `tidegate backfill resume {backfill}`",
            old.id
        );
    }
    let steps = store.steps(&old.id)?;
    let failed: Vec<&StepRecord> =
        steps.iter().filter(|s| matches!(s.status(), StepStatus::Failed | StepStatus::UpstreamFailed)).collect();
    if failed.is_empty() {
        crate::refuse!(Conflict, "run {} has no failed step ({}); there is nothing to rerun", old.id, tally(&steps));
    }
    if let Some(gone) = failed.iter().find(|s| !ws.spec.tasks.contains_key(&s.task)) {
        crate::refuse!(
            Invalid,
            "step {} of run {} runs task {:?}, which is no longer in {}; rerun what remains with `tidegate run`",
            gone.name,
            old.id,
            gone.task,
            ws.spec.file
        );
    }
    let seeds: Vec<(String, Partition)> =
        failed.iter().map(|s| (s.task.clone(), Partition { key: s.partition.clone(), interval: s.interval })).collect();
    let target =
        if ws.spec.tasks.contains_key(&old.request.target) || ws.spec.datasets.contains_key(&old.request.target) {
            old.request.target.clone()
        } else {
            failed[0].task.clone()
        };
    let plan = tidegate_core::plan::plan_steps(&ws.spec, &target, seeds, request.downstream)?;
    let run_request = new_request(ws, actor, &old, &failed, request);
    let reason = format!("rerun of the failed steps of run {}: {}", old.id, request.reason);
    let (run, created) = crate::submit::submit_planned(ws, store, actor, &run_request, &plan, reason)?;
    if created {
        journal_link(ws, store, actor, &old, &run, request)?;
    }
    let n_steps = store.steps(&run.id)?.len();
    Ok(Rerun {
        rerun_of: old.id,
        failed: failed.iter().map(|s| s.name.clone()).collect(),
        submitted: Submitted { created, run, n_steps },
    })
}

/// The new run's request: the old one's target and priority, the failed steps' partitions, and
/// the link to the old run in its params.
fn new_request(
    ws: &Workspace,
    actor: &Actor,
    old: &RunRecord,
    failed: &[&StepRecord],
    request: &RerunRequest,
) -> RunRequest {
    let partitions: BTreeSet<String> = failed.iter().map(|s| s.partition.clone()).collect();
    RunRequest {
        target: old.request.target.clone(),
        partitions: partitions.into_iter().collect(),
        scope: if request.downstream { format!("{RERUN_SCOPE}+downstream") } else { RERUN_SCOPE.to_owned() },
        trigger: Trigger::Manual,
        priority: old.request.priority,
        requester: actor.name.clone(),
        spec_hash: ws.spec.hash.clone(),
        params: BTreeMap::from([(RERUN_OF_PARAM.to_owned(), old.id.clone())]),
        backfill_id: None,
        idempotency_key: request.idempotency_key.clone(),
    }
}

/// Journals on the old run that `new` reruns its failed steps, so its history names the rerun.
fn journal_link(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    old: &RunRecord,
    new: &RunRecord,
    request: &RerunRequest,
) -> Result<()> {
    let decision = Decision {
        kind: RERUN_KIND.to_owned(),
        run_id: Some(old.id.clone()),
        task: None,
        partition: None,
        payload: serde_json::json!({ "rerun": new.id, "downstream": request.downstream }),
    };
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: new.id.clone(),
        reason: format!("its failed steps rerun as run {}: {}", new.id, request.reason),
        at: ws.now(),
    };
    store.record_decision(&decision, &meta)?;
    Ok(())
}

/// The steps counted by status, for a refusal: `3 published, 1 running`.
fn tally(steps: &[StepRecord]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in steps {
        *counts.entry(s.status().to_string()).or_default() += 1;
    }
    if counts.is_empty() {
        return "it has no steps".to_owned();
    }
    counts.into_iter().map(|(status, n)| format!("{n} {status}")).collect::<Vec<_>>().join(", ")
}
