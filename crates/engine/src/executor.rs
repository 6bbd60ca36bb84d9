//! The scheduler loop: promotes steps whose upstream published, starts attempts within pool slots,
//! rate limits and priority shares, turns attempt reports into events, publishes validated steps,
//! retries transient failures inside each pool's retry budget, and expires dead leases. Every
//! state change goes through the store in group commits.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tidegate_core::clock::Clock;
use tidegate_core::idempotency::PinnedInput;
use tidegate_core::pause::{Pausable, PausedClass, Pauses};
use tidegate_core::retry::{ErrorClass, RetryBudget};
use tidegate_core::schedule::{self, ClassLoad, RateLimit, Shares};
use tidegate_core::spec::{DatasetKind, Spec};
use tidegate_core::state::{RunStatus, StepStatus};
use tidegate_lake::Lake;
use tidegate_store::{
    BackfillStatus, ClaimRequest, Claimed, Decision, JournalMeta, Outcome, Priority, StagedRecord, StepEventRecord,
    Store, WorkerRecord,
};
use tokio_util::sync::CancellationToken;

use crate::attempt::{self, Attempt, Report};
use crate::view::{self, View};
use crate::{Error, Result};

mod drain;
mod publication;
use drain::Drain;

/// The most events one group commit holds.
pub const MAX_EVENTS_PER_COMMIT: usize = 2_000;
/// The most steps claimed in one transaction.
pub const MAX_CLAIMS_PER_TICK: usize = 512;
/// How many recent backfills and runs the loop watches for changes made by other processes.
const BACKFILLS_WATCHED: u32 = 200;
const RUNS_WATCHED: u32 = 50;

/// How often the loop looks for expired leases and due retries when nothing else wakes it.
pub const IDLE_TICK: Duration = Duration::from_millis(250);

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Names this process in leases and the journal.
    pub worker_id: String,
    /// Attempts this process runs at once, whatever the pools allow.
    pub max_parallel: usize,
    /// Guaranteed minimum shares for catch-up and backfill work.
    pub shares: Shares,
    /// Seed for backoff jitter, so a test can reproduce a schedule.
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            worker_id: format!("worker-{}", std::process::id()),
            max_parallel: 4,
            shares: Shares::default(),
            seed: 0x5eed,
        }
    }
}

/// What a drain did, for the summary line.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Steps published.
    pub published: usize,
    /// Steps that failed.
    pub failed: usize,
    /// Steps skipped or superseded.
    pub skipped: usize,
    /// Retries scheduled.
    pub retried: usize,
    /// Reports the store refused (fenced or illegal).
    pub rejected: usize,
    /// Steps stopped at staged output, waiting for approval.
    pub awaiting_approval: usize,
    /// Delivered rows appends published no copy of: their `dedup_key` was already published or
    /// earlier in the delivery (0 when this process only followed the run).
    pub duplicates_dropped: u64,
    /// Delivered rows merges ignored as late: the table held a newer row of their key by
    /// `order_by` (0 when this process only followed the run).
    pub late_rows_ignored: u64,
}

impl Summary {
    /// What a run's steps add up to, for a process that followed a run another process executed.
    pub fn of_steps(steps: &[tidegate_store::StepRecord]) -> Summary {
        let mut summary = Summary::default();
        for step in steps {
            summary.count(step.status());
            if step.status() == StepStatus::AwaitingApproval {
                summary.awaiting_approval += 1;
            }
            summary.retried += step.state.attempt.saturating_sub(1) as usize;
        }
        summary
    }

    /// Counts a step that reached `status` (non-final statuses count nowhere).
    fn count(&mut self, status: StepStatus) {
        match status {
            StepStatus::Published => self.published += 1,
            StepStatus::Failed | StepStatus::UpstreamFailed => self.failed += 1,
            StepStatus::Skipped | StepStatus::Superseded => self.skipped += 1,
            _ => {}
        }
    }
}

/// Progress for a terminal or a log: counts per status after each tick.
pub type ProgressFn = Box<dyn Fn(&BTreeMap<String, usize>) + Send + Sync>;

/// Per-pool limits and budgets.
#[derive(Debug)]
struct PoolState {
    slots: u32,
    running: [u32; 3],
    rate: RateLimit,
    budget: RetryBudget,
}

/// A backfill's limits as the scheduler applies them, refreshed from the store while draining so
/// that `backfill pause` and a changed throttle take effect within a second.
#[derive(Debug)]
struct BackfillGate {
    paused: bool,
    max_active: u32,
    rate: RateLimit,
}

/// The name of the scheduler's gauge in the store's metrics.
pub const SCHEDULER_GAUGE: &str = "scheduler";
/// How often the scheduler writes its gauge.
const GAUGE_EVERY: Duration = Duration::from_secs(1);
/// The window recent throughput is measured over.
const THROUGHPUT_WINDOW_S: i64 = 60;

/// Steps settled (published, failed, skipped) recently, for the backlog's ETA.
#[derive(Debug, Default)]
struct Throughput {
    /// When the drain started, and the settled count seen at each observation.
    started: Option<DateTime<Utc>>,
    settled: usize,
    events: std::collections::VecDeque<(DateTime<Utc>, usize)>,
}

impl Throughput {
    fn observe(&mut self, summary: &Summary, now: DateTime<Utc>) {
        self.started.get_or_insert(now);
        let settled = summary.published + summary.failed + summary.skipped;
        if settled > self.settled {
            self.events.push_back((now, settled - self.settled));
            self.settled = settled;
        }
        while self.events.front().is_some_and(|(t, _)| now - *t > chrono::Duration::seconds(THROUGHPUT_WINDOW_S)) {
            self.events.pop_front();
        }
    }

    /// Steps settled per second over the window (or since the drain began, if more recent).
    fn per_s(&self, now: DateTime<Utc>) -> Option<f64> {
        let started = self.started?;
        let span = (now - started).min(chrono::Duration::seconds(THROUGHPUT_WINDOW_S));
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let span_s = span.num_milliseconds() as f64 / 1000.0;
        if span_s < 1.0 {
            return None;
        }
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let n = self.events.iter().map(|(_, n)| n).sum::<usize>() as f64;
        Some(n / span_s)
    }
}

/// How often the loop re-reads the steps of attempts in flight in worker processes, on a store
/// that does not announce their end.
const REMOTE_POLL: Duration = Duration::from_millis(50);
/// How often it re-reads them anyway on a store that announces their end (PostgreSQL), in case
/// an announcement was lost; the loop's own timers ([`IDLE_TICK`]) usually come first.
const REMOTE_POLL_WHEN_WOKEN: Duration = Duration::from_secs(1);

/// Where claimed attempts can run: this process's slots not in use, and live worker processes.
struct Dispatch<'a> {
    in_flight: usize,
    workers: &'a [WorkerRecord],
    remote: &'a mut HashMap<String, Remote>,
}

/// How often the loop re-reads backfill gates and looks for runs submitted by other processes.
const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// An attempt leased to a worker process (or found holding a lease when the drain started): the
/// scheduler follows it through the store instead of a report.
#[derive(Debug, Clone)]
struct Remote {
    /// The worker it was leased to; empty for one found at start-up.
    worker: String,
    pool: String,
    class: usize,
    epoch: u64,
}

/// `max_active_runs` as the scheduler applies it when it claims: a task's catch-up step may
/// start only while fewer than `max_active_runs` of the task's scheduled intervals (its schedule
/// and catch-up runs' steps) are active, that is claimed once and not yet settled
/// ([`crate::view::Entry::is_active`]). Live intervals are never held back, but they count, so
/// after downtime the journal shows at most that many of the task's intervals at once (a new live
/// interval arriving mid-catch-up can add one). Manual runs and backfills do not count.
struct CatchupRoom<'s> {
    spec: &'s Spec,
    /// Active scheduled intervals per task; empty when no catch-up step is ready.
    active: HashMap<String, u32>,
}

impl<'s> CatchupRoom<'s> {
    fn new(spec: &'s Spec, view: &View) -> Self {
        let active = if view.has_ready(Priority::Catchup) { view.scheduled_active() } else { HashMap::new() };
        Self { spec, active }
    }

    /// Whether the catch-up step may be claimed now; counts it as active if so.
    fn admit(&mut self, e: &crate::view::Entry) -> bool {
        let Some(max) = self.spec.tasks.get(&e.record.task).and_then(|t| t.catchup.max_active_runs) else {
            return true;
        };
        if e.is_active() {
            // A retry of an interval already counted.
            return true;
        }
        let n = self.active.entry(e.record.task.clone()).or_default();
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }
}

/// The engine: one scheduler loop with in-process workers.
pub struct Engine {
    store: Arc<dyn Store>,
    lake: Arc<Lake>,
    spec: Arc<Spec>,
    site: attempt::Site,
    clock: Arc<dyn Clock>,
    opts: Options,
    progress: Option<ProgressFn>,
    /// Set by a shutdown request: start nothing new, let in-flight attempts finish, return.
    stop: CancellationToken,
    /// Runs each claimed attempt ([`attempt::TaskRunner`] unless replaced).
    runner: Arc<dyn attempt::Runner>,
    /// When set, the only run this engine executes; other unfinished runs wait for another drain.
    only_run: Option<String>,
    /// With `only_run`: runs created at or after this instant are executed too (live work
    /// submitted while this engine runs, whose submitters follow it), not the queue from before.
    also_since: Option<DateTime<Utc>>,
    /// Whether a step runs and publishes only the code it was planned with (decision 0020).
    code_check: bool,
    /// Publications failing with an error worth retrying (a full disk, an unreachable store),
    /// so that the first failure and then one in [`publication::TROUBLE_EVERY`] are logged.
    trouble: std::sync::Mutex<publication::Trouble>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("site", &self.site).field("opts", &self.opts).finish_non_exhaustive()
    }
}

/// The pausable class of a priority (live work is paused by task or pool, not as a class).
fn paused_class(p: Priority) -> Option<PausedClass> {
    match p {
        Priority::Live => None,
        Priority::Catchup => Some(PausedClass::Catchup),
        Priority::Backfill => Some(PausedClass::Backfill),
    }
}

fn class_of(p: Priority) -> usize {
    match p {
        Priority::Live => 0,
        Priority::Catchup => 1,
        Priority::Backfill => 2,
    }
}

/// Takes the scheduler role for `owner`, waiting out a holder that stopped renewing it (a crashed
/// process holds it until its TTL passes); [`Error::SchedulerBusy`] after twice the TTL. Anything
/// that publishes outside a drain (a backfill release, a rollback) takes the role this way too.
pub async fn acquire_scheduler_role(store: &Arc<dyn Store>, owner: &str, clock: &dyn Clock, ttl_s: u32) -> Result<()> {
    let give_up = std::time::Instant::now() + Duration::from_secs(u64::from(ttl_s) * 2 + 1);
    loop {
        let (s, o, now) = (store.clone(), owner.to_owned(), clock.now());
        let acquired = tokio::task::spawn_blocking(move || s.acquire_scheduler(&o, now, ttl_s))
            .await
            .map_err(|e| Error::Internal(e.to_string()))??;
        if acquired {
            return Ok(());
        }
        if std::time::Instant::now() >= give_up {
            return Err(Error::SchedulerBusy);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Engine {
    #[allow(
        clippy::too_many_arguments,
        reason = "each is a separate collaborator the caller owns; a builder would only rename them"
    )]
    /// An engine over a store and a lake for `spec`, run from `workspace`, on `clock`.
    pub fn new(
        store: Arc<dyn Store>,
        lake: Arc<Lake>,
        spec: Arc<Spec>,
        workspace: PathBuf,
        lake_uri: String,
        clock: Arc<dyn Clock>,
        opts: Options,
    ) -> Self {
        let runner = Arc::new(attempt::TaskRunner);
        let site = attempt::Site::new(workspace, lake_uri);
        let trouble = std::sync::Mutex::default();
        Self {
            store,
            lake,
            spec,
            site,
            clock,
            opts,
            progress: None,
            stop: CancellationToken::new(),
            runner,
            only_run: None,
            also_since: None,
            code_check: false,
            trouble,
        }
    }

    /// Runs attempts with `runner` instead of the task's command or SQL (a benchmark's no-op).
    pub fn with_runner(mut self, runner: Arc<dyn attempt::Runner>) -> Self {
        self.runner = runner;
        self
    }

    /// Names this engine in the scheduler role, leases and the journal (instead of
    /// `worker-<pid>`).
    #[must_use]
    pub fn with_owner(mut self, owner: String) -> Self {
        self.opts.worker_id = owner;
        self
    }

    /// A flag that, once set, makes `drain` start no new attempt and return when the attempts in
    /// flight have reported (a clean shutdown on SIGTERM).
    pub fn with_stop(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    fn stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Executes only `run_id`: the other unfinished runs in the store wait for a drain of
    /// everything (`tidegate serve`, or a `run` asked to execute the queue too).
    #[must_use]
    pub fn with_only_run(mut self, run_id: &str) -> Self {
        self.only_run = Some(run_id.to_owned());
        self
    }

    /// With [`Engine::with_only_run`]: also executes the runs submitted at or after `since` (live
    /// work arriving while this engine holds the scheduler role, whose `run` commands follow it
    /// instead of executing), but none of the runs queued before (decision 0020).
    #[must_use]
    pub fn with_runs_submitted_since(mut self, since: DateTime<Utc>) -> Self {
        self.also_since = Some(since);
        self
    }

    /// Runs and publishes a step only when its task's code now (the spec this engine was given,
    /// the declared files on disk) is the code version the step was planned with; a step planned
    /// with other code fails (`refused`) with a reason naming both versions and what to do instead
    /// (decision 0020), and a publication replacing a partition that other code published is
    /// refused unless its dataset says `rewrites = "free"`. Off for engines driven by tests of the
    /// loop on made-up steps.
    #[must_use]
    pub fn with_code_check(mut self) -> Self {
        self.code_check = true;
        self
    }

    /// Why the step `entry` must not run the code this engine would run for it now, if it must
    /// not. `cache` holds each task's current code version for the caller's turn.
    fn code_refusal(&self, entry: &crate::view::Entry, cache: &mut HashMap<String, Option<String>>) -> Option<String> {
        if !self.code_check {
            return None;
        }
        let record = &entry.record;
        let planned = record.code_version.as_deref()?;
        let current = cache.entry(record.task.clone()).or_insert_with(|| {
            // A declared file that cannot be read fails the attempt itself, with its reason.
            crate::code::version_of(&self.spec, &self.site.workspace, &record.task).and_then(Result::ok)
        });
        let backfill = entry.backfill_id.as_deref();
        crate::code::refusal(&record.task, &record.partition, planned, current.as_deref()?, backfill)
    }

    /// Whether this engine executes the run `run_id`, created at `created_at`.
    fn executes(&self, run_id: &str, created_at: DateTime<Utc>) -> bool {
        self.only_run.as_deref().is_none_or(|only| only == run_id) || self.also_since.is_some_and(|t| created_at >= t)
    }

    /// Tells `f` the steps by status as they change.
    pub fn with_progress(mut self, f: ProgressFn) -> Self {
        self.progress = Some(f);
        self
    }

    fn meta(&self, reason: impl Into<String>, correlation_id: &str) -> JournalMeta {
        JournalMeta {
            via: None,
            actor: self.opts.worker_id.clone(),
            correlation_id: correlation_id.to_owned(),
            reason: reason.into(),
            at: self.clock.now(),
        }
    }

    async fn db<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> tidegate_store::Result<T> + Send + 'static,
    ) -> Result<T> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(store.as_ref()))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(Error::Store)
    }

    /// Runs every unfinished run in the store until nothing more can move without a person
    /// (everything is published, failed, or waiting for a backfill approval).
    pub async fn drain(&self) -> Result<Summary> {
        let owner = self.opts.worker_id.clone();
        self.acquire_scheduler_role().await?;
        let result = self.drain_inner().await;
        let o = owner.clone();
        let _ = self.db(move |s| s.release_scheduler(&o)).await;
        result
    }

    /// Runs until `run_id` settles: drains everything when this process can take the scheduler
    /// role; otherwise another process (a `serve`, a backfill, another `run`) is executing, so this
    /// one follows the run's progress in the store, and takes over if that holder dies.
    pub async fn drain_until(&self, run_id: &str) -> Result<Summary> {
        loop {
            let (o, now, ttl) = (self.opts.worker_id.clone(), self.clock.now(), self.spec.project.lease_ttl_s);
            if self.db(move |s| s.acquire_scheduler(&o, now, ttl)).await? {
                let result = self.drain_inner().await;
                let o = self.opts.worker_id.clone();
                let _ = self.db(move |s| s.release_scheduler(&o)).await;
                return result;
            }
            let rid = run_id.to_owned();
            let run = self.db(move |s| s.run(&rid)).await?;
            let rid = run_id.to_owned();
            let steps = self.db(move |s| s.steps(&rid)).await?;
            let mut tally: BTreeMap<String, usize> = BTreeMap::new();
            for step in &steps {
                *tally.entry(step.status().to_string()).or_default() += 1;
            }
            if let Some(progress) = &self.progress {
                progress(&tally);
            }
            let settled = run.is_none_or(|r| r.status.is_terminal() || r.status == RunStatus::AwaitingApproval);
            if settled {
                return Ok(Summary::of_steps(&steps));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Takes the scheduler role if it is free or its holder's lease expired, or renews it if this
    /// engine holds it; false when another process holds it. For a long-lived scheduler that
    /// keeps the role between drains ([`Engine::drain_holding_role`]) and stands by without it.
    pub async fn try_scheduler_role(&self) -> Result<bool> {
        let (o, now, ttl) = (self.opts.worker_id.clone(), self.clock.now(), self.spec.project.lease_ttl_s);
        self.db(move |s| s.acquire_scheduler(&o, now, ttl)).await
    }

    /// Drains like [`Engine::drain`], for a caller that already holds the scheduler role (see
    /// [`Engine::try_scheduler_role`]) and keeps it afterwards. [`Error::SchedulerBusy`] if another
    /// process took it meanwhile (this one went unrenewed past its lease: stopped or cut off);
    /// that is journaled, and nothing more is started or published.
    pub async fn drain_holding_role(&self) -> Result<Summary> {
        self.drain_inner().await
    }

    /// Gives up the scheduler role, if this engine holds it.
    pub async fn give_up_scheduler_role(&self) -> Result<()> {
        let o = self.opts.worker_id.clone();
        self.db(move |s| s.release_scheduler(&o)).await
    }

    /// Journals that this engine found the scheduler role taken by another process while it
    /// meant to hold it (`scheduler_stepped_down`), and so stepped down.
    pub async fn record_stepped_down(&self) -> Result<()> {
        let decision = Decision {
            kind: "scheduler_stepped_down".to_owned(),
            run_id: None,
            task: None,
            partition: None,
            payload: serde_json::json!({ "owner": self.opts.worker_id }),
        };
        let meta = self.meta(
            "another scheduler took the role while this one went unrenewed past its lease; nothing more is started \
             or published here",
            "scheduler-role",
        );
        self.db(move |s| s.record_decision(&decision, &meta)).await.map(|_| ())
    }

    /// Takes the scheduler role, waiting out a holder that stopped renewing it (a crashed process
    /// holds it until its lease TTL passes).
    async fn acquire_scheduler_role(&self) -> Result<()> {
        acquire_scheduler_role(&self.store, &self.opts.worker_id, self.clock.as_ref(), self.spec.project.lease_ttl_s)
            .await
    }

    /// The scheduler loop: one turn after another until the drain is settled (see [`Drain`] for
    /// what each phase does).
    async fn drain_inner(&self) -> Result<Summary> {
        let mut drain = Drain::start(self).await?;
        drain.refuse_changed_code().await?;
        loop {
            let now = self.clock.now();
            // First: a process that was stopped past its lease must find out before it starts or
            // publishes anything.
            if let Err(e) = drain.renew_scheduler_role(now).await {
                if matches!(e, Error::SchedulerBusy) {
                    self.record_stepped_down().await?;
                }
                return Err(e);
            }
            drain.refresh(now).await?;
            drain.follow_remote().await?;
            let mut events = drain.absorb_reports().await?;
            events.extend(drain.dependency_events().await?);
            events.extend(drain.source_events(now).await?);
            events.extend(drain.due_retries(now));
            events.extend(drain.expired_leases(now).await?);
            drain.commit(events).await?;
            drain.start_attempts().await?;
            let publishing = drain.publish().await?;
            drain.observe(now).await?;
            if drain.settled() {
                return drain.finish().await;
            }
            if !publishing.published_now {
                drain.wait(now, publishing.publish_at).await?;
            }
        }
    }

    /// The scheduler's gauges for `tidegate status`: per pool its slots, attempts running per
    /// class, rate in force and retry budget left; the backlog (steps not yet settled), recent
    /// throughput and the backlog's ETA at that pace; the live workers.
    fn gauge(
        &self,
        view: &View,
        pools: &HashMap<String, PoolState>,
        workers: &[WorkerRecord],
        throughput: &Throughput,
        now: DateTime<Utc>,
    ) -> serde_json::Value {
        let pools: serde_json::Map<String, serde_json::Value> = pools
            .iter()
            .map(|(name, p)| {
                let rate = p.rate.current_per_s.is_finite().then_some(p.rate.current_per_s);
                let value = serde_json::json!({
                    "slots": p.slots,
                    "running": { "live": p.running[0], "catchup": p.running[1], "backfill": p.running[2] },
                    "rate_per_s": rate,
                    "retry_budget_left": p.budget.remaining(),
                    "retry_budget_burst": self.spec.pools.get(name).map(|c| c.retry_budget_burst),
                });
                (name.clone(), value)
            })
            .collect();
        let backlog = view.backlog();
        let per_s = throughput.per_s(now);
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let eta_s = per_s.filter(|r| *r > 0.0).map(|r| backlog as f64 / r);
        serde_json::json!({
            "scheduler": self.opts.worker_id,
            "pools": pools,
            "backlog": backlog,
            "throughput_per_s": per_s,
            "backlog_eta_s": eta_s,
            "workers": workers.iter().map(|w| serde_json::json!({ "id": w.id, "slots": w.slots })).collect::<Vec<_>>(),
        })
    }

    /// Follows attempts in flight elsewhere through the store: each one's step is re-read, and
    /// once it has left the in-flight statuses (the worker staged and checked it, or it failed,
    /// or its lease expired and moved on) its pool slot is freed.
    async fn follow_remote(
        &self,
        remote: &mut HashMap<String, Remote>,
        view: &mut View,
        pools: &mut HashMap<String, PoolState>,
        summary: &mut Summary,
    ) -> Result<()> {
        if remote.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = remote.keys().cloned().collect();
        let steps = self.db(move |s| s.steps_by_id(&ids)).await?;
        for step in steps {
            let Some(r) = remote.get(&step.id) else { continue };
            let before = view.get(&step.id).map(|e| e.status());
            let status = step.state.status;
            let done = !status.holds_lease() || step.state.epoch != r.epoch;
            if before != Some(status) {
                summary.count(status);
                view.update(&step.id, step.state.clone());
            }
            if done {
                if let Some(p) = pools.get_mut(&r.pool) {
                    p.running[r.class] = p.running[r.class].saturating_sub(1);
                    let transient = step.state.last_failure.as_ref().is_some_and(|f| f.class == ErrorClass::Transient);
                    p.rate.record(matches!(status, StepStatus::RetryWait | StepStatus::Failed) && transient);
                }
                remote.remove(&step.id);
            }
        }
        Ok(())
    }

    /// Re-reads the throttle and pause state of every backfill that holds partitions.
    /// The pauses in force, read again every REFRESH_EVERY so that `pause` and `resume` take
    /// effect within a second.
    async fn refresh_pauses(&self) -> Result<Pauses> {
        let pauses = self.db(|s| s.pauses()).await?;
        Ok(Pauses::parse(pauses.iter().map(|p| p.what.as_str())))
    }

    async fn refresh_gates(&self, gates: &mut HashMap<String, BackfillGate>) -> Result<()> {
        let backfills: Vec<_> = self
            .db(|s| s.backfills(BACKFILLS_WATCHED))
            .await?
            .into_iter()
            .filter(|b| b.status.holds_partitions())
            .collect();
        gates.retain(|id, _| backfills.iter().any(|b| &b.id == id));
        for b in backfills {
            let paused = b.status == BackfillStatus::Paused;
            let gate = gates.entry(b.id.clone()).or_insert_with(|| BackfillGate {
                paused,
                max_active: b.throttle.max_active,
                rate: RateLimit::new(b.throttle.rate_per_s),
            });
            gate.paused = paused;
            gate.max_active = b.throttle.max_active;
        }
        Ok(())
    }

    /// Adds runs submitted since the view was loaded (by `tidegate run` in another process, which
    /// then only follows its run while this process, holding the scheduler role, executes it).
    async fn discover_runs(&self, view: &mut View) -> Result<()> {
        let runs = self.db(|s| s.runs(RUNS_WATCHED)).await?;
        let new: Vec<_> = runs
            .into_iter()
            .filter(|r| !r.status.is_terminal() && !view.has_run(&r.id) && self.executes(&r.id, r.created_at))
            .collect();
        for run in new {
            let rid = run.id.clone();
            let steps = self.db(move |s| s.steps(&rid)).await?;
            view.add_run(steps, run.request.priority, run.request.trigger, run.request.backfill_id.clone());
        }
        Ok(())
    }

    fn pools(&self) -> HashMap<String, PoolState> {
        self.spec
            .pools
            .iter()
            .map(|(name, p)| {
                let state = PoolState {
                    slots: p.slots,
                    running: [0; 3],
                    rate: RateLimit::new(p.rate_per_s),
                    budget: RetryBudget::new(p.retry_budget_ratio, p.retry_budget_burst),
                };
                (name.clone(), state)
            })
            .collect()
    }

    fn next_wake(&self, view: &View, pools: &HashMap<String, PoolState>, now: DateTime<Utc>) -> Duration {
        let mut wake = now + chrono::Duration::from_std(IDLE_TICK).unwrap_or_default();
        for e in view.in_status(StepStatus::RetryWait) {
            if let Some(t) = e.record.state.retry_at {
                wake = wake.min(t);
            }
        }
        if view.count(StepStatus::Ready) > 0 {
            for at in pools.values().filter_map(|p| p.rate.next_token_at(now)) {
                wake = wake.min(at);
            }
        }
        (wake - now).to_std().unwrap_or(Duration::from_millis(1)).max(Duration::from_millis(1))
    }

    /// Where an external source's own Delta table is (its `location`, when not a template).
    fn external_table(&self, dataset: &str) -> Option<String> {
        let ds = self.spec.datasets.get(dataset)?;
        let DatasetKind::External { location: Some(at), .. } = &ds.kind else { return None };
        if tidegate_core::source::is_template(at) {
            return None;
        }
        Some(tidegate_core::source::resolve(&self.site.workspace, at))
    }

    /// Pins every input of a step to the table version published now (unless planned with a
    /// version already); the pins are stored with
    /// the step and every attempt, retries included, reads exactly them.
    async fn pin_inputs(
        &self,
        view: &View,
        step_id: &str,
        versions: &mut HashMap<String, Option<u64>>,
    ) -> Result<Vec<PinnedInput>> {
        let Some(entry) = view.get(step_id) else { return Ok(Vec::new()) };
        let mut pins = Vec::new();
        for input in &entry.record.inputs {
            let version = match versions.get(&input.dataset) {
                Some(v) => *v,
                None => {
                    let v = match self.external_table(&input.dataset) {
                        // A source's own Delta table, outside the lake.
                        Some(at) => tidegate_lake::source::table_version_at(&at).await.map_err(Error::Lake)?,
                        None => self.lake.table_version(&input.dataset).await.map_err(Error::Lake)?,
                    };
                    versions.insert(input.dataset.clone(), v);
                    v
                }
            };
            // Inside a backfill, upstream steps of the same run that wrote this input are staged,
            // not published: the attempt reads their output over the published version.
            let staged_steps = entry
                .upstream_ids
                .iter()
                .filter_map(|id| view.get(id))
                .filter(|up| up.status() == StepStatus::AwaitingApproval)
                .filter(|up| self.spec.tasks.get(&up.record.task).is_some_and(|t| t.outputs.contains(&input.dataset)))
                .map(|up| up.record.id.clone())
                .collect();
            pins.push(PinnedInput {
                dataset: input.dataset.clone(),
                partitions: input.partitions.clone(),
                // A version pinned at plan time (a backfill's frozen spec) wins over the current one.
                version: input.version.or_else(|| version.and_then(|v| i64::try_from(v).ok())),
                staged_steps,
            });
        }
        Ok(pins)
    }

    async fn commit(&self, events: Vec<StepEventRecord>, view: &mut View, summary: &mut Summary) -> Result<()> {
        for chunk in events.chunks(MAX_EVENTS_PER_COMMIT) {
            let batch = chunk.to_vec();
            let outcomes = self.db(move |s| s.commit(&batch)).await?;
            for (record, outcome) in chunk.iter().zip(outcomes) {
                let rejected = matches!(outcome, Outcome::Rejected { .. });
                self.absorb_outcome(&record.step_id, outcome, view, summary);
                if rejected {
                    self.refresh(&record.step_id, view).await?;
                }
            }
        }
        Ok(())
    }

    /// Reloads a step whose event was rejected: someone else moved it, so the view is stale.
    async fn refresh(&self, step_id: &str, view: &mut View) -> Result<()> {
        let sid = step_id.to_owned();
        if let Some(step) = self.db(move |s| s.step(&sid)).await? {
            view.update(step_id, step.state);
        }
        Ok(())
    }

    fn absorb_outcome(&self, step_id: &str, outcome: Outcome, view: &mut View, summary: &mut Summary) {
        match outcome {
            Outcome::Applied { step, .. } => {
                summary.count(step.status);
                view.update(step_id, step);
            }
            Outcome::Rejected { .. } => summary.rejected += 1,
        }
    }

    /// Settles the reports of finished attempts: frees their pool slots, records the staged
    /// output of all of them in one store transaction (fenced per attempt) together with the
    /// check results that follow each, and queues the events of failed attempts (retries,
    /// failures) for the tick's group commit.
    async fn absorb_reports(
        &self,
        reports: Vec<Report>,
        view: &mut View,
        pools: &mut HashMap<String, PoolState>,
        events: &mut Vec<StepEventRecord>,
        correlation: &str,
        summary: &mut Summary,
    ) -> Result<()> {
        // Each staged attempt's record, with the events that may follow only once it is stored.
        let mut staged: Vec<StagedRecord> = Vec::new();
        // Attempts stopped by a cancel: their steps, cancelled elsewhere, are read back.
        let mut stopped: Vec<String> = Vec::new();
        for report in reports {
            let Some(entry) = view.get(report.step_id()) else { continue };
            if matches!(report, Report::Stopped { .. }) {
                stopped.push(report.step_id().to_owned());
            }
            // Backpressure protects a struggling dependency from load: only transient failures
            // count. A deterministic one (bad input, bad config) says nothing about load, and
            // counting it throttled a task failing on every partition down to the floor rate.
            let failed = matches!(report, Report::Failed { class: ErrorClass::Transient, .. });
            if let Some(p) = pools.get_mut(&entry.record.pool) {
                let class = class_of(entry.priority);
                p.running[class] = p.running[class].saturating_sub(1);
                p.rate.record(failed);
            }
            let settlement = attempt::settle(report, entry.record.state.attempt, self.opts.seed, &|reason| {
                self.meta(reason, correlation)
            });
            match settlement.staged {
                Some((step_id, epoch, versions)) => {
                    let meta = self.meta(format!("staged {} rows", settlement.n_rows), correlation);
                    // The validation events go in the same transaction, applied only if the
                    // staging is accepted.
                    staged.push(StagedRecord { step_id, epoch, versions, meta, then: settlement.events });
                }
                None => events.extend(settlement.events),
            }
        }
        for step_id in stopped {
            self.refresh(&step_id, view).await?;
        }
        if staged.is_empty() {
            return Ok(());
        }
        // The records go to the blocking thread and come back, rather than being copied every
        // tick for the rare fallback below.
        let (recorded, staged) = self.db(move |s| Ok((s.record_staged_many(&staged), staged))).await?;
        let outcomes = match recorded {
            Ok(outcomes) => outcomes,
            // One item at fault fails the transaction: record them one by one, so the others
            // are kept and the error reported is that item's.
            Err(_) if staged.len() > 1 => {
                let mut outcomes = Vec::with_capacity(staged.len());
                for record in &staged {
                    let record = record.clone();
                    let one = self.db(move |s| s.record_staged_many(std::slice::from_ref(&record))).await?;
                    outcomes.extend(one);
                }
                outcomes
            }
            Err(e) => return Err(Error::Store(e)),
        };
        crate::failpoint::hit("after-record-staged");
        for (record, outcome) in staged.into_iter().zip(outcomes) {
            let rejected = matches!(outcome, Outcome::Rejected { .. });
            self.absorb_outcome(&record.step_id, outcome, view, summary);
            if !rejected {
                view.note_staged(&record.step_id, record.versions);
            }
            if rejected {
                // Another attempt owns the step now (this one's lease expired): its output
                // stays unpublished and reconciliation removes the files.
                self.refresh(&record.step_id, view).await?;
            }
        }
        Ok(())
    }

    async fn claim(
        &self,
        view: &mut View,
        pools: &mut HashMap<String, PoolState>,
        gates: &mut HashMap<String, BackfillGate>,
        pauses: &Pauses,
        dispatch: Dispatch<'_>,
        correlation: &str,
    ) -> Result<Vec<Attempt>> {
        let now = self.clock.now();
        let Dispatch { in_flight, workers, remote } = dispatch;
        // Slots: this process's own, then each live worker's not taken by its leases.
        let mut free: Vec<(String, usize)> =
            vec![(self.opts.worker_id.clone(), self.opts.max_parallel.saturating_sub(in_flight))];
        for w in workers {
            let used = remote.values().filter(|r| r.worker == w.id).count();
            free.push((w.id.clone(), (w.slots as usize).saturating_sub(used)));
        }
        // A pool's time windows (`windows`, in its `time_zone`) give it other slots while they hold.
        for (name, pool) in pools.iter_mut() {
            if let Some(spec) = self.spec.pools.get(name) {
                pool.slots = spec.slots_at(now);
            }
        }
        let mut room = free.iter().map(|(_, n)| n).sum::<usize>().min(MAX_CLAIMS_PER_TICK);
        if room == 0 || view.count(StepStatus::Ready) == 0 {
            return Ok(Vec::new());
        }
        // Each backfill's room under its throttle: max_active minus its steps holding leases.
        let mut active: HashMap<&str, u32> = HashMap::new();
        for e in view.in_statuses(StepStatus::holds_lease) {
            if let Some(b) = &e.backfill_id {
                *active.entry(b.as_str()).or_default() += 1;
            }
        }
        let mut backfill_room: HashMap<String, u32> = gates
            .iter()
            .map(|(id, gate)| {
                let used = active.get(id.as_str()).copied().unwrap_or(0);
                (id.clone(), if gate.paused { 0 } else { gate.max_active.saturating_sub(used) })
            })
            .collect();
        // Each task's room for catch-up intervals under its `max_active_runs`.
        let mut catchup = CatchupRoom::new(&self.spec, view);
        // Ready steps per pool and class, in order, at most `room` of each (no more can be picked
        // this tick); a backfill's steps only within its room, catch-up steps within their task's.
        let mut queues: BTreeMap<String, [Vec<String>; 3]> = BTreeMap::new();
        let mut pool_names: Vec<&String> = pools.keys().collect();
        pool_names.sort();
        // A paused pool's or class's ready steps are not looked at; a paused task's are skipped
        // one by one (they stay ready, shown as paused by `status`).
        let tasks_paused = pauses.any_task();
        for pool_name in pool_names.into_iter().filter(|p| !pauses.contains(&Pausable::Pool((*p).clone()))) {
            let classes = [Priority::Live, Priority::Catchup, Priority::Backfill].map(|priority| {
                if paused_class(priority).is_some_and(|c| pauses.contains(&Pausable::Class(c))) {
                    return Vec::new();
                }
                let unpaused = |e: &view::Entry| !tasks_paused || !pauses.task(&e.record.task);
                if priority == Priority::Catchup {
                    return view.take_ready_each(pool_name, priority, room, |e| unpaused(e) && catchup.admit(e));
                }
                let mut admit = |e: &view::Entry| {
                    let Some(b) = &e.backfill_id else { return true };
                    let (Some(left), Some(gate)) = (backfill_room.get_mut(b), gates.get_mut(b)) else { return false };
                    if *left == 0 || !gate.rate.try_start(now) {
                        return false;
                    }
                    *left -= 1;
                    true
                };
                if tasks_paused {
                    // Refused one task at a time, not one run at a time.
                    return view.take_ready_each(pool_name, priority, room, |e| unpaused(e) && admit(e));
                }
                view.take_ready(pool_name, priority, room, admit)
            });
            if classes.iter().any(|q| !q.is_empty()) {
                queues.insert(pool_name.clone(), classes);
            }
        }
        let mut picked: Vec<(String, String, usize)> = Vec::new();
        for (pool_name, mut classes) in queues {
            let Some(pool) = pools.get_mut(&pool_name) else { continue };
            for q in &mut classes {
                q.reverse();
            }
            while room > 0 {
                let load = ClassLoad {
                    ready: [0, 1, 2].map(|c| u32::try_from(classes[c].len()).unwrap_or(u32::MAX)),
                    running: pool.running,
                };
                let Some(class) = schedule::next_class(&load, pool.slots, &self.opts.shares) else { break };
                if !pool.rate.try_start(now) {
                    break;
                }
                let Some(step_id) = classes[class].pop() else { break };
                pool.running[class] += 1;
                room -= 1;
                picked.push((step_id, pool_name.clone(), class));
            }
        }
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        // Each pick goes to the process with the most free slots (this one first among equals:
        // no store round trip to start its attempts), so claims spread over the workers.
        let counts: Vec<usize> = free.iter().map(|(_, n)| *n).collect();
        let mut spread = schedule::spread_claims(&counts, picked.len()).into_iter();
        let requests: Vec<ClaimRequest> = picked
            .iter()
            .map(|(id, _, _)| {
                let worker = spread.next().map_or_else(|| self.opts.worker_id.clone(), |i| free[i].0.clone());
                let reason = if worker == self.opts.worker_id { "claimed" } else { "leased to a worker" };
                ClaimRequest { step_id: id.clone(), worker, meta: self.meta(reason, correlation) }
            })
            .collect();
        let ttl = self.spec.project.lease_ttl_s;
        // The claims, with the claimed steps as the claims left them and, for local attempts,
        // the checkpoint to resume from: one transaction, since a pool slot stays empty until
        // its next attempt starts.
        let local = self.opts.worker_id.clone();
        let claimed = self.db(move |s| s.claim_steps_to_start(&requests, &local, now, ttl)).await?;
        let mut attempts = Vec::new();
        for ((step_id, pool_name, class), claim) in picked.into_iter().zip(claimed) {
            let Some(Claimed { lease, step, resume_from }) = claim else {
                if let Some(p) = pools.get_mut(&pool_name) {
                    p.running[class] = p.running[class].saturating_sub(1);
                }
                continue;
            };
            if lease.attempt == 1
                && let Some(p) = pools.get_mut(&pool_name)
            {
                p.budget.on_first_attempt();
            }
            view.update(&step_id, step.state.clone());
            if lease.worker != self.opts.worker_id {
                let r = Remote { worker: lease.worker.clone(), pool: pool_name, class, epoch: lease.epoch };
                remote.insert(step_id, r);
                continue;
            }
            let clock = self.clock.clone();
            let attempt = attempt::prepare(&self.spec, &self.site, step, lease, resume_from, clock)
                .ok_or_else(|| Error::Internal(format!("claimed step {step_id} has a task the spec lacks")))?;
            attempts.push(attempt);
        }
        Ok(attempts)
    }
}
