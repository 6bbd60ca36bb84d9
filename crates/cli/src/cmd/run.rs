//! `tidegate run`: submit a run and execute it in the foreground until everything is published,
//! failed or waiting for approval, with a progress bar on a terminal and plain lines otherwise.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tidegate_app::logs::{StepFailure, failures};
use tidegate_app::run::Scope;
use tidegate_app::submit::{SubmitRequest, submit};
use tidegate_app::workspace::{self, Workspace};
use tidegate_core::actor::Actor;
use tidegate_engine::Summary;
use tidegate_store::{Priority, Trigger};

use crate::cmd::plan::TargetArgs;
use crate::output;

/// Plan, run, check and publish a target's partitions in the foreground.
///
/// Each step's output is staged invisibly, checked, and published as one Delta commit per
/// dataset. Transient failures are retried with backoff inside the pool's retry budget;
/// deterministic ones fail at once with the reason. Interrupting and running again resumes: the
/// state store knows what was done, and a replayed publication adds nothing.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate run daily_stats --from 2024-01-01 --to 2024-01-07\n  tidegate run events --partition 2024-01-03 --idempotency-key events-2024-01-03\n  tidegate run daily_stats --from 2024-01-01 --to 2024-01-31 --workers 8 --json"
)]
pub struct Args {
    #[command(flatten)]
    pub target: TargetArgs,
    /// A client key that makes the submission safe to retry: the same key and request resume
    /// the same run instead of creating another.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Attempts to run at once in this process (pools may allow fewer); registered `tidegate
    /// worker` processes add their slots.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=4096), allow_negative_numbers = true)]
    pub workers: u16,
    /// Also execute every other unfinished run in the store, as `tidegate serve` would, until
    /// this one settles (by default other runs wait for `serve`).
    #[arg(long)]
    pub drain_queue: bool,
    /// Print the summary as JSON (no progress output).
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct RunReport<'a> {
    run_id: &'a str,
    created: bool,
    status: String,
    summary: &'a Summary,
    elapsed_s: f64,
    failures: Vec<StepFailure>,
}

/// Cancel a run: its unfinished steps stop being scheduled; what it published stays.
///
/// Attempts running when it is cancelled finish, and their outcome is refused (the steps are
/// cancelled); nothing more of the run is published. Undo what it published with `tidegate
/// rollback --run RUN`. A backfill's run is cancelled with `tidegate backfill cancel`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate cancel 0193a5c2-...\n  tidegate cancel 0193a5c2-... --reason \"wrong range\" --json"
)]
pub struct CancelArgs {
    /// The run (see `tidegate status`).
    pub run: String,
    /// Why (recorded in the journal).
    #[arg(long, default_value = "cancelled by operator", value_parser = crate::cmd::reason)]
    pub reason: String,
    #[arg(long)]
    pub json: bool,
}

pub fn cancel(ws: Option<&Path>, actor: &Actor, args: CancelArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let cancelled = tidegate_app::run::cancel(&ws, store.as_ref(), actor, &args.run, &args.reason)?;
    if args.json {
        output::json(&cancelled)?;
    } else {
        println!("Cancelled run {} ({} unfinished steps cancelled)", cancelled.run_id, cancelled.n_steps_cancelled);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let request = SubmitRequest {
        target: args.target.target()?,
        idempotency_key: args.idempotency_key,
        trigger: Trigger::Manual,
        priority: Priority::Live,
    };
    submit_and_run(&ws, actor, &request, args.workers.into(), args.drain_queue, args.json)
}

/// Submits a run and drains it in this process with `workers` slots, printing its outcome (as
/// JSON with `json`); the exit status says whether any step failed.
pub(crate) fn submit_and_run(
    ws: &Workspace,
    actor: &Actor,
    request: &SubmitRequest,
    workers: usize,
    drain_queue: bool,
    json: bool,
) -> Result<ExitCode> {
    let store = ws.open_store()?;
    let submitted = submit(ws, store.as_ref(), actor, request)?;
    let (run, created, n_steps) = (submitted.run, submitted.created, submitted.n_steps);
    if !json {
        let verb = if created { "Created" } else { "Resuming" };
        eprintln!("{verb} run {} ({n_steps} steps)", run.id);
    }
    let started = Instant::now();
    let scope = if drain_queue { Scope::RunAndQueue(&run.id) } else { Scope::Run(&run.id) };
    let summary = execute(ws, store.clone(), actor, workers, !json, scope)?;
    let run = store.run(&run.id)?.context("the run vanished from the store")?;
    let failures = failures(ws, store.as_ref(), actor, &run.id)?;
    let report = RunReport {
        run_id: &run.id,
        created,
        status: run.status.to_string(),
        summary: &summary,
        elapsed_s: started.elapsed().as_secs_f64(),
        failures,
    };
    if json {
        output::json(&report)?;
    } else {
        println!(
            "Run {} {}: {} published, {} failed, {} skipped, {} retries, {} rejected stale reports in {:.1} s",
            run.id,
            report.status,
            summary.published,
            summary.failed,
            summary.skipped,
            summary.retried,
            summary.rejected,
            report.elapsed_s
        );
        for f in &report.failures {
            let log = f.log.as_ref().map(|p| format!("\n    log: {}", p.display())).unwrap_or_default();
            println!("  {} failed after {} attempt(s): {}{log}", f.step, f.attempts, f.reason);
        }
        if !report.failures.is_empty() {
            println!("Logs: tidegate logs --run {}; the whole story: tidegate history {}", run.id, run.id);
        }
    }
    Ok(if summary.failed > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Executes the runs `scope` names (see `tidegate_app::run::execute`), with a progress line on
/// stderr when `show_progress`.
pub fn execute(
    ws: &Workspace,
    store: Arc<dyn tidegate_store::Store>,
    actor: &Actor,
    workers: usize,
    show_progress: bool,
    scope: Scope<'_>,
) -> Result<Summary> {
    let summary = tidegate_app::run::execute(ws, store, actor, workers, show_progress.then(progress_printer), scope)?;
    if show_progress && std::io::stderr().is_terminal() {
        eprintln!();
    }
    Ok(summary)
}

/// A progress line: redrawn in place on a terminal, printed every few seconds otherwise.
fn progress_printer() -> tidegate_engine::executor::ProgressFn {
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let last = Mutex::new((Instant::now() - Duration::from_secs(60), String::new()));
    Box::new(move |tally: &BTreeMap<String, usize>| {
        let total: usize = tally.values().sum();
        let done: usize =
            ["published", "failed", "upstream_failed", "skipped", "superseded", "cancelled", "awaiting_approval"]
                .iter()
                .filter_map(|s| tally.get(*s))
                .sum();
        let elapsed = started.elapsed().as_secs_f64();
        let eta = if done > 0 && done < total {
            #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
            let rate = done as f64 / elapsed.max(0.001);
            #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
            let left = (total - done) as f64 / rate;
            format!(", ETA {left:.0} s")
        } else {
            String::new()
        };
        let detail: Vec<String> = tally.iter().filter(|(_, n)| **n > 0).map(|(s, n)| format!("{n} {s}")).collect();
        let line = format!("[{done}/{total}] {}{eta}", detail.join(", "));
        let Ok(mut last) = last.lock() else { return };
        if tty {
            if line != last.1 {
                eprint!("\r\x1b[2K{line}");
                last.1 = line;
            }
        } else if last.0.elapsed() >= Duration::from_secs(2) && line != last.1 {
            eprintln!("{line}");
            *last = (Instant::now(), line);
        }
    })
}
