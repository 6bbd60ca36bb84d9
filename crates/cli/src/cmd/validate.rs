//! `tidegate validate`: parse and check tidegate.toml, reporting every problem at once.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde::Serialize;
use tidegate_core::spec::{self, DatasetKind};

use crate::output;
use tidegate_app::workspace::{self, SPEC_FILE};

/// Check tidegate.toml and report every problem, each with file:line:col and the setting.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate validate\n  tidegate validate --json | jq '.errors[].setting'\n  tidegate -C path/to/workspace validate"
)]
pub struct Args {
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    file: String,
    valid: bool,
    spec_hash: Option<&'a str>,
    n_datasets: usize,
    n_external: usize,
    n_tasks: usize,
    n_pools: usize,
    errors: &'a [spec::Diagnostic],
}

pub fn run(ws: Option<&Path>, args: Args) -> Result<ExitCode> {
    let root = workspace::find_root(ws)?;
    let path = root.join(SPEC_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let file = workspace::display_name(&path);
    match spec::parse(&file, &text) {
        Ok(spec) => {
            let n_external = spec.datasets.values().filter(|d| matches!(d.kind, DatasetKind::External { .. })).count();
            let report = Report {
                file: file.clone(),
                valid: true,
                spec_hash: Some(&spec.hash),
                n_datasets: spec.datasets.len() - n_external,
                n_external,
                n_tasks: spec.tasks.len(),
                n_pools: spec.pools.len(),
                errors: &[],
            };
            if args.json {
                output::json(&report)?;
            } else {
                println!(
                    "{file} is valid: {} datasets, {} external, {} tasks, {} pools (spec hash {})",
                    report.n_datasets,
                    n_external,
                    report.n_tasks,
                    report.n_pools,
                    &spec.hash[..12]
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(diags) => {
            if args.json {
                let report = Report {
                    file,
                    valid: false,
                    spec_hash: None,
                    n_datasets: 0,
                    n_external: 0,
                    n_tasks: 0,
                    n_pools: 0,
                    errors: &diags.0,
                };
                output::json(&report)?;
            } else {
                eprintln!("{diags}");
                let n = diags.0.len();
                eprintln!("\n{n} error{} in {file}", if n == 1 { "" } else { "s" });
            }
            Ok(ExitCode::from(1))
        }
    }
}
