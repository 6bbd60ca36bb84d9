//! `tidegate logs` (`tidegate_app::logs`): what a task's attempts printed, by run, step, or task
//! and partition; one attempt or all; followed while the step runs.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Result, bail};
use tidegate_app::logs::{self, Selector};
use tidegate_core::actor::Actor;

use crate::output;

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
    let (ws, store) = crate::cmd::open(ws)?;
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
    }
    let mut stdout = std::io::stdout();
    for (i, a) in attempts.iter().enumerate() {
        let streams = [("stdout", &a.stdout, !args.stderr), ("stderr", &a.stderr, !args.stdout)];
        let shown: Vec<_> = streams.into_iter().filter(|(_, _, shown)| *shown).collect();
        for (name, path, _) in &shown {
            println!("== {} attempt {} ({}), {name}", a.step, a.attempt, a.status);
            match path {
                Some(path) => {
                    // A long log shows its end, where a failure is, and says where the rest is.
                    let size = std::fs::metadata(path).map_or(0, |m| m.len());
                    let from = size.saturating_sub(logs::READ_BYTES_MAX);
                    if from > 0 {
                        say!(
                            "(the last {} of {}; the whole log is {})",
                            output::human_bytes(logs::READ_BYTES_MAX),
                            output::human_bytes(size),
                            path.display()
                        );
                    }
                    stdout.write_all(&logs::read(path, from)?.0)?;
                }
                None => println!(
                    "(no {name} log: the attempt ran no command, or its log was swept by `tidegate reconcile`)"
                ),
            }
        }
        if args.follow && i + 1 == attempts.len() {
            let files: Vec<&Path> = shown.iter().filter_map(|(_, path, _)| path.as_deref()).collect();
            logs::follow(&ws, store.as_ref(), actor, &selector, a, &files, &mut stdout)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
