//! Output for people: every command's human output fits a 100-column terminal on a real
//! workspace (the demo's: a month of runs, failures, a backfill, debt), every command's help fits
//! it too and ends with examples, and the shell completions and man page generated from the
//! command line's definition cover every command.
//!
//! Not checked for width: the rows `read` and `sql` print and the task output `logs` shows, which
//! are the user's data, printed whole (a cut value could mislead; `--csv`, `--json` or fewer
//! columns narrow them); error messages (`error: ...`), printed as one line each; and a path
//! longer than a line, printed whole so it can be copied.

use std::path::Path;

use serde_json::Value;

use crate::common::tidegate;

/// The widest line a command may print for people.
const WIDTH: usize = 100;

/// Every line of `text` wider than [`WIDTH`] columns, with what printed it.
fn too_wide(what: &str, text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.chars().count() > WIDTH)
        .map(|l| format!("{what}: {} columns: {l}", l.chars().count()))
        .collect()
}

/// Runs `tidegate ARGS` in `dir`, asserting it succeeds; its stdout and stderr.
fn both(dir: &Path, args: &[&str]) -> String {
    let out = tidegate(dir).args(args).output().expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "tidegate {args:?} failed:\n{stdout}\n{stderr}");
    format!("{stdout}{stderr}")
}

/// Runs `tidegate ARGS --json` in `dir`.
fn json(dir: &Path, args: &[&str]) -> Value {
    let out = tidegate(dir).args(args).arg("--json").output().expect("runs");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("tidegate {args:?} --json ({e})"))
}

#[test]
fn human_output_fits_100_columns_on_the_demo_workspace() {
    let dir = tempfile::tempdir().expect("temp dir");
    // With tidegate on the PATH, as an installed binary is, the demo's closing suggestions say
    // `tidegate` rather than the test binary's long path.
    let bin = Path::new(env!("CARGO_BIN_EXE_tidegate")).parent().expect("the binary's folder");
    let path = std::env::join_paths(
        std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("a PATH");
    let out = tidegate(dir.path()).args(["demo", "--dir", "demo"]).env("PATH", path).output().expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("\n  tidegate -C demo status\n"), "{stdout}");
    let mut wide = too_wide("tidegate demo", &format!("{stdout}{stderr}"));
    let ws = dir.path().join("demo");
    let ws = ws.as_path();
    let status = json(ws, &["status"]);
    let runs = status["runs"].as_array().expect("runs");
    let first_run = runs.last().and_then(|r| r["id"].as_str()).expect("a run").to_owned();
    // The demo leaves schedule debt: the case the issue found as a 1,601-character line.
    assert!(status["debt"]["missed"].as_array().is_some_and(|m| !m.is_empty()), "the demo leaves debt: {status}");
    let backfills = json(ws, &["backfill", "list"]);
    let backfill = backfills[0]["id"].as_str().expect("a backfill").to_owned();
    let commands: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["status", "--now", "2024-06-01"],
        vec!["history"],
        vec!["history", &first_run],
        vec!["history", "user_features:2024-01-12"],
        vec!["history", "ingest_clicks@2024-01-05"],
        vec!["backfill", "list"],
        vec!["backfill", "status", &backfill],
        vec!["plan", "user_features", "--from", "2024-01-01", "--to", "2024-01-30"],
        vec!["plan", "training_snapshot", "--from", "2024-01-01", "--to", "2024-03-31"],
        vec!["validate"],
        vec!["token", "list"],
        vec!["tick", "--dry-run", "--now", "2024-06-01"],
        vec!["vacuum", "--dry-run"],
        vec!["reconcile"],
        vec![
            "backfill",
            "plan",
            "user_features",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-30",
            "--reprocess",
            "all",
            "--include-downstream",
            "--reason",
            "the width test plans one to see its blast radius",
        ],
    ];
    for args in &commands {
        wide.extend(too_wide(&format!("tidegate {}", args.join(" ")), &both(ws, args)));
    }
    // Undoing a run or a dataset's newest run, said before acting.
    // (A run whose partitions a later release changed is refused; the newest that is not, is shown.)
    let ids: Vec<&str> = runs.iter().filter_map(|r| r["id"].as_str()).collect();
    let undo_run = ids
        .iter()
        .map(|id| tidegate(ws).args(["rollback", "--run", id, "--dry-run"]).output().expect("runs"))
        .find(|out| out.status.success())
        .expect("some run of the demo can be rolled back");
    let text = format!("{}{}", String::from_utf8_lossy(&undo_run.stdout), String::from_utf8_lossy(&undo_run.stderr));
    assert!(text.contains("Rolling back run"), "{text}");
    wide.extend(too_wide("tidegate rollback --run RUN --dry-run", &text));
    wide.extend(too_wide(
        "tidegate rollback user_features --dry-run",
        &both(ws, &["rollback", "user_features", "--dry-run"]),
    ));
    // `logs` prints the tasks' own output (their data, as `read` prints rows): only its headings.
    let logs = both(ws, &["logs", "--run", &first_run]);
    let headings: Vec<&str> = logs.lines().filter(|l| l.starts_with("== ") || l.starts_with("(no ")).collect();
    assert!(!headings.is_empty(), "{logs}");
    wide.extend(too_wide("tidegate logs --run RUN", &headings.join("\n")));
    // The debt is summarised, not listed: the demo's weekly snapshot owes many weeks.
    let text = both(ws, &["status", "--now", "2024-06-01"]);
    assert!(text.lines().any(|l| l.starts_with("Debt ") && l.contains("..") && l.contains(')')), "{text}");
    assert!(wide.is_empty(), "lines wider than {WIDTH} columns:\n{}", wide.join("\n"));
}

/// The subcommands of the command line, from `tidegate --help` (every command a user can call).
fn subcommands(dir: &Path, args: &[&str]) -> Vec<String> {
    let help = both(dir, args);
    let section = help.split("Commands:\n").nth(1).expect("a Commands section");
    section
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command under `path` a user can call (`backfill plan` as `["backfill", "plan"]`), depth
/// first, with its `--help`.
pub(crate) fn commands(dir: &Path, path: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let args: Vec<&str> = path.iter().map(String::as_str).chain(["--help"]).collect();
    let help = both(dir, &args);
    let subcommands = if help.contains("Commands:\n") { subcommands(dir, &args) } else { Vec::new() };
    out.push((path.to_vec(), help));
    for name in subcommands {
        commands(dir, &[path, &[name]].concat(), out);
    }
}

/// Every command's `--help` and `-h`, usage line included (clap wraps the rest, not that), fits
/// 100 columns; and every command's `--help` ends with examples, each line indented, so a new
/// command cannot forget them and clap never wraps an example in the middle of a command.
#[test]
fn every_help_fits_100_columns_and_ends_with_examples() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut all = Vec::new();
    commands(dir.path(), &[], &mut all);
    assert!(all.len() > 30, "the walk finds the commands: {}", all.len());
    let (mut wide, mut missing) = (Vec::new(), Vec::new());
    for (path, help) in &all {
        let name = path.join(" ");
        let short: Vec<&str> = path.iter().map(String::as_str).chain(["-h"]).collect();
        wide.extend(too_wide(&format!("tidegate {name} --help"), help));
        wide.extend(too_wide(&format!("tidegate {name} -h"), &both(dir.path(), &short)));
        if path.is_empty() {
            continue; // the top level starts people off instead
        }
        let Some((_, examples)) = help.split_once("Examples:\n") else {
            missing.push(name);
            continue;
        };
        let lines: Vec<&str> = examples.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(!lines.is_empty(), "`tidegate {name} --help` has an empty Examples section");
        for line in lines {
            assert!(line.starts_with("  "), "`tidegate {name}` example not indented: {line:?}");
        }
    }
    assert!(wide.is_empty(), "help lines wider than {WIDTH} columns:\n{}", wide.join("\n"));
    assert!(missing.is_empty(), "commands without an Examples section in --help: {missing:?}");
}

#[test]
fn completions_and_the_man_page_cover_every_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let top = subcommands(dir.path(), &["--help"]);
    assert!(top.len() > 15 && top.iter().any(|c| c == "completions"), "{top:?}");
    let backfill = subcommands(dir.path(), &["backfill", "--help"]);
    assert!(backfill.len() == 11, "{backfill:?}");
    for shell in ["bash", "zsh", "fish"] {
        let script = both(dir.path(), &["completions", shell]);
        for name in top.iter().chain(&backfill) {
            assert!(script.contains(name.as_str()), "the {shell} completion does not mention {name}");
        }
    }
    let bash = both(dir.path(), &["completions", "bash"]);
    assert!(bash.contains("complete -F") && bash.contains("tidegate__subcmd__backfill__subcmd__plan"), "{bash}");
    let out = tidegate(dir.path()).args(["completions", "tcsh"]).output().expect("runs");
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("possible values"));

    let page = both(dir.path(), &["man"]);
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH SUBCOMMANDS"] {
        assert!(page.contains(section), "the man page has no {section}:\n{page}");
    }
    for name in &top {
        assert!(page.contains(&format!("tidegate\\-{}", name.replace('-', "\\-"))), "the man page lacks {name}");
    }
    let pages = dir.path().join("man1");
    both(dir.path(), &["man", "--out-dir", pages.to_str().expect("utf-8 path")]);
    for name in ["tidegate.1", "tidegate-run.1", "tidegate-backfill-plan.1", "tidegate-token-create.1"] {
        assert!(pages.join(name).is_file(), "no {name} in {}", pages.display());
    }
    render(&pages.join("tidegate-backfill-plan.1"));
}

/// Renders a man page as `man` does (groff's man macros, warnings on, plain text out), asserting
/// it renders cleanly with its sections and examples.
fn render(page: &Path) {
    let groff = std::process::Command::new("groff").args(["-man", "-Tutf8", "-ww", "-P-cbu"]).arg(page).output();
    let Ok(out) = groff else {
        tidegate_testkit::service_missing("completions_and_the_man_page_cover_every_command", "groff (groff-base)");
        return;
    };
    let (text, warnings) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && warnings.trim().is_empty(), "groff: {warnings}");
    // The examples keep their lines: a command is not reflowed into the next.
    let example = "tidegate backfill plan daily_stats --from 2024-01-01 --to 2024-01-31 --reprocess all \\\n";
    for needle in ["NAME", "SYNOPSIS", "EXAMPLES", example] {
        assert!(text.contains(needle), "the rendered page lacks {needle}:\n{text}");
    }
}
