//! Faults a cluster survives (issue 23, item 4). A scheduler (`serve --workers 0`) and two
//! `tidegate worker`s, each in a folder of its own, run an eight-day pipeline (a command task,
//! then a SQL task over its output) on PostgreSQL and an `s3://` lake while the test breaks
//! something under them:
//!
//! - PostgreSQL restarted mid-run (a server of the test's own, so the shared one never stops);
//! - the scheduler's connections killed with `pg_terminate_backend`;
//! - the object store gone and back (moto keeps its objects in memory, so what restarts is a
//!   proxy in front of it: connections reset, then refused, then accepted again);
//! - a worker killed with kill -9 mid-attempt;
//! - a worker frozen with SIGSTOP past its lease, then resumed.
//!
//! Each ends with every partition published exactly once (one commit per step identity in the
//! Delta logs) and readable with Python `deltalake` on the object store, and with every process
//! that was not killed still running and stopping cleanly on SIGTERM. Needs
//! `TIDEGATE_TEST_POSTGRES_URL`, `TIDEGATE_TEST_S3_URL` (with `AWS_*`) and Python `deltalake`;
//! without them each test says it was skipped (and fails under CI).

use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tidegate_testkit::TestWorkspace;
use tidegate_testkit::store::PgSchema;

use crate::machines::{Process, python_has_deltalake, read_lake, wait_until};

const N_DAYS: i64 = 8;
const STEPS: i64 = 2 * N_DAYS;
const LEASE_TTL_S: u64 = 4;

fn spec(state: &str, lake: &str) -> String {
    format!(
        r#"
[project]
name = "cluster"
state = "{state}"
lake = "{lake}"
lease_ttl_s = {LEASE_TTL_S}
heartbeat_s = 1

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64", nullable = false }}, {{ name = "day", type = "string" }}]

[datasets.summary]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.extract]
command = ["sh", "-c", "sleep 1; printf 'id,day\n1,%s\n2,%s\n' \"$TIDEGATE_PARTITION\" \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
timeout_s = 120
retry = {{ attempts = 6, backoff_base_ms = 200, backoff_max_ms = 2000 }}

[tasks.summarize]
sql = "SELECT day, COUNT(*) AS n FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
retry = {{ attempts = 6, backoff_base_ms = 200, backoff_max_ms = 2000 }}
"#
    )
}

/// What a cluster test needs from the machine, or `None` after saying what is missing.
fn services(test: &str) -> Option<String> {
    let Ok(base) = std::env::var("TIDEGATE_TEST_S3_URL") else {
        tidegate_testkit::service_missing(test, "TIDEGATE_TEST_S3_URL (and AWS_* for the client)");
        return None;
    };
    if !python_has_deltalake() {
        tidegate_testkit::service_missing(test, "Python deltalake");
        return None;
    }
    Some(format!("{}/cluster-{}", base.trim_end_matches('/'), uuid::Uuid::now_v7()))
}

/// A scheduler and two workers, each in a folder of its own that holds only `tidegate.toml`.
struct Cluster {
    state: String,
    lake: String,
    /// The S3 endpoint the processes use, when it is not the environment's.
    endpoint: Option<String>,
    scheduler: TestWorkspace,
    workers: [TestWorkspace; 2],
    work: tempfile::TempDir,
    logs: tempfile::TempDir,
    processes: Vec<(&'static str, Option<Process>)>,
}

impl Cluster {
    fn start(state: &str, lake: &str, endpoint: Option<String>) -> Self {
        let text = spec(state, lake);
        let mut cluster = Self {
            state: state.to_owned(),
            lake: lake.to_owned(),
            endpoint,
            scheduler: TestWorkspace::new(&text),
            workers: [(); 2].map(|()| TestWorkspace::new(&text)),
            work: tempfile::tempdir().expect("the workers' own folders"),
            logs: tempfile::tempdir().expect("the processes' logs"),
            processes: Vec::new(),
        };
        let serve =
            cluster.spawn(cluster.scheduler.path(), "serve", &["serve", "--workers", "0", "--tick-every-s", "1"]);
        cluster.processes.push(("serve", Some(serve)));
        for (i, name) in ["one", "two"].into_iter().enumerate() {
            let work_dir = cluster.work.path().join(name);
            let args = ["worker", "--name", name, "--slots", "2", "--work-dir", work_dir.to_str().expect("utf-8")];
            let worker = cluster.spawn(cluster.workers[i].path(), name, &args);
            cluster.processes.push((name, Some(worker)));
        }
        wait_until("both workers register", Duration::from_secs(60), || {
            cluster.count("SELECT COUNT(*) FROM workers") == 2
        });
        cluster
    }

    fn command(&self, dir: &Path) -> Command {
        let mut command = crate::common::tidegate(dir);
        if let Some(endpoint) = &self.endpoint {
            command.env("AWS_ENDPOINT_URL", endpoint);
        }
        command
    }

    fn spawn(&self, dir: &Path, name: &str, args: &[&str]) -> Process {
        let log = std::fs::File::create(self.log_path(name)).expect("a log file");
        Process(Some(self.command(dir).args(args).stdout(Stdio::null()).stderr(log).spawn().expect("spawn")))
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.logs.path().join(format!("{name}.log"))
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    fn process(&mut self, name: &str) -> &mut Process {
        let found = self.processes.iter_mut().find(|(n, _)| *n == name).expect("a process of that name");
        found.1.as_mut().expect("still running")
    }

    fn pid(&mut self, name: &str) -> u32 {
        self.process(name).id()
    }

    fn signal(&mut self, name: &str, signal: &str) {
        let pid = self.pid(name).to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().expect("kill").success());
    }

    /// kill -9, and forgets the process.
    fn kill(&mut self, name: &str) {
        self.signal(name, "-KILL");
        let found = self.processes.iter_mut().find(|(n, _)| *n == name).expect("a process of that name");
        let mut process = found.1.take().expect("running");
        let _ = process.0.take().expect("running").wait();
    }

    /// One integer from the store, on a connection of its own; -1 while PostgreSQL is away.
    fn count(&self, sql: &str) -> i64 {
        postgres::Client::connect(&self.state, postgres::NoTls)
            .and_then(|mut db| db.query_one(sql, &[]))
            .map_or(-1, |row| row.get(0))
    }

    fn published(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM steps WHERE status = 'published'")
    }

    fn submit(&self) {
        let last = format!("2024-01-{N_DAYS:02}");
        let out = self
            .command(self.scheduler.path())
            .args(["submit", "summarize", "--from", "2024-01-01", "--to", &last])
            .output()
            .expect("submit runs");
        assert!(out.status.success(), "submit: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn wait_published(&self, n: i64, within: Duration) {
        let started = std::time::Instant::now();
        while self.published() < n {
            if started.elapsed() > within {
                let logs: Vec<String> =
                    ["serve", "one", "two"].iter().map(|p| format!("--- {p}:\n{}", self.log(p))).collect();
                let attempts = postgres::Client::connect(&self.state, postgres::NoTls)
                    .and_then(|mut db| {
                        db.query(
                            "SELECT step_id, attempt, worker, outcome, reason FROM attempts ORDER BY started_at",
                            &[],
                        )
                    })
                    .map(|rows| {
                        rows.iter()
                            .map(|r| {
                                let (step, attempt, worker): (String, i64, String) = (r.get(0), r.get(1), r.get(2));
                                let (outcome, reason): (Option<String>, Option<String>) = (r.get(3), r.get(4));
                                format!("{step} #{attempt} on {worker}: {outcome:?} {reason:?}")
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .unwrap_or_default();
                panic!(
                    "{} of {n} steps published after {within:?}\nattempts:\n{attempts}\n{}",
                    self.published(),
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for every step, then checks the lake with Python and stops what still runs.
    fn finish(mut self) {
        self.wait_published(STEPS, Duration::from_secs(180));
        assert_eq!(self.count("SELECT COUNT(*) FROM steps WHERE status <> 'published'"), 0, "every step published");
        let read = read_lake(&self.lake);
        for table in ["raw", "summary"] {
            let per_step = read["app_ids"][table].as_object().expect("app ids");
            assert_eq!(per_step.len() as i64, N_DAYS, "{table}: {per_step:?}");
            assert!(per_step.values().all(|n| n == 1), "{table}: a step published twice: {per_step:?}");
        }
        let summary = read["rows"]["summary"].as_array().expect("summary rows");
        let days: Vec<String> = summary.iter().filter_map(|r| r["day"].as_str().map(str::to_owned)).collect();
        let expected: Vec<String> = (1..=N_DAYS).map(|d| format!("2024-01-{d:02}")).collect();
        assert_eq!(days, expected, "{summary:?}");
        assert!(summary.iter().all(|r| r["n"] == 2), "{summary:?}");
        assert_eq!(read["rows"]["raw"].as_array().map(Vec::len), Some(2 * N_DAYS as usize));

        for (name, process) in std::mem::take(&mut self.processes) {
            let Some(mut process) = process else { continue };
            let child = process.0.as_mut().expect("running");
            assert!(child.try_wait().expect("wait").is_none(), "{name} exited during the fault:\n{}", self.log(name));
            let status = process.terminate();
            let log = self.log(name);
            assert!(status.success() && log.contains("stopped cleanly"), "{name}: {status:?}\n{log}");
            // delta-rs aborts a failed multipart upload on a detached task that panics inside
            // object_store (its BufWriter was already spent): noisy, harmless, not ours.
            let panics: Vec<&str> =
                log.lines().filter(|l| l.contains("panicked") && !l.contains("/object_store-")).collect();
            assert!(panics.is_empty(), "{name}:\n{log}");
        }
    }
}

#[test]
fn a_postgresql_restart_mid_run_loses_and_repeats_nothing() {
    const TEST: &str = "a_postgresql_restart_mid_run_loses_and_repeats_nothing";
    let Some(lake) = services(TEST) else { return };
    let Some(server) = PrivatePostgres::start(TEST) else { return };
    let cluster = Cluster::start(&server.url(), &lake, None);
    cluster.submit();
    cluster.wait_published(3, Duration::from_secs(60));
    server.down();
    std::thread::sleep(Duration::from_secs(3));
    server.up();
    cluster.finish();
}

#[test]
fn the_schedulers_connections_killed_mid_run_lose_and_repeat_nothing() {
    const TEST: &str = "the_schedulers_connections_killed_mid_run_lose_and_repeat_nothing";
    let Some(lake) = services(TEST) else { return };
    let Some(schema) = PgSchema::create() else { return };
    let server_port = postgres_port(&schema.url);
    let mut cluster = Cluster::start(&schema.url, &lake, None);
    cluster.submit();
    let mut db = schema.client();
    // Twice: once early, once late in the run.
    for after in [2, STEPS / 2] {
        cluster.wait_published(after, Duration::from_secs(60));
        let ports = client_ports(cluster.pid("serve"), server_port);
        assert!(!ports.is_empty(), "the scheduler holds connections to PostgreSQL");
        let killed: i64 = db
            .query_one(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE client_port = ANY($1) AND pid <> pg_backend_pid()) AS t",
                &[&ports],
            )
            .expect("pg_terminate_backend")
            .get(0);
        assert!(killed > 0, "terminated the scheduler's sessions ({ports:?})");
    }
    cluster.finish();
}

#[test]
fn the_object_store_gone_and_back_mid_run_loses_and_repeats_nothing() {
    const TEST: &str = "the_object_store_gone_and_back_mid_run_loses_and_repeats_nothing";
    let Some(lake) = services(TEST) else { return };
    let Some(schema) = PgSchema::create() else { return };
    let upstream = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL names the S3 server");
    let proxy = Proxy::start(endpoint_port(&upstream));
    let cluster = Cluster::start(&schema.url, &lake, Some(format!("http://127.0.0.1:{}", proxy.port)));
    cluster.submit();
    cluster.wait_published(3, Duration::from_secs(60));
    proxy.down();
    std::thread::sleep(Duration::from_secs(4));
    proxy.up();
    cluster.wait_published(STEPS / 2 + 1, Duration::from_secs(120));
    proxy.down();
    std::thread::sleep(Duration::from_secs(2));
    proxy.up();
    cluster.finish();
}

/// A cluster on the test PostgreSQL whose run has published a little and whose worker `one` is in
/// the middle of an attempt (the schema is dropped when the first value is).
fn worker_one_mid_attempt(test: &str) -> Option<(PgSchema, Cluster)> {
    let lake = services(test)?;
    let schema = PgSchema::create()?;
    let cluster = Cluster::start(&schema.url, &lake, None);
    cluster.submit();
    cluster.wait_published(2, Duration::from_secs(60));
    wait_until("worker one is mid-attempt", Duration::from_secs(60), || {
        cluster.count("SELECT COUNT(*) FROM attempts WHERE worker = 'one' AND ended_at IS NULL") > 0
    });
    Some((schema, cluster))
}

#[test]
fn a_worker_killed_mid_attempt_loses_and_repeats_nothing() {
    const TEST: &str = "a_worker_killed_mid_attempt_loses_and_repeats_nothing";
    let Some((_schema, mut cluster)) = worker_one_mid_attempt(TEST) else { return };
    cluster.kill("one");
    cluster.finish();
    // finish() checked the lake; the killed worker's steps were taken over after their leases.
}

#[test]
fn a_worker_frozen_past_its_lease_and_resumed_loses_and_repeats_nothing() {
    const TEST: &str = "a_worker_frozen_past_its_lease_and_resumed_loses_and_repeats_nothing";
    let Some((_schema, mut cluster)) = worker_one_mid_attempt(TEST) else { return };
    cluster.signal("one", "-STOP");
    wait_until("worker one's leases expire", Duration::from_secs(LEASE_TTL_S * 5), || {
        cluster.count("SELECT COUNT(*) FROM journal WHERE kind = 'lease_expired'") > 0
    });
    // Its attempts' processes ran on while it was frozen; resumed, it holds output it may not publish.
    std::thread::sleep(Duration::from_secs(1));
    cluster.signal("one", "-CONT");
    cluster.finish();
}

/// A PostgreSQL server of the test's own (initdb in a temporary folder, run as `postgres`), so
/// that the test can stop and start it under a running cluster.
struct PrivatePostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl PrivatePostgres {
    fn start(test: &str) -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .map(|version| version.path().join("bin"))
            .find(|bin| bin.join("initdb").is_file());
        let Some(bin) = bin else {
            tidegate_testkit::service_missing(test, "PostgreSQL's server binaries (/usr/lib/postgresql/*/bin)");
            return None;
        };
        let dir = tempfile::tempdir().expect("a folder for the server");
        let chown = Command::new("chown").args(["postgres"]).arg(dir.path()).status();
        if !chown.is_ok_and(|s| s.success()) {
            tidegate_testkit::service_missing(test, "a `postgres` user this test may hand a folder to (run as root)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("address").port();
        let server = Self { dir, bin, port };
        let data = server.data();
        server.pg(&[&server.bin.join("initdb"), Path::new("-D"), &data, Path::new("-A"), Path::new("trust")]);
        server.up();
        Some(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn pg(&self, argv: &[&Path]) {
        let out = Command::new("runuser").args(["-u", "postgres", "--"]).args(argv).output().expect("runuser");
        assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn pg_ctl(&self, args: &[&str]) {
        let pg_ctl = self.bin.join("pg_ctl");
        let data = self.data();
        let mut argv: Vec<&Path> = vec![&pg_ctl, Path::new("-D"), &data, Path::new("-w")];
        argv.extend(args.iter().map(Path::new));
        self.pg(&argv);
    }

    fn up(&self) {
        let options = format!("-h 127.0.0.1 -p {} -k {}", self.port, self.dir.path().display());
        let log = self.dir.path().join("server.log");
        self.pg_ctl(&["-l", log.to_str().expect("utf-8"), "-o", &options, "start"]);
    }

    /// A fast shutdown: every session is ended, as in a restart of the server.
    fn down(&self) {
        self.pg_ctl(&["-m", "fast", "stop"]);
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let (pg_ctl, data) = (self.bin.join("pg_ctl"), self.data());
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_ctl)
            .arg("-D")
            .arg(data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// The port in a `postgres://` URL (5432 when it names none).
fn postgres_port(url: &str) -> u16 {
    let config: postgres::Config = url.parse().expect("a PostgreSQL URL");
    config.get_ports().first().copied().unwrap_or(5432)
}

/// The port in an `http://host:port` endpoint.
fn endpoint_port(endpoint: &str) -> u16 {
    endpoint.trim_end_matches('/').rsplit(':').next().and_then(|p| p.parse().ok()).expect("an endpoint with a port")
}

/// The local ports of `pid`'s TCP connections to `server_port`: its PostgreSQL sessions, as
/// `pg_stat_activity.client_port` names them.
fn client_ports(pid: u32, server_port: u16) -> Vec<i32> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's descriptors")
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let port_of = |address: &str| address.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(&[_, local, remote, .., inode]) = fields.get(..10) else { continue };
            if inodes.contains(inode) && port_of(remote) == Some(server_port) {
                ports.extend(port_of(local).map(i32::from));
            }
        }
    }
    ports
}

/// A TCP proxy in front of the S3 server that the test can take down (every connection reset,
/// new ones refused) and bring back on the same port.
struct Proxy {
    port: u16,
    upstream: u16,
    running: Mutex<Option<Running>>,
}

struct Running {
    stop: Arc<AtomicBool>,
    accepting: JoinHandle<()>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: u16) -> Self {
        let port = TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("address").port();
        let proxy = Self { port, upstream, running: Mutex::new(None) };
        proxy.up();
        proxy
    }

    fn up(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).expect("the proxy's port again");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let upstream = self.upstream;
        let accepting = {
            let (stop, connections) = (stop.clone(), connections.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let _ = client.set_nonblocking(false);
                            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                            let pairs =
                                [(client.try_clone(), server.try_clone()), (server.try_clone(), client.try_clone())];
                            connections.lock().expect("connections").extend([client, server]);
                            for pair in pairs {
                                if let (Ok(mut from), Ok(mut to)) = pair {
                                    std::thread::spawn(move || {
                                        let _ = std::io::copy(&mut from, &mut to);
                                        let _ = to.shutdown(Shutdown::Write);
                                    });
                                }
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        *self.running.lock().expect("proxy") = Some(Running { stop, accepting, connections });
    }

    fn down(&self) {
        let Some(running) = self.running.lock().expect("proxy").take() else { return };
        running.stop.store(true, Ordering::SeqCst);
        running.accepting.join().expect("the accept loop ends");
        for connection in running.connections.lock().expect("connections").drain(..) {
            let _ = connection.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.down();
    }
}
