//! `tidegate worker`: a process that runs leased attempts (`tidegate_app::worker`) until SIGTERM or
//! Ctrl-C.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::worker::{self, WorkerRequest};
use tidegate_app::workspace::{self, open_lake, runtime};
use tidegate_core::actor::Actor;

use tracing::info;

use crate::cmd::serve::stop_on_signal;
use crate::logging::LogFormat;
use crate::output;

/// Run attempts leased to this worker by the scheduler, until stopped.
///
/// Start it beside `tidegate serve` (give serve `--workers 0` to run every attempt in worker
/// processes) on the same workspace and state store. The scheduler leases a step to a worker with
/// a free slot; if the worker dies, its leases expire and the steps are retried elsewhere.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate worker\n  tidegate worker --slots 8 --name gpu-box-1\n  tidegate serve --workers 0 & tidegate worker --slots 4"
)]
pub struct Args {
    /// Attempts this worker runs at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024), allow_negative_numbers = true)]
    pub slots: u32,
    /// The worker's name in leases and the journal (default: worker-<host>-<pid>).
    #[arg(long)]
    pub name: Option<String>,
    /// Print what the worker did as JSON when it stops.
    #[arg(long)]
    pub json: bool,
    /// How log lines are written (standard error; `RUST_LOG` filters them: by default tidegate's at info, others' at warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    crate::logging::init(args.log_format);
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let name = worker::name(&WorkerRequest { slots: args.slots, name: args.name })?;
    let summary = runtime()?.block_on(async {
        let stop = stop_on_signal("tidegate worker: stopping; attempts in flight will finish")?;
        let lake = open_lake(&ws).await?;
        let project = &ws.spec.project.name;
        info!(
            worker = name,
            slots = args.slots,
            project,
            "tidegate worker {name}: {} slot(s) (SIGTERM or Ctrl-C stops)",
            args.slots
        );
        worker::work(&ws, store, lake, actor, name.clone(), args.slots, stop).await
    })?;
    if args.json {
        output::json(&summary)?;
    } else {
        info!(
            worker = name,
            staged = summary.staged,
            failed = summary.failed,
            rejected = summary.rejected,
            "tidegate worker {name}: stopped cleanly ({} staged, {} failed, {} refused as stale)",
            summary.staged,
            summary.failed,
            summary.rejected
        );
    }
    Ok(ExitCode::SUCCESS)
}
