//! `tidegate init`: a small working example workspace with comments explaining each setting.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use crate::workspace::SPEC_FILE;

/// Create a workspace with a commented example pipeline.
///
/// Writes tidegate.toml (every setting explained), the example task's script under tasks/, and a
/// .gitignore for the local state. Refuses to overwrite an existing tidegate.toml.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate init my-pipeline\n  tidegate init .            # in the current folder\n  tidegate init demo --force  # overwrite an existing tidegate.toml"
)]
pub struct Args {
    /// Folder to create the workspace in (created if missing).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Overwrite an existing tidegate.toml and example files.
    #[arg(long)]
    force: bool,
}

/// The example's final task, suggested as the first thing to plan.
pub const EXAMPLE_TARGET: &str = "daily_stats";

/// The files an example workspace holds, relative to its root.
pub const FILES: &[(&str, &str)] = &[
    (SPEC_FILE, tidegate_core::spec::EXAMPLE),
    ("tasks/clean_events.py", include_str!("../../assets/clean_events.py")),
    (".gitignore", "# Local state and tables written by tidegate.\n.tidegate/\n"),
];

pub fn run(args: Args) -> Result<ExitCode> {
    write_example(&args.dir, args.force)?;
    let shown = args.dir.display();
    println!("Created a Tidegate workspace in {shown}");
    for (path, _) in FILES {
        println!("  {path}");
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

/// Writes the example workspace into `dir`.
pub fn write_example(dir: &Path, force: bool) -> Result<()> {
    let spec_path = dir.join(SPEC_FILE);
    if spec_path.exists() && !force {
        bail!("{} already exists; pass --force to overwrite it", spec_path.display());
    }
    for (rel, content) in FILES {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suggested_target_is_a_task_of_the_example() {
        let spec = tidegate_core::spec::parse("tidegate.toml", tidegate_core::spec::EXAMPLE).expect("example parses");
        assert!(spec.tasks.contains_key(EXAMPLE_TARGET));
    }
}
