//! `tidegate completions` and `tidegate man`: shell completion scripts, man pages and the
//! Markdown reference (docs/cli.md) generated from the command line's own definition
//! (`clap_complete`, `clap_mangen`, `markdown`), so they never drift from `--help`.

mod markdown;

use std::io::Write;
use std::path::{Path, PathBuf};
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
/// With --markdown, prints the reference of every command in Markdown instead (docs/cli.md).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate man | man -l -\n  tidegate man --out-dir /usr/local/share/man/man1 && man tidegate-backfill-plan\n  tidegate man --markdown > docs/cli.md      # the reference, from the workspace's root"
)]
pub struct ManArgs {
    /// Write a page per command into this folder (created if missing) instead of printing one.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,

    /// Print every command's reference as one Markdown page (the one checked in as docs/cli.md).
    #[arg(long, conflicts_with = "out_dir")]
    pub markdown: bool,
}

/// Prints the completion script of `command` for the chosen shell. The script is made whole
/// first: `clap_complete` panics on a failed write, and a reader may stop early
/// (`tidegate completions zsh | head`), which ends the output quietly (`output::Stdout`).
pub fn completions(mut command: clap::Command, args: &CompletionsArgs) -> Result<ExitCode> {
    let name = command.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, name, &mut script);
    let mut stdout = crate::output::Stdout;
    stdout.write_all(&script).and_then(|()| stdout.flush()).context("printing the completion script")?;
    Ok(ExitCode::SUCCESS)
}

/// Prints `command`'s man page, or writes a page per command into `--out-dir`, or prints the
/// Markdown reference (`--markdown`).
pub fn man(command: clap::Command, args: &ManArgs) -> Result<ExitCode> {
    let mut command = command.disable_help_subcommand(true);
    command.build();
    match &args.out_dir {
        None if args.markdown => {
            let mut stdout = crate::output::Stdout;
            let page = markdown::reference(&command);
            stdout.write_all(page.as_bytes()).and_then(|()| stdout.flush()).context("printing the reference")?;
        }
        None => {
            let mut stdout = crate::output::Stdout;
            page(&command, &mut stdout).and_then(|()| stdout.flush()).context("printing the man page")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            write_pages(&command, dir)?;
            println!("Wrote the man pages into {}", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `command` and of every command under it into `dir`.
fn write_pages(command: &clap::Command, dir: &Path) -> Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    let path = dir.join(clap_mangen::Man::new(command.clone()).get_filename());
    let mut file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    page(command, &mut file).with_context(|| format!("writing {}", path.display()))
}

/// One man page: clap_mangen's sections, with the examples of `--help` (its after-help text) as
/// a section of their own whose lines are kept as written (a command is not reflowed).
fn page(command: &clap::Command, w: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(command.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if command.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if command.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(w)?;
    }
    if let Some(after) = command.get_after_help() {
        let after = after.to_string();
        let (title, body) = after.split_once('\n').unwrap_or(("EXAMPLES", after.as_str()));
        let mut roff = roff::Roff::new();
        roff.control("SH", [title.trim_end_matches(':').to_uppercase().as_str()]).control("nf", []);
        for line in body.lines() {
            roff.text([roff::roman(line)]);
        }
        roff.control("fi", []);
        roff.to_writer(w)?;
    }
    if command.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}
