//! `tidegate logs` (`tidegate_app::logs`): what a task's attempts printed, by run, step, or task
//! and partition; one attempt or all; followed while the step runs.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use tidegate_app::logs::{self, AttemptLogs, Selector};
use tidegate_app::workspace;
use tidegate_core::actor::Actor;

use crate::output;

/// How often `--follow` looks for new output and whether the step finished.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

/// Show what attempts printed (standard output and error, secrets redacted).
///
/// Name a run (every step's attempts), a step, or a task and partition (the newest run's step).
/// Without --attempt every attempt is shown, oldest first. --follow prints the newest attempt's
/// output as it is written, until its step finishes.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate logs clean_events 2024-01-03\n  tidegate logs clean_events 2024-01-03 --attempt 2 --stderr\n  tidegate logs --run 0193a5c2-...\n  tidegate logs --step 0193a5c3-... --follow"
)]
pub struct Args {
    /// The task (with PARTITION).
    #[arg(requires = "partition", conflicts_with_all = ["run", "step"])]
    pub task: Option<String>,
    /// The partition key.
    pub partition: Option<String>,
    /// Every step of this run.
    #[arg(long, conflicts_with = "step")]
    pub run: Option<String>,
    /// This step, by id.
    #[arg(long)]
    pub step: Option<String>,
    /// Only this attempt (from 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub attempt: Option<u32>,
    /// Only standard output.
    #[arg(long, conflicts_with = "stderr")]
    pub stdout: bool,
    /// Only standard error.
    #[arg(long)]
    pub stderr: bool,
    /// Keep printing the newest attempt's output until its step finishes.
    #[arg(long, conflicts_with = "json")]
    pub follow: bool,
    /// List the attempts and their log files as JSON, without their contents.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let selector = match (args.task, args.partition, args.run, args.step) {
        (Some(task), Some(partition), None, None) => Selector::TaskPartition { task, partition },
        (None, None, Some(run), None) => Selector::Run(run),
        (None, None, None, Some(step)) => Selector::Step(step),
        _ => bail!("say whose logs: TASK PARTITION, --run RUN or --step STEP"),
    };
    let attempts = logs::attempts(&ws, store.as_ref(), actor, &selector, args.attempt)?;
    if args.json {
        output::json(&attempts)?;
        return Ok(ExitCode::SUCCESS);
    }
    if attempts.is_empty() {
        println!("No attempts yet.");
        return Ok(ExitCode::SUCCESS);
    }
    let streams = |a: &AttemptLogs| -> Vec<(&'static str, Option<std::path::PathBuf>)> {
        let mut out = Vec::new();
        if !args.stderr {
            out.push(("stdout", a.stdout.clone()));
        }
        if !args.stdout {
            out.push(("stderr", a.stderr.clone()));
        }
        out
    };
    let newest = attempts.len() - 1;
    for (i, a) in attempts.iter().enumerate() {
        for (name, path) in streams(a) {
            println!("== {} attempt {} ({}), {name}", a.step, a.attempt, a.status);
            let Some(path) = path else {
                println!("(no {name} log: the attempt ran no command, or its log was swept by `tidegate reconcile`)");
                continue;
            };
            let (bytes, _) = logs::read(&path, 0)?;
            std::io::stdout().write_all(&bytes)?;
        }
        if args.follow && i == newest {
            follow(&ws, store.as_ref(), actor, &selector, a, &streams(a))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints what `attempt` writes after what was already printed, until its step finishes.
fn follow(
    ws: &workspace::Workspace,
    store: &dyn tidegate_store::Store,
    actor: &Actor,
    selector: &Selector,
    attempt: &AttemptLogs,
    streams: &[(&'static str, Option<std::path::PathBuf>)],
) -> Result<()> {
    let mut offsets: Vec<u64> = streams
        .iter()
        .map(|(_, p)| p.as_ref().and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len()))
        .collect();
    loop {
        let now = logs::attempts(ws, store, actor, selector, Some(attempt.attempt))?;
        let finished = now.iter().find(|a| a.step_id == attempt.step_id).is_none_or(|a| a.status.is_terminal());
        for ((_, path), offset) in streams.iter().zip(offsets.iter_mut()) {
            let Some(path) = path else { continue };
            if let Ok((bytes, next)) = logs::read(path, *offset) {
                std::io::stdout().write_all(&bytes)?;
                std::io::stdout().flush()?;
                *offset = next;
            }
        }
        if finished {
            return Ok(());
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
}
