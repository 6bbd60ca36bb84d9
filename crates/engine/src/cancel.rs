//! Attempts stopped by a cancel. While an attempt runs, the process running it (the scheduler's,
//! or a `tidegate worker`) looks at its step in the store every [`CHECK_EVERY`]; once an operator
//! has cancelled the step (`tidegate cancel`, `tidegate backfill cancel`, or the API), the
//! attempt's whole process tree is killed ([`crate::process::run_until`]), the stop is journaled
//! (`attempt_stopped`: which attempt, the process that stopped it, who cancelled and why), and the
//! attempt reports [`crate::attempt::Report::Stopped`], which writes nothing more: the step is
//! cancelled already, and nothing the attempt staged is ever published.
//!
//! The look is one read of one step by its key, and only for attempts that run longer than
//! [`CHECK_EVERY`]: short attempts never make it.

use std::sync::Arc;
use std::time::Duration;

use tidegate_core::state::StepStatus;
use tidegate_store::{Decision, JournalMeta, JournalQuery, Store};
use tokio::sync::watch;

use crate::attempt::Attempt;

/// How often a running attempt's step is looked at for a cancel.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The journal kind of an attempt stopped by a cancel.
pub const ATTEMPT_STOPPED: &str = "attempt_stopped";

/// Who cancelled a step, and why, as the journal recorded the cancel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    /// Who cancelled it.
    pub by: String,
    /// How they were known and from where (`cli`, `http` ...), when recorded.
    pub via: Option<String>,
    /// Why, in their words.
    pub reason: String,
    /// The cancel's correlation id (the run's or the backfill's id).
    pub correlation_id: String,
    /// The cancel's journal entry.
    pub seq: Option<u64>,
}

impl Cancel {
    /// `cancelled by <who>: <why>`.
    pub fn describe(&self) -> String {
        format!("cancelled by {}: {}", self.by, self.reason)
    }
}

/// Set once the attempt's step is found cancelled.
pub type StopSignal = watch::Receiver<Option<Cancel>>;

/// Resolves once `stop` is set; never, if it never is.
pub async fn stopped(mut stop: StopSignal) {
    if stop.wait_for(Option::is_some).await.is_err() {
        // The look ended without a cancel (another attempt owns the step): nothing stops this one.
        std::future::pending::<()>().await;
    }
}

/// Looks at step `step_id` every [`CHECK_EVERY`] while its attempt at `epoch` runs, and sets
/// `stop` once it is cancelled. Ends when another attempt owns the step (its report is fenced).
/// A look the store could not answer is made again at the next one.
pub(crate) async fn watch(store: Arc<dyn Store>, step_id: String, epoch: u64, stop: watch::Sender<Option<Cancel>>) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let (s, id) = (store.clone(), step_id.clone());
        let Ok(Ok(Some(step))) = tokio::task::spawn_blocking(move || s.step(&id)).await else { continue };
        if step.state.epoch != epoch {
            return;
        }
        if step.state.status != StepStatus::Cancelled {
            continue;
        }
        let (s, id) = (store.clone(), step_id.clone());
        let found = tokio::task::spawn_blocking(move || who_cancelled(s.as_ref(), &id)).await.ok().flatten();
        let cancel = found.unwrap_or_else(|| Cancel {
            by: "an operator".to_owned(),
            via: None,
            reason: "the step was cancelled (its journal entry could not be read)".to_owned(),
            correlation_id: step.run_id.clone(),
            seq: None,
        });
        let _ = stop.send(Some(cancel));
        return;
    }
}

/// The step's last `cancelled` journal entry, as a [`Cancel`].
fn who_cancelled(store: &dyn Store, step_id: &str) -> Option<Cancel> {
    let query = JournalQuery { step_id: Some(step_id.to_owned()), ..JournalQuery::default() };
    let entries = store.journal(&query).ok()?;
    let entry = entries.into_iter().rev().find(|e| e.kind == "cancelled")?;
    Some(Cancel {
        by: entry.actor,
        via: entry.via,
        reason: entry.reason,
        correlation_id: entry.correlation_id,
        seq: Some(entry.seq),
    })
}

/// Journals that attempt `a` was stopped by `cancel` (`attempt_stopped`), as the process that ran
/// it. Best effort: a store that is away loses the entry, not the stop (the cancel itself is
/// journaled).
pub(crate) async fn record_stop(store: &Arc<dyn Store>, a: &Attempt, cancel: &Cancel) {
    let decision = Decision {
        kind: ATTEMPT_STOPPED.to_owned(),
        run_id: Some(a.run_id.clone()),
        task: Some(a.step.task.clone()),
        partition: Some(a.step.partition.clone()),
        payload: serde_json::json!({
            "step_id": a.step.id,
            "attempt": a.lease.attempt,
            "epoch": a.lease.epoch,
            "worker": a.lease.worker,
            "cancelled_by": cancel.by,
            "cancelled_via": cancel.via,
            "cancel_reason": cancel.reason,
            "cancel_seq": cancel.seq,
        }),
    };
    let meta = JournalMeta {
        via: None,
        actor: a.lease.worker.clone(),
        correlation_id: cancel.correlation_id.clone(),
        reason: format!(
            "attempt {} of step {} stopped: the step was {}",
            a.lease.attempt,
            a.step.id,
            cancel.describe()
        ),
        at: a.clock.now(),
    };
    let s = store.clone();
    match tokio::task::spawn_blocking(move || s.record_decision(&decision, &meta)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "journaling a stopped attempt failed"),
        Err(e) => tracing::warn!(error = %e, "journaling a stopped attempt failed"),
    }
}
