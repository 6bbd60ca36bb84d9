//! What a person at a terminal, or a pipe, gets: output into a reader that stops reading ends
//! quietly, colour only on a terminal and never with `NO_COLOR`, a plan over a year in a few
//! lines of ranges, and counts whose nouns agree with them.

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, tidegate};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `tidegate completions zsh | head -1` panicked in `clap_complete` ("failed to write completion
/// file"); with the reader gone before the first byte, and as the shell runs it.
#[test]
fn completions_and_the_man_page_into_a_closed_pipe_exit_0_quietly() {
    let dir = tempfile::tempdir().expect("a folder");
    for args in [&["completions", "zsh"][..], &["completions", "bash"], &["man"], &["--help"], &["plan", "--help"]] {
        let mut child =
            tidegate(dir.path()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("exits");
        assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()), "tidegate {args:?}");
    }
    let out = Command::new("bash")
        .args(["-c", "set -o pipefail; \"$TG\" completions zsh | head -1"])
        .env("TG", env!("CARGO_BIN_EXE_tidegate"))
        .current_dir(dir.path())
        .output()
        .expect("bash runs");
    assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "#compdef tidegate\n");
}

/// `tidegate ARGS` in `dir` on a pseudo-terminal (util-linux `script`), with `env` set and
/// `NO_COLOR` and `CLICOLOR*` unset unless `env` sets them: what the terminal showed.
fn on_a_terminal(dir: &Path, args: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &format!("\"$TG\" {args}"), "/dev/null"])
        .env("TG", env!("CARGO_BIN_EXE_tidegate"))
        .env("SHELL", "/bin/sh")
        .env("TERM", "xterm-256color")
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR")
        .env_remove("CLICOLOR_FORCE")
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("script runs");
    let mut shown = String::new();
    child.stdout.take().expect("its output").read_to_string(&mut shown).expect("reading the terminal");
    child.wait().expect("script exits");
    shown
}

#[test]
fn colour_shows_on_a_terminal_only_and_never_with_no_color() {
    // No workspace here: `validate` fails with `error: ...`, which is red on a terminal.
    let dir = tempfile::tempdir().expect("a folder");
    let coloured = on_a_terminal(dir.path(), "validate", &[]);
    assert!(coloured.contains("\x1b[") && coloured.contains("error:"), "a terminal gets colour: {coloured:?}");
    let help = on_a_terminal(dir.path(), "cancel --help", &[]);
    assert!(help.contains("\x1b["), "clap's help is styled on a terminal: {help:?}");

    let plain = on_a_terminal(dir.path(), "validate", &[("NO_COLOR", "1")]);
    assert!(plain.contains("error:") && !plain.contains('\x1b'), "NO_COLOR: {plain:?}");
    let help = on_a_terminal(dir.path(), "cancel --help", &[("NO_COLOR", "1")]);
    assert!(help.contains("Usage") && !help.contains('\x1b'), "NO_COLOR: {help:?}");

    // `serve`'s log lines: coloured on a terminal, plain with NO_COLOR (tracing's colour was once
    // set from "stderr is a terminal" alone, which overrode NO_COLOR).
    let ws = TestWorkspace::new(format!("[project]\nname = \"logs\"\n{EXTRACT_SUMMARIZE}"));
    let serve = "serve --tick-every-s 1 & sleep 2; kill -TERM $!; wait";
    let logs = on_a_terminal(ws.path(), serve, &[]);
    assert!(logs.contains("tidegate serve: logs") && logs.contains("\x1b["), "{logs:?}");
    let logs = on_a_terminal(ws.path(), serve, &[("NO_COLOR", "1")]);
    assert!(logs.contains("tidegate serve: logs") && !logs.contains('\x1b'), "NO_COLOR: {logs:?}");

    // Piped, with a terminal's TERM: no colour.
    let piped = tidegate(dir.path()).arg("validate").env("TERM", "xterm-256color").output().expect("runs");
    assert!(stderr(&piped).starts_with("error: ") && !stderr(&piped).contains('\x1b'), "{}", stderr(&piped));
}

/// `plan` over a year printed one line per step (739 lines for two tasks); now each task's run
/// of consecutive partitions is one line, and `--json` still lists every step.
#[test]
fn a_plan_over_a_year_shows_ranges() {
    let dir = TestWorkspace::new(format!("[project]\nname = \"year\"\n{EXTRACT_SUMMARIZE}"));
    let args = ["plan", "summarize", "--from", "2024-01-01", "--to", "2024-12-31"];
    let out = tidegate(dir.path()).args(args).output().expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.starts_with("Plan for summarize: 732 steps over 2 tasks\n"), "{text}");
    assert!(text.contains("\n  extract@2024-01-01..2024-12-31 (366 partitions)\n"), "{text}");
    assert!(
        text.contains(
            "\n  summarize@2024-01-01..2024-12-31 (366 partitions)  <- extract@2024-01-01..2024-12-31 (366)\n"
        ),
        "{text}"
    );
    assert!(text.lines().count() < 12, "{} lines:\n{text}", text.lines().count());

    let out = tidegate(dir.path()).args(args).arg("--json").output().expect("runs");
    let plan: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(plan["steps"].as_array().map(Vec::len), Some(732), "--json lists every step");

    // A week is short enough to list step by step, with what each waits for.
    let week = tidegate(dir.path()).args(["plan", "summarize", "--from", "2024-01-01", "--to", "2024-01-07"]).output();
    let week = String::from_utf8_lossy(&week.expect("runs").stdout).into_owned();
    assert!(week.contains("\n  summarize@2024-01-07  <- extract@2024-01-07\n"), "{week}");
}

/// "1 steps" and "0 retry": counts agree with their nouns in what a run prints.
#[test]
fn counts_agree_with_their_nouns() {
    let dir = TestWorkspace::new(format!("[project]\nname = \"counts\"\n{EXTRACT_SUMMARIZE}"));
    let out = tidegate(dir.path()).args(["run", "extract", "--partition", "2024-01-01"]).output().expect("runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains(" (1 step)\n"), "{stderr}");
    // The line wraps at 100 columns; read it as words.
    let words = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains(": 1 published, 0 failed, 0 skipped, 0 retries, 0 rejected stale reports in "), "{stdout}");
    let plan = tidegate(dir.path()).args(["plan", "extract", "--partition", "2024-01-02"]).output().expect("runs");
    let plan = String::from_utf8_lossy(&plan.stdout).into_owned();
    assert!(
        plan.starts_with("Plan for extract: 1 step over 1 task\n\nlevel 0 (1 step can run in parallel)\n"),
        "{plan}"
    );
}
