//! A standby scheduler (issue 23, item 2): two `serve` processes on one PostgreSQL store; one
//! holds the scheduler role, the other waits. Killed with kill -9, the active one is replaced
//! within its lease and the work finishes with no partition published twice. Stopped with SIGSTOP
//! past its lease and resumed, it finds the role taken, steps down (journaled) and publishes
//! nothing more.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidegate_testkit::TestWorkspace;
use tidegate_testkit::delta::commits_per_app_id;
use tidegate_testkit::store::PgSchema;

use crate::common::{ok, table};

const LEASE_TTL_S: u64 = 3;

fn spec(state: &str) -> String {
    format!(
        r#"
[project]
name = "standby_test"
state = "{state}"
lease_ttl_s = {LEASE_TTL_S}
heartbeat_s = 1

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.extract]
command = ["sh", "-c", "sleep 0.4; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 60
"#
    )
}

/// A `serve` process logging to `<name>.log` in the workspace (a pipe nobody reads until the end
/// would fill and stall it).
fn serve(ws: &std::path::Path, name: &str) -> Child {
    let log = std::fs::File::create(ws.join(format!("{name}.log"))).expect("a log file");
    Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(["serve", "--tick-every-s", "1", "--workers", "2"])
        .current_dir(ws)
        .env_remove("TIDEGATE_TOKEN")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn serve")
}

fn signal(child: &Child, signal: &str) {
    assert!(Command::new("kill").args([signal, &child.id().to_string()]).status().expect("kill").success());
}

/// The owner name a `serve` process took the role under (it ends in its pid and a nonce).
fn owner_of(db: &mut postgres::Client, pid: u32) -> Option<String> {
    let rows = db
        .query("SELECT payload::text FROM journal WHERE kind = 'scheduler_acquired' ORDER BY seq", &[])
        .expect("journal");
    rows.iter().map(|r| r.get::<_, String>(0)).find_map(|payload| {
        let v: serde_json::Value = serde_json::from_str(&payload).ok()?;
        let owner = v["owner"].as_str()?.to_owned();
        owner.contains(&format!("-{pid}-")).then_some(owner)
    })
}

fn count(db: &mut postgres::Client, sql: &str, arg: &str) -> i64 {
    db.query_one(sql, &[&arg]).map_or(0, |r| r.get(0))
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

#[test]
fn a_standby_takes_over_a_killed_scheduler_and_a_stopped_one_steps_down() {
    let Some(schema) = PgSchema::create() else { return };
    let dir = TestWorkspace::new(spec(&schema.url));
    let ws = dir.path();
    let mut db = schema.client();
    ok(ws, &["submit", "extract", "--from", "2024-01-01", "--to", "2024-01-16"]);

    let a = serve(ws, "a");
    let a_owner = {
        let mut owner = None;
        wait_until("the first serve takes the role", Duration::from_secs(30), || {
            owner = owner_of(&mut db, a.id());
            owner.is_some()
        });
        owner.expect("owner")
    };
    let b = serve(ws, "b");
    wait_until("the first serve publishes", Duration::from_secs(60), || {
        count(&mut db, "SELECT COUNT(*) FROM journal WHERE kind = 'published' AND actor = $1", &a_owner) >= 2
    });
    assert!(owner_of(&mut db, b.id()).is_none(), "the second serve stands by while the first holds the role");

    // kill -9 the active one: the standby takes over within the lease and finishes the work.
    signal(&a, "-KILL");
    let took = wait_until("the standby takes over", Duration::from_secs(LEASE_TTL_S + 10), || {
        owner_of(&mut db, b.id()).is_some()
    });
    assert!(took <= Duration::from_secs(LEASE_TTL_S + 2), "took over after {took:?}");
    let raw = table(ws, "raw");
    let published_all = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while commits_per_app_id(&raw).len() < n {
            if Instant::now() > deadline {
                let status = crate::common::tidegate(ws).args(["status"]).output().expect("status");
                panic!(
                    "{} of {n} steps published after 90 s; status:\n{}\n{}",
                    commits_per_app_id(&raw).len(),
                    String::from_utf8_lossy(&status.stdout),
                    String::from_utf8_lossy(&status.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    published_all(16);
    let per_step: Vec<usize> = commits_per_app_id(&raw).into_values().collect();
    assert!(per_step.iter().all(|n| *n == 1), "a step published twice: {per_step:?}");

    // SIGSTOP the active one past its lease: the other takes over; resumed, the stopped one steps
    // down and publishes nothing more.
    let c = serve(ws, "c");
    std::thread::sleep(Duration::from_secs(1));
    ok(ws, &["submit", "extract", "--from", "2024-02-01", "--to", "2024-02-08"]);
    let mut running = String::new();
    wait_until("a scheduler starts the new run", Duration::from_secs(30), || {
        running = db
            .query("SELECT actor FROM journal WHERE kind = 'claimed' AND partition_key >= '2024-02' ORDER BY seq", &[])
            .ok()
            .and_then(|rows| rows.first().map(|r| r.get::<_, String>(0)))
            .unwrap_or_default();
        !running.is_empty()
    });
    let (stopped, other) = if running.contains(&format!("-{}-", b.id())) { (&b, &c) } else { (&c, &b) };
    let stopped_owner = running.clone();
    let seq_at_stop: i64 = db.query_one("SELECT COALESCE(MAX(seq), 0) FROM journal", &[]).map_or(0, |r| r.get(0));
    signal(stopped, "-STOP");
    let other_pid = format!("-{}-", other.id());
    wait_until("the other takes over the stopped one", Duration::from_secs(LEASE_TTL_S + 10), || {
        db.query("SELECT payload::text FROM journal WHERE kind = 'scheduler_acquired' AND seq > $1", &[&seq_at_stop])
            .is_ok_and(|rows| rows.iter().any(|r| r.get::<_, String>(0).contains(&other_pid)))
    });
    let published_before =
        count(&mut db, "SELECT COUNT(*) FROM journal WHERE kind = 'published' AND actor = $1", &stopped_owner);
    signal(stopped, "-CONT");
    wait_until("the resumed one steps down", Duration::from_secs(20), || {
        count(
            &mut db,
            "SELECT COUNT(*) FROM journal WHERE kind = 'scheduler_stepped_down' AND actor = $1",
            &stopped_owner,
        ) > 0
    });
    published_all(24);
    assert_eq!(
        count(&mut db, "SELECT COUNT(*) FROM journal WHERE kind = 'published' AND actor = $1", &stopped_owner),
        published_before,
        "the resumed scheduler published after losing the role"
    );
    let per_step: Vec<usize> = commits_per_app_id(&raw).into_values().collect();
    assert!(per_step.iter().all(|n| *n == 1), "a step published twice: {per_step:?}");

    for child in [&b, &c] {
        signal(child, "-TERM");
    }
    for (name, mut child) in [("b", b), ("c", c)] {
        let status = child.wait().expect("exits");
        let log = std::fs::read_to_string(ws.join(format!("{name}.log"))).unwrap_or_default();
        assert!(status.success(), "{name}: {log}");
        assert!(log.contains("stopped cleanly") && !log.contains("panicked"), "{name}: {log}");
    }
    let mut a = a;
    let _ = a.wait();
}

/// A deployment's locations come from the environment (issue 23, item 5): TIDEGATE_STATE and
/// TIDEGATE_LAKE replace the spec's, so a PostgreSQL password never sits in tidegate.toml.
#[test]
fn the_state_store_and_the_lake_can_come_from_the_environment() {
    let Some(schema) = PgSchema::create() else { return };
    let text = spec("unused").replace("state = \"unused\"\n", "");
    let dir = TestWorkspace::new(text);
    let ws = dir.path();
    let lake = tempfile::tempdir().expect("a lake folder");
    let run = |args: &[&str]| {
        let out = crate::common::tidegate(ws)
            .env("TIDEGATE_STATE", &schema.url)
            .env("TIDEGATE_LAKE", lake.path())
            .args(args)
            .output()
            .expect("runs");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8")
    };
    run(&["run", "extract", "--partition", "2024-01-01"]);
    let status: serde_json::Value = serde_json::from_str(&run(&["status", "--json"])).expect("status JSON");
    assert!(status["state"].as_str().is_some_and(|s| s.starts_with("postgres://")), "{status}");
    assert!(lake.path().join("raw/_delta_log").is_dir(), "the table is in the lake the environment names");
    assert!(!ws.join(".tidegate/lake").exists() && !ws.join(".tidegate/state.db").exists(), "nothing local");
    let mut db = schema.client();
    assert_eq!(count(&mut db, "SELECT COUNT(*) FROM journal WHERE kind = $1", "published"), 1);
}

/// A running `serve` leaves the scheduler role free between ticks, so a backfill's publication
/// (which takes the role to publish) goes ahead beside it instead of waiting out two lease times
/// and failing.
#[test]
fn a_backfill_publishes_beside_a_running_serve() {
    let dir = TestWorkspace::new(format!("[project]\nname = \"beside\"\n{}", crate::common::EXTRACT_SUMMARIZE));
    let ws = dir.path();
    ok(ws, &["run", "summarize", "--partition", "2024-01-01"]);
    let serve = serve(ws, "serve");
    std::thread::sleep(Duration::from_secs(1));
    let plan = ok(
        ws,
        &[
            "backfill",
            "plan",
            "summarize",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-01",
            "--reprocess",
            "all",
            "--reason",
            "recount",
            "--json",
        ],
    );
    let id =
        serde_json::from_str::<serde_json::Value>(&plan).expect("plan JSON")["id"].as_str().expect("id").to_owned();
    ok(ws, &["backfill", "start", &id]);
    ok(ws, &["backfill", "compare", &id]);
    let token = crate::common::token_of(ws, "bo");
    let approve = crate::common::tidegate(ws)
        .env("TIDEGATE_TOKEN", &token)
        .args(["backfill", "approve", &id, "--comparison", &crate::common::comparison_of(ws, &id)])
        .output();
    assert!(approve.expect("runs").status.success(), "approved by a second person");
    let started = Instant::now();
    ok(ws, &["backfill", "publish", &id]);
    assert!(started.elapsed() < Duration::from_secs(20), "publish waited {:?} for the role", started.elapsed());
    signal(&serve, "-TERM");
    let mut serve = serve;
    assert!(serve.wait().expect("serve exits").success());
}
