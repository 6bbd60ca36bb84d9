//! What monitoring reads (decision 0011): a [`Snapshot`] of the workspace's gauges, counters and
//! duration histograms for `/metrics`, and [`Readiness`] for `/readyz`.
//!
//! A scrape is a few grouped queries, not a scan: steps counted by status and queues per priority
//! class ([`Store::step_counts`]), the scheduler's last gauge (retry budgets, backlog, its ETA),
//! and the schedules' debt and freshness decided from the published partitions the store recorded
//! (decision 0018). Durations come from the journal, read incrementally: each scrape reads only
//! the entries appended since the last one (at most [`JOURNAL_ENTRIES_PER_SCRAPE`]), so the
//! histograms are cumulative counts of the attempts and publications that ended while this
//! [`Monitor`] watched, as Prometheus expects of a histogram.
//!
//! Every label value is a name the spec validated (task, dataset, pool) or a fixed word (status,
//! priority class, outcome): never a reason, a path, a URL or anything a task printed, so no
//! secret can reach a metric.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::plan;
use tidegate_core::state::StepStatus;
use tidegate_lake::Lake;
use tidegate_store::{JournalEntry, JournalQuery, Priority, Store};

use crate::actor::{Access, require};
use crate::workspace::{Workspace, open_lake};

/// The most journal entries one scrape reads; a burst larger than this is caught up over the
/// next scrapes.
pub const JOURNAL_ENTRIES_PER_SCRAPE: u32 = 20_000;
/// Journal entries read per query.
const JOURNAL_PAGE: u32 = 5_000;
/// On the first scrape, how many entries before the journal's head are read without observing
/// anything, to learn when the attempts then in flight were claimed.
const WARM_UP_ENTRIES: u64 = 10_000;
/// The newest backfills a scrape looks at for one awaiting approval.
const APPROVALS_WATCHED: u32 = 500;
/// The most attempts in flight (and validated steps awaiting publication) remembered at once.
const STEPS_WATCHED_MAX: usize = 100_000;

/// Upper bounds, in seconds, of the step duration histogram's buckets (an attempt: claimed to
/// staged or to its failure).
pub const STEP_DURATION_BOUNDS_S: &[f64] =
    &[0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0];
/// Upper bounds, in seconds, of the publication duration histogram's buckets (a step: validated,
/// or approved, to published).
pub const PUBLICATION_DURATION_BOUNDS_S: &[f64] =
    &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

/// The workspace's metrics at one instant.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// When it was taken.
    pub at: DateTime<Utc>,
    /// Every step the store holds, by status; every status is present (zero when none).
    pub steps: BTreeMap<StepStatus, u64>,
    /// Per priority class (live, catch-up, backfill; all present): its queue.
    pub queues: BTreeMap<Priority, Queue>,
    /// How long the longest-waiting step in `waiting_for_source` has waited (0 when none waits).
    pub source_wait_oldest_s: f64,
    /// How long the compared backfill waiting longest for its approval has waited (0 when none
    /// waits).
    pub approval_wait_oldest_s: f64,
    /// Per dataset the workspace writes: its stale partitions (built on inputs changed since).
    pub stale_partitions: BTreeMap<String, u64>,
    /// The scheduler's last gauge; absent before any scheduler ran.
    pub scheduler: Option<SchedulerGauge>,
    /// Per scheduled task: how many intervals ended and were not run (`tidegate status`'s debt),
    /// exact for an outage of any length.
    pub missed: BTreeMap<String, u64>,
    /// Per dataset a scheduled task writes: how far behind now the end of its newest published
    /// partition is, in seconds. Absent for a dataset with nothing published yet.
    pub freshness_lag_s: BTreeMap<String, f64>,
    /// Attempt durations by task and outcome, since this monitor's first scrape.
    pub step_durations: Vec<Labelled>,
    /// Publication durations by task, since this monitor's first scrape.
    pub publication_durations: Vec<Labelled>,
    /// What is paused (`tidegate pause`): each `schedule:TASK`, `task:TASK`, `pool:NAME` or
    /// `class:...` in force.
    pub paused: Vec<String>,
    /// Store and lake calls of this monitor (scrapes and readiness checks) that failed.
    pub errors: Errors,
}

/// One priority class's queue.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Queue {
    /// Steps ready to start.
    pub ready: u64,
    /// Steps whose attempt holds a lease.
    pub running: u64,
    /// How long the longest-waiting ready step has waited (0 when none waits).
    pub oldest_ready_age_s: f64,
}

/// The scheduler's last gauge (written by the engine as it runs; see `tidegate status`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SchedulerGauge {
    /// How old the gauge is: a scheduler that stopped stops renewing it.
    #[serde(default)]
    pub age_s: f64,
    /// Steps not yet settled in the scheduler's view.
    #[serde(default)]
    pub backlog: u64,
    /// Steps settled per second, recently.
    #[serde(default)]
    pub throughput_per_s: Option<f64>,
    /// The backlog's ETA at that pace; absent while nothing settles.
    #[serde(default)]
    pub backlog_eta_s: Option<f64>,
    /// Per pool: its retry budget.
    #[serde(default)]
    pub pools: BTreeMap<String, PoolGauge>,
}

/// One pool in the scheduler's gauge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolGauge {
    /// Whole retries the pool's budget allows now.
    #[serde(default)]
    pub retry_budget_left: u64,
}

/// A cumulative histogram: per bucket, how many observations fell in it (not cumulative; the
/// last bucket is everything above the last bound), their count and their sum.
#[derive(Debug, Clone, Serialize)]
pub struct Histogram {
    /// The buckets' upper bounds, in seconds.
    pub bounds_s: &'static [f64],
    /// Observations per bucket; one more than `bounds_s` (the last is `+Inf`).
    pub counts: Vec<u64>,
    /// How many observations.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_s: f64,
}

impl Histogram {
    fn new(bounds_s: &'static [f64]) -> Self {
        Self { bounds_s, counts: vec![0; bounds_s.len() + 1], count: 0, sum_s: 0.0 }
    }

    fn observe(&mut self, seconds: f64) {
        let bucket = self.bounds_s.iter().position(|b| seconds <= *b).unwrap_or(self.bounds_s.len());
        self.counts[bucket] += 1;
        self.count += 1;
        self.sum_s += seconds;
    }
}

/// A histogram with its labels.
#[derive(Debug, Clone, Serialize)]
pub struct Labelled {
    /// Label names and values: `task`, and `outcome` for attempts.
    pub labels: Vec<(&'static str, String)>,
    /// The histogram.
    pub histogram: Histogram,
}

/// Failed calls counted by a monitor.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Errors {
    /// Store calls that failed.
    pub store: u64,
    /// Lake calls that failed.
    pub lake: u64,
}

/// Whether the server can do its work: the store answers with the schema this build knows, and
/// the lake answers.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Readiness {
    /// The store answers and holds exactly this build's migrations.
    pub store: bool,
    /// The lake answers (its folder is there, or its object store serves a read).
    pub lake: bool,
}

impl Readiness {
    /// Both.
    pub fn ready(&self) -> bool {
        self.store && self.lake
    }
}

/// How an attempt ended, for the step duration histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// Its output was staged.
    Staged,
    /// It failed, or its lease expired.
    Failed,
    /// An operator cancelled it.
    Cancelled,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Staged => "staged",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// What outlives one scrape: the lake handle (opened once: opening an `s3://` lake probes it
/// with writes), the runtime that drives it, the position in the journal, the histograms and the
/// error counts. One per server.
#[derive(Debug, Default)]
pub struct Monitor {
    /// Started on first use; taken when dropped.
    runtime: OnceLock<tokio::runtime::Runtime>,
    lake: Mutex<Option<Arc<Lake>>>,
    tail: Mutex<Tail>,
    errors: Mutex<Errors>,
}

impl Monitor {
    /// Runs `future` to completion on the monitor's runtime (one thread, started on first use).
    fn block_on<F: std::future::Future>(&self, future: F) -> Result<F::Output> {
        if self.runtime.get().is_none() {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("tidegate-monitor")
                .enable_all()
                .build()
                .context("starting the monitor's runtime")?;
            // Another thread may have started one meanwhile: then this one goes unused.
            if let Err(unused) = self.runtime.set(runtime) {
                unused.shutdown_background();
            }
        }
        let runtime = self.runtime.get().context("the monitor's runtime is gone (this is a bug)")?;
        Ok(runtime.block_on(future))
    }

    /// The workspace's metrics at `now`, for `actor` (viewer and above). A store failure fails
    /// the snapshot, and is counted.
    pub fn snapshot(&self, ws: &Workspace, store: &dyn Store, actor: &Actor, now: DateTime<Utc>) -> Result<Snapshot> {
        require(actor, Access::Read)?;
        let read = Self::read_store(store, now);
        let (steps, queues, scheduler, source_wait_oldest_s) = self.counted(read, |e| e.store += 1)?;
        let (step_durations, publication_durations) = {
            let mut tail = lock(&self.tail);
            let advanced = tail.advance(store).context("reading the journal for durations");
            self.counted(advanced, |e| e.store += 1)?;
            (tail.step_durations(), tail.publication_durations())
        };
        let stale = crate::stale::stale_in(ws, store, None).context("finding stale partitions");
        let stale = self.counted(stale, |e| e.store += 1)?;
        let mut stale_partitions: BTreeMap<String, u64> = ws
            .spec
            .datasets
            .iter()
            .filter(|(_, d)| matches!(d.kind, tidegate_core::spec::DatasetKind::Managed { .. }))
            .map(|(name, _)| (name.clone(), 0))
            .collect();
        for s in stale {
            *stale_partitions.entry(s.dataset).or_default() += 1;
        }
        let decided = Self::schedules(ws, store, now);
        let (missed, freshness_lag_s) = self.counted(decided, |e| e.store += 1)?;
        let waiting = Self::approval_wait(store, now);
        let approval_wait_oldest_s = self.counted(waiting, |e| e.store += 1)?;
        let pauses = store.pauses().context("listing pauses");
        let paused = self.counted(pauses, |e| e.store += 1)?.into_iter().map(|p| p.what).collect();
        Ok(Snapshot {
            at: now,
            steps,
            queues,
            source_wait_oldest_s,
            approval_wait_oldest_s,
            stale_partitions,
            scheduler,
            missed,
            freshness_lag_s,
            step_durations,
            publication_durations,
            paused,
            errors: *lock(&self.errors),
        })
    }

    /// Whether the store and the lake answer (no access needed: it says nothing but yes or no).
    pub fn ready(&self, ws: &Workspace, store: &dyn Store) -> Readiness {
        let store_ok = matches!(store.schema_current(), Ok(true));
        let lake_ok = self.lake_answers(ws).unwrap_or(false);
        let mut errors = lock(&self.errors);
        errors.store += u64::from(!store_ok);
        errors.lake += u64::from(!lake_ok);
        Readiness { store: store_ok, lake: lake_ok }
    }

    /// `result`, counting its failure with `count`.
    fn counted<T>(&self, result: Result<T>, count: impl FnOnce(&mut Errors)) -> Result<T> {
        if result.is_err() {
            count(&mut lock(&self.errors));
        }
        result
    }

    /// Steps by status, queues per class and the scheduler's gauge.
    #[allow(clippy::type_complexity, reason = "three parts of the snapshot, named where they are used")]
    pub(crate) fn read_store(
        store: &dyn Store,
        now: DateTime<Utc>,
    ) -> Result<(BTreeMap<StepStatus, u64>, BTreeMap<Priority, Queue>, Option<SchedulerGauge>, f64)> {
        let counts = store.step_counts().context("counting steps")?;
        let steps = StepStatus::ALL.iter().map(|s| (*s, counts.by_status.get(s).copied().unwrap_or(0))).collect();
        let queues = [Priority::Live, Priority::Catchup, Priority::Backfill]
            .into_iter()
            .map(|p| {
                let q = counts.queues.get(&p).cloned().unwrap_or_default();
                let oldest_ready_age_s = q.oldest_ready_since.map_or(0.0, |since| seconds(now - since));
                (p, Queue { ready: q.ready, running: q.running, oldest_ready_age_s })
            })
            .collect();
        let gauges = store.metrics().context("reading the scheduler's gauge")?;
        let scheduler = gauges
            .into_iter()
            .find(|(name, _, _)| name == tidegate_engine::executor::SCHEDULER_GAUGE)
            .and_then(|(_, value, at)| {
                // The engine of this same build wrote it; a gauge it cannot read is left out
                // rather than failing the scrape.
                let mut gauge: SchedulerGauge = serde_json::from_value(value).ok()?;
                gauge.age_s = seconds(now - at);
                Some(gauge)
            });
        let source_wait = counts.oldest_waiting_for_source.map_or(0.0, |since| seconds(now - since));
        Ok((steps, queues, scheduler, source_wait))
    }

    /// How long the compared backfill waiting longest for its approval has waited.
    fn approval_wait(store: &dyn Store, now: DateTime<Utc>) -> Result<f64> {
        let backfills = store.backfills(APPROVALS_WATCHED).context("listing backfills")?;
        let oldest = backfills
            .iter()
            .filter(|b| b.status == tidegate_store::BackfillStatus::Staged && b.comparison_hash.is_some())
            .map(|b| b.updated_at)
            .min();
        Ok(oldest.map_or(0.0, |since| seconds(now - since)))
    }

    /// Missed intervals per scheduled task and freshness lag per dataset, decided from what the
    /// store recorded as published (decision 0018).
    pub(crate) fn schedules(
        ws: &Workspace,
        store: &dyn Store,
        now: DateTime<Utc>,
    ) -> Result<(BTreeMap<String, u64>, BTreeMap<String, f64>)> {
        let decisions = crate::schedule::decide(&ws.spec, store, now)?;
        let mut missed = BTreeMap::new();
        let mut lag = BTreeMap::new();
        for d in decisions {
            missed.insert(d.task.clone(), d.n_gaps + d.n_debt);
            let Some(dataset) = ws.spec.tasks[&d.task].outputs.first() else { continue };
            let Some(axis) = plan::axis_of(&ws.spec.datasets[dataset]) else { continue };
            let end = d.newest_published.as_ref().and_then(|k| axis.parse_key(k).ok()).map(|t| axis.shift(t, 1));
            if let Some(end) = end {
                lag.insert(dataset.clone(), seconds(now - end));
            }
        }
        Ok((missed, lag))
    }

    /// Whether the lake answers: its folder is there and can be listed, or its object store
    /// serves a read of the release pointer.
    fn lake_answers(&self, ws: &Workspace) -> Result<bool> {
        let lake = self.lake(ws)?;
        if let Some(root) = lake.root() {
            // Not through the lake: reading a local lake creates the folders it reads.
            return Ok(std::fs::read_dir(root).is_ok());
        }
        Ok(self.block_on(lake.pointer())?.is_ok())
    }

    /// The lake, opened on first use and kept.
    fn lake(&self, ws: &Workspace) -> Result<Arc<Lake>> {
        let mut kept = lock(&self.lake);
        if let Some(lake) = kept.as_ref() {
            return Ok(lake.clone());
        }
        let lake = self.block_on(open_lake(ws))??;
        *kept = Some(lake.clone());
        Ok(lake)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // A server drops its monitor on one of its own runtime's threads, where dropping another
        // runtime (which waits for it) is refused.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// `mutex`'s guard; a panic while it was held left plain counters, still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A duration in seconds, never negative (clocks of several machines may disagree).
fn seconds(d: chrono::Duration) -> f64 {
    #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
    let ms = d.num_milliseconds().max(0) as f64;
    ms / 1000.0
}

/// The journal read so far, what it says is in flight, and the histograms.
#[derive(Debug, Default)]
struct Tail {
    /// Entries up to this sequence number were read; `None` before the first scrape.
    read_to: Option<u64>,
    /// Entries up to this one were read only to learn what was in flight (the warm-up).
    observe_after: u64,
    /// Per step with an attempt in flight: when it was claimed.
    claimed: HashMap<String, DateTime<Utc>>,
    /// Per validated step awaiting publication: when it became validated.
    validated: HashMap<String, DateTime<Utc>>,
    steps: BTreeMap<(String, Outcome), Histogram>,
    publications: BTreeMap<String, Histogram>,
}

impl Tail {
    /// Reads the entries appended since the last call (at most [`JOURNAL_ENTRIES_PER_SCRAPE`]).
    fn advance(&mut self, store: &dyn Store) -> Result<()> {
        let from = match self.read_to {
            Some(seq) => seq,
            None => {
                let head = store.journal_head()?.map_or(0, |h| h.seq);
                self.observe_after = head;
                head.saturating_sub(WARM_UP_ENTRIES)
            }
        };
        self.read_to = Some(from);
        let mut n_read = 0;
        while n_read < JOURNAL_ENTRIES_PER_SCRAPE {
            let query = JournalQuery { after_seq: self.read_to, limit: Some(JOURNAL_PAGE), ..JournalQuery::default() };
            let entries = store.journal(&query)?;
            for entry in &entries {
                self.read(entry);
                self.read_to = Some(entry.seq);
            }
            n_read += u32::try_from(entries.len()).unwrap_or(JOURNAL_PAGE);
            if entries.len() < JOURNAL_PAGE as usize {
                break;
            }
        }
        Ok(())
    }

    /// What one entry says about attempts and publications.
    fn read(&mut self, e: &JournalEntry) {
        let (Some(step), Some(task), Some(to)) =
            (&e.step_id, &e.task, e.to_status.as_deref().and_then(StepStatus::parse))
        else {
            return;
        };
        let from = e.from_status.as_deref().and_then(StepStatus::parse);
        let observe = e.seq > self.observe_after;
        if from == Some(StepStatus::Ready) && to == StepStatus::Running {
            if self.claimed.len() < STEPS_WATCHED_MAX {
                self.claimed.insert(step.clone(), e.at);
            }
            return;
        }
        if from == Some(StepStatus::Running) && to != StepStatus::Running {
            let outcome = match to {
                StepStatus::Staged => Outcome::Staged,
                StepStatus::Cancelled => Outcome::Cancelled,
                _ => Outcome::Failed,
            };
            if let Some(claimed) = self.claimed.remove(step).filter(|_| observe) {
                let histogram =
                    self.steps.entry((task.clone(), outcome)).or_insert_with(|| Histogram::new(STEP_DURATION_BOUNDS_S));
                histogram.observe(seconds(e.at - claimed));
            }
        }
        if to == StepStatus::Validated {
            if self.validated.len() < STEPS_WATCHED_MAX {
                self.validated.insert(step.clone(), e.at);
            }
        } else if let Some(validated) = self.validated.remove(step).filter(|_| observe && to == StepStatus::Published) {
            let histogram =
                self.publications.entry(task.clone()).or_insert_with(|| Histogram::new(PUBLICATION_DURATION_BOUNDS_S));
            histogram.observe(seconds(e.at - validated));
        }
    }

    fn step_durations(&self) -> Vec<Labelled> {
        self.steps
            .iter()
            .map(|((task, outcome), h)| Labelled {
                labels: vec![("task", task.clone()), ("outcome", outcome.as_str().to_owned())],
                histogram: h.clone(),
            })
            .collect()
    }

    fn publication_durations(&self) -> Vec<Labelled> {
        self.publications
            .iter()
            .map(|(task, h)| Labelled { labels: vec![("task", task.clone())], histogram: h.clone() })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_puts_each_observation_in_the_first_bucket_that_holds_it() {
        let mut h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 1.5, 10.0, 11.0] {
            h.observe(v);
        }
        assert_eq!(h.counts, [2, 2, 1]);
        assert_eq!((h.count, h.sum_s), (5, 24.0));
    }
}
