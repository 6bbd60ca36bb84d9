//! `tidegate pause`, `resume` and `pauses` (`tidegate_app::pause`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::human::count;
use tidegate_app::pause::PauseLine;
use tidegate_core::actor::Actor;
use tidegate_store::PauseRecord;

use crate::cmd::Json;
use crate::output;

/// Pause a schedule, a task, a pool, or all catch-up or backfill traffic.
///
/// WHAT is `schedule:TASK` (the tick plans nothing for the task; its intervals stay owed),
/// `task:TASK` or `pool:NAME` (their ready steps are not started; they stay ready), or
/// `class:catchup` / `class:backfill` (no catch-up or backfill step starts). Attempts already
/// running finish: a pause is not a cancel. The pause is journaled with its reason and shows in
/// `tidegate status`, `tidegate pauses` and the `tidegate_paused` metric until `tidegate resume`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate pause task:daily_sales --reason \"upstream feed is wrong\"\n  tidegate pause class:backfill --reason \"incident 42: warehouse overloaded\"\n  tidegate pause schedule:hourly_clicks --reason \"maintenance window\" --json"
)]
pub struct PauseArgs {
    /// What to pause: schedule:TASK, task:TASK, pool:NAME, class:catchup or class:backfill.
    pub what: String,
    /// Why (recorded in the journal; required).
    #[arg(long, value_parser = tidegate_app::input::reason)]
    pub reason: String,
    #[command(flatten)]
    pub out: Json,
}

/// End a pause: what it held back may start again (a schedule's next tick plans it again).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate resume task:daily_sales --reason \"feed fixed\"\n  tidegate resume class:backfill --reason \"incident 42 over\""
)]
pub struct ResumeArgs {
    /// What to resume, as it was paused (see `tidegate pauses`).
    pub what: String,
    /// Why (recorded in the journal; required).
    #[arg(long, value_parser = tidegate_app::input::reason)]
    pub reason: String,
    #[command(flatten)]
    pub out: Json,
}

/// List the pauses in force: what, who, since when, why, and what each holds back now.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate pauses\n  tidegate pauses --json")]
pub struct PausesArgs {
    #[command(flatten)]
    pub out: Json,
}

pub fn pause(ws: Option<&Path>, actor: &Actor, args: PauseArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let paused = tidegate_app::pause::pause(&ws, store.as_ref(), actor, &args.what, &args.reason)?;
    output::emit(args.out.json, &paused, print_paused)
}

pub fn resume(ws: Option<&Path>, actor: &Actor, args: ResumeArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let ended = tidegate_app::pause::resume(&ws, store.as_ref(), actor, &args.what, &args.reason)?;
    output::emit(args.out.json, &ended, print_resumed)
}

pub fn list(ws: Option<&Path>, actor: &Actor, args: PausesArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let pauses = tidegate_app::pause::list(&ws, store.as_ref(), actor)?;
    output::emit(args.out.json, &pauses, |p| print_pauses(p))
}

fn since(p: &PauseRecord) -> String {
    p.paused_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A pause begun, for people.
pub(crate) fn print_paused(p: &PauseRecord) {
    say!("Paused {} ({}); running attempts finish; `tidegate resume {}` ends it", p.what, p.reason, p.what);
}

/// A pause ended, for people.
pub(crate) fn print_resumed(p: &PauseRecord) {
    say!("Resumed {} (paused by {} since {}: {})", p.what, p.actor, since(p), p.reason);
}

/// The pauses in force, for people.
pub(crate) fn print_pauses(pauses: &[PauseLine]) {
    if pauses.is_empty() {
        println!("Nothing is paused.");
        return;
    }
    for p in pauses {
        say!("{}", pause_line(p));
    }
}

/// One pause in a line: what, what it holds back, who, since when, why.
pub(crate) fn pause_line(p: &PauseLine) -> String {
    let r = &p.record;
    let held = if r.what.starts_with("schedule:") {
        format!("{} not planned", count(p.held_back, "owed interval", "owed intervals"))
    } else {
        format!("{} held", count(p.held_back, "ready step", "ready steps"))
    };
    format!("{}: paused by {} since {} ({held}): {}", r.what, r.actor, since(r), r.reason)
}
