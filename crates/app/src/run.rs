//! Running work in this process: the engine a workspace gets, draining its queue, or following one
//! run until it settles.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use tidegate_core::actor::Actor;
use tidegate_core::state::StepEvent;
use tidegate_engine::executor::ProgressFn;
use tidegate_engine::{Engine, Options, Summary};
use tidegate_lake::Lake;
use tidegate_store::{JournalMeta, RunRecord, StepEventRecord, StepRecord, Store};

use crate::actor::{Access, require};
use crate::logs::{StepFailure, failures};
use crate::submit::Submitted;
use crate::workspace::{Workspace, open_lake, runtime};

/// The in-process engine for a workspace, on the workspace's clock.
pub fn engine(ws: &Workspace, store: Arc<dyn Store>, lake: Arc<Lake>, workers: usize) -> Engine {
    Engine::new(
        store,
        lake,
        Arc::new(ws.spec.clone()),
        ws.root.clone(),
        ws.lake_url(),
        ws.clock.clone(),
        Options { max_parallel: workers, ..Options::default() },
    )
    .with_code_check()
}

/// Which runs an execution drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every unfinished run in the store, as `tidegate serve` does.
    Everything,
    /// Only this run; the others wait for a drain of everything.
    Run(&'a str),
    /// Every unfinished run, until this one settles.
    RunAndQueue(&'a str),
    /// This run, and the runs submitted while it executes (live work whose submitters follow
    /// this process), until it settles; runs queued before wait (a backfill's start, decision
    /// 0020).
    RunAndLater(&'a str),
}

/// Executes the runs `scope` names with an in-process engine of `workers` slots. For one run,
/// waits for it to settle, following it when another process holds the scheduler role instead of
/// competing for it. `progress` is told the steps by status as they change. Then exports the
/// OpenLineage events of what it did (events a transport could not take wait for the next export).
pub fn execute(
    ws: &Workspace,
    store: Arc<dyn Store>,
    actor: &Actor,
    workers: usize,
    progress: Option<ProgressFn>,
    scope: Scope<'_>,
) -> Result<Summary> {
    let summary = execute_only(ws, store.clone(), actor, workers, progress, scope)?;
    crate::lineage::export(ws, store.as_ref());
    crate::notify::deliver(ws, store.as_ref());
    Ok(summary)
}

/// [`execute`] without the lineage export.
fn execute_only(
    ws: &Workspace,
    store: Arc<dyn Store>,
    actor: &Actor,
    workers: usize,
    progress: Option<ProgressFn>,
    scope: Scope<'_>,
) -> Result<Summary> {
    require(actor, Access::RunWork)?;
    crate::notify::start(ws, store.as_ref());
    runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        let mut engine = engine(ws, store.clone(), lake.clone(), workers);
        if let Some(progress) = progress {
            engine = engine.with_progress(progress);
        }
        let summary = match scope {
            Scope::Everything => engine.drain().await?,
            Scope::Run(run_id) => engine.with_only_run(run_id).drain_until(run_id).await?,
            Scope::RunAndQueue(run_id) => engine.drain_until(run_id).await?,
            Scope::RunAndLater(run_id) => {
                engine.with_only_run(run_id).with_runs_submitted_since(ws.now()).drain_until(run_id).await?
            }
        };
        // The run's end and what it decided after its last commit, vouched for by the lake.
        crate::anchor::vouch(ws, store.as_ref(), &lake).await;
        Ok(summary)
    })
}

/// A submitted run executed in this process: where it ended, and what failed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// The run.
    pub run_id: String,
    /// False when the submission found the run already created (and this resumed it).
    pub created: bool,
    /// The run's status when the execution stopped.
    pub status: String,
    /// What the execution did.
    pub summary: Summary,
    /// How long it took, in seconds.
    pub elapsed_s: f64,
    /// The run's failed steps, with their reasons and logs.
    pub failures: Vec<StepFailure>,
    /// Where the OpenLineage events of the execution went, or why they wait.
    pub lineage: crate::lineage::Delivery,
}

impl Outcome {
    /// Whether every step that settled succeeded (none failed).
    pub fn succeeded(&self) -> bool {
        self.summary.failed == 0
    }
}

/// Executes the `submitted` run in this process with `workers` slots until it settles (and every
/// other unfinished run meanwhile when `with_queue`, as `tidegate serve` would), and reports
/// where it ended. `progress` is told the steps by status as they change.
pub fn execute_submitted(
    ws: &Workspace,
    store: Arc<dyn Store>,
    actor: &Actor,
    submitted: &Submitted,
    workers: usize,
    with_queue: bool,
    progress: Option<ProgressFn>,
) -> Result<Outcome> {
    let started = Instant::now();
    let run_id = submitted.run.id.as_str();
    let scope = if with_queue { Scope::RunAndQueue(run_id) } else { Scope::Run(run_id) };
    let summary = execute_only(ws, store.clone(), actor, workers, progress, scope)?;
    let elapsed_s = started.elapsed().as_secs_f64();
    let run = store.run(run_id)?.context("the run vanished from the store")?;
    let failures = failures(ws, store.as_ref(), actor, run_id)?;
    let (created, status) = (submitted.created, run.status.to_string());
    let lineage = crate::lineage::export(ws, store.as_ref());
    crate::notify::deliver(ws, store.as_ref());
    Ok(Outcome { run_id: run.id, created, status, summary, elapsed_s, failures, lineage })
}

/// A run cancelled.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = RunCancelled))]
pub struct Cancelled {
    /// The run.
    pub run_id: String,
    /// Its steps that were not finished, now cancelled.
    pub n_steps_cancelled: usize,
    /// Of those, the steps an attempt was running for: the process running each (this machine's
    /// scheduler or a worker) stops it within a few seconds, killing every process of its task.
    #[serde(default)]
    pub n_attempts_stopping: usize,
    /// Its steps whose publication had already committed (a process killed between its commit
    /// and its record): recorded as their releases instead of cancelled, so no published row is
    /// left outside the journal. Undo them with a rollback of the run.
    pub published: Vec<crate::unrecorded::Finished>,
}

/// Cancels every unfinished step of `run_id` (journaled with `reason`): nothing more of it runs or
/// publishes; what it published stays (undo that with a rollback of the run). Its running attempts
/// are stopped by the processes running them, which look at their steps every
/// [`tidegate_engine::cancel::CHECK_EVERY`]. A backfill's run is cancelled through its backfill.
pub fn cancel(ws: &Workspace, store: &dyn Store, actor: &Actor, run_id: &str, reason: &str) -> Result<Cancelled> {
    require(actor, Access::RunWork)?;
    let run = find(store, run_id)?;
    let run_id = run.id.as_str();
    if let Some(backfill) = &run.request.backfill_id {
        crate::refuse!(
            Conflict,
            "run {run_id} is backfill {backfill}'s; cancel it with `tidegate backfill cancel {backfill}`"
        );
    }
    if run.status.is_terminal() {
        crate::refuse!(Conflict, "run {run_id} is already {}; there is nothing to cancel", run.status);
    }
    let meta = JournalMeta {
        via: Some(actor.via()),
        actor: actor.name.clone(),
        correlation_id: run_id.to_owned(),
        reason: reason.to_owned(),
        at: ws.now(),
    };
    // A publication that committed and was not recorded is finished first: its rows are live.
    let published = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        crate::unrecorded::finish(ws, store, &lake, run_id, &meta).await
    })?;
    let unfinished: Vec<StepRecord> = store.steps(run_id)?.into_iter().filter(|s| !s.status().is_terminal()).collect();
    let n_attempts_stopping = unfinished.iter().filter(|s| s.status().holds_lease()).count();
    let events: Vec<StepEventRecord> = unfinished
        .into_iter()
        .map(|s| StepEventRecord {
            step_id: s.id,
            event: StepEvent::Cancelled { reason: reason.to_owned() },
            meta: meta.clone(),
        })
        .collect();
    let n_steps_cancelled = events.len();
    store.commit(&events)?;
    crate::lineage::export(ws, store);
    crate::notify::deliver(ws, store);
    Ok(Cancelled { run_id: run_id.to_owned(), n_steps_cancelled, n_attempts_stopping, published })
}

/// The run `run_id` names (its whole id or a unique prefix, `ids::run`), or a refusal (not found)
/// that says where the known ones are.
pub fn find(store: &dyn Store, run_id: &str) -> Result<RunRecord> {
    match store.run(&crate::ids::run(store, run_id)?)? {
        Some(run) => Ok(run),
        None => crate::refuse!(NotFound, "no run {run_id:?}; `tidegate status` lists the recent ones"),
    }
}

/// How many of the newest runs a listing reads to find the page after a cursor.
pub const RUNS_LISTED_MAX: u32 = 10_000;

/// A page of runs, newest first: at most `limit`, those after the run `after` (a cursor: the
/// last run of the previous page), each with its steps counted by status.
pub fn list(
    store: &dyn Store,
    actor: &Actor,
    limit: u32,
    after: Option<&str>,
) -> Result<crate::listing::Page<crate::status::RunStatusLine>> {
    require(actor, Access::Read)?;
    let runs = store.runs(RUNS_LISTED_MAX)?;
    let page = crate::listing::Page::of(runs, |r| r.id.as_str(), limit, after)?;
    page.try_map(|run| line(store, run))
}

/// The run `run_id` with its steps counted by status.
pub fn get(store: &dyn Store, actor: &Actor, run_id: &str) -> Result<crate::status::RunStatusLine> {
    require(actor, Access::Read)?;
    line(store, find(store, run_id)?)
}

/// The steps of run `run_id`, in plan order, with their state (status, attempts, pins).
pub fn steps(store: &dyn Store, actor: &Actor, run_id: &str) -> Result<Vec<StepRecord>> {
    require(actor, Access::Read)?;
    let run = find(store, run_id)?;
    Ok(store.steps(&run.id)?)
}

fn line(store: &dyn Store, run: RunRecord) -> Result<crate::status::RunStatusLine> {
    crate::status::RunStatusLine::of(store, run)
}
