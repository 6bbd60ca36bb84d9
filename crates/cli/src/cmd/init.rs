//! `tidegate init`: a small working example workspace with comments explaining each setting.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::workspace;

/// Create a workspace with a commented example pipeline.
///
/// Writes tidegate.toml (every setting explained), the example task's script under tasks/, and a
/// .gitignore for the local state. Never overwrites a file: if tidegate.toml or the task script
/// exists, nothing is written and the command names them; an existing .gitignore is kept as it is.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate init my-pipeline\n  tidegate init .            # in the current folder")]
pub struct Args {
    /// Folder to create the workspace in (created if missing).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Refused: init never overwrites a file. Move or delete the files it names instead.
    #[arg(long, hide = true)]
    force: bool,
}

/// The example's final task, suggested as the first thing to plan.
pub const EXAMPLE_TARGET: &str = "daily_stats";

pub fn run(args: Args) -> Result<ExitCode> {
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

/// Writes the example workspace into `dir`; returns the files written. Writes nothing when any
/// file the example needs exists (named in the error), and never replaces a file: each is created
/// exclusively, so a file appearing meanwhile is an error too, not overwritten.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suggested_target_is_a_task_of_the_example() {
        let spec = tidegate_core::spec::parse("tidegate.toml", tidegate_core::spec::EXAMPLE).expect("example parses");
        assert!(spec.tasks.contains_key(EXAMPLE_TARGET));
    }
}
