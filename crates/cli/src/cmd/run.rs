//! `tidegate submit`, `run` and `cancel`: create a run (queued, not executed) idempotently; submit
//! one and execute it in the foreground until everything is published, failed or waiting for
//! approval, with a progress bar on a terminal and plain lines otherwise; cancel one.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use tidegate_app::human::{count, duration};
use tidegate_app::run::{Cancelled, Outcome};
use tidegate_app::submit::{self, SubmitRequest, Submitted};
use tidegate_app::target::{Partitions, Target};
use tidegate_app::view;
use tidegate_app::workspace::{self, Workspace};
use tidegate_core::actor::Actor;
use tidegate_engine::executor::ProgressFn;
use tidegate_store::{Priority, Trigger};

use crate::cmd::Json;
use crate::cmd::plan::TargetArgs;
use crate::output;

/// Create a queued run for a target and partition range, without executing it.
///
/// With --idempotency-key, submitting the same request again returns the run already created
/// and creates nothing; the same key with a different request is an error naming what differs.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate submit daily_stats --from 2024-01-01 --to 2024-01-07\n  tidegate submit daily_stats --partition 2024-01-03 --idempotency-key nightly-2024-01-03 --json"
)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// A client key that makes the submission safe to retry (kept 24 h by default).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Plan, run, check and publish a target's partitions in the foreground.
///
/// Each step's output is staged invisibly, checked, and published as one Delta commit per
/// dataset. Transient failures are retried with backoff inside the pool's retry budget;
/// deterministic ones fail at once with the reason. Interrupting and running again resumes: the
/// state store knows what was done, and a replayed publication adds nothing. A run that would
/// replace partitions published by another version of a task's code is refused, naming them and
/// the `tidegate backfill plan` that replaces them under review (unless the dataset declares
/// `rewrites = "free"`); a step runs only the code it was submitted with.
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
    /// Rebuild exactly the target's stale partitions (`tidegate stale`): those built from inputs
    /// that changed since. Instead of --from/--to, --partition or --all.
    #[arg(long, conflicts_with_all = ["from", "partition", "all"])]
    pub stale: bool,
    /// Print the summary as JSON (no progress output).
    #[arg(long)]
    pub json: bool,
}

/// Cancel a run: its unfinished steps and running attempts stop; what it published stays.
///
/// Attempts running when it is cancelled are stopped within a few seconds by the process running
/// them (a `serve`, a `run`, or a `tidegate worker` on another machine, which learn of the cancel
/// through the store): every process the task started is killed, nothing it staged is published,
/// and the journal records the stop (`attempt_stopped`, with who cancelled and why). Nothing more
/// of the run is published. Undo what it published with `tidegate rollback --run RUN`. A
/// backfill's run is cancelled with `tidegate backfill cancel`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate cancel 0193a5c2-...\n  tidegate cancel 0193a5c2-... --reason \"wrong range\" --json"
)]
pub struct CancelArgs {
    /// The run: its id, or the first characters of it (4 or more; see `tidegate status`).
    pub run: String,
    /// Why (recorded in the journal).
    #[arg(long, default_value = "cancelled by operator", value_parser = tidegate_app::input::reason)]
    pub reason: String,
    #[command(flatten)]
    pub out: Json,
}

pub fn submit(ws: Option<&Path>, actor: &Actor, args: SubmitArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let submitted = submit::submit(&ws, store.as_ref(), actor, &args.target.submit_request(args.idempotency_key)?)?;
    output::emit(args.json, &submitted, print_submitted)
}

/// A submission for people.
pub(crate) fn print_submitted(s: &Submitted) {
    if s.created {
        println!("Created run {} ({}, queued)", s.run.id, count(s.n_steps, "step", "steps"));
    } else {
        println!(
            "Run {} already exists for this idempotency key ({}, {}); nothing new was created",
            s.run.id,
            count(s.n_steps, "step", "steps"),
            s.run.status
        );
    }
}

pub fn cancel(ws: Option<&Path>, actor: &Actor, args: CancelArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let cancelled = tidegate_app::run::cancel(&ws, store.as_ref(), actor, &args.run, &args.reason)?;
    output::emit(args.out.json, &cancelled, print_cancelled)
}

/// A run cancelled, for people.
pub(crate) fn print_cancelled(c: &Cancelled) {
    println!(
        "Cancelled run {} ({} cancelled)",
        c.run_id,
        count(c.n_steps_cancelled, "unfinished step", "unfinished steps")
    );
    if c.n_attempts_stopping > 0 {
        say!(
            "{} being stopped by the processes running them (within a few seconds)",
            count(c.n_attempts_stopping, "running attempt is", "running attempts are")
        );
    }
    if !c.published.is_empty() {
        say!(
            "{} of its steps had already committed their publication (a process stopped before recording it); \
             recorded as releases, their rows stay published: undo them with `tidegate rollback --run {}`",
            c.published.len(),
            c.run_id
        );
        for f in &c.published {
            println!("  published: step {} as release {}", f.step_id, f.release_id);
        }
    }
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    crate::logging::init_foreground();
    let ws = workspace::load(ws)?;
    let request = if args.stale {
        let task = tidegate_core::plan::resolve_target(&ws.spec, &args.target.target)?;
        let keys = tidegate_app::stale::stale_keys(&ws, ws.open_store()?.as_ref(), &task.name)?;
        if keys.is_empty() {
            if args.json {
                output::json(&serde_json::json!({ "created": false, "stale": [] }))?;
            } else {
                say!("Nothing of {} is stale.", task.name);
            }
            return Ok(ExitCode::SUCCESS);
        }
        SubmitRequest {
            target: Target {
                target: task.name.clone(),
                partitions: Partitions::Keys(keys),
                only: true,
                downstream: args.target.downstream,
            },
            idempotency_key: args.idempotency_key,
            trigger: Trigger::Manual,
            priority: Priority::Live,
        }
    } else {
        args.target.submit_request(args.idempotency_key)?
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
    with_queue: bool,
    json: bool,
) -> Result<ExitCode> {
    let store = ws.open_store()?;
    let submitted = submit::submit(ws, store.as_ref(), actor, request)?;
    if !json {
        let verb = if submitted.created { "Created" } else { "Resuming" };
        eprintln!("{verb} run {} ({})", submitted.run.id, count(submitted.n_steps, "step", "steps"));
    }
    run_submitted(ws, actor, &submitted, workers, with_queue, json)
}

/// Drains the `submitted` run in this process with `workers` slots, printing its outcome (as
/// JSON with `json`); the exit status says whether any step failed.
pub(crate) fn run_submitted(
    ws: &Workspace,
    actor: &Actor,
    submitted: &Submitted,
    workers: usize,
    with_queue: bool,
    json: bool,
) -> Result<ExitCode> {
    let store = ws.open_store()?;
    let outcome = with_progress(!json, |progress| {
        tidegate_app::run::execute_submitted(ws, store, actor, submitted, workers, with_queue, progress)
    })?;
    output::emit(json, &outcome, print_outcome)?;
    Ok(if outcome.succeeded() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// A run's outcome for people, with where to look when steps failed.
fn print_outcome(outcome: &Outcome) {
    let (s, id) = (&outcome.summary, &outcome.run_id);
    say!(
        "Run {id} {}: {} published, {} failed, {} skipped, {}, {} in {}",
        outcome.status,
        s.published,
        s.failed,
        s.skipped,
        count(s.retried, "retry", "retries"),
        count(s.rejected, "rejected stale report", "rejected stale reports"),
        duration(outcome.elapsed_s)
    );
    // Rows the write modes left out are data a reader will not find: said, never silent.
    if s.duplicates_dropped > 0 {
        say!(
            "  {} dropped by dedup_key (already published, or earlier in the delivery)",
            count(s.duplicates_dropped, "duplicate row", "duplicate rows")
        );
    }
    if s.late_rows_ignored > 0 {
        say!(
            "  {} ignored by merge: the table holds a newer row of their key by order_by",
            count(s.late_rows_ignored, "late row", "late rows")
        );
    }
    for f in &outcome.failures {
        let log = f.log.as_ref().map(|p| format!("\n    log: {}", p.location())).unwrap_or_default();
        say!("  {} failed after {}: {}{log}", f.step, count(f.attempts, "attempt", "attempts"), f.reason);
    }
    if !outcome.failures.is_empty() {
        // One command a line, each whole, to copy.
        println!("Logs: tidegate logs --run {id}");
        println!("The whole story: tidegate history {id}");
    }
    // Lineage is quiet while it keeps up; a receiver that is down is worth a line.
    if outcome.lineage.is_pending() {
        eprintln!("Note: {}", outcome.lineage);
    }
}

/// Calls `f` with a progress printer for the executor when `show` (on stderr), and leaves the
/// last state on screen when it returns.
pub fn with_progress<T>(show: bool, f: impl FnOnce(Option<ProgressFn>) -> Result<T>) -> Result<T> {
    let progress = show.then(Progress::new);
    let out = f(progress.as_ref().map(Progress::printer))?;
    if let Some(Progress::Bar(bar)) = progress {
        // The last state stays on screen; what follows starts on a line of its own.
        bar.finish();
        eprintln!();
    }
    Ok(out)
}

/// Progress on stderr: an `indicatif` bar redrawn in place on a terminal, a plain line every few
/// seconds otherwise (a log keeps a readable record).
enum Progress {
    Bar(indicatif::ProgressBar),
    Lines,
}

impl Progress {
    fn new() -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress::Lines;
        }
        let bar = indicatif::ProgressBar::with_draw_target(Some(0), indicatif::ProgressDrawTarget::stderr());
        // The message takes what the terminal's width leaves (cut there, never wrapped); the time
        // left is worded as every duration is.
        let template = "[{bar:24}] {pos}/{len} steps, ETA {left}: {wide_msg}";
        if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
            let left = |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&duration(state.eta().as_secs_f64()));
            };
            bar.set_style(style.progress_chars("=> ").with_key("left", left));
        }
        Progress::Bar(bar)
    }

    /// The callback the executor calls with each tally of steps by state.
    fn printer(&self) -> ProgressFn {
        match self {
            Progress::Bar(bar) => {
                let bar = bar.clone();
                Box::new(move |tally: &BTreeMap<String, usize>| {
                    let p = view::Progress::of(tally, 0.0);
                    bar.set_length(u64::try_from(p.total).unwrap_or(u64::MAX));
                    bar.set_position(u64::try_from(p.done).unwrap_or(u64::MAX));
                    bar.set_message(view::states(tally));
                })
            }
            Progress::Lines => {
                let started = Instant::now();
                let last = Mutex::new((Instant::now() - Duration::from_secs(60), String::new()));
                Box::new(move |tally: &BTreeMap<String, usize>| {
                    let line = plain_line(tally, started.elapsed().as_secs_f64());
                    let Ok(mut last) = last.lock() else { return };
                    if last.0.elapsed() >= Duration::from_secs(2) && line != last.1 {
                        eprintln!("{line}");
                        *last = (Instant::now(), line);
                    }
                })
            }
        }
    }
}

/// The widest a progress line is: it fits an 80-column terminal, or a log viewer's line.
pub const PROGRESS_WIDTH: usize = 80;

/// The plain progress line: `[33/78] ETA 3.0 s: 30 published, ...`, cut to [`PROGRESS_WIDTH`].
fn plain_line(tally: &BTreeMap<String, usize>, elapsed_s: f64) -> String {
    let p = view::Progress::of(tally, elapsed_s);
    let eta = p.eta_s.map(|left| format!(" ETA {}:", duration(left))).unwrap_or_default();
    cut(&format!("[{}/{}]{eta} {}", p.done, p.total, view::states(tally)), PROGRESS_WIDTH)
}

/// `line` cut to `width` characters, ending in `…` when cut.
fn cut(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(width - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of a year's steps in many states: the plain progress line fits 80 columns.
    #[test]
    fn the_progress_line_fits_80_columns() {
        let tally: BTreeMap<String, usize> = [
            ("published", 120_000),
            ("failed", 1_200),
            ("upstream_failed", 3_400),
            ("running", 16),
            ("retry_wait", 9),
            ("ready", 200_000),
            ("pending", 99_000),
        ]
        .into_iter()
        .map(|(s, n)| (s.to_owned(), n))
        .collect();
        let line = plain_line(&tally, 5_000.0);
        assert!(line.chars().count() <= 80, "{} columns: {line}", line.chars().count());
        assert!(line.starts_with("[124600/423625] ETA 3 h 19 min: 120000 published"), "{line}");
    }
}
