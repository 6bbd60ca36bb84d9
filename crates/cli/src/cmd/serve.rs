//! `tidegate serve`: the long-lived scheduler (`tidegate_app::serve`) until SIGTERM or Ctrl-C.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use tidegate_app::serve::{Event, ServeOptions, serve};
use tidegate_app::workspace::{self, open_lake, runtime};
use tidegate_core::actor::Actor;
use tracing::info;

use crate::logging::LogFormat;

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
    /// How log lines are written (standard error; `RUST_LOG` filters them: by default tidegate's at info, others' at warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    crate::logging::init(args.log_format);
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let options = ServeOptions { tick_every: Duration::from_secs(args.tick_every_s), workers: args.workers.into() };
    runtime()?.block_on(async {
        let stop = stop_on_signal("tidegate serve: stopping; attempts in flight will finish")?;
        let lake = open_lake(&ws).await?;
        let project = &ws.spec.project.name;
        info!(project, tick_every_s = args.tick_every_s, "tidegate serve: {project} (SIGTERM or Ctrl-C stops)");
        serve(&ws, store, lake, actor, options, stop, &mut print_event).await
    })?;
    info!("tidegate serve: stopped cleanly");
    Ok(ExitCode::SUCCESS)
}

fn print_event(event: Event) {
    match event {
        Event::Started { at, run_id } => info!(%at, run_id, "tick: started run {run_id}"),
        Event::Superseded { at, interval: s } => info!(
            %at, task = s.task, partition = s.partition, by_run = s.by_run,
            "tick: {}@{} superseded by run {}", s.task, s.partition, s.by_run
        ),
        Event::Debt { at, task, n_intervals } => {
            info!(%at, task, n_intervals, "tick: {task} has {n_intervals} missed intervals as debt (catch-up off)");
        }
        Event::StandingBy => info!("another scheduler holds the role on this store: standing by"),
        Event::Active => info!("this scheduler holds the role"),
        Event::SteppedDown => info!("another scheduler took the role while this one was not renewing it: stepped down"),
        Event::Drained(s) => info!(
            published = s.published,
            failed = s.failed,
            skipped = s.skipped,
            retried = s.retried,
            "drained: {} published, {} failed, {} skipped, {} retries",
            s.published,
            s.failed,
            s.skipped,
            s.retried
        ),
    }
}

/// A flag set when SIGTERM or Ctrl-C arrives (saying `note` on stderr); call within a runtime.
pub fn stop_on_signal(note: &'static str) -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("{note}");
        flag.store(true, Ordering::SeqCst);
    });
    Ok(stop)
}
