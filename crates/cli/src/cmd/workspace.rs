//! `tidegate init` and `tidegate validate` (`tidegate_app::workspace`): a small working example
//! workspace with comments explaining each setting, and tidegate.toml parsed and checked, every
//! problem reported at once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::human::count;
use tidegate_app::workspace::{self, EXAMPLE_TARGET};

use crate::output;

/// Create a workspace with a commented example pipeline.
///
/// Writes tidegate.toml (every setting explained), the example task's script under tasks/, and a
/// .gitignore for the local state. Never overwrites a file: if tidegate.toml or the task script
/// exists, nothing is written and the command names them; an existing .gitignore is kept as it is.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate init my-pipeline\n  tidegate init .            # in the current folder")]
pub struct InitArgs {
    /// Folder to create the workspace in (created if missing).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Refused: init never overwrites a file. Move or delete the files it names instead.
    #[arg(long, hide = true)]
    force: bool,
}

pub fn init(args: InitArgs) -> Result<ExitCode> {
    let written = workspace::create(&args.dir, args.force)?;
    let shown = args.dir.display();
    println!("Created a Tidegate workspace in {shown}");
    for path in &written {
        println!("  {path}");
    }
    if !written.contains(&workspace::GITIGNORE) {
        println!(
            "  ({} exists and was left as it is; add `.tidegate/` to it to keep local state out of git)",
            workspace::GITIGNORE
        );
    }
    println!();
    println!("Next:");
    if args.dir != Path::new(".") {
        println!("  cd {shown}");
    }
    println!("  tidegate validate       # check the spec");
    println!("  tidegate plan {EXAMPLE_TARGET} --from 2024-01-01 --to 2024-01-07");
    println!("  tidegate run {EXAMPLE_TARGET} --from 2024-01-01 --to 2024-01-07   # stage, check, publish");
    println!("  tidegate sql \"SELECT * FROM {EXAMPLE_TARGET} ORDER BY day\"");
    println!("  tidegate history        # what was intended, what happened, what became visible");
    Ok(ExitCode::SUCCESS)
}

/// Check tidegate.toml and report every problem, each with file:line:col and the setting.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate validate\n  tidegate validate --json | jq '.errors[].setting'\n  tidegate -C path/to/workspace validate"
)]
pub struct ValidateArgs {
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub fn validate(ws: Option<&Path>, args: ValidateArgs) -> Result<ExitCode> {
    let report = workspace::validate(ws)?;
    output::emit(args.json, &report, |report| {
        if report.valid {
            println!(
                "{} is valid: {}, {} external, {}, {} (spec hash {})",
                report.file,
                count(report.n_datasets, "dataset", "datasets"),
                report.n_external,
                count(report.n_tasks, "task", "tasks"),
                count(report.n_pools, "pool", "pools"),
                report.spec_hash.as_deref().map_or("", |h| &h[..12])
            );
            for dataset in &report.free_rewrites {
                println!(
                    "  {dataset}: rewrites = \"free\": any run may replace its published partitions with the output \
                     of other code, without review (each replacement is journaled as free_rewrite)"
                );
            }
        } else {
            let n = report.errors.len();
            eprintln!("{}", tidegate_core::spec::Diagnostics(report.errors.clone()));
            eprintln!("\n{n} error{} in {}", if n == 1 { "" } else { "s" }, report.file);
        }
    })?;
    Ok(if report.valid { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
