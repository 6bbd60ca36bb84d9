//! Filling a store with many steps fast: runs planned through the application layer's planner
//! and submitted to the store, whose steps are then skipped or made ready with step events in
//! batches, without running anything. Shared by the benchmarks that measure reads over a big
//! store (`monitor`, `overview`).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use chrono::Utc;
use tidegate_app::submit;
use tidegate_app::target::{Partitions, Target};
use tidegate_app::workspace::Workspace;
use tidegate_core::state::StepEvent;
use tidegate_engine::executor::MAX_EVENTS_PER_COMMIT;
use tidegate_store::{JournalMeta, Priority, RunRequest, StepEventRecord, Store, Trigger};

/// Plans a run of `task` over `from..=to` in the store as `actor`, then skips all its steps
/// (`finish`) or makes them ready.
pub(crate) fn planned_run(
    ws: &Workspace,
    store: &dyn Store,
    actor: &str,
    task: &str,
    (from, to): (&str, &str),
    finish: bool,
) -> Result<()> {
    let target = Target {
        target: task.to_owned(),
        partitions: Partitions::Range { from: from.to_owned(), to: to.to_owned() },
        only: true,
        downstream: false,
    };
    let steps = submit::new_steps(ws, &target.plan(&ws.spec)?, &BTreeMap::new(), false)?;
    let request = RunRequest {
        target: task.to_owned(),
        partitions: vec![format!("{from}..{to}")],
        scope: "only".to_owned(),
        trigger: Trigger::Manual,
        priority: Priority::Live,
        requester: actor.to_owned(),
        spec_hash: ws.spec.hash.clone(),
        params: BTreeMap::new(),
        backfill_id: None,
        idempotency_key: None,
    };
    let run = store.submit_run(&request, &steps, &meta(actor))?.run;
    let events: Vec<StepEventRecord> = store
        .steps(&run.id)?
        .into_iter()
        .map(|s| {
            let event = if finish {
                StepEvent::Skipped { reason: "bench".to_owned() }
            } else {
                StepEvent::DepsMet { inputs: vec![] }
            };
            StepEventRecord { step_id: s.id, event, meta: meta(actor) }
        })
        .collect();
    for chunk in events.chunks(MAX_EVENTS_PER_COMMIT) {
        store.commit(chunk).context("recording the bench's step events")?;
    }
    Ok(())
}

fn meta(actor: &str) -> JournalMeta {
    JournalMeta {
        via: None,
        actor: actor.to_owned(),
        correlation_id: actor.to_owned(),
        reason: "bench".to_owned(),
        at: Utc::now(),
    }
}
