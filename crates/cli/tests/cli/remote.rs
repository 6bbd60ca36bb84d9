//! `tidegate --server URL`: the CLI acting on a `tidegate serve --http` process over HTTP, from
//! a folder that holds no workspace (so nothing can happen on local files). Two people with
//! their own tokens take a backfill from plan to rollback; the output is the local commands'
//! output; refusals carry the server's words; a command with no route refuses to run.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common;

const SPEC: &str = r#"
[project]
name = "remote_test"
lease_ttl_s = 5
heartbeat_s = 1

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64", nullable = false }, { name = "day", type = "string" }, { name = "v", type = "int64" }]

[datasets.summary]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.extract]
command = ["sh", "-c", "printf 'id,day,v\n1,%s,10\n2,%s,20\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 60

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n, {TOTAL} AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
timeout_s = 60
"#;

/// `tidegate serve --http 127.0.0.1:PORT --no-scheduler` on a workspace, killed on drop.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start(dir: &Path) -> Serve {
        // A free port: bind one, let it go, hand it to the server.
        let port = TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port();
        let log = std::fs::File::create(dir.join("serve.log")).expect("the server's log");
        let child = common::tidegate(dir)
            .args(["serve", "--http", &format!("127.0.0.1:{port}"), "--no-scheduler"])
            .stdout(Stdio::from(log.try_clone().expect("the log again")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("serve starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "serve never listened: {}", server_log(dir));
            std::thread::sleep(Duration::from_millis(100));
        }
        Serve { child, url: format!("http://127.0.0.1:{port}") }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
}

/// A token minted in the server's workspace by its admin (the OS account).
fn mint(dir: &Path, name: &str, role: &str) -> String {
    let (code, minted) = common::json(dir, &["token", "create", "--name", name, "--role", role, "--json"]);
    assert_eq!(code, 0, "{minted}");
    minted["token"].as_str().expect("a token").to_owned()
}

/// `tidegate --server URL ARGS` in `here` with `token` in `TIDEGATE_TOKEN`.
fn remote(here: &Path, url: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd: Command = common::tidegate(here);
    cmd.env_remove("TIDEGATE_SERVER").env_remove("TIDEGATE_TOKEN_FILE").args(["--server", url]).args(args);
    if let Some(token) = token {
        cmd.env("TIDEGATE_TOKEN", token);
    }
    cmd.output().expect("tidegate runs")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8")
}

fn refused(out: &Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(1), "{what} should be refused: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8(out.stderr.clone()).expect("utf-8")
}

fn json_of(out: &Output, what: &str) -> Value {
    serde_json::from_str(&ok(out, what)).expect("JSON")
}

/// A workspace with `summary` published for two days, then a fix to its code, served.
fn served() -> (TestWorkspace, Serve) {
    let dir = TestWorkspace::new(SPEC.replace("{TOTAL}", "SUM(v)"));
    common::ok(dir.path(), &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02"]);
    dir.set_spec(SPEC.replace("{TOTAL}", "SUM(v) * 2"));
    let serve = Serve::start(dir.path());
    (dir, serve)
}

#[test]
fn two_people_take_a_backfill_from_plan_to_rollback_through_a_server_from_a_folder_without_a_workspace() {
    let (dir, serve) = served();
    let ana = mint(dir.path(), "ana", "operator");
    let ana_approver = mint(dir.path(), "ana", "approver");
    let bo = mint(dir.path(), "bo", "approver");
    let bo_file = dir.path().join("bo.token");
    std::fs::write(&bo_file, format!("{bo}\n")).expect("bo's token file");
    let elsewhere = tempfile::tempdir().expect("a folder without a workspace");
    let (here, url) = (elsewhere.path(), serve.url.as_str());
    let totals = |token: &str| {
        let sql = "SELECT tg_partition, total FROM summary ORDER BY tg_partition";
        json_of(&remote(here, url, Some(token), &["sql", sql, "--json"]), "sql")
    };
    assert_eq!(
        totals(&bo),
        serde_json::json!([{ "tg_partition": "2024-01-01", "total": 30 }, { "tg_partition": "2024-01-02", "total": 30 }])
    );

    let plan = ["backfill", "plan", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--reprocess", "all"];
    let planned = json_of(
        &remote(here, url, Some(&ana), &[&plan[..], &["--reason", "total was half of the truth", "--json"]].concat()),
        "plan",
    );
    let id = planned["id"].as_str().expect("an id").to_owned();
    assert_eq!(planned["spec"]["requester"], "ana");

    // Start waits for the server's workers, as the local command waits for its own.
    let started = ok(&remote(here, url, Some(&ana), &["backfill", "start", &id]), "start");
    assert!(started.contains(&format!("Backfill {id} is staged")), "{started}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let report = json_of(&remote(here, url, Some(&bo), &["backfill", "status", &id, "--json"]), "status");
        if report["status"] == "staged" {
            break;
        }
        assert!(Instant::now() < deadline, "never staged: {report}\n{}", server_log(dir.path()));
        std::thread::sleep(Duration::from_millis(200));
    }
    let compared = ok(&remote(here, url, Some(&ana), &["backfill", "compare", &id]), "compare");
    assert!(compared.contains(&format!("Comparison of backfill {id}")), "{compared}");
    assert!(compared.contains("someone other than ana"), "{compared}");
    // The approver names the comparison they reviewed, as the server's status shows it.
    let reviewed = json_of(&remote(here, url, Some(&bo), &["backfill", "status", &id, "--json"]), "status");
    let reviewed = reviewed["comparison_hash"].as_str().expect("a recorded comparison").to_owned();

    // An operator may not approve; the requester under an approver's token may not approve their own.
    let as_operator = refused(
        &remote(here, url, Some(&ana), &["backfill", "approve", &id, "--comparison", &reviewed]),
        "approve by an operator",
    );
    assert!(as_operator.starts_with("error: "), "{as_operator}");
    let own = refused(
        &remote(here, url, Some(&ana_approver), &["backfill", "approve", &id, "--comparison", &reviewed]),
        "self-approval",
    );
    assert!(own.contains("cannot also approve it"), "{own}");

    let mut by_bo = common::tidegate(here);
    by_bo.env_remove("TIDEGATE_SERVER").args(["--server", url, "--token-file"]).arg(&bo_file);
    let approved = ok(
        &by_bo.args(["backfill", "approve", &id, "--comparison", &reviewed]).output().expect("runs"),
        "approve by bo",
    );
    assert!(approved.contains(&format!("Backfill {id} approved by bo")), "{approved}");

    let published = ok(&remote(here, url, Some(&ana), &["backfill", "publish", &id]), "publish");
    assert!(published.contains(&format!("Published backfill {id} as release")), "{published}");
    assert_eq!(totals(&bo)[0]["total"], 60);
    let listed = ok(&remote(here, url, Some(&bo), &["backfill", "list"]), "list");
    assert!(listed.contains(&id) && listed.contains("published"), "{listed}");

    let rolled =
        ok(&remote(here, url, Some(&ana), &["backfill", "rollback", &id, "--reason", "dashboards broke"]), "rollback");
    assert!(rolled.contains(&format!("Rolled back backfill {id} as release")), "{rolled}");
    assert_eq!(totals(&bo)[0]["total"], 30);

    // The journal tells the story, verified, with who did what.
    let history = ok(&remote(here, url, Some(&bo), &["history"]), "history");
    assert!(history.contains("hash chain verified intact"), "{history}");
    assert!(history.contains("backfill_approved") && history.contains(" bo "), "{history}");
    assert!(!here.join("tidegate.toml").exists() && !here.join(".tidegate").exists(), "nothing was made here");
}

#[test]
fn remote_output_is_the_local_output_and_refusals_say_why() {
    let (dir, serve) = served();
    let ana = mint(dir.path(), "ana", "operator");
    let viewer = mint(dir.path(), "vi", "viewer");
    let elsewhere = tempfile::tempdir().expect("a folder without a workspace");
    let (here, url) = (elsewhere.path(), serve.url.as_str());

    // The same status, locally and through the server.
    let local =
        json_of(&common::tidegate(dir.path()).args(["status", "--json"]).output().expect("runs"), "local status");
    let over_http = json_of(&remote(here, url, Some(&ana), &["status", "--json"]), "remote status");
    assert_eq!(over_http["runs"], local["runs"]);
    assert_eq!(keys(&over_http), keys(&local));
    let human_local = common::ok(dir.path(), &["status"]);
    let human_remote = ok(&remote(here, url, Some(&ana), &["status"]), "remote status");
    assert_eq!(human_remote, human_local);

    // Submit and cancel over HTTP; a retried submit with the same key creates nothing new.
    let submit = ["submit", "summarize", "--partition", "2024-01-03", "--idempotency-key", "jan-3", "--json"];
    let first = json_of(&remote(here, url, Some(&ana), &submit), "submit");
    let again = json_of(&remote(here, url, Some(&ana), &submit), "submit again");
    assert_eq!(first["run"]["id"], again["run"]["id"]);
    let run = first["run"]["id"].as_str().expect("a run id");
    let cancelled = ok(&remote(here, url, Some(&ana), &["cancel", run]), "cancel");
    assert!(cancelled.starts_with(&format!("Cancelled run {run}")), "{cancelled}");

    // A refusal: the server's words, exit status 1, as locally.
    let unknown = refused(&remote(here, url, Some(&ana), &["backfill", "status", "bf-nope"]), "an unknown backfill");
    let local_unknown = refused(
        &common::tidegate(dir.path()).args(["backfill", "status", "bf-nope"]).output().expect("runs"),
        "locally",
    );
    assert_eq!(unknown, local_unknown);
    let forbidden = refused(&remote(here, url, Some(&viewer), &["cancel", run]), "a viewer cancelling");
    assert!(forbidden.contains("viewer"), "{forbidden}");

    // No token, a bad token, no server there.
    let none = refused(&remote(here, url, None, &["status"]), "no token");
    assert!(none.contains("needs a token") && none.contains("TIDEGATE_TOKEN"), "{none}");
    let bogus = refused(&remote(here, url, Some("tgt_not-a-token"), &["status"]), "a bad token");
    assert!(bogus.contains("refused the token from TIDEGATE_TOKEN"), "{bogus}");

    // A command without a route refuses instead of acting on local files.
    let run_here =
        refused(&remote(dir.path(), url, Some(&ana), &["run", "summarize", "--partition", "2024-01-04"]), "run");
    assert!(run_here.contains("`tidegate run` runs on local files only") && run_here.contains("submit"), "{run_here}");
    let latest = refused(&remote(here, url, Some(&ana), &["rollback", "summary"]), "rollback DATASET");
    assert!(latest.contains("--run RUN"), "{latest}");
    // TIDEGATE_SERVER is --server's default.
    let by_env =
        common::tidegate(here).env("TIDEGATE_SERVER", url).env("TIDEGATE_TOKEN", &ana).args(["status"]).output();
    assert_eq!(ok(&by_env.expect("runs"), "status by TIDEGATE_SERVER"), common::ok(dir.path(), &["status"]));
}

/// The keys of a JSON object, and of its objects, recursively (the shape, not the values).
fn keys(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Value::Object(map) = value {
        for (k, v) in map {
            out.push(k.clone());
            out.extend(keys(v).into_iter().map(|inner| format!("{k}.{inner}")));
        }
    }
    out
}

/// A run is found over HTTP by the first characters of its id, as locally: a unique prefix
/// shows and cancels it, an ambiguous one is refused with the server's words, listing both.
#[test]
fn a_run_is_found_over_http_by_a_unique_prefix() {
    let (dir, serve) = served();
    let ana = mint(dir.path(), "ana", "operator");
    let elsewhere = tempfile::tempdir().expect("a folder without a workspace");
    let (here, url) = (elsewhere.path(), serve.url.as_str());
    let submit = |partition: &str| {
        let run = json_of(
            &remote(here, url, Some(&ana), &["submit", "extract", "--partition", partition, "--json"]),
            "submit",
        );
        run["run"]["id"].as_str().expect("a run id").to_owned()
    };
    let (first, second) = (submit("2024-01-05"), submit("2024-01-06"));
    let alike =
        |a: &str, b: &str| -> String { a.chars().zip(b.chars()).take_while(|(x, y)| x == y).map(|(x, _)| x).collect() };
    let shared = alike(&first, &second);
    // The shortest prefix of the first that begins no other run (the workspace ran one before).
    let (_, status) = common::json(dir.path(), &["status", "--json"]);
    let runs = status["runs"].as_array().expect("runs").iter().filter_map(|r| r["id"].as_str());
    let longest_alike = runs.filter(|id| *id != first).map(|id| alike(&first, id).len()).max().unwrap_or(0);
    let unique = &first[..longest_alike.max(3) + 1];

    let logs = json_of(&remote(here, url, Some(&ana), &["logs", "--run", unique, "--json"]), "logs by a prefix");
    assert_eq!(logs, serde_json::json!([]), "a queued run has no attempts yet");
    let cancelled = ok(&remote(here, url, Some(&ana), &["cancel", unique]), "cancel by a prefix");
    assert!(cancelled.starts_with(&format!("Cancelled run {first}")), "{cancelled}");
    let ambiguous = refused(&remote(here, url, Some(&ana), &["cancel", &shared]), "an ambiguous prefix");
    assert!(ambiguous.contains("begins more than one run id"), "{ambiguous}");
    assert!(ambiguous.contains(&first) && ambiguous.contains(&second), "{ambiguous}");
}

/// A task that fails for 2024-01-05 saying why on stderr, and one that writes a line, waits for
/// a file named `go` in the workspace, then writes another.
const LOGGING: &str = r#"
[project]
name = "remote_logs"

[datasets.out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[datasets.slow_out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "x", type = "int64" }]

[tasks.flaky]
command = ["sh", "-c", "echo starting $TIDEGATE_PARTITION; echo 'the upstream API said no' >&2; exit 3"]
outputs = ["out"]
retry = { attempts = 1 }

[datasets.chatty_out]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.chatty]
command = ["sh", "-c", "yes 'a line of progress' | head -c 2200000 >&2; echo 'THE REAL ERROR' >&2; exit 3"]
outputs = ["chatty_out"]
retry = { attempts = 1 }

[tasks.slow]
command = ["sh", "-c", "echo first; while [ ! -f '{GO}' ]; do sleep 0.1; done; echo second"]
outputs = ["slow_out"]
timeout_s = 120
"#;

/// The newest run's id in the workspace `dir`.
fn newest_run(dir: &Path) -> Option<String> {
    let (_, status) = common::json(dir, &["status", "--json"]);
    status["runs"].as_array()?.first()?["id"].as_str().map(str::to_owned)
}

/// `logs --server` reads a failed step's stderr as text from the server, by run and by step, and
/// the run's listing names the server's routes, not paths on its disk.
#[test]
fn logs_over_a_server_print_a_failed_step_s_stderr_text() {
    let dir = TestWorkspace::new(LOGGING.replace("{GO}", "/nonexistent"));
    let out = common::tidegate(dir.path()).args(["run", "flaky", "--partition", "2024-01-05"]).output().expect("runs");
    assert!(!out.status.success(), "the task fails");
    let run = newest_run(dir.path()).expect("the failed run");
    let serve = Serve::start(dir.path());
    let viewer = mint(dir.path(), "vi", "viewer");
    let elsewhere = tempfile::tempdir().expect("a folder without a workspace");
    let (here, url) = (elsewhere.path(), serve.url.as_str());

    let shown = ok(&remote(here, url, Some(&viewer), &["logs", "--run", &run, "--stderr"]), "logs --run");
    assert!(shown.contains("== flaky@2024-01-05 attempt 1 (failed), stderr"), "{shown}");
    assert!(shown.contains("the upstream API said no") && !shown.contains("starting"), "{shown}");

    let listed = json_of(&remote(here, url, Some(&viewer), &["logs", "--run", &run, "--json"]), "logs --json");
    let text = listed.to_string();
    assert!(!text.contains(&dir.path().display().to_string()), "a path on the server's disk: {text}");
    let step = listed[0]["step_id"].as_str().expect("a step id").to_owned();
    assert_eq!(listed[0]["stderr"], format!("/api/steps/{step}/log?attempt=1&stream=stderr"));

    let by_step = ok(&remote(here, url, Some(&viewer), &["logs", "--step", &step]), "logs --step");
    assert!(by_step.contains("starting 2024-01-05") && by_step.contains("the upstream API said no"), "{by_step}");
    let by_task = refused(&remote(here, url, Some(&viewer), &["logs", "flaky", "2024-01-05"]), "logs TASK PARTITION");
    assert!(by_task.contains("--run RUN") && by_task.contains("--step STEP"), "{by_task}");
}

/// A log longer than one read shows its end over a server, as locally, naming the route of the rest.
#[test]
fn logs_over_a_server_show_a_long_log_s_end() {
    let dir = TestWorkspace::new(LOGGING.replace("{GO}", "/nonexistent"));
    let out = common::tidegate(dir.path()).args(["run", "chatty", "--partition", "2024-01-01"]).output().expect("runs");
    assert!(!out.status.success(), "the task fails");
    let run = newest_run(dir.path()).expect("the failed run");
    let serve = Serve::start(dir.path());
    let viewer = mint(dir.path(), "vi", "viewer");
    let elsewhere = tempfile::tempdir().expect("a folder without a workspace");
    let logs = ok(&remote(elsewhere.path(), &serve.url, Some(&viewer), &["logs", "--run", &run, "--stderr"]), "logs");
    assert!(logs.trim_end().ends_with("THE REAL ERROR"), "the end of the log, where the failure is");
    let flat = logs[..400.min(logs.len())].split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("(the last 1.0 MiB of 2.1 MiB; the whole log is at /api/steps/"), "{flat}");
    assert!(logs.len() < 1_200_000, "about 1 MiB shown, not the whole log");
}

/// `logs --server --follow` prints what the attempt writes while it runs, until its step ends.
#[test]
fn logs_over_a_server_follow_lines_appended_while_the_attempt_runs() {
    use std::io::Read as _;
    let scratch = tempfile::tempdir().expect("a folder for the go file");
    let go = scratch.path().join("go");
    let dir = TestWorkspace::new(LOGGING.replace("{GO}", &go.display().to_string()));
    let serve = Serve::start(dir.path());
    let viewer = mint(dir.path(), "vi", "viewer");
    let running = common::tidegate(dir.path())
        .args(["run", "slow", "--partition", "2024-01-01"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the run starts");
    let elsewhere = tempfile::tempdir().expect("a folder without a workspace");
    let (here, url) = (elsewhere.path(), serve.url.as_str());
    // Once the attempt has written its first line, follow it from elsewhere.
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        if let Some(run) = newest_run(dir.path()) {
            let shown = remote(here, url, Some(&viewer), &["logs", "--run", &run, "--stdout"]);
            if String::from_utf8_lossy(&shown.stdout).contains("first") {
                break run;
            }
        }
        assert!(Instant::now() < deadline, "the attempt never wrote its first line: {}", server_log(dir.path()));
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut follower = common::tidegate(here);
    follower
        .env_remove("TIDEGATE_SERVER")
        .env_remove("TIDEGATE_TOKEN_FILE")
        .env("TIDEGATE_TOKEN", &viewer)
        .args(["--server", url, "logs", "--run", &run, "--stdout", "--follow"])
        .stdout(Stdio::piped());
    let mut follower = follower.spawn().expect("the follower starts");
    let mut stdout = follower.stdout.take().expect("its stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).expect("the follower's output");
        text
    });
    // The follower is following (it printed the first line) before the second is written.
    std::thread::sleep(Duration::from_secs(2));
    assert!(follower.try_wait().expect("the follower").is_none(), "the follower stopped before the step ended");
    std::fs::write(&go, "").expect("the go file");
    assert!(running.wait_with_output().expect("the run ends").status.success());
    let status = follower.wait().expect("the follower ends");
    let text = reader.join().expect("the reader");
    assert!(status.success(), "{text}");
    let (first, second) = (text.find("first"), text.find("second"));
    assert!(first.is_some() && first < second, "first, then second, in one follow: {text}");
}

/// `pause`, `pauses` and `resume` over HTTP print what they print locally and refuse alike.
#[test]
fn pauses_over_http_are_the_local_ones() {
    let (dir, serve) = served();
    let ana = mint(dir.path(), "ana", "operator");
    let elsewhere = tempfile::tempdir().expect("a folder without a workspace");
    let (here, url) = (elsewhere.path(), serve.url.as_str());

    let paused = json_of(
        &remote(here, url, Some(&ana), &["pause", "task:summarize", "--reason", "numbers off", "--json"]),
        "pause",
    );
    assert_eq!((paused["what"].as_str(), paused["actor"].as_str()), (Some("task:summarize"), Some("ana")));
    let listed_remote = ok(&remote(here, url, Some(&ana), &["pauses"]), "remote pauses");
    assert_eq!(listed_remote, common::ok(dir.path(), &["pauses"]));
    assert!(listed_remote.contains("task:summarize: paused by ana"), "{listed_remote}");
    let twice = refused(&remote(here, url, Some(&ana), &["pause", "task:summarize", "--reason", "x"]), "twice");
    assert!(twice.contains("paused already"), "{twice}");
    let resumed = ok(&remote(here, url, Some(&ana), &["resume", "task:summarize", "--reason", "fine"]), "resume");
    assert!(resumed.starts_with("Resumed task:summarize"), "{resumed}");
    let again = refused(&remote(here, url, Some(&ana), &["resume", "task:summarize", "--reason", "x"]), "again");
    assert!(again.contains("is not paused"), "{again}");
}
