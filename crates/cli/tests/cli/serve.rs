//! `tidegate serve`: schedules start due work, and SIGTERM stops the process cleanly: the attempt
//! in flight finishes and is published, nothing new starts, the process exits 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tidegate_testkit::TestWorkspace;

fn spec(start: &str) -> String {
    format!(
        r#"
[project]
name = "serve_test"
lease_ttl_s = 10
heartbeat_s = 1

[datasets.raw]
partitioning = {{ grain = "day", start = "{start}" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.extract]
command = ["sh", "-c", "sleep 1.5; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
schedule = "@daily"
timeout_s = 60
"#
    )
}

fn count(db: &rusqlite::Connection, kind: &str) -> i64 {
    db.query_row("SELECT COUNT(*) FROM journal WHERE kind = ?1", [kind], |r| r.get(0)).unwrap_or(0)
}

#[test]
fn serve_runs_what_is_due_and_sigterm_lets_the_attempt_in_flight_finish() {
    let start = (chrono::Utc::now() - chrono::Duration::days(5)).format("%Y-%m-%d").to_string();
    let dir = TestWorkspace::new(spec(&start));
    let serve = Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(["serve", "--tick-every-s", "1"])
        .current_dir(dir.path())
        .env_remove("TIDEGATE_TOKEN")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");

    // Wait until the scheduled attempt is running, then ask the server to stop.
    let db_path = dir.path().join(".tidegate/state.db");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "serve never started the due interval");
        if let Ok(db) = rusqlite::Connection::open(&db_path)
            && count(&db, "claimed") > 0
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = serve.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let out = serve.wait_with_output().expect("serve exits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "serve exits 0 on SIGTERM: {stderr}");
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
    // Without RUST_LOG, the libraries' info events (a Delta snapshot's, per table read) stay out.
    assert!(!stderr.contains("snap.build") && !stderr.contains("ScanMetadataCompleted"), "{stderr}");

    let db = rusqlite::Connection::open(&db_path).expect("db");
    assert_eq!(count(&db, "claimed"), 1, "exactly one attempt: the newest due day, catch-up being off");
    assert_eq!(count(&db, "published"), 1, "the attempt in flight finished and was published");
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1)).format("%Y-%m-%d").to_string();
    let partition: String =
        db.query_row("SELECT partition_key FROM release_versions", [], |r| r.get(0)).expect("one release item");
    assert_eq!(partition, yesterday, "the schedule ran the newest interval that ended");
}

/// On PostgreSQL, `serve` (scheduling only) and a `worker` (running the attempts) share nothing
/// but the database and the lake; both stop cleanly on SIGTERM. (Both once panicked there: a
/// synchronous PostgreSQL client used, then dropped, on a thread driving async tasks.)
#[test]
fn on_postgresql_serve_and_a_worker_run_the_schedule_and_stop_cleanly_on_sigterm() {
    let Some(schema) = tidegate_testkit::store::PgSchema::create() else { return };
    let start = (chrono::Utc::now() - chrono::Duration::days(3)).format("%Y-%m-%d").to_string();
    let text = spec(&start).replace("lease_ttl_s = 10", &format!("lease_ttl_s = 10\nstate = \"{}\"", schema.url));
    let dir = TestWorkspace::new(text);
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tidegate"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("TIDEGATE_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let serve = spawn(&["serve", "--tick-every-s", "1", "--workers", "0"]);
    let worker = spawn(&["worker", "--slots", "1", "--name", "pg-worker"]);
    let mut db = schema.client();
    let published = |db: &mut postgres::Client| -> i64 {
        db.query_one("SELECT COUNT(*) FROM journal WHERE kind = 'published'", &[]).map_or(0, |row| row.get::<_, i64>(0))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while published(&mut db) == 0 {
        assert!(Instant::now() < deadline, "serve and the worker never published the due interval");
        std::thread::sleep(Duration::from_millis(100));
    }
    for child in [&serve, &worker] {
        assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill").success());
    }
    for (name, child) in [("serve", serve), ("worker", worker)] {
        let out = child.wait_with_output().expect("exits");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name} exits 0 on SIGTERM: {stderr}");
        assert!(stderr.contains("stopped cleanly") && !stderr.contains("panicked"), "{name}: {stderr}");
    }
    let claimed: i64 = db
        .query_one("SELECT COUNT(*) FROM journal WHERE kind = 'claimed' AND payload::text LIKE '%pg-worker%'", &[])
        .map_or(0, |row| row.get(0));
    assert!(claimed >= 1, "the worker ran the attempt, not serve");
    assert_eq!(published(&mut db), 1, "the newest due day, once");
}
