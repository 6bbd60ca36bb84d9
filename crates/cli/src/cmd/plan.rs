//! `tidegate plan`: the steps a target and partition range expand to, with their dependencies.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Result, bail};
use tidegate_app::human::count;
use tidegate_app::submit::SubmitRequest;
use tidegate_app::target::{Partitions, Target};
use tidegate_app::view::{self, MAX_GROUPS};
use tidegate_app::{plan, workspace};
use tidegate_core::plan::{Plan, PlannedStep};
use tidegate_store::{Priority, Trigger};

use crate::output;

/// Show the steps a target expands to over a partition range, and what each waits for.
///
/// TARGET is a task, or a dataset standing for the task that writes it. Upstream tasks whose
/// partitions the target reads are planned too (unless --only); --downstream adds every task that
/// reads what the plan rebuilds. Ranges are inclusive: --from 2024-01-01 --to 2024-01-07 is 7 days.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate plan daily_stats --from 2024-01-01 --to 2024-01-07\n  tidegate plan events --partition 2024-01-03 --only\n  tidegate plan daily_stats --from 2024-01-01 --to 2024-01-03 --graph mermaid\n  tidegate plan daily_stats --from 2024-01-01 --to 2024-01-03 --json"
)]
pub struct Args {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Print the plan as JSON.
    #[arg(long, conflicts_with = "graph")]
    pub json: bool,
    /// Print the dependency graph in Graphviz dot or Mermaid syntax.
    #[arg(long, value_name = "FORMAT", value_parser = ["dot", "mermaid"])]
    pub graph: Option<String>,
}

/// The target and partition selection shared by `plan`, `submit` and `run`.
#[derive(Debug, clap::Args)]
pub struct TargetArgs {
    /// A task, or a dataset written by a task.
    pub target: String,
    /// First partition (a key such as 2024-01-05, a date, or an RFC 3339 instant).
    #[arg(long, requires = "to", conflicts_with_all = ["partition", "all"])]
    pub from: Option<String>,
    /// Last partition, included.
    #[arg(long, requires = "from")]
    pub to: Option<String>,
    /// One partition key; repeat for several.
    #[arg(long, short = 'p', conflicts_with = "all")]
    pub partition: Vec<String>,
    /// Every key of a statically partitioned target.
    #[arg(long)]
    pub all: bool,
    /// Plan only the target, not the upstream tasks it reads from.
    #[arg(long)]
    pub only: bool,
    /// Also plan every task downstream of what the plan rebuilds.
    #[arg(long)]
    pub downstream: bool,
}

impl TargetArgs {
    /// The target the flags describe.
    pub fn target(&self) -> Result<Target> {
        let partitions = match (&self.from, &self.to, self.partition.is_empty(), self.all) {
            (Some(from), Some(to), true, false) => Partitions::Range { from: from.clone(), to: to.clone() },
            (None, None, false, false) => Partitions::Keys(self.partition.clone()),
            (None, None, true, true) => Partitions::All,
            _ => bail!("say which partitions to plan: --from A --to B, --partition P (repeatable), or --all"),
        };
        Ok(Target { target: self.target.clone(), partitions, only: self.only, downstream: self.downstream })
    }

    /// A person's submission of the target (manual, live), retried safely under `idempotency_key`.
    pub fn submit_request(&self, idempotency_key: Option<String>) -> Result<SubmitRequest> {
        Ok(SubmitRequest {
            target: self.target()?,
            idempotency_key,
            trigger: Trigger::Manual,
            priority: Priority::Live,
        })
    }
}

pub fn run(ws: Option<&Path>, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let view = plan::plan(&ws, &args.target.target()?)?;
    match (args.json, args.graph.as_deref()) {
        (true, _) => output::json(&view)?,
        (false, Some("dot")) => print!("{}", plan::dot(&view.plan)),
        (false, Some(_)) => print!("{}", plan::mermaid(&view.plan)),
        (false, None) => print!("{}", text(&view.plan)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The most steps of one task, with consecutive partitions in one level, listed one a line;
/// more become one line for their range (`task@2024-01-01..2024-12-31 (366 partitions)`), so a
/// plan over a year reads in a few lines. `--json` and `--graph` list every step.
pub const STEPS_LISTED_MAX: usize = 7;

/// The plan for people: its levels, each step (or each long range of a task's steps) with what it
/// waits for, and the critical path.
pub fn text(plan: &Plan) -> String {
    let mut out = String::new();
    let n_tasks = plan.steps.iter().map(|s| s.task.as_str()).collect::<std::collections::BTreeSet<_>>().len();
    let _ = writeln!(
        out,
        "Plan for {}: {} over {}",
        plan.target,
        count(plan.steps.len(), "step", "steps"),
        count(n_tasks, "task", "tasks")
    );
    let widths = plan.level_widths();
    for (level, width) in widths.iter().enumerate() {
        let steps: Vec<&PlannedStep> = plan.steps.iter().filter(|s| s.level as usize == level).collect();
        let _ = writeln!(out, "\nlevel {level} ({} can run in parallel)", count(*width, "step", "steps"));
        for line in level_lines(&steps) {
            let _ = writeln!(out, "{}", output::wrap_indent(&format!("  {line}"), Some(6)));
        }
    }
    let path = plan.critical_path();
    let line = format!("critical path ({}): {}", count(path.len(), "step", "steps"), path.join(" -> "));
    let _ = writeln!(out, "\n{}", output::wrap(&line));
    out
}

/// The lines of one level: each task's steps in plan order, a run of more than
/// [`STEPS_LISTED_MAX`] consecutive partitions as one line, with what the steps wait for.
fn level_lines(steps: &[&PlannedStep]) -> Vec<String> {
    let mut tasks: Vec<(&str, Vec<&PlannedStep>)> = Vec::new();
    for s in steps {
        match tasks.iter_mut().find(|(t, _)| *t == s.task) {
            Some((_, of_task)) => of_task.push(s),
            None => tasks.push((&s.task, vec![s])),
        }
    }
    let mut lines = Vec::new();
    for (task, of_task) in tasks {
        let keys: Vec<String> = of_task.iter().map(|s| key_of(&s.name).to_owned()).collect();
        for run in view::consecutive(&keys) {
            let group = &of_task[run.clone()];
            if group.len() <= STEPS_LISTED_MAX {
                lines.extend(group.iter().map(|s| with_waits(s.name.clone(), &s.upstream)));
                continue;
            }
            let mut upstream: Vec<String> = Vec::new();
            for s in group {
                for u in &s.upstream {
                    if !upstream.contains(u) {
                        upstream.push(u.clone());
                    }
                }
            }
            let name = format!(
                "{task}@{}..{} ({})",
                keys[run.start],
                keys[run.end - 1],
                count(group.len(), "partition", "partitions")
            );
            lines.push(with_waits(name, &upstream));
        }
    }
    lines
}

/// `name`, and what it waits for when anything.
fn with_waits(name: String, upstream: &[String]) -> String {
    if upstream.is_empty() { name } else { format!("{name}  <- {}", view::steps(upstream, MAX_GROUPS)) }
}

/// The partition key of a step name (`task@key`).
fn key_of(name: &str) -> &str {
    name.split_once('@').map_or(name, |(_, key)| key)
}
