//! `tidegate backfill`: a backfill is a governed release. `plan` freezes what will be rebuilt and
//! sizes its blast radius; `start` runs it into staging only, throttled below live work; `compare`
//! reports what would change; `approve` binds a second person to the exact spec and comparison;
//! `publish` makes it visible as one release; `rollback` restores what was there before.

pub(crate) mod exec;
pub(crate) mod plan;
pub(crate) mod release;
pub(crate) mod review;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_core::actor::Actor;

/// Governed backfills: plan, run into staging, compare, approve, publish, roll back.
///
/// Nothing a backfill computes is visible to readers until it is approved by someone other than
/// its requester (unless the workspace allows self-approval) and published as one release.
#[derive(Debug, clap::Subcommand)]
#[command(
    after_help = "Examples:\n  # a backfill's life, from plan to rollback\n  tidegate backfill plan daily_stats --from 2024-01-01 --to 2024-01-31 --reprocess all \\\n      --reason \"fix the dedup\"\n  tidegate backfill start bf-1a2b3c4d\n  tidegate backfill compare bf-1a2b3c4d --html report.html\n  TIDEGATE_TOKEN=tgt_... tidegate backfill approve bf-1a2b3c4d   # as the reviewer, with their token\n  tidegate backfill publish bf-1a2b3c4d\n  tidegate backfill rollback bf-1a2b3c4d"
)]
pub enum Command {
    Plan(plan::PlanArgs),
    /// Run a planned backfill into staging (published data is untouched).
    ///
    /// Its steps run below live work, within its throttle, and stop at staged, validated output.
    /// This backfill's run executes here, and live runs submitted while it does; runs queued
    /// before it started wait for `serve`, `tick` or `run --drain-queue`. Interrupted or crashed, `start` again resumes where it stopped.
    #[command(
        after_help = "Examples:\n  tidegate backfill start bf-1a2b3c4d\n  tidegate backfill start bf-1a2b3c4d --workers 8 --json"
    )]
    Start(exec::StartArgs),
    #[command(
        after_help = "Examples:\n  tidegate backfill status bf-1a2b3c4d\n  tidegate backfill status bf-1a2b3c4d --watch     # redraw every second while it runs\n  tidegate backfill status bf-1a2b3c4d --json"
    )]
    Status(exec::StatusArgs),
    /// Pause a running backfill: no new step starts; running attempts finish.
    ///
    /// `tidegate backfill resume` continues it where it stopped.
    #[command(
        after_help = "Examples:\n  tidegate backfill pause bf-1a2b3c4d --reason \"the warehouse is busy until 18:00\"\n  tidegate backfill resume bf-1a2b3c4d"
    )]
    Pause(exec::IdArgs),
    /// Resume a paused or interrupted backfill, running the rest of it into staging.
    ///
    /// Steps that already staged their output are not run again.
    #[command(
        after_help = "Examples:\n  tidegate backfill resume bf-1a2b3c4d\n  tidegate backfill resume bf-1a2b3c4d --workers 2"
    )]
    Resume(exec::StartArgs),
    /// Cancel a backfill before it is published: its unfinished steps are cancelled.
    ///
    /// Its running attempts are stopped within a few seconds by the processes running them, every
    /// process their tasks started killed (journaled as `attempt_stopped`). Nothing it staged is
    /// published; `tidegate reconcile` removes the staged files.
    #[command(
        after_help = "Examples:\n  tidegate backfill cancel bf-1a2b3c4d --reason \"superseded by bf-5e6f7a8b\"\n  tidegate backfill cancel bf-1a2b3c4d --json"
    )]
    Cancel(exec::IdArgs),
    Compare(review::CompareArgs),
    Approve(review::ApproveArgs),
    #[command(
        after_help = "Examples:\n  tidegate backfill publish bf-1a2b3c4d\n  tidegate backfill publish bf-1a2b3c4d --json"
    )]
    Publish(release::PublishArgs),
    #[command(
        after_help = "Examples:\n  tidegate backfill rollback bf-1a2b3c4d\n  tidegate backfill rollback bf-1a2b3c4d --reason \"consumers saw a drop in churn scores\""
    )]
    Rollback(release::RollbackArgs),
    #[command(after_help = "Examples:\n  tidegate backfill list\n  tidegate backfill list --limit 5 --json")]
    List(exec::ListArgs),
}

pub fn run(ws: Option<&Path>, actor: &Actor, command: Command) -> Result<ExitCode> {
    match command {
        Command::Plan(args) => plan::plan(ws, actor, args),
        Command::Start(args) => exec::start(ws, actor, args, false),
        Command::Resume(args) => exec::start(ws, actor, args, true),
        Command::Status(args) => exec::status(ws, actor, args),
        Command::Pause(args) => exec::pause(ws, actor, args),
        Command::Cancel(args) => exec::cancel(ws, actor, args),
        Command::List(args) => exec::list(ws, actor, args),
        Command::Compare(args) => review::compare(ws, actor, args),
        Command::Approve(args) => review::approve(ws, actor, args),
        Command::Publish(args) => release::publish(ws, actor, args),
        Command::Rollback(args) => release::rollback(ws, actor, args),
    }
}
