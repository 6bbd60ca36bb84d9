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
    // a task sees only the variables Tidegate gives it, not its worker's. Every execution appends
    // its partition and attempt to `executions.log` there, whichever worker runs it.
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
command = ["sh", "-c", "echo \"$TIDEGATE_PARTITION $TIDEGATE_ATTEMPT\" >> executions.log; if [ -e slow-first ] && [ \"$TIDEGATE_ATTEMPT\" = 1 ]; then sleep 30; fi; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
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

/// The lines of `executions.log`: one per execution of the task, whichever worker ran it.
fn executions(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("executions.log")).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// How `child` exited, if it did within `secs`; `None` while it still runs.
fn exited_within(child: &mut Child, secs: u64) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// This machine's name, as a refusal names the other worker's host.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the host name").trim().to_owned()
}

/// Two workers started with one `--name` (two machines cloned from one image give the unit's
/// `%H-%i` equal names) were both accepted and ran every attempt twice: four steps, eight
/// executions, since publication is fenced and a task's side effects are not. The second is
/// refused at start, naming the first's host and process, and every attempt runs once.
#[test]
fn a_second_worker_with_a_taken_name_is_refused_and_every_attempt_runs_once() {
    let dir = workspace();
    let first = spawn(dir.path(), &["worker", "--slots", "2", "--name", "twin"]);
    wait_for("the first worker to register", 60, || query_i64(dir.path(), "SELECT COUNT(*) FROM workers") == 1);
    let mut second = spawn(dir.path(), &["worker", "--slots", "2", "--name", "twin"]);
    let refused = exited_within(&mut second, 30);
    let serve = spawn(dir.path(), &["serve", "--workers", "0", "--tick-every-s", "1"]);
    submit(dir.path());
    wait_for("every partition to publish", 120, || published(dir.path()) == N_DAYS as i64);
    // A duplicate's executions would start with the first's: a moment is enough to see them.
    std::thread::sleep(Duration::from_secs(2));
    let second = if refused.is_some() { second.wait_with_output().expect("output") } else { stop(second) };
    let runs = executions(dir.path());
    assert_eq!(runs.len(), N_DAYS, "each attempt runs once; the executions were {runs:?}");

    assert!(!second.status.success(), "the second worker named twin was accepted: {:?}", second.status);
    let said = String::from_utf8_lossy(&second.stderr);
    let holder = format!("host {} (pid {})", hostname(), first.id());
    assert!(said.contains("twin") && said.contains(&holder), "the refusal names the other worker ({holder}): {said}");
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM journal WHERE kind = 'worker_joined'"), 1);
    let out = stop(first);
    assert!(out.status.success(), "the first worker: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stop(serve).status.success());
}

/// A worker killed with kill -9 and started again under its name (systemd's `Restart=on-failure`)
/// is refused while the dead one's registration lasts, and accepted once it lapses, one
/// `lease_ttl_s` after its last renewal: a name is never locked for ever.
#[test]
fn a_name_left_by_a_killed_worker_is_taken_again_once_its_registration_lapses() {
    let dir = workspace();
    let mut dead = spawn(dir.path(), &["worker", "--name", "phoenix"]);
    wait_for("the worker to register", 60, || query_i64(dir.path(), "SELECT COUNT(*) FROM workers") == 1);
    let dead_pid = dead.id();
    dead.kill().expect("kill -9 the worker");
    let _ = dead.wait();

    let mut early = spawn(dir.path(), &["worker", "--name", "phoenix"]);
    let refused = exited_within(&mut early, 30);
    let early = if refused.is_some() { early.wait_with_output().expect("output") } else { stop(early) };
    let said = String::from_utf8_lossy(&early.stderr);
    assert!(!early.status.success(), "a restart while the dead registration lasts was accepted: {said}");
    assert!(said.contains(&format!("(pid {dead_pid})")), "the refusal names the dead worker: {said}");

    // lease_ttl_s = 4: within a few restarts the name is free again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let restarted = loop {
        let mut again = spawn(dir.path(), &["worker", "--name", "phoenix"]);
        if exited_within(&mut again, 5).is_none() {
            break again;
        }
        assert!(Instant::now() < deadline, "the name was still refused a minute after its worker died");
        std::thread::sleep(Duration::from_secs(1));
    };
    wait_for("the restarted worker to register", 60, || {
        query_i64(dir.path(), "SELECT COUNT(*) FROM journal WHERE kind = 'worker_joined'") == 2
    });
    let out = stop(restarted);
    assert!(out.status.success(), "the restarted worker: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(query_i64(dir.path(), "SELECT COUNT(*) FROM workers"), 0, "a clean stop frees the name at once");
}
