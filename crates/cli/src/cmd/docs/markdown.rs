//! The command reference in Markdown (`tidegate man --markdown`, checked in as docs/cli.md): every
//! command's name, description, usage, arguments and options with their help, and the examples of
//! its `--help`, rendered from the same clap definition as `--help` and the man pages, in the
//! order `--help` lists them, so the page cannot drift from the binary unnoticed.

use std::fmt::Write as _;

/// The command that regenerates docs/cli.md, from the workspace's root.
pub const REGENERATE: &str = "cargo run -- man --markdown > docs/cli.md";

/// The whole reference: a title, then a section per command, the top-level command first and
/// each command followed by its own subcommands. `command` is built.
pub fn reference(command: &clap::Command) -> String {
    let name = command.get_name();
    let mut page = format!(
        "# The `{name}` command line\n\nEvery command, its options and its examples, as `{name} COMMAND --help` \
         prints them. This page is generated from the command line's definition (`{name} man --markdown`); \
         do not edit it: change the help in `crates/cli/src` and run `{REGENERATE}` (a test checks that \
         it is current).\n\n"
    );
    let mut commands = Vec::new();
    collect(command, &mut commands);
    for command in commands {
        section(&mut page, command);
    }
    page.truncate(page.trim_end().len());
    page.push('\n');
    page
}

/// `command` and every visible command under it, depth first, in the order `--help` lists them.
fn collect<'a>(command: &'a clap::Command, out: &mut Vec<&'a clap::Command>) {
    out.push(command);
    for sub in visible_subcommands(command) {
        collect(sub, out);
    }
}

/// The subcommands `--help` lists (not the hidden ones, such as the demo's feed).
fn visible_subcommands(command: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    command.get_subcommands().filter(|s| !s.is_hide_set())
}

/// `tidegate backfill plan`: the name a user types (clap sets it when the command is built).
fn title(command: &clap::Command) -> &str {
    command.get_bin_name().unwrap_or_else(|| command.get_name())
}

/// The heading's anchor as GitHub makes it: lowercase, spaces as dashes.
fn anchor(command: &clap::Command) -> String {
    title(command).to_lowercase().replace(' ', "-")
}

/// The command's one-line description.
fn about(command: &clap::Command) -> String {
    prose(&command.get_about().map(ToString::to_string).unwrap_or_default())
}

/// Help text as Markdown: `<` and `>` outside code spans escaped, so a placeholder such as
/// `worker-<host>` is shown rather than taken for an HTML tag.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => in_code = !in_code,
            '<' | '>' if !in_code => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}

/// One command's section: its description, usage, subcommands, arguments, options and examples.
fn section(page: &mut String, command: &clap::Command) {
    let _ = writeln!(page, "## {}\n", title(command));
    let description = command.get_long_about().or(command.get_about()).map(ToString::to_string);
    if let Some(description) = description.filter(|d| !d.trim().is_empty()) {
        let _ = writeln!(page, "{}\n", prose(description.trim_end()));
    }
    let usage = command.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage:").trim();
    let _ = writeln!(page, "```text\n{usage}\n```\n");
    let subcommands: Vec<_> = visible_subcommands(command).collect();
    if !subcommands.is_empty() {
        let _ = writeln!(page, "Commands:\n");
        for sub in subcommands {
            let _ = writeln!(page, "- [`{}`](#{}): {}", sub.get_name(), anchor(sub), about(sub));
        }
        page.push('\n');
    }
    let shown: Vec<_> = command.get_arguments().filter(|a| shown(command, a)).collect();
    let (positionals, options): (Vec<_>, Vec<_>) = shown.into_iter().partition(|a| a.is_positional());
    arguments(page, "Arguments", &positionals);
    arguments(page, "Options", &options);
    if let Some(after) = command.get_after_help() {
        examples(page, &after.to_string());
    }
}

/// Whether `arg` is listed in `command`'s section: not hidden, not clap's own `--help` and
/// `--version`, and a global option only where it is declared (the top-level command).
fn shown(command: &clap::Command, arg: &clap::Arg) -> bool {
    let generated = matches!(arg.get_id().as_str(), "help" | "version");
    let inherited = arg.is_global_set() && command.get_bin_name().is_some_and(|n| n.contains(' '));
    !arg.is_hide_set() && !generated && !inherited
}

/// A list of arguments or options, each with its spelling, help and the values it takes.
fn arguments(page: &mut String, heading: &str, args: &[&clap::Arg]) {
    if args.is_empty() {
        return;
    }
    let _ = writeln!(page, "{heading}:\n");
    for arg in args {
        let spelling = match (arg.get_short(), arg.get_long()) {
            (Some(short), Some(_)) => format!("-{short}, {arg}"),
            _ => arg.to_string(),
        };
        let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
        let help = prose(help.trim()).replace("\n\n", "\n\n  ");
        let _ = writeln!(page, "- `{spelling}`: {help}{}", values(arg));
    }
    page.push('\n');
}

/// The values an argument takes and its default, as `--help` shows them.
fn values(arg: &clap::Arg) -> String {
    let mut notes = Vec::new();
    if arg.get_action().takes_values() {
        let possible: Vec<_> = arg.get_possible_values().into_iter().filter(|v| !v.is_hide_set()).collect();
        if !possible.is_empty() && !arg.is_hide_possible_values_set() {
            let names: Vec<_> = possible.iter().map(|v| format!("`{}`", v.get_name())).collect();
            notes.push(format!("possible values: {}", names.join(", ")));
        }
        let defaults: Vec<_> = arg.get_default_values().iter().map(|v| v.to_string_lossy()).collect();
        if !defaults.is_empty() && !arg.is_hide_default_value_set() {
            notes.push(format!("default: `{}`", defaults.join(",")));
        }
    }
    if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) }
}

/// The after-help text: a title line (`Examples:`) and indented command lines, kept as written in a
/// shell block; any other text as it is, in a plain block.
fn examples(page: &mut String, after: &str) {
    match after.split_once('\n') {
        Some((title, body)) if title.ends_with(':') && body.lines().all(|l| l.is_empty() || l.starts_with("  ")) => {
            let body: Vec<_> = body.lines().map(|l| l.strip_prefix("  ").unwrap_or(l)).collect();
            let _ = writeln!(page, "{title}\n\n```sh\n{}\n```\n", body.join("\n"));
        }
        _ => {
            let _ = writeln!(page, "```text\n{}\n```\n", after.trim_end());
        }
    }
}
