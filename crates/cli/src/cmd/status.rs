//! `tidegate status` (`tidegate_app::status`): the recent runs and their steps, and what the
//! workspace owes, for people or scripts.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::human::{count, duration};
use tidegate_app::status::{Debt, Status};
use tidegate_app::view::{self, MAX_GROUPS};
use tidegate_core::actor::Actor;

use crate::output;

/// Show recent runs with their step counts by status.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate status\n  tidegate status --limit 50 --json")]
pub struct Args {
    /// How many recent runs to show.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true)]
    pub limit: u32,
    /// Print the status as JSON.
    #[arg(long)]
    pub json: bool,
    /// Judge schedule debt and freshness at this instant (RFC 3339 or a date); default now.
    #[arg(long)]
    pub now: Option<String>,
}

/// List published partitions built from inputs or code that changed since (an input republished,
/// rebuilt by a backfill or rolled back; the task's command, SQL or files edited): they are stale
/// until rebuilt, with `tidegate run TARGET --stale` (inputs) or a backfill with `--reprocess
/// stale` (code: history changes only under review).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate stale\n  tidegate stale user_features --json")]
pub struct StaleArgs {
    /// Only this dataset.
    pub dataset: Option<String>,
    /// Print the stale partitions as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn stale(ws: Option<&Path>, actor: &Actor, args: StaleArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    if let Some(d) = &args.dataset
        && !ws.spec.datasets.contains_key(d)
    {
        anyhow::bail!("no dataset {d:?} in {}", ws.spec.file);
    }
    let stale = tidegate_app::stale::stale(&ws, store.as_ref(), actor, args.dataset.as_deref())?;
    output::emit(args.json, &stale, |stale| {
        if stale.is_empty() {
            println!("Nothing is stale: every published partition was built from the inputs visible now.");
            return;
        }
        for s in stale {
            say!("{}:{} (built by {}, step {}) is stale:", s.dataset, s.partition, s.task, s.built_by_step);
            for r in &s.reasons {
                say!("  {r}");
            }
        }
        let mut tasks: Vec<&str> = stale.iter().map(|s| s.task.as_str()).collect();
        tasks.dedup();
        say!("Rebuild with `tidegate run {} --stale`.", tasks.join(" / "));
    })
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let now = crate::cmd::now(&ws, args.now.as_deref())?;
    let status = tidegate_app::status::status(&ws, store.as_ref(), actor, args.limit, now)?;
    output::emit(args.json, &status, print_status)
}

/// The status for people: the debt, then the recent runs.
pub(crate) fn print_status(status: &Status) {
    say!("Project {} (state: {})", status.project, status.state);
    print_debt(&status.debt);
    if status.runs.is_empty() {
        println!("\nNo runs yet. Create one with `tidegate run TARGET --from A --to B`.");
        return;
    }
    // Four columns fit 100: the id whole (it is what `history` and `logs` take), the time, the
    // status over its trigger, and what the run covers over its steps, wrapped at spaces.
    println!();
    let header = ["RUN", "CREATED (UTC)", "STATUS", "TARGET, PARTITIONS AND STEPS"];
    output::print_table(&header, &[0, 1, 2], &status.runs, |r| {
        let steps = r.steps.iter().map(|(s, n)| format!("{n} {s}")).collect::<Vec<_>>().join(", ");
        let request = &r.run.request;
        vec![
            r.run.id.clone(),
            r.run.created_at.format("%Y-%m-%d %H:%M").to_string(),
            format!("{}\n{}", r.run.status, format!("{:?}", request.trigger).to_lowercase()),
            // Several tasks (a tick's run) wrap at their commas.
            format!("{} {}\n{steps}", request.target.replace(',', ", "), view::requested(&request.partitions, 2)),
        ]
    });
}

fn print_debt(debt: &Debt) {
    if let Some(g) = &debt.scheduler {
        let num = |k: &str| g[k].as_f64();
        let when = if g["stale"].as_bool() == Some(true) {
            // A scheduler writes its gauge while it drains; an idle `serve` waits without writing.
            format!("as of its last drain, {} ago", duration(num("age_s").unwrap_or_default()))
        } else {
            "live".to_owned()
        };
        let eta = num("backlog_eta_s").map(|e| format!(", ETA {}", duration(e))).unwrap_or_default();
        let pace = num("throughput_per_s").map(|r| format!(", {r:.1} steps/s")).unwrap_or_default();
        println!("Scheduler ({when}): backlog {}{pace}{eta}", g["backlog"]);
        if let Some(pools) = g["pools"].as_object() {
            for (name, p) in pools {
                let slots = p["slots"].as_u64().map_or_else(|| p["slots"].to_string(), |n| count(n, "slot", "slots"));
                println!(
                    "Pool {name}: {slots}; retry budget left {} of {}",
                    p["retry_budget_left"], p["retry_budget_burst"]
                );
            }
        }
        let workers = g["workers"].as_array().map_or(0, Vec::len);
        if workers > 0 {
            println!("Workers: {workers} live");
        }
    }
    for (class, q) in &debt.queues {
        let age = q.oldest_ready_age_s.map(|a| format!(", oldest waiting {}", duration(a))).unwrap_or_default();
        println!("Queue {class}: {} ready, {} running{age}", q.ready, q.running);
    }
    for p in &debt.paused {
        say!("Paused {}", crate::cmd::pause::pause_line(p));
    }
    for s in &debt.stale {
        say!(
            "Stale {}: {} built on inputs that changed since, from {} (`tidegate stale {}`)",
            s.dataset,
            count(s.partitions, "partition", "partitions"),
            s.first,
            s.dataset
        );
    }
    for w in &debt.waiting_for_source {
        say!(
            "Waiting for source {}: {} of {}, the longest {} (since partition {})",
            w.sources.join(", "),
            count(w.steps, "step", "steps"),
            w.task,
            duration(w.longest_s),
            w.oldest_partition
        );
    }
    for d in &debt.missed {
        let first = d.oldest.as_deref().or(d.debt.first().map(String::as_str)).unwrap_or("-");
        let last = d.debt.last().map_or("-", String::as_str);
        let newest = if d.n_missed > d.debt.len() as u64 { "newest " } else { "" };
        say!("Debt {}: {} missed intervals not run: {newest}{}", d.task, d.n_missed, view::keys(&d.debt, MAX_GROUPS));
        say!("  run them with `tidegate run {} --from {first} --to {last}`", d.task);
    }
}
