//! `tidegate-bench engine`: the engine benchmarks of issue 4, each a median over several runs with
//! a baseline measured in the same invocation.
//!
//! - B1 ([`noop`]): pre-planned no-op steps drained by the in-process engine on SQLite; baseline:
//!   the same store calls in a plain loop.
//! - B2 and B4 ([`commands`]): `tidegate run` as a child process (the `tidegate` binary beside
//!   this one, or `--tidegate`) over a chain of `/bin/true` tasks and over many independent ones;
//!   baselines: the same number of sequential `/bin/true` spawns, and `xargs -P2` running the same
//!   commands.
//! - B5 ([`planning`]): planning 100 partitions of a generated 5,000-task DAG: time and peak memory.
//! - B6 ([`sources`]): B4's steps reading a source folder each, with `ready = "location"` against
//!   `ready = "none"`: what source readiness costs a step.

mod commands;
mod noop;
mod planning;
mod sources;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::{Samples, Scratch, command_line, load_average, machine, now_text, progress, round};

/// One of the engine benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Bench {
    B1,
    B2,
    B4,
    B5,
    B6,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate-bench engine\n  tidegate-bench engine --only b1 --b1-steps 100000 --repeats 1\n  tidegate-bench engine --only b2,b4 --b4-steps 1000 --json"
)]
pub struct EngineArgs {
    /// Only these benchmarks (comma-separated); all by default.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub only: Vec<Bench>,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub repeats: usize,
    /// B1: no-op steps drained per run of the benchmark.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub b1_steps: usize,
    /// B1: how many store runs the steps are spread over (1: a single run holds them all).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub b1_runs: usize,
    /// B1: attempts in flight at once (the engine's `--workers`; pool slots are set to match).
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub b1_workers: usize,
    /// B2: tasks in the chain, each reading the previous one's output.
    #[arg(long, default_value_t = 40, value_name = "N")]
    pub b2_chain: usize,
    /// B4: independent `/bin/true` steps (one task over this many daily partitions).
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub b4_steps: usize,
    /// B4: `tidegate run --workers` (pool slots are set to match).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub b4_workers: usize,
    /// B6: independent steps, each reading its day of a source folder.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub b6_steps: usize,
    /// B5: tasks in the generated DAG, the sink included.
    #[arg(long, default_value_t = 5_000, value_name = "N")]
    pub b5_tasks: usize,
    /// B5: daily partitions planned.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub b5_partitions: usize,
    /// B2 and B4: the `tidegate` binary they run; by default the one beside this executable
    /// (`cargo build --release` builds both into target/release).
    #[arg(long, value_name = "PATH")]
    pub tidegate: Option<PathBuf>,
    /// Keep the temp folder (its path is printed) instead of removing it.
    #[arg(long)]
    pub keep: bool,
}

/// What each benchmark gives back: its JSON object and its lines for people.
#[derive(Debug)]
struct Outcome {
    json: Value,
    human: String,
}

pub fn run(args: EngineArgs) -> Result<ExitCode> {
    ensure!(args.repeats >= 1, "--repeats must be at least 1");
    for (name, n) in [
        ("--b1-steps", args.b1_steps),
        ("--b1-runs", args.b1_runs),
        ("--b1-workers", args.b1_workers),
        ("--b2-chain", args.b2_chain),
        ("--b4-steps", args.b4_steps),
        ("--b4-workers", args.b4_workers),
        ("--b5-partitions", args.b5_partitions),
        ("--b6-steps", args.b6_steps),
    ] {
        ensure!(n >= 1, "Invalid value 0 for {name}: must be at least 1");
    }
    ensure!(
        args.b1_runs <= args.b1_steps,
        "--b1-runs ({}) must not exceed --b1-steps ({})",
        args.b1_runs,
        args.b1_steps
    );
    ensure!(args.b5_tasks >= 2, "Invalid value {} for --b5-tasks: must be at least 2", args.b5_tasks);
    let wanted = |b: Bench| args.only.is_empty() || args.only.contains(&b);
    // Found before anything runs, so that a missing binary does not fail B2 after minutes of B1.
    let tidegate =
        if wanted(Bench::B2) || wanted(Bench::B4) || wanted(Bench::B6) { Some(tidegate_binary(&args)?) } else { None };
    let tidegate = || tidegate.as_deref().expect("the tidegate binary is found when B2, B4 or B6 is wanted");
    let command = command_line();
    let scratch = Scratch::new(args.keep)?;
    let load_before = load_average();

    // B5 first: its peak memory is cleanest in a process that has not run anything yet.
    let mut results: Vec<(Bench, Outcome)> = Vec::new();
    if wanted(Bench::B5) {
        progress(&format!("B5: planning {} partitions of a {}-task DAG", args.b5_partitions, args.b5_tasks));
        results.push((Bench::B5, planning::b5(args.b5_tasks, args.b5_partitions, args.repeats)?));
    }
    if wanted(Bench::B1) {
        progress(&format!("B1: {} no-op steps in {} run(s), {} repeat(s)", args.b1_steps, args.b1_runs, args.repeats));
        let sizes = noop::Sizes { n_steps: args.b1_steps, n_runs: args.b1_runs, workers: args.b1_workers };
        results.push((Bench::B1, noop::b1(&scratch.path.join("b1"), sizes, args.repeats)?));
    }
    if wanted(Bench::B2) {
        progress(&format!("B2: a chain of {} /bin/true tasks, {} repeat(s)", args.b2_chain, args.repeats));
        results.push((Bench::B2, commands::b2(tidegate(), &scratch.path.join("b2"), args.b2_chain, args.repeats)?));
    }
    if wanted(Bench::B4) {
        progress(&format!("B4: {} independent /bin/true steps, {} repeat(s)", args.b4_steps, args.repeats));
        let b4 = commands::b4(tidegate(), &scratch.path.join("b4"), args.b4_steps, args.b4_workers, args.repeats)?;
        results.push((Bench::B4, b4));
    }
    if wanted(Bench::B6) {
        progress(&format!("B6: {} steps reading a source, ready = location against none", args.b6_steps));
        let b6 = sources::b6(tidegate(), &scratch.path.join("b6"), args.b6_steps, args.b4_workers, args.repeats)?;
        results.push((Bench::B6, b6));
    }
    results.sort_by_key(|(b, _)| *b);

    let machine = machine();
    let date = now_text();
    let load_after = load_average();
    if args.json {
        let mut out = json!({
            "command": command,
            "date": date,
            "machine": machine,
            "repeats": args.repeats,
            "load_average_1m": { "before": load_before, "after": load_after },
        });
        for (bench, outcome) in results {
            out[name(bench)] = outcome.json;
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let mut o = String::new();
        let _ = writeln!(o, "Engine benchmarks  ({date})");
        let _ = writeln!(
            o,
            "machine: {} CPU(s), {} GiB RAM, {}; load average (1 min) {} before, {} after",
            machine["nproc"],
            machine["mem_total_gib"],
            machine["cpu"].as_str().unwrap_or("?"),
            load_before.map_or("?".to_owned(), |l| format!("{l:.2}")),
            load_after.map_or("?".to_owned(), |l| format!("{l:.2}")),
        );
        let _ = writeln!(o, "command: {command}");
        let _ = writeln!(o, "runs per measurement: {} (median reported)", args.repeats);
        for (_, outcome) in results {
            let _ = writeln!(o);
            o.push_str(&outcome.human);
        }
        print!("{o}");
    }
    Ok(ExitCode::SUCCESS)
}

fn name(bench: Bench) -> &'static str {
    match bench {
        Bench::B1 => "b1",
        Bench::B2 => "b2",
        Bench::B4 => "b4",
        Bench::B5 => "b5",
        Bench::B6 => "b6",
    }
}

/// The `tidegate` binary B2 and B4 run: `--tidegate`, or the one beside this executable, which is
/// where Cargo puts both (`target/<profile>/`).
fn tidegate_binary(args: &EngineArgs) -> Result<PathBuf> {
    let path = match &args.tidegate {
        Some(path) => path.clone(),
        None => {
            let this = std::env::current_exe().context("finding this executable")?;
            this.with_file_name(format!("tidegate{}", std::env::consts::EXE_SUFFIX))
        }
    };
    ensure!(
        path.is_file(),
        "no tidegate binary at {}: B2 and B4 run `tidegate run` as a child process; build it first, with \
         the same profile as this binary (`cargo build --release -p tidegate`), or pass --tidegate PATH",
        path.display()
    );
    Ok(path)
}

/// Writes `text` as the workspace's `tidegate.toml` in a new folder `dir`.
fn workspace(dir: &Path, text: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(tidegate_app::workspace::SPEC_FILE), text)?;
    Ok(())
}

/// Milliseconds, rounded to a tenth, for JSON.
fn ms(seconds: f64) -> f64 {
    (seconds * 10_000.0).round() / 10.0
}

/// `median (min-max)` in seconds, for people.
fn spread(samples: &Samples) -> String {
    format!("{:.3} s ({:.3}-{:.3})", samples.median(), samples.min(), samples.max())
}

/// `samples.json()` with the median's rate for `n` items.
fn rate_json(samples: &Samples, n: usize) -> Value {
    let mut v = samples.json();
    v["per_s"] = json!(round(per_s(n, samples.median())));
    v
}

#[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
fn per_s(n: usize, seconds: f64) -> f64 {
    n as f64 / seconds
}
