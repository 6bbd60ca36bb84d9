//! `tidegate-bench engine` at tiny sizes, as a real process: every benchmark runs to the end and
//! its JSON report carries the fields BENCHMARKS.md is written from, with consistent counts.
//! Timings are only checked to be positive numbers, never compared with anything.
//!
//! B2 and B4 run the `tidegate` binary, which is another package's: Cargo builds it for these tests
//! only as part of the workspace (`cargo test --workspace`, as the README and `.ci/run` do), into
//! the same folder as `tidegate-bench`. The tests pass that path with `--tidegate`, so they never
//! run a `tidegate` found anywhere else, and they say what to build when it is missing (after
//! `cargo test -p tidegate-bench` alone, for instance).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The `tidegate` binary beside `tidegate-bench` in Cargo's output folder.
fn tidegate() -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_tidegate-bench"))
        .with_file_name(format!("tidegate{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "no tidegate binary at {}: run the tests with `cargo test --workspace`, or `cargo build -p tidegate` first",
        path.display()
    );
    path
}

fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tidegate-bench"))
        .args(["engine", "--json", "--repeats", "1"])
        .arg("--tidegate")
        .arg(tidegate())
        .args(args)
        .env_remove("TIDEGATE_TOKEN")
        .output()
        .expect("the tidegate-bench binary runs");
    assert!(out.status.success(), "bench engine failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("valid JSON on stdout")
}

/// A duration or rate that was measured: a finite number above zero.
fn positive(v: &Value, path: &str) -> f64 {
    let x = path.split('.').fold(v, |v, k| &v[k]).as_f64().unwrap_or_else(|| panic!("{path} is not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{path} = {x}");
    x
}

fn boolean(v: &Value, path: &str) {
    assert!(path.split('.').fold(v, |v, k| &v[k]).is_boolean(), "{path} is not a boolean in {v}");
}

#[test]
fn every_engine_benchmark_reports_its_figures_at_tiny_sizes() {
    let report = bench(&[
        "--b1-steps",
        "40",
        "--b1-runs",
        "2",
        "--b1-workers",
        "8",
        "--b2-chain",
        "3",
        "--b4-steps",
        "6",
        "--b5-tasks",
        "30",
        "--b5-partitions",
        "3",
    ]);
    assert_eq!(report["repeats"], 1);
    assert!(report["machine"]["nproc"].as_u64().is_some_and(|n| n >= 1), "{report}");

    let b1 = &report["b1"];
    assert_eq!((b1["steps"].as_u64(), b1["runs"].as_u64(), b1["workers"].as_u64()), (Some(40), Some(2), Some(8)));
    for path in [
        "engine_drain.median_s",
        "publication_bookkeeping.median_s",
        "engine_total.median_s",
        "engine_total.per_s",
        "steps_per_s",
        "baseline_store_loop.median_s",
        "baseline_total.median_s",
        "ratio_to_baseline",
    ] {
        positive(b1, path);
    }
    boolean(b1, "aim_met");
    assert_eq!(b1["aim_steps_per_s"], 5000.0);

    let b2 = &report["b2"];
    assert_eq!(b2["chain"], 3);
    assert_eq!(b2["phases"]["steps"], 3, "every step of the timed run has its phases: {b2}");
    for path in ["tidegate_run_wall.median_s", "tidegate_run_elapsed.median_s", "ms_per_step", "baseline_ms_per_spawn"]
    {
        positive(b2, path);
    }
    let wall = positive(b2, "tidegate_run_wall.median_s");
    let elapsed = positive(b2, "tidegate_run_elapsed.median_s");
    assert!(elapsed <= wall, "the run's own elapsed time is part of its wall time: {b2}");
    boolean(b2, "aim_met");

    let b4 = &report["b4"];
    assert_eq!((b4["steps"].as_u64(), b4["workers"].as_u64()), (Some(6), Some(2)));
    assert_eq!(b4["phases"]["steps"], 6);
    for path in
        ["tidegate_run_wall.median_s", "baseline_xargs_p2.median_s", "tidegate_steps_per_s", "ratio_to_baseline"]
    {
        positive(b4, path);
    }
    boolean(b4, "aim_met");

    let b5 = &report["b5"];
    assert_eq!((b5["tasks"].as_u64(), b5["partitions"].as_u64()), (Some(30), Some(3)));
    // Every task is planned for every partition; the windowed layer adds one earlier partition.
    let steps = b5["steps_planned"].as_u64().expect("steps_planned");
    assert!((90..=120).contains(&steps), "{b5}");
    assert!(b5["levels"].as_u64().is_some_and(|l| l >= 3), "the DAG is layered: {b5}");
    positive(b5, "plan.median_s");
}

#[test]
fn only_runs_the_benchmarks_asked_for() {
    let report = bench(&["--only", "b5", "--b5-tasks", "10", "--b5-partitions", "2"]);
    assert!(report["b5"].is_object(), "{report}");
    for skipped in ["b1", "b2", "b4"] {
        assert!(report.get(skipped).is_none(), "{skipped} ran without being asked for: {report}");
    }
}

#[test]
fn a_missing_tidegate_binary_is_named_before_anything_runs() {
    let out = Command::new(env!("CARGO_BIN_EXE_tidegate-bench"))
        .args(["engine", "--only", "b5,b2", "--tidegate", "/nonexistent/tidegate"])
        .output()
        .expect("the tidegate-bench binary runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no tidegate binary at /nonexistent/tidegate"), "{stderr}");
    assert!(stderr.contains("--tidegate PATH"), "{stderr}");
    assert!(!stderr.contains("B5:"), "B5 ran before the binary was checked: {stderr}");
}
