//! The scheduler loop in process, on a manual clock: an [`Engine`] over a SQLite store in a temp
//! folder and a folder lake, with attempts run by a scripted runner, so that the time the loop
//! acts on (backoffs, lease expiry) moves only when a test moves it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tidegate_core::clock::{Clock, ManualClock};
use tidegate_core::retry::ErrorClass;
use tidegate_core::spec::{RetryPolicy, Spec};
use tidegate_core::state::{Step, StepEvent, StepStatus};
use tidegate_engine::attempt::{Attempt, Report, ReportFuture, Runner};
use tidegate_engine::{Engine, Options, Summary};
use tidegate_lake::{Lake, StagedVersion};
use tidegate_store::{StepRecord, Store};
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

async fn setup(runner: Scripted) -> Setup {
    let dir = tempfile::tempdir().expect("a temp folder for the workspace");
    let spec = Arc::new(tidegate_core::spec::parse("tidegate.toml", SPEC).expect("the test spec is valid"));
    let store = StoreUnderTest::sqlite();
    let clock = Arc::new(ManualClock::new(fixed_instant()));
    let mut steps = new_steps(1);
    // A backoff long enough that the loop's real-time ticks never reach it by themselves.
    let retry = RetryPolicy { attempts: 3, backoff_base_ms: 60_000, backoff_max_ms: 60_000 };
    steps[0].state = Step::new(retry, true);
    let submission =
        store.store.submit_run(&run_request("task_0"), &steps, &meta(clock.now())).expect("submitting the run");
    let step_id = store.store.steps(&submission.run.id).expect("reading the steps")[0].id.clone();
    let lake_uri = dir.path().join("lake").display().to_string();
    let lake = Arc::new(Lake::open(&lake_uri).await.expect("opening the folder lake"));
    let runner = Arc::new(runner);
    let opts = Options { worker_id: "scheduler-test".to_owned(), max_parallel: 1, ..Options::default() };
    let engine =
        Engine::new(store.store.clone(), lake, spec.clone(), dir.path().to_path_buf(), lake_uri, clock.clone(), opts)
            .with_runner(runner.clone());
    Setup { store, clock, runner, spec, step_id, engine, _dir: dir }
}

impl Setup {
    fn step(&self) -> StepRecord {
        self.store.store.step(&self.step_id).expect("reading the step").expect("the step exists")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_is_retried_only_once_the_clock_passes_its_backoff() {
    let t = setup(Scripted { fail_first: true, ..Scripted::default() }).await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_heartbeat_stopped_is_reclaimed_once_the_clock_passes_its_ttl() {
    let t = setup(Scripted::default()).await;
    // Another process claimed the step and then stopped heartbeating (it died).
    let now = t.clock.now();
    t.store.store.commit(&[event(&t.step_id, StepEvent::DepsMet { inputs: vec![] }, now)]).expect("making it ready");
    let claims = [claim_request(&t.step_id, "gone-worker", now)];
    let lease = t.store.store.claim_steps(&claims, now, t.spec.project.lease_ttl_s).expect("claiming")[0]
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
}
