//! `tidegate validate`: parse and check tidegate.toml, reporting every problem at once.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::workspace;

use crate::output;

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

pub fn run(ws: Option<&Path>, args: Args) -> Result<ExitCode> {
    let report = workspace::validate(ws)?;
    if args.json {
        output::json(&report)?;
    } else if report.valid {
        println!(
            "{} is valid: {} datasets, {} external, {} tasks, {} pools (spec hash {})",
            report.file,
            report.n_datasets,
            report.n_external,
            report.n_tasks,
            report.n_pools,
            report.spec_hash.as_deref().map_or("", |h| &h[..12])
        );
    } else {
        let n = report.errors.len();
        eprintln!("{}", tidegate_core::spec::Diagnostics(report.errors.clone()));
        eprintln!("\n{n} error{} in {}", if n == 1 { "" } else { "s" }, report.file);
    }
    Ok(if report.valid { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
