//! A worker process (`tidegate worker`): runs the attempts the scheduler leased in its name, and
//! nothing else. It registers its slots in the store and renews the registration; it looks for
//! leases in its name when the store announces a lease ([`tidegate_store::Change::StepLeased`], on PostgreSQL)
//! and otherwise every [`POLL_EVERY`] (SQLite) or [`POLL_EVERY_WHEN_WOKEN`] (a safety net where
//! leases are announced), runs each attempt (heartbeating the lease as any attempt does), and
//! writes the outcome itself (staged versions, then the checks' verdict, or the failure), fenced
//! by the lease epoch. It never promotes, retries or publishes: those stay with the single
//! scheduler. An attempt whose step is cancelled meanwhile is stopped here, its processes killed
//! (`cancel`): the worker learns of the cancel through the store.
//!
//! It shares nothing with the scheduler but the store and the lake: attempts write their output,
//! logs and checkpoint files in the worker's own working folder ([`Site::work_dir`]), read their
//! inputs from the lake, stage into the lake, and copy their logs to the lake for `tidegate logs`
//! on any machine.
//!
//! A worker that dies stops heartbeating: its leases expire, the scheduler retries the attempts
//! elsewhere, and whatever the dead worker might still write is rejected by the epoch. A worker
//! whose store goes away (restarted, connections cut) waits for it and goes on.
//!
//! A name belongs to one live process: a worker started with a name another live worker holds is
//! refused at start ([`tidegate_store::Error::WorkerNameTaken`], naming the holder's host and
//! pid), and one that finds its name taken over (its registration lapsed while it was cut off)
//! stops. Each lease in the name is taken by one process only ([`Store::take_leases`]), so even
//! two processes under one name never run an attempt twice.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidegate_core::clock::Clock;
use tidegate_core::spec::Spec;
use tidegate_lake::Lake;
use tidegate_store::{JournalMeta, Lease, Outcome, StagedRecord, StepRecord, Store, WorkerIdentity};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::attempt::{self, Report, Site};
use crate::wake::Wakeups;
use crate::{Error, Result};

/// How often a worker looks for new leases in its name on a store that does not announce them.
pub const POLL_EVERY: Duration = Duration::from_millis(100);
/// How often it looks anyway on a store that announces leases: a lease announced while the
/// worker's listener was reconnecting is found within this, well inside a lease's life.
pub const POLL_EVERY_WHEN_WOKEN: Duration = Duration::from_secs(5);
/// How often a stopping worker looks at its attempts (each one that ends wakes it too).
const STOP_POLL: Duration = Duration::from_millis(200);
/// The first and the longest pause before a store call the store could not make is made again.
const STORE_RETRY_FIRST: Duration = Duration::from_millis(100);
const STORE_RETRY_MAX: Duration = Duration::from_secs(5);

/// What a worker did before it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkerSummary {
    /// Attempts that staged output.
    pub staged: usize,
    /// Attempts that failed.
    pub failed: usize,
    /// Outcomes the store refused because the lease had moved on (fenced).
    pub rejected: usize,
    /// Attempts stopped because their steps were cancelled.
    pub stopped: usize,
}

/// One worker process.
pub struct Worker {
    store: Arc<dyn Store>,
    lake: Arc<Lake>,
    spec: Arc<Spec>,
    site: Site,
    clock: Arc<dyn Clock>,
    /// The worker's name (`identity.name`), as leases and the journal know it.
    id: String,
    identity: WorkerIdentity,
    seed: u64,
    stop: CancellationToken,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("identity", &self.identity).finish_non_exhaustive()
    }
}

impl Worker {
    #[allow(
        clippy::too_many_arguments,
        reason = "each is a separate collaborator the caller owns; a builder would only rename them"
    )]
    /// A worker over the store and lake, running attempts at `site`, registered as `identity`
    /// (its name, its process and its attempt slots).
    pub fn new(
        store: Arc<dyn Store>,
        lake: Arc<Lake>,
        spec: Arc<Spec>,
        site: Site,
        clock: Arc<dyn Clock>,
        identity: WorkerIdentity,
        stop: CancellationToken,
    ) -> Self {
        Self { store, lake, spec, site, clock, id: identity.name.clone(), identity, seed: 0x5eed, stop }
    }

    /// Runs a store call off the runtime's threads. A call the store could not make for now (the
    /// database restarting, a connection cut) is made again, backing off, until it succeeds: a
    /// worker outlives an outage of its store instead of exiting and leaving its attempts
    /// unreported. A stopping worker tries for one lease time at most (its leases are gone by
    /// then), then gives up with the error.
    async fn db<T: Send + 'static>(
        &self,
        f: impl Fn(&dyn Store) -> tidegate_store::Result<T> + Send + Sync + 'static,
    ) -> Result<T> {
        let f = Arc::new(f);
        let mut backoff = STORE_RETRY_FIRST;
        let mut stopping_since: Option<Instant> = None;
        loop {
            let (store, call) = (self.store.clone(), f.clone());
            let result = tokio::task::spawn_blocking(move || call(store.as_ref()))
                .await
                .map_err(|e| Error::Internal(e.to_string()))?;
            let e = match result {
                Err(e @ tidegate_store::Error::Unavailable(_)) => e,
                other => return other.map_err(Error::Store),
            };
            if self.stop.is_cancelled() {
                let since = *stopping_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(u64::from(self.spec.project.lease_ttl_s)) {
                    return Err(Error::Store(e));
                }
            }
            tracing::warn!(worker = self.id, error = %e, retry_in_ms = backoff.as_millis(), "the store is unavailable; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(STORE_RETRY_MAX);
        }
    }

    fn meta(&self, reason: String, correlation_id: &str) -> JournalMeta {
        JournalMeta {
            actor: self.id.clone(),
            correlation_id: correlation_id.to_owned(),
            reason,
            at: self.clock.now(),
            via: None,
        }
    }

    async fn register(&self) -> Result<()> {
        let (identity, now, ttl) = (self.identity.clone(), self.clock.now(), self.spec.project.lease_ttl_s);
        self.db(move |s| s.register_worker(&identity, now, ttl)).await
    }

    /// Runs until its stop token is cancelled, then lets the attempts in flight finish, deregisters and
    /// returns.
    pub async fn run(&self) -> Result<WorkerSummary> {
        // Watching before the first look for leases: a lease made after that look wakes it.
        let mut leased = Wakeups::leases_of(self.store.clone(), &self.identity.name).await?;
        let poll_every = if leased.wakes() { POLL_EVERY_WHEN_WOKEN } else { POLL_EVERY };
        self.register().await?;
        let mut summary = WorkerSummary::default();
        let mut last_registration = Instant::now();
        let renew_every = Duration::from_secs(u64::from(self.spec.project.heartbeat_s));
        let mut next_look = Instant::now();
        // The attempts running here, by (step, epoch), with their runs' ids.
        let mut running: HashMap<(String, u64), String> = HashMap::new();
        let (tx, mut rx) = mpsc::unbounded_channel::<(Lease, Report)>();
        loop {
            let mut ended = Vec::new();
            while let Ok(report) = rx.try_recv() {
                ended.push(report);
            }
            self.settle(ended, &mut running, &mut summary).await?;
            let stopping = self.stop.is_cancelled();
            if stopping && running.is_empty() {
                break;
            }
            if last_registration.elapsed() >= renew_every {
                self.register().await?;
                last_registration = Instant::now();
            }
            if !stopping && Instant::now() >= next_look {
                next_look = Instant::now() + poll_every;
                self.start_leased(&mut running, &tx).await?;
            }
            // A stopping worker looks for no lease: it only waits for its attempts to report.
            let look = if stopping { STOP_POLL } else { next_look.saturating_duration_since(Instant::now()) };
            let wait = look.min(renew_every.saturating_sub(last_registration.elapsed()));
            tokio::select! {
                // Settled at the top of the next turn, with any other attempt ended by then.
                Some(report) = rx.recv() => {
                    self.settle(vec![report], &mut running, &mut summary).await?;
                }
                () = leased.changed() => next_look = Instant::now(),
                () = tokio::time::sleep(wait) => {}
                // Told to stop: no new lease is looked for from the next turn on.
                () = self.stop.cancelled(), if !stopping => {}
            }
        }
        let (identity, now) = (self.identity.clone(), self.clock.now());
        self.db(move |s| s.deregister_worker(&identity, now)).await?;
        Ok(summary)
    }

    /// Starts the attempts of the leases in this worker's name that no process has taken yet.
    async fn start_leased(
        &self,
        running: &mut HashMap<(String, u64), String>,
        tx: &mpsc::UnboundedSender<(Lease, Report)>,
    ) -> Result<()> {
        let identity = self.identity.clone();
        // The leases taken and their steps, in one trip to the store: one query for every step,
        // not one per lease (issue 35).
        let (leases, steps) = self
            .db(move |s| {
                let leases = s.take_leases(&identity)?;
                let ids: Vec<String> = leases.iter().map(|l| l.step_id.clone()).collect();
                let steps = if ids.is_empty() { Vec::new() } else { s.steps_by_id(&ids)? };
                Ok((leases, steps))
            })
            .await?;
        let mut steps: HashMap<String, StepRecord> = steps.into_iter().map(|s| (s.id.clone(), s)).collect();
        for lease in leases {
            let key = (lease.step_id.clone(), lease.epoch);
            let step = steps.remove(&lease.step_id);
            if let Entry::Vacant(slot) = running.entry(key)
                && let Some(step) = step
            {
                slot.insert(step.run_id.clone());
                self.start(lease, step, tx.clone()).await?;
            }
        }
        Ok(())
    }

    /// Starts the attempt `lease` names on `step`, on its own task; a retry first reads the
    /// checkpoint it resumes from.
    async fn start(&self, lease: Lease, step: StepRecord, tx: mpsc::UnboundedSender<(Lease, Report)>) -> Result<()> {
        let sid = lease.step_id.clone();
        let resume_from = if lease.may_resume() { self.db(move |s| s.last_checkpoint(&sid)).await? } else { None };
        let epoch = lease.epoch;
        let Some(attempt) =
            attempt::prepare(&self.spec, &self.site, step, lease.clone(), resume_from, self.clock.clone())
        else {
            let report = Report::Failed {
                step_id: lease.step_id.clone(),
                epoch,
                class: tidegate_core::retry::ErrorClass::Deterministic,
                reason: format!(
                    "worker {} runs a spec without this step's task; start workers on the scheduler's tidegate.toml",
                    self.id
                ),
                ended_at: self.clock.now(),
            };
            let _ = tx.send((lease, report));
            return Ok(());
        };
        let (store, lake) = (self.store.clone(), self.lake.clone());
        tokio::spawn(async move {
            let report = attempt::run(attempt, store, lake).await;
            let _ = tx.send((lease, report));
        });
        Ok(())
    }

    /// Writes the outcomes of the attempts that ended: every staged one in one transaction
    /// (each fenced by its epoch, its checks' verdict applied only if it is accepted), then each
    /// failure. One write for the attempts that end together, not one each (issue 35).
    async fn settle(
        &self,
        ended: Vec<(Lease, Report)>,
        running: &mut HashMap<(String, u64), String>,
        summary: &mut WorkerSummary,
    ) -> Result<()> {
        let mut staged = Vec::new();
        let mut reported = Vec::new();
        for (lease, report) in ended {
            let Some(run_id) = running.remove(&(lease.step_id.clone(), lease.epoch)) else { continue };
            if matches!(report, Report::Stopped { .. }) {
                // Journaled by the attempt; the step is cancelled already.
                summary.stopped += 1;
                continue;
            }
            let failed = matches!(report, Report::Failed { .. });
            let settlement = attempt::settle(report, lease.attempt, self.seed, &|reason| self.meta(reason, &run_id));
            match settlement.staged {
                Some((step_id, epoch, versions)) => {
                    let meta = self.meta(format!("staged {} rows", settlement.n_rows), &run_id);
                    // The check results follow in the same transaction, applied only if it is accepted.
                    staged.push(StagedRecord { step_id, epoch, versions, meta, then: settlement.events });
                }
                None => reported.push((failed, settlement.events)),
            }
        }
        if !staged.is_empty() {
            for outcome in self.db(move |s| s.record_staged_many(&staged)).await? {
                if matches!(outcome, Outcome::Rejected { .. }) {
                    summary.rejected += 1;
                } else {
                    summary.staged += 1;
                }
            }
        }
        for (failed, events) in reported {
            let outcomes = self.db(move |s| s.commit(&events)).await?;
            if outcomes.iter().any(|o| matches!(o, Outcome::Rejected { .. })) {
                summary.rejected += 1;
            } else if failed {
                summary.failed += 1;
            } else {
                summary.staged += 1;
            }
        }
        Ok(())
    }
}
