//! `tidegate serve`: schedules start due work, and SIGTERM stops the process cleanly: the attempt
//! in flight finishes and is published, nothing new starts, the process exits 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tidegate_testkit::TestWorkspace;

use crate::common::{StateDb, state, tidegate};

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

fn count(db: &StateDb, kind: &str) -> i64 {
    db.try_rows("SELECT COUNT(*) FROM journal WHERE kind = ?1", &[kind]).map_or(0, |rows| rows[0][0].int())
}

#[test]
fn serve_runs_what_is_due_and_sigterm_lets_the_attempt_in_flight_finish() {
    let start = (chrono::Utc::now() - chrono::Duration::days(5)).format("%Y-%m-%d").to_string();
    let dir = TestWorkspace::new(spec(&start));
    let serve = tidegate(dir.path())
        .args(["serve", "--tick-every-s", "1"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");

    // Wait until the scheduled attempt is running, then ask the server to stop.
    let db = state(dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&db, "claimed") == 0 {
        assert!(Instant::now() < deadline, "serve never started the due interval");
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

    assert_eq!(count(&db, "claimed"), 1, "exactly one attempt: the newest due day, catch-up being off");
    assert_eq!(count(&db, "published"), 1, "the attempt in flight finished and was published");
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1)).format("%Y-%m-%d").to_string();
    let partition = db.texts("SELECT partition_key FROM release_versions", &[]);
    assert_eq!(partition, [yesterday], "the schedule ran the newest interval that ended");
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

/// Item 7 of issue 22: with `--log-format json`, every line logged while a request is answered
/// carries its request id (the caller's `X-Request-Id`, echoed in the response), and every line
/// of an attempt its run, step and attempt; a publication's line names the run and the step.
#[test]
fn every_log_line_of_a_request_or_an_attempt_names_it() {
    use std::io::{Read as _, Write as _};
    let start = (chrono::Utc::now() - chrono::Duration::days(2)).format("%Y-%m-%d").to_string();
    let dir = TestWorkspace::new(spec(&start));
    let token = crate::common::token_of(dir.path(), "vi");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let log = dir.path().join("serve.log");
    let serve = tidegate(dir.path())
        .args(["serve", "--tick-every-s", "1", "--log-format", "json", "--http", &format!("127.0.0.1:{port}")])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn serve");
    let db = state(dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        assert!(Instant::now() < deadline, "serve never answered and published: {}", read(&log));
        let published = count(&db, "published") > 0;
        if let Ok(mut http) = std::net::TcpStream::connect(("127.0.0.1", port))
            && published
        {
            let request = format!(
                "GET /api/status HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
                 X-Request-Id: req-trace-1\r\nConnection: close\r\n\r\n"
            );
            http.write_all(request.as_bytes()).expect("request");
            let mut answer = String::new();
            http.read_to_string(&mut answer).expect("answer");
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.to_lowercase().contains("x-request-id: req-trace-1"), "the id is echoed: {answer}");
    assert!(Command::new("kill").args(["-TERM", &serve.id().to_string()]).status().expect("kill").success());
    assert!(serve.wait_with_output().expect("serve exits").status.success(), "{}", read(&log));

    let lines: Vec<serde_json::Value> = read(&log).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let with = |message: &str| -> Vec<&serde_json::Value> {
        lines.iter().filter(|l| l["message"] == message || l["fields"]["message"] == message).collect()
    };
    let answered = with("answered");
    assert!(!answered.is_empty(), "one line per answered request: {}", read(&log));
    for line in &answered {
        assert_eq!(line["span"]["request_id"], "req-trace-1", "{line}");
        assert_eq!(line["span"]["path"], "/api/status", "{line}");
    }
    let started = with("attempt started");
    assert!(!started.is_empty(), "{}", read(&log));
    for line in started.iter().chain(&with("attempt staged its output; its checks passed")) {
        let span = &line["span"];
        assert!(span["run_id"].is_string() && span["step_id"].is_string() && span["attempt"] == 1, "{line}");
        assert!(span["step"].as_str().is_some_and(|s| s.starts_with("extract@")), "{line}");
    }
    let published = with("published");
    assert!(!published.is_empty(), "{}", read(&log));
    assert!(published.iter().all(|l| l["run_id"].is_string() && l["step_id"].is_string()), "{published:?}");
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Kills process `pid` if the test fails, so that a failure leaves no server behind.
struct KillOnPanic(u32);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
        }
    }
}

/// Issue 34, item 10: a run submitted by another process to an idle `serve` starts within
/// seconds, not at the next tick (an hour away here), and so does one submitted over HTTP to the
/// serve itself. PostgreSQL announces a submission; on SQLite the serve's watch notices the commit
/// (`PRAGMA data_version`, looked at every 200 ms). On main, SQLite's serve slept until the tick.
#[test]
fn a_run_submitted_to_an_idle_serve_starts_within_seconds_not_at_the_next_tick() {
    let dir = TestWorkspace::new(
        r#"
[project]
name = "prompt_submit"

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64" }]

[tasks.extract]
command = ["sh", "-c", "printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
"#,
    );
    let (code, minted) =
        crate::common::json(dir.path(), &["token", "create", "--name", "op", "--role", "operator", "--json"]);
    assert_eq!(code, 0, "{minted}");
    let token = minted["token"].as_str().expect("a token").to_owned();
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let url = format!("http://127.0.0.1:{port}");
    // `server`: through the serve's own HTTP API instead of the store.
    let submit = |day: &str, server: Option<&str>| -> String {
        let mut cmd = tidegate(dir.path());
        if let Some(url) = server {
            cmd.env_remove("TIDEGATE_SERVER").env("TIDEGATE_TOKEN", &token).args(["--server", url]);
        }
        let out = cmd.args(["submit", "extract", "--partition", day, "--json"]).output().expect("submit");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let submitted: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        submitted["run"]["id"].as_str().expect("a run id").to_owned()
    };
    let count_of = |kind: &str, run_id: &str| {
        state(dir.path())
            .try_rows("SELECT COUNT(*) FROM journal WHERE kind = ?1 AND run_id = ?2", &[kind, run_id])
            .map_or(0, |rows| rows[0][0].int())
    };
    let wait_until_published = |run_id: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while count_of("published", run_id) == 0 {
            assert!(Instant::now() < deadline, "run {run_id} never published");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // The first run is drained by the serve's first turn; then it sleeps until the next tick.
    let first = submit("2024-01-01", None);
    let serve = tidegate(dir.path())
        .args(["serve", "--tick-every-s", "3600", "--http", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let _guard = KillOnPanic(serve.id());
    wait_until_published(&first);

    for (day, server, how) in [("2024-01-02", None, "by `submit`"), ("2024-01-03", Some(url.as_str()), "over HTTP")] {
        // Idle now: its drain ended with nothing left to do.
        std::thread::sleep(Duration::from_secs(1));
        let run_id = submit(day, server);
        let submitted = Instant::now();
        // Generous for a loaded machine; the tick is an hour away.
        while count_of("claimed", &run_id) == 0 {
            assert!(submitted.elapsed() < Duration::from_secs(20), "the run submitted {how} waits for the next tick");
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("the run submitted {how} was claimed {:?} after the submission returned", submitted.elapsed());
        wait_until_published(&run_id);
    }
    assert!(Command::new("kill").args(["-TERM", &serve.id().to_string()]).status().expect("kill").success());
    let out = serve.wait_with_output().expect("serve exits");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
