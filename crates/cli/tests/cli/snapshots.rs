//! The human output of `plan`, `status`, `history`, `backfill plan` and `backfill compare`, pinned
//! with snapshot tests: the real binary on a temp workspace, its stdout with the values that change
//! from run to run (ids, hashes, times, durations, paths, the OS account, worker pids) replaced by
//! placeholders. A change to what a user reads shows up as a diff of a `.snap` file under review.

use std::path::Path;

use tidegate_testkit::TestWorkspace;

use crate::common::{self, EXTRACT_SUMMARIZE};

/// The range every test works on: three days, so the plan has parallel levels and the tables rows.
const FROM: &str = "2024-01-01";
const TO: &str = "2024-01-03";

/// The summary's SQL before and after the fix a backfill reprocesses.
const BUGGY: &str = "COUNT(*) AS n FROM raw";
const FIXED: &str = "COUNT(*) * 2 AS n FROM raw";

/// A temp workspace holding the two-step pipeline under a `[project]` table.
fn workspace() -> TestWorkspace {
    TestWorkspace::new(format!("[project]\nname = \"snapshot_test\"\n{EXTRACT_SUMMARIZE}"))
}

/// A workspace whose summary of [`FROM`]..=[`TO`] is published, then found wrong and fixed in the
/// spec, with a backfill of it planned: its id and `backfill plan`'s output.
fn planned_backfill(dir: &Path) -> (String, String) {
    // One run per day: a run of several days may publish them in one commit or several, and
    // `backfill compare` names the table version it compares with.
    for day in [FROM, "2024-01-02", TO] {
        common::ok(dir, &["run", "summarize", "--from", day, "--to", day]);
    }
    let path = dir.join("tidegate.toml");
    let spec = std::fs::read_to_string(&path).expect("spec");
    assert!(spec.contains(BUGGY), "the spec has the query to fix");
    std::fs::write(&path, spec.replace(BUGGY, FIXED)).expect("spec");
    let args =
        ["backfill", "plan", "summarize", "--from", FROM, "--to", TO, "--reprocess", "all", "--reason", "n was half"];
    let planned = common::ok(dir, &args);
    let id = planned.split_whitespace().find(|w| w.starts_with("bf-")).expect("a backfill id").to_owned();
    (id, planned)
}

/// Pins `output` as snapshot `name`, after replacing what changes from run to run. `command`
/// becomes the snapshot's description, so a reviewer sees what printed it.
fn check(name: &str, command: &str, output: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.set_description(command);
    for (pattern, placeholder) in redactions() {
        settings.add_filter(&pattern, placeholder);
    }
    settings.bind(|| insta::assert_snapshot!(name, output));
}

/// Regexes and their placeholders, applied in order. Ids and times keep their width, so the tables
/// stay aligned as a user sees them.
fn redactions() -> Vec<(String, &'static str)> {
    let user = escape(&os_account());
    vec![
        // A temp workspace: tempfile's `.tmp` and six random characters, under the temp folder.
        (r"(/[^\s/]+)*/\.tmp[A-Za-z0-9]{6}".to_owned(), "[workspace]"),
        (
            r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b".to_owned(),
            "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
        ),
        (r"\bbf-[0-9a-f]{8}\b".to_owned(), "bf-xxxxxxxx"),
        // `status` shows the scheduler's pace and ETA only once a run has lasted a second, which
        // depends on the machine's speed; the backlog stays.
        (r"(backlog \d+), \d+(\.\d+)? steps/s(, ETA [^\n]+)?".to_owned(), "$1"),
        (r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?Z?".to_owned(), "YYYY-MM-DD hh:mm:ss"),
        (r"\b\d{4}-\d\d-\d\d \d\d:\d\d\b".to_owned(), "YYYY-MM-DD hh:mm"),
        (r"\b[0-9a-f]{12,}\b".to_owned(), "[hash]"),
        (r"\b\d+(\.\d+)? steps/s\b".to_owned(), "[n] steps/s"),
        (r"\b\d+(\.\d+)? (ms|s)\b".to_owned(), "[n] $2"),
        // The journal's actor column is fourteen wide, so a worker's pid (up to seven digits) does
        // not move the rest of the entry, nor where it wraps; a longer name widens it.
        (r"hh:mm:ss worker-\d+ +".to_owned(), "hh:mm:ss worker-PID     "),
        (format!(r"hh:mm:ss {user} +"), "hh:mm:ss [user]         "),
        (r"\bworker-\d+\b".to_owned(), "worker-PID"),
        (format!(r"\b{user}\b"), "[user]"),
    ]
}

/// The OS account the binary records as the actor of local commands (`app::actor::os_account`).
fn os_account() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| format!("uid-{uid}"))
}

/// `text` as a regex matching itself.
fn escape(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_ascii_alphanumeric() || c == '_' { vec![c] } else { vec!['\\', c] }).collect()
}

#[test]
fn plan_shows_levels_and_the_critical_path() {
    let dir = workspace();
    let out = common::ok(dir.path(), &["plan", "summarize", "--from", FROM, "--to", TO]);
    check("plan", "tidegate plan summarize --from 2024-01-01 --to 2024-01-03", &out);
}

#[test]
fn status_shows_the_project_pools_and_runs() {
    let dir = workspace();
    common::ok(dir.path(), &["run", "summarize", "--from", FROM, "--to", TO]);
    let out = common::ok(dir.path(), &["status"]);
    check("status", "tidegate status (after one run of summarize over three days)", &out);
}

#[test]
fn history_shows_the_journal_by_intent_happening_and_visibility() {
    let dir = workspace();
    // One day: its two steps run one after the other, so the journal's order is fixed.
    common::ok(dir.path(), &["run", "summarize", "--from", FROM, "--to", FROM]);
    let out = common::ok(dir.path(), &["history"]);
    check("history", "tidegate history (after one run of summarize over one day)", &out);
}

#[test]
fn backfill_plan_shows_the_blast_radius_and_the_estimate() {
    let dir = workspace();
    let (_, out) = planned_backfill(dir.path());
    check(
        "backfill_plan",
        "tidegate backfill plan summarize --from 2024-01-01 --to 2024-01-03 --reprocess all --reason 'n was half'",
        &out,
    );
}

#[test]
fn backfill_compare_shows_each_partition_before_and_after() {
    let dir = workspace();
    let (id, _) = planned_backfill(dir.path());
    common::ok(dir.path(), &["backfill", "start", &id]);
    let out = common::ok(dir.path(), &["backfill", "compare", &id]);
    check("backfill_compare", "tidegate backfill compare BACKFILL (after it was planned and started)", &out);
}
