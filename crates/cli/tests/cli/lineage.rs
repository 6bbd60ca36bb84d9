//! OpenLineage, end to end with the real binary: every step attempt, run and backfill gets a START
//! and a COMPLETE, FAIL or ABORT event with its parent, the Delta versions it read and wrote, and
//! no secret; every event validates against the official OpenLineage schemas (vendored in
//! `tests/fixtures/openlineage`, checked with Python `jsonschema`); the HTTP transport delivers to
//! a receiver, and one that was down gets every event once it is back.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common;

/// A secret's value that must never reach an event, whatever the task does with it.
const CANARY: &str = "canary-7f3a9c1e55d04b2b";

const SPEC: &str = r#"
[project]
name = "lineage_test"

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[datasets.summary]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[datasets.broken_out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.extract]
command = ["sh", "-c", "if [ \"$TIDEGATE_ATTEMPT\" -lt 2 ]; then exit 75; fi; printf 'id,day,v\n1,%s,10\n2,%s,20\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
retry = { attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n, SUM(v) AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]

[tasks.broken]
command = ["sh", "-c", "echo \"login refused for $CANARY_TOKEN\" >&2; exit 65"]
outputs = ["broken_out"]
secrets = ["CANARY_TOKEN"]
"#;

fn tidegate(dir: &Path) -> Command {
    let mut cmd = common::tidegate(dir);
    cmd.env("CANARY_TOKEN", CANARY).env("TEST_LINEAGE_KEY", "key-for-the-receiver");
    cmd
}

/// Runs `tidegate ARGS --json`; returns its exit code and output.
fn json(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = tidegate(dir).args(args).arg("--json").output().expect("tidegate runs");
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), value)
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

fn event_file(dir: &Path) -> PathBuf {
    dir.join(".tidegate/openlineage.jsonl")
}

/// Validates every line of `files` against the vendored OpenLineage schemas and Tidegate's facet.
fn validate(files: &[&Path]) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ready = Command::new("python3")
        .args(["-c", "import jsonschema, referencing, rfc3339_validator, rfc3986_validator"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        tidegate_testkit::service_missing(
            "the OpenLineage schema validation",
            "Python jsonschema with rfc3339-validator and rfc3986-validator",
        );
        return;
    }
    let out = Command::new("python3")
        .arg(manifest.join("tests/fixtures/openlineage/validate.py"))
        .arg(manifest.join("../../docs/openlineage/TidegateRunFacet.json"))
        .args(files)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "events invalid against the OpenLineage schemas:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The events of one job, as `(eventType, runId)`.
fn of_job<'a>(events: &'a [Value], job: &str) -> Vec<(&'a str, &'a str)> {
    events
        .iter()
        .filter(|e| e["job"]["name"] == job)
        .map(|e| (e["eventType"].as_str().unwrap_or_default(), e["run"]["runId"].as_str().unwrap_or_default()))
        .collect()
}

/// `(dataset name in the spec, Delta version)` of an event's inputs or outputs.
fn versions(event: &Value, side: &str) -> Vec<(String, Option<String>)> {
    event[side]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|d| {
            let name = d["facets"]["symlinks"]["identifiers"][0]["name"].as_str().unwrap_or_default().to_owned();
            (name, d["facets"]["version"]["datasetVersion"].as_str().map(str::to_owned))
        })
        .collect()
}

fn find<'a>(events: &'a [Value], event_type: &str, job: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["eventType"] == event_type && e["job"]["name"] == job)
        .unwrap_or_else(|| panic!("no {event_type} event of {job}"))
}

#[test]
fn attempts_runs_retries_and_failures_emit_valid_events_with_parents_versions_and_no_secret() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    let (code, done) = json(ws, &["run", "summarize", "--partition", "2024-01-02"]);
    assert_eq!(code, 0, "{done}");
    assert_eq!(done["summary"]["retried"], 1, "{done}");
    let (code, failed) = json(ws, &["run", "broken", "--partition", "2024-01-02"]);
    assert_eq!(code, 1, "{failed}");
    let events = lines(&event_file(ws));
    validate(&[&event_file(ws)]);

    // The transient failure: START and FAIL for attempt 1, START and COMPLETE for attempt 2.
    let extract = of_job(&events, "extract");
    let kinds: Vec<&str> = extract.iter().map(|e| e.0).collect();
    assert_eq!(kinds, ["START", "FAIL", "START", "COMPLETE"], "{extract:?}");
    assert_eq!(extract[0].1, extract[1].1, "one run id per attempt");
    assert_eq!(extract[2].1, extract[3].1);
    assert_ne!(extract[0].1, extract[2].1, "each attempt is its own run");
    let fail = find(&events, "FAIL", "extract");
    assert!(fail["run"]["facets"]["errorMessage"]["message"].as_str().is_some_and(|m| m.contains("75")), "{fail}");
    assert_eq!(fail["run"]["facets"]["tidegate"]["attempt"], 1);
    assert_eq!(fail["run"]["facets"]["nominalTime"]["nominalStartTime"], "2024-01-02T00:00:00.000Z");

    // What summarize read is what extract published; what it wrote has its version too.
    let extracted = find(&events, "COMPLETE", "extract");
    let raw = versions(extracted, "outputs");
    assert!(matches!(raw.as_slice(), [(name, Some(_))] if name == "raw"), "{raw:?}");
    let summarized = find(&events, "COMPLETE", "summarize");
    assert_eq!(versions(summarized, "inputs"), raw);
    let summary = versions(summarized, "outputs");
    assert!(matches!(summary.as_slice(), [(name, Some(_))] if name == "summary"), "{summary:?}");
    assert!(summarized["run"]["facets"]["tidegate"]["codeVersion"].is_string(), "{summarized}");
    assert!(summarized["run"]["facets"]["tidegate"]["releaseId"].is_string(), "{summarized}");

    // Each attempt's parent is its run, which starts first and completes last.
    let run_id = done["run_id"].as_str().expect("a run id");
    let run_events: Vec<(&str, &str)> = of_job(&events, "run.summarize");
    assert_eq!(run_events, [("START", run_id), ("COMPLETE", run_id)]);
    for e in events.iter().filter(|e| ["extract", "summarize"].contains(&e["job"]["name"].as_str().unwrap_or_default()))
    {
        assert_eq!(e["run"]["facets"]["parent"]["run"]["runId"], run_id, "{e}");
        assert_eq!(e["run"]["facets"]["parent"]["job"]["name"], "run.summarize", "{e}");
    }
    let position = |t: &str, job: &str| events.iter().position(|e| e["eventType"] == t && e["job"]["name"] == job);
    assert!(position("START", "run.summarize") < position("START", "extract"));
    assert!(position("COMPLETE", "summarize") < position("COMPLETE", "run.summarize"));

    // The deterministic failure: one attempt, START and FAIL; its run fails.
    assert_eq!(of_job(&events, "broken").iter().map(|e| e.0).collect::<Vec<_>>(), ["START", "FAIL"]);
    let broken = find(&events, "FAIL", "broken");
    let message = broken["run"]["facets"]["errorMessage"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("exited with code 65") && message.contains("***"), "the secret was redacted: {message}");
    assert_eq!(of_job(&events, "run.broken").iter().map(|e| e.0).collect::<Vec<_>>(), ["START", "FAIL"]);
    let text = std::fs::read_to_string(event_file(ws)).expect("events");
    assert!(!text.contains(CANARY), "a declared secret reached a lineage event");

    // Exporting again sends nothing twice: each transport's cursor is past what it took.
    let (code, again) = json(ws, &["run", "summarize", "--partition", "2024-01-03"]);
    assert_eq!(code, 0, "{again}");
    assert_eq!(again["lineage"]["transports"][0]["pending"], Value::Null, "{again}");
    let after = lines(&event_file(ws));
    let mut seen = std::collections::BTreeSet::new();
    for e in &after {
        let key = (e["run"]["runId"].to_string(), e["eventType"].to_string());
        assert!(seen.insert(key), "sent twice: {e}");
    }
    assert!(after.len() > events.len());
}

#[test]
fn a_backfill_is_the_parent_of_its_run_and_publishes_and_rolls_back_named_versions() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    let (code, out) = json(ws, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    assert_eq!(code, 0, "{out}");
    let spec = std::fs::read_to_string(ws.join("tidegate.toml")).expect("spec");
    std::fs::write(ws.join("tidegate.toml"), spec.replace("SUM(v) AS total", "SUM(v) * 2 AS total")).expect("spec");
    let args = ["backfill", "plan", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--reprocess", "all"];
    let (code, planned) = json(ws, &[&args[..], &["--reason", "total doubled"]].concat());
    assert_eq!(code, 0, "{planned}");
    let id = planned["id"].as_str().expect("an id").to_owned();
    assert_eq!(json(ws, &["backfill", "start", &id]).0, 0);
    assert_eq!(json(ws, &["backfill", "compare", &id]).0, 0);
    let approve = tidegate(ws)
        .env("TIDEGATE_TOKEN", common::token_of(ws, "reviewer"))
        .args(["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)])
        .output()
        .expect("runs");
    assert!(approve.status.success(), "{}", String::from_utf8_lossy(&approve.stderr));
    let (code, published) = json(ws, &["backfill", "publish", &id]);
    assert_eq!(code, 0, "{published}");
    assert_eq!(published["lineage"]["transports"][0]["pending"], Value::Null, "{published}");
    assert_eq!(json(ws, &["backfill", "rollback", &id]).0, 0);
    let events = lines(&event_file(ws));
    validate(&[&event_file(ws)]);

    let backfill = of_job(&events, "backfill.summarize");
    assert_eq!(backfill.iter().map(|e| e.0).collect::<Vec<_>>(), ["START", "COMPLETE"], "{backfill:?}");
    let backfill_run = backfill[0].1;
    // The backfill's run names it as its parent; its attempts name the run, and the backfill as root.
    let run_start = events
        .iter()
        .find(|e| e["job"]["name"] == "run.summarize" && e["run"]["facets"]["tidegate"]["backfillId"] == id.as_str())
        .expect("the backfill's run started");
    assert_eq!(run_start["run"]["facets"]["parent"]["run"]["runId"], backfill_run, "{run_start}");
    assert_eq!(run_start["run"]["facets"]["parent"]["job"]["name"], "backfill.summarize");
    let backfill_run_id = run_start["run"]["runId"].clone();
    let attempts: Vec<&Value> = events
        .iter()
        .filter(|e| e["job"]["name"] == "summarize" && e["run"]["facets"]["parent"]["run"]["runId"] == backfill_run_id)
        .collect();
    assert_eq!(attempts.len(), 4, "two partitions, START and COMPLETE each: {attempts:?}");
    assert!(attempts.iter().all(|e| e["run"]["facets"]["parent"]["root"]["run"]["runId"] == backfill_run));

    // Its COMPLETE names the versions the release made visible; the rollback, those it restored.
    let complete = find(&events, "COMPLETE", "backfill.summarize");
    let table_version = published["publication"]["items"][0]["table_version"].as_u64().expect("a version");
    assert_eq!(versions(complete, "outputs"), [("summary".to_owned(), Some(table_version.to_string()))]);
    assert_eq!(versions(complete, "inputs").first().map(|v| v.0.as_str()), Some("raw"), "{complete}");
    let rollback = find(&events, "COMPLETE", "rollback");
    assert_eq!(rollback["run"]["facets"]["parent"]["run"]["runId"], backfill_run);
    assert_eq!(versions(rollback, "outputs"), [("summary".to_owned(), Some((table_version + 1).to_string()))]);
    assert_eq!(of_job(&events, "rollback").iter().map(|e| e.0).collect::<Vec<_>>(), ["START", "COMPLETE"]);
}

/// A port nothing listens on (yet).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// The stand-in receiver on `port`, logging to `log`; killed on drop.
struct Receiver(Child);

impl Receiver {
    fn start(port: u16, log: &Path, dir: &Path) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openlineage/receiver.py");
        let output = std::fs::File::create(dir.join("receiver.out")).expect("the receiver's own log");
        let child = Command::new("python3")
            .arg(script)
            .arg(port.to_string())
            .arg(log)
            .stdout(Stdio::null())
            .stderr(output)
            .spawn()
            .expect("python3 starts the receiver");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the receiver never listened on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Receiver(child)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_http_receiver_gets_every_event_even_those_emitted_while_it_was_down() {
    let port = free_port();
    let spec = format!("{SPEC}\n[lineage]\nurl = \"http://127.0.0.1:{port}\"\napi_key_env = \"TEST_LINEAGE_KEY\"\n");
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();

    // The receiver is down: publication succeeds anyway, and the events wait (the file has them).
    let (code, down) = json(ws, &["run", "extract", "--partition", "2024-01-01"]);
    assert_eq!(code, 0, "{down}");
    assert_eq!(down["summary"]["published"], 1, "{down}");
    let http = &down["lineage"]["transports"][1];
    assert_eq!(http["transport"], "http", "{down}");
    assert!(http["pending"].is_string() && http["n_events"] == 0, "{down}");
    assert_eq!(down["lineage"]["transports"][0]["pending"], Value::Null, "the file is its own transport: {down}");

    // Back up: the next export delivers what waited, then the new run's events, once each.
    let log = ws.join("received.jsonl");
    let receiver = Receiver::start(port, &log, ws);
    let (code, up) = json(ws, &["run", "extract", "--partition", "2024-01-02"]);
    assert_eq!(code, 0, "{up}");
    assert_eq!(up["lineage"]["transports"][1]["pending"], Value::Null, "{up}");
    drop(receiver);
    let received = lines(&log);
    assert!(received.iter().all(|r| r["path"] == "/api/v1/lineage"), "{received:?}");
    assert!(received.iter().all(|r| r["authorization"] == "Bearer key-for-the-receiver"));
    let bodies: Vec<Value> = received.iter().map(|r| r["body"].clone()).collect();
    assert_eq!(bodies, lines(&event_file(ws)), "the receiver got what the file has, in order, once");
    let run_ids: BTreeMap<&str, usize> =
        bodies.iter().filter(|e| e["job"]["name"] == "run.extract").fold(BTreeMap::new(), |mut m, e| {
            *m.entry(e["run"]["runId"].as_str().unwrap_or_default()).or_default() += 1;
            m
        });
    assert_eq!(run_ids.len(), 2, "both runs, the one emitted while it was down included: {run_ids:?}");
    let bodies_file = ws.join("received-bodies.jsonl");
    let text: String = bodies.iter().map(|b| format!("{b}\n")).collect();
    std::fs::write(&bodies_file, text).expect("write");
    validate(&[&bodies_file]);
    let all = std::fs::read_to_string(&log).expect("log") + &std::fs::read_to_string(event_file(ws)).expect("events");
    assert!(!all.contains(CANARY));
}

#[test]
fn serve_sends_events_as_work_happens_beside_its_scheduler() {
    let port = free_port();
    let spec = format!("{SPEC}\n[lineage]\nurl = \"http://127.0.0.1:{port}\"\nfile = false\n");
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let log = ws.join("received.jsonl");
    let _receiver = Receiver::start(port, &log, ws);
    let (code, submitted) = json(ws, &["submit", "extract", "--partition", "2024-01-01"]);
    assert_eq!(code, 0, "{submitted}");
    let run_id = submitted["run"]["id"].as_str().expect("a run id").to_owned();
    let stderr = std::fs::File::create(ws.join("serve.log")).expect("serve's log");
    let mut serve = tidegate(ws)
        .args(["serve", "--tick-every-s", "1"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("serve starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let complete = loop {
        let received = lines(&log);
        let done = received.iter().any(|r| {
            r["body"]["eventType"] == "COMPLETE"
                && r["body"]["job"]["name"] == "run.extract"
                && r["body"]["run"]["runId"] == run_id.as_str()
        });
        if done || Instant::now() > deadline {
            break done;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = Command::new("kill").args(["-TERM", &serve.id().to_string()]).status();
    let status = serve.wait().expect("serve stops");
    let serve_log = std::fs::read_to_string(ws.join("serve.log")).unwrap_or_default();
    assert!(complete, "serve never sent the run's COMPLETE; its log:\n{serve_log}");
    assert!(status.success(), "{serve_log}");
    assert!(!ws.join(".tidegate/openlineage.jsonl").exists(), "file = false writes no file");
    let kinds: Vec<String> = lines(&log)
        .iter()
        .filter(|r| r["body"]["job"]["name"] == "extract")
        .map(|r| r["body"]["eventType"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(kinds, ["START", "FAIL", "START", "COMPLETE"], "the retried attempt too");
}
