//! The long-lived processes, until SIGTERM or Ctrl-C: `tidegate serve`, the scheduler
//! (`tidegate_app::serve`) with the HTTP API (`tidegate_server`) beside it when `--http` is given,
//! and `tidegate worker`, which runs leased attempts (`tidegate_app::worker`).

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tidegate_app::serve::{Event, ServeOptions, serve};
use tidegate_app::worker::{self, WorkerRequest};
use tidegate_app::workspace::{self, open_lake, runtime};
use tidegate_core::actor::Actor;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::logging::LogFormat;
use crate::output;

/// Run the schedules and execute runs until stopped (SIGTERM or Ctrl-C stop it cleanly).
///
/// Each tick does what `tidegate tick` does, then drains every unfinished run, including runs
/// and backfills submitted by other processes. On SIGTERM no new attempt starts, attempts in
/// flight finish and are recorded, and the process exits 0.
///
/// With `--http ADDR` the same process serves the HTTP API (bearer tokens from `tidegate token
/// create`; the OpenAPI document at /api/openapi.json). With `--no-scheduler` it serves the API
/// without scheduling (runs wait for a `tidegate serve`; a started backfill runs in this
/// process); with `--read-only` it is a read-only replica: nothing runs and changes are refused.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate serve\n  tidegate serve --tick-every-s 10 --workers 8\n  tidegate serve --workers 0   # attempts run in `tidegate worker` processes\n  tidegate serve --http 127.0.0.1:8080\n  tidegate serve --http 127.0.0.1:8080 --trust-proxy   # behind nginx, which sets X-Forwarded-For\n  tidegate serve --http 127.0.0.1:8081 --read-only   # a read-only replica"
)]
pub struct Args {
    /// Seconds between schedule evaluations.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600), allow_negative_numbers = true)]
    pub tick_every_s: u64,
    /// Seconds between evaluations of the `[alerts]` rules (`tidegate alerts status`).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600), allow_negative_numbers = true)]
    pub alerts_every_s: u64,
    /// Attempts this process runs itself at once (pools may allow fewer); 0 runs every attempt
    /// in `tidegate worker` processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=4096), allow_negative_numbers = true)]
    pub workers: u16,
    /// How log lines are written (standard error; `RUST_LOG` filters them: by default tidegate's at info, others' at warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Also serve the HTTP API on this address (e.g. 127.0.0.1:8080; port 0 picks a free one).
    /// Give an address other than 127.0.0.1 only behind a TLS proxy.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Serve the HTTP API without scheduling: runs wait for a `tidegate serve`.
    #[arg(long, requires = "http")]
    pub no_scheduler: bool,
    /// Serve the HTTP API only, as a read-only replica: no scheduling, no work, changes refused.
    #[arg(long, requires = "http")]
    pub read_only: bool,
    /// The HTTP API is reached through a reverse proxy that appends the client's address to
    /// X-Forwarded-For: count failed authentications (and journal requests) by that address, not
    /// the proxy's. Give it only when every request comes through that proxy.
    #[arg(long, requires = "http")]
    pub trust_proxy: bool,
    /// The most memory one SQL query over HTTP may hold, its result included, in MiB.
    #[arg(long, requires = "http", default_value_t = tidegate_server::HTTP_QUERY_LIMITS.memory_mb, value_parser = clap::value_parser!(u64).range(1..))]
    pub sql_memory_limit_mb: u64,
    /// The longest one SQL query over HTTP may run, in seconds.
    #[arg(long, requires = "http", default_value_t = tidegate_server::HTTP_QUERY_LIMITS.time_s, value_parser = clap::value_parser!(u64).range(1..))]
    pub sql_time_limit_s: u64,
    /// The most rows one SQL query over HTTP may return.
    #[arg(long, requires = "http", default_value_t = HTTP_MAX_ROWS, value_parser = clap::value_parser!(u64).range(1..))]
    pub sql_max_rows: u64,
    /// The most memory the result of one SQL query over HTTP may take, in MiB (its JSON is
    /// larger).
    #[arg(long, requires = "http", default_value_t = HTTP_MAX_RESULT_MB, value_parser = clap::value_parser!(u64).range(1..))]
    pub sql_max_result_mb: u64,
    /// How many SQL queries over HTTP run at once; another is refused (429) until one finishes.
    #[arg(long, requires = "http", default_value_t = tidegate_server::HTTP_QUERIES_AT_ONCE, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub sql_queries_at_once: u16,
}

/// The default of `--sql-max-rows`.
const HTTP_MAX_ROWS: u64 = match tidegate_server::HTTP_QUERY_LIMITS.max_rows {
    Some(n) => n,
    None => u64::MAX,
};

/// The default of `--sql-max-result-mb`.
const HTTP_MAX_RESULT_MB: u64 = match tidegate_server::HTTP_QUERY_LIMITS.max_result_mb {
    Some(n) => n,
    None => u64::MAX,
};

impl Args {
    /// The limits of one SQL query over HTTP, from the flags.
    fn sql_limits(&self) -> tidegate_lake::QueryLimits {
        tidegate_lake::QueryLimits {
            memory_mb: self.sql_memory_limit_mb,
            time_s: self.sql_time_limit_s,
            max_rows: Some(self.sql_max_rows),
            max_result_mb: Some(self.sql_max_result_mb),
            set_by: tidegate_lake::LimitsSetBy::Server,
        }
    }
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    crate::logging::init(args.log_format);
    let ws = Arc::new(workspace::load(ws)?);
    let store = ws.open_store()?;
    let options = ServeOptions {
        tick_every: Duration::from_secs(args.tick_every_s),
        workers: args.workers.into(),
        alerts_every: Duration::from_secs(args.alerts_every_s),
    };
    runtime()?.block_on(async {
        let stop = stop_on_signal("tidegate serve: stopping; attempts in flight will finish")?;
        let project = &ws.spec.project.name;
        let http = match args.http {
            None => None,
            Some(addr) => {
                let server = tidegate_server::Options {
                    writable: !args.read_only,
                    workers: options.workers,
                    trust_proxy: args.trust_proxy,
                    connections_max: connections_max(),
                    sql_limits: args.sql_limits(),
                    sql_queries_at_once: args.sql_queries_at_once.into(),
                    ..tidegate_server::Options::default()
                };
                let router = tidegate_server::router(ws.clone(), store.clone(), server);
                let listener = tidegate_server::bind(addr).await?;
                let local = listener.local_addr().context("reading the HTTP server's address")?;
                info!(
                    addr = %local,
                    read_only = args.read_only,
                    connections_max = server.connections_max,
                    "tidegate serve: HTTP API on http://{local}"
                );
                Some(tokio::spawn(tidegate_server::serve(listener, router, server, stop.clone().cancelled_owned())))
            }
        };
        if args.no_scheduler || args.read_only {
            let what = if args.read_only { "a read-only replica" } else { "no scheduler" };
            info!(project, "tidegate serve: {project}, HTTP only ({what}; SIGTERM or Ctrl-C stops)");
        } else {
            let lake = open_lake(&ws).await?;
            info!(project, tick_every_s = args.tick_every_s, "tidegate serve: {project} (SIGTERM or Ctrl-C stops)");
            serve(&ws, store, lake, actor, options, stop.clone(), &mut print_event).await?;
        }
        if let Some(http) = http {
            http.await.context("the HTTP server's task")??;
        }
        anyhow::Ok(())
    })?;
    info!("tidegate serve: stopped cleanly");
    Ok(ExitCode::SUCCESS)
}

/// Run attempts leased to this worker by the scheduler, until stopped.
///
/// Start it beside `tidegate serve` (give serve `--workers 0` to run every attempt in worker
/// processes) on the same state store and lake, on this machine or another: a worker needs a copy
/// of tidegate.toml (and the files its tasks run), the PostgreSQL store and an s3:// lake, and no
/// disk shared with the scheduler. The scheduler leases a step to a worker with a free slot; if the
/// worker dies, its leases expire and the steps are retried elsewhere. Attempts write in the
/// worker's own folder; their logs are copied to the lake, where `tidegate logs` finds them from
/// any machine.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate worker\n  tidegate worker --slots 8 --name gpu-box-1 --work-dir /var/lib/tidegate\n  tidegate serve --workers 0 & tidegate worker --slots 4"
)]
pub struct WorkerArgs {
    /// Attempts this worker runs at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024), allow_negative_numbers = true)]
    pub slots: u32,
    /// The worker's name in leases and the journal (default: worker-<host>-<pid>). One live
    /// worker per name: a worker started under a name another live worker holds is refused.
    #[arg(long)]
    pub name: Option<String>,
    /// The folder attempts write their output, logs and checkpoint files in (default: the
    /// TIDEGATE_WORK_DIR variable, else .tidegate/workers/<name> in the workspace).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
    /// Print what the worker did as JSON when it stops.
    #[arg(long)]
    pub json: bool,
    /// How log lines are written (standard error; `RUST_LOG` filters them: by default tidegate's at info, others' at warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

pub fn worker(ws: Option<&Path>, actor: &Actor, args: WorkerArgs) -> Result<ExitCode> {
    crate::logging::init(args.log_format);
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let work_dir = match args.work_dir.or_else(|| std::env::var_os(WORK_DIR_VAR).map(Into::into)) {
        Some(dir) => Some(std::path::absolute(&dir).with_context(|| format!("resolving {}", dir.display()))?),
        None => None,
    };
    let request = WorkerRequest { slots: args.slots, name: args.name, work_dir };
    let name = worker::name(&request)?;
    let summary = runtime()?.block_on(async {
        let stop = stop_on_signal("tidegate worker: stopping; attempts in flight will finish")?;
        let lake = open_lake(&ws).await?;
        let project = &ws.spec.project.name;
        let work_dir = worker::work_dir(&ws, &request, &name);
        info!(
            worker = name,
            slots = args.slots,
            project,
            work_dir = %work_dir.display(),
            "tidegate worker {name}: {} (SIGTERM or Ctrl-C stops)",
            tidegate_app::human::count(args.slots, "slot", "slots")
        );
        worker::work(&ws, store, lake, actor, &request, name.clone(), stop).await
    })?;
    output::emit(args.json, &summary, |s| {
        info!(
            worker = name,
            staged = s.staged,
            failed = s.failed,
            rejected = s.rejected,
            stopped = s.stopped,
            "tidegate worker {name}: stopped cleanly ({} staged, {} failed, {} refused as stale, {} stopped by a cancel)",
            s.staged,
            s.failed,
            s.rejected,
            s.stopped
        );
    })
}

/// The HTTP connections `serve` keeps open at once: [`tidegate_server::CONNECTIONS_MAX`], or half
/// the open files this process may have if that is fewer (the store, the lake and the attempts
/// need the rest). The soft limit is raised to the hard one first, as servers do: a soft limit
/// of 256 or 1024 is a default, not a decision.
fn connections_max() -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return tidegate_server::CONNECTIONS_MAX };
    let soft = if hard > soft && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() { hard } else { soft };
    usize::try_from(soft / 2).unwrap_or(usize::MAX).clamp(1, tidegate_server::CONNECTIONS_MAX)
}

/// The variable naming a worker's working folder when `--work-dir` is not given (`tidegate logs`
/// reads logs there too).
pub const WORK_DIR_VAR: &str = "TIDEGATE_WORK_DIR";

fn print_event(event: Event) {
    match event {
        Event::Started { at, run_id } => info!(%at, run_id, "tick: started run {run_id}"),
        Event::Superseded { at, interval: s } => info!(
            %at, task = s.task, partition = s.partition, by_run = s.by_run,
            "tick: {}@{} superseded by run {}", s.task, s.partition, s.by_run
        ),
        Event::Debt { at, task, n_intervals } => {
            info!(%at, task, n_intervals, "tick: {task} has {n_intervals} missed intervals as debt (catch-up off)");
        }
        Event::StandingBy => info!("another scheduler holds the role on this store: standing by"),
        Event::Active => info!("this scheduler holds the role"),
        Event::SteppedDown => info!("another scheduler took the role while this one was not renewing it: stepped down"),
        Event::Interrupted { reason, retry_in_ms } => {
            warn!(retry_in_ms, "the store or the lake is unavailable ({reason}); trying again in {retry_in_ms} ms");
        }
        Event::Alerts(e) => {
            for fired in &e.fired {
                warn!(alert = %fired, "alert fired: {fired}");
            }
            for resolved in &e.resolved {
                info!(alert = %resolved, "alert resolved: {resolved}");
            }
        }
        Event::Notified(passes) => {
            for t in passes {
                match &t.pending {
                    Some(why) => {
                        warn!(receiver = %t.receiver, delivered = t.n_delivered, "notifications to {} wait: {why}", t.receiver)
                    }
                    None => {
                        info!(receiver = %t.receiver, delivered = t.n_delivered, refused = t.n_refused, "told {}: {} delivered", t.receiver, t.n_delivered)
                    }
                }
            }
        }
        Event::AlertsFailed { reason } => warn!("alerts: evaluation failed, tried again next pass: {reason}"),
        Event::Lineage(d) if d.is_pending() => warn!(n_events = d.n_events(), "lineage: {d}"),
        Event::Lineage(d) => info!(
            n_events = d.n_events(),
            "lineage: {} delivered ({d})",
            tidegate_app::human::count(d.n_events(), "event", "events")
        ),
        Event::Drained(s) => info!(
            published = s.published,
            failed = s.failed,
            skipped = s.skipped,
            retried = s.retried,
            "drained: {} published, {} failed, {} skipped, {}",
            s.published,
            s.failed,
            s.skipped,
            tidegate_app::human::count(s.retried, "retry", "retries")
        ),
    }
}

/// A token cancelled when SIGTERM or Ctrl-C arrives (saying `note` on stderr); call within a
/// runtime.
pub fn stop_on_signal(note: &'static str) -> Result<CancellationToken> {
    let stop = CancellationToken::new();
    let token = stop.clone();
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("{note}");
        token.cancel();
    });
    Ok(stop)
}
