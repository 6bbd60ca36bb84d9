//! Submitting a run (queued, not executed) idempotently, and what makes a step what it is: its
//! identity key, from the task's code version, parameters, partition and pinned inputs.

use std::collections::BTreeMap;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::idempotency::{PinnedInput, StepIdentity};
use tidegate_core::plan::Plan;
use tidegate_core::spec::Spec;
use tidegate_core::spec::model::{Dataset, DatasetKind, WriteMode};
use tidegate_core::state::Step;
use tidegate_store::{JournalMeta, NewStep, Priority, RunRecord, RunRequest, Store, Trigger};

use crate::actor::{Access, require};
use crate::target::Target;
use crate::workspace::{Workspace, open_lake, runtime};

/// A run, as submitted: whether this submission created it (or found it under its idempotency
/// key), and how many steps it has.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Submitted {
    /// False when the idempotency key named a run already created with the same request.
    pub created: bool,
    /// The run.
    pub run: RunRecord,
    /// Its steps.
    pub n_steps: usize,
}

/// What to submit.
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    /// The target and its partitions.
    pub target: Target,
    /// A client key that makes the submission safe to retry.
    pub idempotency_key: Option<String>,
    /// Who or what asked.
    pub trigger: Trigger,
    /// Live work or a backfill.
    pub priority: Priority,
}

/// Creates a queued run for the target (or, under an idempotency key already used with the same
/// request, returns the one created then), without running it.
pub fn submit(ws: &Workspace, store: &dyn Store, actor: &Actor, request: &SubmitRequest) -> Result<Submitted> {
    require(actor, Access::RunWork)?;
    let (run, created) = create_run(ws, store, actor, request)?;
    let n_steps = store.steps(&run.id)?.len();
    Ok(Submitted { created, run, n_steps })
}

/// Creates a run for the target (or, under an idempotency key already used with the same
/// request, returns the existing one). Returns the run and whether it was created now.
fn create_run(ws: &Workspace, store: &dyn Store, actor: &Actor, submit: &SubmitRequest) -> Result<(RunRecord, bool)> {
    let SubmitRequest { target, idempotency_key, trigger, priority } = submit;
    let (trigger, priority) = (*trigger, *priority);
    let request = RunRequest {
        target: target.target.clone(),
        partitions: target.describe(),
        scope: target.scope(),
        trigger,
        priority,
        requester: actor.name.clone(),
        spec_hash: ws.spec.hash.clone(),
        params: BTreeMap::new(),
        backfill_id: None,
        idempotency_key: idempotency_key.clone(),
    };
    let plan = target.plan(&ws.spec)?;
    let reason = format!("{} run of {}", format!("{trigger:?}").to_lowercase(), target.target);
    submit_planned(ws, store, actor, &request, &plan, reason)
}

/// Submits `plan` as the run `request` asks for, journaled with `reason`, after the checks every
/// submission passes: no schema change readers cannot follow, no partition published by another
/// version of a task's code replaced outside a review (`rewrites`). Returns the run and whether
/// it was created now (under an idempotency key already used, the run created then).
pub(crate) fn submit_planned(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    request: &RunRequest,
    plan: &Plan,
    reason: String,
) -> Result<(RunRecord, bool)> {
    // Plan first, then submit in one transaction: a crash between the two leaves nothing behind,
    // and a replay under the same key returns the run the first submission created.
    refuse_rewrites(ws, plan)?;
    let steps = new_steps(ws, plan, &BTreeMap::new(), false)?;
    crate::rewrites::refuse(&crate::rewrites::under_review(&ws.spec, store, &steps)?)?;
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: request.requester.clone(),
        correlation_id: uuid::Uuid::now_v7().to_string(),
        reason,
        at: ws.now(),
    };
    let submission = store.submit_run(request, &steps, &meta)?;
    Ok((submission.run, submission.created))
}

/// Refuses a run that would publish a schema change readers cannot follow in place (a column
/// dropped, renamed, retyped or made not null) to a partitioned dataset: one step's commit cannot
/// replace every file of the table, so every step would fail at publication. A governed backfill
/// of every partition publishes it (the lake's error says so). A snapshot replaces the whole
/// table each time, so any change is its to make.
fn refuse_rewrites(ws: &Workspace, plan: &Plan) -> Result<()> {
    let outputs: std::collections::BTreeSet<&str> =
        plan.steps.iter().flat_map(|s| ws.spec.tasks[&s.task].outputs.iter().map(String::as_str)).collect();
    let checked: Vec<&Dataset> = outputs
        .into_iter()
        .filter_map(|name| ws.spec.datasets.get(name))
        .filter(|d| !d.columns.is_empty())
        .filter(|d| !matches!(d.kind, DatasetKind::Managed { write: WriteMode::Snapshot }))
        .collect();
    if checked.is_empty() {
        return Ok(());
    }
    runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        for dataset in checked {
            let pending = lake.schema_change(dataset).await?;
            if let Some(refusal) = pending.change.rewrite_refusal(&dataset.name) {
                return Err(refusal.into());
            }
        }
        Ok(())
    })
}

/// Code versions per task: the command or SQL text plus the declared files' contents.
pub fn code_versions(ws: &Workspace) -> Result<BTreeMap<String, String>> {
    Ok(tidegate_engine::code::versions(&ws.spec, &ws.root)?)
}

/// Turns planned steps into store rows with their idempotency keys. `pins` fixes the table
/// version an input dataset is read at (a backfill pins at plan time; other runs pin when a step
/// becomes ready); `needs_approval` makes the steps stop at staged output (backfills).
pub fn new_steps(
    ws: &Workspace,
    plan: &Plan,
    pins: &BTreeMap<String, Option<i64>>,
    needs_approval: bool,
) -> Result<Vec<NewStep>> {
    let versions = code_versions(ws)?;
    let spec: &Spec = &ws.spec;
    Ok(plan
        .steps
        .iter()
        .map(|s| {
            let task = &spec.tasks[&s.task];
            // Unless pinned here, input versions are pinned by the engine when the step becomes
            // ready; until then an input is recorded without a version.
            let inputs: Vec<PinnedInput> = s
                .inputs
                .iter()
                .map(|i| PinnedInput {
                    dataset: i.dataset.clone(),
                    partitions: i.partitions.clone(),
                    version: pins.get(&i.dataset).copied().flatten(),
                    staged_steps: Vec::new(),
                })
                .collect();
            let step_key = StepIdentity {
                task: &s.task,
                partition: &s.partition.key,
                code_version: &versions[&s.task],
                params: &task.params,
                inputs: &inputs,
            }
            .key();
            NewStep {
                name: s.name.clone(),
                task: s.task.clone(),
                partition: s.partition.key.clone(),
                interval: s.partition.interval,
                step_key,
                pool: task.pool.clone(),
                upstream: s.upstream.clone(),
                inputs,
                state: Step::new(task.retry, needs_approval),
                code_version: Some(versions[&s.task].clone()),
            }
        })
        .collect())
}
