//! `tidegate rerun RUN --failed`: a new run over a run's failed steps (`tidegate_app::rerun`),
//! linked to it, executed in the foreground as `tidegate run` executes one.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::human::count;
use tidegate_app::rerun::{self, Rerun, RerunRequest};
use tidegate_core::actor::Actor;

/// Run a run's failed steps again, as a new run linked to it.
///
/// The new run holds the steps of RUN that failed or did not run because an upstream step
/// failed (with --downstream, also every step downstream of them in the spec, for the same
/// partitions), at the task's code as it is now: fix the cause, then rerun. Steps of RUN that
/// published are not run again. The link is journaled both ways: `tidegate history RUN` names
/// the new run, and the new run's request names RUN. The new run is checked as every run is
/// (schema changes, rewrites under review). Here it runs in the foreground as `tidegate run`
/// does; with --server it is queued on the server, whose scheduler runs it.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate rerun 0193a5c2 --failed\n  tidegate rerun 0193a5c2 --failed --downstream --reason \"source fixed\" --json"
)]
pub struct Args {
    /// The run: its id, or the first characters of it (4 or more; see `tidegate status`).
    pub run: String,
    /// Rerun the run's failed and upstream-failed steps (the one kind of rerun there is).
    #[arg(long, required = true)]
    pub failed: bool,
    /// Also rerun every step downstream of them in the spec, for the same partitions.
    #[arg(long)]
    pub downstream: bool,
    /// Why (recorded in the journal, on both runs).
    #[arg(long, default_value = "rerun by operator", value_parser = tidegate_app::input::reason)]
    pub reason: String,
    /// A client key that makes the rerun safe to retry: the same key returns the run it created.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Attempts to run at once in this process (pools may allow fewer).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=4096), allow_negative_numbers = true)]
    pub workers: u16,
    /// Print the result as JSON (no progress output).
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The application layer's request.
    pub fn request(&self) -> RerunRequest {
        RerunRequest {
            run: self.run.clone(),
            downstream: self.downstream,
            reason: self.reason.clone(),
            idempotency_key: self.idempotency_key.clone(),
        }
    }
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    crate::logging::init_foreground();
    let ws = tidegate_app::workspace::load(ws)?;
    let store = ws.open_store()?;
    let rerun = rerun::rerun(&ws, store.as_ref(), actor, &args.request())?;
    if !args.json {
        print_rerun(&rerun);
    }
    crate::cmd::run::run_submitted(&ws, actor, &rerun.submitted, args.workers.into(), false, args.json)
}

/// A rerun submitted, for people (on stderr: the run's outcome follows on stdout).
pub(crate) fn print_rerun(r: &Rerun) {
    let s = &r.submitted;
    let verb = if s.created { "Created" } else { "Found" };
    say_err!(
        "{verb} run {} rerunning {} of run {} ({} in all)",
        s.run.id,
        count(r.failed.len(), "failed step", "failed steps"),
        r.rerun_of,
        count(s.n_steps, "step", "steps")
    );
}
