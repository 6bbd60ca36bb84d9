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
///
/// A log is read where the attempt wrote it when that is on this machine (the workspace's
/// .tidegate folder, a worker's folder in it, or TIDEGATE_WORK_DIR), else from its copy in the
/// lake, which attempts on every machine write: so a worker's logs are read from anywhere. With
/// --server, a run's or a step's logs are read as text from the server (--follow included), never
/// from a path on its disk.
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
    /// Every step of this run (its id, or a unique prefix of it).
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
    /// List the attempts and their log files as JSON, without their contents (with --server,
    /// the server's routes that serve each log's text).
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
    // A worker started here with its own folder elsewhere left its logs there.
    let work_dirs: Vec<std::path::PathBuf> =
        std::env::var_os(crate::cmd::serve::WORK_DIR_VAR).map(Into::into).into_iter().collect();
    let mut reader = logs::Logs::new(&ws, work_dirs);
    let attempts = reader.attempts(store.as_ref(), actor, &selector, args.attempt)?;
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
        for (name, file, _) in &shown {
            println!("== {} attempt {} ({}), {name}", a.step, a.attempt, a.status);
            match file {
                Some(file) => {
                    // A long log shows its end, where a failure is, and says where the rest is.
                    let size = file.size();
                    let from = size.saturating_sub(logs::READ_BYTES_MAX);
                    if from > 0 {
                        say!(
                            "(the last {} of {}; the whole log is {})",
                            tidegate_app::human::size(logs::READ_BYTES_MAX),
                            tidegate_app::human::size(size),
                            file.location()
                        );
                    }
                    stdout.write_all(&reader.read(file, from)?.0)?;
                }
                None => println!("(no {name} log: nothing written, no command run, or swept by `tidegate reconcile`)"),
            }
        }
        if args.follow && i + 1 == attempts.len() {
            let streams: Vec<&str> = shown.iter().map(|(name, _, _)| *name).collect();
            reader.follow(store.as_ref(), actor, &selector, a, &streams, &mut stdout)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
