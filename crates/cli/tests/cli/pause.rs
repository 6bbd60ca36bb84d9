//! Pause and resume (issue 34): a paused task's ready steps are not started while another task's
//! run proceeds, and run once it is resumed; a paused backfill class holds a started backfill's
//! steps while a live run proceeds; a paused schedule's tick plans nothing for it; `status`,
//! `pauses` and the journal show each pause with its reason; bad input is a clear error.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{json, state, tidegate};

/// Two quick day-partitioned tasks, `a` and `b`, each writing its own dataset from 2024-01-01;
/// `c` does the same in pool `side`; `s` is scheduled daily from five days ago (catch-up off).
fn workspace() -> TestWorkspace {
    TestWorkspace::new(spec(""))
}

/// The spec of [`workspace`], with `side` added to pool `side`'s settings.
fn spec(side: &str) -> String {
    let recent = (chrono::Utc::now() - chrono::Duration::days(5)).format("%Y-%m-%d").to_string();
    let write =
        serde_json::to_string(&["sh", "-c", "printf 'v\\nx\\n' > \"$TIDEGATE_OUTPUT_DIR/o.csv\""]).expect("JSON");
    let spec = String::from("[project]\nname = \"pause_test\"\nheartbeat_s = 1\nlease_ttl_s = 5\n");
    let mut spec = format!("{spec}\n[pools.side]\nslots = 1\n{side}");
    for (task, start, extra) in [
        ("a", "2024-01-01", ""),
        ("b", "2024-01-01", ""),
        ("c", "2024-01-01", "pool = \"side\"\n"),
        ("s", recent.as_str(), "schedule = \"@daily\"\n"),
    ] {
        spec.push_str(&format!(
            "\n[datasets.out_{task}]\npartitioning = {{ grain = \"day\", start = \"{start}\" }}\n\
             write = {{ mode = \"replace\" }}\ncolumns = [{{ name = \"v\", type = \"string\" }}]\n\
             \n[tasks.{task}]\ncommand = {write}\noutputs = [\"out_{task}\"]\ntimeout_s = 60\n{extra}"
        ));
    }
    spec
}

/// Kills the processes a test started if it fails before stopping them.
struct Cleanup(Vec<u32>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.0.is_empty() {
            let pids: Vec<String> = self.0.iter().map(u32::to_string).collect();
            let _ = Command::new("kill").arg("-KILL").args(&pids).stderr(Stdio::null()).status();
        }
    }
}

fn spawn(dir: &Path, args: &[&str]) -> Child {
    tidegate(dir).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn tidegate")
}

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `tidegate ARGS`, expecting it to fail; its stderr.
fn fails(dir: &Path, args: &[&str]) -> String {
    let out: Output = tidegate(dir).args(args).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "tidegate {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    stderr
}

fn ok_json(dir: &Path, args: &[&str]) -> Value {
    let (code, value) = json(dir, args);
    assert_eq!(code, 0, "tidegate {args:?}: {value}");
    value
}

fn submit(dir: &Path, task: &str) -> String {
    let submitted = ok_json(dir, &["submit", task, "--partition", "2024-01-01", "--json"]);
    submitted["run"]["id"].as_str().expect("a run id").to_owned()
}

fn run_status(dir: &Path, run_id: &str) -> String {
    state(dir).texts("SELECT status FROM runs WHERE id = ?1", &[run_id]).concat()
}

fn step_statuses(dir: &Path, run_id: &str) -> Vec<String> {
    state(dir).texts("SELECT status FROM steps WHERE run_id = ?1", &[run_id])
}

/// The journal's pause entries: (kind, actor's reason, task).
fn pause_entries(dir: &Path) -> Vec<(String, String)> {
    state(dir)
        .rows("SELECT kind, reason FROM journal WHERE kind IN ('paused', 'resumed') ORDER BY seq", &[])
        .iter()
        .map(|r| (r[0].text().unwrap_or_default(), r[1].text().unwrap_or_default()))
        .collect()
}

fn stop(mut child: Child) -> Output {
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the process did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn a_paused_tasks_steps_stay_ready_while_another_task_runs_and_run_once_resumed() {
    let dir = workspace();
    let ws = dir.path();
    let paused = ok_json(ws, &["pause", "task:a", "--reason", "feed is wrong", "--json"]);
    assert_eq!(paused["what"], "task:a", "{paused}");
    assert_eq!(paused["reason"], "feed is wrong", "{paused}");
    let again = fails(ws, &["pause", "task:a", "--reason", "twice"]);
    assert!(again.contains("task:a is paused already") && again.contains("feed is wrong"), "{again}");

    let serve = spawn(ws, &["serve", "--tick-every-s", "3600"]);
    let mut cleanup = Cleanup(vec![serve.id()]);
    let held = submit(ws, "a");
    let other = submit(ws, "b");
    wait_for("task b's run to succeed", 120, || run_status(ws, &other) == "succeeded");
    // The scheduler went round many times while b ran and published: a's step is still ready.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(step_statuses(ws, &held), ["ready"], "the paused task's step was not started");
    assert_eq!(
        state(ws).int("SELECT COUNT(*) FROM attempts a JOIN steps s ON s.id = a.step_id WHERE s.task = 'a'", &[]),
        0
    );

    // Shown as paused, with what it holds back.
    let status = ok_json(ws, &["status", "--json"]);
    let lines = status["debt"]["paused"].as_array().expect("paused in the debt").clone();
    assert_eq!(lines.len(), 1, "{status}");
    assert_eq!(lines[0]["what"], "task:a");
    assert_eq!(lines[0]["held_back"], 1);
    let human = String::from_utf8_lossy(&tidegate(ws).arg("status").output().expect("status").stdout).into_owned();
    assert!(human.contains("Paused task:a") && human.contains("1 ready step held"), "{human}");
    let listed = ok_json(ws, &["pauses", "--json"]);
    assert_eq!(listed[0]["what"], "task:a", "{listed}");
    assert_eq!(listed[0]["held_back"], 1, "{listed}");

    let resumed = ok_json(ws, &["resume", "task:a", "--reason", "feed fixed", "--json"]);
    assert_eq!(resumed["reason"], "feed is wrong", "the pause it ended: {resumed}");
    wait_for("task a's run to succeed once resumed", 120, || run_status(ws, &held) == "succeeded");
    assert_eq!(ok_json(ws, &["pauses", "--json"]), serde_json::json!([]));

    let not_paused = fails(ws, &["resume", "task:a", "--reason", "again"]);
    assert!(not_paused.contains("task:a is not paused"), "{not_paused}");
    assert_eq!(
        pause_entries(ws),
        [("paused".to_owned(), "feed is wrong".to_owned()), ("resumed".to_owned(), "feed fixed".to_owned())]
    );
    let out = stop(serve);
    cleanup.0.clear();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_paused_pools_steps_stay_ready_while_another_pools_run() {
    let dir = workspace();
    let ws = dir.path();
    ok_json(ws, &["pause", "pool:side", "--reason", "warehouse full", "--json"]);
    let serve = spawn(ws, &["serve", "--tick-every-s", "3600"]);
    let mut cleanup = Cleanup(vec![serve.id()]);
    let held = submit(ws, "c");
    let other = submit(ws, "a");
    wait_for("task a's run to succeed", 120, || run_status(ws, &other) == "succeeded");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(step_statuses(ws, &held), ["ready"], "the paused pool's step was not started");
    let listed = ok_json(ws, &["pauses", "--json"]);
    assert_eq!((listed[0]["what"].as_str(), listed[0]["held_back"].as_u64()), (Some("pool:side"), Some(1)));
    ok_json(ws, &["resume", "pool:side", "--reason", "room again", "--json"]);
    wait_for("task c's run to succeed once resumed", 120, || run_status(ws, &held) == "succeeded");
    let out = stop(serve);
    cleanup.0.clear();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A pool's time window (here one that always holds, with no slots) gives the scheduler its
/// slots: the pool's step waits while another pool's run proceeds, and runs once the window is
/// gone.
#[test]
fn a_pool_window_with_no_slots_holds_the_pools_steps_while_it_holds() {
    let always = "time_zone = \"Europe/Paris\"\nwindows = [{ days = \"mon-sun\", from = \"00:00\", to = \"24:00\", slots = 0 }]\n";
    let dir = TestWorkspace::new(spec(always));
    let ws = dir.path();
    let serve = spawn(ws, &["serve", "--tick-every-s", "3600"]);
    let mut cleanup = Cleanup(vec![serve.id()]);
    let held = submit(ws, "c");
    let other = submit(ws, "a");
    wait_for("task a's run to succeed", 120, || run_status(ws, &other) == "succeeded");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(step_statuses(ws, &held), ["ready"], "no slot in the window: the step was not started");
    let out = stop(serve);
    cleanup.0.clear();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    dir.set_spec(spec(""));
    let serve = spawn(ws, &["serve", "--tick-every-s", "3600"]);
    cleanup.0.push(serve.id());
    wait_for("task c's run to succeed without the window", 120, || run_status(ws, &held) == "succeeded");
    let out = stop(serve);
    cleanup.0.clear();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn pausing_the_backfill_class_holds_a_started_backfill_while_a_live_run_proceeds() {
    let dir = workspace();
    let ws = dir.path();
    ok_json(ws, &["pause", "class:backfill", "--reason", "incident 42", "--json"]);
    let plan = ["backfill", "plan", "a", "--from", "2024-01-01", "--to", "2024-01-01", "--reprocess", "all"];
    let planned = ok_json(ws, &[&plan[..], &["--reason", "redo", "--json"]].concat());
    let id = planned["id"].as_str().expect("a backfill id").to_owned();
    // `backfill start` drains its run and the runs submitted after it (`run` follows it).
    let start = spawn(ws, &["backfill", "start", &id, "--json"]);
    let mut cleanup = Cleanup(vec![start.id()]);
    let backfill_run = || state(ws).texts("SELECT run_id FROM backfills WHERE id = ?1", &[&id]).concat();
    wait_for("the backfill's run", 60, || {
        !backfill_run().is_empty() && step_statuses(ws, &backfill_run()) == ["ready"]
    });

    let live = ok_json(ws, &["run", "b", "--partition", "2024-01-01", "--json"]);
    assert_eq!(live["status"], "succeeded", "{live}");
    assert_eq!(step_statuses(ws, &backfill_run()), ["ready"], "the paused class's step was not started");
    let status = ok_json(ws, &["status", "--json"]);
    assert_eq!(status["debt"]["paused"][0]["what"], "class:backfill", "{status}");
    assert_eq!(status["debt"]["paused"][0]["held_back"], 1, "{status}");

    ok_json(ws, &["resume", "class:backfill", "--reason", "incident 42 over", "--json"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut start = start;
    while start.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the backfill did not finish once resumed");
        std::thread::sleep(Duration::from_millis(100));
    }
    cleanup.0.clear();
    let out = start.wait_with_output().expect("output");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["status"], "staged", "{report}");
}

#[test]
fn a_paused_schedules_tick_plans_nothing_and_says_so() {
    let dir = workspace();
    let ws = dir.path();
    ok_json(ws, &["pause", "schedule:s", "--reason", "maintenance window", "--json"]);
    let tick = ok_json(ws, &["tick", "--dry-run", "--json"]);
    let decision =
        tick["decisions"].as_array().expect("decisions").iter().find(|d| d["task"] == "s").expect("s").clone();
    assert!(decision["paused"].as_str().expect("paused").contains("maintenance window"), "{decision}");
    assert_eq!(decision["run"], serde_json::json!([]), "{decision}");
    let human =
        String::from_utf8_lossy(&tidegate(ws).args(["tick", "--dry-run"]).output().expect("tick").stdout).into_owned();
    assert!(human.contains("s: paused, nothing planned"), "{human}");
    let ticked = ok_json(ws, &["tick", "--json"]);
    assert_eq!(ticked["runs"], serde_json::json!([]), "a paused schedule starts no run: {ticked}");
    let pauses = ok_json(ws, &["pauses", "--json"]);
    assert!(pauses[0]["held_back"].as_u64().expect("held back") >= 1, "owed intervals not planned: {pauses}");

    ok_json(ws, &["resume", "schedule:s", "--reason", "window over", "--json"]);
    let ticked = ok_json(ws, &["tick", "--json"]);
    assert_eq!(ticked["runs"].as_array().map(Vec::len), Some(1), "resumed, the tick runs it: {ticked}");
}

#[test]
fn bad_pauses_are_clear_errors() {
    let dir = workspace();
    let ws = dir.path();
    let unknown = fails(ws, &["pause", "task:nope", "--reason", "x"]);
    assert!(unknown.contains("no task of that name") && unknown.contains("a, b, c, s"), "{unknown}");
    let pool = fails(ws, &["pause", "pool:nope", "--reason", "x"]);
    assert!(pool.contains("no pool of that name"), "{pool}");
    let what = fails(ws, &["pause", "everything", "--reason", "x"]);
    assert!(what.contains("not something to pause") && what.contains("class:backfill"), "{what}");
    let live = fails(ws, &["pause", "class:live", "--reason", "x"]);
    assert!(live.contains("not something to pause"), "{live}");
    let unscheduled = fails(ws, &["pause", "schedule:a", "--reason", "x"]);
    assert!(unscheduled.contains("has no schedule"), "{unscheduled}");
    let no_reason = fails(ws, &["pause", "task:a", "--reason", "  "]);
    assert!(no_reason.contains("reason"), "{no_reason}");
    let not_paused = fails(ws, &["resume", "pool:default", "--reason", "x"]);
    assert!(not_paused.contains("pool:default is not paused (nothing is paused)"), "{not_paused}");
    assert!(pause_entries(ws).is_empty(), "nothing journaled");
}
