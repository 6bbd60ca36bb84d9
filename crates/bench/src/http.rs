//! The service under load (issue 22): `tidegate serve --http` answering 200 concurrent clients
//! that read `/api/status` and `/api/runs` while W(N) (N daily partitions of three chained no-op
//! tasks, as `scripts/bench-w.sh`) runs in the same workspace: request latency p50 and p99, failed
//! requests, failed steps, and W(N)'s wall time with the load against without it, measured
//! alternately in the same invocation. Also the server's resident memory once it has started,
//! idle.
//!
//! The clients are plain threads with one kept-alive HTTP/1.1 connection each: the load is the
//! server's to carry, not a client library's.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::{Samples, Scratch, progress};

/// What `tidegate-bench http` measures.
#[derive(Debug, clap::Args)]
pub(crate) struct HttpArgs {
    /// The `tidegate` binary to serve and run W(N) with (a release build).
    #[arg(long, default_value = "target/release/tidegate")]
    tidegate: PathBuf,
    /// Daily partitions of W(N).
    #[arg(long, default_value_t = 200)]
    n: u32,
    /// Concurrent clients reading status and runs.
    #[arg(long, default_value_t = 200)]
    clients: usize,
    /// Each client's pause between two requests, in milliseconds (0: as fast as answers come;
    /// a dashboard polls about once a second).
    #[arg(long, default_value_t = 0)]
    think_ms: u64,
    /// Clients poll what the web UI's screens poll (the overview grid, the status, the runs and
    /// the graph, in turn) instead of `/api/status` and `/api/runs`: with `--clients 50
    /// --think-ms 5000`, fifty open UIs.
    #[arg(long)]
    ui: bool,
    /// Rounds (each: W(N) without the load, then with it).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Keep the scratch folder.
    #[arg(long)]
    keep: bool,
}

/// Runs the benchmark and prints its RESULT lines.
pub(crate) fn run(args: &HttpArgs) -> Result<std::process::ExitCode> {
    let tidegate = std::fs::canonicalize(&args.tidegate)
        .with_context(|| format!("{} (build it: cargo build --release --workspace)", args.tidegate.display()))?;
    let scratch = Scratch::new(args.keep)?;
    let (mut quiet, mut loaded, mut p50s, mut p99s, mut idle_rss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut requests, mut failed_requests) = (0u64, 0u64);
    for round in 0..args.repeats {
        let ws = scratch.path.join(format!("round-{round}"));
        std::fs::create_dir_all(&ws)?;
        std::fs::write(ws.join("tidegate.toml"), spec())?;
        let token = mint(&tidegate, &ws)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let mut server = Server::start(&tidegate, &ws, addr)?;
        std::thread::sleep(Duration::from_secs(1));
        idle_rss.push(rss_mib(server.child.id())?);

        // Without the load: the first N days. With it: the next N, in the same store and lake.
        quiet.push(run_w(&tidegate, &ws, 0, args.n)?);
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..args.clients)
            .map(|i| {
                let (stop, token, think) = (stop.clone(), token.clone(), Duration::from_millis(args.think_ms));
                let paths = if args.ui { UI_PATHS } else { DASHBOARD_PATHS };
                std::thread::spawn(move || client(addr, &token, i, think, paths, &stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        loaded.push(run_w(&tidegate, &ws, args.n, args.n)?);
        stop.store(true, Ordering::Relaxed);
        let mut latencies: Vec<f64> = Vec::new();
        for c in clients {
            let stats = c.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
            requests += stats.latencies_ms.len() as u64 + stats.failed;
            failed_requests += stats.failed;
            latencies.extend(stats.latencies_ms);
        }
        latencies.sort_by(f64::total_cmp);
        p50s.push(percentile(&latencies, 0.50));
        p99s.push(percentile(&latencies, 0.99));
        server.stop();
        progress(&format!(
            "round {round}: W({}) {:.2} s quiet, {:.2} s under load; p50 {:.1} ms, p99 {:.1} ms over {} requests",
            args.n,
            quiet[round],
            loaded[round],
            p50s[round],
            p99s[round],
            latencies.len()
        ));
    }
    let tasks = f64::from(3 * args.n);
    let median = |v: &[f64]| Samples(v.to_vec()).median();
    let (q, l) = (median(&quiet), median(&loaded));
    let result = json!({
        "benchmark": "http_load",
        "n": args.n,
        "clients": args.clients,
        "think_ms": args.think_ms,
        "reads": if args.ui { "web UI screens" } else { "status and runs" },
        "w_quiet_s": q,
        "w_loaded_s": l,
        "w_quiet_tasks_per_s": tasks / q,
        "w_loaded_tasks_per_s": tasks / l,
        "slowdown": l / q - 1.0,
        "p50_ms": median(&p50s),
        "p99_ms": median(&p99s),
        "requests": requests,
        "failed_requests": failed_requests,
        "idle_rss_mib": median(&idle_rss),
    });
    println!("RESULT {result}");
    Ok(std::process::ExitCode::SUCCESS)
}

/// W(N)'s spec, as `scripts/bench-w.sh` writes it: three chained `true` tasks per day.
fn spec() -> String {
    let mut s = String::from("[project]\nname = \"bench_http\"\n[pools.default]\nslots = 16\n");
    for d in ["raw", "mid", "out"] {
        s.push_str(&format!(
            "[datasets.{d}]\npartitioning = {{ grain = \"day\", start = \"2024-01-01\" }}\nwrite = {{ mode = \"replace\" }}\n\
             columns = [{{ name = \"x\", type = \"int64\" }}]\n"
        ));
    }
    s.push_str("[tasks.extract]\ncommand = [\"true\"]\noutputs = [\"raw\"]\n");
    s.push_str("[tasks.transform]\ncommand = [\"true\"]\ninputs = [\"raw\"]\noutputs = [\"mid\"]\n");
    s.push_str("[tasks.load]\ncommand = [\"true\"]\ninputs = [\"mid\"]\noutputs = [\"out\"]\n");
    s
}

/// A viewer's token for `ws`.
fn mint(tidegate: &Path, ws: &Path) -> Result<String> {
    let out = Command::new(tidegate)
        .current_dir(ws)
        .env_remove("TIDEGATE_TOKEN")
        .args(["token", "create", "--name", "dashboard", "--role", "viewer", "--json"])
        .output()?;
    if !out.status.success() {
        bail!("minting a token: {}", String::from_utf8_lossy(&out.stderr));
    }
    let minted: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(minted["token"].as_str().context("a minted token")?.to_owned())
}

/// W(N) over days `first..first + n`, timed; fails if any step failed.
fn run_w(tidegate: &Path, ws: &Path, first: u32, n: u32) -> Result<f64> {
    let day = |k: u32| {
        (chrono::NaiveDate::from_ymd_opt(2024, 1, 1).unwrap_or_default() + chrono::Duration::days(i64::from(k)))
            .format("%Y-%m-%d")
            .to_string()
    };
    let started = Instant::now();
    let out = Command::new(tidegate)
        .current_dir(ws)
        .env_remove("TIDEGATE_TOKEN")
        .args(["run", "load", "--from", &day(first), "--to", &day(first + n - 1), "--workers", "16", "--json"])
        .output()?;
    let wall = started.elapsed().as_secs_f64();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("W({n}) printed no report: {}", String::from_utf8_lossy(&out.stderr)))?;
    if report["summary"]["failed"] != 0 || report["status"] != "succeeded" {
        bail!("W({n}) had failed steps: {report}");
    }
    Ok(wall)
}

/// `tidegate serve --http` (no scheduler: the runs are `tidegate run`'s), logging to a file.
struct Server {
    child: Child,
}

impl Server {
    fn start(tidegate: &Path, ws: &Path, addr: SocketAddr) -> Result<Server> {
        let log = std::fs::File::create(ws.join("serve.log"))?;
        let child = Command::new(tidegate)
            .current_dir(ws)
            .env_remove("TIDEGATE_TOKEN")
            .args(["serve", "--http", &addr.to_string(), "--no-scheduler"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(addr).is_err() {
            if Instant::now() > deadline {
                bail!("the server did not listen on {addr}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Server { child })
    }

    fn stop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS in /proc/PID/status")?;
    Ok(kib / 1024.0)
}

/// One client's requests.
#[derive(Debug, Default)]
struct ClientStats {
    latencies_ms: Vec<f64>,
    failed: u64,
}

/// What a dashboard reads.
const DASHBOARD_PATHS: &[&str] = &["/api/status", "/api/runs?limit=20"];
/// What the web UI's screens poll: the overview (its first page, partitions with activity), the
/// operations screen's status, the runs screen and the graph.
const UI_PATHS: &[&str] =
    &["/api/grid?columns=90&activity=true", "/api/status?limit=1", "/api/runs?limit=100", "/api/graph"];

/// Reads `paths` in turn over one kept-alive connection until `stop`; a connection the server
/// closes is reopened (and the request counted as failed).
fn client(addr: SocketAddr, token: &str, i: usize, think: Duration, paths: &[&str], stop: &AtomicBool) -> ClientStats {
    let mut stats = ClientStats::default();
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut k = i;
    while !stop.load(Ordering::Relaxed) {
        let path = paths[k % paths.len()];
        k += 1;
        let started = Instant::now();
        let ok = conn
            .take()
            .or_else(|| TcpStream::connect(addr).ok().map(BufReader::new))
            .and_then(|mut c| get(&mut c, path, token).ok().map(|status| (c, status)));
        match ok {
            Some((c, 200)) => {
                stats.latencies_ms.push(started.elapsed().as_secs_f64() * 1000.0);
                conn = Some(c);
            }
            Some((c, _)) => {
                stats.failed += 1;
                conn = Some(c);
            }
            None => stats.failed += 1,
        }
        if !think.is_zero() {
            std::thread::sleep(think);
        }
    }
    stats
}

/// One GET on a kept-alive connection; the response's status (its body read and dropped).
fn get(conn: &mut BufReader<TcpStream>, path: &str, token: &str) -> std::io::Result<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n\r\n");
    conn.get_mut().write_all(request.as_bytes())?;
    let mut line = String::new();
    conn.read_line(&mut line)?;
    let status: u16 = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut length = 0usize;
    loop {
        line.clear();
        conn.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body)?;
    Ok(status)
}

/// The `q` quantile of sorted values (nearest rank).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a rank within the slice")]
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
