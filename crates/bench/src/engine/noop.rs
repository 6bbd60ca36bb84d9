//! B1: pre-planned no-op steps drained by the in-process engine on SQLite.
//!
//! A no-op step's attempt does no work: [`Noop`] reports at once an empty staged version of each
//! output (no files, no rows) without touching the lake, so the engine records it as a real
//! attempt's report (one version row per output). The steps are planned with `needs_approval`,
//! as a backfill's are, so the engine stops each at `awaiting_approval` instead of publishing it:
//! publishing would make one Delta commit per step, which is the lake's cost (see B2 and B4), not
//! the scheduler's. The store side of publication (recording a tick's releases and `Published`
//! events in one transaction, as `Engine::publish` does after its Delta commit, with the staged
//! versions the engine noted when it recorded them) is then timed through the store for every
//! step and counted in the step rate.
//!
//! Baseline: the same store calls for the same steps in a plain loop, with the engine's batch
//! sizes (group commits of at most `MAX_EVENTS_PER_COMMIT` events, claims of at most
//! `MAX_CLAIMS_PER_TICK`): what the store costs without the scheduler around it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use chrono::{Duration, TimeZone as _, Utc};
use serde_json::json;
use tidegate_core::state::{StepEvent, StepStatus};
use tidegate_engine::attempt::{Attempt, Report, ReportFuture, Runner};
use tidegate_engine::executor::{MAX_CLAIMS_PER_TICK, MAX_EVENTS_PER_COMMIT};
use tidegate_lake::{Lake, StagedVersion};
use tidegate_store::{
    ClaimRequest, JournalMeta, Outcome, Priority, ReleaseItem, ReleaseKind, ReleaseRecord, RunRequest, StagedRecord,
    StepEventRecord, StepRecord, Store, Trigger, VersionRecord,
};

use super::{Outcome as BenchOutcome, per_s, rate_json, spread, workspace};
use crate::{Samples, progress, ratio, round};
use tidegate_app::target::{Partitions, Target};
use tidegate_app::workspace::{self as ws_mod, Workspace, open_lake, runtime};
use tidegate_app::{run, submit};

/// The aim, in steps per second.
const AIM_STEPS_PER_S: f64 = 5_000.0;
/// Who the benchmark's journal entries name.
const ACTOR: &str = "bench-b1";

/// Sizes of B1.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub n_steps: usize,
    pub n_runs: usize,
    pub workers: usize,
}

/// An attempt runner that does nothing: it reports an empty staged version of each output.
#[derive(Debug, Clone, Copy)]
pub struct Noop;

impl Runner for Noop {
    fn run(&self, attempt: Attempt, _store: Arc<dyn Store>, _lake: Arc<Lake>) -> ReportFuture {
        Box::pin(async move {
            let staging_id = format!("{}-{}", attempt.step.id, attempt.lease.attempt);
            let versions =
                attempt.outputs.iter().map(|d| empty_version(&d.name, &staging_id, &attempt.partition)).collect();
            Report::Staged {
                step_id: attempt.step.id,
                epoch: attempt.lease.epoch,
                versions,
                checks: Vec::new(),
                ended_at: attempt.clock.now(),
            }
        })
    }
}

fn empty_version(dataset: &str, staging_id: &str, partition: &tidegate_core::partition::Partition) -> StagedVersion {
    StagedVersion {
        dataset: dataset.to_owned(),
        staging_id: staging_id.to_owned(),
        partitions: vec![partition.clone()],
        files: Vec::new(),
        n_rows: 0,
        schema_hash: String::new(),
        checksum: String::new(),
        columns: Vec::new(),
    }
}

/// The spec: one command task writing one hourly dataset; it never runs.
fn spec(workers: usize) -> String {
    format!(
        "[project]\nname = \"bench_b1\"\n\n[pools.default]\nslots = {workers}\n\n[datasets.out]\n\
         partitioning = {{ grain = \"hour\", start = \"2000-01-01T00:00:00Z\" }}\nwrite = {{ mode = \"replace\" }}\n\n\
         [tasks.noop]\ncommand = [\"/bin/true\"]\noutputs = [\"out\"]\n"
    )
}

/// A workspace with `n_steps` pre-planned steps over `n_runs` runs, each run a range of hours.
fn prepare(dir: &Path, sizes: Sizes) -> Result<(Workspace, Arc<dyn Store>, Vec<String>)> {
    workspace(dir, &spec(sizes.workers.max(1)))?;
    let ws = ws_mod::load(Some(dir))?;
    let store = ws.open_store()?;
    let first = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single().context("a valid instant")?;
    let mut run_ids = Vec::new();
    let per_run = sizes.n_steps.div_ceil(sizes.n_runs);
    let mut start = 0usize;
    while start < sizes.n_steps {
        let end = (start + per_run).min(sizes.n_steps);
        let hour = |i: usize| (first + Duration::hours(i as i64)).to_rfc3339();
        let target = Target {
            target: "noop".to_owned(),
            partitions: Partitions::Range { from: hour(start), to: hour(end - 1) },
            only: true,
            downstream: false,
        };
        let planned = target.plan(&ws.spec)?;
        ensure!(planned.steps.len() == end - start, "planned {} steps, expected {}", planned.steps.len(), end - start);
        let steps = submit::new_steps(&ws, &planned, &BTreeMap::new(), true)?;
        let request = RunRequest {
            target: "noop".to_owned(),
            partitions: vec![format!("{}..{}", hour(start), hour(end - 1))],
            scope: "only".to_owned(),
            trigger: Trigger::Manual,
            priority: Priority::Live,
            requester: ACTOR.to_owned(),
            spec_hash: ws.spec.hash.clone(),
            params: BTreeMap::new(),
            backfill_id: None,
            idempotency_key: None,
        };
        let submission = store.submit_run(&request, &steps, &meta("bench B1 submission"))?;
        run_ids.push(submission.run.id);
        start = end;
    }
    Ok((ws, store, run_ids))
}

fn meta(reason: &str) -> JournalMeta {
    JournalMeta {
        via: None,
        actor: ACTOR.to_owned(),
        correlation_id: "bench-b1".to_owned(),
        reason: reason.to_owned(),
        at: Utc::now(),
    }
}

fn all_steps(store: &dyn Store, run_ids: &[String]) -> Result<Vec<StepRecord>> {
    let mut steps = Vec::new();
    for id in run_ids {
        steps.extend(store.steps(id)?);
    }
    Ok(steps)
}

/// The version row the engine records for a no-op report (as `Engine::absorb_report` builds it).
fn version_record(step: &StepRecord, attempt: u32, dataset: &str) -> VersionRecord {
    let partition = tidegate_core::partition::Partition { key: step.partition.clone(), interval: step.interval };
    let staged = empty_version(dataset, &format!("{}-{attempt}", step.id), &partition);
    VersionRecord {
        id: format!("{}:{}", staged.staging_id, staged.dataset),
        step_id: step.id.clone(),
        attempt,
        dataset: dataset.to_owned(),
        partition: staged.partition_keys().join(","),
        files: serde_json::to_value(&staged).unwrap_or_default(),
        n_rows: 0,
        schema_hash: String::new(),
        checksum: String::new(),
        stats: json!([]),
        created_at: Utc::now(),
    }
}

/// Moves every step from `awaiting_approval` to `validated` (untimed: a normal step gets there
/// directly), then times the store side of publishing them as `Engine::publish` does it: record
/// a tick's one-item releases (naming the versions the engine noted at staging) and `Published`
/// events in one transaction.
fn publication_bookkeeping(store: &dyn Store, run_ids: &[String]) -> Result<f64> {
    let steps = all_steps(store, run_ids)?;
    let approvals: Vec<StepEventRecord> = steps
        .iter()
        .map(|s| StepEventRecord {
            step_id: s.id.clone(),
            event: StepEvent::Approved { by: ACTOR.to_owned() },
            meta: meta("bench: stands in for checks passing without approval"),
        })
        .collect();
    for chunk in approvals.chunks(MAX_EVENTS_PER_COMMIT) {
        store.commit(chunk)?;
    }
    let started = Instant::now();
    // The engine records the releases of the steps it publishes in one tick together; a tick
    // claims at most `MAX_CLAIMS_PER_TICK` steps, so that is the batch here.
    for (c, chunk) in steps.chunks(MAX_CLAIMS_PER_TICK).enumerate() {
        let mut batch = Vec::with_capacity(chunk.len());
        for (j, step) in chunk.iter().enumerate() {
            // The engine publishes the versions it noted when it recorded the step's staging (it
            // reads them back from the store only for steps staged before a restart).
            let version = version_record(step, step.state.attempt, "out");
            let delta_version = c * MAX_CLAIMS_PER_TICK + j + 1;
            let record = ReleaseRecord {
                id: format!("rel-{}", step.id),
                kind: ReleaseKind::Publish,
                run_id: Some(step.run_id.clone()),
                backfill_id: None,
                restores_release_id: None,
                created_by: ACTOR.to_owned(),
                created_at: Utc::now(),
                items: vec![ReleaseItem {
                    dataset: version.dataset.clone(),
                    partition: step.partition.clone(),
                    version_id: Some(version.id.clone()),
                    delta_version: i64::try_from(delta_version).unwrap_or(i64::MAX),
                    restored_delta_version: None,
                    unchanged: false,
                }],
            };
            batch.push((record, vec![(step.id.clone(), step.state.epoch)]));
        }
        let outcomes = store.record_releases(&batch, &meta("published"))?;
        for ((record, _), outcome) in batch.iter().zip(outcomes) {
            ensure!(
                outcome.iter().all(|o| matches!(o, Outcome::Applied { .. })),
                "release {} was not recorded: {outcome:?}",
                record.id
            );
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The baseline: the lifecycle the engine gives each step, as plain store calls in a loop.
fn store_loop(store: &dyn Store, run_ids: &[String]) -> Result<f64> {
    let started = Instant::now();
    let steps = all_steps(store, run_ids)?;
    let deps: Vec<StepEventRecord> = steps
        .iter()
        .map(|s| StepEventRecord {
            step_id: s.id.clone(),
            event: StepEvent::DepsMet { inputs: Vec::new() },
            meta: meta("upstream settled"),
        })
        .collect();
    for chunk in deps.chunks(MAX_EVENTS_PER_COMMIT) {
        store.commit(chunk)?;
    }
    let by_id: std::collections::HashMap<&str, &StepRecord> = steps.iter().map(|s| (s.id.as_str(), s)).collect();
    for chunk in steps.chunks(MAX_CLAIMS_PER_TICK) {
        let requests: Vec<ClaimRequest> = chunk
            .iter()
            .map(|s| ClaimRequest { step_id: s.id.clone(), worker: ACTOR.to_owned(), meta: meta("claimed") })
            .collect();
        let leases = store.claim_steps(&requests, Utc::now(), 30)?;
        let leases: Vec<_> = leases.into_iter().flatten().collect();
        // The engine records the staged output of the reports it absorbs in one tick together,
        // each with its validation events.
        let staged: Vec<StagedRecord> = leases
            .iter()
            .map(|lease| StagedRecord {
                step_id: lease.step_id.clone(),
                epoch: lease.epoch,
                versions: vec![version_record(by_id[lease.step_id.as_str()], lease.attempt, "out")],
                meta: meta("staged 0 rows"),
                then: [
                    StepEvent::ValidationStarted { epoch: lease.epoch },
                    StepEvent::ChecksPassed { epoch: lease.epoch },
                ]
                .into_iter()
                .map(|event| StepEventRecord { step_id: lease.step_id.clone(), event, meta: meta("checks") })
                .collect(),
            })
            .collect();
        store.record_staged_many(&staged)?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Counts the steps of `run_ids` in `status`.
fn count_in(store: &dyn Store, run_ids: &[String], status: StepStatus) -> Result<usize> {
    Ok(all_steps(store, run_ids)?.iter().filter(|s| s.status() == status).count())
}

pub fn b1(dir: &Path, sizes: Sizes, repeats: usize) -> Result<BenchOutcome> {
    let rt = runtime()?;
    let (mut drain, mut engine_books) = (Samples::default(), Samples::default());
    let (mut baseline, mut baseline_books) = (Samples::default(), Samples::default());
    for r in 0..repeats {
        progress(&format!("B1 run {}: submitting {} steps for the engine (untimed)", r + 1, sizes.n_steps));
        let (ws, store, run_ids) = prepare(&dir.join(format!("engine-{r}")), sizes)?;
        progress(&format!("B1 run {}: draining with the no-op runner", r + 1));
        let seconds = rt.block_on(async {
            let lake = open_lake(&ws).await?;
            let engine = run::engine(&ws, store.clone(), lake, sizes.workers).with_runner(Arc::new(Noop));
            let started = Instant::now();
            let summary = engine.drain().await?;
            let seconds = started.elapsed().as_secs_f64();
            ensure!(
                summary.awaiting_approval == sizes.n_steps && summary.failed == 0,
                "the drain left {summary:?}, expected {} steps awaiting approval",
                sizes.n_steps
            );
            anyhow::Ok(seconds)
        })?;
        drain.0.push(seconds);
        engine_books.0.push(publication_bookkeeping(store.as_ref(), &run_ids)?);
        ensure!(count_in(store.as_ref(), &run_ids, StepStatus::Published)? == sizes.n_steps, "not all published");
        drop(store);

        progress(&format!("B1 run {}: submitting {} steps for the baseline (untimed)", r + 1, sizes.n_steps));
        let (_ws, store, run_ids) = prepare(&dir.join(format!("baseline-{r}")), sizes)?;
        progress(&format!("B1 run {}: the same store calls in a plain loop", r + 1));
        baseline.0.push(store_loop(store.as_ref(), &run_ids)?);
        ensure!(
            count_in(store.as_ref(), &run_ids, StepStatus::AwaitingApproval)? == sizes.n_steps,
            "the baseline loop left steps behind"
        );
        baseline_books.0.push(publication_bookkeeping(store.as_ref(), &run_ids)?);
        // The workspaces hold a few hundred MB at 100,000 steps: remove each once measured.
        drop(store);
        let _ = std::fs::remove_dir_all(dir.join(format!("engine-{r}")));
        let _ = std::fs::remove_dir_all(dir.join(format!("baseline-{r}")));
    }
    let total = drain.sum(&engine_books);
    let baseline_total = baseline.sum(&baseline_books);
    let steps_per_s = per_s(sizes.n_steps, total.median());
    let aim_met = steps_per_s >= AIM_STEPS_PER_S;
    let json = json!({
        "steps": sizes.n_steps,
        "runs": sizes.n_runs,
        "workers": sizes.workers,
        "repeats": repeats,
        "engine_drain": rate_json(&drain, sizes.n_steps),
        "publication_bookkeeping": rate_json(&engine_books, sizes.n_steps),
        "engine_total": rate_json(&total, sizes.n_steps),
        "steps_per_s": round(steps_per_s),
        "baseline_store_loop": rate_json(&baseline, sizes.n_steps),
        "baseline_publication_bookkeeping": rate_json(&baseline_books, sizes.n_steps),
        "baseline_total": rate_json(&baseline_total, sizes.n_steps),
        "ratio_to_baseline": round(ratio(total.median(), baseline_total.median())),
        "aim_steps_per_s": AIM_STEPS_PER_S,
        "aim_met": aim_met,
    });
    let mut o = String::new();
    let _ = writeln!(
        o,
        "B1. {} pre-planned no-op steps in {} run(s), in-process engine on SQLite, {} attempts in flight",
        sizes.n_steps, sizes.n_runs, sizes.workers
    );
    let row = |o: &mut String, what: &str, s: &Samples| {
        let _ = writeln!(o, "   {what:<58} {:>28} {:>10.0} steps/s", spread(s), per_s(sizes.n_steps, s.median()));
    };
    row(&mut o, "engine drain (no-op runner, stops at awaiting_approval)", &drain);
    row(&mut o, "+ publication bookkeeping in the store (no Delta commit)", &engine_books);
    row(&mut o, "= engine total", &total);
    row(&mut o, "baseline: the same store calls in a plain loop", &baseline);
    row(&mut o, "baseline: + publication bookkeeping", &baseline_books);
    row(&mut o, "= baseline total", &baseline_total);
    let _ = writeln!(
        o,
        "   engine total / baseline total: {:.2}x; aim at least {AIM_STEPS_PER_S:.0} steps/s: {} ({steps_per_s:.0})",
        ratio(total.median(), baseline_total.median()),
        if aim_met { "met" } else { "NOT met" }
    );
    Ok(BenchOutcome { json, human: o })
}
