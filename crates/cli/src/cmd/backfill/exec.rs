//! `backfill start|resume|status|pause|cancel|list`: run a frozen backfill into staging, throttled
//! below live work, and watch or steer it (`tidegate_app::backfill::exec`).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tidegate_app::backfill::{Begun, Cancelled, Report, short};
use tidegate_app::human::{count, duration};
use tidegate_app::run::Scope;
use tidegate_app::workspace::Workspace;
use tidegate_core::actor::Actor;
use tidegate_store::{BackfillRecord, BackfillStatus, Store};

use crate::cmd::Json;
use crate::cmd::run::with_progress;
use crate::output;

/// A backfill to run into staging (`start` and `resume`, which say what they do).
#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// The backfill's id (`bf-...`, see `tidegate backfill list`), or a unique prefix of it.
    pub id: String,
    /// Attempts this process runs at once, 1 to 4096 (the backfill's own throttle still applies;
    /// with --server, the server's workers run it).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=4096), allow_negative_numbers = true)]
    pub workers: u16,
    #[command(flatten)]
    pub out: Json,
}

/// A backfill to steer (`pause` and `cancel`, which say what they do).
#[derive(Debug, clap::Args)]
pub struct IdArgs {
    /// The backfill's id (`bf-...`, see `tidegate backfill list`), or a unique prefix of it.
    pub id: String,
    /// Why (recorded in the journal).
    #[arg(long, value_parser = tidegate_app::input::reason)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub out: Json,
}

/// Progress, throughput, ETA and failures of a backfill.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The backfill's id (`bf-...`, see `tidegate backfill list`), or a unique prefix of it.
    pub id: String,
    /// Redraw every second until the backfill stops moving.
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub out: Json,
}

/// The known backfills, newest first.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// How many backfills to show, newest first.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true)]
    pub limit: u32,
    #[command(flatten)]
    pub out: Json,
}

pub fn start(ws: Option<&Path>, actor: &Actor, args: StartArgs, resume: bool) -> Result<ExitCode> {
    crate::logging::init_foreground();
    let (ws, store) = crate::cmd::open(ws)?;
    let report = start_and_wait(&ws, &store, actor, &args.id, resume, usize::from(args.workers), !args.out.json)?;
    output::emit(args.out.json, &report, print_report)?;
    Ok(if report.status == BackfillStatus::Failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Starts (or resumes) a backfill and drains its run in this process with `workers` slots, then
/// reports where it stands; `talk` prints what runs and a progress line.
pub(crate) fn start_and_wait(
    ws: &Workspace,
    store: &Arc<dyn Store>,
    actor: &Actor,
    id: &str,
    resume: bool,
    workers: usize,
    talk: bool,
) -> Result<Report> {
    Ok(match tidegate_app::backfill::start(ws, store.as_ref(), actor, id, resume)? {
        Begun::AlreadyRan { report } => *report,
        Begun::Running { id, run_id, n_steps, max_active } => {
            if talk {
                say_err!(
                    "Backfill {id} running as run {run_id}: {} into staging, at most {max_active} at once",
                    count(n_steps, "step", "steps")
                );
            }
            // The backfill's own run, below live work submitted meanwhile (its `run` commands
            // follow this process); runs queued before are not this command's to execute
            // (decision 0020).
            let scope = Scope::RunAndLater(&run_id);
            with_progress(talk, |p| tidegate_app::run::execute(ws, store.clone(), actor, workers, p, scope))?;
            tidegate_app::backfill::settle(ws, store.as_ref(), actor, &id)?
        }
    })
}

pub fn pause(ws: Option<&Path>, actor: &Actor, args: IdArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let record = tidegate_app::backfill::pause(&ws, store.as_ref(), actor, &args.id, args.reason.as_deref())?;
    output::emit(args.out.json, &record, print_paused)
}

/// A backfill paused, for people.
pub(crate) fn print_paused(r: &BackfillRecord) {
    println!("Paused backfill {}: no new step starts; running attempts finish.", r.id);
    println!("Resume with: tidegate backfill resume {}", r.id);
}

pub fn cancel(ws: Option<&Path>, actor: &Actor, args: IdArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let cancelled = tidegate_app::backfill::cancel(&ws, store.as_ref(), actor, &args.id, args.reason.as_deref())?;
    output::emit(args.out.json, &cancelled.record, |r| print_cancelled(r, &cancelled))
}

/// A backfill cancelled, for people.
pub(crate) fn print_cancelled(r: &BackfillRecord, cancelled: &Cancelled) {
    say!(
        "Cancelled backfill {} ({} cancelled). Nothing it staged was published; `tidegate reconcile` removes the \
         staged files.",
        r.id,
        count(cancelled.n_steps_cancelled, "unfinished step", "unfinished steps")
    );
    if cancelled.n_attempts_stopping > 0 {
        say!(
            "{} being stopped by the processes running them (within a few seconds)",
            count(cancelled.n_attempts_stopping, "running attempt is", "running attempts are")
        );
    }
}

pub(crate) fn print_report(r: &Report) {
    println!("Backfill {} is {} (spec {}), requested by {}", r.id, r.status, short(&r.spec_hash), r.requester);
    say!("  reason: {}", r.reason);
    let detail: Vec<String> = r.steps.iter().map(|(s, n)| format!("{n} {s}")).collect();
    println!(
        "  steps: {}/{} settled ({})",
        r.n_done,
        r.n_steps,
        if detail.is_empty() { "none started".to_owned() } else { detail.join(", ") }
    );
    if let (Some(e), Some(rate)) = (r.elapsed_s, r.steps_per_s) {
        let eta = r.eta_s.map(|s| format!(", ETA {}", duration(s))).unwrap_or_default();
        println!("  {} elapsed, {rate:.2} steps/s{eta}", duration(e));
    }
    for f in &r.failures {
        say!("  failed: {} after {}: {}", f.step, count(f.attempts, "attempt", "attempts"), f.reason);
    }
    if let (Some(hash), None) = (&r.comparison_hash, &r.approval) {
        println!("  compared: comparison {} (what an approval names)", short(hash));
    }
    if let Some(a) = &r.approval {
        println!(
            "  approved by {} at {} (spec {}, comparison {})",
            a.by,
            a.at,
            short(&a.spec_hash),
            short(&a.comparison_hash)
        );
    }
    if let Some(rel) = &r.release_id {
        println!("  published as release {rel}");
    }
    say!("Next: {}", r.next);
}

pub fn status(ws: Option<&Path>, actor: &Actor, args: StatusArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let redraw = args.watch && !args.out.json && std::io::stdout().is_terminal();
    loop {
        let report = tidegate_app::backfill::status(&ws, store.as_ref(), actor, &args.id)?;
        if redraw {
            print!("\x1b[2J\x1b[H");
        }
        output::emit(args.out.json, &report, print_report)?;
        if !args.watch || !matches!(report.status, BackfillStatus::Running | BackfillStatus::Paused) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

pub fn list(ws: Option<&Path>, actor: &Actor, args: ListArgs) -> Result<ExitCode> {
    let (_, store) = crate::cmd::open(ws)?;
    let backfills = tidegate_app::backfill::list(store.as_ref(), actor, args.limit)?;
    output::emit(args.out.json, &backfills, |b| print_list(b))
}

/// Backfills for people, newest first.
pub(crate) fn print_list(backfills: &[BackfillRecord]) {
    if backfills.is_empty() {
        println!("No backfills yet. Plan one with:");
        println!("  tidegate backfill plan TARGET --from A --to B --reprocess all --reason \"...\"");
        return;
    }
    let header = ["id", "status", "requester", "planned", "footprint", "reason"];
    output::print_table(&header, &[0], backfills, |b| {
        let partitions: usize = b.footprint.values().map(Vec::len).sum();
        vec![
            b.id.clone(),
            b.status.to_string(),
            b.requester.clone(),
            b.created_at.format("%Y-%m-%d %H:%M").to_string(),
            format!(
                "{}, {}",
                count(b.footprint.len(), "dataset", "datasets"),
                count(partitions, "partition", "partitions")
            ),
            b.reason.clone(),
        ]
    });
}
