//! Workers that share nothing with the scheduler but PostgreSQL and the object store (issue 23,
//! item 3). A scheduler (`serve --workers 0`) and two `tidegate worker` processes, each in a
//! folder of its own holding only a copy of `tidegate.toml` and each with its own working folder,
//! run a four-day pipeline (a command task, then a SQL task over its output) on PostgreSQL and an
//! `s3://` lake: every partition is published exactly once (counted in the Delta log and read back
//! with Python `deltalake` on the object store), `tidegate logs` from a fourth folder prints what
//! a worker's attempt printed, a secret the task echoes never reaches the log copies in the lake,
//! and a run submitted to the idle cluster starts long before the scheduler's next tick.
//! Needs `TIDEGATE_TEST_POSTGRES_URL`, `TIDEGATE_TEST_S3_URL` (with `AWS_*`) and Python
//! `deltalake`; without them it says it was skipped (and fails under CI).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;
use tidegate_testkit::store::PgSchema;

use crate::common::{ok, tidegate};

const N_DAYS: i64 = 4;
/// The scheduler's tick: long, so that only a wake-up can start a run promptly.
const TICK_S: u64 = 30;
/// What "promptly" means here: far below the tick, with room for a loaded machine.
const STARTS_WITHIN: Duration = Duration::from_secs(5);
/// The secret the extract task echoes; only `***` may reach a log.
const CANARY_VAR: &str = "MACHINES_CANARY";

fn spec(state: &str, lake: &str) -> String {
    format!(
        r#"
[project]
name = "machines"
state = "{state}"
lake = "{lake}"
lease_ttl_s = 10
heartbeat_s = 2

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64", nullable = false }}, {{ name = "day", type = "string" }}]

[datasets.summary]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.extract]
command = ["sh", "-c", "echo \"extracting $TIDEGATE_PARTITION with ${CANARY_VAR}\"; echo \"warming up on $(pwd)\" >&2; printf 'id,day\n1,%s\n2,%s\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
secrets = ["{CANARY_VAR}"]

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
"#
    )
}

/// A long-lived `tidegate` process, killed if the test ends (or fails) before stopping it.
pub(crate) struct Process(pub(crate) Option<Child>);

impl Process {
    pub(crate) fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Stops it with SIGTERM and waits for it to exit.
    pub(crate) fn terminate(mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("running");
        assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill").success());
        child.wait().expect("exits")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A long-lived `tidegate` process in `dir`, logging to `log` (a pipe nobody reads would stall it).
fn spawn(dir: &Path, log: &Path, args: &[&str], canary: &str) -> Process {
    let log = std::fs::File::create(log).expect("a log file");
    Process(Some(
        tidegate(dir).args(args).env(CANARY_VAR, canary).stdout(Stdio::null()).stderr(log).spawn().expect("spawn"),
    ))
}

fn count(db: &mut postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).map_or(-1, |r| r.get(0))
}

pub(crate) fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

/// Reads the lake with Python: every commit's `txn` app ids per table (from the Delta logs),
/// each table's rows through `deltalake`, and the text of every log copy under `_tidegate/logs`.
const READER: &str = r#"
import json, os, sys
from urllib.parse import urlparse
from deltalake import DeltaTable
import pyarrow.fs as pafs

lake = sys.argv[1]
endpoint = os.environ["AWS_ENDPOINT_URL"]
options = {k: os.environ[k] for k in ["AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]}
options["AWS_ALLOW_HTTP"] = "true"
url = urlparse(lake)
fs = pafs.S3FileSystem(endpoint_override=endpoint, access_key=options["AWS_ACCESS_KEY_ID"],
                       secret_key=options["AWS_SECRET_ACCESS_KEY"], region=options["AWS_REGION"])
root = url.netloc + url.path
out = {"app_ids": {}, "rows": {}, "logs": {}}
for table in ["raw", "summary"]:
    counts = {}
    for info in fs.get_file_info(pafs.FileSelector(f"{root}/{table}/_delta_log")):
        if not info.path.endswith(".json"):
            continue
        with fs.open_input_stream(info.path) as f:
            for line in f.read().decode().splitlines():
                app = json.loads(line).get("txn", {}).get("appId")
                if app:
                    counts[app] = counts.get(app, 0) + 1
    out["app_ids"][table] = counts
    rows = DeltaTable(f"{lake}/{table}", storage_options=options).to_pyarrow_table().to_pylist()
    out["rows"][table] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
for info in fs.get_file_info(pafs.FileSelector(f"{root}/_tidegate/logs", recursive=True, allow_not_found=True)):
    if info.type == pafs.FileType.File:
        with fs.open_input_stream(info.path) as f:
            out["logs"][info.path[len(root) + 1:]] = f.read().decode()
print(json.dumps(out, default=str))
sys.stdout.flush()
# deltalake 1.6.6 with pyarrow 26 sometimes aborts in interpreter teardown; skip it.
os._exit(0)
"#;

pub(crate) fn read_lake(lake: &str) -> Value {
    let out = Command::new("python3").args(["-c", READER, lake]).output().expect("python3 runs");
    assert!(out.status.success(), "reading the lake with Python: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the reader prints JSON")
}

pub(crate) fn python_has_deltalake() -> bool {
    Command::new("python3").args(["-c", "import deltalake, pyarrow.fs"]).output().is_ok_and(|o| o.status.success())
}

/// The files under `dir`, relative to it.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path.strip_prefix(dir).expect("inside").to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn workers_on_other_machines_share_only_the_store_and_the_lake() {
    const TEST: &str = "workers_on_other_machines_share_only_the_store_and_the_lake";
    let Ok(base) = std::env::var("TIDEGATE_TEST_S3_URL") else {
        tidegate_testkit::service_missing(TEST, "TIDEGATE_TEST_S3_URL (and AWS_* for the client)");
        return;
    };
    if !python_has_deltalake() {
        tidegate_testkit::service_missing(TEST, "Python deltalake");
        return;
    }
    let Some(schema) = PgSchema::create() else { return };
    let lake = format!("{}/machines-{}", base.trim_end_matches('/'), uuid::Uuid::now_v7());
    let canary = format!("canary-{}", uuid::Uuid::now_v7().simple());
    let text = spec(&schema.url, &lake);
    // Four machines: each holds only its copy of tidegate.toml, and each worker a working folder.
    let [scheduler, one, two, desk] = [(); 4].map(|()| TestWorkspace::new(&text));
    let work = tempfile::tempdir().expect("the workers' own folders");
    let (work_one, work_two) = (work.path().join("one"), work.path().join("two"));
    let logs = tempfile::tempdir().expect("the processes' logs");
    let mut db = schema.client();

    let serve_args = ["serve", "--workers", "0", "--tick-every-s", &TICK_S.to_string()];
    let serve = spawn(scheduler.path(), &logs.path().join("serve.log"), &serve_args, &canary);
    let worker = |ws: &TestWorkspace, name: &str, dir: &Path| {
        let args = ["worker", "--name", name, "--slots", "2", "--work-dir", dir.to_str().expect("utf-8")];
        spawn(ws.path(), &logs.path().join(format!("{name}.log")), &args, &canary)
    };
    let (w1, w2) = (worker(&one, "one", &work_one), worker(&two, "two", &work_two));
    wait_until("both workers register", Duration::from_secs(30), || {
        count(&mut db, "SELECT COUNT(*) FROM workers") == 2
    });
    // The scheduler's first tick found nothing due and gave the role up: it is idle until its
    // next tick, 30 s away, unless a submitted run wakes it.
    wait_until("the scheduler goes idle", Duration::from_secs(30), || {
        count(&mut db, "SELECT COUNT(*) FROM journal WHERE kind = 'scheduler_released'") >= 1
    });

    let submitted = Instant::now();
    let last = format!("2024-01-{N_DAYS:02}");
    ok(desk.path(), &["submit", "summarize", "--from", "2024-01-01", "--to", &last]);
    wait_until("the run starts", Duration::from_secs(TICK_S), || count(&mut db, "SELECT COUNT(*) FROM attempts") > 0);
    let started_after = submitted.elapsed();
    assert!(started_after < STARTS_WITHIN, "the run started {started_after:?} after it was submitted");
    wait_until("every step publishes", Duration::from_secs(60), || {
        count(&mut db, "SELECT COUNT(*) FROM steps WHERE status = 'published'") == 2 * N_DAYS
    });

    // Every attempt ran on a worker, both workers ran some, and each wrote only in its folder.
    assert_eq!(count(&mut db, "SELECT COUNT(*) FROM attempts WHERE worker NOT IN ('one', 'two')"), 0);
    assert_eq!(count(&mut db, "SELECT COUNT(DISTINCT worker) FROM attempts"), 2, "both workers took work");
    for (ws, work_dir) in [(&one, &work_one), (&two, &work_two)] {
        assert!(!ws.path().join(".tidegate").exists(), "a worker with its own folder writes nothing in its workspace");
        assert!(files_under(work_dir).iter().any(|f| f.to_string_lossy().ends_with(".stdout.log")), "local logs");
    }
    assert!(!scheduler.path().join(".tidegate/attempts").exists() && !scheduler.path().join(".tidegate/logs").exists());

    // Published exactly once per step identity, and readable on the object store.
    let read = read_lake(&lake);
    for table in ["raw", "summary"] {
        let per_step = read["app_ids"][table].as_object().expect("app ids");
        assert_eq!(per_step.len() as i64, N_DAYS, "{table}: {per_step:?}");
        assert!(per_step.values().all(|n| n == 1), "{table}: a step published twice: {per_step:?}");
    }
    let summary = read["rows"]["summary"].as_array().expect("summary rows");
    let days: Vec<&str> = summary.iter().filter_map(|r| r["day"].as_str()).collect();
    assert_eq!(days, ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"], "{summary:?}");
    assert!(summary.iter().all(|r| r["n"] == 2), "{summary:?}");
    assert_eq!(read["rows"]["raw"].as_array().map(Vec::len), Some(2 * N_DAYS as usize));

    // The log copies in the lake: one per stream of each extract attempt, the secret masked.
    let copies = read["logs"].as_object().expect("log copies");
    assert!(copies.len() as i64 >= 2 * N_DAYS, "{:?}", copies.keys().collect::<Vec<_>>());
    for (path, text) in copies {
        assert!(!text.as_str().unwrap_or_default().contains(&canary), "{path} holds the secret: {text}");
    }
    assert!(copies.values().any(|t| t.as_str().is_some_and(|t| t.contains("with ***"))), "{copies:?}");

    // `tidegate logs` on a fourth machine reads a worker's attempt from the lake.
    let shown = ok(desk.path(), &["logs", "extract", "2024-01-02"]);
    assert!(shown.contains("extracting 2024-01-02 with ***"), "stdout, masked: {shown}");
    assert!(shown.contains("warming up on"), "stderr: {shown}");
    assert!(!shown.contains(&canary), "{shown}");
    let listed: Value =
        serde_json::from_str(&ok(desk.path(), &["logs", "extract", "2024-01-02", "--json"])).expect("JSON");
    let stdout = listed[0]["stdout"].as_str().expect("a log");
    assert!(stdout.starts_with(&lake) && stdout.ends_with("attempt-1.stdout.log"), "read from the lake: {listed}");
    assert!(!desk.path().join(".tidegate/logs").exists(), "read from the lake, not copied here");

    for (name, process) in [("one", w1), ("two", w2), ("serve", serve)] {
        let status = process.terminate();
        let log = std::fs::read_to_string(logs.path().join(format!("{name}.log"))).unwrap_or_default();
        assert!(status.success() && log.contains("stopped cleanly"), "{name}: {status:?}\n{log}");
        assert!(!log.contains(&canary), "{name}'s own log holds the secret");
    }
}

const FOLLOWED_SPEC: &str = r#"
[project]
name = "followed"

[datasets.out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "x", type = "int64" }]

[tasks.slow]
command = ["sh", "-c", "echo first; sleep 7; echo second"]
outputs = ["out"]

[datasets.other]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "x", type = "int64" }]

[tasks.quick]
command = ["sh", "-c", "echo quick"]
outputs = ["other"]
"#;

/// -1 until the workspace's SQLite store exists.
fn sqlite_count(ws: &Path, sql: &str) -> i64 {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    rusqlite::Connection::open_with_flags(ws.join(".tidegate/state.db"), flags)
        .and_then(|db| db.query_row(sql, [], |r| r.get(0)))
        .unwrap_or(-1)
}

fn stop(process: Process, name: &str, log: &Path) {
    let status = process.terminate();
    assert!(status.success(), "{name}: {status:?}\n{}", std::fs::read_to_string(log).unwrap_or_default());
}

/// `tidegate logs` reads a log where its attempt wrote it when it can (a worker's default folder
/// in the workspace, or `TIDEGATE_WORK_DIR`), else its copy in the lake, and `--follow` follows
/// that copy while the attempt runs on a worker whose folder this machine cannot see.
#[test]
fn logs_are_read_where_the_worker_wrote_them_or_followed_in_the_lake() {
    let dir = TestWorkspace::new(FOLLOWED_SPEC);
    let ws = dir.path();
    let elsewhere = tempfile::tempdir().expect("a worker's folder");
    let logs = tempfile::tempdir().expect("the processes' logs");
    let serve_log = logs.path().join("serve.log");
    let serve = spawn(ws, &serve_log, &["serve", "--workers", "0", "--tick-every-s", "1"], "unused");
    let away_log = logs.path().join("away.log");
    let away_dir = elsewhere.path().to_str().expect("utf-8");
    let away = spawn(ws, &away_log, &["worker", "--name", "away", "--work-dir", away_dir], "unused");
    ok(ws, &["submit", "slow", "--partition", "2024-01-01"]);
    wait_until("the attempt starts", Duration::from_secs(30), || {
        sqlite_count(ws, "SELECT COUNT(*) FROM attempts") == 1
    });

    // Followed from the lake: the first line is copied while the task sleeps, the rest at its end.
    let followed = ok(ws, &["logs", "slow", "2024-01-01", "--stdout", "--follow"]);
    assert!(followed.contains("first") && followed.contains("second"), "{followed}");
    let listed = |env: Option<&str>| -> String {
        let mut cmd = tidegate(ws);
        cmd.args(["logs", "slow", "2024-01-01", "--json"]).env_remove(WORK_DIR_VAR);
        if let Some(dir) = env {
            cmd.env(WORK_DIR_VAR, dir);
        }
        let out = cmd.output().expect("runs");
        let value: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        value[0]["stdout"].as_str().expect("a stdout log").to_owned()
    };
    let copy = listed(None);
    assert!(
        copy.starts_with("file://") && copy.contains("/_tidegate/logs/") && copy.ends_with("/attempt-1.stdout.log"),
        "the lake's copy: {copy}"
    );
    let local = listed(Some(away_dir));
    assert!(local.starts_with(away_dir) && local.ends_with(".attempt-1.stdout.log"), "the worker's own file: {local}");
    stop(away, "away", &away_log);

    // A worker without a folder of its own writes in its folder in the workspace, read from there.
    let here_log = logs.path().join("here.log");
    let here = spawn(ws, &here_log, &["worker", "--name", "here"], "unused");
    ok(ws, &["submit", "quick", "--partition", "2024-01-02"]);
    wait_until("the quick step publishes", Duration::from_secs(30), || {
        sqlite_count(ws, "SELECT COUNT(*) FROM steps WHERE status = 'published'") == 2
    });
    let (code, quick) = crate::common::json(ws, &["logs", "quick", "2024-01-02", "--json"]);
    assert_eq!(code, 0, "{quick}");
    let path = quick[0]["stdout"].as_str().expect("a stdout log");
    assert!(path.starts_with(&ws.join(".tidegate/workers/here/logs").display().to_string()), "{quick}");
    assert!(ok(ws, &["logs", "quick", "2024-01-02"]).contains("quick"));
    stop(here, "here", &here_log);
    stop(serve, "serve", &serve_log);
}

/// The variable naming a worker's folder (see `tidegate worker --help`).
const WORK_DIR_VAR: &str = "TIDEGATE_WORK_DIR";
