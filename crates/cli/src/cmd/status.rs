//! `tidegate status`: the recent runs and their steps, for people or scripts.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;
use tidegate_store::RunRecord;

use crate::output;
use crate::workspace;

/// Show recent runs with their step counts by status.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate status\n  tidegate status --limit 50 --json")]
pub struct Args {
    /// How many recent runs to show.
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
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
    let status = Status { project: ws.spec.project.name.clone(), state: workspace::redact(&ws.state_url()), runs };
    if args.json {
        output::json(&status)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("Project {} (state: {})", status.project, status.state);
    if status.runs.is_empty() {
        println!("\nNo runs yet. Create one with `tidegate submit TARGET --from A --to B`.");
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
