//! Running work in this process: the engine a workspace gets, draining its queue, or following one
//! run until it settles.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tidegate_core::actor::Actor;
use tidegate_core::state::StepEvent;
use tidegate_engine::executor::ProgressFn;
use tidegate_engine::{Engine, Options, Summary};
use tidegate_lake::Lake;
use tidegate_store::{JournalMeta, StepEventRecord, Store};

use crate::actor::{Access, require};
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
}

/// Executes the runs `scope` names with an in-process engine of `workers` slots. For one run,
/// waits for it to settle, following it when another process holds the scheduler role instead of
/// competing for it. `progress` is told the steps by status as they change.
pub fn execute(
    ws: &Workspace,
    store: Arc<dyn Store>,
    actor: &Actor,
    workers: usize,
    progress: Option<ProgressFn>,
    scope: Scope<'_>,
) -> Result<Summary> {
    require(actor, Access::RunWork)?;
    runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        let mut engine = engine(ws, store, lake, workers);
        if let Some(progress) = progress {
            engine = engine.with_progress(progress);
        }
        Ok(match scope {
            Scope::Everything => engine.drain().await?,
            Scope::Run(run_id) => engine.with_only_run(run_id).drain_until(run_id).await?,
            Scope::RunAndQueue(run_id) => engine.drain_until(run_id).await?,
        })
    })
}

/// A run cancelled.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cancelled {
    /// The run.
    pub run_id: String,
    /// Its steps that were not finished, now cancelled.
    pub n_steps_cancelled: usize,
}

/// Cancels every unfinished step of `run_id` (journaled with `reason`): nothing more of it runs or
/// publishes; what it published stays (undo that with a rollback of the run). A backfill's run is
/// cancelled through its backfill.
pub fn cancel(ws: &Workspace, store: &dyn Store, actor: &Actor, run_id: &str, reason: &str) -> Result<Cancelled> {
    require(actor, Access::RunWork)?;
    let run =
        store.run(run_id)?.with_context(|| format!("no run {run_id:?}; `tidegate status` lists the recent ones"))?;
    if let Some(backfill) = &run.request.backfill_id {
        bail!("run {run_id} is backfill {backfill}'s; cancel it with `tidegate backfill cancel {backfill}`");
    }
    if run.status.is_terminal() {
        bail!("run {run_id} is already {}; there is nothing to cancel", run.status);
    }
    let meta = JournalMeta {
        actor: actor.name.clone(),
        correlation_id: run_id.to_owned(),
        reason: reason.to_owned(),
        at: ws.now(),
    };
    let events: Vec<StepEventRecord> = store
        .steps(run_id)?
        .into_iter()
        .filter(|s| !s.status().is_terminal())
        .map(|s| StepEventRecord {
            step_id: s.id,
            event: StepEvent::Cancelled { reason: reason.to_owned() },
            meta: meta.clone(),
        })
        .collect();
    let n_steps_cancelled = events.len();
    store.commit(&events)?;
    Ok(Cancelled { run_id: run_id.to_owned(), n_steps_cancelled })
}
