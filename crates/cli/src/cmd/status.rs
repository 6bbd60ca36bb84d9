//! `tidegate status`: the recent runs and their steps, for people or scripts.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use chrono::Utc;
use serde::Serialize;
use tidegate_core::plan;
use tidegate_core::state::StepStatus;
use tidegate_store::RunRecord;

use crate::cmd::data::{open_lake, runtime};
use crate::cmd::tick;
use crate::output;
use tidegate_app::workspace::{self, Workspace};

/// Show recent runs with their step counts by status.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate status\n  tidegate status --limit 50 --json")]
pub struct Args {
    /// How many recent runs to show.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true)]
    limit: u32,
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
    /// Judge schedule debt and freshness at this instant (RFC 3339 or a date); default now.
    #[arg(long)]
    now: Option<String>,
}

#[derive(Serialize)]
struct RunStatusLine {
    #[serde(flatten)]
    run: RunRecord,
    steps: BTreeMap<String, u32>,
}

#[derive(Serialize)]
struct Status {
    project: String,
    state: String,
    runs: Vec<RunStatusLine>,
    debt: Debt,
}

/// What is owed: queued work per priority class, missed schedule intervals, and how stale each
/// scheduled dataset is.
#[derive(Serialize, Default)]
struct Debt {
    /// Per priority class (live, catchup, backfill): steps ready and running, and how long the
    /// oldest ready step has waited.
    queues: BTreeMap<String, Queue>,
    /// Per scheduled task: intervals that ended and were not run (catch-up off leaves them here).
    missed: Vec<Missed>,
    /// Per scheduled task's dataset: the newest published partition and how far behind now its
    /// end is.
    freshness: Vec<Freshness>,
    /// The scheduler's last gauge (pools with their retry budget left, backlog, throughput,
    /// backlog ETA, live workers), with its age; absent before any scheduler ran.
    scheduler: Option<serde_json::Value>,
}

/// A gauge older than this is from a scheduler that is no longer running.
const GAUGE_STALE_S: f64 = 10.0;

#[derive(Serialize)]
struct Missed {
    task: String,
    /// Missed intervals, oldest first: gaps between published partitions, then the due intervals
    /// a tick would leave as debt.
    debt: Vec<String>,
    /// The interval the next tick would run.
    next: Option<String>,
}

#[derive(Serialize, Default)]
struct Queue {
    ready: usize,
    running: usize,
    oldest_ready_age_s: Option<f64>,
}

#[derive(Serialize)]
struct Freshness {
    task: String,
    newest_published: Option<String>,
    lag_s: Option<f64>,
}

pub fn run(ws: Option<&Path>, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let mut runs = Vec::new();
    for run in store.runs(args.limit)? {
        let mut steps = BTreeMap::new();
        for s in store.steps(&run.id)? {
            *steps.entry(s.status().to_string()).or_insert(0) += 1;
        }
        runs.push(RunStatusLine { run, steps });
    }
    let now = match &args.now {
        Some(text) => tick::parse_instant(text)?,
        None => Utc::now(),
    };
    let debt = debt(&ws, store.as_ref(), now)?;
    let status =
        Status { project: ws.spec.project.name.clone(), state: workspace::redact(&ws.state_url()), runs, debt };
    if args.json {
        output::json(&status)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("Project {} (state: {})", status.project, status.state);
    print_debt(&status.debt);
    if status.runs.is_empty() {
        println!("\nNo runs yet. Create one with `tidegate run TARGET --from A --to B`.");
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = status
        .runs
        .iter()
        .map(|r| {
            let steps = r.steps.iter().map(|(s, n)| format!("{n} {s}")).collect::<Vec<_>>().join(", ");
            vec![
                r.run.id.clone(),
                r.run.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                r.run.request.target.clone(),
                r.run.request.partitions.join(" "),
                format!("{:?}", r.run.request.trigger).to_lowercase(),
                r.run.status.to_string(),
                steps,
            ]
        })
        .collect();
    println!();
    print!("{}", output::table(&["RUN", "CREATED (UTC)", "TARGET", "PARTITIONS", "TRIGGER", "STATUS", "STEPS"], &rows));
    Ok(ExitCode::SUCCESS)
}

fn debt(ws: &Workspace, store: &dyn tidegate_store::Store, now: chrono::DateTime<Utc>) -> Result<Debt> {
    let mut queues: BTreeMap<String, Queue> = BTreeMap::new();
    for a in store.active_steps()? {
        let q = queues.entry(format!("{:?}", a.priority).to_lowercase()).or_default();
        match a.step.status() {
            StepStatus::Ready => {
                q.ready += 1;
                #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
                let age = (now - a.step.updated_at).num_milliseconds().max(0) as f64 / 1000.0;
                q.oldest_ready_age_s = Some(q.oldest_ready_age_s.map_or(age, |o| o.max(age)));
            }
            s if s.holds_lease() => q.running += 1,
            _ => {}
        }
    }
    let decisions = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        tidegate_app::schedule::decide(&ws.spec, &lake, now).await
    })?;
    let freshness = decisions
        .iter()
        .map(|d| {
            let task = &ws.spec.tasks[&d.task];
            let axis = task.outputs.first().and_then(|o| plan::axis_of(&ws.spec.datasets[o]));
            let end = d
                .newest_published
                .as_ref()
                .and_then(|k| axis.as_ref().and_then(|a| a.parse_key(k).ok().map(|t| a.shift(t, 1))));
            #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
            let lag_s = end.map(|e| (now - e).num_milliseconds().max(0) as f64 / 1000.0);
            Freshness { task: d.task.clone(), newest_published: d.newest_published.clone(), lag_s }
        })
        .collect();
    let missed = decisions
        .into_iter()
        .map(|d| Missed {
            task: d.task,
            debt: d.gaps.into_iter().chain(d.debt).collect(),
            next: d.run.first().cloned(),
        })
        .filter(|m| !m.debt.is_empty())
        .collect();
    let scheduler =
        store.metrics()?.into_iter().find(|(name, _, _)| name == tidegate_engine::executor::SCHEDULER_GAUGE).map(
            |(_, mut value, at)| {
                #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
                let age_s = (now - at).num_milliseconds().max(0) as f64 / 1000.0;
                if let Some(object) = value.as_object_mut() {
                    object.insert("updated_at".to_owned(), serde_json::json!(at));
                    object.insert("age_s".to_owned(), serde_json::json!(age_s));
                    object.insert("stale".to_owned(), serde_json::json!(age_s > GAUGE_STALE_S));
                }
                value
            },
        );
    Ok(Debt { queues, missed, freshness, scheduler })
}

fn print_debt(debt: &Debt) {
    if let Some(g) = &debt.scheduler {
        let num = |k: &str| g[k].as_f64();
        let when = if g["stale"].as_bool() == Some(true) {
            format!("as of {:.0} s ago; no scheduler is running now", num("age_s").unwrap_or_default())
        } else {
            "live".to_owned()
        };
        let eta = num("backlog_eta_s").map(|e| format!(", ETA {e:.0} s")).unwrap_or_default();
        let pace = num("throughput_per_s").map(|r| format!(", {r:.1} steps/s")).unwrap_or_default();
        println!("Scheduler ({when}): backlog {}{pace}{eta}", g["backlog"]);
        if let Some(pools) = g["pools"].as_object() {
            for (name, p) in pools {
                println!(
                    "Pool {name}: {} slots; retry budget left {} of {}",
                    p["slots"], p["retry_budget_left"], p["retry_budget_burst"]
                );
            }
        }
        let workers = g["workers"].as_array().map_or(0, Vec::len);
        if workers > 0 {
            println!("Workers: {workers} live");
        }
    }
    for (class, q) in &debt.queues {
        let age = q.oldest_ready_age_s.map(|a| format!(", oldest waiting {a:.0} s")).unwrap_or_default();
        println!("Queue {class}: {} ready, {} running{age}", q.ready, q.running);
    }
    for d in &debt.missed {
        println!(
            "Debt {}: {} missed intervals not run ({}); run them with `tidegate run {} --from {} --to {}`",
            d.task,
            d.debt.len(),
            d.debt.join(", "),
            d.task,
            d.debt.first().map_or("-", String::as_str),
            d.debt.last().map_or("-", String::as_str)
        );
    }
}
