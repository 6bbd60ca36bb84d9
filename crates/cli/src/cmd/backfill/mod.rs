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
    after_help = "A backfill's life:\n  tidegate backfill plan daily_stats --from 2024-01-01 --to 2024-01-31 --reprocess all --reason \"fix the dedup\"\n  tidegate backfill start bf-1a2b3c4d\n  tidegate backfill compare bf-1a2b3c4d --html report.html\n  TIDEGATE_TOKEN=tgt_... tidegate backfill approve bf-1a2b3c4d   # as the reviewer, with their token\n  tidegate backfill publish bf-1a2b3c4d\n  tidegate backfill rollback bf-1a2b3c4d"
)]
pub enum Command {
    Plan(plan::PlanArgs),
    Start(exec::StartArgs),
    Status(exec::StatusArgs),
    Pause(exec::IdArgs),
    Resume(exec::StartArgs),
    Cancel(exec::IdArgs),
    Compare(review::CompareArgs),
    Approve(review::ApproveArgs),
    Publish(release::PublishArgs),
    Rollback(release::RollbackArgs),
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
