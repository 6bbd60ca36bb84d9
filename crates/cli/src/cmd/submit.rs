//! `tidegate submit`: create a run (queued, not executed) idempotently.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::submit::{SubmitRequest, Submitted, submit};
use tidegate_app::workspace;
use tidegate_core::actor::Actor;
use tidegate_store::{Priority, Trigger};

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
pub struct Args {
    #[command(flatten)]
    pub target: TargetArgs,
    /// A client key that makes the submission safe to retry (kept 24 h by default).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let request = SubmitRequest {
        target: args.target.target()?,
        idempotency_key: args.idempotency_key,
        trigger: Trigger::Manual,
        priority: Priority::Live,
    };
    let submitted = submit(&ws, store.as_ref(), actor, &request)?;
    report(&submitted, args.json)
}

fn report(s: &Submitted, json: bool) -> Result<ExitCode> {
    if json {
        output::json(s)?;
    } else if s.created {
        println!("Created run {} ({} steps, queued)", s.run.id, s.n_steps);
    } else {
        println!(
            "Run {} already exists for this idempotency key ({} steps, {}); nothing new was created",
            s.run.id, s.n_steps, s.run.status
        );
    }
    Ok(ExitCode::SUCCESS)
}
