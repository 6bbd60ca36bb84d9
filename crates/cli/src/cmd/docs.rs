//! `tidegate completions` and `tidegate man`: shell completion scripts and man pages generated
//! from the command line's own definition (`clap_complete`, `clap_mangen`), so they never drift
//! from `--help`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

/// Print a shell completion script for tidegate.
///
/// Load it in the current shell, or install it where your shell looks for completions.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  source <(tidegate completions bash)\n  tidegate completions bash > ~/.local/share/bash-completion/completions/tidegate\n  tidegate completions zsh > ~/.zfunc/_tidegate      # with fpath+=~/.zfunc in .zshrc\n  tidegate completions fish > ~/.config/fish/completions/tidegate.fish"
)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    pub shell: clap_complete::Shell,
}

/// Print tidegate's man page, or write one page per command to a folder.
///
/// Without --out-dir, prints tidegate(1) in roff on stdout: view it with `man -l -`. With it,
/// writes tidegate.1 and a page for every command (tidegate-run.1, tidegate-backfill-plan.1, ...).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate man | man -l -\n  tidegate man --out-dir /usr/local/share/man/man1 && man tidegate-backfill-plan"
)]
pub struct ManArgs {
    /// Write a page per command into this folder (created if missing) instead of printing one.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// Prints the completion script of `command` for the chosen shell.
pub fn completions(mut command: clap::Command, args: &CompletionsArgs) -> Result<ExitCode> {
    let name = command.get_name().to_owned();
    clap_complete::generate(args.shell, &mut command, name, &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

/// Prints `command`'s man page, or writes a page per command into `--out-dir`.
pub fn man(command: clap::Command, args: &ManArgs) -> Result<ExitCode> {
    match &args.out_dir {
        None => {
            clap_mangen::Man::new(command).render(&mut std::io::stdout()).context("printing the man page")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(command, dir)
                .with_context(|| format!("writing the man pages into {}", dir.display()))?;
            println!("Wrote the man pages into {}", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
