//! `tidegate-bench overview`: what the web UI's overview grid costs the server (issue 33: 20
//! datasets x 365 partitions with 100,000 steps in the store, p99 under 50 ms).
//!
//! The store: 20 daily datasets over 2024 (every other one reading the one before, so staleness
//! has inputs to judge), each of their 7,300 partitions built and published by a real run in
//! this process (one-row SQL tasks, a folder lake), then runs of every partition again whose steps
//! were skipped until the store holds `--steps` steps (the newest-step query must pass over
//! them), and one last run left ready (queued cells).
//!
//! Measured, each the application operation as `GET /api/grid` calls it: the grid's first 90
//! columns (what the page asks for), and all 365. Baseline in the same run: `status::debt` (what
//! `GET /api/debt` and the operations screen compute over the same store).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use serde_json::{Value, json};
use tidegate_app::actor::os_account;
use tidegate_app::overview::{GridQuery, grid};
use tidegate_app::target::{Partitions, Target};
use tidegate_app::workspace::{self as ws_mod, Workspace};
use tidegate_app::{status, submit};
use tidegate_store::{Priority, Store, Trigger};

use crate::{Samples, Scratch, command_line, load_average, machine, now_text, progress, round};

/// Datasets (and tasks).
const DATASETS: usize = 20;
/// Days of 2024 per dataset.
const DAYS: usize = 365;
/// Who the benchmark's journal entries name.
const ACTOR: &str = "bench-overview";

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate-bench overview\n  tidegate-bench overview --repeats 200 --json")]
pub struct OverviewArgs {
    /// Steps in the store (at least 20 x 365: every partition built once).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub steps: usize,
    /// Answers per measurement (the median and p99 are reported).
    #[arg(long, default_value_t = 100, value_name = "N")]
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
    /// Measure over the store a kept earlier run left in DIR instead of building one.
    #[arg(long, value_name = "DIR")]
    pub reuse: Option<std::path::PathBuf>,
}

pub fn run(args: OverviewArgs) -> Result<std::process::ExitCode> {
    ensure!(args.steps >= DATASETS * DAYS && args.repeats >= 1, "--steps must be at least {}", DATASETS * DAYS);
    let scratch;
    let (ws, store) = match &args.reuse {
        Some(dir) => {
            let ws = ws_mod::load(Some(dir))?;
            let store = ws.open_store()?;
            (ws, store)
        }
        None => {
            scratch = Scratch::new(args.keep)?;
            prepare(&scratch.path, &args)?
        }
    };
    let counts = store.step_counts()?;
    progress(&format!("store ready ({counts:?}); answering"));
    let actor = os_account();
    let time = |f: &dyn Fn() -> Result<()>| -> Result<Samples> {
        let mut samples = Vec::with_capacity(args.repeats);
        for _ in 0..args.repeats {
            let started = Instant::now();
            f()?;
            samples.push(started.elapsed().as_secs_f64());
        }
        Ok(Samples(samples))
    };
    let cells = |columns: u32| -> Result<usize> {
        let q = GridQuery { columns: Some(columns), ..GridQuery::default() };
        let g = grid(&ws, store.as_ref(), &actor, &q, ws.now())?;
        Ok(g.rows.iter().map(|r| r.cells.len()).sum())
    };
    let (n90, n365) = (cells(90)?, cells(365)?);
    ensure!(n365 == DATASETS * DAYS, "the grid answered {n365} cells, not {}", DATASETS * DAYS);
    // The first answer of a store no one asked before (a server just started, or a dataset
    // whose releases moved since it was last asked): what the store's memo of visible builds
    // does not save. Each repeat on a store opened beforehand, outside the timing.
    let fresh_stores: Vec<Arc<dyn Store>> = (0..args.repeats).map(|_| ws.open_store()).collect::<Result<_>>()?;
    let mut fresh = Vec::with_capacity(args.repeats);
    for s in &fresh_stores {
        let q = GridQuery { columns: Some(90), ..GridQuery::default() };
        let started = Instant::now();
        grid(&ws, s.as_ref(), &actor, &q, ws.now())?;
        fresh.push(started.elapsed().as_secs_f64());
    }
    drop(fresh_stores);
    let fresh = Samples(fresh);
    let page = time(&|| cells(90).map(drop))?;
    let whole = time(&|| cells(365).map(drop))?;
    let debt = time(&|| status::debt(&ws, store.as_ref(), &actor, ws.now()).map(drop))?;
    // Where the grid's time goes: its parts, each alone.
    let tasks: Vec<String> = ws.spec.tasks.keys().cloned().collect();
    let datasets: Vec<String> = ws.spec.datasets.keys().cloned().collect();
    let newest = time(&|| tasks.iter().try_for_each(|t| store.newest_steps(t, None).map(drop).map_err(Into::into)))?;
    let published =
        time(&|| datasets.iter().try_for_each(|d| store.published_partitions(d).map(drop).map_err(Into::into)))?;
    let stale = time(&|| tidegate_app::stale::stale(&ws, store.as_ref(), &actor, None).map(drop))?;
    let decide = time(&|| tidegate_app::schedule::decide(&ws.spec, store.as_ref(), ws.now()).map(drop))?;
    let report = json!({
        "benchmark": "overview",
        "command": command_line(),
        "at": now_text(),
        "machine": machine(),
        "load_average": load_average(),
        "store": if args.state.is_some() { "postgres" } else { "sqlite" },
        "n_steps": args.steps,
        "datasets": DATASETS,
        "partitions": DAYS,
        "grid_90_columns": stats(&page, n90),
        "grid_365_columns": stats(&whole, n365),
        "grid_90_columns_first_answer": stats(&fresh, n90),
        "baseline_status_debt": stats(&debt, 0),
        "parts": {
            "newest_steps_per_task": stats(&newest, 0),
            "published_partitions_per_dataset": stats(&published, 0),
            "stale": stats(&stale, 0),
            "schedule_decide": stats(&decide, 0),
        },
    });
    print(&report, args.json);
    Ok(std::process::ExitCode::SUCCESS)
}

fn stats(s: &Samples, cells: usize) -> Value {
    let mut v = s.0.clone();
    v.sort_by(f64::total_cmp);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss, reason = "a rank")]
    let p99 = v.get(((v.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
    json!({ "cells": cells, "median_s": round(s.median()), "p99_s": round(p99), "max_s": round(s.max()) })
}

fn print(report: &Value, as_json: bool) {
    if as_json {
        println!("{report}");
        return;
    }
    let ms = |v: &Value| v.as_f64().map_or_else(|| "?".to_owned(), |s| format!("{:.1} ms", s * 1000.0));
    println!(
        "overview: {} datasets x {} partitions, {} steps ({})",
        report["datasets"], report["partitions"], report["n_steps"], report["store"]
    );
    for (name, key) in [
        ("grid, 90 columns", "grid_90_columns"),
        ("grid, 365 columns", "grid_365_columns"),
        ("grid, 90, first answer", "grid_90_columns_first_answer"),
        ("baseline status::debt", "baseline_status_debt"),
    ] {
        let r = &report[key];
        println!(
            "  {name:<24} median {:>9}  p99 {:>9}  max {:>9}",
            ms(&r["median_s"]),
            ms(&r["p99_s"]),
            ms(&r["max_s"])
        );
    }
}

fn spec(state: Option<&str>) -> String {
    let mut text = format!(
        "[project]\nname = \"bench_overview\"\n{}\n",
        state.map(|url| format!("state = \"{url}\"\n")).unwrap_or_default()
    );
    for i in 0..DATASETS {
        text.push_str(&format!(
            "[datasets.d{i:02}]\npartitioning = {{ grain = \"day\", start = \"2024-01-01\" }}\nwrite = {{ mode = \"replace\" }}\n\n"
        ));
        let (sql, inputs) = if i % 2 == 1 {
            (format!("SELECT COUNT(*) AS n FROM d{:02}", i - 1), format!("inputs = [\"d{:02}\"]\n", i - 1))
        } else {
            ("SELECT 1 AS n".to_owned(), String::new())
        };
        text.push_str(&format!("[tasks.t{i:02}]\nsql = \"{sql}\"\n{inputs}outputs = [\"d{i:02}\"]\n\n"));
    }
    text
}

/// The workspace and its store: every partition published once, then skipped runs up to
/// `--steps`, then one run left ready.
fn prepare(dir: &Path, args: &OverviewArgs) -> Result<(Workspace, Arc<dyn Store>)> {
    std::fs::write(dir.join(ws_mod::SPEC_FILE), spec(args.state.as_deref()))?;
    let ws = ws_mod::load(Some(dir))?;
    let store = ws.open_store()?;
    let actor = os_account();
    let (from, to) = ("2024-01-01".to_owned(), "2024-12-30".to_owned());
    progress("building and publishing every partition once");
    for i in 0..DATASETS {
        let target = Target {
            target: format!("t{i:02}"),
            partitions: Partitions::Range { from: from.clone(), to: to.clone() },
            only: true,
            downstream: false,
        };
        let request =
            submit::SubmitRequest { target, idempotency_key: None, trigger: Trigger::Manual, priority: Priority::Live };
        let submitted = submit::submit(&ws, store.as_ref(), &actor, &request)?;
        let summary = tidegate_app::run::execute(
            &ws,
            store.clone(),
            &actor,
            2,
            None,
            tidegate_app::run::Scope::Run(&submitted.run.id),
        )?;
        ensure!(summary.failed == 0, "building t{i:02} failed: {summary:?}");
    }
    let mut n_steps = DATASETS * DAYS;
    progress(&format!("{n_steps} steps published; adding skipped runs"));
    let mut round = 0;
    while n_steps + DATASETS * DAYS <= args.steps {
        for i in 0..DATASETS {
            crate::fill::planned_run(&ws, store.as_ref(), ACTOR, &format!("t{i:02}"), (&from, &to), true)?;
        }
        n_steps += DATASETS * DAYS;
        round += 1;
        if round % 3 == 0 {
            progress(&format!("{n_steps} steps"));
        }
    }
    crate::fill::planned_run(&ws, store.as_ref(), ACTOR, "t00", ("2024-12-01", "2024-12-30"), false)?;
    Ok((ws, store))
}
