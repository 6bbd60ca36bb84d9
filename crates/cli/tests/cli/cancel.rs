//! `cancel` stops work (issue 34): a run or a backfill cancelled while its task runs has the
//! task's whole process tree (children in the background and in a session of their own
//! included) killed within seconds by the process running the attempt (`serve`, `backfill
//! start`, or a `tidegate worker`, which learns of the cancel through the store); the run ends
//! cancelled, nothing is published, and the journal records the stop with who cancelled and why.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{alive_with, json, state, tidegate};

/// A workspace whose task `t` runs for ten minutes, with a child in the background and one in a
/// session of its own, each with `marker` (a number no other test uses) in its command line.
fn workspace(marker: &str) -> TestWorkspace {
    let script = format!(
        "setsid sleep 601.{marker} > /dev/null 2>&1 < /dev/null & sleep 602.{marker} & sleep 600.{marker}; \
         printf 'v\\nlate\\n' > \"$TIDEGATE_OUTPUT_DIR/o.csv\""
    );
    let command = serde_json::to_string(&["sh", "-c", &script]).expect("JSON");
    TestWorkspace::new(format!(
        r#"
[project]
name = "cancel_test"
heartbeat_s = 1
lease_ttl_s = 5

[datasets.out]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "v", type = "string" }}]

[tasks.t]
command = {command}
outputs = ["out"]
timeout_s = 900
"#
    ))
}

fn spawn(dir: &Path, args: &[&str]) -> Child {
    tidegate(dir).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn tidegate")
}

/// Kills, when the test ends (a failed one included), the `tidegate` processes it started and
/// every process holding its marker, so a failure leaves no ten-minute task behind.
struct Cleanup {
    marker: &'static str,
    pids: Vec<u32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // A test that passed stopped and reaped its processes: their pids may be another's now.
        let started = if std::thread::panicking() { self.pids.as_slice() } else { &[] };
        let mut pids: Vec<String> = started.iter().map(u32::to_string).collect();
        pids.extend(task_processes(self.marker).iter().filter_map(|p| p.split(':').next().map(str::to_owned)));
        if !pids.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(&pids).stderr(Stdio::null()).status();
        }
    }
}

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The processes of the task of `marker`: those whose command line holds `600.MARKER`,
/// `601.MARKER` or `602.MARKER`. Never the bare marker, which other processes' command lines
/// may hold among their digits (Chromium's, in the browser test running beside these: a match
/// there once had this test see a stray process, and its cleanup kill the browser's).
fn task_processes(marker: &str) -> Vec<String> {
    let mut found: Vec<String> =
        ["600.", "601.", "602."].iter().flat_map(|n| alive_with(&format!("{n}{marker}"))).collect();
    found.sort();
    found.dedup();
    found
}

/// Waits until the task of `marker` and both its children run.
fn wait_for_the_task(marker: &str) {
    wait_for("the task and its children to run", 120, || {
        let alive = task_processes(marker).join("\n");
        ["600.", "601.", "602."].iter().all(|s| alive.contains(&format!("{s}{marker}")))
    });
}

/// Asserts that every process of the task of `marker` is gone within 10 s of the cancel (a stop
/// is looked for every second; on main they ran for ten minutes).
fn assert_the_task_is_gone(marker: &str) {
    let cancelled = Instant::now();
    let deadline = cancelled + Duration::from_secs(10);
    loop {
        let left = task_processes(marker);
        if left.is_empty() {
            eprintln!("the task of {marker} was gone {:?} after the cancel returned", cancelled.elapsed());
            return;
        }
        assert!(Instant::now() < deadline, "the cancelled attempt's processes still run: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops `child` with SIGTERM and returns its output; it must exit within 30 s (an attempt left
/// running would hold it for ten minutes).
fn stop(mut child: Child) -> std::process::Output {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the process did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn submit(dir: &Path) -> String {
    let (code, submitted) = json(dir, &["submit", "t", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 0, "{submitted}");
    submitted["run"]["id"].as_str().expect("a run id").to_owned()
}

/// The run ended cancelled with every step cancelled, nothing was published, and the journal says
/// which process stopped the attempt, for whom and why. Returns that process's name.
fn assert_stopped_by_the_cancel(dir: &Path, run_id: &str, reason: &str) -> String {
    let db = state(dir);
    let steps = db.texts("SELECT status FROM steps WHERE run_id = ?1", &[run_id]);
    assert!(!steps.is_empty() && steps.iter().all(|s| s == "cancelled"), "{steps:?}");
    wait_for("the run to end cancelled", 30, || {
        db.texts("SELECT status FROM runs WHERE id = ?1", &[run_id]) == ["cancelled"]
    });
    assert_eq!(db.int("SELECT COUNT(*) FROM journal WHERE kind = 'published'", &[]), 0, "nothing is published");
    assert_eq!(db.int("SELECT COUNT(*) FROM releases", &[]), 0, "no release");
    let cancels = db.rows("SELECT actor, reason FROM journal WHERE kind = 'cancelled' AND run_id = ?1", &[run_id]);
    let canceller = cancels[0][0].text().expect("the cancel names who cancelled");
    let stops =
        db.rows("SELECT actor, reason, payload, run_id FROM journal WHERE kind = 'attempt_stopped' ORDER BY seq", &[]);
    assert_eq!(stops.len(), 1, "one attempt stopped, journaled once");
    let (actor, why) = (stops[0][0].text().expect("actor"), stops[0][1].text().expect("reason"));
    assert!(why.contains(reason) && why.contains(&canceller) && why.contains("stopped"), "{why}");
    let payload: Value = serde_json::from_str(&stops[0][2].text().expect("payload")).expect("JSON");
    assert_eq!(payload["cancelled_by"], canceller.as_str(), "{payload}");
    assert_eq!(payload["cancel_reason"], reason, "{payload}");
    assert_eq!(payload["attempt"], 1, "{payload}");
    assert_eq!(stops[0][3].text().as_deref(), Some(run_id));
    let ran_on = db.texts("SELECT worker FROM attempts", &[]);
    assert_eq!(ran_on, std::slice::from_ref(&actor), "the process that ran the attempt stopped it");
    actor
}

#[test]
fn a_run_cancelled_while_serve_runs_its_task_stops_the_task_and_everything_it_started() {
    let marker = "4781";
    let dir = workspace(marker);
    let run_id = submit(dir.path());
    let serve = spawn(dir.path(), &["serve", "--tick-every-s", "3600"]);
    let _cleanup = Cleanup { marker, pids: vec![serve.id()] };
    wait_for_the_task(marker);

    let (code, cancelled) = json(dir.path(), &["cancel", &run_id, "--reason", "wrong range", "--json"]);
    assert_eq!(code, 0, "{cancelled}");
    assert_eq!(cancelled["n_steps_cancelled"], 1, "{cancelled}");
    assert_eq!(cancelled["n_attempts_stopping"], 1, "{cancelled}");
    assert_the_task_is_gone(marker);
    let stopper = assert_stopped_by_the_cancel(dir.path(), &run_id, "wrong range");
    assert!(stopper.starts_with("serve-"), "{stopper}");

    let out = stop(serve);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_run_cancelled_while_a_worker_runs_its_task_is_stopped_on_the_worker() {
    let marker = "4782";
    let dir = workspace(marker);
    let run_id = submit(dir.path());
    let worker = spawn(dir.path(), &["worker", "--slots", "1", "--name", "far-away"]);
    wait_for("the worker to register", 60, || state(dir.path()).int_or_missing("SELECT COUNT(*) FROM workers") == 1);
    let serve = spawn(dir.path(), &["serve", "--workers", "0", "--tick-every-s", "3600"]);
    let _cleanup = Cleanup { marker, pids: vec![worker.id(), serve.id()] };
    wait_for_the_task(marker);

    let (code, cancelled) = json(dir.path(), &["cancel", &run_id, "--reason", "bad input", "--json"]);
    assert_eq!(code, 0, "{cancelled}");
    assert_the_task_is_gone(marker);
    let stopper = assert_stopped_by_the_cancel(dir.path(), &run_id, "bad input");
    assert_eq!(stopper, "far-away", "the worker stopped its attempt");

    let out = stop(worker);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("1 stopped by a cancel"), "{stderr}");
    assert!(stop(serve).status.success());
}

#[test]
fn a_backfill_cancelled_while_its_steps_run_stops_them() {
    let marker = "4783";
    let dir = workspace(marker);
    let ws = dir.path();
    let plan = ["backfill", "plan", "t", "--from", "2024-01-01", "--to", "2024-01-01", "--reprocess", "all"];
    let (code, planned) = json(ws, &[&plan[..], &["--reason", "redo", "--json"]].concat());
    assert_eq!(code, 0, "{planned}");
    let id = planned["id"].as_str().expect("a backfill id").to_owned();
    let mut start = spawn(ws, &["backfill", "start", &id, "--json"]);
    let _cleanup = Cleanup { marker, pids: vec![start.id()] };
    wait_for_the_task(marker);

    let (code, cancelled) = json(ws, &["backfill", "cancel", &id, "--reason", "superseded", "--json"]);
    assert_eq!(code, 0, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_the_task_is_gone(marker);
    // `backfill start` ran the attempt: it stops it, and then has nothing left to wait for.
    let deadline = Instant::now() + Duration::from_secs(30);
    while start.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "`backfill start` still runs after its backfill was cancelled");
        std::thread::sleep(Duration::from_millis(100));
    }
    let run_id = state(ws).texts("SELECT run_id FROM backfills WHERE id = ?1", &[&id]);
    let stopper = assert_stopped_by_the_cancel(ws, &run_id[0], "superseded");
    assert!(!stopper.is_empty());
    let (_, status) = json(ws, &["backfill", "status", &id, "--json"]);
    assert_eq!(status["status"], "cancelled", "{status}");
}
