//! `tidegate-bench monitor`: what one `/metrics` scrape costs on a store with many steps
//! (decision 0011). The store holds `--steps` steps in runs of 1,000: every run but the last
//! finished (its steps skipped, one journal entry each), the last one's steps ready, so the
//! queue query has a thousand steps to count. One scheduled task makes the scrape decide its
//! debt and freshness over the lake.
//!
//! Measured, each the application layer's `Monitor::snapshot` as the server calls it: the first
//! scrape (it opens the lake and reads the journal's warm-up window), a scrape with nothing new,
//! and a scrape after a run of 1,000 more steps was planned and skipped (about 2,000 new journal
//! entries to read). Baseline: `status::debt` (what `GET /api/debt` and `tidegate status`
//! compute), in the same run.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use chrono::{Duration, TimeZone as _, Utc};
use serde_json::{Value, json};
use tidegate_app::actor::os_account;
use tidegate_app::monitor::Monitor;
use tidegate_app::status;
use tidegate_app::workspace::{self as ws_mod, Workspace};
use tidegate_store::Store;

use crate::{Samples, Scratch, command_line, load_average, machine, now_text, progress, round};

/// Steps per run.
const RUN_STEPS: usize = 1_000;
/// Who the benchmark's journal entries name.
const ACTOR: &str = "bench-monitor";

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate-bench monitor\n  tidegate-bench monitor --steps 1000000 --repeats 5 --json"
)]
pub struct MonitorArgs {
    /// Steps in the store (in runs of 1,000; the last run's steps are ready, the others skipped).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub steps: usize,
    /// Scrapes per measurement (the median is reported).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub repeats: usize,
    /// A PostgreSQL URL for the store instead of SQLite (its schema must be empty).
    #[arg(long, value_name = "URL")]
    pub state: Option<String>,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Keep the temp folder (its path is printed) instead of removing it.
    #[arg(long)]
    pub keep: bool,
}

pub fn run(args: MonitorArgs) -> Result<std::process::ExitCode> {
    ensure!(args.steps >= RUN_STEPS && args.repeats >= 1, "--steps must be at least {RUN_STEPS}, --repeats at least 1");
    let scratch = Scratch::new(args.keep)?;
    let (ws, store) = prepare(&scratch.path, &args)?;
    let n_entries = store.journal_head()?.map_or(0, |h| h.seq);
    progress(&format!("{} steps, {n_entries} journal entries; scraping", args.steps));
    let monitor = Monitor::default();
    let actor = os_account();
    let scrape = || -> Result<f64> {
        let started = Instant::now();
        monitor.snapshot(&ws, store.as_ref(), &actor, ws.now())?;
        Ok(started.elapsed().as_secs_f64())
    };
    let first = scrape()?;
    let steady = Samples((0..args.repeats).map(|_| scrape()).collect::<Result<_>>()?);
    let mut after_run = Samples::default();
    for i in 0..args.repeats {
        add_run(&ws, store.as_ref(), args.steps + i * RUN_STEPS, true)?;
        after_run.0.push(scrape()?);
    }
    let debt = Samples(
        (0..args.repeats)
            .map(|_| {
                let started = Instant::now();
                status::debt(&ws, store.as_ref(), &actor, ws.now())?;
                Ok(started.elapsed().as_secs_f64())
            })
            .collect::<Result<_>>()?,
    );
    let report = json!({
        "benchmark": "monitor",
        "command": command_line(),
        "at": now_text(),
        "machine": machine(),
        "load_average": load_average(),
        "store": if args.state.is_some() { "postgres" } else { "sqlite" },
        "n_steps": args.steps,
        "n_journal_entries": n_entries,
        "first_scrape_s": round(first),
        "scrape_nothing_new": steady.json(),
        "scrape_after_1000_steps_planned_and_skipped": after_run.json(),
        "baseline_status_debt": debt.json(),
    });
    print(&report, args.json);
    Ok(std::process::ExitCode::SUCCESS)
}

fn print(report: &Value, as_json: bool) {
    if as_json {
        println!("{report}");
        return;
    }
    let ms = |v: &Value| v.as_f64().map_or_else(|| "?".to_owned(), |s| format!("{:.1} ms", s * 1000.0));
    println!(
        "monitor: {} steps, {} journal entries ({})",
        report["n_steps"], report["n_journal_entries"], report["store"]
    );
    println!("  first scrape                     {}", ms(&report["first_scrape_s"]));
    println!("  scrape, nothing new (median)     {}", ms(&report["scrape_nothing_new"]["median_s"]));
    println!(
        "  scrape after 1,000 steps (median) {}",
        ms(&report["scrape_after_1000_steps_planned_and_skipped"]["median_s"])
    );
    println!("  baseline status::debt (median)   {}", ms(&report["baseline_status_debt"]["median_s"]));
}

/// One hourly scheduled command task; the store holds `--steps` steps.
fn prepare(dir: &Path, args: &MonitorArgs) -> Result<(Workspace, Arc<dyn Store>)> {
    let state = args.state.as_ref().map(|url| format!("state = \"{url}\"\n")).unwrap_or_default();
    let spec = format!(
        "[project]\nname = \"bench_monitor\"\n{state}\n[datasets.out]\n\
         partitioning = {{ grain = \"hour\", start = \"2000-01-01T00:00:00Z\" }}\nwrite = {{ mode = \"replace\" }}\n\n\
         [tasks.noop]\ncommand = [\"/bin/true\"]\noutputs = [\"out\"]\nschedule = \"@hourly\"\n"
    );
    std::fs::write(dir.join(ws_mod::SPEC_FILE), spec)?;
    let ws = ws_mod::load(Some(dir))?;
    let store = ws.open_store()?;
    let n_runs = args.steps / RUN_STEPS;
    for i in 0..n_runs {
        add_run(&ws, store.as_ref(), i * RUN_STEPS, i + 1 < n_runs)?;
        if (i + 1) % 20 == 0 {
            progress(&format!("{} steps planned", (i + 1) * RUN_STEPS));
        }
    }
    Ok((ws, store))
}

/// Plans a run of [`RUN_STEPS`] hourly steps from hour `first`, then skips them all (`finish`)
/// or makes them ready.
fn add_run(ws: &Workspace, store: &dyn Store, first: usize, finish: bool) -> Result<()> {
    let start = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single().context("a valid instant")?;
    let hour = |i: usize| (start + Duration::hours(i64::try_from(i).unwrap_or(i64::MAX))).to_rfc3339();
    let (from, to) = (hour(first), hour(first + RUN_STEPS - 1));
    crate::fill::planned_run(ws, store, ACTOR, "noop", (&from, &to), finish)
}
