//! Attempts' logs: what a task printed (stdout and stderr, bounded and with secrets redacted by
//! the engine), found by run, by step, or by task and partition, and the failures of a run with
//! their reasons and where their logs are.
//!
//! A log is read where its attempt wrote it when that is on this machine (the workspace's
//! `.tidegate/logs`, a worker's own folder in the workspace, or another working folder the caller
//! names), and otherwise from its copy in the lake (`<lake>/_tidegate/logs/`, written by the
//! engine while the attempt runs and when it ends), so that an attempt a worker ran on another
//! machine is read the same way.

use std::io::{Read as _, Seek as _, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tidegate_core::actor::Actor;
use tidegate_core::state::StepStatus;
use tidegate_engine::attempt::{attempt_name, default_work_dir, logs_dir, worker_work_dir};
use tidegate_lake::{Lake, LogCopy};
use tidegate_store::{StepRecord, Store};

use crate::actor::{Access, require};
use crate::workspace::{Workspace, open_lake, runtime};

/// The most a single read of a log returns, so a huge log is followed in pieces.
pub const READ_BYTES_MAX: u64 = 1 << 20;

/// How often [`follow`] looks for new output and whether the step finished.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// Whose logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Every step of a run.
    Run(String),
    /// One step, by id.
    Step(String),
    /// The newest run's step of a task for a partition.
    TaskPartition {
        /// The task.
        task: String,
        /// The partition key.
        partition: String,
    },
}

/// Where one of an attempt's logs can be read: shown (and serialized) as its path or URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogFile {
    /// A file on this machine, where the attempt wrote it.
    Local(PathBuf),
    /// Its copy in the lake.
    Lake(LogCopy),
    /// A path or URL another process reported (a server's answer), not read from here.
    Reported(String),
}

impl LogFile {
    /// Its path or URL, for people.
    pub fn location(&self) -> String {
        match self {
            LogFile::Local(path) => path.display().to_string(),
            LogFile::Lake(copy) => copy.url.clone(),
            LogFile::Reported(location) => location.clone(),
        }
    }

    /// Its size in bytes when it was found (a local file's, now); 0 when unknown.
    pub fn size(&self) -> u64 {
        match self {
            LogFile::Local(path) => std::fs::metadata(path).map_or(0, |m| m.len()),
            LogFile::Lake(copy) => copy.size,
            LogFile::Reported(_) => 0,
        }
    }
}

impl Serialize for LogFile {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.location())
    }
}

impl<'de> Deserialize<'de> for LogFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        String::deserialize(d).map(LogFile::Reported)
    }
}

/// One attempt's logs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptLogs {
    /// The step's id.
    pub step_id: String,
    /// Its name, `task@partition`.
    pub step: String,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// The step's status now.
    pub status: StepStatus,
    /// The worker that ran it.
    pub worker: String,
    /// Where what the task wrote to standard output is, if it ran a command that wrote anything:
    /// a path on this machine or its copy's URL in the lake; from a server, the URL path of the
    /// route that serves its text (`/api/steps/{id}/log?attempt=N&stream=stdout`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub stdout: Option<LogFile>,
    /// Where what it wrote to standard error is, as `stdout` says.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub stderr: Option<LogFile>,
}

/// Finds and reads attempts' logs: on this machine first, in the lake otherwise (opened the
/// first time it is needed, and kept).
pub struct Logs<'w> {
    ws: &'w Workspace,
    /// Working folders to look in besides the workspace's own (a worker's `--work-dir`).
    work_dirs: Vec<PathBuf>,
    lake: Option<(tokio::runtime::Runtime, Arc<Lake>)>,
}

impl std::fmt::Debug for Logs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logs").field("work_dirs", &self.work_dirs).finish_non_exhaustive()
    }
}

impl<'w> Logs<'w> {
    /// Logs of `ws`'s attempts, looked for in `work_dirs` too (working folders of workers on
    /// this machine that are not in the workspace).
    pub fn new(ws: &'w Workspace, work_dirs: Vec<PathBuf>) -> Self {
        Self { ws, work_dirs, lake: None }
    }

    fn lake(&mut self) -> Result<(&tokio::runtime::Runtime, &Lake)> {
        if self.lake.is_none() {
            let rt = runtime()?;
            let lake = rt.block_on(open_lake(self.ws))?;
            self.lake = Some((rt, lake));
        }
        let (rt, lake) = self.lake.as_ref().context("the lake was just opened")?;
        Ok((rt, lake.as_ref()))
    }

    /// The attempts `selector` names, oldest first; only `attempt` (a number) if given.
    pub fn attempts(
        &mut self,
        store: &dyn Store,
        actor: &Actor,
        selector: &Selector,
        attempt: Option<u32>,
    ) -> Result<Vec<AttemptLogs>> {
        require(actor, Access::Read)?;
        let steps = steps_of(store, selector)?;
        let mut out = Vec::new();
        for step in &steps {
            let made = store.attempts(&step.id)?;
            let mut copies: Option<Vec<LogCopy>> = None;
            for n in 1..=step.state.attempt {
                if attempt.is_some_and(|a| a != n) {
                    continue;
                }
                let worker = made.iter().find(|a| a.attempt == n).map(|a| a.worker.clone()).unwrap_or_default();
                let mut file = |stream: &str| -> Result<Option<LogFile>> {
                    if let Some(path) = self.local(&step.id, n, &worker, stream) {
                        return Ok(Some(LogFile::Local(path)));
                    }
                    if copies.is_none() {
                        let (rt, lake) = self.lake()?;
                        copies = Some(rt.block_on(lake.log_copies(&step.id))?);
                    }
                    let copy = copies.iter().flatten().find(|c| c.attempt == n && c.stream == stream);
                    Ok(copy.cloned().map(LogFile::Lake))
                };
                let (stdout, stderr) = (file("stdout")?, file("stderr")?);
                out.push(AttemptLogs {
                    step_id: step.id.clone(),
                    step: step.name.clone(),
                    attempt: n,
                    status: step.status(),
                    worker,
                    stdout,
                    stderr,
                });
            }
        }
        if let (Some(n), true) = (attempt, out.is_empty()) {
            crate::refuse!(
                NotFound,
                "no attempt {n} among the steps asked for; `tidegate logs` without --attempt lists the attempts made"
            );
        }
        Ok(out)
    }

    /// The log of `stream` of attempt `n` of a step on this machine, if there is one: in the
    /// working folders named, the worker's own folder in the workspace, or the workspace's.
    fn local(&self, step_id: &str, n: u32, worker: &str, stream: &str) -> Option<PathBuf> {
        let name = format!("{}.{stream}.log", attempt_name(step_id, n));
        let mut dirs: Vec<PathBuf> = self.work_dirs.clone();
        if !worker.is_empty() && worker.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
            dirs.push(worker_work_dir(&self.ws.root, worker));
        }
        dirs.push(default_work_dir(&self.ws.root));
        dirs.into_iter().map(|d| logs_dir(&d).join(&name)).find(|p| p.is_file())
    }

    /// Up to [`READ_BYTES_MAX`] bytes of `file` from byte `from`, the offset to read on from,
    /// and the log's size now.
    pub fn read(&mut self, file: &LogFile, from: u64) -> Result<(Vec<u8>, u64, u64)> {
        match file {
            LogFile::Local(path) => {
                let (bytes, next) = read(path, from)?;
                let size = std::fs::metadata(path).map_or(next, |m| m.len());
                Ok((bytes, next, size))
            }
            LogFile::Lake(copy) => {
                let (rt, lake) = self.lake()?;
                let read = lake.read_log(&copy.step_id, copy.attempt, &copy.stream, from, READ_BYTES_MAX);
                let (bytes, size) = rt.block_on(read)?.unwrap_or((Vec::new(), from));
                let next = from + u64::try_from(bytes.len()).unwrap_or(u64::MAX);
                Ok((bytes, next, size))
            }
            LogFile::Reported(location) => {
                anyhow::bail!("the log {location} was reported by another process; it is not read from here")
            }
        }
    }

    /// Writes what `streams` (of `attempt`, one of the attempts `selector` names) gain past their
    /// ends to `out` as it is written, looking every [`FOLLOW_EVERY`], until the attempt's step is
    /// finished. Each stream is read where [`Logs::attempts`] finds it at each look: on this
    /// machine while the attempt writes it here, else its copy in the lake (copied every few
    /// seconds while the attempt runs).
    pub fn follow(
        &mut self,
        store: &dyn Store,
        actor: &Actor,
        selector: &Selector,
        attempt: &AttemptLogs,
        streams: &[&str],
        out: &mut dyn Write,
    ) -> Result<()> {
        let mut offsets: Vec<u64> = streams.iter().map(|s| stream_of(attempt, s).map_or(0, LogFile::size)).collect();
        loop {
            let now = self.attempts(store, actor, selector, Some(attempt.attempt))?;
            let Some(current) = now.iter().find(|a| a.step_id == attempt.step_id) else { return Ok(()) };
            let finished = current.status.is_terminal();
            for (stream, offset) in streams.iter().zip(offsets.iter_mut()) {
                let Some(file) = stream_of(current, stream) else { continue };
                loop {
                    let Ok((bytes, next, _)) = self.read(file, *offset) else { break };
                    if bytes.is_empty() {
                        break;
                    }
                    out.write_all(&bytes)?;
                    out.flush()?;
                    *offset = next;
                }
            }
            if finished {
                return Ok(());
            }
            std::thread::sleep(FOLLOW_EVERY);
        }
    }
}

/// The log of `stream` (`stdout` or `stderr`) of an attempt, if it has one.
pub fn stream_of<'a>(attempt: &'a AttemptLogs, stream: &str) -> Option<&'a LogFile> {
    match stream {
        "stdout" => attempt.stdout.as_ref(),
        "stderr" => attempt.stderr.as_ref(),
        _ => None,
    }
}

/// The attempts `selector` names, oldest first; only `attempt` (a number) if given. See
/// [`Logs::attempts`].
pub fn attempts(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    selector: &Selector,
    attempt: Option<u32>,
) -> Result<Vec<AttemptLogs>> {
    Logs::new(ws, Vec::new()).attempts(store, actor, selector, attempt)
}

/// Up to [`READ_BYTES_MAX`] bytes of `path` from byte `from`, and the offset to read on from.
pub fn read(path: &Path, from: u64) -> Result<(Vec<u8>, u64)> {
    let mut file = std::fs::File::open(path).with_context(|| format!("opening the log {}", path.display()))?;
    file.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::new();
    file.take(READ_BYTES_MAX).read_to_end(&mut bytes)?;
    let next = from + u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    Ok((bytes, next))
}

/// A failed step of a run, with why and where to look.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepFailure {
    /// The step's name.
    pub step: String,
    /// The step's id.
    pub step_id: String,
    /// Attempts it made.
    pub attempts: u32,
    /// Why its last attempt failed (or which upstream step failed).
    pub reason: String,
    /// Its last attempt's standard error, when there is one: the file's path where the attempt
    /// ran; over HTTP, the URL path of `GET /api/steps/{id}/log` that serves it (a path on the
    /// server's disk is not the client's to know).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub log: Option<LogFile>,
}

impl StepFailure {
    /// The failure as the HTTP API shows it: its log as the route that serves its text.
    pub fn linked(mut self) -> StepFailure {
        if self.log.is_some() {
            let route = format!("/api/steps/{}/log?attempt={}&stream=stderr", self.step_id, self.attempts);
            self.log = Some(LogFile::Reported(route));
        }
        self
    }
}

/// The failed steps of `run_id`, in step order, with their last reason and log.
pub fn failures(ws: &Workspace, store: &dyn Store, actor: &Actor, run_id: &str) -> Result<Vec<StepFailure>> {
    require(actor, Access::Read)?;
    Ok(failures_of(ws, &store.steps(run_id)?))
}

/// The failed steps among `steps`, with their last reason and log.
pub fn failures_of(ws: &Workspace, steps: &[StepRecord]) -> Vec<StepFailure> {
    steps
        .iter()
        .filter(|s| matches!(s.status(), StepStatus::Failed | StepStatus::UpstreamFailed))
        .map(|s| StepFailure {
            step: s.name.clone(),
            step_id: s.id.clone(),
            attempts: s.state.attempt,
            reason: s.state.last_failure.as_ref().map_or_else(|| s.status().to_string(), |f| f.reason.clone()),
            log: (s.state.attempt > 0)
                .then(|| log_file(ws, &s.id, s.state.attempt, "stderr.log"))
                .flatten()
                .map(LogFile::Local),
        })
        .collect()
}

/// The steps `selector` names.
fn steps_of(store: &dyn Store, selector: &Selector) -> Result<Vec<StepRecord>> {
    match selector {
        Selector::Run(run_id) => {
            let run = crate::run::find(store, run_id)?;
            Ok(store.steps(&run.id)?)
        }
        Selector::Step(step_id) => match store.step(step_id)? {
            Some(step) => Ok(vec![step]),
            None => crate::refuse!(NotFound, "no step {step_id:?}"),
        },
        Selector::TaskPartition { task, partition } => {
            // The newest run holding that step: runs come newest first.
            for run in store.runs(RUNS_SEARCHED)? {
                if let Some(step) =
                    store.steps(&run.id)?.into_iter().find(|s| &s.task == task && &s.partition == partition)
                {
                    return Ok(vec![step]);
                }
            }
            crate::refuse!(NotFound, "no step of {task} for partition {partition} in the newest {RUNS_SEARCHED} runs")
        }
    }
}

/// How many of the newest runs a task-and-partition search reads.
const RUNS_SEARCHED: u32 = 1_000;

/// An attempt's log file, if it exists.
fn log_file(ws: &Workspace, step_id: &str, attempt: u32, suffix: &str) -> Option<PathBuf> {
    let path = logs_dir(&default_work_dir(&ws.root)).join(format!("{}.{suffix}", attempt_name(step_id, attempt)));
    path.exists().then_some(path)
}

/// A piece of one attempt's log, as text: what `GET /api/steps/{id}/log` answers, so a client
/// reads a log over HTTP, from wherever the attempt wrote it, without a path on the server's
/// disk; followed by asking again from `next` until `finished`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogText {
    /// The step's id.
    pub step_id: String,
    /// The attempt's number, from 1 (0: the step has made no attempt).
    pub attempt: u32,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The step's status now.
    pub status: StepStatus,
    /// Whether the step has finished, so the log will not grow.
    pub finished: bool,
    /// The byte offset `text` starts at.
    pub from: u64,
    /// The offset to ask from for what follows.
    pub next: u64,
    /// The log's size now, in bytes.
    pub size: u64,
    /// The bytes read (at most [`READ_BYTES_MAX`]), as UTF-8 with invalid sequences replaced.
    pub text: String,
}

/// Where [`text`] starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At this byte offset.
    Offset(u64),
    /// This many bytes before the log's end (the end of a failed attempt's log).
    Tail(u64),
}

/// Up to [`READ_BYTES_MAX`] bytes of `stream` of attempt `attempt` (the newest unless given) of
/// step `step_id`, from where `start` says.
pub fn text(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    step_id: &str,
    attempt: Option<u32>,
    stream: &str,
    start: Start,
) -> Result<LogText> {
    require(actor, Access::Read)?;
    if !matches!(stream, "stdout" | "stderr") {
        crate::refuse!(Invalid, "a log's stream is `stdout` or `stderr`, not {stream:?}");
    }
    let Some(step) = store.step(step_id)? else {
        crate::refuse!(NotFound, "no step {step_id:?} in this workspace's store");
    };
    let mut logs = Logs::new(ws, Vec::new());
    let selector = Selector::Step(step.id.clone());
    let n = attempt.unwrap_or(step.state.attempt);
    let status = step.status();
    let empty = |n, from| LogText {
        step_id: step.id.clone(),
        attempt: n,
        stream: stream.to_owned(),
        status,
        finished: status.is_terminal(),
        from,
        next: from,
        size: 0,
        text: String::new(),
    };
    let at = match start {
        Start::Offset(at) => at,
        Start::Tail(_) => 0,
    };
    if n == 0 {
        return Ok(empty(0, at));
    }
    let found = logs.attempts(store, actor, &selector, Some(n))?;
    let Some(file) = found.first().and_then(|a| stream_of(a, stream)).cloned() else { return Ok(empty(n, at)) };
    let from = match start {
        Start::Offset(at) => at,
        Start::Tail(n) => file.size().saturating_sub(n),
    };
    let (bytes, next, size) = logs.read(&file, from)?;
    Ok(LogText { text: String::from_utf8_lossy(&bytes).into_owned(), next, size, ..empty(n, from) })
}
