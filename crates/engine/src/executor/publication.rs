//! Publication of validated steps, off the scheduler loop's critical path.
//!
//! The loop hands the validated steps it holds to one publication at a time, which makes their
//! Delta commits on its own task ([`Lake::publish_many`]: releases of one dataset with disjoint
//! partitions share a commit, each step keeping its own `txn`). Meanwhile the loop goes on
//! absorbing reports and claiming, so pool slots are refilled while a commit is being made, and
//! the steps validated meanwhile form the next publication: the busier the loop, the more steps
//! share a commit (a group commit). When the commits are done, the loop records the releases in
//! the store, fenced by each step's lease epoch, in one transaction.
//!
//! While steps are waiting for a slot, a dataset gets at most one publication per [`PACE`]:
//! steps validated within that time of the last one wait and share the next commit. Without it a
//! busy table took a commit per step or two (a commit is quick next to the steps arriving), and
//! every commit costs its readers a log update and, every few commits, a Delta checkpoint
//! rewriting the table's whole state. A chain of steps writing different datasets never waits.
//! The pace is work-conserving: when no step is waiting for a slot, holding a commit back gains
//! nothing (no more steps can arrive to share it than are already running) and delays the
//! downstream steps the commit makes ready, so it is published at once. That is the tail of
//! every run, and the whole of a short chained one.
//!
//! Crash safety is unchanged by running the commit on its own task: a process that dies after a
//! Delta commit and before the store's record leaves the step validated with its `txn` in the
//! table, and the next publication of the step finds the `txn` and records the commit instead
//! of making another (invariant 2).
//!
//! [`Lake::publish_many`]: tidegate_lake::Lake::publish_many

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tidegate_core::partition::TimeAxis;
use tidegate_core::retry::ErrorClass;
use tidegate_core::spec::Spec;
use tidegate_core::spec::model::{Dataset, DatasetKind, Partitioning, WriteMode};
use tidegate_core::state::{StepEvent, StepStatus};
use tidegate_lake::{Advance, Publication};
use tidegate_store::{Decision, ReleaseItem, ReleaseKind, ReleaseRecord, StepEventRecord, VersionRecord};
use tokio::task::{JoinError, JoinHandle};

use super::{Engine, Summary};
use crate::view::{Entry, View};
use crate::{Error, Result};

/// How long a publication whose commit met a retryable error (a conflicting writer) waits
/// before handing its steps back, so the next attempt at them is not immediate.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// The longest such a pause grows to while failures go on.
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(5);

/// The least time between two publications to one dataset.
pub(super) const PACE: Duration = Duration::from_millis(50);

/// How often a publication that keeps failing with a retryable error is logged again.
pub(super) const TROUBLE_EVERY: Duration = Duration::from_secs(30);

/// Publications failing with retryable errors since the last one that succeeded: the loop
/// retries them at every turn, and a person must hear of it (a full disk is retried until
/// freed), once at the first failure and then every [`TROUBLE_EVERY`], not at every turn.
#[derive(Debug, Default)]
pub(super) struct Trouble {
    /// When the failures began, how many there were, when the last was logged.
    since: Option<(Instant, u32, Instant)>,
}

impl Trouble {
    /// Notes a retryable failure at `now`; whether to log it.
    fn failed(&mut self, now: Instant) -> Option<(Duration, u32)> {
        let (since, n, logged) = self.since.get_or_insert((now, 0, now));
        *n += 1;
        let first = *n == 1;
        if first || now.duration_since(*logged) >= TROUBLE_EVERY {
            *logged = now;
            return Some((now.duration_since(*since), *n));
        }
        None
    }

    /// How long a publication failing now waits before handing its steps back: [`RETRY_PAUSE`]
    /// doubled with each failure in a row, at most [`RETRY_PAUSE_MAX`] (a full disk is not
    /// freed in 50 ms, and each try costs the lake a listing).
    fn pause(&self) -> Duration {
        let n = self.since.map_or(0, |(_, n, _)| n.min(16));
        RETRY_PAUSE.saturating_mul(1 << n).min(RETRY_PAUSE_MAX)
    }

    /// Notes a publication that succeeded; the failures it ends, if any.
    fn recovered(&mut self, now: Instant) -> Option<(Duration, u32)> {
        self.since.take().map(|(since, n, _)| (now.duration_since(since), n))
    }
}

/// When each dataset was last published to by this loop, to keep to [`PACE`].
#[derive(Debug, Default)]
pub(super) struct Pacer {
    last: HashMap<String, Instant>,
}

impl Pacer {
    /// When a step writing `outputs` may be published: `None` for now. `waiting` is whether any
    /// step is waiting for a slot; when none is, the pace holds nothing back.
    pub(super) fn due(&self, outputs: &[String], now: Instant, waiting: bool) -> Option<Instant> {
        if !waiting {
            return None;
        }
        outputs.iter().filter_map(|d| self.last.get(d)).map(|t| *t + PACE).max().filter(|t| *t > now)
    }

    /// Notes a publication to `datasets` starting at `now`.
    pub(super) fn started<'a>(&mut self, datasets: impl IntoIterator<Item = &'a String>, now: Instant) {
        for d in datasets {
            self.last.insert(d.clone(), now);
        }
    }
}

/// For the steps writing an append dataset with a `dedup_lookback`: the steps of the same run
/// and task at the earlier partitions in that lookback. Such a step is published only once those
/// are settled (published, failed, ...) or go in the same publication, so the run publishes
/// what one worker would, whatever order its steps finish in (decision 0017).
struct Earlier<'v> {
    /// Per validated step that must wait: the earliest partition start it waits for.
    from: HashMap<&'v str, DateTime<Utc>>,
    /// Per (run, task) of those steps: its steps, by partition start, with their id and status.
    steps: HashMap<(&'v str, &'v str), Vec<StepAt<'v>>>,
}

/// A step's partition start, id and status.
type StepAt<'v> = (DateTime<Utc>, &'v str, StepStatus);

impl<'v> Earlier<'v> {
    fn of(spec: &Spec, view: &'v View, validated: &[&'v Entry]) -> Self {
        let mut from = HashMap::new();
        for e in validated {
            let Some(interval) = e.record.interval else { continue };
            let outputs = spec.tasks.get(&e.record.task).map_or(&[][..], |t| &t.outputs[..]);
            let starts =
                outputs.iter().filter_map(|d| spec.datasets.get(d)).filter_map(|d| lookback_start(d, interval.start));
            if let Some(start) = starts.min() {
                from.insert(e.record.id.as_str(), start);
            }
        }
        let mut steps: HashMap<(&str, &str), Vec<_>> = HashMap::new();
        if !from.is_empty() {
            let wanted: HashSet<(&str, &str)> = validated
                .iter()
                .filter(|e| from.contains_key(e.record.id.as_str()))
                .map(|e| (e.record.run_id.as_str(), e.record.task.as_str()))
                .collect();
            for o in view.entries() {
                let key = (o.record.run_id.as_str(), o.record.task.as_str());
                if let (true, Some(interval)) = (wanted.contains(&key), o.record.interval) {
                    steps.entry(key).or_default().push((interval.start, o.record.id.as_str(), o.status()));
                }
            }
        }
        Earlier { from, steps }
    }

    /// Whether `e` must wait: a step of its run and task at an earlier partition in its lookback
    /// is neither settled nor among those `going` now.
    fn unsettled(&self, e: &Entry, going: &HashSet<String>) -> bool {
        let (Some(from), Some(interval)) = (self.from.get(e.record.id.as_str()), e.record.interval) else {
            return false;
        };
        let Some(steps) = self.steps.get(&(e.record.run_id.as_str(), e.record.task.as_str())) else { return false };
        steps.iter().any(|(start, id, status)| {
            *start >= *from
                && *start < interval.start
                && !status.is_terminal()
                && *status != StepStatus::AwaitingApproval
                && !going.contains(*id)
        })
    }
}

/// The start of the earliest partition an append's de-duplication of the partition starting at
/// `start` looks back to, for a time-partitioned append dataset with a lookback.
fn lookback_start(dataset: &Dataset, start: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let (
        DatasetKind::Managed { write: WriteMode::Append { dedup_lookback, .. } },
        Partitioning::Time { grain, start: first, time_zone },
    ) = (&dataset.kind, &dataset.partitioning)
    else {
        return None;
    };
    let back = i32::try_from(*dedup_lookback).unwrap_or(i32::MAX);
    (back > 0).then(|| TimeAxis::new(*grain, *first, *time_zone).shift(start, -back))
}

/// The outcome of each release of a publication, in order.
pub(super) type Outcomes = Vec<tidegate_lake::Result<Publication>>;

/// Validated steps whose Delta commits are being made on their own task.
#[derive(Debug)]
pub(super) struct InPublication {
    pending: Vec<Pending>,
    commits: JoinHandle<Outcomes>,
}

impl InPublication {
    /// Whether the commits are done (the outcome is then ready without waiting).
    pub(super) fn is_done(&self) -> bool {
        self.commits.is_finished()
    }
}

/// Waits for the publication in progress, if any; never returns when there is none. Cancel safe:
/// a `select!` that takes another branch leaves the publication running.
pub(super) async fn finished(publishing: &mut Option<InPublication>) -> Result<Outcomes, JoinError> {
    match publishing {
        Some(p) => (&mut p.commits).await,
        None => std::future::pending().await,
    }
}

/// A validated step on its way to publication: what recording its release needs.
#[derive(Debug)]
struct Pending {
    step_id: String,
    epoch: u64,
    release_id: String,
    run_id: String,
    partition: String,
    version_ids: HashMap<String, String>,
    /// The partitions it replaces that other code published, in datasets with
    /// `rewrites = "free"`: journaled once its commit happened.
    free_rewrites: Vec<FreeRewrite>,
}

/// A published partition of a dataset with `rewrites = "free"` that a step replaces with the
/// output of another code version: no review, but the journal says so (`free_rewrite`).
#[derive(Debug, Clone)]
pub(super) struct FreeRewrite {
    decision: Decision,
    reason: String,
}

/// What [`Engine::guard_rewrites`] lets through, and what it refuses.
#[derive(Debug, Default)]
pub(super) struct Guarded {
    /// The steps that may be published.
    pub(super) allowed: Vec<String>,
    /// Per allowed step, the free rewrites it makes.
    free: HashMap<String, Vec<FreeRewrite>>,
    /// The refused steps, failed (`refused`).
    pub(super) refused: Vec<StepEventRecord>,
}

/// A release whose Delta commit happened, waiting to be recorded in the store with its step.
#[derive(Debug)]
struct Recorded {
    release: ReleaseRecord,
    /// The steps it publishes, each with the lease epoch its publication is fenced by.
    fence: Vec<(String, u64)>,
    /// Staged rows its publication left out (duplicates, late rows), for the journal.
    left_out: LeftOut,
}

/// Delivered rows a publication left out by its write mode's rules, for the journal and the
/// run's summary.
#[derive(Debug, Clone, Copy, Default)]
struct LeftOut {
    /// Append: rows whose `dedup_key` was already published or earlier in the delivery.
    duplicates: u64,
    /// Merge: rows older (by `order_by`) than the table's row of their key.
    late: u64,
}

impl LeftOut {
    fn of(publication: &Publication) -> LeftOut {
        let items = publication.items.iter();
        LeftOut {
            duplicates: items.clone().map(|i| i.n_duplicates_dropped).sum(),
            late: items.map(|i| i.n_late_rows_ignored).sum(),
        }
    }

    fn sum<'a>(all: impl Iterator<Item = &'a LeftOut>) -> LeftOut {
        all.fold(LeftOut::default(), |a, b| LeftOut { duplicates: a.duplicates + b.duplicates, late: a.late + b.late })
    }

    /// The journal's reason for the `published` entry: what was left out, when anything was.
    fn reason(&self) -> String {
        let mut reason = "published".to_owned();
        if self.duplicates > 0 {
            reason.push_str(&format!("; {} duplicate rows dropped by dedup_key", self.duplicates));
        }
        if self.late > 0 {
            reason.push_str(&format!(
                "; {} late rows ignored by merge (the table holds a newer row of their key by order_by)",
                self.late
            ));
        }
        reason
    }
}

impl Engine {
    /// The validated steps the pace lets publish now (a backfill's wait for `backfill publish`),
    /// and the earliest moment one held back by the pace may go.
    pub(super) fn publishable(&self, view: &View, pacer: &Pacer) -> (Vec<String>, Option<Instant>) {
        let now = Instant::now();
        // Ready steps held back by a paused backfill or a rate limit count as waiting too: the
        // pace then keeps to its old rule, which delays a commit by at most `PACE`.
        let waiting = view.count(StepStatus::Ready) > 0;
        let mut ready = Vec::new();
        let mut held_until: Option<Instant> = None;
        let mut validated: Vec<&Entry> =
            view.in_status(StepStatus::Validated).filter(|e| !e.record.state.needs_approval).collect();
        // Earlier partitions first: an append step waits for the earlier ones it de-duplicates
        // against, and goes with them when they go.
        validated.sort_by_key(|e| (e.record.interval.map(|i| i.start), e.record.partition.clone()));
        let earlier = Earlier::of(&self.spec, view, &validated);
        let mut going: HashSet<String> = HashSet::new();
        for e in validated {
            if earlier.unsettled(e, &going) {
                continue;
            }
            match pacer.due(self.outputs_of(&e.record.task), now, waiting) {
                Some(at) => held_until = Some(held_until.map_or(at, |h| h.min(at))),
                None => {
                    going.insert(e.record.id.clone());
                    ready.push(e.record.id.clone());
                }
            }
        }
        (ready, held_until)
    }

    fn outputs_of(&self, task: &str) -> &[String] {
        self.spec.tasks.get(task).map_or(&[], |t| &t.outputs[..])
    }

    /// The last check before `step_ids` are committed (decision 0020): a step whose partition
    /// holds the output of another code version than the step's is refused (failed, naming
    /// both and the backfill that would replace it under review), unless the dataset says
    /// `rewrites = "free"`, when the replacement goes ahead and is journaled after its commit.
    /// A run is checked when it is submitted too; this catches what was published meanwhile.
    pub(super) async fn guard_rewrites(
        &self,
        step_ids: Vec<String>,
        view: &View,
        correlation: &str,
    ) -> Result<Guarded> {
        if !self.code_check {
            return Ok(Guarded { allowed: step_ids, ..Guarded::default() });
        }
        let mut wanted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for e in step_ids.iter().filter_map(|id| view.get(id)).filter(|e| e.record.code_version.is_some()) {
            for d in self.outputs_of(&e.record.task) {
                wanted.entry(d.clone()).or_default().insert(e.record.partition.clone());
            }
        }
        let published: BTreeMap<String, BTreeMap<String, Option<String>>> = if wanted.is_empty() {
            BTreeMap::new()
        } else {
            self.db(move |s| {
                wanted
                    .into_iter()
                    .map(|(d, parts)| {
                        let parts: Vec<String> = parts.into_iter().collect();
                        s.published_code_versions(&d, &parts).map(|v| (d, v))
                    })
                    .collect()
            })
            .await?
        };
        let mut guarded = Guarded::default();
        for step_id in step_ids {
            let Some(e) = view.get(&step_id) else { continue };
            match self.rewrites_of(e, &published) {
                Ok(free) => {
                    guarded.free.insert(step_id.clone(), free);
                    guarded.allowed.push(step_id);
                }
                Err(reason) => {
                    let meta = self.meta(reason.clone(), correlation);
                    guarded.refused.push(StepEventRecord { step_id, event: StepEvent::Refused { reason }, meta });
                }
            }
        }
        Ok(guarded)
    }

    /// The free rewrites publishing `e` makes, or why it is refused.
    fn rewrites_of(
        &self,
        e: &crate::view::Entry,
        published: &BTreeMap<String, BTreeMap<String, Option<String>>>,
    ) -> std::result::Result<Vec<FreeRewrite>, String> {
        let (record, mut free) = (&e.record, Vec::new());
        let Some(planned) = record.code_version.as_deref() else { return Ok(free) };
        for d in self.outputs_of(&record.task) {
            let Some(Some(before)) = published.get(d).and_then(|p| p.get(&record.partition)) else { continue };
            if before == planned {
                continue;
            }
            let (task, partition) = (&record.task, &record.partition);
            let (was, now) = (crate::code::short(before), crate::code::short(planned));
            let policy = self.spec.datasets.get(d).map(|d| d.rewrites).unwrap_or_default();
            if policy == tidegate_core::spec::Rewrites::Review {
                return Err(format!(
                    "refused at publication: partition {partition} of {d} holds the output of code version {was} \
                     and this step's is {now}; replacing published history needs review: \
                     `tidegate backfill plan {task} --from {partition} --to {partition} --reprocess all --reason \
                     \"...\"` (or declare rewrites = \"free\" in [datasets.{d}])"
                ));
            }
            let decision = Decision {
                kind: "free_rewrite".to_owned(),
                run_id: Some(record.run_id.clone()),
                task: Some(task.clone()),
                partition: Some(partition.clone()),
                payload: serde_json::json!({
                    "dataset": d, "step_id": record.id, "published_code_version": before, "code_version": planned,
                    "rewrites": "free",
                }),
            };
            let reason = format!(
                "free rewrite (rewrites = \"free\" in [datasets.{d}]): partition {partition}, published by code \
                 version {was}, replaced by task {task}'s code version {now} without review"
            );
            free.push(FreeRewrite { decision, reason });
        }
        Ok(free)
    }

    /// Starts publishing `step_ids` (validated steps): their staged versions are read from the
    /// store in one trip, and the Delta commits are made on their own task; the pacer notes their
    /// datasets. `None` when none of the steps is still in the view.
    pub(super) async fn start_publication(
        &self,
        guarded: Guarded,
        view: &View,
        pacer: &mut Pacer,
    ) -> Result<Option<InPublication>> {
        let Guarded { allowed, mut free, .. } = guarded;
        let step_ids = &allowed[..];
        // The versions this loop recorded when the steps staged; steps staged before a restart
        // (or by another scheduler) have theirs read back, in one trip.
        let unknown: Vec<String> = step_ids.iter().filter(|id| view.staged(id).is_none()).cloned().collect();
        let mut read: HashMap<String, Vec<VersionRecord>> = if unknown.is_empty() {
            HashMap::new()
        } else {
            self.db(move |s| unknown.into_iter().map(|id| s.versions(&id).map(|v| (id, v))).collect()).await?
        };
        // The journal's head, carried by the commits: the lake then vouches for every entry up to it.
        let project = self.spec.project.name.clone();
        let anchor = self.db(|s| s.journal_head()).await?.map(|h| tidegate_lake::Anchor {
            journal_seq: h.seq,
            journal_hash: h.hash,
            project: project.clone(),
        });
        let mut pending = Vec::with_capacity(step_ids.len());
        let mut releases = Vec::with_capacity(step_ids.len());
        for step_id in step_ids {
            let records = match view.staged(step_id) {
                Some(noted) => noted.to_vec(),
                None => read.remove(step_id).unwrap_or_default(),
            };
            if let Some((mut p, release)) = self.prepare_release(step_id, &records, view, &anchor)? {
                p.free_rewrites = free.remove(step_id).unwrap_or_default();
                pending.push(p);
                releases.push(release);
            }
        }
        if pending.is_empty() {
            return Ok(None);
        }
        let now = Instant::now();
        for step_id in step_ids {
            if let Some(e) = view.get(step_id) {
                pacer.started(self.outputs_of(&e.record.task), now);
            }
        }
        let lake = self.lake.clone();
        let retry_pause = self.trouble.lock().map_or(RETRY_PAUSE, |t| t.pause());
        let commits = tokio::spawn(async move {
            crate::failpoint::hit("after-stage");
            crate::failpoint::hit("before-commit");
            tidegate_lake::failpoint::pause("before-commit").await;
            let outcomes = lake.publish_many(&releases).await;
            if outcomes.iter().any(Result::is_ok) {
                crate::failpoint::hit("after-commit");
            }
            if outcomes.iter().any(|o| o.as_ref().is_err_and(tidegate_lake::Error::is_retryable)) {
                tokio::time::sleep(retry_pause).await;
            }
            outcomes
        });
        Ok(Some(InPublication { pending, commits }))
    }

    /// Settles a finished publication: records the releases whose commits happened (fenced, in
    /// one transaction), marks steps superseded by a newer snapshot, fails steps whose commit
    /// failed deterministically, and leaves steps that met a retryable error validated, so a later
    /// publication takes them again.
    pub(super) async fn finish_publication(
        &self,
        publication: InPublication,
        outcomes: Result<Outcomes, JoinError>,
        view: &mut View,
        summary: &mut Summary,
        correlation: &str,
    ) -> Result<()> {
        let outcomes = outcomes.map_err(|e| Error::Internal(format!("the publication task failed: {e}")))?;
        let mut recorded: Vec<Recorded> = Vec::new();
        let mut events: Vec<StepEventRecord> = Vec::new();
        let mut free_rewrites: Vec<FreeRewrite> = Vec::new();
        for (mut p, outcome) in publication.pending.into_iter().zip(outcomes) {
            if outcome.is_ok() {
                free_rewrites.append(&mut p.free_rewrites);
            }
            let run_id = view.get(&p.step_id).map(|e| e.record.run_id.clone()).unwrap_or_default();
            match &outcome {
                Ok(publication) => tracing::info!(
                    run_id,
                    step_id = p.step_id,
                    release_id = publication.release_id,
                    tables = ?publication.items.iter().map(|i| (&i.dataset, i.table_version)).collect::<Vec<_>>(),
                    "published"
                ),
                Err(e) if e.is_retryable() => self.note_trouble(&run_id, &p.step_id, e),
                Err(e) => tracing::warn!(run_id, step_id = p.step_id, error = %e, "publication failed"),
            }
            match outcome {
                Ok(publication) => recorded.push(self.recorded(p, &publication)),
                Err(tidegate_lake::Error::SupersededSnapshot { dataset, staged, published }) => {
                    let reason = format!("the published snapshot of {dataset} ({published}) is newer than {staged}");
                    events.push(StepEventRecord {
                        step_id: p.step_id,
                        event: StepEvent::Superseded { by: format!("{dataset}@{published}") },
                        meta: self.meta(reason, correlation),
                    });
                }
                // Left validated: the next publication takes it again.
                Err(e) if e.is_retryable() => {}
                Err(e) => events.push(StepEventRecord {
                    step_id: p.step_id,
                    event: StepEvent::AttemptFailed {
                        epoch: p.epoch,
                        class: ErrorClass::Deterministic,
                        reason: format!("publication failed: {e}"),
                        at: self.clock.now(),
                        jitter: 0.0,
                    },
                    meta: self.meta("publication failed", correlation),
                }),
            }
        }
        self.commit(events, view, summary).await?;
        let any = !recorded.is_empty();
        if any && let Some((after, n)) = self.trouble.lock().ok().and_then(|mut t| t.recovered(Instant::now())) {
            tracing::warn!(n_failures = n, failing_for_s = after.as_secs(), "publication succeeded again");
        }
        // The last release of each run in this publication, for the pointer.
        let mut last_of_run: BTreeMap<String, String> = BTreeMap::new();
        for r in &recorded {
            if let Some(run) = &r.release.run_id {
                last_of_run.insert(run.clone(), r.release.id.clone());
            }
        }
        self.record_releases(recorded, view, summary, correlation).await?;
        if any {
            crate::failpoint::hit("after-record-release");
        }
        for FreeRewrite { decision, reason } in free_rewrites {
            let meta = self.meta(reason, correlation);
            self.db(move |s| s.record_decision(&decision, &meta)).await?;
        }
        for (run_id, release) in last_of_run {
            if view.run_succeeded(&run_id) {
                self.advance_pointer(&run_id, release, view, correlation).await?;
            }
        }
        Ok(())
    }

    /// Logs a publication failing with a retryable error: the first time, then once every
    /// [`TROUBLE_EVERY`] while it goes on.
    fn note_trouble(&self, run_id: &str, step_id: &str, e: &tidegate_lake::Error) {
        let logged = self.trouble.lock().ok().and_then(|mut t| t.failed(Instant::now()));
        if let Some((for_how_long, n)) = logged {
            tracing::warn!(
                run_id,
                step_id,
                error = %e,
                n_failures = n,
                failing_for_s = for_how_long.as_secs(),
                "publication failed; it is retried until it succeeds (free the disk or bring the lake back)"
            );
        }
    }

    /// Moves the release pointer to a run that just succeeded: every dataset it wrote at its
    /// version now. A pointer the lake refuses to take is journaled (`pointer_not_advanced`) and
    /// the drain goes on: what was published stays published; pointer readers see it with the
    /// next pointer that names those datasets.
    async fn advance_pointer(&self, run_id: &str, release: String, view: &View, correlation: &str) -> Result<()> {
        let mut datasets: BTreeSet<&str> = BTreeSet::new();
        for e in view.entries().filter(|e| e.record.run_id == run_id) {
            datasets.extend(self.outputs_of(&e.record.task).iter().map(String::as_str));
        }
        let mut tables = BTreeMap::new();
        let mut outcome = Ok(());
        for d in datasets {
            match self.lake.table_version(d).await {
                Ok(Some(v)) => {
                    tables.insert(d.to_owned(), v);
                }
                Ok(None) => {}
                Err(e) => outcome = Err(e),
            }
        }
        if outcome.is_ok() {
            let advance = Advance {
                release: release.clone(),
                run_id: Some(run_id.to_owned()),
                backfill_id: None,
                at: self.clock.now(),
                tables,
            };
            outcome = self.lake.advance_pointer(advance).await.map(|_| ());
        }
        if let Err(e) = outcome {
            let decision = Decision {
                kind: "pointer_not_advanced".to_owned(),
                run_id: Some(run_id.to_owned()),
                task: None,
                partition: None,
                payload: serde_json::json!({ "release_id": release, "error": e.to_string() }),
            };
            let meta = self.meta(format!("the release pointer did not move to run {run_id}: {e}"), correlation);
            self.db(move |s| s.record_decision(&decision, &meta)).await?;
        }
        Ok(())
    }

    /// The store's record of a step's release whose commits happened.
    fn recorded(&self, p: Pending, publication: &Publication) -> Recorded {
        let items = publication
            .items
            .iter()
            .map(|i| ReleaseItem {
                dataset: i.dataset.clone(),
                partition: p.partition.clone(),
                version_id: p.version_ids.get(&i.dataset).cloned(),
                delta_version: i64::try_from(i.table_version).unwrap_or(i64::MAX),
                restored_delta_version: None,
                // An append whose every row was already published changed nothing readers see.
                unchanged: !i.already_published && i.n_rows_added == 0 && i.n_files_removed == 0,
            })
            .collect();
        let release = ReleaseRecord {
            id: p.release_id,
            kind: ReleaseKind::Publish,
            run_id: Some(p.run_id),
            backfill_id: None,
            restores_release_id: None,
            created_by: self.opts.worker_id.clone(),
            created_at: self.clock.now(),
            items,
        };
        Recorded { release, fence: vec![(p.step_id, p.epoch)], left_out: LeftOut::of(publication) }
    }

    /// Records published releases in one store transaction (the releases of a shared Delta
    /// commit); if that fails, one by one, so the release at fault does not hold back the others
    /// and its error is the one reported.
    async fn record_releases(
        &self,
        recorded: Vec<Recorded>,
        view: &mut View,
        summary: &mut Summary,
        correlation: &str,
    ) -> Result<()> {
        if recorded.is_empty() {
            return Ok(());
        }
        // The journal says what a publication left out (the commit records it too).
        let meta = self.meta(LeftOut::sum(recorded.iter().map(|r| &r.left_out)).reason(), correlation);
        let batch: Vec<(ReleaseRecord, Vec<(String, u64)>)> =
            recorded.iter().map(|r| (r.release.clone(), r.fence.clone())).collect();
        let together = {
            let meta = meta.clone();
            self.db(move |s| s.record_releases(&batch, &meta)).await
        };
        let outcomes = match together {
            Ok(outcomes) => outcomes,
            Err(_) if recorded.len() > 1 => {
                let mut outcomes = Vec::with_capacity(recorded.len());
                for r in &recorded {
                    let meta = self.meta(r.left_out.reason(), correlation);
                    let (record, fence) = (r.release.clone(), r.fence.clone());
                    outcomes.push(self.db(move |s| s.record_release(&record, &fence, &meta)).await?);
                }
                outcomes
            }
            Err(e) => return Err(e),
        };
        // `record_release` returns one outcome per fenced step, in order.
        let mut refused = Vec::new();
        for (r, step_outcomes) in recorded.iter().zip(outcomes) {
            summary.duplicates_dropped += r.left_out.duplicates;
            summary.late_rows_ignored += r.left_out.late;
            for ((step_id, _), o) in r.fence.iter().zip(step_outcomes) {
                if matches!(o, tidegate_store::Outcome::Rejected { .. }) {
                    refused.push((step_id.clone(), r.release.clone()));
                }
                self.absorb_outcome(step_id, o, view, summary);
            }
        }
        for (step_id, release) in refused {
            self.withdraw_if_ended(&step_id, &release, view, correlation).await?;
        }
        Ok(())
    }

    /// Takes back the commits of a release the store refused to record because its step ended
    /// meanwhile (a `cancel` between the commit and the record): published rows must not stay
    /// live outside the journal. A step still validated (the refusal was fencing: another
    /// scheduler publishes it) is left alone. What is done, or why not, is journaled.
    async fn withdraw_if_ended(
        &self,
        step_id: &str,
        release: &ReleaseRecord,
        view: &mut View,
        correlation: &str,
    ) -> Result<()> {
        let id = step_id.to_owned();
        let Some(step) = self.db(move |s| s.step(&id)).await? else { return Ok(()) };
        if !step.status().is_terminal() || step.status() == StepStatus::Published {
            return Ok(());
        }
        // The view learns that the step ended, so no later turn publishes it again.
        view.update(step_id, step.state.clone());
        let id = step_id.to_owned();
        let versions = self.db(move |s| s.versions(&id)).await?;
        for item in &release.items {
            let keys = versions
                .iter()
                .find(|v| Some(&v.id) == item.version_id.as_ref())
                .and_then(|v| serde_json::from_value::<tidegate_lake::StagedVersion>(v.files.clone()).ok())
                .map_or_else(|| vec![item.partition.clone()], |staged| staged.partition_keys());
            let why = format!("step {step_id} was {} while its publication committed", step.status());
            let outcome = match (self.spec.datasets.get(&item.dataset), u64::try_from(item.delta_version)) {
                (Some(dataset), Ok(version)) => {
                    self.lake.withdraw(dataset, step_id, version, &keys, &why).await.map_err(|e| e.to_string())
                }
                _ => Err(format!("{} is not a dataset of this spec", item.dataset)),
            };
            let (kind, reason) = match &outcome {
                Ok(v) => ("publication_withdrawn", format!("{why}: its commit was taken back (version {v})")),
                Err(e) => ("publication_not_withdrawn", format!("{why}; taking its commit back failed: {e}")),
            };
            if let Err(e) = &outcome {
                tracing::error!(step_id, dataset = item.dataset, error = e, "a cancelled step's commit stays");
            }
            let decision = Decision {
                kind: kind.to_owned(),
                run_id: Some(step.run_id.clone()),
                task: Some(step.task.clone()),
                partition: Some(step.partition.clone()),
                payload: serde_json::json!({
                    "release_id": release.id, "dataset": item.dataset, "table_version": item.delta_version,
                    "restored_as": outcome.as_ref().ok(),
                }),
            };
            let meta = self.meta(reason, correlation);
            self.db(move |s| s.record_decision(&decision, &meta)).await?;
        }
        Ok(())
    }

    /// The release that publishes a validated step's staged versions (its last attempt's), from
    /// the step's version records.
    fn prepare_release(
        &self,
        step_id: &str,
        records: &[VersionRecord],
        view: &View,
        anchor: &Option<tidegate_lake::Anchor>,
    ) -> Result<Option<(Pending, tidegate_lake::Release)>> {
        let Some(entry) = view.get(step_id) else { return Ok(None) };
        let attempt = entry.record.state.attempt;
        let task = &self.spec.tasks[&entry.record.task];
        let mut items = Vec::new();
        let mut version_ids = HashMap::new();
        for dataset_name in &task.outputs {
            let Some(rec) = records.iter().rev().find(|r| r.attempt == attempt && &r.dataset == dataset_name) else {
                return Err(Error::Internal(format!(
                    "step {step_id} is validated but has no staged version of {dataset_name}"
                )));
            };
            let staged: tidegate_lake::StagedVersion = serde_json::from_value(rec.files.clone())
                .map_err(|e| Error::Internal(format!("decoding staged version {}: {e}", rec.id)))?;
            version_ids.insert(dataset_name.clone(), rec.id.clone());
            items.push(tidegate_lake::ReleaseItem {
                dataset: self.spec.datasets[dataset_name].clone(),
                staged,
                step_identity: step_id.to_owned(),
            });
        }
        let release_id = format!("rel-{step_id}");
        let release = tidegate_lake::Release {
            release_id: release_id.clone(),
            run_id: entry.record.run_id.clone(),
            spec_hash: self.spec.hash.clone(),
            items,
            anchor: anchor.clone(),
        };
        let pending = Pending {
            step_id: step_id.to_owned(),
            epoch: entry.record.state.epoch,
            release_id,
            run_id: entry.record.run_id.clone(),
            partition: entry.record.partition.clone(),
            free_rewrites: Vec::new(),
            version_ids,
        };
        Ok(Some((pending, release)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(ds: &[&str]) -> Vec<String> {
        ds.iter().map(|d| (*d).to_owned()).collect()
    }

    #[test]
    fn a_publication_failing_again_and_again_is_logged_rarely_and_retried_ever_more_slowly() {
        let mut trouble = Trouble::default();
        let t0 = Instant::now();
        assert_eq!(trouble.pause(), RETRY_PAUSE);
        assert_eq!(trouble.failed(t0), Some((Duration::ZERO, 1)), "the first failure is logged");
        assert_eq!(trouble.pause(), RETRY_PAUSE * 2);
        assert_eq!(trouble.failed(t0 + Duration::from_secs(1)), None, "not the next ones");
        assert_eq!(trouble.failed(t0 + TROUBLE_EVERY), Some((TROUBLE_EVERY, 3)), "then one every TROUBLE_EVERY");
        for _ in 0..20 {
            trouble.failed(t0 + TROUBLE_EVERY);
        }
        assert_eq!(trouble.pause(), RETRY_PAUSE_MAX);
        assert_eq!(trouble.recovered(t0 + TROUBLE_EVERY * 2), Some((TROUBLE_EVERY * 2, 23)));
        assert_eq!(trouble.recovered(t0 + TROUBLE_EVERY * 2), None, "a success after a success ends nothing");
        assert_eq!(trouble.pause(), RETRY_PAUSE);
    }

    #[test]
    fn the_pace_holds_a_dataset_back_only_while_steps_wait_for_a_slot() {
        let t0 = Instant::now();
        let mut pacer = Pacer::default();
        let (a, b) = (names(&["a"]), names(&["b"]));
        assert_eq!(pacer.due(&a, t0, true), None, "a dataset never published goes at once");
        pacer.started(&a, t0);
        let soon = t0 + PACE / 2;
        assert_eq!(pacer.due(&a, soon, true), Some(t0 + PACE), "busy slots: the next commit waits out the pace");
        assert_eq!(pacer.due(&a, soon, false), None, "idle slots: waiting gains nothing");
        assert_eq!(pacer.due(&b, soon, true), None, "another dataset is not held back");
        assert_eq!(pacer.due(&a, t0 + PACE, true), None, "the pace has elapsed");
        let both = names(&["a", "b"]);
        pacer.started(&b, soon);
        assert_eq!(pacer.due(&both, soon, true), Some(soon + PACE), "a step writing both waits for the later");
    }
}
