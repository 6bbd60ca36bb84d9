//! `tidegate worker`: attempts run in separate worker processes that the scheduler (`serve
//! --workers 0`) leases steps to. A worker killed with kill -9 mid-attempt loses its leases when
//! they expire, and the steps are retried on another worker; every partition is published once.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidegate_testkit::TestWorkspace;

const N_DAYS: usize = 4;

fn spec() -> String {
    // With a `slow-first` file in the workspace (the task's working folder), attempt 1 of each
    // step sleeps long enough for the test to kill its worker mid-attempt. A file, not a variable:
    // a task sees only the variables Tidegate gives it, not its worker's.
    r#"
[project]
name = "worker_test"
lease_ttl_s = 4
heartbeat_s = 1

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64" }]

[tasks.extract]
command = ["sh", "-c", "if [ -e slow-first ] && [ \"$TIDEGATE_ATTEMPT\" = 1 ]; then sleep 30; fi; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 120
retry = { attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }
"#
    .to_owned()
}

fn spawn(dir: &Path, args: &[&str]) -> Child {
    crate::common::tidegate(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tidegate")
}

/// -1 until the state database exists (it is never created here, only by tidegate).
fn query_i64(dir: &Path, sql: &str) -> i64 {
    crate::common::state(dir).int_or_missing(sql)
}

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

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

fn workspace() -> TestWorkspace {
    let dir = TestWorkspace::new(spec());
    let init = crate::common::tidegate(dir.path()).arg("validate").output();
    assert!(init.expect("validate").status.success());
    dir
}

fn submit(dir: &Path) {
    let last = format!("2024-01-{N_DAYS:02}");
    let out = crate::common::tidegate(dir)
        .args(["submit", "extract", "--from", "2024-01-01", "--to", &last, "--json"])
        .output()
        .expect("submit");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn published(dir: &Path) -> i64 {
    query_i64(dir, "SELECT COUNT(*) FROM steps WHERE status = 'published'")
}

#[test]
fn a_scheduler_without_slots_of_its_own_runs_everything_on_worker_processes() {
    let dir = workspace();
    let worker = spawn(dir.path(), &["worker", "--slots", "2", "--name", "w1"]);
    wait_for("the worker to register", 60, || query_i64(dir.path(), "SELECT COUNT(*) FROM workers") == 1);
    let serve = spawn(dir.path(), &["serve", "--workers", "0", "--tick-every-s", "1"]);
    submit(dir.path());
    wait_for("every partition to publish", 120, || published(dir.path()) == N_DAYS as i64);

    // Every attempt ran on the worker, none in the scheduler's process.
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM attempts WHERE worker <> 'w1'"), 0);
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM attempts"), N_DAYS as i64);

    let out = stop(worker);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stopped cleanly"));
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM workers"), 0, "a clean stop deregisters");
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM journal WHERE kind = 'worker_joined'"), 1);
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM journal WHERE kind = 'worker_left'"), 1);
    assert!(stop(serve).status.success());
}

#[test]
fn steps_of_a_worker_killed_mid_attempt_are_retried_on_another_worker() {
    let dir = workspace();
    dir.write("slow-first", "");
    let mut doomed = spawn(dir.path(), &["worker", "--slots", "8", "--name", "doomed"]);
    wait_for("the worker to register", 60, || query_i64(dir.path(), "SELECT COUNT(*) FROM workers") == 1);
    let serve = spawn(dir.path(), &["serve", "--workers", "0", "--tick-every-s", "1"]);
    submit(dir.path());
    wait_for("the first attempts to start on the doomed worker", 60, || {
        query_i64(dir.path(), "SELECT COUNT(*) FROM attempts WHERE worker = 'doomed'") == N_DAYS as i64
    });
    // Every first attempt is sleeping on the doomed worker: nothing can be published yet.
    assert_eq!(published(dir.path()), 0);
    doomed.kill().expect("kill -9 the worker");
    let _ = doomed.wait();
    // Its task processes are still sleeping; they hold nothing the store will accept.
    let rescuer = spawn(dir.path(), &["worker", "--slots", "2", "--name", "rescuer"]);
    wait_for("every partition to publish after the leases expire", 120, || published(dir.path()) == N_DAYS as i64);

    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM attempts WHERE worker = 'rescuer'"), N_DAYS as i64);
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM journal WHERE kind = 'lease_expired'"), N_DAYS as i64);
    // One Delta commit per step identity, whatever the crash.
    let app_ids = crate::common::commits_per_app_id(&crate::common::table(dir.path(), "raw"));
    assert_eq!(app_ids.len(), N_DAYS, "{app_ids:?}");
    assert!(app_ids.values().all(|n| *n == 1), "{app_ids:?}");
    let out = stop(rescuer);
    assert!(out.status.success(), "the rescuer: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let out = stop(serve);
    assert!(out.status.success(), "serve: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
}
