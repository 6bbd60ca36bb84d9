//! `tidegate worker`: a process that runs attempts and nothing else. The scheduler (`tidegate
//! serve`, or a `tidegate run` holding the scheduler role) leases steps to registered workers
//! within pools, rate limits and priority shares; each worker runs what is leased in its name and
//! records the outcome. SIGTERM or Ctrl-C stops it cleanly: no new lease is taken, attempts in
//! flight finish and are recorded, and the registration is removed.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use tidegate_core::clock::SystemClock;
use tidegate_engine::Worker;

use crate::cmd::data::{open_lake, runtime};
use crate::{output, workspace};

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
}

pub fn run(ws: Option<&Path>, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let name = match args.name {
        Some(name) if is_worker_name(&name) => name,
        Some(name) => {
            anyhow::bail!("--name {name:?} cannot name a worker: use 1 to 64 letters, digits, '-', '_' or '.'")
        }
        None => format!("worker-{}-{}", hostname(), std::process::id()),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let summary = runtime()?.block_on(async {
        let flag = stop.clone();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            eprintln!("tidegate worker: stopping; attempts in flight will finish");
            flag.store(true, Ordering::SeqCst);
        });
        let lake = open_lake(&ws).await?;
        let worker = Worker::new(
            store,
            lake,
            Arc::new(ws.spec.clone()),
            ws.root.clone(),
            ws.lake_url(),
            Arc::new(SystemClock),
            name.clone(),
            args.slots,
            stop.clone(),
        );
        eprintln!(
            "tidegate worker {name}: {} slot(s) on {} (SIGTERM or Ctrl-C stops)",
            args.slots, ws.spec.project.name
        );
        anyhow::Ok(worker.run().await?)
    })?;
    if args.json {
        output::json(&summary)?;
    } else {
        eprintln!(
            "tidegate worker {name}: stopped cleanly ({} staged, {} failed, {} refused as stale)",
            summary.staged, summary.failed, summary.rejected
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn is_worker_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// This machine's name, for default worker names; `localhost` when it cannot be read.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
