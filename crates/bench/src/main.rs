//! `tidegate-bench`: developers' benchmarks, each a median over several runs with a baseline
//! measured in the same invocation; the results go to BENCHMARKS.md. `lake` measures the data
//! plane against DuckDB, `engine` the scheduler, the store and the planner (issue 4), `monitor`
//! a `/metrics` scrape on a store with many steps. A binary of
//! its own, not a subcommand of `tidegate`, so that none of it ships to users.
//!
//! Everything happens in a fresh folder under the system temp folder, removed at the end.

mod engine;
mod fill;
mod http;
mod lake;
mod monitor;
mod overview;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

use engine::EngineArgs;
use lake::LakeArgs;
use monitor::MonitorArgs;

/// The allocator `tidegate` uses (see its `main.rs`), so that B1, which runs the engine in this
/// process, measures it as the binary runs it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks for developers; the results go to BENCHMARKS.md.
#[derive(Debug, Parser)]
#[command(name = "tidegate-bench", version, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The lake: publication as the table grows, merge against DuckDB, diff of two versions.
    Lake(LakeArgs),
    /// The engine: no-op step throughput, a chain of `/bin/true`, many independent `/bin/true`
    /// against `xargs -P2`, planning a 5,000-task DAG.
    Engine(EngineArgs),
    /// The HTTP service: 200 clients reading status and runs while W(200) runs, and idle memory.
    Http(http::HttpArgs),
    /// `/metrics`: one scrape's cost on a store with many steps, against `status::debt`.
    Monitor(MonitorArgs),
    /// The web UI's overview grid: 20 datasets x 365 partitions over 100,000 steps, against
    /// `status::debt`.
    Overview(overview::OverviewArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Lake(args) => lake::run(args),
        Command::Engine(args) => engine::run(args),
        Command::Http(args) => http::run(&args),
        Command::Monitor(args) => monitor::run(args),
        Command::Overview(args) => overview::run(args),
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(1)
    })
}

/// A temp folder removed when dropped (unless kept).
#[derive(Debug)]
struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Scratch {
    /// A new folder `tidegate-bench-<uuid>` under the system temp folder.
    fn new(keep: bool) -> Result<Scratch> {
        let path = std::env::temp_dir().join(format!("tidegate-bench-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        progress(&format!("working in {}", path.display()));
        Ok(Scratch { path, keep })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("kept {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Durations in seconds.
#[derive(Debug, Clone, Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn median(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    fn min(&self) -> f64 {
        self.0.iter().copied().fold(f64::INFINITY, f64::min)
    }

    fn max(&self) -> f64 {
        self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }

    fn sum(&self, other: &Samples) -> Samples {
        Samples(self.0.iter().zip(&other.0).map(|(a, b)| a + b).collect())
    }

    fn json(&self) -> Value {
        json!({ "median_s": round(self.median()), "min_s": round(self.min()), "max_s": round(self.max()),
                "samples_s": self.0.iter().map(|s| round(*s)).collect::<Vec<_>>() })
    }
}

fn round(seconds: f64) -> f64 {
    (seconds * 10_000.0).round() / 10_000.0
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

fn progress(message: &str) {
    eprintln!("[bench] {message}");
}

/// The command line as typed, for the report.
fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Now, to the second, for the report.
fn now_text() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

// ---------------------------------------------------------------------------------------------
// Machine and memory

fn machine() -> Value {
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()));
    json!({
        "nproc": nproc,
        "mem_total_kib": mem_kib,
        "mem_total_gib": mem_kib.map(|k| round(k as f64 / 1024.0 / 1024.0)),
        "cpu": cpu,
        "os": std::env::consts::OS,
    })
}

/// The 1-minute load average (`/proc/loadavg`), to tell a busy machine from an idle one.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Resets the process's peak resident set size (Linux `clear_refs`); false if that failed.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak resident set size since the last reset, in KiB.
fn peak_rss_kib() -> Option<u64> {
    status_kib("VmHWM:")
}

/// The process's resident set size now, in KiB.
fn rss_kib() -> Option<u64> {
    status_kib("VmRSS:")
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix(field))?.trim().trim_end_matches("kB").trim().parse().ok()
}

fn mib(kib: Option<u64>) -> String {
    kib.map(|k| format!("{} MiB", k / 1024)).unwrap_or_else(|| "?".to_owned())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over both subcommands (duplicate flags, bad defaults).
    #[test]
    fn the_command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
