//! `tidegate tick`: one pass of the scheduler (`tidegate_app::schedule`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use chrono::{DateTime, Utc};
use tidegate_app::run::Scope;
use tidegate_app::schedule::{TaskDecision, tick};
use tidegate_app::view::{self, MAX_GROUPS};
use tidegate_app::workspace::{self, Workspace};
use tidegate_core::actor::Actor;

use crate::cmd::run::with_progress;
use crate::output;

/// Run the schedules once: start what is due, and report what catch-up leaves as debt.
///
/// An interval of a scheduled task's dataset is due at the first time the task's schedule fires
/// at or after the interval ends, in the dataset's time zone (`30 4 * * *` makes a day due at
/// 04:30 the next morning; `@daily` at midnight, as it ends). The intervals due since the newest
/// published partition are owed: those due at the latest fire time run now; older ones were
/// missed. With catch-up off (the default) the missed ones are reported as debt; with
/// `catchup = { enabled = true, max_active_runs = N }` they run newest first, below live work, at
/// most N of the task's intervals at once. `--now` replays the decision at another instant.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate tick\n  tidegate tick --now 2024-01-31T00:05:00Z --json\n  tidegate tick --dry-run"
)]
pub struct Args {
    /// The instant to decide at (RFC 3339 or a date); default now.
    #[arg(long)]
    pub now: Option<String>,
    /// Decide and report, but submit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Attempts to run at once in this process while running what is due (pools may allow fewer).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=4096), allow_negative_numbers = true)]
    pub workers: u16,
    /// Print the result as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let now = crate::cmd::now(&ws, args.now.as_deref())?;
    tick_at(&ws, actor, now, args.dry_run, args.workers.into(), args.json)
}

/// One scheduler pass at `now`: decides, starts what is due (unless `dry_run`) and drains it with
/// `workers` slots, then prints the decisions (as JSON with `json`).
pub(crate) fn tick_at(
    ws: &Workspace,
    actor: &Actor,
    now: DateTime<Utc>,
    dry_run: bool,
    workers: usize,
    json: bool,
) -> Result<ExitCode> {
    let store = ws.open_store()?;
    let tick = tick(ws, store.as_ref(), actor, now, dry_run)?;
    if !json {
        print_decisions(&tick.decisions, now);
        for s in &tick.superseded {
            say!("  {}@{}: superseded by run {}, which already covers it", s.task, s.partition, s.by_run);
        }
        for a in &tick.arrivals {
            let list = |keys: &[String]| match keys {
                [] => String::new(),
                [one] => format!(" ({one})"),
                [first, .., last] => format!(" ({first} .. {last})"),
            };
            say!(
                "{}: on arrival: {} started, its sources arrived{}; {} waiting for their sources{}",
                a.task,
                a.started.len(),
                list(&a.started),
                a.waiting.len(),
                list(&a.waiting)
            );
        }
    }
    if !tick.runs.is_empty() {
        with_progress(!json, |p| tidegate_app::run::execute(ws, store.clone(), actor, workers, p, Scope::Everything))?;
    }
    if json {
        output::json(&tick)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_decisions(decisions: &[TaskDecision], now: DateTime<Utc>) {
    println!("Tick at {now}:");
    if decisions.is_empty() {
        println!("  no scheduled task has a time-partitioned output");
    }
    for d in decisions {
        if let Some(why) = &d.paused {
            say!("  {}: paused, nothing planned ({why}); {} due, left owed", d.task, d.n_due);
            continue;
        }
        if d.n_due == 0 {
            println!("  {}: up to date (newest published {})", d.task, d.newest_published.as_deref().unwrap_or("-"));
            continue;
        }
        let mode = if d.catchup { "catch-up on" } else { "catch-up off" };
        let newest = if d.n_due > d.due.len() as u64 { ", newest shown" } else { "" };
        say!(
            "  {}: {} due ({}{newest}); {mode} -> running {}",
            d.task,
            d.n_due,
            view::span(&d.due),
            view::keys(&d.run, MAX_GROUPS)
        );
        if d.n_debt > 0 {
            let newest = if d.n_debt > d.debt.len() as u64 { "newest " } else { "" };
            say!("    debt (missed, not run): {}; {newest}{}", d.n_debt, view::keys(&d.debt, MAX_GROUPS));
        }
    }
}
