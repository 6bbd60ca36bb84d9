//! Runs and backfills named by the first characters of their id, as git names a commit: a unique
//! prefix is the run, an ambiguous one is refused listing the ids it begins, one that begins
//! nothing says so, and one too short says how long a prefix must be.

use std::path::Path;

use tidegate_testkit::TestWorkspace;

use crate::common::{EXTRACT_SUMMARIZE, json, ok, tidegate};

fn workspace() -> TestWorkspace {
    TestWorkspace::new(format!("[project]\nname = \"ids\"\n{EXTRACT_SUMMARIZE}"))
}

/// Submits `task` for `partition` (queued: nothing runs it) and returns the run's id.
fn submitted(dir: &Path, task: &str, partition: &str) -> String {
    let (code, run) = json(dir, &["submit", task, "--partition", partition, "--json"]);
    assert_eq!(code, 0, "{run}");
    run["run"]["id"].as_str().expect("a run id").to_owned()
}

/// The characters `a` and `b` begin with alike.
fn common_prefix(a: &str, b: &str) -> String {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).map(|(x, _)| x).collect()
}

/// `tidegate ARGS`, which must fail with status 1; its stderr.
fn refused(dir: &Path, args: &[&str]) -> String {
    let out = tidegate(dir).args(args).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "tidegate {args:?} should be refused: {stderr}");
    stderr
}

#[test]
fn a_run_is_found_by_a_unique_prefix_and_an_ambiguous_one_lists_the_matches() {
    let dir = workspace();
    let dir = dir.path();
    let first = submitted(dir, "extract", "2024-01-01");
    let second = submitted(dir, "extract", "2024-01-02");
    // UUIDv7 begin with the time: two runs made a moment apart share their first characters.
    let shared = common_prefix(&first, &second);
    assert!(shared.len() >= 4, "{first} and {second}");
    let unique = &second[..shared.len() + 1];

    // The commands that show a run take its prefix.
    let (code, steps) = json(dir, &["logs", "--run", unique, "--json"]);
    assert_eq!(code, 0, "{steps}");
    let history = ok(dir, &["history", unique]);
    assert!(history.contains(&second) && !history.contains(&first), "{history}");
    // So does the one that changes it, and it names the run it found.
    let cancelled = ok(dir, &["cancel", unique]);
    assert!(cancelled.starts_with(&format!("Cancelled run {second} (1 unfinished step cancelled)")), "{cancelled}");

    // Ambiguous: refused, listing both ids, whichever command.
    for args in [vec!["cancel", shared.as_str()], vec!["logs", "--run", shared.as_str()], vec!["history", &shared]] {
        let stderr = refused(dir, &args);
        assert!(stderr.contains("begins more than one run id"), "{args:?}: {stderr}");
        assert!(stderr.contains(&first) && stderr.contains(&second), "{args:?} lists both: {stderr}");
    }
    // Nothing begins with it; too short to look for.
    let none = refused(dir, &["cancel", "ffff"]);
    assert!(none.contains("no run id starts with \"ffff\"") && none.contains("tidegate status"), "{none}");
    let short = refused(dir, &["cancel", &first[..3]]);
    assert!(short.contains("at least its first 4 characters"), "{short}");
    // A LIKE wildcard is not a prefix.
    let wildcard = refused(dir, &["cancel", "0%"]);
    assert!(wildcard.contains("made of a-z, 0-9 and -"), "{wildcard}");
    // The first run was left alone by all of this.
    let state = crate::common::state(dir);
    assert_eq!(state.texts("SELECT status FROM runs WHERE id = ?1", &[&first]), ["queued"]);
}

#[test]
fn a_backfill_is_found_by_a_unique_prefix() {
    let dir = workspace();
    let dir = dir.path();
    ok(dir, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    let plan = ["backfill", "plan", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--reprocess", "all"];
    let (code, planned) = json(dir, &[&plan[..], &["--reason", "fix", "--json"]].concat());
    assert_eq!(code, 0, "{planned}");
    let id = planned["id"].as_str().expect("a backfill id").to_owned();
    let prefix = &id[..6];
    let (code, status) = json(dir, &["backfill", "status", prefix, "--json"]);
    assert_eq!((code, status["id"].as_str()), (0, Some(id.as_str())), "{status}");
    let cancelled = ok(dir, &["backfill", "cancel", prefix]);
    assert!(cancelled.contains(&format!("Cancelled backfill {id}")), "{cancelled}");
}

#[test]
fn a_release_is_found_by_a_unique_prefix_where_rows_are_read_at_it() {
    let dir = workspace();
    let dir = dir.path();
    ok(dir, &["run", "extract", "--partition", "2024-01-01"]);
    let releases = crate::common::state(dir).texts("SELECT id FROM releases", &[]);
    let [release] = releases.as_slice() else { panic!("one release: {releases:?}") };
    let prefix = &release[..8];
    let (code, rows) = json(dir, &["read", "raw", "--release", prefix, "--json"]);
    assert_eq!((code, rows.as_array().map(Vec::len)), (0, Some(2)), "{rows}");
    let (code, rows) = json(dir, &["sql", "SELECT COUNT(*) AS n FROM raw", "--release", prefix, "--json"]);
    assert_eq!((code, rows[0]["n"].as_i64()), (0, Some(2)), "{rows}");
}
