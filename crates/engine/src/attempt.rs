//! One attempt of one step: run the command (or the SQL query) for the step's partition, stage
//! what it produced into the lake (invisible to readers), run the checks on the staged data, and
//! report back. An attempt never publishes; the scheduler does, after fencing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use tidegate_core::clock::Clock;
use tidegate_core::partition::Partition;
use tidegate_core::retry::{self, ErrorClass, Exit};
use tidegate_core::spec::{Dataset, Task, TaskRun};
use tidegate_lake::{CheckResult, Lake, StagedVersion};
use tidegate_store::{CheckpointRecord, Lease, StepRecord, Store};

use crate::log_copy::{COPY_EVERY, LogCopies};
use crate::process;
use crate::secrets::Secrets;

/// Everything an attempt needs, cloned out of the scheduler so the attempt runs on its own.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The lease this attempt runs under (its epoch fences its reports).
    pub lease: Lease,
    /// The step, as claimed.
    pub step: StepRecord,
    /// Its task.
    pub task: Task,
    /// The datasets it writes.
    pub outputs: Vec<Dataset>,
    /// Its partition.
    pub partition: Partition,
    /// The workspace folder: commands run here.
    pub workspace: PathBuf,
    /// The working folder of the process running it ([`Site::work_dir`]).
    pub work_dir: PathBuf,
    /// `<work dir>/attempts/<step>.attempt-<n>`: the attempt's output folder (one subfolder per
    /// dataset when the task has several outputs). Its logs and checkpoint file are files in
    /// `<work dir>/logs` named after it ([`Attempt::file`]). One new folder per attempt: creating
    /// folders (ext4 allocates each inode by a scan) was a third of Tidegate's own CPU per no-op
    /// task when an attempt made three.
    pub dir: PathBuf,
    /// The lake's URL, for the task's environment.
    pub lake_uri: String,
    /// How often the lease is renewed while it runs.
    pub heartbeat: Duration,
    /// How long a lease lives without a heartbeat.
    pub lease_ttl_s: u32,
    /// The checkpoint a retried attempt resumes from, if any.
    pub resume_from: Option<CheckpointRecord>,
    /// Its run.
    pub run_id: String,
    /// The engine's clock: the attempt's heartbeats, checkpoints and report are timed by it.
    pub clock: Arc<dyn Clock>,
    /// Where the external sources it reads are, for its environment: the variables naming
    /// each source's `location` (a Delta table's URI, or the folders of a template).
    pub source_env: Vec<(String, String)>,
}

/// How an attempt ended, for the scheduler to turn into events.
#[derive(Debug, Clone)]
pub enum Report {
    /// Output staged; `checks` holds every check's result per dataset.
    Staged {
        /// The step.
        step_id: String,
        /// The lease epoch it ran under.
        epoch: u64,
        /// What it staged, per dataset.
        versions: Vec<StagedVersion>,
        /// Every check's result, per dataset.
        checks: Vec<CheckResult>,
        /// When it ended, on the engine's clock.
        ended_at: DateTime<Utc>,
    },
    /// The attempt failed; `class` decides whether it is retried.
    Failed {
        /// The step.
        step_id: String,
        /// The lease epoch it ran under.
        epoch: u64,
        /// Transient (retried within the budget) or deterministic.
        class: ErrorClass,
        /// Why, in words (secrets redacted).
        reason: String,
        /// When it ended, on the engine's clock.
        ended_at: DateTime<Utc>,
    },
    /// The attempt was stopped because its step was cancelled while it ran: its processes were
    /// killed, and the stop journaled (`attempt_stopped`). Nothing of it is recorded: the step is
    /// cancelled already, and what it staged is never published.
    Stopped {
        /// The step.
        step_id: String,
        /// The lease epoch it ran under.
        epoch: u64,
        /// Who cancelled the step, and why.
        reason: String,
        /// When it ended, on the engine's clock.
        ended_at: DateTime<Utc>,
    },
}

impl Attempt {
    /// `<work dir>/logs/<step>.attempt-<n>.<suffix>`: a file of this attempt's beside the others'
    /// (`stdout.log`, `stderr.log`, `checkpoints.jsonl`).
    pub fn file(&self, suffix: &str) -> PathBuf {
        let name = attempt_name(&self.step.id, self.lease.attempt);
        logs_dir(&self.work_dir).join(format!("{name}.{suffix}"))
    }
}

/// Where a process runs its attempts: the workspace folder (commands run there), its working
/// folder (what attempts write locally) and the lake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The workspace folder: commands run here, and their relative paths are read from it.
    pub workspace: PathBuf,
    /// The folder attempts write their output (`attempts/`), logs and checkpoint files (`logs/`)
    /// in before staging: the workspace's `.tidegate` for a scheduler ([`default_work_dir`]), a
    /// folder of its own for each worker, so that a worker needs no disk shared with anyone.
    pub work_dir: PathBuf,
    /// The lake's URL, for the task's environment.
    pub lake_uri: String,
}

impl Site {
    /// Attempts run from `workspace`, writing in its `.tidegate` folder, for the lake at
    /// `lake_uri`.
    pub fn new(workspace: PathBuf, lake_uri: String) -> Self {
        Self { work_dir: default_work_dir(&workspace), workspace, lake_uri }
    }

    /// The same site, writing in `work_dir` instead.
    #[must_use]
    pub fn with_work_dir(mut self, work_dir: PathBuf) -> Self {
        self.work_dir = work_dir;
        self
    }
}

/// `<workspace>/.tidegate`: the working folder of a scheduler (`serve`, `run`) in `workspace`.
pub fn default_work_dir(workspace: &std::path::Path) -> PathBuf {
    workspace.join(".tidegate")
}

/// `<workspace>/.tidegate/workers/<name>`: the working folder of worker `name` started in
/// `workspace` without one of its own.
pub fn worker_work_dir(workspace: &std::path::Path, name: &str) -> PathBuf {
    default_work_dir(workspace).join("workers").join(name)
}

/// `<step>.attempt-<n>`: what an attempt's output folder and its files in `<work dir>/logs` are
/// named after.
pub fn attempt_name(step_id: &str, attempt: u32) -> String {
    format!("{step_id}.attempt-{attempt}")
}

/// `<step>-<n>`: the staging id an attempt stages its output under (`staging/<id>/` in each
/// output's table). A checkpointing task's granules are staged under `<step>-<n>-g<k>` and what
/// follows its last checkpoint under `<step>-<n>-rest` (`checkpoint.rs`).
pub fn staging_id(step_id: &str, attempt: u32) -> String {
    format!("{step_id}-{attempt}")
}

/// The step id and attempt number a staging id names, if it has one of the forms staging uses
/// ([`staging_id`] of a step id the store minted, and its granule and `-rest` forms); `None` for
/// any other name.
pub fn staging_attempt(staging_id: &str) -> Option<(&str, u32)> {
    let base = staging_id.strip_suffix("-rest").unwrap_or(staging_id);
    let base = match base.rsplit_once("-g") {
        Some((head, granule)) if is_number(granule) => head,
        _ => base,
    };
    let (step_id, attempt) = base.rsplit_once('-')?;
    if !is_uuid(step_id) || !is_number(attempt) {
        return None;
    }
    Some((step_id, attempt.parse().ok()?))
}

fn is_number(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `text` is shaped as the store's step ids are (a hyphenated UUID, as the store mints).
fn is_uuid(text: &str) -> bool {
    let hyphens = [8, 13, 18, 23];
    text.len() == 36
        && text.bytes().enumerate().all(|(i, b)| if hyphens.contains(&i) { b == b'-' } else { b.is_ascii_hexdigit() })
}

/// `<work dir>/attempts`: the attempts' output folders.
pub fn attempts_dir(work_dir: &std::path::Path) -> PathBuf {
    work_dir.join("attempts")
}

/// `<work dir>/logs`: the attempts' logs and checkpoint files.
pub fn logs_dir(work_dir: &std::path::Path) -> PathBuf {
    work_dir.join("logs")
}

impl Report {
    /// One log line saying how the attempt ended (in the attempt's span, which names it).
    pub fn log(&self) {
        match self {
            Report::Staged { versions, checks, .. } => {
                let n_rows: u64 = versions.iter().map(|v| v.n_rows).sum();
                let failed: Vec<&str> = checks.iter().filter(|c| c.blocks()).map(|c| c.name.as_str()).collect();
                if failed.is_empty() {
                    tracing::info!(n_rows, "attempt staged its output; its checks passed");
                } else {
                    tracing::warn!(
                        n_rows,
                        failed = failed.join(", "),
                        "attempt staged its output; blocking checks failed"
                    );
                }
            }
            Report::Failed { class, reason, .. } => tracing::warn!(class = ?class, reason, "attempt failed"),
            Report::Stopped { reason, .. } => tracing::info!(reason, "attempt stopped: its step was cancelled"),
        }
    }

    /// The step this report is about.
    pub fn step_id(&self) -> &str {
        match self {
            Report::Staged { step_id, .. } | Report::Failed { step_id, .. } | Report::Stopped { step_id, .. } => {
                step_id
            }
        }
    }
}

/// What a [`Runner`] returns: the attempt's report, once it ends.
pub type ReportFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Report> + Send>>;

/// Runs the engine's attempts. The engine uses [`TaskRunner`] unless told otherwise
/// (`Engine::with_runner`); a benchmark swaps in a runner that does no work, to measure the
/// scheduler and the store alone.
pub trait Runner: Send + Sync {
    /// Runs one attempt to its report.
    fn run(&self, attempt: Attempt, store: Arc<dyn Store>, lake: Arc<Lake>) -> ReportFuture;
}

/// The default runner: the task's command or SQL, with [`run`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskRunner;

impl Runner for TaskRunner {
    fn run(&self, attempt: Attempt, store: Arc<dyn Store>, lake: Arc<Lake>) -> ReportFuture {
        Box::pin(run(attempt, store, lake))
    }
}

/// Runs the attempt to its end; heartbeats the lease meanwhile. Never panics on task failure:
/// every failure is a [`Report::Failed`] with its class.
pub async fn run(attempt: Attempt, store: Arc<dyn Store>, lake: Arc<Lake>) -> Report {
    let step_id = attempt.step.id.clone();
    let epoch = attempt.lease.epoch;
    let clock = attempt.clock.clone();
    let fail = |class, reason: String| Report::Failed {
        step_id: step_id.clone(),
        epoch,
        class,
        reason,
        ended_at: clock.now(),
    };
    let secrets = match crate::secrets::from_env(&attempt.task) {
        Ok(secrets) => secrets,
        Err(reason) => return fail(ErrorClass::Deterministic, reason),
    };
    let redactor = Secrets::new(&secrets.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>());
    let heartbeat = tokio::spawn(heartbeat_loop(
        store.clone(),
        attempt.clock.clone(),
        attempt.lease.clone(),
        attempt.heartbeat,
        attempt.lease_ttl_s,
    ));
    let (stop_tx, stop) = tokio::sync::watch::channel(None);
    let watcher = tokio::spawn(crate::cancel::watch(store.clone(), step_id.clone(), epoch, stop_tx));
    let result = execute(&attempt, &store, &lake, &secrets, &redactor, stop.clone()).await;
    heartbeat.abort();
    watcher.abort();
    let stopped = stop.borrow().clone();
    if let Some(cancel) = stopped {
        crate::cancel::record_stop(&store, &attempt, &cancel).await;
        return Report::Stopped { step_id, epoch, reason: cancel.describe(), ended_at: clock.now() };
    }
    // What the attempt reports is journaled and stored: the task's data or output quoted in a
    // failure or a check's detail must not carry its secrets there.
    match result {
        Ok((mut versions, mut checks)) => {
            for check in &mut checks {
                check.detail = redactor.redact(&check.detail);
            }
            versions.iter_mut().for_each(|v| redact_stats(v, &redactor));
            Report::Staged { step_id, epoch, versions, checks, ended_at: clock.now() }
        }
        Err((class, reason)) => fail(class, redactor.redact(&reason)),
    }
}

/// Hides secrets in a staged version's statistics (a column's smallest or largest value can be a
/// secret the task wrote into its data), which are stored with the version: masked in its column
/// statistics, and dropped from each file's Delta statistics, which the store keeps too and the
/// publication copies into the table's log.
pub(crate) fn redact_stats(v: &mut StagedVersion, secrets: &Secrets) {
    if secrets.is_empty() {
        return;
    }
    for c in &mut v.columns {
        for value in [&mut c.min, &mut c.max].into_iter().flatten() {
            *value = secrets.redact(value);
        }
    }
    for file in &mut v.files {
        file.delta_stats = file.delta_stats.as_deref().and_then(|stats| without_secrets(stats, secrets));
    }
}

/// A file's Delta statistics without the smallest and largest values that hold (or begin) a
/// secret. Dropped rather than masked: readers skip files by these bounds, and a masked bound
/// would skip wrongly where a missing one skips nothing. Statistics that do not parse are
/// dropped whole.
fn without_secrets(stats: &str, secrets: &Secrets) -> Option<String> {
    let mut json: serde_json::Value = serde_json::from_str(stats).ok()?;
    for bound in ["minValues", "maxValues"] {
        if let Some(values) = json.get_mut(bound) {
            prune(values, secrets);
        }
    }
    Some(json.to_string())
}

/// Removes every string in `values` (nested objects for struct columns) that touches a secret.
fn prune(values: &mut serde_json::Value, secrets: &Secrets) {
    if let serde_json::Value::Object(map) = values {
        map.retain(|_, value| match value {
            serde_json::Value::String(text) => !secrets.touches(text),
            serde_json::Value::Object(_) => {
                prune(value, secrets);
                true
            }
            _ => true,
        });
    }
}

async fn heartbeat_loop(store: Arc<dyn Store>, clock: Arc<dyn Clock>, mut lease: Lease, every: Duration, ttl_s: u32) {
    loop {
        tokio::time::sleep(every).await;
        let s = store.clone();
        let (l, now) = (lease.clone(), clock.now());
        match tokio::task::spawn_blocking(move || s.heartbeat(&l, now, ttl_s)).await {
            Ok(Ok(renewed)) => lease = renewed,
            // The store is away for now (restarting, a connection cut): try again at the next
            // beat; a lease that outlives the outage was never lost.
            Ok(Err(tidegate_store::Error::Unavailable(_))) => {}
            // Fenced: stop renewing. The scheduler gave the step to another attempt, and this
            // one's report will be rejected.
            _ => return,
        }
    }
}

use crate::checkpoint::{Checkpoints, Failure};

/// How often a running command's checkpoint file is read.
pub const CHECKPOINT_POLL: Duration = Duration::from_millis(200);

/// A task's secrets as `(name, value)`, read when the attempt started.
type SecretEnv = [(String, String)];

async fn execute(
    a: &Attempt,
    store: &Arc<dyn Store>,
    lake: &Lake,
    secrets: &SecretEnv,
    redactor: &Secrets,
    stop: crate::cancel::StopSignal,
) -> Result<(Vec<StagedVersion>, Vec<CheckResult>), Failure> {
    let staging_id = staging_id(&a.step.id, a.lease.attempt);
    let versions = match &a.task.run {
        TaskRun::Command { argv, .. } => {
            let task = TaskProcess { argv, secrets, redactor };
            run_command(a, &task, store, lake, &staging_id, stop).await?
        }
        // The query runs in this process: dropping it stops it.
        TaskRun::Sql { query } => tokio::select! {
            versions = run_sql(a, query, store, lake, &staging_id) => versions?,
            () = crate::cancel::stopped(stop) => {
                return Err((ErrorClass::Deterministic, "stopped: its step was cancelled".to_owned()));
            }
        },
    };
    crate::failpoint::hit("after-stage-output");
    let mut checks = Vec::new();
    for (dataset, staged) in a.outputs.iter().zip(&versions) {
        let results = lake.check(dataset, staged).await.map_err(|e| lake_failure("checking", &e))?;
        checks.extend(results);
    }
    crate::failpoint::hit("after-checks");
    Ok((versions, checks))
}

fn lake_failure(doing: &str, e: &tidegate_lake::Error) -> Failure {
    let class = if e.is_retryable() { ErrorClass::Transient } else { ErrorClass::Deterministic };
    (class, format!("{doing} output: {e}"))
}

/// How many blocking checks failed in the journal's reason are named, with their details.
const REASON_CHECKS: usize = 2;

/// The most characters of one check's detail in the journal's reason.
const REASON_DETAIL_CHARS: usize = 200;

/// The journal's reason for a check verdict: how many checks ran and failed, and the first
/// [`REASON_CHECKS`] blocking failures by name and (shortened) detail, so `tidegate history` says
/// why a step was stopped. Details are already redacted of the task's secrets.
fn checks_reason(checks: &[CheckResult]) -> String {
    let blocking: Vec<_> = checks.iter().filter(|c| c.blocks()).collect();
    let mut reason = format!("{} checks, {} blocking failures", checks.len(), blocking.len());
    let named: Vec<String> =
        blocking.iter().take(REASON_CHECKS).map(|c| format!("{} ({})", c.name, shorten(&c.detail))).collect();
    if !named.is_empty() {
        reason = format!("{reason}: {}", named.join("; "));
    }
    if blocking.len() > REASON_CHECKS {
        reason = format!("{reason}; and {} more", blocking.len() - REASON_CHECKS);
    }
    reason
}

/// `text` cut to [`REASON_DETAIL_CHARS`] characters, marked when cut.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(REASON_DETAIL_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Why a SQL task's query failed; a table it names that is a dataset in the lake, but not one of
/// the task's inputs, is said to be so (a task reads only its inputs, at their pinned versions).
async fn sql_task_failure(lake: &Lake, inputs: &[tidegate_lake::InputTable], e: &tidegate_lake::Error) -> Failure {
    if let tidegate_lake::Error::UnknownTable { table, .. } = e
        && !inputs.iter().any(|i| &i.name == table)
        && matches!(lake.table_version(table).await, Ok(Some(_)))
    {
        let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
        let detail = format!(
            "query failed: no table {table:?}: the dataset {table:?} is not one of the task's inputs ({}); \
             add it to the task's `inputs` to read it",
            names.join(", ")
        );
        return (ErrorClass::Deterministic, format!("running the query for output: {detail}"));
    }
    lake_failure("running the query for", e)
}

/// The folder a command leaves `dataset`'s files in.
pub(crate) fn output_dir(a: &Attempt, dataset: &str) -> PathBuf {
    if a.outputs.len() == 1 { a.dir.clone() } else { a.dir.join(dataset) }
}

/// What a command task's process is started with.
struct TaskProcess<'a> {
    argv: &'a [String],
    secrets: &'a SecretEnv,
    redactor: &'a Secrets,
}

async fn run_command(
    a: &Attempt,
    task: &TaskProcess<'_>,
    store: &Arc<dyn Store>,
    lake: &Lake,
    staging_id: &str,
    stop: crate::cancel::StopSignal,
) -> Result<Vec<StagedVersion>, Failure> {
    // The output folders, and the folder the task appends its checkpoints in (made once per
    // working folder). Made on this thread: the working folder is the process's own, on a local
    // disk, where a `mkdir` takes microseconds, less than a hand-off to a blocking thread and
    // back.
    let mut folders: Vec<PathBuf> = a.outputs.iter().map(|d| output_dir(a, &d.name)).collect();
    folders.extend(crate::checkpoint::checkpoint_file(a).parent().map(PathBuf::from));
    folders
        .iter()
        .try_for_each(|f| std::fs::create_dir_all(f).map_err(|e| format!("{}: {e}", f.display())))
        .map_err(|e| (ErrorClass::Transient, format!("preparing the attempt's folders: {e}")))?;
    let mut env = step_env(a);
    env.extend(lake_client_env(&a.lake_uri, |name| std::env::var(name).ok()));
    env.extend(task.secrets.iter().cloned());
    let argv = task.argv;
    let spec = process::Spec {
        argv: argv.to_vec(),
        cwd: a.workspace.clone(),
        env,
        timeout: Duration::from_secs(u64::from(a.task.timeout_s)),
        stdout_log: a.file("stdout.log"),
        stderr_log: a.file("stderr.log"),
        redact: task.secrets.iter().map(|(_, v)| v.clone()).collect(),
        log_max_bytes: a.task.log_max_bytes,
    };
    // The process runs on its own task so that staging a checkpointed granule never stalls the
    // reading of its output pipes or its timeout. A cancel of its step kills its processes.
    let mut process = tokio::spawn(async move { process::run_until(&spec, crate::cancel::stopped(stop)).await });
    let mut checkpoints = Checkpoints::new(a, store.clone(), lake, task.redactor);
    let mut poll = tokio::time::interval(CHECKPOINT_POLL);
    let mut copies = LogCopies::new(a, lake);
    let mut copy = tokio::time::interval_at(tokio::time::Instant::now() + COPY_EVERY, COPY_EVERY);
    copy.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let finished = loop {
        tokio::select! {
            done = &mut process => break done,
            _ = poll.tick() => checkpoints.poll().await,
            _ = copy.tick() => copies.copy().await,
        }
    };
    // Granules completed before the process ended count even when it failed: a retry resumes
    // after them.
    checkpoints.poll().await;
    // The logs are complete: their last copy is what `tidegate logs` shows elsewhere.
    copies.copy().await;
    let finished = finished
        .map_err(|e| (ErrorClass::Transient, format!("the task's supervisor failed: {e}")))?
        .map_err(|e| match e {
            process::Error::Spawn { .. } | process::Error::EmptyArgv => (ErrorClass::Deterministic, e.to_string()),
            process::Error::Log { .. } => (ErrorClass::Transient, e.to_string()),
        })?;
    // A refused checkpoint is the task's bug and says more than how its process ended: it fails
    // the attempt deterministically even when the task then died in a way worth retrying.
    let refused = checkpoints.failure();
    if let Some(failure) = refused.clone().filter(|(class, _)| *class == ErrorClass::Deterministic) {
        return Err(failure);
    }
    if !finished.succeeded() {
        let class = retry::classify(finished.exit, &a.task.exit_codes);
        let how = match finished.exit {
            Exit::Code { code } => format!("exited with code {code}"),
            Exit::Signal { signal } => format!("was killed by signal {signal}"),
            Exit::TimedOut => format!("timed out after {} s", a.task.timeout_s),
        };
        // The reason is stored and journaled, and read on other machines: it names no path on
        // this one (`tidegate logs` and `GET /api/steps/{id}/log` find the log by step).
        let detail = match (last_words(&finished.stderr_tail), finished.stderr_tail.is_empty()) {
            (Some(line), _) => format!(": {line}"),
            (None, true) => " (it wrote nothing to stderr)".to_owned(),
            (None, false) => " (it wrote only blank lines to stderr)".to_owned(),
        };
        return Err((class, format!("{} {how}{detail}", argv[0])));
    }
    if let Some(failure) = refused {
        return Err(failure);
    }
    let versions = match checkpoints.finish(staging_id).await? {
        Some(versions) => versions,
        None => {
            let mut versions = Vec::new();
            for d in &a.outputs {
                let staged = lake
                    .stage_files(d, staging_id, std::slice::from_ref(&a.partition), &output_dir(a, &d.name))
                    .await
                    .map_err(|e| lake_failure("staging", &e))?;
                versions.push(staged);
            }
            versions
        }
    };
    discard_output_folder(a).await;
    Ok(versions)
}

/// The last line of a failed task's stderr that says something: error messages (deltalake's,
/// for one) often end with a blank line, which made the reason "exited with code 1: ".
fn last_words(tail: &[String]) -> Option<&str> {
    tail.iter().rev().map(String::as_str).find(|line| !line.trim().is_empty())
}

/// Removes a staged attempt's output folder: staging wrote the rows into the lake, so the task's
/// own files are copies nobody reads again (a retry gets a new folder; logs live elsewhere).
/// Failed attempts keep theirs, for whoever investigates. Best effort: a folder left behind
/// costs disk, not correctness.
async fn discard_output_folder(a: &Attempt) {
    // An empty folder (a task with nothing to publish for the partition) goes with one `rmdir`
    // on this thread; one with files is emptied on a blocking thread.
    if std::fs::remove_dir(&a.dir).is_ok() {
        return;
    }
    let dir = a.dir.clone();
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
}

async fn run_sql(
    a: &Attempt,
    query: &str,
    store: &Arc<dyn Store>,
    lake: &Lake,
    staging_id: &str,
) -> Result<Vec<StagedVersion>, Failure> {
    let mut inputs = Vec::new();
    for p in &a.step.state.pinned {
        inputs.push(tidegate_lake::InputTable {
            name: p.dataset.clone(),
            dataset: p.dataset.clone(),
            version: p.version.and_then(|v| u64::try_from(v).ok()),
            partitions: p.partitions.clone(),
            overlay: staged_overlay(store, &p.dataset, &p.staged_steps).await?,
        });
    }
    let batches = match lake.sql_over(query, &inputs).await {
        Ok(batches) => batches,
        Err(e) => return Err(sql_task_failure(lake, &inputs, &e).await),
    };
    let dataset = a.outputs.first().ok_or((ErrorClass::Deterministic, "the task has no output".to_owned()))?;
    let staged = lake
        .stage_batches(dataset, staging_id, std::slice::from_ref(&a.partition), batches)
        .await
        .map_err(|e| lake_failure("staging", &e))?;
    Ok(vec![staged])
}

/// The staged versions of `dataset` written by a backfill's upstream steps (their last attempt's),
/// which the attempt reads in place of the published rows of the partitions they cover.
async fn staged_overlay(
    store: &Arc<dyn Store>,
    dataset: &str,
    step_ids: &[String],
) -> Result<Vec<StagedVersion>, Failure> {
    let mut overlay = Vec::new();
    for step_id in step_ids {
        let (s, sid) = (store.clone(), step_id.clone());
        let records = tokio::task::spawn_blocking(move || s.versions(&sid))
            .await
            .map_err(|e| (ErrorClass::Transient, format!("reading staged versions: {e}")))?
            .map_err(|e| (ErrorClass::Transient, format!("reading the staged versions of step {step_id}: {e}")))?;
        let Some(record) = records.iter().rev().find(|r| r.dataset == dataset) else {
            return Err((
                ErrorClass::Deterministic,
                format!("upstream step {step_id} staged no version of {dataset}, which this step reads"),
            ));
        };
        let staged: StagedVersion = serde_json::from_value(record.files.clone())
            .map_err(|e| (ErrorClass::Deterministic, format!("decoding staged version {}: {e}", record.id)))?;
        overlay.push(staged);
    }
    Ok(overlay)
}

/// The environment a command task sees, besides the inherited basics and its secrets.
pub fn step_env(a: &Attempt) -> Vec<(String, String)> {
    let ts = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Secs, true);
    let mut env = vec![
        ("TIDEGATE_RUN_ID".to_owned(), a.run_id.clone()),
        ("TIDEGATE_STEP_ID".to_owned(), a.step.id.clone()),
        ("TIDEGATE_TASK".to_owned(), a.step.task.clone()),
        ("TIDEGATE_PARTITION".to_owned(), a.partition.key.clone()),
        ("TIDEGATE_ATTEMPT".to_owned(), a.lease.attempt.to_string()),
        ("TIDEGATE_IDEMPOTENCY_KEY".to_owned(), a.step.step_key.clone()),
        ("TIDEGATE_OUTPUT_DIR".to_owned(), a.dir.display().to_string()),
        ("TIDEGATE_CHECKPOINT_FILE".to_owned(), crate::checkpoint::checkpoint_file(a).display().to_string()),
        ("TIDEGATE_LAKE".to_owned(), a.lake_uri.clone()),
    ];
    if let Some(i) = a.partition.interval {
        env.push(("TIDEGATE_INTERVAL_START".to_owned(), ts(i.start)));
        env.push(("TIDEGATE_INTERVAL_END".to_owned(), ts(i.end)));
    }
    if let Some(c) = &a.resume_from {
        env.push(("TIDEGATE_RESUME_FROM".to_owned(), c.position.clone()));
        env.push(("TIDEGATE_RESUME_GRANULE".to_owned(), c.granule.clone()));
    }
    for d in &a.outputs {
        env.push((
            format!("TIDEGATE_OUTPUT_DIR_{}", d.name.to_uppercase()),
            output_dir(a, &d.name).display().to_string(),
        ));
    }
    for p in &a.step.state.pinned {
        let name = p.dataset.to_uppercase();
        let uri_var = format!("TIDEGATE_INPUT_{name}_URI");
        if !a.source_env.iter().any(|(k, _)| *k == uri_var) {
            env.push((uri_var, format!("{}/{}", a.lake_uri.trim_end_matches('/'), p.dataset)));
        }
        env.push((format!("TIDEGATE_INPUT_{name}_VERSION"), p.version.map_or_else(String::new, |v| v.to_string())));
    }
    env.extend(a.source_env.iter().cloned());
    for (k, v) in &a.task.params {
        env.push((format!("TIDEGATE_PARAM_{}", k.to_uppercase()), v.clone()));
    }
    // The params again with their keys as the spec spells them (`TIDEGATE_PARAM_<KEY>` upper-cases
    // them, so `Batch` and `batch` would be one variable): what the Python package's params() reads.
    env.push(("TIDEGATE_PARAMS".to_owned(), serde_json::to_string(&a.task.params).unwrap_or_default()));
    env
}

/// The `AWS_*` client settings a task passes to its S3 client, none of them a credential.
pub const LAKE_CLIENT_ENV: &[&str] = &["AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"];

/// For an `s3://` lake, the [`LAKE_CLIENT_ENV`] settings the Tidegate process has (`get` reads
/// its environment), so that a task reaches the lake its pinned inputs are in as Tidegate does;
/// nothing for a folder lake. Credentials are not among them: a task that needs keys declares
/// them in `secrets`, which redacts them.
pub fn lake_client_env(lake_uri: &str, get: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    if !(lake_uri.starts_with("s3://") || lake_uri.starts_with("s3a://")) {
        return Vec::new();
    }
    LAKE_CLIENT_ENV.iter().filter_map(|name| get(name).map(|value| ((*name).to_owned(), value))).collect()
}

/// The attempt a lease starts at `site`: the step's task, outputs, partition and folders, from the
/// spec. `None` when the spec no longer has the step's task (the worker runs another spec
/// version).
pub fn prepare(
    spec: &tidegate_core::spec::Spec,
    site: &Site,
    step: StepRecord,
    lease: Lease,
    resume_from: Option<CheckpointRecord>,
    clock: Arc<dyn Clock>,
) -> Option<Attempt> {
    let task = spec.tasks.get(&step.task)?.clone();
    let outputs = task.outputs.iter().filter_map(|o| spec.datasets.get(o).cloned()).collect();
    let source_env = source_env(spec, &site.workspace, &step.inputs);
    Some(Attempt {
        dir: attempts_dir(&site.work_dir).join(attempt_name(&step.id, lease.attempt)),
        run_id: step.run_id.clone(),
        partition: Partition { key: step.partition.clone(), interval: step.interval },
        lease,
        step,
        task,
        outputs,
        workspace: site.workspace.clone(),
        work_dir: site.work_dir.clone(),
        lake_uri: site.lake_uri.clone(),
        heartbeat: Duration::from_secs(u64::from(spec.project.heartbeat_s)),
        lease_ttl_s: spec.project.lease_ttl_s,
        resume_from,
        clock,
        source_env,
    })
}

/// For each external input with a `location`: `TIDEGATE_INPUT_<NAME>_URI` is the Delta table's
/// location; for a template, `TIDEGATE_INPUT_<NAME>_PATHS` is the JSON array of the folders of
/// the partitions read, and `TIDEGATE_INPUT_<NAME>_PATH` the one folder when there is one.
fn source_env(
    spec: &tidegate_core::spec::Spec,
    workspace: &std::path::Path,
    inputs: &[tidegate_core::idempotency::PinnedInput],
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for input in inputs {
        let Some(ds) = spec.datasets.get(&input.dataset) else { continue };
        let tidegate_core::spec::DatasetKind::External { location: Some(location), .. } = &ds.kind else { continue };
        let name = input.dataset.to_uppercase();
        let resolve = |at: String| tidegate_core::source::resolve(workspace, &at);
        if tidegate_core::source::is_template(location) {
            let partitions = tidegate_core::plan::partitions_of(ds, &input.partitions).unwrap_or_default();
            let paths: Vec<String> =
                partitions.iter().map(|p| resolve(tidegate_core::source::render(location, p))).collect();
            if let [one] = paths.as_slice() {
                env.push((format!("TIDEGATE_INPUT_{name}_PATH"), one.clone()));
            }
            env.push((format!("TIDEGATE_INPUT_{name}_PATHS"), serde_json::to_string(&paths).unwrap_or_default()));
        } else {
            env.push((format!("TIDEGATE_INPUT_{name}_URI"), resolve(location.clone())));
        }
    }
    env
}

/// What a finished attempt's report asks of the store: the staged versions to record (fenced by
/// the epoch) and then the events that follow them.
#[derive(Debug)]
pub struct Settlement {
    /// The step, epoch and versions to record as staged, when the attempt staged output.
    pub staged: Option<(String, u64, Vec<tidegate_store::VersionRecord>)>,
    /// The events to commit after it (validation, a retry, a failure).
    pub events: Vec<tidegate_store::StepEventRecord>,
    /// Rows staged.
    pub n_rows: u64,
}

/// Turns a report into store writes. `attempt` is the step's attempt number the report is for;
/// `seed` seeds the backoff jitter (per step and epoch, so steps failing together spread out);
/// `meta` makes the journal metadata for a reason.
pub fn settle(
    report: Report,
    attempt: u32,
    seed: u64,
    meta: &dyn Fn(String) -> tidegate_store::JournalMeta,
) -> Settlement {
    use tidegate_core::rng::SplitMix64;
    use tidegate_core::state::StepEvent;
    use tidegate_store::{StepEventRecord, VersionRecord};
    match report {
        Report::Failed { step_id, epoch, class, reason, ended_at } => {
            let step_seed =
                u64::from_le_bytes(blake3::hash(step_id.as_bytes()).as_bytes()[..8].try_into().unwrap_or([0; 8]));
            let jitter = SplitMix64::new(seed ^ step_seed ^ epoch).next_unit();
            let event = StepEvent::AttemptFailed { epoch, class, reason: reason.clone(), at: ended_at, jitter };
            Settlement {
                staged: None,
                events: vec![StepEventRecord {
                    step_id,
                    event,
                    meta: meta(format!("{} failure: {reason}", class.as_str())),
                }],
                n_rows: 0,
            }
        }
        Report::Staged { step_id, epoch, versions, checks, ended_at } => {
            let records = versions
                .iter()
                .map(|v| VersionRecord {
                    id: crate::checkpoint::version_id(v),
                    step_id: step_id.clone(),
                    attempt,
                    dataset: v.dataset.clone(),
                    partition: v.partition_keys().join(","),
                    files: serde_json::to_value(v).unwrap_or_default(),
                    n_rows: v.n_rows,
                    schema_hash: v.schema_hash.clone(),
                    checksum: v.checksum.clone(),
                    stats: serde_json::to_value(&checks).unwrap_or_default(),
                    created_at: ended_at,
                })
                .collect();
            let failing: Vec<String> =
                checks.iter().filter(|c| c.blocks()).map(|c| format!("{} ({})", c.name, c.detail)).collect();
            let verdict = if failing.is_empty() {
                StepEvent::ChecksPassed { epoch }
            } else {
                StepEvent::ChecksFailed { epoch, reason: format!("blocking checks failed: {}", failing.join("; ")) }
            };
            let reason = checks_reason(&checks);
            Settlement {
                staged: Some((step_id.clone(), epoch, records)),
                events: vec![
                    StepEventRecord {
                        step_id: step_id.clone(),
                        event: StepEvent::ValidationStarted { epoch },
                        meta: meta("checks started".to_owned()),
                    },
                    StepEventRecord { step_id, event: verdict, meta: meta(reason) },
                ],
                n_rows: versions.iter().map(|v| v.n_rows).sum(),
            }
        }
        // Journaled by the attempt; the step is cancelled already.
        Report::Stopped { .. } => Settlement { staged: None, events: Vec::new(), n_rows: 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::{staging_attempt, staging_id, without_secrets};
    use crate::secrets::Secrets;

    #[test]
    fn delta_statistics_lose_the_bounds_that_hold_or_begin_a_secret() {
        let secrets = Secrets::new(&["canary-7e3b91d04c2a"]);
        let stats = r#"{"numRecords":2,"minValues":{"id":1,"token":"canary-7e3b91d04c2a","s":{"inner":"a canary-7e3b"},"ok":"abc"},"maxValues":{"id":2,"token":"zzz canary-7e3b91d04c2a zzz"},"nullCount":{"id":0,"token":0}}"#;
        let cleaned = without_secrets(stats, &secrets).expect("statistics that parse");
        assert_eq!(
            cleaned,
            r#"{"maxValues":{"id":2},"minValues":{"id":1,"ok":"abc","s":{}},"nullCount":{"id":0,"token":0},"numRecords":2}"#
        );
        assert_eq!(without_secrets("not json canary-7e3b91d04c2a", &secrets), None, "dropped whole");
    }

    #[test]
    fn a_failure_is_explained_by_the_last_line_of_stderr_that_says_something() {
        let tail = |lines: &[&str]| lines.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
        let error = tail(&["Traceback (most recent call last):", "OSError: Generic S3 error: no route", "", "  "]);
        assert_eq!(super::last_words(&error), Some("OSError: Generic S3 error: no route"));
        assert_eq!(super::last_words(&tail(&["", " "])), None);
        assert_eq!(super::last_words(&[]), None);
    }

    #[test]
    fn an_s3_lake_hands_its_client_settings_to_tasks_and_never_a_credential() {
        let env = |name: &str| Some(format!("value of {name}"));
        let handed = super::lake_client_env("s3://bucket/lake", env);
        let names: Vec<&str> = handed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"]);
        assert_eq!(handed[0].1, "value of AWS_REGION");
        assert!(super::lake_client_env("/srv/lake", env).is_empty(), "a folder lake needs none");
        let only_region = |name: &str| (name == "AWS_REGION").then(|| "eu-west-1".to_owned());
        assert_eq!(
            super::lake_client_env("s3a://b/l", only_region),
            [("AWS_REGION".to_owned(), "eu-west-1".to_owned())]
        );
    }

    #[test]
    fn staging_ids_name_their_step_and_attempt_and_nothing_else_does() {
        let step = "01a23150-d164-714a-a99c-7a9cf10f166b";
        let id = staging_id(step, 3);
        assert_eq!(staging_attempt(&id), Some((step, 3)));
        assert_eq!(staging_attempt(&format!("{id}-g12")), Some((step, 3)), "a checkpoint granule");
        assert_eq!(staging_attempt(&format!("{id}-rest")), Some((step, 3)), "what followed the last checkpoint");
        let short = "01a23150-d164-714a-a99c-7a9cf10f166-1";
        for other in
            ["abandoned-1", "batch-7", "notes", "-1", "dead-1-g", short, &format!("{id}-other"), &format!("{id}-g")]
        {
            assert_eq!(staging_attempt(other), None, "{other}");
        }
    }
}
