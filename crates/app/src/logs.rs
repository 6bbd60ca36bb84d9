//! Attempts' logs: what a task printed (stdout and stderr, bounded and with secrets redacted by
//! the engine), found by run, by step, or by task and partition, and the failures of a run with
//! their reasons and where their logs are.

use std::io::{Read as _, Seek as _, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::state::StepStatus;
use tidegate_engine::attempt::{attempt_name, logs_dir};
use tidegate_store::{StepRecord, Store};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

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
    /// What the task wrote to standard output, if it ran a command.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub stdout: Option<PathBuf>,
    /// What it wrote to standard error.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub stderr: Option<PathBuf>,
}

/// A failed step of a run, with why and where to look.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepFailure {
    /// The step's name.
    pub step: String,
    /// Attempts it made.
    pub attempts: u32,
    /// Why its last attempt failed (or which upstream step failed).
    pub reason: String,
    /// Its last attempt's standard error, when there is one.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub log: Option<PathBuf>,
}

/// The attempts `selector` names, oldest first; only `attempt` (a number) if given.
pub fn attempts(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    selector: &Selector,
    attempt: Option<u32>,
) -> Result<Vec<AttemptLogs>> {
    require(actor, Access::Read)?;
    let steps = steps_of(store, selector)?;
    let mut out = Vec::new();
    for step in &steps {
        for n in 1..=step.state.attempt {
            if attempt.is_some_and(|a| a != n) {
                continue;
            }
            let (stdout, stderr) = (log_file(ws, &step.id, n, "stdout.log"), log_file(ws, &step.id, n, "stderr.log"));
            out.push(AttemptLogs {
                step_id: step.id.clone(),
                step: step.name.clone(),
                attempt: n,
                status: step.status(),
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

/// Up to [`READ_BYTES_MAX`] bytes of `path` from byte `from`, and the offset to read on from.
pub fn read(path: &Path, from: u64) -> Result<(Vec<u8>, u64)> {
    let mut file = std::fs::File::open(path).with_context(|| format!("opening the log {}", path.display()))?;
    file.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::new();
    file.take(READ_BYTES_MAX).read_to_end(&mut bytes)?;
    let next = from + u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    Ok((bytes, next))
}

/// Writes what `files` (logs of `attempt`, one of the attempts `selector` names) gain past their
/// current ends to `out` as it is written, looking every [`FOLLOW_EVERY`], until the attempt's
/// step is finished.
pub fn follow(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    selector: &Selector,
    attempt: &AttemptLogs,
    files: &[&Path],
    out: &mut dyn Write,
) -> Result<()> {
    let mut offsets: Vec<u64> = files.iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len())).collect();
    loop {
        let now = attempts(ws, store, actor, selector, Some(attempt.attempt))?;
        let finished = now.iter().find(|a| a.step_id == attempt.step_id).is_none_or(|a| a.status.is_terminal());
        for (path, offset) in files.iter().zip(offsets.iter_mut()) {
            if let Ok((bytes, next)) = read(path, *offset) {
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
            attempts: s.state.attempt,
            reason: s.state.last_failure.as_ref().map_or_else(|| s.status().to_string(), |f| f.reason.clone()),
            log: (s.state.attempt > 0).then(|| log_file(ws, &s.id, s.state.attempt, "stderr.log")).flatten(),
        })
        .collect()
}

/// The steps `selector` names.
fn steps_of(store: &dyn Store, selector: &Selector) -> Result<Vec<StepRecord>> {
    match selector {
        Selector::Run(run_id) => {
            crate::run::find(store, run_id)?;
            Ok(store.steps(run_id)?)
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
    let path = logs_dir(&ws.root).join(format!("{}.{suffix}", attempt_name(step_id, attempt)));
    path.exists().then_some(path)
}
