//! A reader that stops reading (`tidegate run | head`, `tidegate sql --csv | head`, `tidegate
//! history | head`) ends nothing but the output: the command does its work to the end and exits
//! with the code it would have had, quietly.

use std::path::Path;
use std::process::{Output, Stdio};

use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, ok, tidegate};

fn workspace() -> TestWorkspace {
    TestWorkspace::new(format!("[project]\nname = \"pipes\"\n{EXTRACT_SUMMARIZE}"))
}

/// `tidegate ARGS` whose stdout (and with `with_stderr` its stderr too, as `2>&1 | head` makes
/// it) is a pipe nobody reads: its reader is gone before the first line.
fn into_a_closed_pipe(dir: &Path, args: &[&str], with_stderr: bool) -> Output {
    let mut child =
        tidegate(dir).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn tidegate");
    drop(child.stdout.take());
    if with_stderr {
        drop(child.stderr.take());
    }
    child.wait_with_output().expect("tidegate exits")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `tidegate run ... 2>&1 | head` once exited at its first progress line, leaving its run
/// unfinished and its leases to expire.
#[test]
fn a_run_whose_reader_has_gone_finishes_and_leaves_no_lease_behind() {
    let dir = workspace();
    let args = ["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-03", "--workers", "1"];
    let out = into_a_closed_pipe(dir.path(), &args, true);
    assert_eq!(out.status.code(), Some(0), "the run's outcome");
    let state = crate::common::state(dir.path());
    assert_eq!(state.int("SELECT COUNT(*) FROM steps WHERE status = 'published'", &[]), 6);
    assert_eq!(state.int("SELECT COUNT(*) FROM leases", &[]), 0, "a lease left to expire");
}

/// More rows than any buffer holds, so writing them meets the closed pipe.
#[test]
fn sql_as_csv_into_a_closed_pipe_exits_0_quietly() {
    let dir = workspace();
    let out = into_a_closed_pipe(dir.path(), &["sql", "--csv", "SELECT * FROM generate_series(1, 200000)"], false);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "a closed pipe is not worth a word");
}

#[test]
fn history_into_a_closed_pipe_still_exits_with_the_tamper_code() {
    let dir = workspace();
    ok(dir.path(), &["run", "extract", "--partition", "2024-01-01"]);
    let state = crate::common::state(dir.path());
    state.drop_journal_guard();
    state.execute("UPDATE journal SET reason = 'forged' WHERE seq = 2", &[]);
    assert_eq!(tidegate(dir.path()).arg("history").output().expect("history").status.code(), Some(2));
    let out = into_a_closed_pipe(dir.path(), &["history"], false);
    assert_eq!(out.status.code(), Some(2), "tampering found, the reader gone: {}", stderr(&out));
}
