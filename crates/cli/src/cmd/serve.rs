//! `tidegate serve`: the long-lived scheduler. Every tick it starts what the schedules say is due
//! (catch-up rules included), then executes every unfinished run, live work first. SIGTERM or
//! Ctrl-C stops it cleanly: no new attempt starts, attempts in flight finish and report, the
//! scheduler role is given up.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chrono::Utc;
use tidegate_core::actor::Actor;

use crate::cmd::data::{open_lake, runtime};
use tidegate_app::run;
use tidegate_app::workspace;

/// Run the schedules and execute runs until stopped (SIGTERM or Ctrl-C stop it cleanly).
///
/// Each tick does what `tidegate tick` does, then drains every unfinished run, including runs
/// and backfills submitted by other processes. On SIGTERM no new attempt starts, attempts in
/// flight finish and are recorded, and the process exits 0.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate serve\n  tidegate serve --tick-every-s 10 --workers 8\n  tidegate serve --workers 0   # attempts run in `tidegate worker` processes"
)]
pub struct Args {
    /// Seconds between schedule evaluations.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600), allow_negative_numbers = true)]
    pub tick_every_s: u64,
    /// Attempts this process runs itself at once (pools may allow fewer); 0 runs every attempt
    /// in `tidegate worker` processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=4096), allow_negative_numbers = true)]
    pub workers: u16,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let stop = Arc::new(AtomicBool::new(false));
    runtime()?.block_on(async {
        let flag = stop.clone();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            eprintln!("tidegate serve: stopping; attempts in flight will finish");
            flag.store(true, Ordering::SeqCst);
        });
        let lake = open_lake(&ws).await?;
        let engine = run::engine(&ws, store.clone(), lake.clone(), args.workers.into()).with_stop(stop.clone());
        eprintln!(
            "tidegate serve: {} (ticking every {} s; SIGTERM or Ctrl-C stops)",
            ws.spec.project.name, args.tick_every_s
        );
        while !stop.load(Ordering::SeqCst) {
            let started = Instant::now();
            let now = Utc::now();
            let decisions = tidegate_app::schedule::decide(&ws.spec, &lake, now).await?;
            let due = tidegate_app::schedule::start_due(&ws, store.as_ref(), actor, &decisions, now)?;
            for run_id in &due.runs {
                eprintln!("tick {now}: started run {run_id}");
            }
            for s in &due.superseded {
                eprintln!("tick {now}: {}@{} superseded by run {}", s.task, s.partition, s.by_run);
            }
            for d in decisions.iter().filter(|d| !d.debt.is_empty()) {
                eprintln!("tick {now}: {} has {} missed intervals as debt (catch-up off)", d.task, d.debt.len());
            }
            let summary = engine.drain().await?;
            if summary.published + summary.failed + summary.skipped > 0 {
                eprintln!(
                    "drained: {} published, {} failed, {} skipped, {} retries",
                    summary.published, summary.failed, summary.skipped, summary.retried
                );
            }
            let next = started + Duration::from_secs(args.tick_every_s);
            while !stop.load(Ordering::SeqCst) && Instant::now() < next {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        eprintln!("tidegate serve: stopped cleanly");
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
