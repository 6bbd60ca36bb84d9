//! One drain of the scheduler loop: the state a drain carries from one turn to the next, and one
//! method per phase of a turn. `Engine::drain_inner` is the loop over these phases; the order of
//! the phases (and so of the store calls each makes) is the loop's contract.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tidegate_core::rng::SplitMix64;
use tidegate_core::state::{StepEvent, StepStatus};
use tidegate_store::{Change, StepEventRecord, WorkerRecord};
use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::publication::{self, InPublication};
use super::{
    BackfillGate, Dispatch, Engine, GAUGE_EVERY, PoolState, REFRESH_EVERY, REMOTE_POLL, REMOTE_POLL_WHEN_WOKEN, Remote,
    SCHEDULER_GAUGE, Summary, Throughput, class_of,
};
use crate::attempt::Report;
use crate::view::{Dependency, View};
use crate::wake::Wakeups;
use crate::{Error, Result};

/// A step's inputs as (dataset, partition keys), for the readiness checks.
fn external_inputs(inputs: &[tidegate_core::idempotency::PinnedInput]) -> Vec<(String, Vec<String>)> {
    inputs.iter().map(|i| (i.dataset.clone(), i.partitions.clone())).collect()
}

/// Backfills in the view whose steps must not start now: paused, or no longer holding their
/// partitions (their steps wait for an operator, not for this loop).
fn blocked_backfills(view: &View, gates: &HashMap<String, BackfillGate>) -> Vec<String> {
    view.backfill_ids().filter(|b| gates.get(*b).is_none_or(|g| g.paused)).cloned().collect()
}

/// What ended the loop's wait.
enum Woke {
    Report(Report),
    Published(std::result::Result<publication::Outcomes, tokio::task::JoinError>),
    /// A timer, or an attempt elsewhere ended: the next turn looks.
    Timer,
}

/// A step whose upstream is done and which reads an external source that declares a readiness
/// check: looked at in the background, every `poll`, until it is ready or `timeout` passes.
struct SourceWatch {
    /// When the step was first found waiting (it entered `waiting_for_source`); `None` while
    /// the first look is under way.
    since: Option<DateTime<Utc>>,
    /// When to look next.
    next: DateTime<Utc>,
    poll: Duration,
    timeout: Duration,
    /// The look under way.
    look: Option<tokio::task::JoinHandle<Option<crate::source::NotReady>>>,
}

/// How long a turn waits for the source looks it just started.
const SOURCE_LOOK_WAIT: Duration = Duration::from_millis(50);

/// What the publication phase of a turn leaves for the rest of it.
pub(super) struct Publishing {
    /// A publication finished this turn: go round again at once, its downstream may be ready.
    pub(super) published_now: bool,
    /// The earliest moment a validated step held back by the pace may be published.
    pub(super) publish_at: Option<Instant>,
}

/// The scheduler loop's state between turns.
pub(super) struct Drain<'e> {
    engine: &'e Engine,
    view: View,
    pools: HashMap<String, PoolState>,
    jitter: SplitMix64,
    summary: Summary,
    /// Where in-process attempts send their reports.
    tx: mpsc::UnboundedSender<Report>,
    rx: mpsc::UnboundedReceiver<Report>,
    /// In-process attempts not yet reported.
    in_flight: usize,
    correlation: String,
    last_scheduler_renewal: DateTime<Utc>,
    _renewal: Renewal,
    gates: HashMap<String, BackfillGate>,
    /// The pauses in force (issue 34), read with the gates.
    pauses: tidegate_core::pause::Pauses,
    last_refresh: Option<Instant>,
    last_lease_check: Option<Instant>,
    workers: Vec<WorkerRecord>,
    /// Attempts in flight elsewhere: leased to worker processes, or left by an earlier scheduler
    /// (they hold pool slots until they report or their lease expires).
    remote: HashMap<String, Remote>,
    throughput: Throughput,
    last_gauge: Option<Instant>,
    publishing: Option<InPublication>,
    pacer: publication::Pacer,
    /// Attempts that ended in worker processes, announced by the store (on PostgreSQL).
    ended_elsewhere: Wakeups,
    /// Steps waiting for their external sources (or being looked at), by step id.
    sources: HashMap<String, SourceWatch>,
}

impl<'e> Drain<'e> {
    /// Loads the view and counts the attempts found holding leases against their pools.
    pub(super) async fn start(engine: &'e Engine) -> Result<Self> {
        // Before the view is read: an attempt that ends after that read wakes the loop.
        let ended_elsewhere = Wakeups::start(engine.store.clone(), &[Change::AttemptEnded]).await?;
        // Before the view is read too: loading a large view must not let the role lapse.
        let renewal = Renewal::start(engine);
        let only = engine.only_run.clone();
        let view = engine.db(move |s| View::load(s, only.as_deref())).await?;
        let (tx, rx) = mpsc::unbounded_channel::<Report>();
        let mut drain = Drain {
            engine,
            view,
            pools: engine.pools(),
            jitter: SplitMix64::new(engine.opts.seed),
            summary: Summary::default(),
            tx,
            rx,
            in_flight: 0,
            correlation: format!("drain-{}", engine.clock.now().timestamp_millis()),
            last_scheduler_renewal: engine.clock.now(),
            _renewal: renewal,
            gates: HashMap::new(),
            pauses: tidegate_core::pause::Pauses::default(),
            last_refresh: None,
            last_lease_check: None,
            workers: Vec::new(),
            remote: HashMap::new(),
            throughput: Throughput::default(),
            last_gauge: None,
            publishing: None,
            pacer: publication::Pacer::default(),
            ended_elsewhere,
            sources: HashMap::new(),
        };
        // Steps that were waiting for a source when the last drain ended wait on; their timeout
        // counts from when they started waiting.
        let now = engine.clock.now();
        for e in drain.view.in_status(StepStatus::WaitingForSource) {
            if let Some((poll, timeout)) = crate::source::waits(&engine.spec, &external_inputs(&e.record.inputs)) {
                let watch = SourceWatch { since: Some(e.record.updated_at), next: now, poll, timeout, look: None };
                drain.sources.insert(e.record.id.clone(), watch);
            }
        }
        for e in drain.view.entries().filter(|e| e.status().holds_lease()) {
            let class = class_of(e.priority);
            if let Some(p) = drain.pools.get_mut(&e.record.pool) {
                p.running[class] += 1;
            }
            let r = Remote { worker: String::new(), pool: e.record.pool.clone(), class, epoch: e.record.state.epoch };
            drain.remote.insert(e.record.id.clone(), r);
        }
        Ok(drain)
    }

    /// Re-reads backfill gates, runs submitted elsewhere and live workers, every REFRESH_EVERY.
    pub(super) async fn refresh(&mut self, now: DateTime<Utc>) -> Result<()> {
        if self.last_refresh.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return Ok(());
        }
        self.engine.refresh_gates(&mut self.gates).await?;
        self.pauses = self.engine.refresh_pauses().await?;
        // A long-lived server would otherwise hold every step it ever ran.
        self.view.forget_finished_runs();
        self.engine.discover_runs(&mut self.view).await?;
        // A worker that missed two renewals is taken for dead before its leases expire, so the
        // steps they free are not leased to it again.
        let silent_after = chrono::Duration::seconds(2 * i64::from(self.engine.spec.project.heartbeat_s));
        self.workers = self.engine.db(move |s| s.live_workers(now)).await?;
        self.workers.retain(|w| now - w.heartbeat_at <= silent_after);
        self.last_refresh = Some(Instant::now());
        Ok(())
    }

    pub(super) async fn follow_remote(&mut self) -> Result<()> {
        let Drain { engine, remote, view, pools, summary, .. } = self;
        engine.follow_remote(remote, view, pools, summary).await
    }

    /// 1. Reports from finished attempts: settled, and the events of failed ones returned.
    pub(super) async fn absorb_reports(&mut self) -> Result<Vec<StepEventRecord>> {
        let mut reports = Vec::new();
        while let Ok(report) = self.rx.try_recv() {
            reports.push(report);
        }
        self.absorb(reports).await
    }

    async fn absorb(&mut self, reports: Vec<Report>) -> Result<Vec<StepEventRecord>> {
        self.in_flight -= reports.len();
        let mut events = Vec::new();
        let Drain { engine, view, pools, correlation, summary, .. } = self;
        engine.absorb_reports(reports, view, pools, &mut events, correlation, summary).await?;
        Ok(events)
    }

    /// 2. Dependencies: steps whose upstream settled become ready (with their inputs pinned) or
    ///    fail with it.
    pub(super) async fn dependency_events(&mut self) -> Result<Vec<StepEventRecord>> {
        // Every step that becomes ready in this turn pins the same table versions: each table's
        // version is read once per turn, not once per step.
        let mut versions: HashMap<String, Option<u64>> = HashMap::new();
        let mut events = Vec::new();
        let now = self.engine.clock.now();
        let mut code = HashMap::new();
        for (step_id, decision) in self.view.take_dependency_decisions() {
            let refusal = self.view.get(&step_id).and_then(|e| self.engine.code_refusal(e, &mut code));
            let (event, reason) = match (decision, refusal) {
                (Dependency::Failed { upstream }, _) => (StepEvent::UpstreamFailed { upstream }, "upstream settled"),
                // The step would run other code than it was submitted with: it does not start.
                (Dependency::Met, Some(reason)) => {
                    events.push(self.refused(step_id, reason));
                    continue;
                }
                (Dependency::Met, None) => {
                    let inputs = self.view.get(&step_id).map(|e| external_inputs(&e.record.inputs)).unwrap_or_default();
                    if let Some((poll, timeout)) = crate::source::waits(&self.engine.spec, &inputs) {
                        // Ready once its sources are: looked at in the background (`source_events`).
                        let watch = SourceWatch { since: None, next: now, poll, timeout, look: None };
                        self.sources.insert(step_id, watch);
                        continue;
                    }
                    let inputs = self.engine.pin_inputs(&self.view, &step_id, &mut versions).await?;
                    (StepEvent::DepsMet { inputs }, "upstream settled")
                }
            };
            events.push(StepEventRecord { step_id, event, meta: self.engine.meta(reason, &self.correlation) });
        }
        Ok(events)
    }

    /// 2b. Sources: each step waiting for one is looked at in the background every poll; once
    ///     all its sources are ready it becomes ready (its inputs pinned then), the first time one
    ///     is not it waits (`waiting_for_source`, journaled with what was seen), and past its
    ///     timeout it fails saying which source, which partition and what was seen.
    pub(super) async fn source_events(&mut self, now: DateTime<Utc>) -> Result<Vec<StepEventRecord>> {
        if self.sources.is_empty() {
            return Ok(Vec::new());
        }
        let mut events = self.look_at_sources(now).await?;
        // A look at a folder or a table takes milliseconds: waiting a little for the ones just
        // started settles them in this turn instead of the next (up to IDLE_TICK later).
        let deadline = Instant::now() + SOURCE_LOOK_WAIT;
        while Instant::now() < deadline
            && self.sources.values().any(|w| w.look.as_ref().is_some_and(|l| !l.is_finished()))
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if self.sources.values().any(|w| w.look.as_ref().is_some_and(tokio::task::JoinHandle::is_finished)) {
            events.extend(self.look_at_sources(now).await?);
        }
        Ok(events)
    }

    /// One pass over the waiting steps: settles the looks that finished, starts the ones due.
    async fn look_at_sources(&mut self, now: DateTime<Utc>) -> Result<Vec<StepEventRecord>> {
        let mut versions: HashMap<String, Option<u64>> = HashMap::new();
        let mut code = HashMap::new();
        let mut events = Vec::new();
        let ids: Vec<String> = self.sources.keys().cloned().collect();
        for id in ids {
            let status = self.view.get(&id).map(crate::view::Entry::status);
            if !matches!(status, Some(StepStatus::Pending | StepStatus::WaitingForSource)) {
                // Cancelled, superseded or failed upstream meanwhile.
                if let Some(w) = self.sources.remove(&id)
                    && let Some(look) = w.look
                {
                    look.abort();
                }
                continue;
            }
            let Some(watch) = self.sources.get_mut(&id) else { continue };
            let finished = watch.look.as_ref().is_some_and(tokio::task::JoinHandle::is_finished);
            if finished && let Some(look) = watch.look.take() {
                let seen = look.await.unwrap_or_else(|e| {
                    Some(crate::source::NotReady {
                        dataset: String::new(),
                        partition: String::new(),
                        reason: format!("the readiness check stopped: {e}"),
                    })
                });
                match seen {
                    None => {
                        self.sources.remove(&id);
                        let refusal = self.view.get(&id).and_then(|e| self.engine.code_refusal(e, &mut code));
                        if let Some(reason) = refusal {
                            events.push(self.refused(id, reason));
                            continue;
                        }
                        let inputs = self.engine.pin_inputs(&self.view, &id, &mut versions).await?;
                        let meta = self.engine.meta("upstream settled; every source is ready", &self.correlation);
                        events.push(StepEventRecord { step_id: id, event: StepEvent::DepsMet { inputs }, meta });
                        continue;
                    }
                    Some(nr) => {
                        let since = *watch.since.get_or_insert(now);
                        let waited = (now - since).to_std().unwrap_or_default();
                        let what = format!("source {} partition {}: {}", nr.dataset, nr.partition, nr.reason);
                        if status == Some(StepStatus::Pending) {
                            let meta = self.engine.meta(format!("waiting for {what}"), &self.correlation);
                            let event = StepEvent::SourceWaiting {
                                dataset: nr.dataset.clone(),
                                partition: nr.partition.clone(),
                                reason: nr.reason.clone(),
                            };
                            events.push(StepEventRecord { step_id: id.clone(), event, meta });
                        } else if waited >= watch.timeout {
                            let reason = format!(
                                "{what}; not ready after {} s (ready_timeout_s = {}): nothing was run or published",
                                waited.as_secs(),
                                watch.timeout.as_secs()
                            );
                            self.sources.remove(&id);
                            let meta = self.engine.meta(reason.clone(), &self.correlation);
                            events.push(StepEventRecord {
                                step_id: id,
                                event: StepEvent::SourceTimedOut { reason },
                                meta,
                            });
                            continue;
                        }
                        watch.next = now + chrono::Duration::from_std(watch.poll).unwrap_or_default();
                    }
                }
            }
            if watch.look.is_none() && watch.next <= now {
                let inputs = self.view.get(&id).map(|e| external_inputs(&e.record.inputs)).unwrap_or_default();
                let (spec, workspace) = (self.engine.spec.clone(), self.engine.site.workspace.clone());
                watch.look =
                    Some(tokio::spawn(async move { crate::source::first_not_ready(&spec, &workspace, &inputs).await }));
            }
        }
        Ok(events)
    }

    /// A step refused before it starts (it was planned with other code): it fails with `reason`
    /// (the `refused` event).
    fn refused(&self, step_id: String, reason: String) -> StepEventRecord {
        let meta = self.engine.meta(reason.clone(), &self.correlation);
        StepEventRecord { step_id, event: StepEvent::Refused { reason }, meta }
    }

    /// Steps found ready or waiting for a retry when the drain starts (pinned by an earlier
    /// process) that were planned with other code than this engine would run: refused, as
    /// [`Drain::dependency_events`] refuses the steps that become ready.
    pub(super) async fn refuse_changed_code(&mut self) -> Result<()> {
        let mut code = HashMap::new();
        let waiting = self.view.in_statuses(|s| matches!(s, StepStatus::Ready | StepStatus::RetryWait));
        let refused: Vec<(String, String)> = waiting
            .filter_map(|e| self.engine.code_refusal(e, &mut code).map(|reason| (e.record.id.clone(), reason)))
            .collect();
        let events = refused.into_iter().map(|(id, reason)| self.refused(id, reason)).collect();
        self.commit(events).await
    }

    /// 3. Retries that are due, inside the pool's budget. When the budget is spent and nothing in
    ///    flight or ready can earn it back, the retries fail instead of waiting forever: that is
    ///    the retry-storm guard doing its job, and the reason says so.
    pub(super) fn due_retries(&mut self, now: DateTime<Utc>) -> Vec<StepEventRecord> {
        let stalled = self.in_flight == 0 && self.remote.is_empty() && self.view.count(StepStatus::Ready) == 0;
        let spec = &self.engine.spec;
        let mut events = Vec::new();
        for entry in self.view.in_status(StepStatus::RetryWait) {
            if entry.record.state.retry_at.is_none_or(|t| t > now) {
                continue;
            }
            let Some(pool) = self.pools.get_mut(&entry.record.pool) else { continue };
            let (event, reason) = if pool.budget.try_spend() {
                self.summary.retried += 1;
                (StepEvent::RetryDue, "backoff elapsed; the retry budget granted a token".to_owned())
            } else if stalled {
                let reason = format!(
                    "retry budget of pool {:?} spent (retries are capped at {} per first attempt plus a burst of {}); not retrying",
                    entry.record.pool,
                    spec.pools[&entry.record.pool].retry_budget_ratio,
                    spec.pools[&entry.record.pool].retry_budget_burst
                );
                (StepEvent::RetryDenied { reason: reason.clone() }, reason)
            } else {
                continue;
            };
            let meta = self.engine.meta(reason, &self.correlation);
            events.push(StepEventRecord { step_id: entry.record.id.clone(), event, meta });
        }
        events
    }

    /// 4. Leases that expired (a worker died or stopped heartbeating), looked for once per
    ///    REFRESH_EVERY: a lease lives for seconds, so reading the store on every turn of the loop
    ///    (each report, each publication) found nothing new almost every time.
    pub(super) async fn expired_leases(&mut self, now: DateTime<Utc>) -> Result<Vec<StepEventRecord>> {
        if self.last_lease_check.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return Ok(Vec::new());
        }
        self.last_lease_check = Some(Instant::now());
        let expired = self.engine.db(move |s| s.expired_leases(now)).await?;
        let events = expired
            .into_iter()
            .map(|lease| StepEventRecord {
                step_id: lease.step_id.clone(),
                event: StepEvent::LeaseExpired { epoch: lease.epoch, at: now, jitter: self.jitter.next_unit() },
                meta: self
                    .engine
                    .meta(format!("lease of {} expired at {}", lease.worker, lease.expires_at), &self.correlation),
            })
            .collect();
        Ok(events)
    }

    /// The turn's events in group commits.
    pub(super) async fn commit(&mut self, events: Vec<StepEventRecord>) -> Result<()> {
        self.engine.commit(events, &mut self.view, &mut self.summary).await
    }

    /// 5. Claims within slots, shares and rate limits (none once a shutdown was asked for), and
    ///    the local attempts started. Before publication, so that the attempts run while the Delta
    ///    commit is made.
    pub(super) async fn start_attempts(&mut self) -> Result<()> {
        if self.engine.stopping() {
            return Ok(());
        }
        let dispatch = Dispatch { in_flight: self.in_flight, workers: &self.workers, remote: &mut self.remote };
        let engine = self.engine;
        let claimed = engine
            .claim(&mut self.view, &mut self.pools, &mut self.gates, &self.pauses, dispatch, &self.correlation)
            .await?;
        for attempt in claimed {
            self.in_flight += 1;
            let (store, lake, tx, runner) =
                (engine.store.clone(), engine.lake.clone(), self.tx.clone(), engine.runner.clone());
            // Every line the attempt logs carries its run, step and attempt.
            let span = tracing::info_span!(
                "attempt",
                run_id = %attempt.step.run_id,
                step_id = %attempt.step.id,
                step = %attempt.step.name,
                attempt = attempt.lease.attempt,
            );
            tokio::spawn(
                async move {
                    tracing::info!("attempt started");
                    let report = runner.run(attempt, store, lake).await;
                    report.log();
                    let _ = tx.send(report);
                }
                .instrument(span),
            );
        }
        Ok(())
    }

    /// 6. Publication of validated steps, on its own task (see `publication`): a finished one is
    ///    settled, and the steps validated meanwhile start the next. A backfill's steps are
    ///    published together by `backfill publish`, never one by one here. A publication can make
    ///    downstream steps ready; their dependency decisions are taken at the top of the loop, so
    ///    the loop goes round again at once instead of sleeping (each link of a chain used to
    ///    wait out an idle tick here).
    pub(super) async fn publish(&mut self) -> Result<Publishing> {
        let engine = self.engine;
        let mut published_now = false;
        if self.publishing.as_ref().is_some_and(InPublication::is_done) {
            let outcomes = publication::finished(&mut self.publishing).await;
            if let Some(p) = self.publishing.take() {
                engine.finish_publication(p, outcomes, &mut self.view, &mut self.summary, &self.correlation).await?;
                published_now = true;
            }
        }
        let mut publish_at = None;
        if self.publishing.is_none() {
            let (validated, held_until) = engine.publishable(&self.view, &self.pacer);
            publish_at = held_until;
            if !validated.is_empty() {
                let mut guarded = engine.guard_rewrites(validated, &self.view, &self.correlation).await?;
                let refused = std::mem::take(&mut guarded.refused);
                engine.commit(refused, &mut self.view, &mut self.summary).await?;
                if !guarded.allowed.is_empty() {
                    self.publishing = engine.start_publication(guarded, &self.view, &mut self.pacer).await?;
                }
            }
        }
        Ok(Publishing { published_now, publish_at })
    }

    /// Throughput, the scheduler's gauge (every GAUGE_EVERY) and the progress callback.
    pub(super) async fn observe(&mut self, now: DateTime<Utc>) -> Result<()> {
        self.throughput.observe(&self.summary, now);
        if self.last_gauge.is_none_or(|t| t.elapsed() >= GAUGE_EVERY) {
            self.put_gauge(now).await?;
            self.last_gauge = Some(Instant::now());
        }
        if let Some(progress) = &self.engine.progress {
            let tally: BTreeMap<String, usize> =
                self.view.tally().into_iter().map(|(s, n)| (s.to_string(), n)).collect();
            progress(&tally);
        }
        Ok(())
    }

    async fn put_gauge(&self, now: DateTime<Utc>) -> Result<()> {
        let gauge = self.engine.gauge(&self.view, &self.pools, &self.workers, &self.throughput, now);
        self.engine.db(move |s| s.put_metric(SCHEDULER_GAUGE, &gauge, now)).await
    }

    /// Whether the drain is over: nothing in flight or publishing, and nothing left that can move
    /// without a person (or a shutdown was asked for).
    pub(super) fn settled(&self) -> bool {
        self.in_flight == 0
            && self.remote.is_empty()
            && self.publishing.is_none()
            && (self.engine.stopping() || !self.view.has_work_outside(&blocked_backfills(&self.view, &self.gates)))
    }

    /// Renews the scheduler role once per heartbeat; [`Error::SchedulerBusy`] if another process
    /// took it.
    pub(super) async fn renew_scheduler_role(&mut self, now: DateTime<Utc>) -> Result<()> {
        let project = &self.engine.spec.project;
        if now - self.last_scheduler_renewal <= chrono::Duration::seconds(i64::from(project.heartbeat_s)) {
            return Ok(());
        }
        // A process resumed after another took the role and gave it up takes it again here and
        // goes on; what it writes from before is fenced by epochs (RELIABILITY, known gaps).
        let (o, ttl) = (self.engine.opts.worker_id.clone(), project.lease_ttl_s);
        if !self.engine.db(move |s| s.acquire_scheduler(&o, now, ttl)).await? {
            return Err(Error::SchedulerBusy);
        }
        self.last_scheduler_renewal = now;
        Ok(())
    }

    /// 7. Sleeps until an attempt reports, the publication finishes, an attempt in a worker
    ///    process ends (where the store announces it) or a timer is due, and settles what woke
    ///    it. Attempts elsewhere are followed through the store: every [`REMOTE_POLL`] where
    ///    nothing announces their end, every [`REMOTE_POLL_WHEN_WOKEN`] as a safety net where
    ///    something does.
    pub(super) async fn wait(&mut self, now: DateTime<Utc>, publish_at: Option<Instant>) -> Result<()> {
        let mut wait = self.engine.next_wake(&self.view, &self.pools, now);
        let following = !self.remote.is_empty();
        if following {
            wait = wait.min(if self.ended_elsewhere.wakes() { REMOTE_POLL_WHEN_WOKEN } else { REMOTE_POLL });
        }
        if let Some(at) = publish_at {
            wait = wait.min(at.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)));
        }
        let woke = tokio::select! {
            Some(report) = self.rx.recv() => Woke::Report(report),
            outcomes = publication::finished(&mut self.publishing) => Woke::Published(outcomes),
            () = self.ended_elsewhere.changed(), if following => Woke::Timer,
            () = tokio::time::sleep(wait) => Woke::Timer,
            // A shutdown asked for: the drain stops claiming at once, not at its next wake-up.
            () = self.engine.stop.cancelled(), if !self.engine.stopping() => Woke::Timer,
        };
        match woke {
            Woke::Report(report) => {
                let mut reports = vec![report];
                while let Ok(report) = self.rx.try_recv() {
                    reports.push(report);
                }
                let events = self.absorb(reports).await?;
                self.commit(events).await?;
            }
            Woke::Published(outcomes) => {
                if let Some(p) = self.publishing.take() {
                    let engine = self.engine;
                    engine
                        .finish_publication(p, outcomes, &mut self.view, &mut self.summary, &self.correlation)
                        .await?;
                }
            }
            Woke::Timer => {}
        }
        Ok(())
    }

    /// The summary, with a last gauge describing where the drain left things.
    pub(super) async fn finish(mut self) -> Result<Summary> {
        self.summary.awaiting_approval = self.view.count(StepStatus::AwaitingApproval);
        let now = self.engine.clock.now();
        self.throughput.observe(&self.summary, now);
        self.put_gauge(now).await?;
        Ok(self.summary)
    }
}

/// Renews the scheduler role every heartbeat on a task of its own while a drain runs, so that a
/// long turn (loading or committing a hundred thousand steps) does not let the role lapse and a
/// standby take it from a scheduler that is working. A process that is frozen renews nothing, as
/// before. It only ever renews (`Store::renew_scheduler`): once the role is another's, it stops,
/// and the drain's own check at its next turn decides.
struct Renewal {
    task: tokio::task::JoinHandle<()>,
}

impl Renewal {
    fn start(engine: &super::Engine) -> Self {
        let (store, clock, owner) = (engine.store.clone(), engine.clock.clone(), engine.opts.worker_id.clone());
        let every = Duration::from_secs(u64::from(engine.spec.project.heartbeat_s));
        let ttl = engine.spec.project.lease_ttl_s;
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let (s, o, now) = (store.clone(), owner.clone(), clock.now());
                // Renewed, or the store is away for now and the next beat tries again; or lost.
                if let Ok(Ok(false)) = tokio::task::spawn_blocking(move || s.renew_scheduler(&o, now, ttl)).await {
                    return;
                }
            }
        });
        Self { task }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.task.abort();
    }
}
