//! Running work in this process: the engine a workspace gets, draining its queue, or following one
//! run until it settles.

use std::sync::Arc;

use anyhow::Result;
use tidegate_core::actor::Actor;
use tidegate_engine::executor::ProgressFn;
use tidegate_engine::{Engine, Options, Summary};
use tidegate_lake::Lake;
use tidegate_store::Store;

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

/// Drains every unfinished run in the workspace's store with an in-process engine of `workers`
/// slots. With `follow`, waits for that run to settle, following it when another process holds
/// the scheduler role instead of competing for it. `progress` is told the steps by status as
/// they change.
pub fn execute(
    ws: &Workspace,
    store: Arc<dyn Store>,
    actor: &Actor,
    workers: usize,
    progress: Option<ProgressFn>,
    follow: Option<&str>,
) -> Result<Summary> {
    require(actor, Access::RunWork)?;
    runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        let mut engine = engine(ws, store, lake, workers);
        if let Some(progress) = progress {
            engine = engine.with_progress(progress);
        }
        Ok(match follow {
            Some(run_id) => engine.drain_until(run_id).await?,
            None => engine.drain().await?,
        })
    })
}
