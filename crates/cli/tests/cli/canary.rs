//! Issue 22, item 8: a canary secret declared in the spec never reaches anything Tidegate writes
//! or answers. Tasks that print the secret (one succeeding, one failing with it in its error) run
//! beside `serve --http --no-scheduler` with JSON logs at debug; then every read route (runs, steps, failures,
//! logs, the journal, releases, status, debt, metrics, the OpenAPI document) is fetched with a
//! token, and every byte under the workspace (the store, the lake, the logs, the OpenLineage
//! file, the server's log) is searched: the canary is nowhere, and the attempt's log shows it
//! was there, masked.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

const CANARY_VAR: &str = "TIDEGATE_CANARY_SECRET";
const CANARY: &str = "canary-7e3b91d04c2a";

fn spec() -> String {
    format!(
        r#"
[project]
name = "canary_test"

[datasets.out]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[datasets.nothing]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.leaky]
command = ["sh", "-c", "echo \"calling the API with ${CANARY_VAR}\"; echo \"key=${CANARY_VAR}\" >&2; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/o.csv\""]
outputs = ["out"]
secrets = ["{CANARY_VAR}"]

[tasks.broken]
command = ["sh", "-c", "echo \"refused: ${CANARY_VAR} is not allowed\" >&2; exit 65"]
outputs = ["nothing"]
secrets = ["{CANARY_VAR}"]
"#
    )
}

fn tidegate(dir: &Path) -> Command {
    let mut cmd = crate::common::tidegate(dir);
    cmd.env(CANARY_VAR, CANARY);
    cmd
}

/// One GET with a bearer token; the whole response, headers and body.
fn get(port: u16, token: &str, path: &str) -> String {
    let mut http = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    http.write_all(request.as_bytes()).expect("request");
    let mut answer = String::new();
    http.read_to_string(&mut answer).expect("answer");
    answer
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[test]
fn a_declared_secret_reaches_no_response_log_metric_lineage_event_or_file() {
    let dir = TestWorkspace::new(spec());
    let ws = dir.path();
    let token = crate::common::token_of(ws, "vi");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
    let serve = tidegate(ws)
        .args(["serve", "--log-format", "json", "--no-scheduler", "--http", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "info,tidegate=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(ws.join("serve.log")).expect("log file"))
        .spawn()
        .expect("serve");
    let leaky = tidegate(ws).args(["run", "leaky", "--partition", "2024-01-01", "--json"]).output().expect("run");
    assert!(leaky.status.success(), "{}", String::from_utf8_lossy(&leaky.stderr));
    let broken = tidegate(ws).args(["run", "broken", "--partition", "2024-01-01"]).output().expect("run");
    assert!(!broken.status.success());
    for out in [&leaky, &broken] {
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains(CANARY), "the command's own output: {text}");
    }

    // Every read route, once the server answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let runs: Value = {
        let answer = get(port, &token, "/api/runs");
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or_default()).expect("runs JSON")
    };
    let mut paths: Vec<String> = [
        "/api/status",
        "/api/debt",
        "/api/runs",
        "/api/releases",
        "/api/backfills",
        "/api/journal",
        "/api/journal/entries?limit=1000",
        "/api/openapi.json",
        "/metrics",
    ]
    .iter()
    .map(|p| (*p).to_owned())
    .collect();
    for run in runs["items"].as_array().expect("runs") {
        let id = run["run"]["id"].as_str().or_else(|| run["id"].as_str()).expect("a run id");
        for tail in ["", "/steps", "/failures", "/logs"] {
            paths.push(format!("/api/runs/{id}{tail}"));
        }
    }
    assert!(paths.len() >= 9 + 8, "both runs' routes: {paths:?}");
    for path in &paths {
        let answer = get(port, &token, path);
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        assert!(!answer.contains(CANARY), "{path} answers the secret: {answer}");
    }
    assert!(Command::new("kill").args(["-TERM", &serve.id().to_string()]).status().expect("kill").success());
    assert!(serve.wait_with_output().expect("serve exits").status.success());

    // Every byte under the workspace: the store, the lake, the logs, lineage, the server's log.
    assert_eq!(files_holding(ws, CANARY.as_bytes()), Vec::<String>::new(), "files holding the secret");
    let masked = files_holding(&ws.join(".tidegate"), b"calling the API with ***");
    assert!(!masked.is_empty(), "the attempt's log shows the secret was printed, masked");
    assert!(std::fs::read_to_string(ws.join(".tidegate/openlineage.jsonl")).is_ok_and(|l| l.lines().count() >= 4));
    assert!(std::fs::read_to_string(ws.join("serve.log")).is_ok_and(|l| l.contains("answered")));
}

/// A task that writes its secret into its data (a column's smallest and largest value): the data
/// is the task's to keep, but the store keeps none of it. The store once held it in each staged
/// file's Delta statistics, beside the column statistics that hide it.
#[test]
fn a_secret_in_a_tasks_data_is_kept_by_no_column_of_the_store() {
    let dir = TestWorkspace::new(format!(
        r#"
[project]
name = "canary_data"

[datasets.tokens]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}, {{ name = "token", type = "string" }}]

[tasks.copy]
command = ["sh", "-c", "printf 'id,token\n1,%s\n' \"${CANARY_VAR}\" > \"$TIDEGATE_OUTPUT_DIR/tokens.csv\""]
outputs = ["tokens"]
secrets = ["{CANARY_VAR}"]
"#
    ));
    let ws = dir.path();
    let out = tidegate(ws).args(["run", "copy", "--partition", "2024-01-01"]).output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let state = crate::common::state(ws);
    let mut held = Vec::new();
    for table in state.tables() {
        for (column, text) in state.text_cells(&table) {
            if text.contains(CANARY) {
                held.push(format!("{table}.{column}"));
            }
        }
    }
    assert_eq!(held, Vec::<String>::new(), "store columns holding the secret");
    let table = crate::common::table(ws, "tokens");
    let adds = crate::common::adds(&table, crate::common::latest_version(&table));
    assert_eq!(adds.len(), 1, "the task's data was published: {adds:?}");
}
