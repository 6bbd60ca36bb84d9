//! The scheduler loop in process, on a manual clock: an [`Engine`] over a SQLite store and a folder
//! lake, and again over a PostgreSQL schema and an `s3://` lake, with attempts run by a scripted
//! runner, so that the time the loop acts on (backoffs, lease expiry) moves only when a test moves
//! it. Catch-up's bound
//! (`max_active_runs`) is read back from the journal.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tidegate_core::clock::{Clock, ManualClock};
use tidegate_core::partition::Interval;
use tidegate_core::retry::ErrorClass;
use tidegate_core::spec::{RetryPolicy, Spec};
use tidegate_core::state::{Step, StepEvent, StepStatus};
use tidegate_engine::attempt::{Attempt, Report, ReportFuture, Runner};
use tidegate_engine::{Engine, Options, Summary};
use tidegate_lake::{Lake, StagedVersion};
use tidegate_store::{JournalQuery, NewStep, Priority, RunRequest, StepRecord, Store, Trigger};
use tidegate_testkit::fixed_instant;
use tidegate_testkit::store::{StoreUnderTest, claim_request, event, meta, new_steps, run_request};

/// One daily dataset written by `task_0` (the task [`new_steps`] names), in the default pool.
const SPEC: &str = r#"
[project]
name = "scheduler_test"

[pools.default]
slots = 1

[datasets.out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.task_0]
command = ["/bin/true"]
outputs = ["out"]
"#;

/// How long a test waits, in real time, for the loop to do what the clock allows.
const PATIENCE: Duration = Duration::from_secs(20);
/// Real time the loop is given to show it does nothing early: several idle ticks and lease checks.
const QUIET: Duration = Duration::from_millis(1_500);

/// Runs attempts without a process: the first attempt fails transiently when `fail_first`, every
/// other stages an empty version of each output. Counts the attempts it ran.
#[derive(Debug, Default)]
struct Scripted {
    fail_first: bool,
    n_runs: AtomicU32,
}

impl Runner for Scripted {
    fn run(&self, attempt: Attempt, _store: Arc<dyn Store>, _lake: Arc<Lake>) -> ReportFuture {
        self.n_runs.fetch_add(1, Ordering::SeqCst);
        let fail = self.fail_first && attempt.lease.attempt == 1;
        Box::pin(async move {
            let (step_id, epoch, ended_at) = (attempt.step.id.clone(), attempt.lease.epoch, attempt.clock.now());
            if fail {
                let reason = "exit 75 (transient)".to_owned();
                return Report::Failed { step_id, epoch, class: ErrorClass::Transient, reason, ended_at };
            }
            let staging_id = format!("{}-{}", attempt.step.id, attempt.lease.attempt);
            let versions = attempt.outputs.iter().map(|d| empty_version(&d.name, &staging_id, &attempt)).collect();
            Report::Staged { step_id, epoch, versions, checks: Vec::new(), ended_at }
        })
    }
}

fn empty_version(dataset: &str, staging_id: &str, attempt: &Attempt) -> StagedVersion {
    StagedVersion {
        dataset: dataset.to_owned(),
        staging_id: staging_id.to_owned(),
        partitions: vec![attempt.partition.clone()],
        files: Vec::new(),
        n_rows: 0,
        schema_hash: String::new(),
        checksum: String::new(),
        columns: Vec::new(),
    }
}

/// Where a test's engine keeps its state and data: a SQLite file and a lake folder, or a fresh
/// PostgreSQL schema and an `s3://` lake (`.ci/run` starts both). Every test runs on each
/// ([`on_both_backends`]).
#[derive(Debug, Clone, Copy)]
enum Backend {
    SqliteAndFolder,
    PostgresAndS3,
}

impl Backend {
    /// The store under test and the lake's URI; `None` (after saying so, or failing under CI)
    /// when PostgreSQL or S3 is missing.
    fn open(self, dir: &std::path::Path) -> Option<(StoreUnderTest, String)> {
        match self {
            Self::SqliteAndFolder => Some((StoreUnderTest::sqlite(), dir.join("lake").display().to_string())),
            Self::PostgresAndS3 => {
                let store = StoreUnderTest::postgres()?;
                let Some(s3) = std::env::var("TIDEGATE_TEST_S3_URL").ok().filter(|s| !s.is_empty()) else {
                    tidegate_testkit::service_missing("the engine suite on S3", "TIDEGATE_TEST_S3_URL (and AWS_*)");
                    return None;
                };
                let unique = dir.file_name().expect("a temp folder's name").to_string_lossy().into_owned();
                Some((store, format!("{}/engine-{}", s3.trim_end_matches('/'), unique.trim_start_matches('.'))))
            }
        }
    }
}

/// Runs `f`, a call to the store, where it may block: PostgreSQL's synchronous client may not
/// start (or drop) its connection on a thread driving async tasks, so tests call the store as the
/// engine does, off the async scheduler.
fn sync<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Each named test body (an `async fn(Backend)`) as two tests, one per [`Backend`].
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod on_sqlite_and_a_folder {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Backend::SqliteAndFolder).await;
                }
            )*
        }
        mod on_postgresql_and_s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Backend::PostgresAndS3).await;
                }
            )*
        }
    };
}

on_both_backends!(
    a_transient_failure_is_retried_only_once_the_clock_passes_its_backoff,
    a_lease_whose_heartbeat_stopped_is_reclaimed_once_the_clock_passes_its_ttl,
    catch_up_keeps_at_most_max_active_runs_intervals_active_newest_first,
    an_interval_waiting_for_a_retry_still_counts_against_max_active_runs,
);

/// A store with one run of one step (`task_0` for 2024-01-01, stopping at `awaiting_approval`
/// so that nothing is published), a folder lake, and an engine over them on a manual clock.
struct Setup {
    store: StoreUnderTest,
    clock: Arc<ManualClock>,
    runner: Arc<Scripted>,
    spec: Arc<Spec>,
    step_id: String,
    engine: Engine,
    _dir: tempfile::TempDir,
}

async fn setup(runner: Scripted, backend: Backend) -> Option<Setup> {
    let dir = tempfile::tempdir().expect("a temp folder for the workspace");
    let spec = Arc::new(tidegate_core::spec::parse("tidegate.toml", SPEC).expect("the test spec is valid"));
    let (store, lake_uri) = sync(|| backend.open(dir.path()))?;
    let clock = Arc::new(ManualClock::new(fixed_instant()));
    let mut steps = new_steps(1);
    // A backoff long enough that the loop's real-time ticks never reach it by themselves.
    let retry = RetryPolicy { attempts: 3, backoff_base_ms: 60_000, backoff_max_ms: 60_000 };
    steps[0].state = Step::new(retry, true);
    let submission = sync(|| store.store.submit_run(&run_request("task_0"), &steps, &meta(clock.now())))
        .expect("submitting the run");
    let step_id = sync(|| store.store.steps(&submission.run.id)).expect("reading the steps")[0].id.clone();
    let lake = Arc::new(Lake::open(&lake_uri).await.expect("opening the lake"));
    let runner = Arc::new(runner);
    let opts = Options { worker_id: "scheduler-test".to_owned(), max_parallel: 1, ..Options::default() };
    let engine =
        Engine::new(store.store.clone(), lake, spec.clone(), dir.path().to_path_buf(), lake_uri, clock.clone(), opts)
            .with_runner(runner.clone());
    Some(Setup { store, clock, runner, spec, step_id, engine, _dir: dir })
}

impl Setup {
    fn step(&self) -> StepRecord {
        sync(|| self.store.store.step(&self.step_id)).expect("reading the step").expect("the step exists")
    }

    /// Waits (in real time) until the step satisfies `done`.
    async fn wait_for(&self, what: &str, done: impl Fn(&StepRecord) -> bool) -> StepRecord {
        let give_up = std::time::Instant::now() + PATIENCE;
        loop {
            let step = self.step();
            if done(&step) {
                return step;
            }
            assert!(std::time::Instant::now() < give_up, "the step never became {what}: {step:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drains with the engine while `drive` moves the clock; the drain's summary.
    async fn drain_while(&self, drive: impl Future<Output = ()>) -> Summary {
        let drain = async { self.engine.drain().await.expect("the drain succeeds") };
        let (summary, ()) = tokio::time::timeout(PATIENCE * 2, async { tokio::join!(drain, drive) })
            .await
            .expect("the drain ends once the clock has moved");
        summary
    }
}

async fn a_transient_failure_is_retried_only_once_the_clock_passes_its_backoff(backend: Backend) {
    let Some(t) = setup(Scripted { fail_first: true, ..Scripted::default() }, backend).await else { return };
    let failed_at = t.clock.now();
    let summary = t
        .drain_while(async {
            let waiting = t.wait_for("retry_wait", |s| s.status() == StepStatus::RetryWait).await;
            let due = waiting.state.retry_at.expect("a step waiting to retry has a due time");
            // Full jitter: anywhere in the 60 s cap (the step id seeds it), so only its being in
            // the future is certain; the manual clock never reaches it by itself.
            assert!(due > failed_at, "the backoff puts the retry in the future: {due} after failing at {failed_at}");

            t.clock.set(due - chrono::Duration::milliseconds(1));
            tokio::time::sleep(QUIET).await;
            let step = t.step();
            assert_eq!((step.status(), step.state.attempt), (StepStatus::RetryWait, 1), "retried before the backoff");
            assert_eq!(t.runner.n_runs.load(Ordering::SeqCst), 1);

            t.clock.set(due);
        })
        .await;
    assert_eq!((summary.retried, summary.awaiting_approval, summary.failed), (1, 1, 0));
    let step = t.step();
    assert_eq!((step.status(), step.state.attempt), (StepStatus::AwaitingApproval, 2));
    assert_eq!(t.runner.n_runs.load(Ordering::SeqCst), 2);
    // The PostgreSQL store's connections close where they may block.
    sync(|| drop(t));
}

async fn a_lease_whose_heartbeat_stopped_is_reclaimed_once_the_clock_passes_its_ttl(backend: Backend) {
    let Some(t) = setup(Scripted::default(), backend).await else { return };
    // Another process claimed the step and then stopped heartbeating (it died).
    let now = t.clock.now();
    sync(|| t.store.store.commit(&[event(&t.step_id, StepEvent::DepsMet { inputs: vec![] }, now)]))
        .expect("making it ready");
    let claims = [claim_request(&t.step_id, "gone-worker", now)];
    let lease = sync(|| t.store.store.claim_steps(&claims, now, t.spec.project.lease_ttl_s)).expect("claiming")[0]
        .clone()
        .expect("the claim is granted");
    assert_eq!(lease.expires_at, now + chrono::Duration::seconds(i64::from(t.spec.project.lease_ttl_s)));

    let summary = t
        .drain_while(async {
            t.clock.set(lease.expires_at);
            tokio::time::sleep(QUIET).await;
            let step = t.step();
            assert_eq!(
                (step.status(), step.state.epoch),
                (StepStatus::Running, 1),
                "reclaimed before the lease expired"
            );

            t.clock.set(lease.expires_at + chrono::Duration::seconds(1));
            let expired =
                t.wait_for("free of the dead lease", |s| s.state.epoch > 1 || s.status() == StepStatus::RetryWait);
            let failure = expired.await.state.last_failure.expect("the expiry is recorded as a failure");
            assert_eq!(failure.reason, "lease of attempt 1 expired without a heartbeat");
            // Past any backoff the expiry set.
            t.clock.advance(chrono::Duration::minutes(2));
        })
        .await;
    assert_eq!((summary.retried, summary.awaiting_approval, summary.failed), (1, 1, 0));
    let step = t.step();
    assert_eq!((step.status(), step.state.attempt, step.state.epoch), (StepStatus::AwaitingApproval, 2, 2));
    assert_eq!(t.runner.n_runs.load(Ordering::SeqCst), 1, "only the reclaimed attempt ran here");
    // The PostgreSQL store's connections close where they may block.
    sync(|| drop(t));
}

/// A scheduled daily task with catch-up on, bounded by `max_active_runs`; the pool and the
/// engine would allow 8 attempts at once, so only the bound can hold them back.
fn catchup_spec(max_active_runs: u32) -> String {
    format!(
        r#"
[project]
name = "catchup_bound_test"

[pools.default]
slots = 8

[datasets.out]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.extract]
command = ["/bin/true"]
outputs = ["out"]
schedule = "@daily"
catchup = {{ enabled = true, max_active_runs = {max_active_runs} }}
"#
    )
}

/// Runs each attempt for [`ATTEMPT_TIME`] of real time, failing transiently the first attempt of
/// the partitions in `fail_first`; records how many ran at once.
#[derive(Debug, Default)]
struct Timed {
    fail_first: Vec<String>,
    running: Arc<AtomicU32>,
    most_at_once: AtomicU32,
}

/// How long each attempt of [`Timed`] takes.
const ATTEMPT_TIME: Duration = Duration::from_millis(150);

impl Runner for Timed {
    fn run(&self, attempt: Attempt, _store: Arc<dyn Store>, _lake: Arc<Lake>) -> ReportFuture {
        let now_running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now_running, Ordering::SeqCst);
        let fail = attempt.lease.attempt == 1 && self.fail_first.contains(&attempt.partition.key);
        let running = self.running.clone();
        Box::pin(async move {
            tokio::time::sleep(ATTEMPT_TIME).await;
            running.fetch_sub(1, Ordering::SeqCst);
            let (step_id, epoch, ended_at) = (attempt.step.id.clone(), attempt.lease.epoch, attempt.clock.now());
            if fail {
                let reason = "exit 75 (transient)".to_owned();
                return Report::Failed { step_id, epoch, class: ErrorClass::Transient, reason, ended_at };
            }
            let staging_id = format!("{}-{}", attempt.step.id, attempt.lease.attempt);
            let versions = attempt.outputs.iter().map(|d| empty_version(&d.name, &staging_id, &attempt)).collect();
            Report::Staged { step_id, epoch, versions, checks: Vec::new(), ended_at }
        })
    }
}

/// Steps of `extract` for the given days of January 2024, stopping at `awaiting_approval` (so
/// that nothing is published and an empty staged version is enough).
fn day_steps(days: impl Iterator<Item = u32>, retry: RetryPolicy) -> Vec<NewStep> {
    days.map(|d| {
        let start = fixed_instant() + chrono::Duration::days(i64::from(d) - 1);
        NewStep {
            name: format!("extract@2024-01-{d:02}"),
            task: "extract".to_owned(),
            partition: format!("2024-01-{d:02}"),
            interval: Some(Interval { start, end: start + chrono::Duration::days(1) }),
            step_key: format!("extract-2024-01-{d:02}"),
            pool: "default".to_owned(),
            upstream: Vec::new(),
            inputs: Vec::new(),
            state: Step::new(retry, true),
            code_version: None,
        }
    })
    .collect()
}

/// What a tick after ten days of downtime submits for a task with catch-up on: a schedule run
/// for the newest day (10) and a catch-up run for days 1-9, oldest first as the planner lists
/// them. The engine allows 8 attempts at once; the clock is manual.
struct Catchup {
    store: StoreUnderTest,
    clock: Arc<ManualClock>,
    runner: Arc<Timed>,
    engine: Engine,
    _dir: tempfile::TempDir,
}

async fn catchup_setup(max_active_runs: u32, runner: Timed, backend: Backend) -> Option<Catchup> {
    let dir = tempfile::tempdir().expect("a temp folder for the workspace");
    let spec = tidegate_core::spec::parse("tidegate.toml", &catchup_spec(max_active_runs)).expect("a valid spec");
    let spec = Arc::new(spec);
    let (store, lake_uri) = sync(|| backend.open(dir.path()))?;
    let clock = Arc::new(ManualClock::new(fixed_instant() + chrono::Duration::days(10)));
    let retry = RetryPolicy { attempts: 3, backoff_base_ms: 60_000, backoff_max_ms: 60_000 };
    let live = RunRequest {
        trigger: Trigger::Schedule,
        priority: Priority::Live,
        partitions: vec!["extract@2024-01-10".to_owned()],
        ..run_request("extract")
    };
    sync(|| store.store.submit_run(&live, &day_steps(10..=10, retry), &meta(clock.now()))).expect("the live run");
    let missed = RunRequest {
        trigger: Trigger::Catchup,
        priority: Priority::Catchup,
        partitions: (1..=9).map(|d| format!("extract@2024-01-{d:02}")).collect(),
        ..run_request("extract")
    };
    sync(|| store.store.submit_run(&missed, &day_steps(1..=9, retry), &meta(clock.now()))).expect("the catch-up run");
    let lake = Arc::new(Lake::open(&lake_uri).await.expect("opening the lake"));
    let runner = Arc::new(runner);
    let opts = Options { worker_id: "catchup-test".to_owned(), max_parallel: 8, ..Options::default() };
    let engine = Engine::new(store.store.clone(), lake, spec, dir.path().to_path_buf(), lake_uri, clock.clone(), opts)
        .with_runner(runner.clone());
    Some(Catchup { store, clock, runner, engine, _dir: dir })
}

/// Replays the journal in order: the partitions in the order they were first claimed, and the
/// most intervals active at once (from a step's claim until it settles).
fn journal_concurrency(store: &dyn Store) -> (Vec<String>, usize) {
    let query = JournalQuery { limit: Some(100_000), ..JournalQuery::default() };
    let (mut order, mut active, mut most) = (Vec::new(), BTreeSet::new(), 0);
    for e in sync(|| store.journal(&query)).expect("reading the journal") {
        let Some(partition) = e.partition else { continue };
        if e.kind == "claimed" {
            if !order.contains(&partition) {
                order.push(partition.clone());
            }
            active.insert(partition);
            most = most.max(active.len());
        } else if e.to_status.as_deref().and_then(StepStatus::parse).is_some_and(|s| !s.keeps_run_active()) {
            active.remove(&partition);
        }
    }
    (order, most)
}

fn days_newest_first(days: impl DoubleEndedIterator<Item = u32>) -> Vec<String> {
    days.rev().map(|d| format!("2024-01-{d:02}")).collect()
}

async fn catch_up_keeps_at_most_max_active_runs_intervals_active_newest_first(backend: Backend) {
    let Some(t) = catchup_setup(2, Timed::default(), backend).await else { return };
    let summary = tokio::time::timeout(PATIENCE, t.engine.drain()).await.expect("the drain ends").expect("drains");
    assert_eq!(summary.awaiting_approval, 10, "every interval ran: {summary:?}");
    let (order, most) = journal_concurrency(t.store.store.as_ref());
    assert_eq!(most, 2, "the journal shows exactly max_active_runs intervals active at once, at most");
    assert_eq!(t.runner.most_at_once.load(Ordering::SeqCst), 2, "attempts running at once");
    assert_newest_first(&order, 2);
    // The PostgreSQL store's connections close where they may block.
    sync(|| drop(t));
}

/// The missed days (1-9) were claimed newest first, and the live day (10) among the first
/// `max_active_runs` claims: it is claimed in the first turn, possibly in the same transaction
/// as the newest missed day, whose class goes first while below its guaranteed share.
fn assert_newest_first(order: &[String], max_active_runs: usize) {
    let missed: Vec<&String> = order.iter().filter(|p| *p != "2024-01-10").collect();
    let expected = days_newest_first(1..=9);
    assert_eq!(missed, expected.iter().collect::<Vec<_>>(), "missed days newest first: {order:?}");
    let live_at = order.iter().position(|p| p == "2024-01-10");
    assert!(live_at.is_some_and(|i| i < max_active_runs), "the live day starts first: {order:?}");
}

async fn an_interval_waiting_for_a_retry_still_counts_against_max_active_runs(backend: Backend) {
    let runner = Timed { fail_first: vec!["2024-01-09".to_owned()], ..Timed::default() };
    let Some(t) = catchup_setup(1, runner, backend).await else { return };
    let summary = async {
        let drain = async { t.engine.drain().await.expect("the drain succeeds") };
        let drive = async {
            // Day 10 (live) runs, then day 9, which fails and waits a minute of the manual clock
            // for its retry: nothing else may start meanwhile.
            let give_up = std::time::Instant::now() + PATIENCE;
            loop {
                let (order, _) = journal_concurrency(t.store.store.as_ref());
                let query = JournalQuery { limit: Some(100_000), ..JournalQuery::default() };
                let waiting = sync(|| t.store.store.journal(&query));
                let retry_wait =
                    waiting.expect("reading the journal").iter().any(|e| e.to_status.as_deref() == Some("retry_wait"));
                if retry_wait {
                    tokio::time::sleep(QUIET).await;
                    let (order, _) = journal_concurrency(t.store.store.as_ref());
                    assert_eq!(order, days_newest_first(9..=10), "nothing started while day 9 waits to retry");
                    break;
                }
                assert!(std::time::Instant::now() < give_up, "day 9 never failed: {order:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            t.clock.advance(chrono::Duration::minutes(2));
        };
        tokio::time::timeout(PATIENCE * 2, async { tokio::join!(drain, drive) }).await.expect("the drain ends").0
    }
    .await;
    assert_eq!((summary.awaiting_approval, summary.retried), (10, 1), "{summary:?}");
    let (order, most) = journal_concurrency(t.store.store.as_ref());
    assert_eq!(most, 1);
    assert_eq!(t.runner.most_at_once.load(Ordering::SeqCst), 1);
    assert_eq!(order, days_newest_first(1..=10), "one at a time: the live day, then the missed ones");
    // The PostgreSQL store's connections close where they may block.
    sync(|| drop(t));
}
