//! A live server on a temp workspace, tokens for people, and a small HTTP client (HTTP/1.1 over a
//! TCP stream, `Connection: close`): what a curl user sees, status, headers and body. Every test
//! workspace comes from [`workspace`]: on the defaults (a SQLite file, a lake folder) in the
//! `server` binary, on a fresh PostgreSQL schema and an `s3://` lake in `server_shared`.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tidegate_app::actor::os_account;
use tidegate_app::workspace::Workspace;
use tidegate_core::actor::Role;
use tidegate_store::Store;
use tidegate_testkit::TestWorkspace;
use tidegate_testkit::store::PgSchema;

/// Two daily datasets: `raw` from a command, `summary` from SQL over it. `{TOTAL}` is replaced by
/// the summary's total expression, so a test can change the code between a run and a backfill.
pub const SPEC: &str = r#"
[project]
name = "server_test"
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

/// The spec with `total` as the summary's total.
pub fn spec(total: &str) -> String {
    SPEC.replace("{TOTAL}", total)
}

/// A test workspace over `spec`, and the PostgreSQL schema it keeps its state in (dropped with it).
pub struct Ws {
    dir: TestWorkspace,
    /// The `state` and `lake` lines its `[project]` gains in `server_shared`.
    placed: Option<(String, PgSchema)>,
}

impl Ws {
    /// Replaces the spec, keeping the workspace where it is (its `state` and `lake`).
    pub fn set_spec(&self, spec: &str) {
        self.dir.set_spec(self.placed.as_ref().map_or_else(|| spec.to_owned(), |(lines, _)| place(spec, lines)));
    }
}

/// `spec` with `lines` at the top of its `[project]` table.
fn place(spec: &str, lines: &str) -> String {
    let text = spec.replacen("[project]\n", &format!("[project]\n{lines}"), 1);
    assert_ne!(text, spec, "a test spec has a [project] table");
    text
}

impl std::ops::Deref for Ws {
    type Target = TestWorkspace;

    fn deref(&self) -> &TestWorkspace {
        &self.dir
    }
}

/// A workspace over `spec`. In `server_shared`, its `[project]` gains `state` (a fresh PostgreSQL
/// schema) and `lake` (an S3 prefix of its own), as a deployment's spec would name them; CI
/// fails when either service is missing, elsewhere the defaults are used after saying so.
pub fn workspace(spec: &str) -> Ws {
    let defaults = || Ws { dir: TestWorkspace::new(spec), placed: None };
    if !crate::SHARED {
        return defaults();
    }
    let Some(s3) = std::env::var("TIDEGATE_TEST_S3_URL").ok().filter(|v| !v.is_empty()) else {
        tidegate_testkit::service_missing("the server suite on S3", "TIDEGATE_TEST_S3_URL (with AWS_*)");
        return defaults();
    };
    let Some(schema) = PgSchema::create() else { return defaults() };
    let lake = format!("{}/{}", s3.trim_end_matches('/'), schema.name());
    let lines = format!("state = \"{}\"\nlake = \"{lake}\"\n", schema.url);
    Ws { dir: TestWorkspace::new(place(spec, &lines)), placed: Some((lines, schema)) }
}

/// A workspace whose `summary` was run and published for 2024-01-01 and 2024-01-02.
pub fn published_workspace() -> Ws {
    let dir = workspace(&spec("SUM(v)"));
    run_live(&dir, "2024-01-01", "2024-01-02", false);
    dir
}

/// Runs `summarize` (with what it reads unless `only`) for `from..=to` in the test's process, as
/// a live run: what a scheduler beside the server would publish. Nothing may fail.
pub fn run_live(dir: &Ws, from: &str, to: &str, only: bool) {
    let (_, (published, failed)) = execute_live(dir, from, to, only);
    assert_eq!(failed, 0, "{published} published");
}

/// [`run_live`] whatever fails: the run's id, and its steps published and failed.
pub fn execute_live(dir: &Ws, from: &str, to: &str, only: bool) -> (String, (usize, usize)) {
    let ws = tidegate_app::workspace::load(Some(dir.path())).expect("the test spec loads");
    let store = ws.open_store().expect("the store opens");
    let actor = os_account();
    let target = tidegate_app::target::Target {
        target: "summarize".to_owned(),
        partitions: tidegate_app::target::Partitions::Range { from: from.to_owned(), to: to.to_owned() },
        only,
        downstream: false,
    };
    let request = tidegate_app::submit::SubmitRequest {
        target,
        idempotency_key: None,
        trigger: tidegate_store::Trigger::Manual,
        priority: tidegate_store::Priority::Live,
    };
    let submitted = tidegate_app::submit::submit(&ws, store.as_ref(), &actor, &request).expect("submitted");
    let summary =
        tidegate_app::run::execute(&ws, store, &actor, 2, None, tidegate_app::run::Scope::Run(&submitted.run.id))
            .expect("the run executes");
    (submitted.run.id, (summary.published, summary.failed))
}

/// A server on 127.0.0.1 (a free port) over a workspace, stopped on drop.
pub struct Server {
    pub addr: SocketAddr,
    pub ws: Arc<Workspace>,
    pub store: Arc<dyn Store>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Server {
    /// Starts a writable server over the workspace in `dir`.
    pub fn start(dir: &TestWorkspace) -> Server {
        Server::start_with(dir, tidegate_server::Options::default())
    }

    /// Starts a server with `options` over the workspace in `dir`.
    pub fn start_with(dir: &TestWorkspace, options: tidegate_server::Options) -> Server {
        Server::start_on(tidegate_app::workspace::load(Some(dir.path())).expect("the workspace loads"), options)
    }

    /// Starts a server with `options` over a loaded workspace (with the clock it was given).
    pub fn start_on(ws: Workspace, options: tidegate_server::Options) -> Server {
        let ws = Arc::new(ws);
        let store = ws.open_store().expect("the store opens");
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let router = tidegate_server::router(ws.clone(), store.clone(), options);
        let listener = runtime
            .block_on(tidegate_server::bind(SocketAddr::from(([127, 0, 0, 1], 0))))
            .expect("binding a free port");
        let addr = listener.local_addr().expect("the bound address");
        runtime.spawn(tidegate_server::serve(listener, router, options, async move {
            let _ = rx.await;
        }));
        Server { addr, ws, store, stop: Some(tx), runtime: Some(runtime) }
    }

    /// A token for `name` with `role`, minted by the workspace's admin (the OS account).
    pub fn token(&self, name: &str, role: Role) -> String {
        tidegate_app::token::mint(&self.ws, self.store.as_ref(), &os_account(), name, role, 1).expect("minted").token
    }

    /// `method path` with `token` and a JSON `body`.
    pub fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Response {
        request(self.addr, method, path, token, body)
    }

    /// `method path` with `token`, `Idempotency-Key: key` and a JSON `body`.
    pub fn call_keyed(&self, method: &str, path: &str, token: &str, key: &str, body: Option<&Value>) -> Response {
        request_with(self.addr, method, path, Some(token), &[("Idempotency-Key", key)], body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// What came back.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// A header's value (names compared without case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over a fresh connection.
pub fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Response {
    request_with(addr, method, path, token, &[], body)
}

/// One HTTP/1.1 request over a fresh connection, with more `headers`.
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Response {
    send(addr, method, path, token, headers, body.map(Value::to_string).unwrap_or_default().as_bytes())
}

/// One HTTP/1.1 request over a fresh connection, with more `headers` and `body` as it is.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut stream = TcpStream::connect(addr).expect("connecting to the server");
    stream.set_read_timeout(Some(Duration::from_secs(120))).expect("a read timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("sending the request");
    stream.write_all(body).expect("sending the body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("reading the response");
    let text = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect::<Vec<_>>();
    let chunked = headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked { dechunk(body) } else { body.to_owned() };
    Response { status, headers, body }
}

fn dechunk(mut text: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = text.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        text = rest[n..].trim_start_matches("\r\n");
    }
    out
}
